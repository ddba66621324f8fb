//! The connection's tests: in-memory host/target pairs (`crate::testing`).

use super::*;
use crate::ana::{AnaConfig, AnaGroupId, AnaState};
use crate::auth::{DhchapSecret, FailureReason, HostAuthError, HostKeys};
use crate::command::{admin_opcode, io_opcode};
use crate::pdu::PduType;
use crate::target::{AddressFamily, AllowedHost, HostAccess, ListenerConfig};
use crate::testing::*;
use crate::wire::{ascii_field, hex};
use std::time::Duration;

/// An admin queue (kept alive) and a second I/O queue of SQSIZE 3: four entries.
fn queue_of_four_entries(target: &Arc<Target>) -> (Pair, Pair) {
    let (mut admin, _) = ready_io_queue(target);
    let cntlid = admin.connection.cntlid().unwrap();
    let _ = admin.simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false));
    let mut io = Pair::new(target);
    assert_eq!(io.connect_io(cntlid, 2, 3).status(), Status::SUCCESS);
    (admin, io)
}

fn ready_io_queue(target: &Arc<Target>) -> (Pair, Pair) {
    let mut admin = Pair::new(target);
    let cntlid = admin.connect_admin(TEST_NQN, 5000);
    let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut queues, 10, 0x07);
    set_cdw(&mut queues, 11, 0x0001_0001);
    let response = admin.simple(&queues);
    assert_eq!(response.status(), Status::SUCCESS);
    let mut io = Pair::new(target);
    let connected = io.connect_io(cntlid, 1, 127);
    assert_eq!(connected.status(), Status::SUCCESS);
    (admin, io)
}

#[test]
fn admin_connect_properties_and_identify() {
    let target = test_target();
    let mut host = Pair::new(&target);
    let cntlid = host.connect_admin(TEST_NQN, 5000);
    assert!(cntlid >= 1);
    let cap = host.simple(&property_get(4, 0)).result();
    assert_eq!(cap & 0xFFFF, 127, "MQES");
    assert_eq!((cap >> 37) & 1, 1, "NVM command set");
    assert_eq!(
        host.simple(&property_get(5, 0x1C)).result() & 1,
        1,
        "CSTS.RDY after CC.EN"
    );
    let (data, response) = host.read_data(&identify(6, 1, 0));
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(data.len(), 4096);
    assert_eq!(ascii_field(&data[768..1024]), TEST_NQN);
    assert_eq!(ascii_field(&data[24..64]), "weft");
    assert_eq!(u16::from_le_bytes([data[78], data[79]]), cntlid);
    assert_eq!(
        u32::from_le_bytes(data[516..520].try_into().unwrap()),
        2,
        "NN"
    );
    let (list, _) = host.read_data(&identify(7, 2, 0));
    assert_eq!(&list[..12], &hex("01000000 02000000 00000000")[..]);
    let (ns, _) = host.read_data(&identify(8, 0, 2));
    assert_eq!(u64::from_le_bytes(ns[0..8].try_into().unwrap()), 256);
    assert_eq!(ns[130], 12, "LBADS of namespace 2");
    let (inactive, response) = host.read_data(&identify(9, 0, 9));
    assert_eq!(response.status(), Status::SUCCESS);
    assert!(
        inactive.iter().all(|&b| b == 0),
        "inactive NSIDs read as zeroes"
    );
    let (descriptors, _) = host.read_data(&identify(10, 3, 1));
    assert_eq!(&descriptors[12..16], &[2, 16, 0, 0]);
    assert_eq!(
        host.simple(&identify(11, 0x7F, 0)).status(),
        Status::INVALID_FIELD
    );
}

#[test]
fn features_and_log_pages() {
    let target = test_target();
    let mut host = Pair::new(&target);
    host.connect_admin(TEST_NQN, 5000);
    let mut get_kato = sqe(admin_opcode::GET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut get_kato, 10, 0x0F);
    assert_eq!(host.simple(&get_kato).result(), 5000);
    let mut saveable = sqe(admin_opcode::SET_FEATURES, 4, 0, 0, false);
    set_cdw(&mut saveable, 10, 0x8000_000B);
    assert_eq!(
        host.simple(&saveable).status(),
        Status::FEATURE_NOT_SAVEABLE
    );
    let (smart, response) = host.read_data(&get_log_page(5, 0x02, 512, 0));
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(smart[3], 100, "available spare");
    let (firmware, _) = host.read_data(&get_log_page(6, 0x03, 512, 0));
    assert_eq!(ascii_field(&firmware[8..16]), "0.1.0");
    assert_eq!(
        host.simple(&get_log_page(7, 0x70, 1024, 0)).status(),
        Status::INVALID_LOG_PAGE
    );
    assert_eq!(
        host.simple(&get_log_page(8, 0xC0, 512, 0)).status(),
        Status::INVALID_LOG_PAGE
    );
    let mut mismatched = get_log_page(9, 0x02, 512, 0);
    mismatched[32..36].copy_from_slice(&4096u32.to_le_bytes());
    assert_eq!(
        host.simple(&mismatched).status(),
        Status::SGL_LENGTH_INVALID
    );
    let ka = host.simple(&sqe(admin_opcode::KEEP_ALIVE, 10, 0, 0, false));
    assert_eq!(ka.status(), Status::SUCCESS);
    assert_eq!(ka.cid(), 10);
}

#[test]
fn discovery_log_lists_subsystems_and_windows() {
    let target = test_target();
    let mut host = Pair::new(&target);
    host.connect_admin(DISCOVERY_NQN, 0);
    let (header, response) = host.read_data(&get_log_page(3, 0x70, 1024, 0));
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(
        u64::from_le_bytes(header[8..16].try_into().unwrap()),
        2,
        "the subsystem and the discovery subsystem"
    );
    let (page, _) = host.read_data(&get_log_page(4, 0x70, 3072, 0));
    assert_eq!(ascii_field(&page[1024 + 256..1024 + 512]), TEST_NQN);
    assert_eq!(page[1024 + 2], 2, "NVM subsystem");
    assert_eq!(ascii_field(&page[2048 + 256..2048 + 512]), DISCOVERY_NQN);
    let (second, _) = host.read_data(&get_log_page(5, 0x70, 1024, 2048));
    assert_eq!(
        &second[..],
        &page[2048..3072],
        "a window at an offset is the same bytes"
    );
    let (controller, _) = host.read_data(&identify(6, 1, 0));
    assert_eq!(controller[111], 2, "CNTRLTYPE discovery");
    assert_eq!(
        host.simple(&identify(7, 0, 1)).status(),
        Status::INVALID_FIELD
    );
}

#[test]
fn reads_and_writes_in_capsule_and_by_r2t() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let write = rw(io_opcode::WRITE, 1, 2, 3, 1, 4096, true);
    let response = io.command(&write, &block).pop().unwrap();
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(&io.disks[&2][3 * 4096..4 * 4096], &block[..]);
    let (read, response) = io.read_data(&rw(io_opcode::READ, 2, 2, 3, 1, 4096, false));
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(read, block);
    // 64 KiB by R2T, arriving as four H2CData PDUs of 16 KiB.
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let response = io.write_r2t(
        &rw(io_opcode::WRITE, 3, 1, 10, 128, 65536, false),
        &big,
        16384,
    );
    assert_eq!(response.status(), Status::SUCCESS);
    let (read, _) = io.read_data(&rw(io_opcode::READ, 4, 1, 10, 128, 65536, false));
    assert_eq!(read, big);
    let compare_same = io
        .command(&rw(io_opcode::COMPARE, 5, 2, 3, 1, 4096, true), &block)
        .pop()
        .unwrap();
    assert_eq!(compare_same.status(), Status::SUCCESS);
    let compare_other = io
        .command(&rw(io_opcode::COMPARE, 6, 2, 4, 1, 4096, true), &block)
        .pop()
        .unwrap();
    assert_eq!(compare_other.status(), Status::COMPARE_FAILURE);
    let mut zeroes = rw(io_opcode::WRITE_ZEROES, 7, 2, 3, 1, 0, false);
    set_cdw(&mut zeroes, 12, 1 << 25);
    assert_eq!(io.simple(&zeroes).status(), Status::SUCCESS);
    assert!(io.disks[&2][3 * 4096..4 * 4096].iter().all(|&b| b == 0));
    let flush = io.simple(&sqe(io_opcode::FLUSH, 8, 0xFFFF_FFFF, 0, false));
    assert_eq!(flush.status(), Status::SUCCESS);
}

#[test]
fn dataset_management_deallocates_ranges() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    io.disks.get_mut(&1).unwrap().fill(0xAA);
    let ranges = hex("00000000 02000000 0400000000000000  00000000 01000000 1000000000000000");
    let mut dsm = sqe(io_opcode::DATASET_MANAGEMENT, 1, 1, 32, true);
    set_cdw(&mut dsm, 10, 1);
    set_cdw(&mut dsm, 11, 1 << 2);
    let response = io.command(&dsm, &ranges).pop().unwrap();
    assert_eq!(response.status(), Status::SUCCESS);
    let disk = &io.disks[&1];
    assert!(disk[4 * 512..6 * 512].iter().all(|&b| b == 0));
    assert!(disk[16 * 512..17 * 512].iter().all(|&b| b == 0));
    assert_eq!(disk[6 * 512], 0xAA);
}

#[test]
fn invalid_commands_get_the_spec_status_and_the_queue_carries_on() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    let beyond = io.simple(&rw(io_opcode::READ, 1, 1, 511, 2, 1024, false));
    assert_eq!(beyond.status(), Status::LBA_OUT_OF_RANGE);
    assert_eq!(
        io.simple(&rw(io_opcode::READ, 2, 7, 0, 1, 512, false))
            .status(),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(
        io.simple(&sqe(0x7C, 3, 1, 0, false)).status(),
        Status::INVALID_OPCODE
    );
    let mut prp = rw(io_opcode::READ, 4, 1, 0, 1, 512, false);
    prp[1] = 0;
    assert_eq!(io.simple(&prp).status(), Status::INVALID_FIELD);
    // A write whose SGL promises more than the command transfers.
    let short = io
        .command(&rw(io_opcode::WRITE, 5, 1, 0, 1, 1024, true), &[0u8; 1024])
        .pop()
        .unwrap();
    assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
    let (_, response) = io.read_data(&rw(io_opcode::READ, 6, 1, 0, 1, 512, false));
    assert_eq!(response.status(), Status::SUCCESS);
}

#[test]
fn digests_protect_headers_and_data() {
    let target = test_target();
    let mut admin = Pair::new(&target);
    admin.header_digest = true;
    admin.data_digest = true;
    let cntlid = admin.connect_admin(TEST_NQN, 5000);
    let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut queues, 10, 0x07);
    assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);
    let mut io = Pair::new(&target);
    io.header_digest = true;
    io.data_digest = true;
    assert_eq!(io.connect_io(cntlid, 1, 63).status(), Status::SUCCESS);
    let data = vec![0x5Au8; 8192];
    let response = io.write_r2t(&rw(io_opcode::WRITE, 1, 2, 0, 2, 8192, false), &data, 4096);
    assert_eq!(response.status(), Status::SUCCESS);
    let (read, _) = io.read_data(&rw(io_opcode::READ, 2, 2, 0, 2, 8192, false));
    assert_eq!(read, data, "C2HData digest verified by the host model");
    // A corrupted data digest fails only that command, with a retryable status.
    let mut capsule = io.capsule(&rw(io_opcode::WRITE, 3, 2, 5, 1, 4096, true), &[1u8; 4096]);
    let last = capsule.len() - 1;
    capsule[last] ^= 0xFF;
    io.send(&capsule);
    let response = io.expect();
    assert_eq!(response.status(), Status::TRANSIENT_TRANSPORT_ERROR);
    assert!(
        io.disks[&2][5 * 4096..6 * 4096].iter().all(|&b| b == 0),
        "nothing written"
    );
    // A corrupted header digest is fatal.
    let mut capsule = io.capsule(&rw(io_opcode::READ, 4, 2, 0, 1, 4096, false), &[]);
    capsule[72] ^= 0xFF;
    io.send(&capsule);
    let term = io.expect();
    assert_eq!(
        term.fatal_status(),
        FatalErrorStatus::HeaderDigestError as u16
    );
    assert!(io.connection.is_closed());
}

