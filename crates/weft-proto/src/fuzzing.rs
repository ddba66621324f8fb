//! Fuzz entry points, shared by the cargo-fuzz targets in `fuzz/` and by the
//! deterministic, seeded loops in this crate's tests (which run on stable
//! Rust in CI). Each entry point must never panic, whatever the input.

use crate::auth::{ControllerExchange, DhchapSecret, HostExchange};
use crate::command::{Command, ConnectCommand, ConnectData, PropertyCommand};
use crate::io::{dsm_ranges, IoError, IoPlan};
use crate::pdu::{CommonHeader, DataHeader, IcReq, IcResp};
use crate::testing::{self, Pair};
use crate::types::Timestamp;
use std::sync::Arc;
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
        let config = testing::test_target().config();
        let subsystem = &config.subsystems[0];
        let _ = IoPlan::from_command(&command, subsystem, config.limits.transfer_bytes_max);
        let mut ranges = Vec::new();
        let _ = dsm_ranges(&data[64..], &subsystem.namespaces[0], &mut ranges);
    }
}

/// The connection state machine on an arbitrary byte stream. The first byte
/// chooses how far the connection gets legitimately first (nothing, ICReq,
/// admin queue, I/O queue), the digests and whether the host must
/// authenticate; the rest is delivered in chunks
/// whose sizes come from the input too, interleaved with I/O completions
/// (some failing) and clock ticks.
pub fn connection(data: &[u8]) {
    let Some((&setup, mut rest)) = data.split_first() else {
        return;
    };
    let target = if setup & 0x40 != 0 {
        testing::authenticating_target(setup & 0x80 != 0)
    } else {
        testing::test_target()
    };
    let mut host = Pair::new(&target);
    host.header_digest = setup & 0x10 != 0;
    host.data_digest = setup & 0x20 != 0;
    host.hold_io = true;
    match setup & 0x3 {
        0 => {}
        1 => host.initialize(host.header_digest, host.data_digest),
        2 => {
            host.hold_io = false;
            host.connect_admin(testing::TEST_NQN, 1000);
            host.hold_io = true;
        }
        _ => {
            let mut admin = Pair::new(&target);
            let cntlid = admin.connect_admin(testing::TEST_NQN, 0);
            let mut queues =
                testing::sqe(crate::command::admin_opcode::SET_FEATURES, 9, 0, 0, false);
            testing::set_cdw(&mut queues, 10, 0x07);
            admin.simple(&queues);
            host.connect_io(cntlid, 1, 127);
        }
    }
    while let Some((&control, tail)) = rest.split_first() {
        let chunk = (usize::from(control & 0x3F) + 1) * if control & 0x40 != 0 { 64 } else { 1 };
        let (piece, remaining) = tail.split_at(chunk.min(tail.len()));
        host.send(piece);
        if control & 0x80 != 0 {
            complete_held(&mut host, piece.first().copied().unwrap_or(0));
            host.advance(Duration::from_millis(300));
        }
        let _ = host.receive();
        rest = remaining;
    }
    complete_held(&mut host, 0);
    host.now = Timestamp(Duration::from_secs(3600));
    host.connection.handle_timeout(host.now);
    host.connection.on_closed();
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

fn complete_held(host: &mut Pair, fail_mask: u8) {
    for (index, request) in std::mem::take(&mut host.held_io).into_iter().enumerate() {
        if fail_mask & (1 << (index % 8)) != 0 {
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

/// Valid PDU streams to start mutating from: an identify, reads and writes in
/// capsule and by R2T, for each setup byte.
pub fn seed_corpus() -> Vec<Vec<u8>> {
    let target = testing::test_target();
    let model = Pair::new(&target);
    let write = testing::rw(crate::command::io_opcode::WRITE, 1, 1, 0, 8, 4096, true);
    let read = testing::rw(crate::command::io_opcode::READ, 2, 1, 0, 8, 4096, false);
    let write_r2t = testing::rw(crate::command::io_opcode::WRITE, 3, 2, 0, 2, 8192, false);
    let mut stream = Vec::new();
    for pdu in [
        model.capsule(&write, &[0xA5; 4096]),
        model.capsule(&read, &[]),
        model.capsule(&write_r2t, &[]),
        model.h2c_data(3, 1, 0, &[0x5A; 8192], true),
        model.capsule(&testing::identify(4, 1, 0), &[]),
    ] {
        // Control byte: deliver up to 4 KiB at once, then complete held I/O and tick.
        for piece in pdu.chunks(64 * 64) {
            stream.push(0xC0 | 0x3F);
            stream.extend_from_slice(piece);
        }
    }
    let mut corpus: Vec<Vec<u8>> = (0..4u8)
        .map(|setup| {
            std::iter::once(setup)
                .chain(stream.iter().copied())
                .collect()
        })
        .collect();
    corpus.push(authentication_stream(&model));
    corpus
}

/// A `connection` input: an admin queue that must authenticate sends
/// Negotiate and reads the Challenge, then an Identify.
fn authentication_stream(model: &Pair) -> Vec<u8> {
    use crate::command::fctype;
    let negotiate = HostExchange::new(
        testing::host_keys(false),
        testing::HOST_NQN,
        testing::TEST_NQN,
        1,
    )
    .negotiate();
    let send = testing::auth_command(fctype::AUTH_SEND, 7, negotiate.len() as u32, true);
    let receive = testing::auth_command(fctype::AUTH_RECEIVE, 8, 4096, false);
    let mut stream = vec![0x42];
    for pdu in [
        model.capsule(&send, &negotiate),
        model.capsule(&receive, &[]),
        model.capsule(&testing::identify(9, 1, 0), &[]),
    ] {
        stream.push(0xC0 | 0x3F);
        stream.extend_from_slice(&pdu);
    }
    stream
}

/// Seeds for `authentication`: a Negotiate, and a Challenge with a Success1.
pub fn authentication_seeds() -> Vec<Vec<u8>> {
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
    vec![negotiate, challenge_then_success1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded mutation fuzzing of the connection state machine (a fixed budget
    /// in CI; `cargo fuzz run connection` in fuzz/ searches further).
    #[test]
    fn connection_survives_mutated_streams() {
        let corpus = seed_corpus();
        let mut rng = Rng::new(0x5eed_0001);
        for iteration in 0..3000 {
            let mut input = corpus[iteration % corpus.len()].clone();
            rng.mutate(&mut input);
            connection(&input);
        }
    }

    #[test]
    fn authentication_survives_mutated_messages() {
        let seeds = authentication_seeds();
        let mut rng = Rng::new(0x5eed_0003);
        for iteration in 0..5000 {
            let mut input = seeds[iteration % seeds.len()].clone();
            rng.mutate(&mut input);
            authentication(&input);
        }
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

    #[test]
    fn seed_corpus_runs_cleanly() {
        for input in seed_corpus() {
            connection(&input);
        }
    }
}
