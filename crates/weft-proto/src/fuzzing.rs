//! Fuzz entry points, shared by the cargo-fuzz targets in `fuzz/` and by the
//! deterministic, seeded loops in this crate's tests (which run on stable
//! Rust in CI). Each entry point must never panic, whatever the input.
//!
//! The `connection` target must be cheap per execution to search far: what
//! it serves is built once per process ([`fixtures`]) with small limits and
//! namespaces ([`FUZZ_LIMITS`]), and the harness zeroes a slot buffer only
//! when a command first uses it. Its seeds, checked in under
//! `fuzz/seeds/connection/`, are the host model's byte streams recorded
//! through the same setup ([`connection_seeds`]), so that mutation starts
//! from I/O queues, R2T transfers and DH-HMAC-CHAP exchanges that work.

use crate::auth::{ControllerExchange, DhchapSecret, HostExchange};
use crate::command::{admin_opcode, Command, ConnectCommand, ConnectData, PropertyCommand};
use crate::host::{DataTransfer, HostCompletion, HostConfig, HostQueue};
use crate::io::{dsm_ranges, IoError, IoPlan};
use crate::pdu::{self, digest_bits, flags, CommonHeader, DataHeader, IcReq, IcResp, PduType};
use crate::status::{Completion, Status};
use crate::target::{Limits, Target, TargetConfig, DISCOVERY_NQN};
use crate::testing::{self, Pair, ReceivedPdu};
use crate::types::{Cid, Nsid};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Every decoder on arbitrary bytes.
pub fn decoders(data: &[u8]) {
    let _ = CommonHeader::decode(data);
    let _ = IcReq::decode(data);
    let _ = IcResp::decode(data);
    let _ = DataHeader::decode(data);
    let _ = ConnectData::decode(data);
    if let Ok(command) = Command::decode(data) {
        let _ = ConnectCommand::decode(&command);
        let _ = PropertyCommand::decode(&command);
        let _ = command.direction();
        let config = &fixtures()[0].config;
        let subsystem = &config.subsystems[0];
        let _ = IoPlan::from_command(&command, subsystem, config.limits.transfer_bytes_max);
        let mut ranges = Vec::new();
        let _ = dsm_ranges(&data[64..], &subsystem.namespaces[0], &mut ranges);
        reservation(&command, &data[64..]);
    }
}

/// A reservation command decoded from `data` and applied to a state with a
/// registrant and a reservation; the report of the outcome.
fn reservation(command: &Command, data: &[u8]) {
    use crate::reservation::{
        HostIdentifier, Registrant, Reservation, ReservationCommand, ReservationState,
        ReservationType,
    };
    let mut report = [0u8; 256];
    let holder = HostIdentifier([1; 16]);
    let held = ReservationState {
        generation: 1,
        registrants: vec![Registrant {
            host: holder,
            key: u64::from(command.cdw(12)),
        }],
        reservation: Some(Reservation {
            holder,
            kind: ReservationType::from_raw(command.cdw(13) as u8 % 6 + 1).expect("1 to 6"),
        }),
    };
    let _ = held.report(command.cdw(11) & 1 != 0, &mut report);
    let Some(needed) = ReservationCommand::data_len(command.opcode) else {
        return;
    };
    if data.len() < needed as usize {
        return;
    }
    let Ok(decoded) = ReservationCommand::decode(command.opcode, command.cdw(10), data) else {
        return;
    };
    for host in [HostIdentifier([0; 16]), holder] {
        if let Ok(next) = held.apply(host, decoded) {
            let _ = next.report(true, &mut report);
            let _ = next.check(host, crate::reservation::Access::Write);
        }
    }
}

/// The connection state machine on an arbitrary input: a setup byte that
/// chooses how far the connection gets legitimately first, then operations
/// (bytes from the host, block I/O completions, clock ticks, a configuration
/// update, sends held unreported and released), as [`Operation::decode`]
/// reads them.
///
/// The setup byte: bits 1:0 the stage reached (0 nothing, 1 ICReq, 2 an
/// admin queue with a 1 s keep-alive, 3 an I/O queue of an enabled
/// controller), bits 4 and 5 header and data digests, bit 6 the host must
/// authenticate (on stage 3 the setup authenticates the admin queue and
/// leaves the I/O queue to the input), bit 7 both ways.
pub fn connection(data: &[u8]) {
    run_connection(data, |_| {});
}

/// [`connection`], handing every PDU the target sends to `on_pdu` (parsing
/// them checks their lengths and digests).
fn run_connection(data: &[u8], mut on_pdu: impl FnMut(ReceivedPdu)) {
    let Some((&setup, mut input)) = data.split_first() else {
        return;
    };
    let mut session = Session::start(setup);
    while let Some(operation) = Operation::decode(&mut input) {
        session.apply(operation);
        while let Some(pdu) = session.host.receive() {
            on_pdu(pdu);
        }
    }
    session.finish();
}

/// Limits of the target the `connection` target fuzzes: few, small slots
/// (every execution builds connections), and a MAXH2CDATA below the largest
/// transfer so that an R2T transfer takes several H2CData PDUs.
pub const FUZZ_LIMITS: Limits = Limits {
    queue_entries_max: 32,
    transfer_bytes_max: 16 * 1024,
    io_in_capsule_bytes_max: 8 * 1024,
    admin_in_capsule_bytes_max: 8 * 1024,
    h2c_data_bytes_max: 4096,
    io_queues_max: 4,
    async_events_max: 2,
    icreq_timeout_ms: Limits::DEFAULT.icreq_timeout_ms,
    connect_timeout_ms: Limits::DEFAULT.connect_timeout_ms,
    controllers_per_subsystem_max: 8,
    pending_authentications_per_subsystem: 4,
    pending_authentications_per_address: 2,
    discovery_controllers_per_address: 4,
    controllers_reserved_for_nodes: 1,
};