/// A socket that never sends ICReq holds buffers for nothing: closed at
/// the ICReq deadline, counted from the first time the driver passes.
#[test]
fn a_silent_socket_is_closed_at_the_icreq_deadline() {
    let target = test_target();
    let mut host = Pair::new(&target);
    host.advance(Duration::ZERO);
    assert_eq!(
        host.connection.poll_timeout(),
        Some(Timestamp(Duration::from_secs(10)))
    );
    host.advance(Duration::from_millis(9_999));
    assert!(!host.connection.is_closed());
    host.advance(Duration::from_millis(1));
    assert!(host.connection.is_closed());
    assert_eq!(
        host.connection.termination(),
        Some(&Termination::SetupTimeout)
    );
}

/// After ICResp the queue must connect within its deadline; once
/// connected, the setup deadline no longer applies.
#[test]
fn connect_must_follow_icresp_within_its_deadline() {
    let target = test_target();
    let mut slow = Pair::new(&target);
    slow.advance(Duration::from_secs(5));
    slow.initialize(false, false);
    slow.advance(Duration::from_millis(9_999));
    assert!(
        !slow.connection.is_closed(),
        "10 s from ICResp, not from accept"
    );
    slow.advance(Duration::from_millis(1));
    assert_eq!(
        slow.connection.termination(),
        Some(&Termination::SetupTimeout)
    );
    let mut prompt = Pair::new(&target);
    prompt.advance(Duration::ZERO);
    prompt.connect_admin(TEST_NQN, 0);
    prompt.advance(Duration::from_secs(60));
    assert!(!prompt.connection.is_closed());
}

/// A subsystem has at most `controllers_per_subsystem_max` controllers;
/// one more is refused as nvmet refuses when it has no controller ID left.
#[test]
fn controllers_per_subsystem_are_limited() {
    let mut config = TargetConfig::clone(&test_target().config());
    config.limits.controllers_per_subsystem_max = 2;
    let target = Target::new(config, Arc::clone(&test_target().random));
    let mut first = Pair::new(&target);
    first.connect_admin(TEST_NQN, 0);
    let mut second = Pair::new(&target);
    second.connect_admin(TEST_NQN, 0);
    let mut third = Pair::new(&target);
    third.initialize(false, false);
    let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let response = third.command(&sqe, &data).pop().unwrap();
    assert_eq!(
        response.status(),
        Status {
            dnr: true,
            ..Status::CONNECT_CONTROLLER_BUSY
        }
    );
    // Discovery counts on its own.
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    first.connection.on_closed();
    let mut again = Pair::new(&target);
    again.connect_admin(TEST_NQN, 0);
}

#[test]
fn keep_alive_expiry_tears_the_controller_down() {
    let target = test_target();
    let (mut admin, mut io) = ready_io_queue(&target);
    admin.advance(Duration::from_millis(4000));
    assert_eq!(
        admin
            .simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false))
            .status(),
        Status::SUCCESS
    );
    admin.advance(Duration::from_millis(4000));
    assert!(
        !admin.connection.is_closed(),
        "the Keep Alive restarted the timer"
    );
    admin.advance(Duration::from_millis(1001));
    assert!(
        !admin.connection.is_closed(),
        "KATO (5 s) passed: the timer's granule (1 s) is slack"
    );
    admin.advance(Duration::from_millis(1000));
    assert!(admin.connection.is_closed());
    assert_eq!(
        admin.connection.termination(),
        Some(&Termination::KeepAliveExpired)
    );
    assert!(target.registry.is_empty());
    io.advance(Duration::from_millis(250));
    assert_eq!(
        io.connection.termination(),
        Some(&Termination::ControllerGone)
    );
}

/// Anyone may connect to discovery: one peer address holds a few
/// discovery controllers (256 idle ones from one stranger refused every
/// host's discovery); over that, Controller Busy without DNR, and other
/// addresses discover.
#[test]
fn discovery_controllers_are_few_per_peer_address() {
    let target = test_target();
    let discover_from = |address: &str| {
        let mut pair = Pair::new(&target);
        pair.connection.set_peer(address.parse().unwrap());
        pair.initialize(false, false);
        let (command, data) = connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
        let response = pair.command(&command, &data).pop().expect("a response");
        (pair, response.status())
    };
    let held: Vec<Pair> = (0..Limits::DEFAULT.discovery_controllers_per_address)
        .map(|_| {
            let (pair, status) = discover_from("192.0.2.7");
            assert_eq!(status, Status::SUCCESS);
            pair
        })
        .collect();
    let (_, busy) = discover_from("192.0.2.7");
    assert_eq!(busy, Status::CONNECT_CONTROLLER_BUSY);
    assert!(!busy.dnr);
    let (_host, status) = discover_from("192.0.2.8");
    assert_eq!(status, Status::SUCCESS);
    drop(held);
}

/// KATO 0 on a discovery controller is two minutes (as nvmet): idle
/// discovery connections cannot hold the registry's places for good.
#[test]
fn an_idle_discovery_controller_without_keep_alive_expires_after_two_minutes() {
    let target = test_target();
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let mut kato = sqe(admin_opcode::GET_FEATURES, 7, 0, 0, false);
    set_cdw(
        &mut kato,
        10,
        u32::from(crate::admin::feature::KEEP_ALIVE_TIMER),
    );
    assert_eq!(discovery.simple(&kato).result(), 120_000);
    discovery.advance(Duration::from_secs(119));
    assert!(!discovery.connection.is_closed());
    discovery.advance(Duration::from_secs(3));
    assert_eq!(
        discovery.connection.termination(),
        Some(&Termination::KeepAliveExpired)
    );
    assert!(target.registry.is_empty());
    // An I/O controller's KATO 0 still means no keep-alive.
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    admin.advance(Duration::from_secs(3600));
    assert!(!admin.connection.is_closed());
}

#[test]
fn connect_errors_name_the_parameter() {
    let target = test_target();
    let mut host = Pair::new(&target);
    host.initialize(false, false);
    let (command, data) = connect_command(1, 0, 31, 0, 0xFFFF, "nqn.2026-11.io.weft:missing");
    let response = host.command(&command, &data).pop().unwrap();
    assert_eq!(response.status(), Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(
        response.result(),
        (1 << 16) | 256,
        "IATTR data, offset of SUBNQN"
    );
    let (command, data) = connect_command(2, 0, 200, 0, 0xFFFF, TEST_NQN);
    let response = host.command(&command, &data).pop().unwrap();
    assert_eq!(response.result(), 44, "offset of SQSIZE in the SQE");
    let mut io = Pair::new(&target);
    assert_eq!(
        io.connect_io(77, 1, 31).status(),
        Status::CONNECT_INVALID_PARAMETERS
    );
    let (admin, _) = ready_io_queue(&target);
    let cntlid = admin.connection.cntlid().unwrap();
    let mut beyond = Pair::new(&target);
    assert_eq!(
        beyond.connect_io(cntlid, 65, 31).result(),
        42,
        "qid beyond the granted queues"
    );
    let mut twice = Pair::new(&target);
    assert_eq!(
        twice.connect_io(cntlid, 1, 31).status(),
        Status::CONNECT_CONTROLLER_BUSY
    );
}

#[test]
fn sq_flow_control_disabled_uses_the_success_flag() {
    let target = test_target();
    let (mut admin, _) = ready_io_queue(&target);
    let cntlid = admin.connection.cntlid().unwrap();
    let _ = admin.simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false));
    let mut io = Pair::new(&target);
    io.initialize(false, false);
    let (mut command, data) = connect_command(1, 2, 31, 0, cntlid, TEST_NQN);
    command[46] = ConnectCommand::CATTR_DISABLE_SQ_FLOW;
    assert_eq!(
        io.command(&command, &data).pop().unwrap().status(),
        Status::SUCCESS
    );
    io.send(&io.capsule(&rw(io_opcode::READ, 2, 1, 0, 1, 512, false), &[]));
    let pdu = io.expect();
    assert_eq!(pdu.pdu_type, PduType::C2hData as u8);
    assert_eq!(
        pdu.flags & (flags::SUCCESS | flags::LAST_PDU),
        flags::SUCCESS | flags::LAST_PDU
    );
    assert!(
        io.receive().is_none(),
        "no CapsuleResp after a SUCCESS C2HData"
    );
}

/// Sends `bytes` on a fresh connection (after ICReq, and Connect if `connected`)
/// and returns the C2HTermReq's FES and FEI.
fn term_req_for(connected: bool, initialized: bool, bytes: &[u8]) -> (u16, u32) {
    let target = test_target();
    let mut host = Pair::new(&target);
    if connected {
        host.connect_admin(TEST_NQN, 0);
    } else if initialized {
        host.initialize(false, false);
    }
    host.send(bytes);
    let term = host.expect();
    assert!(
        host.connection.is_closed(),
        "a fatal error closes the connection"
    );
    (
        term.fatal_status(),
        u32::from_le_bytes(term.header[10..14].try_into().unwrap()),
    )
}

#[test]
fn malformed_pdus_end_the_connection_with_the_right_status() {
    let capsule_header = |hlen: u8, pdo: u8, plen: u32, pdu_flags: u8| {
        let mut pdu = vec![0x04, pdu_flags, hlen, pdo];
        pdu.extend_from_slice(&plen.to_le_bytes());
        pdu.resize(plen.max(72) as usize, 0);
        pdu
    };
    let identify_capsule = {
        let mut pdu = vec![0x04, 0, 72, 0, 72, 0, 0, 0];
        pdu.extend_from_slice(&identify(1, 1, 0));
        pdu
    };
    let mut icreq = [0u8; 128];
    IcReq {
        pfv: 0,
        hpda: 0,
        digest: 0,
        maxr2t: 0,
    }
    .encode(&mut icreq);
    let mut bad_pfv = icreq;
    bad_pfv[8] = 1;
    let h2c_unknown = {
        let mut pdu = vec![0x06, 0x04, 24, 24];
        pdu.extend_from_slice(&(24u32 + 512).to_le_bytes());
        pdu.extend_from_slice(&hex("0100 0500 00000000 00020000 00000000"));
        pdu.resize(24 + 512, 0);
        pdu
    };
    // (name, connect first, ICReq first, bytes, FES, FEI)
    type Case = (&'static str, bool, bool, Vec<u8>, u16, u32);
    let cases: Vec<Case> = vec![
        (
            "unknown PDU type",
            true,
            true,
            hex("08 00 18 00 18000000 0000000000000000 0000000000000000"),
            1,
            0,
        ),
        (
            "controller-to-host type",
            true,
            true,
            hex("05 00 18 00 18000000 0000000000000000 0000000000000000"),
            1,
            0,
        ),
        (
            "capsule with a wrong HLEN",
            true,
            true,
            capsule_header(50, 0, 72, 0),
            1,
            2,
        ),
        (
            "capsule with PLEN shorter than its header",
            true,
            true,
            capsule_header(72, 0, 40, 0),
            1,
            4,
        ),
        (
            "PDO inside the header",
            true,
            true,
            capsule_header(72, 8, 72 + 512, 0),
            1,
            3,
        ),
        (
            "header digest flag not negotiated",
            true,
            true,
            capsule_header(72, 0, 76, 0x01),
            1,
            1,
        ),
        (
            "in-capsule data beyond IOCCSZ",
            true,
            true,
            capsule_header(72, 72, 72 + 64 * 1024, 0),
            5,
            0,
        ),
        (
            "a command before ICReq",
            false,
            false,
            identify_capsule.clone(),
            2,
            0,
        ),
        (
            "a command other than Connect first",
            false,
            true,
            identify_capsule,
            2,
            0,
        ),
        ("a second ICReq", true, true, icreq.to_vec(), 2, 0),
        ("an unsupported PFV", false, false, bad_pfv.to_vec(), 6, 8),
        (
            "H2CData for an unknown transfer",
            true,
            true,
            h2c_unknown,
            1,
            10,
        ),
    ];
    for (name, connected, initialized, bytes, fes, fei) in cases {
        assert_eq!(
            term_req_for(connected, initialized, &bytes),
            (fes, fei),
            "{name}"
        );
    }
}

#[test]
fn h2c_data_outside_the_r2t_window_is_fatal() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 1, 0, 8, 4096, false), &[]));
    let r2t = io.expect();
    let header = DataHeader::decode(&r2t.header).unwrap();
    let pdu = io.h2c_data(1, header.ttag, 2048, &[0u8; 512], false);
    io.send(&pdu);
    assert_eq!(
        io.expect().fatal_status(),
        FatalErrorStatus::DataTransferOutOfRange as u16
    );
}

