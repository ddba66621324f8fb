//! An in-memory host and target pair for protocol tests and fuzzing: a host
//! model that builds the PDUs a Linux host sends, and a target harness that
//! drives a [`Connection`] the way the data plane does, with RAM namespaces.
//! Deterministic: time only moves when a test says so.

use crate::ana::AnaConfig;
use crate::auth::{
    DhchapSecret, HostAuthError, HostExchange, HostKeys, SecureRandom, SECP_DHCHAP, SPSP_DHCHAP,
};
use crate::command::{admin_opcode, fctype, FABRICS_OPCODE};
use crate::connection::{Connection, SlotBuffers, TxSegment};
use crate::digest::crc32c;
use crate::io::{IoError, IoKind, IoRequest};
use crate::pdu::{self, flags, DataHeader, IcReq, PduType};
use crate::reservation::{HostIdentifier, ReservationCell, ReservationCommand};
use crate::status::Status;
use crate::target::{
    AddressFamily, AllowedHost, HostAccess, Limits, ListenerConfig, NamespaceConfig,
    SubsystemConfig, Target, TargetConfig,
};
use crate::types::{Nsid, SlotId, Timestamp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Subsystem NQN of [`test_target`].
pub const TEST_NQN: &str = "nqn.2026-11.io.weft:test";
/// Host NQN the model uses.
pub const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";
/// Host ID the model uses.
pub const HOST_ID: [u8; 16] = [0x11; 16];

/// A target with one subsystem: namespace 1 (256 KiB of 512-byte blocks) and namespace 2 (1 MiB of 4 KiB blocks).
pub fn test_target() -> Arc<Target> {
    target_with(TEST_NQN, &[(1, 512, 512), (2, 256, 4096)])
}

/// A target with one subsystem `nqn` and namespaces given as (NSID, blocks, block size).
pub fn target_with(nqn: &str, namespaces: &[(u32, u64, u32)]) -> Arc<Target> {
    Target::new(
        config_with(nqn, namespaces, Limits::DEFAULT),
        Arc::new(CountingRandom::default()),
    )
}

/// The configuration of [`target_with`], with `limits`.
pub fn config_with(nqn: &str, namespaces: &[(u32, u64, u32)], limits: Limits) -> TargetConfig {
    let namespace = |&(nsid, blocks, block_size): &(u32, u64, u32)| NamespaceConfig {
        nsid: Nsid(nsid),
        blocks,
        block_size,
        nguid: [nsid as u8; 16],
        uuid: [0x40 + nsid as u8; 16],
        eui64: [0x80 + nsid as u8; 8],
        thin: true,
        ready: true,
        reservations: None,
    };
    TargetConfig {
        subsystems: vec![SubsystemConfig {
            nqn: nqn.into(),
            serial: "0123456789abcdef0123".into(),
            model: "weft".into(),
            firmware: "0.1.0".into(),
            namespaces: namespaces.iter().map(namespace).collect(),
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
            service: "4420".into(),
        }],
        limits,
        referrals: Vec::new(),
        node_addresses: Vec::new(),
        discovery_serial: "discovery".into(),
        generation: 1,
    }
}

/// The model host's DH-HMAC-CHAP secret in [`authenticating_target`].
pub const HOST_SECRET: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
/// The controller's secret when the model host authenticates it too.
pub const CONTROLLER_SECRET: &str = "DHHC-1:01:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:";

/// The model host's secrets (and the controller's when `bidirectional`).
pub fn host_keys(bidirectional: bool) -> HostKeys {
    let parse = |text| DhchapSecret::parse(text).expect("a valid test secret");
    HostKeys {
        host: parse(HOST_SECRET),
        controller: bidirectional.then(|| parse(CONTROLLER_SECRET)),
        dh_group: crate::auth::DhGroup::Null,
    }
}

/// [`test_target`] with its subsystem open to the model host only, which must
/// authenticate with [`host_keys`].
pub fn authenticating_target(bidirectional: bool) -> Arc<Target> {
    let target = test_target();
    let mut config = (*target.config()).clone();
    require_authentication(&mut config, bidirectional);
    target.replace_config(Arc::new(config), Timestamp::default());
    target
}

/// Opens the first subsystem of `config` to the model host only, which must
/// authenticate with [`host_keys`].
pub fn require_authentication(config: &mut TargetConfig, bidirectional: bool) {
    config.subsystems[0].access = HostAccess::Only(vec![AllowedHost {
        nqn: HOST_NQN.to_string(),
        keys: Some(Arc::new(host_keys(bidirectional))),
        tls_psk: None,
    }]);
}

/// Deterministic "random" bytes for tests: SplitMix64 over a counter.
#[derive(Debug, Default)]
pub struct CountingRandom {
    counter: AtomicU64,
}

impl SecureRandom for CountingRandom {
    fn fill(&self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let mut z = self
                .counter
                .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
                .wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// Slot buffers as plain vectors, each zeroed when first used: a connection
/// that uses few slots (most tests, every fuzz execution) allocates little.
#[derive(Debug)]
pub struct VecBuffers {
    buffers: Vec<Vec<u8>>,
    buffer_bytes: usize,
}

impl VecBuffers {
    /// Buffers for `limits`.
    pub fn new(limits: &Limits) -> VecBuffers {
        VecBuffers {
            buffers: vec![Vec::new(); limits.slots_per_queue()],
            buffer_bytes: limits.slot_buffer_bytes(),
        }
    }
}

impl SlotBuffers for VecBuffers {
    fn buffer(&mut self, slot: SlotId) -> &mut [u8] {
        let buffer = &mut self.buffers[usize::from(slot.0)];
        if buffer.is_empty() {
            buffer.resize(self.buffer_bytes, 0);
        }
        buffer
    }
}

/// A PDU the target sent, split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedPdu {
    /// PDU type byte.
    pub pdu_type: u8,
    /// Flags.
    pub flags: u8,
    /// The header (HLEN bytes, without digest).
    pub header: Vec<u8>,
    /// The data (without padding and digest).
    pub data: Vec<u8>,
}

impl ReceivedPdu {
    /// CQE status of a CapsuleResp.
    pub fn status(&self) -> Status {
        assert_eq!(
            self.pdu_type,
            PduType::CapsuleResp as u8,
            "not a CapsuleResp: {self:?}"
        );
        Status::from_cqe_status(u16::from_le_bytes([self.header[22], self.header[23]]))
    }

    /// CQE DW0-DW1 of a CapsuleResp.
    pub fn result(&self) -> u64 {
        u64::from_le_bytes(self.header[8..16].try_into().expect("8 bytes"))
    }

    /// CID of a CapsuleResp.
    pub fn cid(&self) -> u16 {
        u16::from_le_bytes([self.header[20], self.header[21]])
    }

    /// FES of a C2HTermReq.
    pub fn fatal_status(&self) -> u16 {
        assert_eq!(
            self.pdu_type,
            PduType::C2hTermReq as u8,
            "not a C2HTermReq: {self:?}"
        );
        u16::from_le_bytes([self.header[8], self.header[9]])
    }
}

/// The target side, executing block I/O on RAM namespaces immediately.
#[derive(Debug)]
pub struct Pair {
    /// The connection under test.
    pub connection: Connection,
    /// Its slot buffers.
    pub buffers: VecBuffers,
    /// RAM namespaces by NSID, shared by every connection of a test through `disks`.
    pub disks: HashMap<u32, Vec<u8>>,
    /// Bytes sent by the target, not yet parsed.
    pub sent: Vec<u8>,
    /// The clock.
    pub now: Timestamp,
    /// Digests negotiated (from the host's point of view).
    pub header_digest: bool,
    /// Data digest negotiated.
    pub data_digest: bool,
    /// When set, block I/O is held back in `held_io` instead of executed.
    pub hold_io: bool,
    /// Held block I/O requests.
    pub held_io: Vec<IoRequest>,
    /// When set, what the target transmits reaches `sent` (the host has the
    /// bytes) but the target is not told the send completed until
    /// [`Pair::finish_transmit`], as when a reactor reaps its send late.
    pub hold_transmit: bool,
    /// A transmission is in `sent` and not yet reported sent.
    transmit_held: bool,
    /// When set, every delivery to the target is appended here too (the
    /// fuzz seeds are recorded from the host model this way).
    pub recorded: Option<Vec<Vec<u8>>>,
    /// Names of the snapshots replica Snapshot commands asked for, in order.
    pub snapshots: Vec<String>,
    /// Where reservation commands take effect, as a node installs them
    /// (each at the next revision); without it they fail.
    pub reservations: Option<Arc<ReservationCell>>,
    /// The Host Identifier its Connects send ([`HOST_ID`] unless changed).
    pub host_id: [u8; 16],
}

impl Pair {
    /// A fresh connection to `target`.
    pub fn new(target: &Arc<Target>) -> Pair {
        let config = target.config();
        let limits = config.limits;
        let disks = config.subsystems[0]
            .namespaces
            .iter()
            .map(|ns| (ns.nsid.0, vec![0u8; ns.size_bytes() as usize]))
            .collect();
        Pair {
            connection: Connection::new(Arc::clone(target)),
            buffers: VecBuffers::new(&limits),
            disks,
            sent: Vec::new(),
            now: Timestamp::default(),
            header_digest: false,
            data_digest: false,
            hold_io: false,
            held_io: Vec::new(),
            hold_transmit: false,
            transmit_held: false,
            recorded: None,
            snapshots: Vec::new(),
            reservations: None,
            host_id: HOST_ID,
        }
    }

    /// Delivers bytes to the target and runs it until it is idle.
    pub fn send(&mut self, bytes: &[u8]) {
        if let Some(recorded) = &mut self.recorded {
            recorded.push(bytes.to_vec());
        }
        self.connection
            .handle_input(bytes, self.now, &mut self.buffers);
        self.pump();
    }

    /// Hands the connection a new configuration snapshot, as the data plane
    /// does after an update, and runs it until it is idle.
    pub fn update_config(&mut self, config: Arc<TargetConfig>) {
        self.connection.update_config(config);
        self.pump();
    }

    /// Advances the clock and fires timers.
    pub fn advance(&mut self, by: Duration) {
        self.now = self.now.after(by);
        self.connection.handle_timeout(self.now);
        self.pump();
    }

    /// Executes block I/O and collects transmissions until nothing moves.
    pub fn pump(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(request) = self.connection.poll_io() {
                progressed = true;
                if self.hold_io {
                    self.held_io.push(request);
                } else {
                    self.execute(request);
                }
            }
            if self.transmit_held {
                // One transmission at a time: the next waits for this one.
            } else if let Some(transmit) = self.connection.poll_transmit() {
                progressed = true;
                let (bytes, segments) = (transmit.bytes.to_vec(), transmit.segments.to_vec());
                for segment in segments {
                    match segment {
                        TxSegment::Bytes(range) => self.sent.extend_from_slice(&bytes[range]),
                        TxSegment::Slot(slot, range) => {
                            let data = self.buffers.buffer(slot)[range].to_vec();
                            self.sent.extend_from_slice(&data);
                        }
                    }
                }
                if self.hold_transmit {
                    self.transmit_held = true;
                } else {
                    self.connection.on_transmitted();
                }
            }
            if !progressed {
                return;
            }
        }
    }

    /// Reports the held transmission sent (see [`Pair::hold_transmit`]) and
    /// runs the target until it is idle.
    pub fn finish_transmit(&mut self) {
        if std::mem::take(&mut self.transmit_held) {
            self.connection.on_transmitted();
        }
        self.pump();
    }

    /// Executes one block I/O request against the RAM disks and reports it.
    pub fn execute(&mut self, request: IoRequest) {
        let disk = self
            .disks
            .get_mut(&request.nsid.0)
            .expect("I/O for a test namespace");
        let buffer = self.buffers.buffer(request.slot);
        match request.kind {
            IoKind::Read {
                offset,
                len,
                buffer_offset,
            } => {
                let (offset, len, at) = (offset as usize, len as usize, buffer_offset as usize);
                buffer[at..at + len].copy_from_slice(&disk[offset..offset + len]);
            }
            IoKind::Write {
                offset,
                len,
                buffer_offset,
                ..
            } => {
                let (offset, len, at) = (offset as usize, len as usize, buffer_offset as usize);
                disk[offset..offset + len].copy_from_slice(&buffer[at..at + len]);
            }
            IoKind::Flush => {}
            IoKind::WriteZeroes { offset, len, .. } | IoKind::Deallocate { offset, len } => {
                disk[offset as usize..(offset + len) as usize].fill(0);
            }
            IoKind::Grow { size_bytes } => {
                // Grows only, as a node does: a smaller size is done already.
                let size = disk.len().max(size_bytes as usize);
                disk.resize(size, 0)
            }
            IoKind::Snapshot { name_len } => {
                let name = &buffer[..name_len as usize];
                self.snapshots
                    .push(String::from_utf8_lossy(name).into_owned());
            }
            IoKind::Reserve { host, command } => {
                let result = self.reserve(host, command);
                return self
                    .connection
                    .handle_io_complete(request.slot, result, &mut self.buffers);
            }
        }
        self.connection
            .handle_io_complete(request.slot, Ok(()), &mut self.buffers);
    }

    fn reserve(&self, host: HostIdentifier, command: ReservationCommand) -> Result<(), IoError> {
        let cell = self.reservations.as_ref().ok_or(IoError::Other)?;
        let (revision, state) = cell.state();
        let next = state.apply(host, command).map_err(|status| {
            if status == Status::RESERVATION_CONFLICT {
                IoError::ReservationConflict
            } else {
                IoError::InvalidField
            }
        })?;
        cell.install(revision + 1, next);
        Ok(())
    }

    /// Parses the next complete PDU the target sent.
    pub fn receive(&mut self) -> Option<ReceivedPdu> {
        parse_pdu(&mut self.sent)
    }

    /// Receives the next PDU, which must exist.
    pub fn expect(&mut self) -> ReceivedPdu {
        self.receive().expect("the target sent a PDU")
    }

    // ----- host PDUs -----

    /// Sends ICReq with the given digests and expects ICResp.
    pub fn initialize(&mut self, header_digest: bool, data_digest: bool) {
        self.send(&icreq(header_digest, data_digest));
        let icresp = self.expect();
        assert_eq!(icresp.pdu_type, PduType::IcResp as u8);
        self.header_digest = header_digest;
        self.data_digest = data_digest;
    }

    /// A CapsuleCmd PDU with this connection's digests.
    pub fn capsule(&self, sqe: &[u8; 64], data: &[u8]) -> Vec<u8> {
        capsule(self.header_digest, self.data_digest, sqe, data)
    }

    /// An H2CData PDU with this connection's digests.
    pub fn h2c_data(&self, cccid: u16, ttag: u16, offset: u32, data: &[u8], last: bool) -> Vec<u8> {
        h2c_data(
            self.header_digest,
            self.data_digest,
            cccid,
            ttag,
            offset,
            data,
            last,
        )
    }

    /// Sends a command (in-capsule data if any) and returns the PDUs until its completion.
    pub fn command(&mut self, sqe: &[u8; 64], data: &[u8]) -> Vec<ReceivedPdu> {
        let capsule = self.capsule(sqe, data);
        self.send(&capsule);
        let mut pdus = Vec::new();
        while let Some(pdu) = self.receive() {
            let done = pdu.pdu_type == PduType::CapsuleResp as u8
                || pdu.pdu_type == PduType::C2hTermReq as u8;
            pdus.push(pdu);
            if done {
                break;
            }
        }
        pdus
    }

    /// Sends a command that completes without data and returns its CapsuleResp.
    pub fn simple(&mut self, sqe: &[u8; 64]) -> ReceivedPdu {
        let mut pdus = self.command(sqe, &[]);
        assert_eq!(pdus.len(), 1, "one CapsuleResp expected: {pdus:?}");
        pdus.remove(0)
    }

    /// Sends a command that returns data: (data, CapsuleResp).
    pub fn read_data(&mut self, sqe: &[u8; 64]) -> (Vec<u8>, ReceivedPdu) {
        let pdus = self.command(sqe, &[]);
        let response = pdus.last().expect("a response").clone();
        let data = pdus
            .iter()
            .filter(|p| p.pdu_type == PduType::C2hData as u8)
            .flat_map(|p| p.data.clone())
            .collect();
        (data, response)
    }

    /// Sends a write-direction command whose data goes by R2T/H2CData in `chunk`-byte PDUs.
    pub fn write_r2t(&mut self, sqe: &[u8; 64], data: &[u8], chunk: usize) -> ReceivedPdu {
        let capsule = self.capsule(sqe, &[]);
        self.send(&capsule);
        let r2t = self.expect();
        assert_eq!(
            r2t.pdu_type,
            PduType::R2t as u8,
            "expected R2T, got {r2t:?}"
        );
        let header = DataHeader::decode(&r2t.header).expect("R2T header");
        assert_eq!(header.length as usize, data.len());
        for (index, piece) in data.chunks(chunk).enumerate() {
            let offset = (index * chunk) as u32;
            let last = offset as usize + piece.len() == data.len();
            let pdu = self.h2c_data(header.cccid, header.ttag, offset, piece, last);
            self.send(&pdu);
        }
        self.expect()
    }

    /// ICReq, admin Connect and CC.EN=1: a ready admin queue; returns the controller ID.
    pub fn connect_admin(&mut self, subnqn: &str, kato_ms: u32) -> u16 {
        self.initialize(self.header_digest, self.data_digest);
        let (sqe, mut data) = connect_command(1, 0, 31, kato_ms, 0xFFFF, subnqn);
        data[..16].copy_from_slice(&self.host_id);
        let response = self.command(&sqe, &data).pop().expect("Connect response");
        assert_eq!(response.status(), Status::SUCCESS, "admin Connect");
        let cntlid = response.result() as u16;
        let enable = property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
        assert_eq!(self.simple(&enable).status(), Status::SUCCESS);
        cntlid
    }

    /// Runs DH-HMAC-CHAP on this queue as the Linux host does, with
    /// Authentication Send (data in-capsule) and Receive commands.
    pub fn authenticate(&mut self, keys: HostKeys, subnqn: &str) -> Result<(), HostAuthError> {
        let mut exchange = HostExchange::new(keys, HOST_NQN, subnqn, 1);
        self.auth_send(&exchange.negotiate());
        let challenge = self.auth_receive();
        let reply = match exchange.reply(&challenge, &CountingRandom::default()) {
            Ok(reply) => reply,
            Err(error) => {
                if let Some(abort) = exchange.abort(&error) {
                    self.auth_send(&abort);
                }
                return Err(error);
            }
        };
        self.auth_send(&reply);
        let success1 = self.auth_receive();
        let (last, outcome) = exchange.conclude(&success1);
        if let Some(last) = last {
            self.auth_send(&last);
        }
        outcome
    }

    fn auth_send(&mut self, message: &[u8]) {
        let command = auth_command(fctype::AUTH_SEND, 0x70, message.len() as u32, true);
        let response = self.command(&command, message).pop().expect("a response");
        assert_eq!(response.status(), Status::SUCCESS, "Authentication Send");
    }

    fn auth_receive(&mut self) -> Vec<u8> {
        let (data, response) =
            self.read_data(&auth_command(fctype::AUTH_RECEIVE, 0x71, 4096, false));
        assert_eq!(response.status(), Status::SUCCESS, "Authentication Receive");
        data
    }

    /// ICReq and I/O queue Connect for `qid` of controller `cntlid`.
    pub fn connect_io(&mut self, cntlid: u16, qid: u16, sqsize: u16) -> ReceivedPdu {
        self.initialize(self.header_digest, self.data_digest);
        let (sqe, mut data) = connect_command(1, qid, sqsize, 0, cntlid, TEST_NQN);
        data[..16].copy_from_slice(&self.host_id);
        self.command(&sqe, &data).pop().expect("Connect response")
    }
}

/// Takes the next complete PDU off the front of `sent` (bytes from a target),
/// checking its digests.
pub fn parse_pdu(sent: &mut Vec<u8>) -> Option<ReceivedPdu> {
    if sent.len() < 8 {
        return None;
    }
    let plen = u32::from_le_bytes(sent[4..8].try_into().expect("4 bytes")) as usize;
    if sent.len() < plen {
        return None;
    }
    let pdu: Vec<u8> = sent.drain(..plen).collect();
    let (pdu_type, pdu_flags, hlen, pdo) =
        (pdu[0], pdu[1], usize::from(pdu[2]), usize::from(pdu[3]));
    if pdu_flags & flags::HDGSTF != 0 {
        let digest = u32::from_le_bytes(pdu[hlen..hlen + 4].try_into().expect("4 bytes"));
        assert_eq!(
            digest,
            crc32c(&pdu[..hlen]),
            "header digest of a target PDU"
        );
    }
    let data = if pdo > 0 {
        let end = plen - if pdu_flags & flags::DDGSTF != 0 { 4 } else { 0 };
        let data = pdu[pdo..end].to_vec();
        if pdu_flags & flags::DDGSTF != 0 {
            assert_eq!(
                u32::from_le_bytes(pdu[end..].try_into().expect("4 bytes")),
                crc32c(&data),
                "data digest of a target PDU"
            );
        }
        data
    } else {
        Vec::new()
    };
    Some(ReceivedPdu {
        pdu_type,
        flags: pdu_flags,
        header: pdu[..hlen].to_vec(),
        data,
    })
}

/// A CapsuleCmd PDU carrying `sqe` and optional in-capsule data.
pub fn capsule(header_digest: bool, data_digest: bool, sqe: &[u8; 64], data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; pdu::CAPSULE_PDO_MAX];
    let header_len =
        pdu::encode_capsule_cmd(header_digest, data_digest, 4, sqe, data.len(), &mut header);
    let mut pdu = header[..header_len].to_vec();
    pdu.extend_from_slice(data);
    if data_digest && !data.is_empty() {
        pdu.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    pdu
}

/// An H2CData PDU.
pub fn h2c_data(
    header_digest: bool,
    data_digest: bool,
    cccid: u16,
    ttag: u16,
    offset: u32,
    data: &[u8],
    last: bool,
) -> Vec<u8> {
    let mut out = [0u8; pdu::MAX_HEADER_LEN];
    let header = DataHeader {
        cccid,
        ttag,
        offset,
        length: data.len() as u32,
    };
    let pdu_flags = if last { flags::LAST_PDU } else { 0 };
    let pdo = pdu::encode_data_pdu(
        PduType::H2cData,
        pdu_flags,
        header_digest,
        data_digest,
        4,
        header,
        &mut out,
    );
    let mut pdu = out[..pdo].to_vec();
    pdu.extend_from_slice(data);
    if data_digest {
        pdu.extend_from_slice(&crc32c(data).to_le_bytes());
    }
    pdu
}

/// An ICReq asking for the given digests.
pub fn icreq(header_digest: bool, data_digest: bool) -> [u8; 128] {
    let mut icreq = [0u8; 128];
    IcReq::asking(header_digest, data_digest).encode(&mut icreq);
    icreq
}

/// A 64-byte SQE with opcode, CID and NSID; SGL 5Ah (transport) of `sgl_len` unless `in_capsule`.
pub fn sqe(opcode: u8, cid: u16, nsid: u32, sgl_len: u32, in_capsule: bool) -> [u8; 64] {
    let mut sqe = [0u8; 64];
    sqe[0] = opcode;
    sqe[1] = 0x40; // PSDT: SGL
    sqe[2..4].copy_from_slice(&cid.to_le_bytes());
    sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
    sqe[32..36].copy_from_slice(&sgl_len.to_le_bytes());
    sqe[39] = if in_capsule { 0x01 } else { 0x5A };
    sqe
}

/// Sets command dword `n` (10..=15).
pub fn set_cdw(sqe: &mut [u8; 64], n: usize, value: u32) {
    let at = 40 + (n - 10) * 4;
    sqe[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// A Fabrics Connect command and its 1024-byte data (sent in-capsule).
pub fn connect_command(
    cid: u16,
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    cntlid: u16,
    subnqn: &str,
) -> ([u8; 64], Vec<u8>) {
    let mut command = sqe(FABRICS_OPCODE, cid, 0, 1024, true);
    command[4] = fctype::CONNECT;
    command[42..44].copy_from_slice(&qid.to_le_bytes());
    command[44..46].copy_from_slice(&sqsize.to_le_bytes());
    command[48..52].copy_from_slice(&kato_ms.to_le_bytes());
    let mut data = vec![0u8; 1024];
    data[..16].copy_from_slice(&HOST_ID);
    data[16..18].copy_from_slice(&cntlid.to_le_bytes());
    data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    data[512..512 + HOST_NQN.len()].copy_from_slice(HOST_NQN.as_bytes());
    (command, data)
}

/// Authentication Send (`fctype::AUTH_SEND`, TL = `len`) or Receive (AL =
/// `len`) for DH-HMAC-CHAP.
pub fn auth_command(fctype: u8, cid: u16, len: u32, in_capsule: bool) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, cid, 0, len, in_capsule);
    command[4] = fctype;
    command[41] = SPSP_DHCHAP;
    command[42] = SPSP_DHCHAP;
    command[43] = SECP_DHCHAP;
    command[44..48].copy_from_slice(&len.to_le_bytes());
    command
}

/// Property Get of `offset` (8-byte for CAP).
pub fn property_get(cid: u16, offset: u32) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, cid, 0, 0, false);
    command[4] = fctype::PROPERTY_GET;
    command[40] = u8::from(offset == 0);
    command[44..48].copy_from_slice(&offset.to_le_bytes());
    command
}

