//! A pool whose device fails, end to end through the binary: a pool on a
//! small tmpfs that fills up, so that a metadata write fails with ENOSPC (a
//! real failure, no injection). The pool then fails every I/O (with DNR) and
//! says so in `weft pool list` / `weft volume show`, until an operator frees
//! space and runs `weft pool clear-failure`. Skipped where tmpfs cannot be
//! mounted (not root).

mod support;

use support::{ok, pool_with_volume, start_node, temp_dir, Tmpfs};
use weft_initiator::{ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::status::Status;

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000fa11d";

#[test]
fn a_pool_that_fails_a_metadata_write_fails_all_io_until_cleared() {
    let dir = temp_dir("failing-pool");
    let small = dir.join("tmpfs");
    let Some(disk) = Tmpfs::mount(&small, "48m") else {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    };
    let node = start_node(&dir.join("data"), &[]);
    pool_with_volume(&node, &small.join("d0.img"), "v", "64MiB");
    ok(&node, &["host", "add", "h", "--nqn", HOST_NQN]);
    ok(&node, &["volume", "attach", "v", "--host", "h"]);
    let url = TargetUrl::parse(&format!("{}/nqn.2026-11.io.weft:vol:v", node.nvme)).unwrap();
    let options = ConnectOptions {
        host_nqn: HOST_NQN.into(),
        ..ConnectOptions::default()
    };
    let controller = Controller::connect(&url, options, 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    queue.write(1, 0, 4096, &[1u8; 4096]).unwrap();
    // Fill the filesystem: the next allocation's journal write fails.
    disk.fill(64);
    let status = |result: Result<(), InitiatorError>| match result {
        Err(InitiatorError::Command { status, .. }) => status,
        other => panic!("expected a command status, got {other:?}"),
    };
    // Allocation units of 1 MiB: block 8192 (32 MiB) is in a fresh one.
    let first = status(queue.write(1, 8192, 4096, &[2u8; 4096]));
    assert_ne!(first, Status::SUCCESS);
    disk.make_room();
    // Space is back, but the pool stays failed: every I/O, with DNR.
    let read = queue.read(1, 0, 4096, 4096).map(|_| ());
    assert_eq!(
        status(read),
        Status {
            dnr: true,
            ..Status::UNRECOVERED_READ_ERROR
        }
    );
    assert!(status(queue.flush(1)).dnr);
    let list = ok(&node, &["pool", "list"]);
    assert!(
        list.contains("FAILED:") && list.contains("weft pool clear-failure p"),
        "{list}"
    );
    let show = ok(&node, &["volume", "show", "v"]);
    assert!(show.contains("state       failed"), "{show}");
    ok(&node, &["pool", "clear-failure", "p"]);
    assert!(ok(&node, &["volume", "show", "v"]).contains("state       online"));
    assert_eq!(queue.read(1, 0, 4096, 4096).unwrap(), &[1u8; 4096][..]);
    queue.write(1, 8192, 4096, &[2u8; 4096]).unwrap();
    queue.flush(1).unwrap();
}