#[test]
fn more_commands_than_queue_entries_is_fatal() {
    let target = test_target();
    let (_admin, mut io) = queue_of_four_entries(&target);
    io.hold_io = true;
    // SQSIZE 3: four entries may be outstanding, not five.
    for cid in 0..5 {
        io.send(&io.capsule(&rw(io_opcode::READ, cid, 1, 0, 1, 512, false), &[]));
    }
    assert_eq!(
        io.expect().fatal_status(),
        FatalErrorStatus::PduSequenceError as u16
    );
}

/// A host sends its next commands once it has the completions, which
/// can be before the target reaps the send that carried them (the reads'
/// slots still hold their data): at the queue's depth, none is refused.
#[test]
fn commands_may_follow_completions_whose_send_is_not_reaped() {
    let target = test_target();
    let (_admin, mut io) = queue_of_four_entries(&target);
    io.hold_transmit = true;
    // A host at depth 4: a new command for every completion it has,
    // while the target reaps its sends only when the host waits.
    let (mut sent, mut in_flight, mut done) = (0u16, 0, 0);
    for _ in 0..1000 {
        if done == 40 {
            break;
        }
        while in_flight < 4 && sent < 40 {
            io.send(&io.capsule(&rw(io_opcode::READ, sent, 1, 0, 1, 512, false), &[]));
            sent += 1;
            in_flight += 1;
        }
        let mut completed = 0;
        while let Some(pdu) = io.receive() {
            assert_ne!(pdu.pdu_type, PduType::C2hTermReq as u8, "after {done}");
            if pdu.pdu_type == PduType::CapsuleResp as u8 {
                completed += 1;
            }
        }
        if completed == 0 {
            io.finish_transmit();
        }
        in_flight -= completed;
        done += completed;
    }
    assert_eq!(done, 40);
    io.finish_transmit();
    assert!(io.connection.termination().is_none());
    // Past the depth (five not completed) is still refused.
    io.hold_io = true;
    for cid in 100..105 {
        io.send(&io.capsule(&rw(io_opcode::READ, cid, 1, 0, 1, 512, false), &[]));
    }
    let mut last = io.expect();
    while let Some(pdu) = io.receive() {
        last = pdu;
    }
    assert_eq!(
        last.fatal_status(),
        FatalErrorStatus::PduSequenceError as u16
    );
}

/// A host that stops reading its socket cannot pile up completions the
/// target must keep: a command counts against the queue's entries until
/// its completion is handed out to be sent.
#[test]
fn a_host_that_does_not_read_its_completions_is_stopped_at_its_depth() {
    let target = test_target();
    let (_admin, mut io) = queue_of_four_entries(&target);
    // The first Flush's completion goes out (and is never reported
    // sent); the next four wait behind it, the sixth is one too many.
    io.hold_transmit = true;
    for cid in 0..5 {
        io.send(&io.capsule(&sqe(io_opcode::FLUSH, cid, 0xFFFF_FFFF, 0, false), &[]));
        assert!(io.connection.termination().is_none(), "flush {cid}");
    }
    io.send(&io.capsule(&sqe(io_opcode::FLUSH, 5, 0xFFFF_FFFF, 0, false), &[]));
    assert_eq!(
        io.connection.termination(),
        Some(&Termination::Protocol(PduError::status(
            FatalErrorStatus::PduSequenceError
        )))
    );
}

#[test]
fn byte_at_a_time_delivery_works() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    let block = vec![0x3Cu8; 512];
    let capsule = io.capsule(&rw(io_opcode::WRITE, 1, 1, 5, 1, 512, true), &block);
    for byte in capsule {
        io.send(&[byte]);
    }
    assert_eq!(io.expect().status(), Status::SUCCESS);
    assert_eq!(&io.disks[&1][5 * 512..6 * 512], &block[..]);
}

// ----- configuration updates -----

/// Applies `change` to a copy of the target's configuration, makes the
/// copy current and returns it, as the data plane's updater does.
fn update(target: &Arc<Target>, change: impl FnOnce(&mut TargetConfig)) -> Arc<TargetConfig> {
    let mut config = TargetConfig::clone(&target.config());
    change(&mut config);
    let config = Arc::new(config);
    target.replace_config(Arc::clone(&config), Timestamp::default());
    config
}

fn resize(target: &Arc<Target>, nsid: u32, blocks: u64) -> Arc<TargetConfig> {
    update(target, |config| {
        let ns = config.subsystems[0]
            .namespaces
            .iter_mut()
            .find(|ns| ns.nsid == Nsid(nsid))
            .expect("a test namespace");
        ns.blocks = blocks;
    })
}

/// A subsystem `nqn` with one namespace of 64 blocks of 512 bytes.
fn subsystem(nqn: &str) -> SubsystemConfig {
    let mut subsystem = test_target().config().subsystems[0].clone();
    subsystem.nqn = nqn.into();
    subsystem.namespaces.truncate(1);
    subsystem.namespaces[0].blocks = 64;
    subsystem
}

fn async_event_request(cid: u16) -> [u8; 64] {
    sqe(admin_opcode::ASYNC_EVENT_REQUEST, cid, 0, 0, false)
}

/// Set Features Asynchronous Event Configuration.
fn async_event_config(cid: u16, value: u32) -> [u8; 64] {
    let mut command = sqe(admin_opcode::SET_FEATURES, cid, 0, 0, false);
    set_cdw(&mut command, 10, 0x0B);
    set_cdw(&mut command, 11, value);
    command
}

/// The NSIDs in a Changed Namespace List, up to the first zero entry.
fn changed_list(host: &mut Pair, cid: u16, retain_event: bool) -> Vec<u32> {
    let mut command = get_log_page(cid, 0x04, 4096, 0);
    if retain_event {
        // CDW10: LID 04h, NUMDL 1023 (4 KiB), RAE.
        set_cdw(&mut command, 10, 0x04 | (1023 << 16) | (1 << 15));
    }
    let (page, response) = host.read_data(&command);
    assert_eq!(response.status(), Status::SUCCESS);
    page.chunks(4)
        .map(|entry| u32::from_le_bytes(entry.try_into().unwrap()))
        .take_while(|&nsid| nsid != 0)
        .collect()
}

/// An admin queue of [`TEST_NQN`] with Namespace Attribute Notices enabled.
fn admin_with_notices(target: &Arc<Target>) -> Pair {
    let mut admin = Pair::new(target);
    admin.connect_admin(TEST_NQN, 0);
    let response = admin.simple(&async_event_config(3, 1 << 8));
    assert_eq!(response.status(), Status::SUCCESS);
    admin
}

#[test]
fn a_resize_completes_a_parked_async_event_request() {
    let target = test_target();
    let mut admin = admin_with_notices(&target);
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    assert!(admin.receive().is_none(), "the request waits for an event");
    admin.update_config(resize(&target, 2, 512));
    let event = admin.expect();
    assert_eq!(event.cid(), 4);
    assert_eq!(event.status(), Status::SUCCESS);
    assert_eq!(
        event.result() as u32,
        0x0004_0002,
        "Notice, Namespace Attribute Changed, log page 04h"
    );
    assert_eq!(changed_list(&mut admin, 5, false), [2]);
    assert_eq!(changed_list(&mut admin, 6, false), [] as [u32; 0]);
    let (ns, _) = admin.read_data(&identify(7, 0, 2));
    assert_eq!(
        u64::from_le_bytes(ns[0..8].try_into().unwrap()),
        512,
        "NSZE"
    );
    assert_eq!(
        u64::from_le_bytes(ns[8..16].try_into().unwrap()),
        512,
        "NCAP"
    );
}

/// A discovery controller with Discovery Log Page Change Notices enabled
/// gets one event when what its host's log lists changes (a subsystem,
/// a referral), none for changes it cannot see, and none again until it
/// reads the log with RAE cleared.
#[test]
fn a_discovery_log_change_completes_a_parked_async_event_request() {
    let target = test_target();
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let (controller, _) = discovery.read_data(&identify(2, 1, 0));
    assert_eq!(
        u32::from_le_bytes(controller[92..96].try_into().unwrap()),
        1 << 31,
        "OAES: Discovery Log Page Change Notices"
    );
    let response = discovery.simple(&async_event_config(3, 1 << 31));
    assert_eq!(response.status(), Status::SUCCESS);
    discovery.send(&discovery.capsule(&async_event_request(4), &[]));
    // A subsystem this host may not connect to: its log does not change.
    discovery.update_config(update(&target, |config| {
        let mut hidden = subsystem("nqn.2026-11.io.weft:hidden");
        hidden.access = HostAccess::Only(Vec::new());
        config.subsystems.push(hidden);
    }));
    assert!(
        discovery.receive().is_none(),
        "nothing this host sees changed"
    );
    discovery.update_config(update(&target, |config| {
        config.referrals.push(ListenerConfig {
            port_id: 1,
            family: AddressFamily::Ipv4,
            address: "10.0.0.7".into(),
            service: "4420".into(),
        });
    }));
    let event = discovery.expect();
    assert_eq!(event.cid(), 4);
    assert_eq!(
        event.result() as u32,
        0x0070_F002,
        "Notice, Discovery Log Page Change, log page 70h"
    );
    // Masked until the host reads the log page (RAE cleared).
    discovery.send(&discovery.capsule(&async_event_request(5), &[]));
    discovery.update_config(update(&target, |config| {
        config.subsystems.push(subsystem("nqn.2026-11.io.weft:new"));
    }));
    assert!(discovery.receive().is_none(), "masked");
    let (_, response) = discovery.read_data(&get_log_page(6, 0x70, 1024, 0));
    assert_eq!(response.status(), Status::SUCCESS);
    discovery.update_config(update(&target, |config| {
        config
            .subsystems
            .push(subsystem("nqn.2026-11.io.weft:newer"));
    }));
    assert_eq!(discovery.expect().result() as u32, 0x0070_F002);
}

#[test]
fn no_event_unless_the_host_enabled_namespace_attribute_notices() {
    let target = test_target();
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    admin.update_config(resize(&target, 1, 1024));
    assert!(admin.receive().is_none(), "no event reported");
    // The log page still lists the change, as nvmet's does.
    assert_eq!(changed_list(&mut admin, 5, false), [1]);
}

#[test]
fn an_event_without_a_parked_request_completes_the_next_one() {
    let target = test_target();
    let mut admin = admin_with_notices(&target);
    admin.update_config(resize(&target, 1, 1024));
    assert!(admin.receive().is_none());
    let event = admin.simple(&async_event_request(4));
    assert_eq!(event.result() as u32, 0x0004_0002);
    // Reported, so masked: the next request waits.
    admin.send(&admin.capsule(&async_event_request(5), &[]));
    assert!(admin.receive().is_none());
}

#[test]
fn the_event_stays_masked_until_the_log_page_is_read_without_rae() {
    let target = test_target();
    let mut admin = admin_with_notices(&target);
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    admin.send(&admin.capsule(&async_event_request(5), &[]));
    admin.update_config(resize(&target, 1, 1024));
    assert_eq!(admin.expect().cid(), 4, "the oldest request reports it");
    admin.update_config(resize(&target, 2, 128));
    assert!(
        admin.receive().is_none(),
        "masked until the host reads the log"
    );
    assert_eq!(changed_list(&mut admin, 6, true), [1, 2]);
    admin.update_config(resize(&target, 2, 64));
    assert!(admin.receive().is_none(), "RAE kept the event, so the mask");
    assert_eq!(changed_list(&mut admin, 7, false), [1, 2]);
    admin.update_config(resize(&target, 1, 2048));
    let event = admin.expect();
    assert_eq!((event.cid(), event.result() as u32), (5, 0x0004_0002));
    assert_eq!(changed_list(&mut admin, 8, false), [1]);
}