/// Property Set of a 4-byte property.
pub fn property_set(cid: u16, offset: u32, value: u32) -> [u8; 64] {
    let mut command = sqe(FABRICS_OPCODE, cid, 0, 0, false);
    command[4] = fctype::PROPERTY_SET;
    command[44..48].copy_from_slice(&offset.to_le_bytes());
    command[48..52].copy_from_slice(&value.to_le_bytes());
    command
}

/// Identify with `cns` for `nsid`.
pub fn identify(cid: u16, cns: u8, nsid: u32) -> [u8; 64] {
    let mut command = sqe(admin_opcode::IDENTIFY, cid, nsid, 4096, false);
    set_cdw(&mut command, 10, u32::from(cns));
    command
}

/// Get Log Page `lid` of `len` bytes at `offset`.
pub fn get_log_page(cid: u16, lid: u8, len: u32, offset: u64) -> [u8; 64] {
    let mut command = sqe(admin_opcode::GET_LOG_PAGE, cid, 0xFFFF_FFFF, len, false);
    let dwords = len / 4 - 1;
    set_cdw(&mut command, 10, u32::from(lid) | ((dwords & 0xFFFF) << 16));
    set_cdw(&mut command, 11, dwords >> 16);
    set_cdw(&mut command, 12, offset as u32);
    set_cdw(&mut command, 13, (offset >> 32) as u32);
    command
}

/// A Read or Write (or Compare) of `blocks` at `slba` for `bytes` of data.
pub fn rw(
    opcode: u8,
    cid: u16,
    nsid: u32,
    slba: u64,
    blocks: u32,
    bytes: u32,
    in_capsule: bool,
) -> [u8; 64] {
    let mut command = sqe(opcode, cid, nsid, bytes, in_capsule);
    set_cdw(&mut command, 10, slba as u32);
    set_cdw(&mut command, 11, (slba >> 32) as u32);
    set_cdw(&mut command, 12, blocks - 1);
    command
}