const _: () = assert!(
    FUZZ_LIMITS.validate().is_ok(),
    "the fuzzing limits are valid"
);

/// Namespaces of the fuzzed target, as (NSID, blocks, block size): 32 KiB each.
const FUZZ_NAMESPACES: [(u32, u64, u32); 2] = [(1, 64, 512), (2, 8, 4096)];

/// Bits of the `connection` setup byte.
mod setup {
    /// How far the connection gets before the input: 0 to 3.
    pub const STAGE: u8 = 0x03;
    /// Header digests.
    pub const HEADER_DIGEST: u8 = 0x10;
    /// Data digests.
    pub const DATA_DIGEST: u8 = 0x20;
    /// The host must authenticate.
    pub const AUTHENTICATE: u8 = 0x40;
    /// ... and authenticates the controller too.
    pub const BIDIRECTIONAL: u8 = 0x80;
}

/// A configuration the `connection` target serves, and the one its
/// configuration update replaces it with.
#[derive(Debug)]
struct Fixture {
    config: Arc<TargetConfig>,
    /// Namespace 1 shrunk to half, namespace 2 removed, the ANA group
    /// Non-optimized (still serving I/O, so that the seeds' I/O after an
    /// update reaches the namespaces).
    updated: Arc<TargetConfig>,
}

/// The fixtures, built once per process so that an execution builds only a
/// target and its connections: open to any host, and open to the model host
/// only, which authenticates one way or both ways.
fn fixtures() -> &'static [Fixture; 3] {
    static FIXTURES: OnceLock<[Fixture; 3]> = OnceLock::new();
    FIXTURES.get_or_init(|| [fixture(None), fixture(Some(false)), fixture(Some(true))])
}

fn fixture(authentication: Option<bool>) -> Fixture {
    let mut config = testing::config_with(testing::TEST_NQN, &FUZZ_NAMESPACES, FUZZ_LIMITS);
    // Namespace 1 serves reservation commands (the cell stays empty: held
    // I/O completes without a node behind it).
    config.subsystems[0].namespaces[0].reservations =
        Some(Arc::new(crate::reservation::ReservationCell::new()));
    if let Some(bidirectional) = authentication {
        testing::require_authentication(&mut config, bidirectional);
    }
    let mut updated = config.clone();
    let subsystem = &mut updated.subsystems[0];
    subsystem.namespaces[0].blocks /= 2;
    subsystem.namespaces.truncate(1);
    subsystem.ana.state = crate::ana::AnaState::NonOptimized;
    updated.generation += 1;
    Fixture {
        config: Arc::new(config),
        updated: Arc::new(updated),
    }
}

/// One step of a `connection` input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation<'a> {
    /// Bytes from the host.
    Deliver(&'a [u8]),
    /// The held block I/O completes; request i fails when bit i % 6 of the mask is set.
    Complete { fail_mask: u8 },
    /// The clock moves by this many tenths of a second (1 to 62) and timers fire.
    Advance { tenths: u8 },
    /// The target's configuration changes to [`Fixture::updated`].
    UpdateConfig,
    /// The target's sends stop being reported done, or are again (the one
    /// held first): as when a reactor reaps its send late, or the host's
    /// socket is full; what the target has to send meanwhile waits in it.
    ToggleTransmitHold,
}

impl<'a> Operation<'a> {
    /// Takes the next operation off the front of `input`, by its first byte:
    /// `00xxxxxx` delivers the next x + 1 bytes, `01xxxxxx` the next
    /// (x + 1) * 64 (fewer at the end of the input); `10xxxxxx` completes
    /// the held I/O with fail mask x; `11xxxxxx` advances the clock by x + 1
    /// tenths of a second, except `11111110`, which holds the target's sends
    /// or releases them, and `11111111`, which updates the configuration.
    fn decode(input: &mut &'a [u8]) -> Option<Operation<'a>> {
        let (&first, rest) = input.split_first()?;
        let value = first & 0x3F;
        let operation = match first >> 6 {
            0b00 | 0b01 => {
                let unit = if first & 0x40 != 0 { 64 } else { 1 };
                let len = (usize::from(value) + 1) * unit;
                let (bytes, rest) = rest.split_at(len.min(rest.len()));
                *input = rest;
                return Some(Operation::Deliver(bytes));
            }
            0b10 => Operation::Complete { fail_mask: value },
            _ if first == 0xFF => Operation::UpdateConfig,
            _ if first == 0xFE => Operation::ToggleTransmitHold,
            _ => Operation::Advance { tenths: value + 1 },
        };
        *input = rest;
        Some(operation)
    }

    /// Appends the encoding [`Operation::decode`] reads back.
    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Operation::Deliver(mut bytes) => {
                while !bytes.is_empty() {
                    // Whole 64-byte blocks (at most 64 of them) first, then the rest.
                    let (first, len) = match bytes.len() / 64 {
                        0 => (bytes.len() as u8 - 1, bytes.len()),
                        blocks => {
                            let blocks = blocks.min(64);
                            (0x40 | (blocks as u8 - 1), blocks * 64)
                        }
                    };
                    out.push(first);
                    out.extend_from_slice(&bytes[..len]);
                    bytes = &bytes[len..];
                }
            }
            Operation::Complete { fail_mask } => {
                assert!(fail_mask < 0x40, "a six-bit fail mask");
                out.push(0x80 | fail_mask);
            }
            Operation::Advance { tenths } => {
                assert!((1..=62).contains(&tenths), "1 to 62 tenths of a second");
                out.push(0xC0 | (tenths - 1));
            }
            Operation::UpdateConfig => out.push(0xFF),
            Operation::ToggleTransmitHold => out.push(0xFE),
        }
    }
}