#[test]
fn added_and_removed_namespaces_are_changed_ones() {
    let target = test_target();
    let mut admin = admin_with_notices(&target);
    let config = update(&target, |config| {
        let namespaces = &mut config.subsystems[0].namespaces;
        let mut added = namespaces[0].clone();
        added.nsid = Nsid(7);
        namespaces.remove(0);
        namespaces.push(added);
    });
    admin.update_config(config);
    assert_eq!(
        admin.simple(&async_event_request(4)).result() as u32,
        0x0004_0002
    );
    assert_eq!(changed_list(&mut admin, 5, false), [1, 7]);
    let (list, _) = admin.read_data(&identify(6, 2, 0));
    assert_eq!(&list[..12], &hex("02000000 07000000 00000000")[..]);
    let (controller, _) = admin.read_data(&identify(7, 1, 0));
    assert_eq!(
        u32::from_le_bytes(controller[516..520].try_into().unwrap()),
        7,
        "NN"
    );
    assert_eq!(
        u32::from_le_bytes(controller[92..96].try_into().unwrap()) & (1 << 8),
        1 << 8,
        "OAES"
    );
}

#[test]
fn removing_a_subsystem_closes_its_queues() {
    let target = test_target();
    let (mut admin, mut io) = ready_io_queue(&target);
    let config = update(&target, |config| config.subsystems.clear());
    io.update_config(Arc::clone(&config));
    assert!(io.connection.is_closed());
    assert_eq!(
        io.connection.termination(),
        Some(&Termination::SubsystemRemoved)
    );
    assert_eq!(io.connection.subsystem_index(), None);
    admin.update_config(config);
    assert!(admin.connection.is_closed());
    assert_eq!(
        admin.connection.termination(),
        Some(&Termination::SubsystemRemoved)
    );
    admin.connection.on_closed();
    assert!(target.registry.is_empty(), "the controller is gone");
}

// ----- host access -----

/// The test target with its subsystem open to `hosts` only.
fn target_allowing(hosts: &[&str]) -> Arc<Target> {
    let target = test_target();
    update(&target, |config| {
        config.subsystems[0].access = HostAccess::Only(
            hosts
                .iter()
                .map(|h| AllowedHost {
                    nqn: h.to_string(),
                    keys: None,
                    tls_psk: None,
                })
                .collect(),
        );
    });
    target
}

// ----- TLS -----

const TLS_KEY: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000ff";

/// The test target open to the model host, which must come over TLS with
/// [`TLS_KEY`], and to [`OTHER_HOST`] in the clear.
fn target_with_tls_host() -> Arc<Target> {
    let target = test_target();
    let psk = crate::tls::psk::ConfiguredPsk::parse(TLS_KEY).unwrap();
    update(&target, |config| {
        config.subsystems[0].access = HostAccess::Only(vec![
            AllowedHost {
                nqn: HOST_NQN.to_string(),
                keys: None,
                tls_psk: Some(Arc::new(psk.clone())),
            },
            AllowedHost {
                nqn: OTHER_HOST.to_string(),
                keys: None,
                tls_psk: None,
            },
        ]);
    });
    target
}

fn tls_identity(host: &str, subsystem: &str) -> crate::tls::psk::Identity {
    let psk = crate::tls::psk::ConfiguredPsk::parse(TLS_KEY).unwrap();
    crate::tls::psk::Identity::of(&psk, 0, host, subsystem)
}

fn admin_connect_as(host: &mut Pair, hostnqn: &str, subnqn: &str) -> ReceivedPdu {
    host.initialize(false, false);
    let (sqe, mut data) = connect_command(1, 0, 31, 0, 0xFFFF, subnqn);
    data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
    data[512 + hostnqn.len()..768].fill(0);
    // A HOSTID of its own: an identifier is bound to the NQN it connects under.
    data[..16].fill(hostnqn.len() as u8);
    host.command(&sqe, &data).pop().unwrap()
}

#[test]
fn a_host_given_a_tls_psk_is_refused_in_the_clear_and_served_over_tls() {
    let target = target_with_tls_host();
    let mut plain = Pair::new(&target);
    let response = admin_connect_as(&mut plain, HOST_NQN, TEST_NQN);
    assert_eq!(response.status(), Status::CONNECT_INVALID_HOST);
    assert!(target.registry.is_empty());

    let mut over_tls = Pair::new(&target);
    over_tls
        .connection
        .set_tls_identity(tls_identity(HOST_NQN, TEST_NQN));
    let cntlid = over_tls.connect_admin(TEST_NQN, 0);
    let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut queues, 10, 0x07);
    set_cdw(&mut queues, 11, 0x0001_0001);
    assert_eq!(over_tls.simple(&queues).status(), Status::SUCCESS);
    let mut io = Pair::new(&target);
    io.connection
        .set_tls_identity(tls_identity(HOST_NQN, TEST_NQN));
    assert_eq!(io.connect_io(cntlid, 1, 31).status(), Status::SUCCESS);

    // Its discovery log says TLS 1.3 is required (what connect-all follows).
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let (page, _) = discovery.read_data(&get_log_page(3, 0x70, 4096, 0));
    let entry = &page[1024..2048];
    assert_eq!(ascii_field(&entry[256..512]), TEST_NQN);
    assert_eq!(
        (entry[3], entry[768]),
        (0x05, 2),
        "TREQ required, SECTYPE TLS 1.3"
    );

    // A host without a PSK still connects in the clear.
    let mut other = Pair::new(&target);
    assert_eq!(
        admin_connect_as(&mut other, OTHER_HOST, TEST_NQN).status(),
        Status::SUCCESS
    );
}

#[test]
fn a_tls_stream_carries_only_the_connects_its_identity_names() {
    let target = target_with_tls_host();
    // Another host's NQN inside the model host's stream: even one allowed in the clear.
    let mut host = Pair::new(&target);
    host.connection
        .set_tls_identity(tls_identity(HOST_NQN, TEST_NQN));
    let response = admin_connect_as(&mut host, OTHER_HOST, TEST_NQN);
    assert_eq!(response.status(), Status::CONNECT_INVALID_HOST);
    // A stream for another subsystem: refused at SUBNQN.
    let mut host = Pair::new(&target);
    host.connection
        .set_tls_identity(tls_identity(HOST_NQN, "nqn.2026-11.io.weft:vol:other"));
    let response = admin_connect_as(&mut host, HOST_NQN, TEST_NQN);
    assert_eq!(response.status(), Status::CONNECT_INVALID_PARAMETERS);
    assert_eq!(response.result(), (1 << 16) | 256);
    assert!(target.registry.is_empty());
}

#[test]
fn the_target_finds_a_hosts_tls_psks_by_its_identity() {
    use crate::tls::PskStore;
    let target = target_with_tls_host();
    let config = target.config();
    let identity = tls_identity(HOST_NQN, TEST_NQN);
    let psk = crate::tls::psk::ConfiguredPsk::parse(TLS_KEY).unwrap();
    let expected = identity.tls_psks(&psk);
    assert_eq!(config.tls_psks(identity.to_string().as_bytes()), expected);
    let discovery = tls_identity(HOST_NQN, DISCOVERY_NQN);
    assert_eq!(
        config.tls_psks(discovery.to_string().as_bytes()),
        discovery.tls_psks(&psk)
    );
    for unknown in [
        tls_identity(OTHER_HOST, TEST_NQN),
        tls_identity(HOST_NQN, "nqn.2026-11.io.weft:vol:other"),
    ] {
        assert!(
            config.tls_psks(unknown.to_string().as_bytes()).is_empty(),
            "{unknown}"
        );
    }
    assert!(config.tls_psks(b"not an identity").is_empty());
}

#[test]
fn a_host_not_allowed_is_refused_at_connect_and_not_listed_in_discovery() {
    let target = target_allowing(&["nqn.2014-08.org.nvmexpress:uuid:someone-else"]);
    let mut host = Pair::new(&target);
    host.initialize(false, false);
    let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let response = host.command(&sqe, &data).pop().unwrap();
    assert_eq!(response.status(), Status::CONNECT_INVALID_HOST);
    assert_eq!(
        response.result(),
        (1 << 16) | 512,
        "IATTR 1, IPO: the Host NQN"
    );
    assert!(target.registry.is_empty(), "no controller was created");
    let refused = host.connection.take_refused_host().unwrap();
    assert_eq!(refused.subnqn, TEST_NQN);
    assert_eq!(refused.hostnqn, crate::testing::HOST_NQN);
    assert_eq!(host.connection.take_refused_host(), None, "told once");
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let (page, _) = discovery.read_data(&get_log_page(3, 0x70, 2048, 0));
    assert_eq!(
        u64::from_le_bytes(page[8..16].try_into().unwrap()),
        1,
        "only the discovery subsystem"
    );
    assert_eq!(ascii_field(&page[1024 + 256..1024 + 512]), DISCOVERY_NQN);
}

#[test]
fn an_allowed_host_connects_and_loses_its_queues_when_access_is_revoked() {
    let target = target_allowing(&[HOST_NQN]);
    let (mut admin, mut io) = ready_io_queue(&target);
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let (header, _) = discovery.read_data(&get_log_page(3, 0x70, 1024, 0));
    assert_eq!(u64::from_le_bytes(header[8..16].try_into().unwrap()), 2);
    let config = update(&target, |config| {
        config.subsystems[0].access = HostAccess::Only(Vec::new());
    });
    io.update_config(Arc::clone(&config));
    admin.update_config(Arc::clone(&config));
    discovery.update_config(config);
    for queue in [&io, &admin] {
        assert_eq!(
            queue.connection.termination(),
            Some(&Termination::AccessRevoked)
        );
    }
    assert!(
        !discovery.connection.is_closed(),
        "discovery is not a subsystem"
    );
}

#[test]
fn an_io_queue_follows_its_subsystem_to_its_new_index() {
    let target = test_target();
    let (mut admin, mut io) = ready_io_queue(&target);
    assert_eq!(io.connection.subsystem_index(), Some(0));
    let config = update(&target, |config| {
        config
            .subsystems
            .insert(0, subsystem("nqn.2026-11.io.weft:first"));
    });
    io.update_config(Arc::clone(&config));
    admin.update_config(config);
    assert_eq!(io.connection.subsystem_index(), Some(1));
    assert!(admin.receive().is_none(), "its namespaces did not change");
    let (_, response) = io.read_data(&rw(io_opcode::READ, 1, 2, 255, 1, 4096, false));
    assert_eq!(response.status(), Status::SUCCESS);
}

#[test]
fn a_write_waiting_for_its_data_is_checked_against_the_new_configuration() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 2, 200, 8, 32768, false), &[]));
    let r2t = DataHeader::decode(&io.expect().header).unwrap();
    io.update_config(resize(&target, 2, 128));
    io.send(&io.h2c_data(1, r2t.ttag, 0, &[0xEE; 32768], true));
    assert_eq!(io.expect().status(), Status::LBA_OUT_OF_RANGE);
    assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn an_added_subsystem_is_connectable_and_discovered() {
    let target = test_target();
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let mut waiting = Pair::new(&target);
    let added = "nqn.2026-11.io.weft:added";
    let config = update(&target, |config| {
        config.subsystems.push(subsystem(added));
        config.generation += 1;
    });
    discovery.update_config(Arc::clone(&config));
    waiting.update_config(config);
    let (page, _) = discovery.read_data(&get_log_page(3, 0x70, 4096, 0));
    assert_eq!(
        u64::from_le_bytes(page[0..8].try_into().unwrap()),
        2,
        "GENCTR"
    );
    assert_eq!(
        u64::from_le_bytes(page[8..16].try_into().unwrap()),
        3,
        "NUMREC"
    );
    assert_eq!(ascii_field(&page[2048 + 256..2048 + 512]), added);
    waiting.connect_admin(added, 0);
    let (ns, _) = waiting.read_data(&identify(4, 0, 1));
    assert_eq!(u64::from_le_bytes(ns[0..8].try_into().unwrap()), 64);
    Pair::new(&target).connect_admin(added, 0);
}

