//! weft's user-space initiator against weft's target over real TCP.

mod support;

use weft_initiator::{read_write, ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_proto::testing::TEST_NQN;

#[test]
fn connects_identifies_and_moves_data() {
    let address = support::start("initiator");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    for digests in [false, true] {
        let options = ConnectOptions {
            header_digest: digests,
            data_digest: digests,
            ..ConnectOptions::default()
        };
        let mut controller = Controller::connect(&url, options, 2).unwrap();
        assert_eq!(controller.info.model, "weft");
        assert_eq!(controller.info.transfer_bytes_max, 128 * 1024);
        assert_eq!(controller.info.io_in_capsule_bytes, 16 * 1024);
        assert_eq!(controller.info.io_queues, 2);
        let namespace = controller.namespace(2).unwrap();
        assert_eq!(namespace.block_size, 4096);
        assert_eq!(namespace.blocks * 4096, support::FILE_BYTES);
        let mut queue = controller.open_io_queue(2).unwrap();
        // Queue depth 16: submit all, then reap; sizes from in-capsule to R2T.
        for (round, len) in [4096u32, 16384, 65536, 131072].into_iter().enumerate() {
            let mut patterns = Vec::new();
            for index in 0..16u64 {
                let slba = index * 32;
                let pattern: Vec<u8> = (0..len)
                    .map(|i| (i as u64 ^ index ^ round as u64) as u8)
                    .collect();
                let cid = queue.next_cid();
                queue.buffer(cid)[..len as usize].copy_from_slice(&pattern);
                queue
                    .submit(
                        read_write(io_opcode::WRITE, 2, slba, len / 4096),
                        DataTransfer::ToController(len),
                    )
                    .unwrap();
                patterns.push((slba, pattern));
            }
            for _ in 0..16 {
                assert!(queue.wait().unwrap().status.is_success());
            }
            for (slba, pattern) in patterns {
                let done = queue
                    .run(
                        read_write(io_opcode::READ, 2, slba, len / 4096),
                        DataTransfer::FromController(len),
                    )
                    .unwrap();
                assert!(done.status.is_success());
                assert!(
                    queue.buffer(done.cid.0)[..len as usize] == pattern[..],
                    "read back differs at {slba}, {len} bytes"
                );
            }
        }
    }
}

#[test]
fn errors_say_what_failed() {
    let address = support::start("initiator-errors");
    let unknown =
        TargetUrl::parse(&format!("nvme-tcp://{address}/nqn.2026-11.io.weft:nothing")).unwrap();
    let error = Controller::connect(&unknown, ConnectOptions::default(), 1).unwrap_err();
    assert!(
        matches!(error, InitiatorError::UnknownNqn { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("nvme discover"), "{error}");
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{TEST_NQN}")).unwrap();
    let mut controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    let error = controller.namespace(9).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("namespace 9 does not exist on {TEST_NQN} (it has [1, 2])")
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let nowhere = TargetUrl::parse(&format!("nvme-tcp://{closed}/{TEST_NQN}")).unwrap();
    let error = Controller::connect(&nowhere, ConnectOptions::default(), 1).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with(&format!("cannot reach {closed}")),
        "{error}"
    );
}