/// One `connection` execution: the connection under test and, when the
/// setup made it an I/O queue, its controller's admin queue.
#[derive(Debug)]
struct Session {
    fixture: &'static Fixture,
    host: Pair,
    admin: Option<Pair>,
}

impl Session {
    /// A fresh target (its controller registry and random source are per
    /// execution, so that executions are independent and repeatable) serving
    /// the fixture `setup` names, and the connection brought to its stage.
    fn start(setup: u8) -> Session {
        let authenticate = setup & setup::AUTHENTICATE != 0;
        let bidirectional = setup & setup::BIDIRECTIONAL != 0;
        let fixture = &fixtures()[match (authenticate, bidirectional) {
            (false, _) => 0,
            (true, false) => 1,
            (true, true) => 2,
        }];
        let target = Target::new(
            Arc::clone(&fixture.config),
            Arc::new(testing::CountingRandom::default()),
        );
        let mut host = Pair::new(&target);
        host.header_digest = setup & setup::HEADER_DIGEST != 0;
        host.data_digest = setup & setup::DATA_DIGEST != 0;
        let mut admin = None;
        match setup & setup::STAGE {
            0 => {}
            1 => host.initialize(host.header_digest, host.data_digest),
            2 => {
                host.connect_admin(testing::TEST_NQN, 1000);
            }
            _ => {
                let mut controller = Pair::new(&target);
                let cntlid = controller.connect_admin(testing::TEST_NQN, 0);
                if authenticate {
                    controller
                        .authenticate(testing::host_keys(bidirectional), testing::TEST_NQN)
                        .expect("the model host authenticates");
                }
                let mut queues = testing::sqe(admin_opcode::SET_FEATURES, 9, 0, 0, false);
                testing::set_cdw(&mut queues, 10, 0x07);
                controller.simple(&queues);
                host.connect_io(cntlid, 1, FUZZ_LIMITS.queue_entries_max - 1);
                admin = Some(controller);
            }
        }
        host.hold_io = true;
        Session {
            fixture,
            host,
            admin,
        }
    }

    fn apply(&mut self, operation: Operation<'_>) {
        match operation {
            Operation::Deliver(bytes) => self.host.send(bytes),
            Operation::Complete { fail_mask } => self.complete_held(fail_mask),
            Operation::Advance { tenths } => self
                .host
                .advance(Duration::from_millis(100 * u64::from(tenths))),
            Operation::UpdateConfig => {
                for pair in std::iter::once(&mut self.host).chain(&mut self.admin) {
                    pair.update_config(Arc::clone(&self.fixture.updated));
                }
            }
            Operation::ToggleTransmitHold => {
                let host = &mut self.host;
                host.hold_transmit = !host.hold_transmit;
                if !host.hold_transmit {
                    host.finish_transmit();
                }
            }
        }
    }

    fn complete_held(&mut self, fail_mask: u8) {
        let host = &mut self.host;
        for (index, request) in std::mem::take(&mut host.held_io).into_iter().enumerate() {
            if fail_mask & (1 << (index % 6)) != 0 {
                host.connection.handle_io_complete(
                    request.slot,
                    Err(IoError::Media),
                    &mut host.buffers,
                );
            } else {
                host.execute(request);
            }
        }
        host.pump();
    }

    /// Completes what is held, lets an hour pass and closes the connection.
    fn finish(mut self) {
        self.host.hold_transmit = false;
        self.host.finish_transmit();
        self.complete_held(0);
        self.host.advance(Duration::from_secs(3600));
        self.host.connection.on_closed();
    }
}

/// DH-HMAC-CHAP on arbitrary input: the secret parser, the controller side
/// fed the messages the input splits into at 0xFF bytes (each followed by an
/// Authentication Receive of the size the first byte says), and the host
/// side taking the first part as a Challenge and the second as Success1.
pub fn authentication(data: &[u8]) {
    let Some((&receive_len, rest)) = data.split_first() else {
        return;
    };
    let _ = DhchapSecret::parse(&String::from_utf8_lossy(rest));
    let random = testing::CountingRandom::default();
    let keys = testing::host_keys(receive_len & 1 != 0);
    let mut controller =
        ControllerExchange::new(Arc::new(keys.clone()), testing::HOST_NQN, testing::TEST_NQN);
    let mut out = [0u8; 256];
    for message in rest.split(|&byte| byte == 0xFF) {
        controller.on_send(message);
        let _ = controller.on_receive(&mut out[..usize::from(receive_len)], &random);
    }
    let mut parts = rest.splitn(2, |&byte| byte == 0xFF);
    let (challenge, success1) = (parts.next().unwrap_or(&[]), parts.next().unwrap_or(&[]));
    let mut host = HostExchange::new(keys, testing::HOST_NQN, testing::TEST_NQN, 1);
    if host.reply(challenge, &random).is_ok() {
        let _ = host.conclude(success1);
    }
}

/// The host side of a connection (the initiator's core) on an arbitrary
/// byte stream from a target. The first byte asks for header (bit 0) and
/// data (bit 1) digests; the rest is read as `connection` operations of
/// which only deliveries carry input: the bytes the target sends. Once
/// ICResp arrives the host submits a read, a write by R2T, a write in the
/// capsule and a command without data; after each operation it sends what
/// it queued and takes its completions.
pub fn host(data: &[u8]) {
    run_host(data, |_| {});
}