/// A host given the largest FFDHE group authenticates an admin queue
/// with it: its Reply carries a 1,024-byte DH value in-capsule, as the
/// Linux host sends it.
#[test]
fn a_host_authenticates_with_the_ffdhe8192_group() {
    let target = test_target();
    let mut config = (*target.config()).clone();
    let keys = crate::auth::HostKeys {
        dh_group: crate::auth::DhGroup::Ffdhe8192,
        ..host_keys(true)
    };
    config.subsystems[0].access = HostAccess::Only(vec![AllowedHost {
        nqn: HOST_NQN.to_string(),
        keys: Some(Arc::new(keys)),
        tls_psk: None,
    }]);
    target.replace_config(Arc::new(config), Timestamp::default());
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    assert_eq!(admin.authenticate(host_keys(true), TEST_NQN), Ok(()));
    let (_, identified) = admin.read_data(&identify(4, 1, 0));
    assert_eq!(identified.status(), Status::SUCCESS);
}

#[test]
fn each_queue_of_a_host_with_a_secret_authenticates_before_other_commands() {
    let target = authenticating_target(true);
    let mut admin = Pair::new(&target);
    admin.initialize(false, false);
    let (connect, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let response = admin.command(&connect, &data).pop().unwrap();
    assert_eq!(response.status(), Status::SUCCESS);
    let cntlid = response.result() as u16;
    assert_eq!(response.result() >> 16, 2, "AUTHREQ.ATR (bit 17)");
    // Fabrics commands are allowed, others wait for authentication.
    let enable = property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
    assert_eq!(admin.simple(&enable).status(), Status::SUCCESS);
    let (_, refused) = admin.read_data(&identify(3, 1, 0));
    assert_eq!(refused.status(), Status::AUTH_REQUIRED);
    let secrets = host_keys(true);
    assert_eq!(admin.authenticate(secrets.clone(), TEST_NQN), Ok(()));
    let (_, identified) = admin.read_data(&identify(4, 1, 0));
    assert_eq!(identified.status(), Status::SUCCESS);
    let mut queues = sqe(admin_opcode::SET_FEATURES, 5, 0, 0, false);
    set_cdw(&mut queues, 10, 0x07);
    assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);

    let mut io = Pair::new(&target);
    let connected = io.connect_io(cntlid, 1, 31);
    assert_eq!(connected.result(), u64::from(cntlid) | 1 << 17);
    // A write is refused before any data is asked for.
    let write = rw(io_opcode::WRITE, 5, 1, 0, 8, 4096, false);
    assert_eq!(io.simple(&write).status(), Status::AUTH_REQUIRED);
    assert_eq!(io.authenticate(secrets, TEST_NQN), Ok(()));
    let (_, read) = io.read_data(&rw(io_opcode::READ, 6, 1, 0, 1, 512, false));
    assert_eq!(read.status(), Status::SUCCESS);

    let mut discovery = Pair::new(&target);
    discovery.initialize(false, false);
    let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
    let response = discovery.command(&sqe, &data).pop().unwrap();
    assert_eq!(response.result() >> 16, 0, "discovery is not authenticated");
}

/// A queue whose host must authenticate and does not by the Connect
/// deadline is closed with its controller; an authenticated one stays.
#[test]
fn a_queue_that_does_not_authenticate_by_the_connect_deadline_is_closed() {
    let target = authenticating_target(false);
    let mut lingering = Pair::new(&target);
    lingering.connect_admin(TEST_NQN, 0);
    let mut authenticated = Pair::new(&target);
    authenticated.connect_admin(TEST_NQN, 0);
    assert_eq!(
        authenticated.authenticate(host_keys(false), TEST_NQN),
        Ok(())
    );
    lingering.advance(Duration::from_secs(10));
    authenticated.advance(Duration::from_secs(10));
    assert_eq!(
        lingering.connection.termination(),
        Some(&Termination::SetupTimeout)
    );
    assert!(!authenticated.connection.is_closed());
    assert!(
        !target.registry.is_empty(),
        "the authenticated controller stays"
    );
    lingering.connection.on_closed();
}

