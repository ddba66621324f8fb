//! Exports updated while hosts are connected, through weft's user-space
//! initiator over real TCP: connected controllers see the new configuration.
//! (The initiator does not listen for Asynchronous Events; the protocol
//! core's unit tests cover the Namespace Attribute Changed event itself.)

mod support;

use std::sync::Arc;
use weft_initiator::{read_write, ConnectOptions, Controller, InitiatorError, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::host::DataTransfer;
use weft_proto::status::Status;
use weft_proto::testing::TEST_NQN;
use weft_proto::TargetConfig;
use weft_target::{DataPlane, Exports};

/// Serves a copy of the current exports with `change` applied to their configuration.
fn update(plane: &DataPlane, change: impl FnOnce(&mut TargetConfig)) {
    let exports = plane.exports();
    let mut config = TargetConfig::clone(&exports.config);
    change(&mut config);
    config.generation += 1;
    let devices = exports
        .devices
        .iter()
        .take(config.subsystems.len())
        .cloned()
        .collect();
    plane.update_exports(Arc::new(Exports::new(Arc::new(config), devices)));
}

#[test]
fn a_namespace_resized_while_connected_reports_its_new_size() {
    let plane = support::start_plane("update-resize");
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    let mut controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    let mut queue = controller.open_io_queue(1).unwrap();
    let blocks = support::RAM_BYTES / 512;
    assert_eq!(controller.namespace(1).unwrap().blocks, blocks);
    let shrunk = blocks / 2;
    update(&plane, |config| {
        config.subsystems[0].namespaces[0].blocks = shrunk;
    });
    support::eventually("Identify Namespace with the new size", || {
        controller.namespace(1).unwrap().blocks == shrunk
    });
    assert_eq!(
        controller.namespace(2).unwrap().blocks * 4096,
        support::FILE_BYTES
    );
    let mut read = |slba: u64| {
        let command = read_write(io_opcode::READ, 1, slba, 1);
        queue
            .run(command, DataTransfer::FromController(512))
            .unwrap()
            .status
    };
    support::eventually("the I/O queue checking the new size", || {
        read(shrunk) == Status::LBA_OUT_OF_RANGE
    });
    assert_eq!(read(shrunk - 1), Status::SUCCESS);
}

#[test]
fn a_removed_subsystem_ends_its_controllers() {
    let plane = support::start_plane("update-remove");
    let url = TargetUrl::parse(&format!("nvme-tcp://{}/{TEST_NQN}", plane.listening[0])).unwrap();
    let mut controller = Controller::connect(&url, ConnectOptions::default(), 1).unwrap();
    update(&plane, |config| config.subsystems.clear());
    assert!(
        controller.namespaces().is_err(),
        "the admin queue's connection was closed"
    );
    let error = Controller::connect(&url, ConnectOptions::default(), 1).unwrap_err();
    assert!(
        matches!(error, InitiatorError::UnknownNqn { .. }),
        "{error}"
    );
}