/// [`host`], handing every completion to `on_completion`.
fn run_host(data: &[u8], mut on_completion: impl FnMut(HostCompletion)) {
    let Some((&setup, mut input)) = data.split_first() else {
        return;
    };
    let mut host = HostQueue::new(HostConfig {
        header_digest: setup & digest_bits::HEADER != 0,
        data_digest: setup & digest_bits::DATA != 0,
        ..HOST_FUZZ_CONFIG
    });
    let mut buffers = testing::VecBuffers::new(&FUZZ_LIMITS);
    let mut submitted = false;
    while let Some(operation) = Operation::decode(&mut input) {
        if let Operation::Deliver(bytes) = operation {
            host.handle_input(bytes, &mut buffers);
        }
        if host.is_ready() && !submitted {
            submitted = true;
            for (sqe, transfer) in host_commands() {
                let _ = host.submit(sqe, transfer, &mut buffers);
            }
        }
        while host.poll_transmit().is_some() {
            host.on_transmitted();
        }
        while let Some(completion) = host.poll_completion() {
            on_completion(completion);
        }
    }
}

/// The host queue [`host`] drives: 8 KiB transfers go by R2T, 4 KiB ones in
/// the capsule.
const HOST_FUZZ_CONFIG: HostConfig = HostConfig {
    header_digest: false,
    data_digest: false,
    queue_entries: 8,
    in_capsule_bytes_max: 4096,
    buffer_bytes: FUZZ_LIMITS.transfer_bytes_max,
};

/// What [`host`] submits, CIDs 0 to 3 in order: a read of 8 KiB, a write of
/// 8 KiB (by R2T), a write of 2 KiB (in the capsule) and a Flush.
fn host_commands() -> [([u8; 64], DataTransfer); 4] {
    use crate::command::io_opcode::{FLUSH, READ, WRITE};
    [
        (
            testing::rw(READ, 0, 1, 0, 16, 0, false),
            DataTransfer::FromController(8192),
        ),
        (
            testing::rw(WRITE, 0, 1, 0, 16, 0, false),
            DataTransfer::ToController(8192),
        ),
        (
            testing::rw(WRITE, 0, 1, 16, 4, 0, false),
            DataTransfer::ToController(2048),
        ),
        (testing::sqe(FLUSH, 0, 1, 0, false), DataTransfer::None),
    ]
}

/// Seeds for `host`: a target answering [`host`]'s commands as weft does
/// (ICResp, an R2T, the read's data in two C2HData PDUs, four
/// CapsuleResps), without and with digests.
pub fn host_seeds() -> Vec<Seed> {
    let answers = |header_digest: bool, data_digest: bool| {
        let mut icresp = [0u8; 128];
        IcResp {
            pfv: 0,
            cpda: 0,
            digest: digest_bits::of(header_digest, data_digest),
            maxh2cdata: FUZZ_LIMITS.h2c_data_bytes_max,
        }
        .encode(&mut icresp);
        // The host submits once ICResp is in: the answers come after.
        let mut stream = Vec::new();
        let mut r2t = [0u8; 28];
        let header = DataHeader {
            cccid: 1,
            ttag: 1,
            offset: 0,
            length: 8192,
        };
        let len = pdu::encode_r2t(header_digest, header, &mut r2t);
        stream.extend_from_slice(&r2t[..len]);
        let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        for (index, piece) in data.chunks(4096).enumerate() {
            let header = DataHeader {
                cccid: 0,
                ttag: 0,
                offset: index as u32 * 4096,
                length: 4096,
            };
            let pdu_flags = if index == 1 { flags::LAST_PDU } else { 0 };
            let mut out = [0u8; pdu::MAX_HEADER_LEN];
            let pdo = pdu::encode_data_pdu(
                PduType::C2hData,
                pdu_flags,
                header_digest,
                data_digest,
                4,
                header,
                &mut out,
            );
            stream.extend_from_slice(&out[..pdo]);
            stream.extend_from_slice(piece);
            if data_digest {
                stream.extend_from_slice(&crate::digest::crc32c(piece).to_le_bytes());
            }
        }
        for cid in 0..4 {
            let cqe = Completion {
                result: 0,
                sqhd: cid + 1,
                sqid: 1,
                cid: Cid(cid),
                status: Status::SUCCESS,
            }
            .encode();
            let mut out = [0u8; 28];
            let len = pdu::encode_capsule_resp(header_digest, &cqe, &mut out);
            stream.extend_from_slice(&out[..len]);
        }
        let mut input = vec![digest_bits::of(header_digest, data_digest)];
        Operation::Deliver(&icresp).encode(&mut input);
        Operation::Deliver(&stream).encode(&mut input);
        input
    };
    vec![
        Seed {
            name: "answers",
            input: answers(false, false),
        },
        Seed {
            name: "answers-with-digests",
            input: answers(true, true),
        },
    ]
}

/// A small deterministic PRNG (xorshift64*) for the seeded fuzz loops.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is remapped).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value below `bound` (> 0).
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    /// Mutates `input` in place: bit flips, byte sets, interesting values, truncation, duplication.
    pub fn mutate(&mut self, input: &mut Vec<u8>) {
        for _ in 0..1 + self.below(4) {
            if input.is_empty() {
                input.push(self.next_u64() as u8);
                continue;
            }
            let at = self.below(input.len());
            match self.below(6) {
                0 => input[at] ^= 1 << self.below(8),
                1 => input[at] = self.next_u64() as u8,
                2 => input[at] = [0x00, 0xFF, 0x7F, 0x80, 0x18, 0x48][self.below(6)],
                3 => input.truncate(at),
                4 => {
                    let end = (at + 1 + self.below(16)).min(input.len());
                    let copy = input[at..end].to_vec();
                    input.splice(at..at, copy);
                }
                _ => {
                    let len = 1 + self.below(8);
                    for _ in 0..len {
                        input.insert(at, self.next_u64() as u8);
                    }
                }
            }
        }
    }
}

/// An input to start mutating from, checked in under `fuzz/seeds/TARGET/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// File name: what the input reaches.
    pub name: &'static str,
    /// The input.
    pub input: Vec<u8>,
}