/// An admin Connect to the test subsystem from peer `address`: the pair
/// and the Connect's status.
fn admin_connect_from(target: &Arc<Target>, address: &str) -> (Pair, Status) {
    let mut pair = Pair::new(target);
    pair.connection.set_peer(address.parse().unwrap());
    pair.initialize(false, false);
    let (command, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
    let response = pair.command(&command, &data).pop().expect("a response");
    (pair, response.status())
}

/// Strangers that name an allowed host but cannot authenticate hold a
/// controller until the Connect deadline: a few per address, and a few
/// dozen per subsystem (they filled a replica's controllers, and a planned
/// move got Controller Busy). Over either, Controller Busy without DNR (a
/// host tries again); a host that authenticated no longer counts.
#[test]
fn controllers_waiting_to_authenticate_are_few_per_address_and_per_subsystem() {
    let target = authenticating_target(false);
    let limits = Limits::DEFAULT;
    let connect_from = |address: String| admin_connect_from(&target, &address);
    let stranger = "192.0.2.1".to_string();
    let mut waiting: Vec<Pair> = (0..limits.pending_authentications_per_address)
        .map(|_| {
            let (pair, status) = connect_from(stranger.clone());
            assert_eq!(status, Status::SUCCESS);
            pair
        })
        .collect();
    let (_, busy) = connect_from(stranger.clone());
    assert_eq!(busy, Status::CONNECT_CONTROLLER_BUSY);
    assert!(!busy.dnr, "a host tries again");
    // Another address is served, and a host that authenticated frees its place.
    let (mut host, status) = connect_from("192.0.2.2".to_string());
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(host.authenticate(host_keys(false), TEST_NQN), Ok(()));
    assert_eq!(waiting[0].authenticate(host_keys(false), TEST_NQN), Ok(()));
    let (_again, status) = connect_from(stranger);
    assert_eq!(status, Status::SUCCESS);
    // Per subsystem: one from each of many addresses, up to the limit.
    let pending = usize::from(limits.pending_authentications_per_address);
    let more = usize::from(limits.pending_authentications_per_subsystem) - pending;
    let _many: Vec<Pair> = (0..more)
        .map(|n| {
            let (pair, status) = connect_from(format!("198.51.100.{n}"));
            assert_eq!(status, Status::SUCCESS);
            pair
        })
        .collect();
    let (_, busy) = connect_from("203.0.113.1".to_string());
    assert_eq!(busy, Status::CONNECT_CONTROLLER_BUSY);
}

/// In a cluster, strangers from many addresses naming a node's host NQN
/// take the places waiting to authenticate up to those kept for the
/// cluster's nodes: a node's Connect (a replica link, a planned move) still
/// gets a controller.
#[test]
fn places_are_kept_for_the_clusters_nodes() {
    let target = authenticating_target(false);
    let mut config = (*target.config()).clone();
    config.node_addresses = vec!["10.0.0.9".parse().unwrap()];
    target.replace_config(Arc::new(config), Timestamp::default());
    let limits = Limits::DEFAULT;
    let connect_from = |address: String| admin_connect_from(&target, &address);
    let strangers =
        limits.pending_authentications_per_subsystem - limits.controllers_reserved_for_nodes;
    let _waiting: Vec<Pair> = (0..strangers)
        .map(|n| {
            let (pair, status) = connect_from(format!("198.51.100.{n}"));
            assert_eq!(status, Status::SUCCESS);
            pair
        })
        .collect();
    let (_, busy) = connect_from("203.0.113.1".to_string());
    assert_eq!(busy, Status::CONNECT_CONTROLLER_BUSY);
    let (mut node, status) = connect_from("10.0.0.9".to_string());
    assert_eq!(status, Status::SUCCESS, "the node's place was kept");
    assert_eq!(node.authenticate(host_keys(false), TEST_NQN), Ok(()));
}

#[test]
fn a_wrong_secret_leaves_the_queue_unauthenticated() {
    let target = authenticating_target(false);
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    let wrong = HostKeys {
        host: DhchapSecret::parse(CONTROLLER_SECRET).unwrap(),
        controller: None,
        dh_group: crate::auth::DhGroup::Null,
    };
    assert_eq!(
        admin.authenticate(wrong, TEST_NQN),
        Err(HostAuthError::Refused(FailureReason::Failed))
    );
    let (_, refused) = admin.read_data(&identify(3, 1, 0));
    assert_eq!(refused.status(), Status::AUTH_REQUIRED);
    // The host may start over with the right one.
    assert_eq!(admin.authenticate(host_keys(false), TEST_NQN), Ok(()));
    let (_, identified) = admin.read_data(&identify(4, 1, 0));
    assert_eq!(identified.status(), Status::SUCCESS);
}

#[test]
fn authentication_commands_are_checked() {
    let target = authenticating_target(false);
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    let mut wrong_protocol = auth_command(fctype::AUTH_RECEIVE, 3, 4096, false);
    wrong_protocol[43] = 0xEA;
    assert_eq!(
        admin.simple(&wrong_protocol).status(),
        Status::INVALID_FIELD
    );
    let mut no_length = auth_command(fctype::AUTH_RECEIVE, 4, 4096, false);
    no_length[44..48].fill(0);
    assert_eq!(admin.simple(&no_length).status(), Status::INVALID_FIELD);
    let mut other_length = auth_command(fctype::AUTH_RECEIVE, 5, 4096, false);
    other_length[44] = 1;
    assert_eq!(
        admin.simple(&other_length).status(),
        Status::SGL_LENGTH_INVALID
    );
    // A host without a secret here has nothing to authenticate.
    let mut open = Pair::new(&test_target());
    open.connect_admin(TEST_NQN, 0);
    let receive = auth_command(fctype::AUTH_RECEIVE, 6, 4096, false);
    assert_eq!(
        open.simple(&receive).status(),
        Status::COMMAND_SEQUENCE_ERROR
    );
}

// ----- Asymmetric Namespace Access -----

/// Makes the test subsystem's ANA group `group` with `state`.
fn set_ana(target: &Arc<Target>, group: u32, state: AnaState) -> Arc<TargetConfig> {
    update(target, |config| {
        config.subsystems[0].ana = AnaConfig {
            group: AnaGroupId::new(group).expect("a valid group"),
            state,
        };
    })
}

/// Get Log Page ANA (0Ch) of `len` bytes at `offset`, with LSP bit 0
/// (Return Groups Only) and RAE as asked.
fn ana_log_page(cid: u16, len: u32, offset: u64, groups_only: bool, retain: bool) -> [u8; 64] {
    let mut command = get_log_page(cid, 0x0C, len, offset);
    let cdw10 =
        0x0C | (u32::from(groups_only) << 8) | (u32::from(retain) << 15) | ((len / 4 - 1) << 16);
    set_cdw(&mut command, 10, cdw10);
    command
}

fn read_ana_log(host: &mut Pair, command: &[u8; 64]) -> Vec<u8> {
    let (page, response) = host.read_data(command);
    assert_eq!(response.status(), Status::SUCCESS);
    page
}

/// Identify Controller of an I/O controller reports ANA (CMIC bit 3,
/// OAES bit 11, ANATT, ANACAP, ANAGRPMAX, NANAGRPID) with MNAN between 1
/// and NN; both Identify Namespace structures report the subsystem's
/// group; a discovery controller reports none of it.
#[test]
fn identify_reports_ana() {
    let target = test_target();
    set_ana(&target, 3, AnaState::NonOptimized);
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    let (controller, _) = admin.read_data(&identify(2, 1, 0));
    assert_eq!(
        controller[76], 0x0A,
        "CMIC: multi-controller, ANA reporting"
    );
    assert_eq!(controller[92..96], hex("00090000"), "OAES: bits 8 and 11");
    assert_eq!(
        controller[342..352],
        hex("0a 5f 40000000 40000000"),
        "ANATT 10 s, ANACAP, ANAGRPMAX 64, NANAGRPID 64"
    );
    assert_eq!(controller[516..520], hex("02000000"), "NN");
    assert_eq!(controller[540..544], hex("02000000"), "MNAN");
    let (ns, _) = admin.read_data(&identify(3, 0, 2));
    assert_eq!(ns[92..96], hex("03000000"), "ANAGRPID");
    assert_eq!(ns[16..24], ns[0..8], "NUSE: the path serves the namespace");
    let (independent, _) = admin.read_data(&identify(4, 8, 1));
    assert_eq!(independent[4..8], hex("03000000"), "ANAGRPID");
    let mut discovery = Pair::new(&target);
    discovery.connect_admin(DISCOVERY_NQN, 0);
    let (controller, _) = discovery.read_data(&identify(2, 1, 0));
    assert_eq!(controller[76], 0x02, "CMIC: no ANA");
    assert_eq!(controller[342..352], [0; 10]);
    assert_eq!(
        discovery
            .simple(&ana_log_page(3, 4096, 0, false, false))
            .status(),
        Status::INVALID_LOG_PAGE
    );
}

/// The ANA log page of a subsystem in group 3, Inaccessible, with
/// namespaces 1 and 2: the header (CHGCNT 0, NGRPS 1), one group
/// descriptor (ANAGRPID 3, NNSIDS 2, CHGCNT 0, ANAS 03h) and the NSIDs;
/// with RGO the descriptor alone (NNSIDS 0); a window at an offset.
#[test]
fn ana_log_page_bytes() {
    let target = test_target();
    set_ana(&target, 3, AnaState::Inaccessible);
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    let header = "0000000000000000 0100 000000000000";
    let descriptor = "03000000 02000000 0000000000000000 03 000000000000000000000000000000";
    let nsids = "01000000 02000000";
    let page = read_ana_log(&mut admin, &ana_log_page(2, 64, 0, false, false));
    assert_eq!(
        page,
        hex(&format!("{header} {descriptor} {nsids} {}", "00".repeat(8)))
    );
    // Linux reads 16 + 64 * 32 + MNAN * 4 bytes: the rest is zeroes.
    let page = read_ana_log(
        &mut admin,
        &ana_log_page(3, 16 + 64 * 32 + 2 * 4, 0, false, false),
    );
    assert_eq!(
        page[..56],
        hex(&format!("{header} {descriptor} {nsids}"))[..]
    );
    assert!(page[56..].iter().all(|&b| b == 0));
    // Return Groups Only: NNSIDS 0 and no NSIDs.
    let groups = read_ana_log(&mut admin, &ana_log_page(4, 64, 0, true, false));
    let descriptor_alone = "03000000 00000000 0000000000000000 03 000000000000000000000000000000";
    assert_eq!(
        groups,
        hex(&format!("{header} {descriptor_alone} {}", "00".repeat(16)))
    );
    // From offset 20 (NNSIDS), 36 bytes: up to and including the last NSID.
    let window = read_ana_log(&mut admin, &ana_log_page(5, 36, 20, false, false));
    assert_eq!(
        window,
        hex("02000000 0000000000000000 03 000000000000000000000000000000 01000000 02000000")
    );
    // Past the page's end: zeroes.
    let beyond = read_ana_log(&mut admin, &ana_log_page(6, 8, 56, false, false));
    assert_eq!(beyond, [0; 8]);
}

/// An Optimized -> Inaccessible change completes a parked Asynchronous
/// Event Request with ANA Change (Notice 2h, information 03h, log page
/// 0Ch) when the host enabled ANA Change Notices (AEC bit 11), and moves
/// the page's change count; the event type stays masked until the host
/// reads the ANA log page with RAE cleared.
#[test]
fn an_ana_state_change_completes_a_parked_async_event_request() {
    let target = test_target();
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    assert_eq!(
        admin.simple(&async_event_config(2, 1 << 11)).status(),
        Status::SUCCESS
    );
    let mut get_config = sqe(admin_opcode::GET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut get_config, 10, 0x0B);
    assert_eq!(admin.simple(&get_config).result(), 1 << 11, "AEC as set");
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    assert!(admin.receive().is_none());
    admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
    let event = admin.expect();
    assert_eq!((event.cid(), event.status()), (4, Status::SUCCESS));
    assert_eq!(
        event.result() as u32,
        0x000C_0302,
        "Notice, ANA Change, log page 0Ch"
    );
    // Masked: a change back is not reported, not even after a read with RAE.
    admin.send(&admin.capsule(&async_event_request(5), &[]));
    admin.update_config(set_ana(&target, 1, AnaState::Change));
    assert!(admin.receive().is_none(), "masked");
    let page = read_ana_log(&mut admin, &ana_log_page(6, 48, 0, true, true));
    assert_eq!(page[0..8], hex("0200000000000000"), "CHGCNT: two changes");
    assert_eq!(page[24..32], hex("0200000000000000"), "the group's CHGCNT");
    assert_eq!(page[32], 0x0F, "ANAS: change");
    admin.update_config(set_ana(&target, 1, AnaState::Optimized));
    assert!(admin.receive().is_none(), "RAE kept the event, so the mask");
    read_ana_log(&mut admin, &ana_log_page(7, 48, 0, true, false));
    admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
    let event = admin.expect();
    assert_eq!((event.cid(), event.result() as u32), (5, 0x000C_0302));
    // A configuration update that leaves the group as it was reports nothing.
    read_ana_log(&mut admin, &ana_log_page(8, 48, 0, true, false));
    admin.send(&admin.capsule(&async_event_request(9), &[]));
    admin.update_config(update(&target, |config| config.generation += 1));
    assert!(admin.receive().is_none());
}

#[test]
fn no_ana_event_unless_the_host_enabled_ana_change_notices() {
    let target = test_target();
    let mut admin = admin_with_notices(&target); // namespace notices only
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
    assert!(admin.receive().is_none(), "no event reported");
    // The page reports the new state all the same.
    let page = read_ana_log(&mut admin, &ana_log_page(5, 48, 0, true, false));
    assert_eq!((page[0], page[32]), (1, 0x03), "CHGCNT 1, Inaccessible");
}

/// One update that resizes a namespace and changes the ANA state raises
/// both events, and two parked requests report both.
#[test]
fn one_update_reports_a_namespace_and_an_ana_event() {
    let target = test_target();
    let mut admin = Pair::new(&target);
    admin.connect_admin(TEST_NQN, 0);
    admin.simple(&async_event_config(2, (1 << 8) | (1 << 11)));
    admin.send(&admin.capsule(&async_event_request(3), &[]));
    admin.send(&admin.capsule(&async_event_request(4), &[]));
    admin.update_config(update(&target, |config| {
        config.subsystems[0].namespaces[0].blocks = 1024;
        config.subsystems[0].ana.state = AnaState::Change;
    }));
    let first = admin.expect();
    let second = admin.expect();
    assert_eq!((first.cid(), first.result() as u32), (3, 0x0004_0002));
    assert_eq!((second.cid(), second.result() as u32), (4, 0x000C_0302));
}

/// Reads and writes on a path whose group is Inaccessible complete with
/// Asymmetric Access Inaccessible (SCT 3h, SC 02h), and in Change with
/// Asymmetric Access Transition (SC 03h), DNR clear, before any data
/// moves; the path serves them again once Non-optimized.
#[test]
fn io_on_a_path_that_does_not_serve_it_fails_with_a_path_status() {
    let target = test_target();
    let (mut admin, mut io) = ready_io_queue(&target);
    for (state, sc) in [(AnaState::Inaccessible, 0x02), (AnaState::Change, 0x03)] {
        let config = set_ana(&target, 1, state);
        io.update_config(Arc::clone(&config));
        admin.update_config(config);
        let (data, read) = io.read_data(&rw(io_opcode::READ, 1, 1, 0, 1, 512, false));
        assert!(data.is_empty(), "no data for a refused read");
        let in_capsule = io
            .command(&rw(io_opcode::WRITE, 2, 2, 0, 1, 4096, true), &[0xAB; 4096])
            .pop()
            .unwrap();
        // By R2T: refused at once, without asking for the data.
        let by_r2t = io.simple(&rw(io_opcode::WRITE, 3, 1, 0, 16, 8192, false));
        for response in [read, in_capsule, by_r2t] {
            let status = response.status();
            assert_eq!(
                (status.sct, status.sc, status.dnr),
                (crate::status::StatusCodeType::Path, sc, false),
                "{state}"
            );
            // CQE DW3 status field: DNR (bit 15 of the 16 bits) clear, SCT 3.
            let raw = u16::from_le_bytes([response.header[22], response.header[23]]);
            assert_eq!(raw >> 1, 0x0300 | sc as u16);
        }
    }
    assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
    let config = set_ana(&target, 1, AnaState::NonOptimized);
    io.update_config(Arc::clone(&config));
    admin.update_config(config);
    let (_, read) = io.read_data(&rw(io_opcode::READ, 4, 1, 0, 1, 512, false));
    assert_eq!(read.status(), Status::SUCCESS);
}

/// weft's replica fence (Set Features C0h, token in CDW11-13).
/// Host A's and host B's I/O queues on a target whose namespace 2 has
/// reservations, both executing reservation commands on one cell.
fn reservation_hosts() -> (Arc<Target>, Pair, Pair) {
    let target = test_target();
    let cell = Arc::new(ReservationCell::new());
    update(&target, |config| {
        config.subsystems[0].namespaces[1].reservations = Some(Arc::clone(&cell));
    });
    let io_as = |host_id: [u8; 16]| {
        let mut admin = Pair::new(&target);
        admin.host_id = host_id;
        let cntlid = admin.connect_admin(TEST_NQN, 5000);
        let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
        set_cdw(&mut queues, 10, 0x07);
        set_cdw(&mut queues, 11, 0x0001_0001);
        assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);
        let mut io = Pair::new(&target);
        io.host_id = host_id;
        assert_eq!(io.connect_io(cntlid, 1, 127).status(), Status::SUCCESS);
        io.reservations = Some(Arc::clone(&cell));
        io
    };
    let a = io_as(HOST_ID);
    let b = io_as([0x22; 16]);
    (target, a, b)
}

