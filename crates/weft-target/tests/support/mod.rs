//! Shared by the data plane tests and benchmarks: a target on 127.0.0.1:0
//! (RAM namespace 1, file namespace 2) and a host connection over TCP that
//! speaks through the protocol core's host model.
#![allow(dead_code)] // each includer uses a subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use weft_proto::ana::AnaConfig;
use weft_proto::command::admin_opcode;
use weft_proto::pdu::{DataHeader, PduType};
use weft_proto::status::Status;
use weft_proto::target::{
    AddressFamily, HostAccess, ListenerConfig, NamespaceConfig, SubsystemConfig,
};
use weft_proto::testing::{self, ReceivedPdu, TEST_NQN};
use weft_proto::types::Nsid;
use weft_proto::{Limits, TargetConfig};
use weft_storage::{BlockDevice, FileDevice, RamDevice};
use weft_target::{Backend, DataPlane, Exports, Health, NamespaceDevice, PeerLimits};

pub const RAM_BYTES: u64 = 16 << 20;
pub const FILE_BYTES: u64 = 16 << 20;

/// This process's resident memory, in bytes (VmRSS).
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

/// Starts a data plane serving until the test process exits; returns its address.
/// Retries `done` until it holds (5 s at most): a reactor acts on what it
/// is sent when it next wakes.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn start(name: &str) -> SocketAddr {
    let plane = start_plane(name);
    let address = plane.listening[0];
    std::mem::forget(plane); // serves until the test process exits
    address
}

/// Starts a data plane and hands it over, so that the test can update its exports.
pub fn start_plane(name: &str) -> DataPlane {
    start_plane_with(name, PeerLimits::DEFAULT)
}

/// [`start_plane`] with its listener's connection limits.
pub fn start_plane_with(name: &str, peer_limits: PeerLimits) -> DataPlane {
    let dir = std::env::temp_dir().join(format!("weft-data-plane-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ram: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(RAM_BYTES, 512).unwrap());
    let file: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open(&dir.join("ns2.img"), Some(FILE_BYTES), 4096).unwrap());
    let devices = [ram, file].map(|device| (device, Arc::default()));
    let poll_us = std::env::var("WEFT_TEST_POLL_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    serve_devices(
        devices.into(),
        2,
        Duration::from_micros(poll_us),
        peer_limits,
    )
}

/// A data plane serving `devices` as namespaces 1, 2, ... of [`TEST_NQN`]
/// (each with its failure flag) on 127.0.0.1, port chosen by the kernel.
pub fn serve_devices(
    devices: Vec<(Arc<dyn BlockDevice>, Arc<Health>)>,
    reactors: usize,
    poll_window: Duration,
    peer_limits: PeerLimits,
) -> DataPlane {
    serve_devices_within(devices, reactors, poll_window, peer_limits, Limits::DEFAULT)
}

/// [`start`] with the protocol's `limits`; returns its address.
pub fn start_within(name: &str, limits: Limits) -> SocketAddr {
    let dir = std::env::temp_dir().join(format!("weft-data-plane-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ram: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(RAM_BYTES, 512).unwrap());
    let devices = vec![(ram, Arc::default())];
    let plane = serve_devices_within(devices, 2, Duration::ZERO, PeerLimits::DEFAULT, limits);
    let address = plane.listening[0];
    std::mem::forget(plane); // serves until the test process exits
    address
}

/// [`serve_devices`] with the protocol's `limits`.
pub fn serve_devices_within(
    devices: Vec<(Arc<dyn BlockDevice>, Arc<Health>)>,
    reactors: usize,
    poll_window: Duration,
    peer_limits: PeerLimits,
    limits: Limits,
) -> DataPlane {
    let namespace = |nsid: u32, device: &Arc<dyn BlockDevice>| NamespaceConfig {
        nsid: Nsid(nsid),
        blocks: device.size_bytes() / u64::from(device.block_size()),
        block_size: device.block_size(),
        nguid: [nsid as u8; 16],
        uuid: [nsid as u8; 16],
        eui64: [nsid as u8; 8],
        thin: true,
        ready: true,
        reservations: None,
    };
    let config = TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: TEST_NQN.into(),
            serial: "data-plane-test".into(),
            model: "weft".into(),
            firmware: "test".into(),
            namespaces: (1..)
                .zip(&devices)
                .map(|(nsid, (device, _))| namespace(nsid, device))
                .collect(),
            access: HostAccess::Any,
            ana: AnaConfig::DEFAULT,
            fenced: false,
            fence_authority: None,
            intent: None,
        }],
        listeners: vec![ListenerConfig {
            port_id: 1,
            family: AddressFamily::Ipv4,
            address: "127.0.0.1".into(),
            service: "0".into(),
        }],
        limits,
        referrals: Vec::new(),
        node_addresses: Vec::new(),
        discovery_serial: "discovery".into(),
        generation: 1,
    };
    let devices = (1..)
        .zip(devices)
        .map(|(nsid, (device, health))| NamespaceDevice {
            nsid: Nsid(nsid),
            backend: Backend::Device(device),
            meter: Default::default(),
            health,
        })
        .collect();
    let exports = Arc::new(Exports::new(Arc::new(config), vec![devices]));
    DataPlane::start(
        exports,
        &["127.0.0.1:0".parse().unwrap()],
        reactors,
        poll_window,
        peer_limits,
        weft_proto::target::DYNAMIC_CNTLIDS,
    )
    .unwrap()
}

