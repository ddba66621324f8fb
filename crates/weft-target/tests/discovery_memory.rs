//! What a stranger's discovery connections cost the node: anyone may
//! connect to the discovery subsystem and ask for its log page with a
//! transfer as large as the target allows (1 MiB), many at a time, without
//! reading the answers. Only the page's own bytes take memory; the rest of
//! each transfer is zeroes that hold none. (A test binary of its own: it
//! measures its process's resident memory.)

mod support;

use std::time::Duration;
use weft_proto::command::admin_opcode;
use weft_proto::pdu::PduType;
use weft_proto::status::Status;
use weft_proto::target::DISCOVERY_NQN;
use weft_proto::testing;

const CONNECTIONS: usize = 4;
/// Outstanding commands per connection (the admin queue holds 32).
const PIPELINED: u16 = 24;
const TRANSFER_BYTES: u32 = 1 << 20;

/// Get Log Page of the discovery log, `TRANSFER_BYTES` long.
fn get_discovery_log(cid: u16) -> [u8; 64] {
    let mut command = testing::sqe(admin_opcode::GET_LOG_PAGE, cid, 0, TRANSFER_BYTES, false);
    let dwords = TRANSFER_BYTES / 4 - 1;
    testing::set_cdw(&mut command, 10, 0x70 | (dwords & 0xFFFF) << 16);
    testing::set_cdw(&mut command, 11, dwords >> 16);
    command
}

#[test]
fn pipelined_large_discovery_log_reads_hold_no_memory_beyond_the_page() {
    let address = support::start("discovery-memory");
    let mut clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut client = support::Client::connect(address, false, false);
            let (connect, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
            assert_eq!(client.command(&connect, &data).1.status(), Status::SUCCESS);
            let enable = testing::property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
            assert_eq!(client.command(&enable, &[]).1.status(), Status::SUCCESS);
            client
        })
        .collect();
    let before = support::resident_bytes();
    for client in &mut clients {
        for cid in 0..PIPELINED {
            let command = get_discovery_log(100 + cid);
            client.send(&testing::capsule(false, false, &command, &[]));
        }
    }
    // The reactor takes them all (and blocks on the sockets nobody reads).
    std::thread::sleep(Duration::from_millis(500));
    let grown = support::resident_bytes().saturating_sub(before);
    let asked = CONNECTIONS as u64 * u64::from(PIPELINED) * u64::from(TRANSFER_BYTES);
    assert!(
        grown < asked / 8,
        "{} MiB resident more for {} MiB of zeroes asked for",
        grown >> 20,
        asked >> 20
    );
    // Each answer is the page, then zeroes up to the length asked for.
    let client = &mut clients[0];
    let mut data = Vec::new();
    loop {
        let pdu = client.next_pdu();
        if pdu.pdu_type == PduType::C2hData as u8 {
            data.extend_from_slice(&pdu.data);
            continue;
        }
        assert_eq!(pdu.pdu_type, PduType::CapsuleResp as u8);
        assert_eq!(pdu.status(), Status::SUCCESS);
        break;
    }
    assert_eq!(data.len(), TRANSFER_BYTES as usize);
    let records = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let page_bytes = 1024 * (1 + records as usize);
    assert!(records >= 1, "the subsystem's record");
    assert!(data[page_bytes..].iter().all(|&byte| byte == 0));
}