/// A host identifier is the host that connected with it (reservations are
/// held by it): another host NQN presenting it while it is connected (a
/// host fenced out, taking the holder's identifier) is refused at HOSTID,
/// and so is a zero identifier where namespaces have reservations.
#[test]
fn a_host_id_is_refused_under_another_nqn_and_zero_where_reservations_are() {
    let (target, _a, _b) = reservation_hosts();
    let connect_as = |host_id: [u8; 16], hostnqn: &str| {
        let mut pair = Pair::new(&target);
        pair.initialize(false, false);
        let (command, mut data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
        data[..16].copy_from_slice(&host_id);
        data[512..768].fill(0);
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        pair.command(&command, &data).pop().expect("a response")
    };
    let other = "nqn.2014-08.org.nvmexpress:uuid:0badc0de-0000-4000-8000-000000000000";
    for host_id in [HOST_ID, [0; 16]] {
        let refused = connect_as(host_id, other);
        assert_eq!(refused.status(), Status::CONNECT_INVALID_PARAMETERS);
        assert_eq!(refused.result(), 1 << 16, "IATTR data, HOSTID at byte 0");
    }
    assert_eq!(connect_as([0x33; 16], other).status(), Status::SUCCESS);
    assert_eq!(connect_as(HOST_ID, HOST_NQN).status(), Status::SUCCESS);
}

fn reservation(opcode: u8, cid: u16, cdw10: u32, keys: &[u64]) -> ([u8; 64], Vec<u8>) {
    let data: Vec<u8> = keys.iter().flat_map(|key| key.to_le_bytes()).collect();
    let mut command = sqe(opcode, cid, 2, data.len() as u32, true);
    set_cdw(&mut command, 10, cdw10);
    (command, data)
}

fn run(io: &mut Pair, (command, data): ([u8; 64], Vec<u8>)) -> Status {
    io.command(&command, &data)
        .pop()
        .expect("a response")
        .status()
}

#[test]
fn reservations_keep_other_hosts_from_writing_and_a_preempt_fences_the_holder() {
    use crate::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE, REPORT_OPCODE};
    let (target, mut a, mut b) = reservation_hosts();
    let mut out = [0u8; 4096];
    let config = target.config();
    let subsystem = &config.subsystems[0];
    crate::identify::namespace(&subsystem.namespaces[1], &subsystem.ana, &mut out);
    assert_eq!(out[31], 0xFF, "RESCAP");
    crate::identify::namespace(&subsystem.namespaces[0], &subsystem.ana, &mut out);
    assert_eq!(out[31], 0, "no reservations on namespace 1");
    let write = |cid| rw(io_opcode::WRITE, cid, 2, 0, 1, 4096, true);
    let read = |cid| rw(io_opcode::READ, cid, 2, 0, 1, 4096, false);
    // A registers key 1 (CPTPL 11b, as Linux sends) and takes Write Exclusive.
    assert_eq!(
        run(
            &mut a,
            reservation(REGISTER_OPCODE, 1, 0xC000_0000, &[0, 1])
        ),
        Status::SUCCESS
    );
    assert_eq!(
        run(&mut a, reservation(ACQUIRE_OPCODE, 2, 0x100, &[1, 0])),
        Status::SUCCESS
    );
    assert_eq!(
        a.command(&write(3), &[3; 4096]).pop().unwrap().status(),
        Status::SUCCESS
    );
    assert_eq!(
        b.command(&write(4), &[4; 4096]).pop().unwrap().status(),
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        b.read_data(&read(5)).1.status(),
        Status::SUCCESS,
        "B still reads"
    );
    // Without a key of its own, B cannot take it.
    assert_eq!(
        run(&mut b, reservation(ACQUIRE_OPCODE, 6, 0x101, &[2, 1])),
        Status::RESERVATION_CONFLICT
    );
    // B registers and preempts A (Exclusive Access, with abort).
    assert_eq!(
        run(&mut b, reservation(REGISTER_OPCODE, 7, 0, &[0, 2])),
        Status::SUCCESS
    );
    assert_eq!(
        run(&mut b, reservation(ACQUIRE_OPCODE, 8, 0x202, &[2, 1])),
        Status::SUCCESS
    );
    assert_eq!(
        a.command(&write(9), &[9; 4096]).pop().unwrap().status(),
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        a.read_data(&read(10)).1.status(),
        Status::RESERVATION_CONFLICT
    );
    assert_eq!(
        b.command(&write(11), &[11; 4096]).pop().unwrap().status(),
        Status::SUCCESS
    );
    // Report: the extended structure only.
    let mut report = sqe(REPORT_OPCODE, 12, 2, 4096, false);
    set_cdw(&mut report, 10, 1023);
    let (_, refused) = a.read_data(&report);
    assert_eq!(refused.status(), Status::HOST_ID_INCONSISTENT_FORMAT);
    set_cdw(&mut report, 11, 1);
    let (data, done) = a.read_data(&report);
    assert_eq!(done.status(), Status::SUCCESS);
    assert_eq!(data.len(), 4096, "NUMD + 1 dwords");
    assert_eq!(data[128..], [0; 4096 - 128], "zeroes past the registrants");
    assert_eq!(data[4], 2, "Exclusive Access");
    assert_eq!(u16::from_le_bytes([data[5], data[6]]), 1, "B only");
    assert_eq!(data[64 + 2], 1, "B holds it");
    assert_eq!(data[64 + 16..64 + 32], [0x22; 16]);
    // Namespace 1 has none: the commands are not supported there.
    let (mut command, data) = reservation(REGISTER_OPCODE, 13, 0, &[0, 1]);
    command[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        a.command(&command, &data).pop().unwrap().status(),
        Status::INVALID_OPCODE
    );
}

#[test]
fn a_preempted_hosts_write_on_its_way_to_the_media_holds_the_drain() {
    use crate::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE};
    let (_target, mut a, mut b) = reservation_hosts();
    let cell = a.reservations.clone().unwrap();
    assert_eq!(
        run(&mut a, reservation(REGISTER_OPCODE, 1, 0, &[0, 1])),
        Status::SUCCESS
    );
    assert_eq!(
        run(&mut b, reservation(REGISTER_OPCODE, 2, 0, &[0, 2])),
        Status::SUCCESS
    );
    // Write Exclusive, Registrants Only: B writes too.
    assert_eq!(
        run(&mut a, reservation(ACQUIRE_OPCODE, 3, 0x300, &[1, 0])),
        Status::SUCCESS
    );
    b.hold_io = true;
    b.send(&b.capsule(&rw(io_opcode::WRITE, 4, 2, 0, 1, 4096, true), &[4; 4096]));
    assert_eq!(b.held_io.len(), 1, "B's write is on the media");
    let before = cell.state().1;
    assert_eq!(
        run(&mut a, reservation(ACQUIRE_OPCODE, 5, 0x102, &[1, 2])),
        Status::SUCCESS
    );
    assert!(
        !cell.drained(&before),
        "B was fenced with a write under way"
    );
    let held = b.held_io.pop().unwrap();
    b.execute(held);
    b.pump();
    assert_eq!(
        b.expect().status(),
        Status::SUCCESS,
        "admitted before the preemption"
    );
    assert!(cell.drained(&before));
    b.hold_io = false;
    let refused = b.command(&rw(io_opcode::WRITE, 6, 2, 0, 1, 4096, true), &[6; 4096]);
    assert_eq!(
        refused.last().unwrap().status(),
        Status::RESERVATION_CONFLICT
    );
}

fn fence_command(cid: u16, epoch: u64, session: u32) -> [u8; 64] {
    let mut command = sqe(admin_opcode::SET_FEATURES, cid, 0, 0, false);
    set_cdw(&mut command, 10, u32::from(crate::fence::FENCE_FEATURE));
    let [cdw11, cdw12, cdw13] = crate::fence::FenceToken { epoch, session }.cdws();
    set_cdw(&mut command, 11, cdw11);
    set_cdw(&mut command, 12, cdw12);
    set_cdw(&mut command, 13, cdw13);
    command
}

/// On a fenced (replica) subsystem only the fence holder's I/O runs; a
/// new fence is answered once the previous holder's I/O in flight is
/// done, so that no older write reaches the media afterwards; tokens
/// only grow, and a refused fence learns the current epoch.
#[test]
fn only_the_fence_holder_writes_and_a_new_fence_waits_for_the_old_holders_io() {
    let target = test_target();
    update(&target, |config| config.subsystems[0].fenced = true);
    let (mut admin_a, mut io_a) = ready_io_queue(&target);
    let (mut admin_b, mut io_b) = ready_io_queue(&target);
    let write = |cid| rw(io_opcode::WRITE, cid, 2, 0, 1, 4096, true);
    let unfenced = io_a.command(&write(1), &[1; 4096]).pop().unwrap();
    assert_eq!(unfenced.status(), Status::RESERVATION_CONFLICT);
    assert_eq!(
        admin_a.simple(&fence_command(5, 1, 1)).status(),
        Status::SUCCESS
    );
    let fenced = io_a.command(&write(2), &[2; 4096]).pop().unwrap();
    assert_eq!(fenced.status(), Status::SUCCESS);
    // A write of A's in flight on the media when B takes the fence.
    io_a.hold_io = true;
    io_a.send(&io_a.capsule(&write(3), &[3; 4096]));
    assert_eq!(io_a.held_io.len(), 1);
    admin_b.send(&admin_b.capsule(&fence_command(6, 2, 1), &[]));
    assert!(admin_b.receive().is_none(), "B's fence waits for A's write");
    admin_b.advance(Duration::from_millis(5));
    assert!(admin_b.receive().is_none(), "still in flight");
    let refused = io_a.command(&write(4), &[4; 4096]).pop().unwrap();
    assert_eq!(
        refused.status(),
        Status::RESERVATION_CONFLICT,
        "A lost it at once"
    );
    let held = io_a.held_io.pop().unwrap();
    io_a.execute(held);
    io_a.pump();
    assert_eq!(io_a.expect().status(), Status::SUCCESS, "A's write done");
    admin_b.advance(Duration::from_millis(1));
    assert_eq!(admin_b.expect().status(), Status::SUCCESS, "then B's fence");
    let by_b = io_b.command(&write(5), &[5; 4096]).pop().unwrap();
    assert_eq!(by_b.status(), Status::SUCCESS);
    assert_eq!(io_b.disks[&2][..4096], [5; 4096]);
    // A write by R2T admitted under B's fence, whose data arrives after
    // C took it, is refused then: it never reaches the media.
    let (mut admin_c, _io_c) = ready_io_queue(&target);
    io_b.send(&io_b.capsule(&rw(io_opcode::WRITE, 6, 2, 2, 2, 8192, false), &[]));
    let r2t = io_b.expect();
    let header = crate::pdu::DataHeader::decode(&r2t.header).unwrap();
    assert_eq!(
        admin_c.simple(&fence_command(9, 3, 1)).status(),
        Status::SUCCESS
    );
    io_b.send(&io_b.h2c_data(header.cccid, header.ttag, 0, &[6; 8192], true));
    assert_eq!(io_b.expect().status(), Status::RESERVATION_CONFLICT);
    assert!(
        io_b.disks[&2][8192..16384].iter().all(|&b| b == 0),
        "not written"
    );
    // A deposed primary's fence is refused and learns the current epoch.
    let stale = admin_a.simple(&fence_command(7, 1, 9));
    assert_eq!(
        (stale.status(), stale.result()),
        (Status::RESERVATION_CONFLICT, 3)
    );
    // A fence on a subsystem that is not fenced is an invalid field.
    update(&target, |config| config.subsystems[0].fenced = false);
    admin_b.update_config(target.config());
    let invalid = admin_b.simple(&fence_command(8, 3, 1));
    assert_eq!(invalid.status(), Status::INVALID_FIELD);
}

/// A replica's fence is taken only from the record's primary at the
/// record's epoch: an older epoch is refused at once with the record's; a
/// newer one waits for a record that admits it (taken when the node's
/// configuration catches up) and is refused if none comes in time: whoever
/// holds a node's keys cannot fence with the largest epoch.
#[test]
fn only_the_records_primary_at_the_records_epoch_takes_the_fence() {
    use crate::fence::FenceAuthority;
    let target = test_target();
    let authority = |epoch| FenceAuthority {
        host_nqn: HOST_NQN.to_string(),
        epoch,
        waits_for_grants: true,
    };
    update(&target, |config| {
        config.subsystems[0].fenced = true;
        config.subsystems[0].fence_authority = Some(authority(3));
    });
    let (mut admin, _io) = ready_io_queue(&target);
    let stale = admin.simple(&fence_command(1, 2, 1));
    assert_eq!(
        (stale.status(), stale.result()),
        (Status::RESERVATION_CONFLICT, 3)
    );
    // The largest epoch waits, then is refused with the record's.
    admin.send(&admin.capsule(&fence_command(2, u64::MAX, 1), &[]));
    admin.advance(Duration::from_millis(900));
    assert!(admin.receive().is_none(), "waits for a newer record");
    admin.advance(Duration::from_millis(200));
    let refused = admin.expect();
    assert_eq!(
        (refused.status(), refused.result()),
        (Status::RESERVATION_CONFLICT, 3)
    );
    assert_eq!(target.fences.token(TEST_NQN).epoch, 0, "not taken");
    // A new primary's fence before its node read the record: taken once it has.
    admin.send(&admin.capsule(&fence_command(3, 4, 1), &[]));
    admin.advance(Duration::from_millis(50));
    assert!(admin.receive().is_none());
    let newer = update(&target, |config| {
        config.subsystems[0].fence_authority = Some(authority(4));
    });
    admin.update_config(newer);
    admin.advance(Duration::from_millis(10));
    assert_eq!(admin.expect().status(), Status::SUCCESS);
    assert_eq!(target.fences.token(TEST_NQN).epoch, 4);
}

/// An admin and an I/O queue of host `hostnqn` (its own HOSTID), ready.
fn ready_io_queue_as(target: &Arc<Target>, hostnqn: &str) -> (Pair, Pair) {
    let connect = |pair: &mut Pair, qid: u16, cntlid: u16| {
        pair.initialize(false, false);
        let (command, mut data) = connect_command(1, qid, 31, 0, cntlid, TEST_NQN);
        data[..16].fill(hostnqn.len() as u8);
        data[512..768].fill(0);
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn.as_bytes());
        let response = pair.command(&command, &data).pop().unwrap();
        assert_eq!(response.status(), Status::SUCCESS, "Connect as {hostnqn}");
        response.result() as u16
    };
    let mut admin = Pair::new(target);
    let cntlid = connect(&mut admin, 0, 0xFFFF);
    let enable = property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
    assert_eq!(admin.simple(&enable).status(), Status::SUCCESS);
    let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    set_cdw(&mut queues, 10, 0x07);
    set_cdw(&mut queues, 11, 0x0001_0001);
    assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);
    let mut io = Pair::new(target);
    connect(&mut io, 1, cntlid);
    (admin, io)
}