/// Seeds for `connection`: the host model's byte streams through every
/// stage, I/O queues (in-capsule and R2T transfers, with and without
/// digests, across a configuration update), DH-HMAC-CHAP on admin and I/O
/// queues, keep-alive expiry, namespace and ANA notices.
pub fn connection_seeds() -> Vec<Seed> {
    use crate::command::io_opcode::{
        COMPARE, DATASET_MANAGEMENT, FLUSH, READ, WRITE, WRITE_ZEROES,
    };
    use testing::{get_log_page, identify, rw, set_cdw, sqe};
    let pattern = |len: usize| (0..len).map(|i| (i * 7 % 251) as u8).collect::<Vec<u8>>();
    // 4 KiB in-capsule to NSID 2, block 1; the data written.
    let write_block = |host: &mut Pair| {
        let block = pattern(4096);
        let write = rw(WRITE, 1, 2, 1, 1, 4096, true);
        assert_eq!(
            host.command(&write, &block).pop().map(|r| r.status()),
            Some(Status::SUCCESS)
        );
        block
    };
    // 8 KiB by R2T: two H2CData PDUs of MAXH2CDATA each.
    let r2t_transfers = |host: &mut Pair| {
        let data = pattern(8192);
        let write = rw(WRITE, 1, 2, 0, 2, 8192, false);
        assert_eq!(
            host.write_r2t(&write, &data, 4096).status(),
            Status::SUCCESS
        );
        let (read, response) = host.read_data(&rw(READ, 2, 2, 0, 2, 8192, false));
        assert_eq!((read, response.status()), (data.clone(), Status::SUCCESS));
        let compare = rw(COMPARE, 3, 2, 0, 2, 8192, false);
        host.write_r2t(&compare, &data, 4096).status()
    };
    vec![
        record("admin-queue", 0x00, |recorder| {
            let host = recorder.host();
            host.connect_admin(testing::TEST_NQN, 5000);
            for (cid, cns, nsid) in [(3, 1, 0), (4, 0, 1), (5, 2, 0), (6, 3, 2), (7, 8, 1)] {
                assert_eq!(
                    host.read_data(&identify(cid, cns, nsid)).1.status(),
                    Status::SUCCESS
                );
            }
            let logs = [
                (8, 0x02, 512),
                (9, 0x03, 512),
                (10, 0x04, 4096),
                (15, 0x0C, 4096),
            ];
            for (cid, lid, len) in logs {
                let (_, response) = host.read_data(&get_log_page(cid, lid, len, 0));
                assert_eq!(response.status(), Status::SUCCESS);
            }
            let mut keep_alive_timer = sqe(admin_opcode::GET_FEATURES, 11, 0, 0, false);
            set_cdw(&mut keep_alive_timer, 10, 0x0F);
            host.simple(&keep_alive_timer);
            host.simple(&testing::property_get(12, 0));
            // An Asynchronous Event Request stays outstanding.
            host.command(
                &sqe(admin_opcode::ASYNC_EVENT_REQUEST, 13, 0, 0, false),
                &[],
            );
            host.simple(&sqe(admin_opcode::KEEP_ALIVE, 14, 0, 0, false))
                .status()
        }),
        record("discovery-log", setup::HEADER_DIGEST, |recorder| {
            let host = recorder.host();
            host.connect_admin(DISCOVERY_NQN, 0);
            for (cid, len, offset) in [(3, 1024, 0), (4, 2048, 1024), (5, 1024, u64::MAX - 3)] {
                let (_, response) = host.read_data(&get_log_page(cid, 0x70, len, offset));
                assert_eq!(response.status(), Status::SUCCESS);
            }
            host.read_data(&identify(6, 1, 0)).1.status()
        }),
        record("io-queue-in-capsule", 0x03, |recorder| {
            let host = recorder.host();
            let block = write_block(host);
            let (read, _) = host.read_data(&rw(READ, 2, 2, 1, 1, 4096, false));
            assert_eq!(read, block);
            let compare = rw(COMPARE, 3, 2, 1, 1, 4096, true);
            assert_eq!(
                host.command(&compare, &block).pop().map(|r| r.status()),
                Some(Status::SUCCESS)
            );
            host.simple(&rw(WRITE_ZEROES, 4, 1, 8, 8, 0, false));
            let mut deallocate = sqe(DATASET_MANAGEMENT, 5, 1, 32, true);
            set_cdw(&mut deallocate, 10, 1);
            set_cdw(&mut deallocate, 11, 1 << 2);
            let ranges = crate::wire::hex(
                "00000000 04000000 1000000000000000  00000000 02000000 2000000000000000",
            );
            host.command(&deallocate, &ranges);
            host.simple(&sqe(FLUSH, 6, Nsid::BROADCAST.0, 0, false));
            host.read_data(&rw(READ, 7, 1, 0, 8, 4096, false))
                .1
                .status()
        }),
        record("io-queue-sends-reaped-late", 0x03, |recorder| {
            // The write's response is out but its send not reported done:
            // the read's data and the Flush's response wait in the target.
            recorder.operation(Operation::ToggleTransmitHold);
            let host = recorder.host();
            let block = write_block(host);
            for command in [
                rw(READ, 2, 2, 1, 1, 4096, false),
                sqe(FLUSH, 3, Nsid::BROADCAST.0, 0, false),
            ] {
                let capsule = host.capsule(&command, &[]);
                host.send(&capsule);
            }
            assert!(
                host.receive().is_none(),
                "nothing sent while a send is held"
            );
            recorder.operation(Operation::ToggleTransmitHold);
            let host = recorder.host();
            let (mut read, mut responses) = (Vec::new(), Vec::new());
            while let Some(pdu) = host.receive() {
                match pdu.pdu_type {
                    t if t == PduType::C2hData as u8 => read.extend_from_slice(&pdu.data),
                    _ => responses.push(pdu),
                }
            }
            assert_eq!(read, block);
            let last = responses.pop().expect("the Flush's response");
            assert_eq!(last.cid(), 3);
            last.status()
        }),
        record("io-queue-r2t", 0x03, |recorder| {
            r2t_transfers(recorder.host())
        }),
        record(
            "io-queue-r2t-digests",
            0x03 | setup::HEADER_DIGEST | setup::DATA_DIGEST,
            |recorder| r2t_transfers(recorder.host()),
        ),
        record("io-queue-r2t-across-config-update", 0x03, |recorder| {
            let host = recorder.host();
            let capsule = host.capsule(&rw(WRITE, 1, 2, 0, 2, 8192, false), &[]);
            host.send(&capsule);
            let r2t = DataHeader::decode(&host.expect().header).expect("an R2T");
            // Namespace 2 goes away while its data is on the way.
            recorder.operation(Operation::UpdateConfig);
            let host = recorder.host();
            for (index, piece) in pattern(8192).chunks(4096).enumerate() {
                let offset = index as u32 * 4096;
                let h2c = host.h2c_data(r2t.cccid, r2t.ttag, offset, piece, index == 1);
                host.send(&h2c);
            }
            assert_eq!(host.expect().status(), Status::INVALID_NAMESPACE);
            let beyond = rw(READ, 2, 1, 32, 1, 512, false);
            host.read_data(&beyond).1.status()
        }),
        record(
            "admin-authenticates",
            0x02 | setup::AUTHENTICATE,
            |recorder| {
                let host = recorder.host();
                host.authenticate(testing::host_keys(false), testing::TEST_NQN)
                    .expect("the model host authenticates");
                host.read_data(&identify(9, 1, 0)).1.status()
            },
        ),
        record(
            "admin-authenticates-both-ways",
            0x02 | setup::AUTHENTICATE | setup::BIDIRECTIONAL,
            |recorder| {
                let host = recorder.host();
                host.authenticate(testing::host_keys(true), testing::TEST_NQN)
                    .expect("both sides authenticate");
                host.read_data(&identify(9, 1, 0)).1.status()
            },
        ),
        record(
            "io-queue-authenticates",
            0x03 | setup::AUTHENTICATE,
            |recorder| {
                let host = recorder.host();
                host.authenticate(testing::host_keys(false), testing::TEST_NQN)
                    .expect("the model host authenticates");
                r2t_transfers(host)
            },
        ),
        record("admin-keep-alive-expires", 0x02, |recorder| {
            let keep_alive = |cid| sqe(admin_opcode::KEEP_ALIVE, cid, 0, 0, false);
            recorder.host().simple(&keep_alive(3));
            recorder.operation(Operation::Advance { tenths: 8 });
            let status = recorder.host().simple(&keep_alive(4)).status();
            // KATO (1 s) and the timer's granule of slack without Keep
            // Alive: the controller goes away.
            recorder.operation(Operation::Advance { tenths: 21 });
            assert!(recorder.host().connection.is_closed());
            status
        }),
        record("admin-namespace-notice", 0x02, |recorder| {
            let host = recorder.host();
            let mut notices = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
            set_cdw(&mut notices, 10, 0x0B);
            set_cdw(&mut notices, 11, 1 << 8);
            host.simple(&notices);
            host.command(&sqe(admin_opcode::ASYNC_EVENT_REQUEST, 4, 0, 0, false), &[]);
            recorder.operation(Operation::UpdateConfig);
            let host = recorder.host();
            assert_eq!(
                host.expect().result() as u32,
                crate::admin::NAMESPACE_ATTRIBUTE_CHANGED
            );
            let (_, response) = host.read_data(&get_log_page(5, 0x04, 4096, 0));
            response.status()
        }),
        record("admin-ana-notice", 0x02, |recorder| {
            let host = recorder.host();
            let mut notices = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
            set_cdw(&mut notices, 10, 0x0B);
            set_cdw(&mut notices, 11, 1 << 11);
            host.simple(&notices);
            host.command(&sqe(admin_opcode::ASYNC_EVENT_REQUEST, 4, 0, 0, false), &[]);
            recorder.operation(Operation::UpdateConfig);
            let host = recorder.host();
            assert_eq!(host.expect().result() as u32, crate::admin::ANA_CHANGED);
            // Groups only (LSP bit 0), at an offset, then the whole page.
            let mut groups = get_log_page(5, 0x0C, 32, 16);
            set_cdw(&mut groups, 10, 0x0C | (1 << 8) | (7 << 16));
            assert_eq!(host.read_data(&groups).1.status(), Status::SUCCESS);
            let (_, response) = host.read_data(&get_log_page(6, 0x0C, 2096, 0));
            response.status()
        }),
    ]
}