/// A host connection over TCP speaking through the host model's PDU builders.
pub struct Client {
    stream: TcpStream,
    received: Vec<u8>,
    header_digest: bool,
    data_digest: bool,
}

impl Client {
    pub fn connect(address: SocketAddr, header_digest: bool, data_digest: bool) -> Client {
        let stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut client = Client {
            stream,
            received: Vec::new(),
            header_digest,
            data_digest,
        };
        client.send(&testing::icreq(header_digest, data_digest));
        assert_eq!(client.next_pdu().pdu_type, PduType::IcResp as u8);
        client
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next PDU, or None at end of stream.
    pub fn try_next_pdu(&mut self) -> Option<ReceivedPdu> {
        loop {
            if let Some(pdu) = testing::parse_pdu(&mut self.received) {
                return Some(pdu);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.received.extend_from_slice(&chunk[..n]),
            }
        }
    }

    pub fn next_pdu(&mut self) -> ReceivedPdu {
        self.try_next_pdu()
            .expect("a PDU before the end of the stream")
    }

    pub fn command(&mut self, sqe: &[u8; 64], data: &[u8]) -> (Vec<u8>, ReceivedPdu) {
        self.send(&testing::capsule(
            self.header_digest,
            self.data_digest,
            sqe,
            data,
        ));
        let mut read = Vec::new();
        loop {
            let pdu = self.next_pdu();
            match pdu.pdu_type {
                t if t == PduType::C2hData as u8 => read.extend_from_slice(&pdu.data),
                t if t == PduType::CapsuleResp as u8 => return (read, pdu),
                other => panic!("unexpected PDU type {other:#x}"),
            }
        }
    }

    pub fn write_r2t(&mut self, sqe: &[u8; 64], data: &[u8]) -> ReceivedPdu {
        self.send(&testing::capsule(
            self.header_digest,
            self.data_digest,
            sqe,
            &[],
        ));
        let r2t = self.next_pdu();
        assert_eq!(r2t.pdu_type, PduType::R2t as u8);
        let header = DataHeader::decode(&r2t.header).unwrap();
        for (index, piece) in data.chunks(32 * 1024).enumerate() {
            let offset = index * 32 * 1024;
            let last = offset + piece.len() == data.len();
            let pdu = testing::h2c_data(
                self.header_digest,
                self.data_digest,
                header.cccid,
                header.ttag,
                offset as u32,
                piece,
                last,
            );
            self.send(&pdu);
        }
        self.next_pdu()
    }
}

/// An enabled admin queue with `io_queues` granted; returns it and the controller ID.
pub fn admin(address: SocketAddr, kato_ms: u32) -> (Client, u16) {
    let mut admin = Client::connect(address, false, false);
    let (sqe, data) = testing::connect_command(1, 0, 31, kato_ms, 0xFFFF, TEST_NQN);
    let (_, response) = admin.command(&sqe, &data);
    assert_eq!(response.status(), Status::SUCCESS);
    let cntlid = response.result() as u16;
    let (_, enabled) = admin.command(
        &testing::property_set(2, 0x14, (6 << 16) | (4 << 20) | 1),
        &[],
    );
    assert_eq!(enabled.status(), Status::SUCCESS);
    let mut queues = testing::sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
    testing::set_cdw(&mut queues, 10, 0x07);
    testing::set_cdw(&mut queues, 11, 0x0003_0003);
    assert_eq!(admin.command(&queues, &[]).1.status(), Status::SUCCESS);
    (admin, cntlid)
}

pub fn io_queue(address: SocketAddr, cntlid: u16, qid: u16, digests: bool) -> Client {
    let mut io = Client::connect(address, digests, digests);
    let (sqe, data) = testing::connect_command(1, qid, 127, 0, cntlid, TEST_NQN);
    assert_eq!(io.command(&sqe, &data).1.status(), Status::SUCCESS);
    io
}
