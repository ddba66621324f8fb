//! What strangers' idle connections cost the node: a thousand connections
//! that sent ICReq (what anyone on the network may do, and hold until the
//! Connect deadline) hold less than 100 MiB between them, and one connected
//! to the discovery subsystem less than 64 KiB. (A test binary of its own:
//! it measures its process's resident memory.)

mod support;

use std::time::Duration;
use weft_proto::command::admin_opcode;
use weft_proto::status::Status;
use weft_proto::target::DISCOVERY_NQN;
use weft_proto::testing;

const CONNECTIONS: usize = 1000;

#[test]
fn a_thousand_idle_connections_hold_less_than_100_mib() {
    // As many discovery controllers from this one address as the test makes.
    let limits = weft_proto::Limits {
        discovery_controllers_per_address: 256,
        ..weft_proto::Limits::DEFAULT
    };
    let address = support::start_within("idle-memory", limits);
    // One connection first: the reactors' own buffers are counted out.
    let mut first = support::Client::connect(address, false, false);
    let (connect, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
    assert_eq!(first.command(&connect, &data).1.status(), Status::SUCCESS);
    std::thread::sleep(Duration::from_millis(200));
    let before = support::resident_bytes();
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|_| support::Client::connect(address, false, false))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let grown = support::resident_bytes().saturating_sub(before);
    println!(
        "{CONNECTIONS} idle connections: {} KiB resident more, {} KiB each (both ends of each socket in this process)",
        grown >> 10,
        (grown >> 10) / CONNECTIONS as u64
    );
    assert!(
        grown < 100 << 20,
        "{} MiB for {CONNECTIONS} idle connections",
        grown >> 20
    );
    // A discovery controller on 200 of them (below the subsystem's 256),
    // each having read the discovery log once.
    let before = support::resident_bytes();
    let connected = 200;
    let mut discovering = Vec::new();
    for mut client in clients.into_iter().take(connected) {
        let (connect, data) = testing::connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
        assert_eq!(client.command(&connect, &data).1.status(), Status::SUCCESS);
        let enable = testing::property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
        assert_eq!(client.command(&enable, &[]).1.status(), Status::SUCCESS);
        let mut log = testing::sqe(admin_opcode::GET_LOG_PAGE, 3, 0, 4096, false);
        testing::set_cdw(&mut log, 10, 0x70 | (1023 << 16));
        assert_eq!(client.command(&log, &[]).1.status(), Status::SUCCESS);
        discovering.push(client);
    }
    std::thread::sleep(Duration::from_millis(200));
    let each = support::resident_bytes().saturating_sub(before) / connected as u64;
    println!(
        "a discovery controller and its log read: {} KiB more each",
        each >> 10
    );
    assert!(each < 64 << 10, "{} KiB each", each >> 10);
    drop((first, discovering));
}