/// Records a `connection` seed: the setup the fuzz target runs for `setup`,
/// then `script` driving the host model, whose deliveries are recorded, each
/// followed by the completion of the block I/O it started (the model
/// executes I/O at once; the fuzz target holds it until told). `script`
/// returns the status of its last command, which the seed must reproduce
/// when the fuzz target replays it, without a C2HTermReq on the way.
fn record(name: &'static str, setup: u8, script: impl FnOnce(&mut Recorder) -> Status) -> Seed {
    let mut session = Session::start(setup);
    session.host.hold_io = false;
    session.host.recorded = Some(Vec::new());
    let mut recorder = Recorder {
        session,
        input: vec![setup],
    };
    let last_status = script(&mut recorder);
    recorder.take_deliveries();
    let mut replayed = None;
    run_connection(&recorder.input, |pdu| {
        assert_ne!(pdu.pdu_type, PduType::C2hTermReq as u8, "{name}: {pdu:?}");
        if pdu.pdu_type == PduType::CapsuleResp as u8 {
            replayed = Some(pdu.status());
        }
    });
    assert_eq!(replayed, Some(last_status), "{name} replays as recorded");
    Seed {
        name,
        input: recorder.input,
    }
}

/// A [`Session`] whose host model's deliveries become a `connection` input.
struct Recorder {
    session: Session,
    input: Vec<u8>,
}

