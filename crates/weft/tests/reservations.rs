//! NVMe reservations on a volume end to end: `weft serve`, two hosts played
//! by weft's initiator (each its own NQN and Host Identifier), the
//! reservation commands as a failover cluster sends them, and the state
//! kept when the node is killed and restarted.

mod support;

use support::{ok, pool_with_volume, start_node, temp_dir, Node};
use weft_initiator::{Controller, InitiatorError, Queue};
use weft_proto::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE, RELEASE_OPCODE};
use weft_proto::status::Status;

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000a0a0";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000b0b0";
const BLOCK: u32 = 4096;

fn connect(node: &Node, host_nqn: &str, host_id: u8) -> (Controller, Queue) {
    support::connect_as(node, "nqn.2026-11.io.weft:vol:db", host_nqn, host_id)
}

fn status_of(result: Result<(), InitiatorError>) -> Status {
    match result {
        Ok(()) => Status::SUCCESS,
        Err(InitiatorError::Command { status, .. }) => status,
        Err(error) => panic!("{error}"),
    }
}

fn write(queue: &mut Queue, byte: u8) -> Status {
    status_of(queue.write(1, 0, BLOCK, &[byte; BLOCK as usize]))
}

/// CDW10 of Register: RREGA, and CPTPL 11b as Linux sends it.
const REGISTER: u32 = 0xC000_0000;

#[test]
fn a_reservation_fences_other_hosts_and_survives_a_crash_of_the_node() {
    let dir = temp_dir("reservations");
    let node = start_node(&dir.join("data"), &[]);
    pool_with_volume(&node, &dir.join("p.img"), "db", "16MiB");
    for (name, nqn) in [("a", HOST_A), ("b", HOST_B)] {
        ok(&node, &["host", "add", name, "--nqn", nqn]);
        ok(&node, &["volume", "attach", "db", "--host", name]);
    }
    let (_ca, mut a) = connect(&node, HOST_A, 0xA);
    let (_cb, mut b) = connect(&node, HOST_B, 0xB);
    a.reservation(REGISTER_OPCODE, 1, REGISTER, &[0, 0xA1])
        .unwrap();
    b.reservation(REGISTER_OPCODE, 1, REGISTER, &[0, 0xB2])
        .unwrap();
    // Write Exclusive, Registrants Only: both write; then A preempts B,
    // whose registration goes, and turns it into Write Exclusive.
    a.reservation(ACQUIRE_OPCODE, 1, 0x300, &[0xA1, 0]).unwrap();
    assert_eq!(write(&mut b, 1), Status::SUCCESS);
    a.reservation(ACQUIRE_OPCODE, 1, 0x301, &[0xA1, 0xB2])
        .unwrap();
    a.reservation(ACQUIRE_OPCODE, 1, 0x101, &[0xA1, 0xA1])
        .unwrap();
    assert_eq!(write(&mut a, 2), Status::SUCCESS);
    assert_eq!(write(&mut b, 3), Status::RESERVATION_CONFLICT);
    assert_eq!(b.read(1, 0, BLOCK, BLOCK).unwrap(), [2; BLOCK as usize]);
    let report = a.reservation_report(1, 128).unwrap();
    assert_eq!(report[4], 1, "Write Exclusive");
    assert_eq!(u16::from_le_bytes([report[5], report[6]]), 1, "A only");
    drop((a, b, _ca, _cb));

    // Killed (SIGKILL) and started again: the same state, still enforced.
    drop(node);
    let node = start_node(&dir.join("data"), &[]);
    let (_ca, mut a) = connect(&node, HOST_A, 0xA);
    let (_cb, mut b) = connect(&node, HOST_B, 0xB);
    assert_eq!(a.reservation_report(1, 128).unwrap(), report);
    assert_eq!(write(&mut b, 4), Status::RESERVATION_CONFLICT);
    assert_eq!(write(&mut a, 5), Status::SUCCESS);
    // B's key is gone: it cannot release or preempt with it.
    assert_eq!(
        status_of(b.reservation(RELEASE_OPCODE, 1, 0x100, &[0xB2])),
        Status::RESERVATION_CONFLICT
    );
    // A releases: B writes again.
    a.reservation(RELEASE_OPCODE, 1, 0x100, &[0xA1]).unwrap();
    assert_eq!(write(&mut b, 6), Status::SUCCESS);
    drop((a, b, _ca, _cb));
    drop(node);
}
