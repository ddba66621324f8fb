//! A namespace's device that fails (feature `fault-injection`): a failed
//! fdatasync or FUA write fails every later I/O, Flush included, until the
//! failure is cleared; a device that cannot punch holes still zeroes.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use weft_initiator::{read_write, sqe, ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_proto::status::Status;
use weft_proto::testing::TEST_NQN;
use weft_storage::faults::{FaultSwitches, FaultyDevice};
use weft_storage::{BlockDevice, FileDevice};
use weft_target::{DataPlane, Health, PeerLimits};

const BYTES: u64 = 8 << 20;

/// A data plane serving one faulty file namespace; its switches and health.
fn start(name: &str) -> (DataPlane, Arc<FaultSwitches>, Arc<Health>) {
    let dir = std::env::temp_dir().join(format!("weft-failures-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let file = FileDevice::open(&dir.join("ns1.img"), Some(BYTES), 4096).unwrap();
    let faulty = FaultyDevice::new(file);
    let switches = faulty.switches();
    let health = Arc::new(Health::default());
    let devices = vec![(
        Arc::new(faulty) as Arc<dyn BlockDevice>,
        Arc::clone(&health),
    )];
    let plane = support::serve_devices(devices, 1, Duration::ZERO, PeerLimits::DEFAULT);
    (plane, switches, health)
}

fn connect(plane: &DataPlane) -> weft_initiator::Queue {
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    let controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    controller.open_io_queue(1).unwrap()
}

fn status_of(result: Result<(), InitiatorError>) -> Status {
    match result {
        Err(InitiatorError::Command { status, .. }) => status,
        Err(other) => panic!("not a command status: {other}"),
        Ok(()) => Status::SUCCESS,
    }
}

#[test]
fn a_failed_sync_fails_every_later_io_until_cleared() {
    let (plane, switches, health) = start("sync");
    let mut queue = connect(&plane);
    queue.write(1, 0, 4096, &[7u8; 4096]).unwrap();
    switches.fail_syncs.store(true, Ordering::SeqCst);
    assert_eq!(status_of(queue.flush(1)), Status::WRITE_FAULT);
    assert!(health.is_failed());
    // The device "works" again, as a retried fsync after EIO does on Linux:
    // the flush must still fail, and so must reads and writes, with DNR.
    switches.fail_syncs.store(false, Ordering::SeqCst);
    let sticky_write = Status {
        dnr: true,
        ..Status::WRITE_FAULT
    };
    assert_eq!(status_of(queue.flush(1)), sticky_write);
    assert_eq!(
        status_of(queue.write(1, 8, 4096, &[8u8; 4096])),
        sticky_write
    );
    let read = queue.read(1, 0, 4096, 4096).map(|_| ());
    assert_eq!(
        status_of(read),
        Status {
            dnr: true,
            ..Status::UNRECOVERED_READ_ERROR
        }
    );
    let failure = health.clear().unwrap();
    assert!(
        failure.to_string().starts_with("fdatasync failed"),
        "{failure}"
    );
    queue.flush(1).unwrap();
    assert_eq!(queue.read(1, 0, 4096, 4096).unwrap(), &[7u8; 4096][..]);
}

#[test]
fn a_failed_fua_write_fails_the_namespace() {
    let (plane, switches, health) = start("fua");
    let mut queue = connect(&plane);
    switches.fail_fua_writes.store(true, Ordering::SeqCst);
    let cid = queue.next_cid();
    queue.buffer(cid)[..4096].fill(3);
    let mut command = read_write(io_opcode::WRITE, 1, 0, 1);
    command[51] |= 0x40; // CDW12 bit 30: FUA
    let done = queue
        .run(command, DataTransfer::ToController(4096))
        .unwrap();
    assert_eq!(done.status, Status::WRITE_FAULT);
    assert!(health.is_failed());
    switches.fail_fua_writes.store(false, Ordering::SeqCst);
    assert!(status_of(queue.flush(1)).dnr);
}

#[test]
fn zeroing_writes_zeroes_where_holes_cannot_be_punched_and_fua_syncs() {
    let (plane, switches, health) = start("zeroes");
    let mut queue = connect(&plane);
    switches.refuse_punch_holes.store(true, Ordering::SeqCst);
    // 64 blocks (256 KiB, two slot buffers' worth) of pattern, zeroed in part.
    for slba in [0u64, 32] {
        queue.write(1, slba, 4096, &[9u8; 128 << 10]).unwrap();
    }
    queue.write_zeroes(1, 4, 50).unwrap();
    let data = queue.read(1, 0, 4096, 128 << 10).unwrap().to_vec();
    assert!(data[..4 * 4096].iter().all(|&b| b == 9));
    assert!(data[4 * 4096..].iter().all(|&b| b == 0));
    let data = queue.read(1, 32, 4096, 128 << 10).unwrap().to_vec();
    assert!(data[..22 * 4096].iter().all(|&b| b == 0));
    assert!(data[22 * 4096..].iter().all(|&b| b == 9));
    queue.deallocate(1, &[(60, 2)]).unwrap();
    assert_eq!(
        switches.punches.load(Ordering::SeqCst),
        1,
        "after one refusal, zeroing writes zeroes at once"
    );
    assert_eq!(queue.read(1, 60, 4096, 8192).unwrap(), &[0u8; 8192][..]);
    // Write Zeroes with FUA syncs: a failing sync fails it and the namespace.
    switches.fail_syncs.store(true, Ordering::SeqCst);
    let mut command = sqe(io_opcode::WRITE_ZEROES, 1);
    command[48..52].copy_from_slice(&(1u32 << 30).to_le_bytes()); // NLB 0 (one block), FUA
    let done = queue.run(command, DataTransfer::None).unwrap();
    assert_eq!(done.status, Status::WRITE_FAULT);
    assert!(health.is_failed());
}