impl Recorder {
    /// The host model.
    fn host(&mut self) -> &mut Pair {
        &mut self.session.host
    }

    /// An operation other than a delivery, recorded in its place in the input.
    fn operation(&mut self, operation: Operation<'_>) {
        self.take_deliveries();
        operation.encode(&mut self.input);
        self.session.apply(operation);
    }

    fn take_deliveries(&mut self) {
        let deliveries = self
            .session
            .host
            .recorded
            .replace(Vec::new())
            .unwrap_or_default();
        for bytes in &deliveries {
            Operation::Deliver(bytes).encode(&mut self.input);
            Operation::Complete { fail_mask: 0 }.encode(&mut self.input);
        }
    }
}

/// The PSK every identity stands for in [`tls`].
struct FuzzPsks;

impl crate::tls::PskStore for FuzzPsks {
    fn tls_psks(&self, _identity: &[u8]) -> Vec<Vec<u8>> {
        vec![FUZZ_TLS_PSK.to_vec()]
    }
}

const FUZZ_TLS_PSK: [u8; 32] = [0x42; 32];
const FUZZ_TLS_IDENTITY: &[u8] = b"NVMe0R01 nqn.fuzz-host nqn.fuzz-subsystem";

/// TLS 1.3 on arbitrary input: the PSK text and identity parsers; a
/// post-handshake message (a KeyUpdate); a
/// target's handshake fed the input as a host's bytes (and, once
/// established, the rest as records); an initiator's handshake fed it as a
/// target's answer to its ClientHello. Randomness is counted, so the seeds
/// (a real ClientHello; a real server flight to the initiator's hello)
/// replay.
pub fn tls(data: &[u8]) {
    use crate::tls::psk::{ConfiguredPsk, Identity};
    use crate::tls::{CipherSuite, ClientHandshake, KeyUpdates, RecordKeys, ServerHandshake};
    let _ = ConfiguredPsk::parse(&String::from_utf8_lossy(data));
    let _ = Identity::parse(data);
    let mut keys = RecordKeys::new(CipherSuite::Aes128GcmSha256, &[0; 32]);
    let _ = KeyUpdates::answering().received(data, &mut keys);
    let mut server = ServerHandshake::new(&testing::CountingRandom::default());
    if server.handle_input(data, &FuzzPsks).is_ok() {
        if let Some(mut established) = server.established() {
            let mut rest = std::mem::take(&mut established.leftover);
            let mut updates = KeyUpdates::answering();
            while let Ok(Some(len)) = crate::tls::record_len(&rest) {
                if len > rest.len() {
                    break;
                }
                let Ok((kind, range)) = established.receive.open(&mut rest[..len]) else {
                    break;
                };
                if kind != crate::tls::APPLICATION_DATA
                    && updates
                        .received(&rest[range], &mut established.receive)
                        .is_err()
                {
                    break;
                }
                rest.drain(..len);
            }
        }
    }
    let random = testing::CountingRandom::default();
    let mut client = ClientHandshake::new(FUZZ_TLS_IDENTITY, &FUZZ_TLS_PSK, &random);
    let _ = client.handle_input(data);
}

/// Seeds for `tls`: the initiator's ClientHello, and the target's flight
/// that answers it.
pub fn tls_seeds() -> Vec<Seed> {
    use crate::tls::{ClientHandshake, ServerHandshake};
    let random = testing::CountingRandom::default();
    let mut client = ClientHandshake::new(FUZZ_TLS_IDENTITY, &FUZZ_TLS_PSK, &random);
    let hello = client.take_output();
    let mut server = ServerHandshake::new(&testing::CountingRandom::default());
    server
        .handle_input(&hello, &FuzzPsks)
        .expect("the target takes the initiator's hello");
    let flight = server.take_output();
    vec![
        Seed {
            name: "client-hello",
            input: hello,
        },
        Seed {
            name: "server-flight",
            input: flight,
        },
    ]
}