/// Read grants (see `crate::fence`): after a promotion, a fence that takes
/// a replica from another node's session is answered only once
/// `READ_GRANT` passed since that session's last command reached it (a
/// grant command counts, and is refused once the fence is gone); after a
/// planned handover it is answered at once.
#[test]
fn a_promotions_fence_waits_out_the_old_primarys_read_grant() {
    use crate::fence::{FenceAuthority, GRANT_OPCODE, READ_GRANT};
    const OTHER: &str = "nqn.2024-01.io.weft:node:other";
    let target = test_target();
    let grant = |cid| sqe(GRANT_OPCODE, cid, 1, 0, false);
    let (mut admin, mut io) = ready_io_queue(&target);
    assert_eq!(
        io.command(&grant(1), &[]).pop().unwrap().status(),
        Status::INVALID_OPCODE,
        "only a fenced subsystem grants reads"
    );
    let authority = |host_nqn: &str, epoch, waits_for_grants| FenceAuthority {
        host_nqn: host_nqn.to_string(),
        epoch,
        waits_for_grants,
    };
    update(&target, |config| {
        config.subsystems[0].fenced = true;
        config.subsystems[0].fence_authority = Some(authority(HOST_NQN, 1, false));
    });
    admin.update_config(target.config());
    io.update_config(target.config());
    assert_eq!(
        admin.simple(&fence_command(2, 1, 1)).status(),
        Status::SUCCESS
    );
    io.advance(Duration::from_millis(300));
    assert_eq!(
        io.command(&grant(3), &[]).pop().unwrap().status(),
        Status::SUCCESS
    );
    // Promoted: the other node's fence waits for the grant (its clock
    // starts at zero, as the old session's did).
    update(&target, |config| {
        config.subsystems[0].fence_authority = Some(authority(OTHER, 2, true));
    });
    let (mut new_admin, _new_io) = ready_io_queue_as(&target, OTHER);
    new_admin.send(&new_admin.capsule(&fence_command(4, 2, 1), &[]));
    assert_eq!(
        io.command(&grant(5), &[]).pop().unwrap().status(),
        Status::RESERVATION_CONFLICT,
        "the old session lost the fence at once"
    );
    new_admin.advance(READ_GRANT + Duration::from_millis(290));
    assert!(new_admin.receive().is_none(), "the grant runs until 1.3 s");
    new_admin.advance(Duration::from_millis(10));
    assert_eq!(new_admin.expect().status(), Status::SUCCESS);
    // A planned handover back: answered at once.
    update(&target, |config| {
        config.subsystems[0].fence_authority = Some(authority(HOST_NQN, 3, false));
    });
    admin.update_config(target.config());
    assert_eq!(
        admin.simple(&fence_command(6, 3, 1)).status(),
        Status::SUCCESS
    );
}

/// A replica subsystem's write intent: its log page (C0h) lists the
/// marked regions; Clean (81h) drops regions, only from the fence
/// holder, and only where the subsystem has an intent.
#[test]
fn the_intent_log_page_lists_marked_regions_and_clean_drops_them() {
    use crate::intent::{WriteIntent, CLEAN_OPCODE, INTENT_LOG};
    let target = test_target();
    let intent = Arc::new(WriteIntent::new(64 << 20, 20, [3, 9, 40], false));
    update(&target, |config| {
        config.subsystems[0].fenced = true;
        config.subsystems[0].intent = Some(Arc::clone(&intent));
    });
    let (mut admin, mut io) = ready_io_queue(&target);
    let (mut other_admin, _other_io) = ready_io_queue(&target);
    let (page, response) = admin.read_data(&get_log_page(1, INTENT_LOG, 32, 0));
    assert_eq!(response.status(), Status::SUCCESS);
    assert_eq!(
        page.iter().map(|b| format!("{b:02x}")).collect::<String>(),
        "0300000000000000000010000000000003000000090000002800000000000000"
    );
    let clean = |cid: u16, regions: &[u32]| {
        let data: Vec<u8> = regions.iter().flat_map(|r| r.to_le_bytes()).collect();
        let mut command = sqe(CLEAN_OPCODE, cid, 2, data.len() as u32, true);
        set_cdw(&mut command, 10, regions.len() as u32);
        (command, data)
    };
    let (command, data) = clean(2, &[9, 40]);
    let refused = io.command(&command, &data).pop().unwrap();
    assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
    assert_eq!(
        admin.simple(&fence_command(3, 1, 1)).status(),
        Status::SUCCESS
    );
    let done = io.command(&command, &data).pop().unwrap();
    assert_eq!(done.status(), Status::SUCCESS);
    assert_eq!(intent.marked(), vec![3]);
    assert!(intent.take_cleared(), "the node persists it again");
    let (mut wrong, data) = clean(4, &[3]);
    set_cdw(&mut wrong, 10, 2);
    let short = io.command(&wrong, &data).pop().unwrap();
    assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
    // The page from another controller, at an offset: the one region left.
    let (page, _) = other_admin.read_data(&get_log_page(5, INTENT_LOG, 4, 16));
    assert_eq!(page, 3u32.to_le_bytes());
    // Without an intent: no page, no Clean.
    update(&target, |config| config.subsystems[0].intent = None);
    admin.update_config(target.config());
    io.update_config(target.config());
    let none = admin.simple(&get_log_page(6, INTENT_LOG, 16, 0));
    assert_eq!(none.status(), Status::INVALID_LOG_PAGE);
    let (command, data) = clean(7, &[3]);
    let invalid = io.command(&command, &data).pop().unwrap();
    assert_eq!(invalid.status(), Status::INVALID_OPCODE);
}

/// A replica's or a member's Snapshot (85h) reaches the data plane with
/// its name, only from the fence holder, only on a private subsystem,
/// with a name of 1 to 64 bytes that is exactly its data.
#[test]
fn a_snapshot_command_carries_its_name_to_the_data_plane() {
    use crate::intent::{WriteIntent, SNAPSHOT_OPCODE};
    let target = test_target();
    let intent = Arc::new(WriteIntent::new(64 << 20, 20, [], false));
    update(&target, |config| {
        config.subsystems[0].fenced = true;
        config.subsystems[0].intent = Some(Arc::clone(&intent));
    });
    let (mut admin, mut io) = ready_io_queue(&target);
    let snapshot = |cid: u16, name: &[u8], declared: u32| {
        let mut command = sqe(SNAPSHOT_OPCODE, cid, 1, name.len() as u32, true);
        set_cdw(&mut command, 10, declared);
        command
    };
    let refused = io.command(&snapshot(2, b"s1", 2), b"s1").pop().unwrap();
    assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
    assert_eq!(
        admin.simple(&fence_command(3, 1, 1)).status(),
        Status::SUCCESS
    );
    let done = io.command(&snapshot(4, b"s1", 2), b"s1").pop().unwrap();
    assert_eq!(done.status(), Status::SUCCESS);
    assert_eq!(io.snapshots, vec!["s1".to_string()]);
    let short = io.command(&snapshot(5, b"s1", 3), b"s1").pop().unwrap();
    assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
    let long = [b'a'; 65];
    let too_long = io.command(&snapshot(6, &long, 65), &long).pop().unwrap();
    assert_eq!(too_long.status(), Status::INVALID_FIELD);
    let mut other_ns = snapshot(7, b"s2", 2);
    other_ns[4..8].copy_from_slice(&9u32.to_le_bytes());
    let missing = io.command(&other_ns, b"s2").pop().unwrap();
    assert_eq!(missing.status(), Status::INVALID_NAMESPACE);
    // An erasure-coded member's subsystem: fenced, without an intent.
    update(&target, |config| config.subsystems[0].intent = None);
    io.update_config(target.config());
    let member = io.command(&snapshot(8, b"s3", 2), b"s3").pop().unwrap();
    assert_eq!(member.status(), Status::SUCCESS);
    // A host-facing subsystem: neither.
    update(&target, |config| config.subsystems[0].fenced = false);
    io.update_config(target.config());
    let invalid = io.command(&snapshot(9, b"s4", 2), b"s4").pop().unwrap();
    assert_eq!(invalid.status(), Status::INVALID_OPCODE);
    assert_eq!(io.snapshots, ["s1", "s3"], "only the valid ones ran");
}

/// A replica's Grow (84h) reaches the data plane with the new size
/// (in CDW10-11), in whole blocks; a size reached already is done.
#[test]
fn a_grow_command_carries_the_new_size_to_the_data_plane() {
    use crate::intent::{WriteIntent, GROW_OPCODE};
    let target = test_target();
    let intent = Arc::new(WriteIntent::new(64 << 20, 20, [], false));
    update(&target, |config| {
        config.subsystems[0].fenced = true;
        config.subsystems[0].intent = Some(intent);
    });
    let (mut admin, mut io) = ready_io_queue(&target);
    let grow = |cid: u16, size_bytes: u64| {
        let mut command = sqe(GROW_OPCODE, cid, 1, 0, false);
        set_cdw(&mut command, 10, size_bytes as u32);
        set_cdw(&mut command, 11, (size_bytes >> 32) as u32);
        command
    };
    // Namespace 1: 512 blocks of 512 bytes.
    let refused = io.command(&grow(2, 1 << 20), &[]).pop().unwrap();
    assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
    assert_eq!(
        admin.simple(&fence_command(3, 1, 1)).status(),
        Status::SUCCESS
    );
    let done = io.command(&grow(4, 1 << 20), &[]).pop().unwrap();
    assert_eq!(done.status(), Status::SUCCESS);
    assert_eq!(io.disks[&1].len(), 1 << 20);
    let again = io.command(&grow(5, 128 << 10), &[]).pop().unwrap();
    assert_eq!(again.status(), Status::SUCCESS, "grown past it already");
    assert_eq!(io.disks[&1].len(), 1 << 20);
    for (cid, size) in [(6, 0), (7, (1 << 20) + 100)] {
        let invalid = io.command(&grow(cid, size), &[]).pop().unwrap();
        assert_eq!(invalid.status(), Status::INVALID_FIELD, "{size} bytes");
    }
}

/// A write waiting for its data when the path becomes Inaccessible
/// completes with the path status once its data arrived, unwritten.
#[test]
fn a_write_waiting_for_its_data_fails_when_the_path_becomes_inaccessible() {
    let target = test_target();
    let (_admin, mut io) = ready_io_queue(&target);
    io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 2, 0, 2, 8192, false), &[]));
    let r2t = DataHeader::decode(&io.expect().header).unwrap();
    io.update_config(set_ana(&target, 1, AnaState::Inaccessible));
    io.send(&io.h2c_data(1, r2t.ttag, 0, &[0xEE; 8192], true));
    assert_eq!(io.expect().status(), Status::ANA_INACCESSIBLE);
    assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
}

/// Hex text of a captured stream, without its `#` comment lines.
fn captured(text: &str) -> Vec<u8> {
    hex(&text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect::<String>())
}

/// Replays what the Linux 6.1 host really sent (admin queue, then an I/O
/// queue, both with header and data digests) and checks every answer.
#[test]
fn replays_a_linux_host_session() {
    let target = target_with("nqn.2026-11.io.weft:default", &[(1, 1024, 4096)]);
    let admin_stream = captured(include_str!("../testdata/linux-6.1-admin-digests.hex"));
    let io_stream = captured(include_str!("../testdata/linux-6.1-io-digests.hex"));
    for stream in [admin_stream, io_stream] {
        let mut host = Pair::new(&target);
        host.send(&stream);
        let mut completions = 0;
        while let Some(pdu) = host.receive() {
            match PduType::from_u8(pdu.pdu_type) {
                Some(PduType::CapsuleResp) => {
                    assert_eq!(
                        pdu.status(),
                        Status::SUCCESS,
                        "command {} failed",
                        pdu.cid()
                    );
                    completions += 1;
                }
                Some(PduType::IcResp | PduType::C2hData) => {}
                other => panic!("unexpected PDU {other:?} in answer to a real host"),
            }
        }
        assert!(!host.connection.is_closed());
        assert!(completions >= 4, "{completions} completions");
    }
}