/// Seeds for `authentication`: a Negotiate, and a Challenge with a Success1.
pub fn authentication_seeds() -> Vec<Seed> {
    let host = HostExchange::new(
        testing::host_keys(true),
        testing::HOST_NQN,
        testing::TEST_NQN,
        1,
    );
    let mut controller = ControllerExchange::new(
        Arc::new(testing::host_keys(true)),
        testing::HOST_NQN,
        testing::TEST_NQN,
    );
    controller.on_send(&host.negotiate());
    let mut challenge = [0u8; 256];
    let len = controller
        .on_receive(&mut challenge, &testing::CountingRandom::default())
        .expect("a Challenge fits");
    let mut challenge_then_success1 = vec![0x81];
    challenge_then_success1.extend_from_slice(&challenge[..len]);
    challenge_then_success1.push(0xFF);
    challenge_then_success1.extend_from_slice(&[1, 3, 0, 0, 1, 0, 48, 0, 1]);
    let mut negotiate = vec![0x80];
    negotiate.extend_from_slice(&host.negotiate());
    vec![
        Seed {
            name: "negotiate",
            input: negotiate,
        },
        Seed {
            name: "challenge-then-success1",
            input: challenge_then_success1,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// Seeded mutation fuzzing of the connection state machine (a fixed budget
    /// in CI; `cargo fuzz run connection` in fuzz/ searches further).
    #[test]
    fn connection_survives_mutated_streams() {
        let corpus = connection_seeds();
        let mut rng = Rng::new(0x5eed_0001);
        for iteration in 0..20_000 {
            let mut input = corpus[iteration % corpus.len()].input.clone();
            rng.mutate(&mut input);
            connection(&input);
        }
    }

    #[test]
    fn authentication_survives_mutated_messages() {
        let seeds = authentication_seeds();
        let mut rng = Rng::new(0x5eed_0003);
        for iteration in 0..5000 {
            let mut input = seeds[iteration % seeds.len()].input.clone();
            rng.mutate(&mut input);
            authentication(&input);
        }
    }

    #[test]
    fn tls_survives_mutated_handshakes() {
        let seeds = tls_seeds();
        let mut rng = Rng::new(0x5eed_0005);
        for iteration in 0..3000 {
            let mut input = seeds[iteration % seeds.len()].input.clone();
            rng.mutate(&mut input);
            tls(&input);
        }
    }

    /// The server flight seed takes the initiator to the end of its handshake.
    #[test]
    fn tls_seeds_complete_the_initiators_handshake() {
        use crate::tls::ClientHandshake;
        let flight = &tls_seeds()[1].input;
        let random = testing::CountingRandom::default();
        let mut client = ClientHandshake::new(FUZZ_TLS_IDENTITY, &FUZZ_TLS_PSK, &random);
        client.handle_input(flight).unwrap();
        assert!(client.established().is_some());
    }

    #[test]
    fn decoders_survive_random_bytes() {
        let mut rng = Rng::new(0x5eed_0002);
        for _ in 0..20_000 {
            let len = rng.below(1100);
            let input: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            decoders(&input);
        }
    }

    /// Recording checks that each seed replays under the fuzz target as it
    /// was recorded; the R2T seeds must also make the target ask for data.
    #[test]
    fn connection_seeds_replay_as_recorded() {
        for seed in connection_seeds() {
            let mut r2t = false;
            run_connection(&seed.input, |pdu| r2t |= pdu.pdu_type == PduType::R2t as u8);
            let by_r2t = seed.name.contains("r2t") || seed.name == "io-queue-authenticates";
            assert_eq!(r2t, by_r2t, "{}", seed.name);
        }
    }

    /// Against its seeds the host completes all four commands successfully,
    /// the read with the data the target sent.
    #[test]
    fn host_seeds_complete_every_command() {
        for seed in host_seeds() {
            let mut completed = Vec::new();
            run_host(&seed.input, |completion| {
                completed.push((completion.cid.0, completion.status));
            });
            completed.sort_by_key(|&(cid, _)| cid);
            let all_succeed: Vec<_> = (0..4).map(|cid| (cid, Status::SUCCESS)).collect();
            assert_eq!(completed, all_succeed, "{}", seed.name);
        }
    }

    #[test]
    fn host_survives_mutated_streams() {
        let seeds = host_seeds();
        let mut rng = Rng::new(0x5eed_0004);
        for iteration in 0..20_000 {
            let mut input = seeds[iteration % seeds.len()].input.clone();
            rng.mutate(&mut input);
            host(&input);
        }
    }

    #[test]
    fn operations_decode_as_encoded() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let mut input = Vec::new();
        Operation::Deliver(&bytes[..130]).encode(&mut input);
        // Two 64-byte blocks, then two bytes.
        assert_eq!(
            (input[0], input[129], input.len()),
            (0x41, 0x01, 1 + 128 + 1 + 2)
        );
        let others = [
            Operation::Complete { fail_mask: 0x25 },
            Operation::Advance { tenths: 62 },
            Operation::UpdateConfig,
            Operation::ToggleTransmitHold,
        ];
        Operation::Deliver(&bytes).encode(&mut input);
        for operation in others {
            operation.encode(&mut input);
        }
        assert_eq!(&input[input.len() - 4..], &[0xA5, 0xFD, 0xFF, 0xFE]);
        let (mut delivered, mut decoded) = (Vec::new(), Vec::new());
        let mut rest = &input[..];
        while let Some(operation) = Operation::decode(&mut rest) {
            match operation {
                Operation::Deliver(piece) => delivered.extend_from_slice(piece),
                other => decoded.push(other),
            }
        }
        assert_eq!(delivered, [&bytes[..130], &bytes[..]].concat());
        assert_eq!(decoded, others);
    }

    fn seeds_dir(target: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds")
            .join(target)
    }

    /// The seeds under fuzz/seeds/ are the ones the harness records now.
    /// After a change to the harness or the protocol, rewrite them with
    /// `WEFT_WRITE_SEEDS=1 cargo test -p weft-proto checked_in_seeds`.
    #[test]
    fn checked_in_seeds_are_the_recorded_ones() {
        let write = std::env::var_os("WEFT_WRITE_SEEDS").is_some();
        for (target, seeds) in [
            ("connection", connection_seeds()),
            ("authentication", authentication_seeds()),
            ("host", host_seeds()),
            ("tls", tls_seeds()),
        ] {
            let dir = seeds_dir(target);
            if write {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("the seeds directory");
            }
            let mut names: Vec<String> = Vec::new();
            for seed in &seeds {
                let path = dir.join(seed.name);
                if write {
                    std::fs::write(&path, &seed.input).expect("a seed file");
                }
                let stored = std::fs::read(&path).unwrap_or_default();
                assert!(
                    stored == seed.input,
                    "{} differs from the recorded seed: rewrite the seeds with \
                     WEFT_WRITE_SEEDS=1 cargo test -p weft-proto checked_in_seeds",
                    path.display()
                );
                names.push(seed.name.to_string());
            }
            let mut stored: Vec<String> = std::fs::read_dir(&dir)
                .expect("the seeds directory")
                .map(|entry| {
                    entry
                        .expect("an entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            stored.sort();
            names.sort();
            assert_eq!(stored, names, "seed files in {}", dir.display());
        }
    }
}
