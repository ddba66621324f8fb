//! NVMe in-band authentication with DH-HMAC-CHAP (NVMe Base 2.0, section
//! 8.13; carried by the Fabrics Authentication Send/Receive commands): the
//! `DHHC-1` secret format, the messages, and each side's exchange as plain
//! state with no I/O. Randomness comes in through [`SecureRandom`].
//!
//! What is implemented: SHA-256/384/512 HMACs, secrets with or without the
//! NQN transform, unidirectional and bidirectional authentication, the
//! NULL Diffie-Hellman group (what Linux nvmet selects by default) and the
//! FFDHE groups 2048 to 8192 ([`ffdhe`]): the controller picks the group
//! configured for the host (a host that does not offer it gets "DH group
//! unusable"), the host follows the controller's choice; with a group, each
//! challenge is augmented with the exchange's session key (section
//! 8.13.5.6: HMAC(H(g^xy mod p), C)). Not implemented: secure channel
//! concatenation (TLS PSKs derived from the exchange), which weft's TLS
//! does without (configured PSKs).

mod ffdhe;

use crate::keytext::{base64_decode, base64_encode, crc32};
pub use ffdhe::DhGroup;
use ffdhe::PrivateValue;
use hmac::{Hmac, Mac};
use std::fmt;
use std::sync::Arc;

/// Security protocol (SECP) of DH-HMAC-CHAP in Authentication Send/Receive.
pub const SECP_DHCHAP: u8 = 0xE9;
/// SPSP0 and SPSP1 of DH-HMAC-CHAP.
pub const SPSP_DHCHAP: u8 = 0x01;
/// Connect response Dword 0, AUTHREQ.ATR: this queue must authenticate.
pub const CONNECT_AUTHREQ_ATR: u32 = 1 << 17;

/// AUTH-TYPE of the common messages (Negotiate, Failure1/2).
const COMMON_MESSAGES: u8 = 0x00;
/// AUTH-TYPE of the DH-HMAC-CHAP messages.
const DHCHAP_MESSAGES: u8 = 0x01;
/// AUTH-ID of each message.
mod message {
    pub const NEGOTIATE: u8 = 0x00;
    pub const CHALLENGE: u8 = 0x01;
    pub const REPLY: u8 = 0x02;
    pub const SUCCESS1: u8 = 0x03;
    pub const SUCCESS2: u8 = 0x04;
    pub const FAILURE2: u8 = 0xF0;
    pub const FAILURE1: u8 = 0xF1;
}
/// AUTHID of the DH-HMAC-CHAP protocol descriptor in Negotiate.
const DHCHAP_AUTH_ID: u8 = 0x01;
/// The DH groups a host lists in Negotiate: NULL, then FFDHE 2048, 3072,
/// 4096, 6144 and 8192, as the Linux host does.
const OFFERED_DH_GROUPS: [DhGroup; 6] = DhGroup::ALL;
/// Failure reason code "authentication failure"; the explanation says why.
const REASON_FAILED: u8 = 0x01;
/// The fixed part of Negotiate, Challenge, Reply and Success1.
const HEADER_LEN: usize = 16;
/// Negotiate's fixed part and one protocol descriptor.
const NEGOTIATE_HEADER_LEN: usize = 8;
const DESCRIPTOR_LEN: usize = 64;
/// Failure1/Failure2.
const FAILURE_LEN: usize = 8;

/// A source of cryptographically secure random bytes (the driver's, e.g. the
/// kernel's), as a protocol core takes its time: from outside.
pub trait SecureRandom: Send + Sync + fmt::Debug {
    /// Fills `dest` with random bytes.
    fn fill(&self, dest: &mut [u8]);
}

/// The hash functions DH-HMAC-CHAP names (HashID values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashFunction {
    /// SHA-256 (HashID 1).
    Sha256,
    /// SHA-384 (HashID 2).
    Sha384,
    /// SHA-512 (HashID 3).
    Sha512,
}

impl HashFunction {
    /// Every hash function, in the order a host offers them.
    pub const ALL: [HashFunction; 3] = [
        HashFunction::Sha256,
        HashFunction::Sha384,
        HashFunction::Sha512,
    ];

    /// The function with HashID `id`.
    pub fn from_id(id: u8) -> Option<HashFunction> {
        HashFunction::ALL.into_iter().find(|hash| hash.id() == id)
    }

    /// Its HashID.
    pub fn id(self) -> u8 {
        match self {
            HashFunction::Sha256 => 1,
            HashFunction::Sha384 => 2,
            HashFunction::Sha512 => 3,
        }
    }

    /// Its output length in bytes (also the challenge and response length).
    pub fn output_len(self) -> usize {
        match self {
            HashFunction::Sha256 => 32,
            HashFunction::Sha384 => 48,
            HashFunction::Sha512 => 64,
        }
    }

    /// The hash of `data`.
    fn digest(self, data: &[u8]) -> Digest {
        use sha2::Digest as _;
        match self {
            HashFunction::Sha256 => Digest::from_slice(&sha2::Sha256::digest(data)),
            HashFunction::Sha384 => Digest::from_slice(&sha2::Sha384::digest(data)),
            HashFunction::Sha512 => Digest::from_slice(&sha2::Sha512::digest(data)),
        }
    }

    /// A challenge augmented with a DH exchange's session key (section
    /// 8.13.5.6): HMAC(H(session key), challenge); the challenge itself
    /// without an exchange (the NULL group).
    fn augmented(self, session_key: Option<&[u8]>, challenge: Digest) -> Digest {
        match session_key {
            Some(key) => self.hmac(self.digest(key).as_ref(), &[challenge.as_ref()]),
            None => challenge,
        }
    }

    /// HMAC of the concatenation of `parts` under `key`.
    pub(crate) fn hmac(self, key: &[u8], parts: &[&[u8]]) -> Digest {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], parts: &[&[u8]]) -> Digest {
            let mut mac = <M as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
            for part in parts {
                mac.update(part);
            }
            Digest::from_slice(&mac.finalize().into_bytes())
        }
        match self {
            HashFunction::Sha256 => run::<Hmac<sha2::Sha256>>(key, parts),
            HashFunction::Sha384 => run::<Hmac<sha2::Sha384>>(key, parts),
            HashFunction::Sha512 => run::<Hmac<sha2::Sha512>>(key, parts),
        }
    }
}

/// A hash output or challenge of up to 64 bytes, kept inline.
#[derive(Clone, Copy)]
pub struct Digest {
    bytes: [u8; 64],
    len: usize,
}

impl Digest {
    fn from_slice(bytes: &[u8]) -> Digest {
        let mut digest = Digest {
            bytes: [0; 64],
            len: bytes.len(),
        };
        digest.bytes[..bytes.len()].copy_from_slice(bytes);
        digest
    }

    fn random(random: &dyn SecureRandom, len: usize) -> Digest {
        let mut digest = Digest {
            bytes: [0; 64],
            len,
        };
        random.fill(&mut digest.bytes[..len]);
        digest
    }

    /// Compares in time independent of where the bytes differ.
    fn matches(&self, other: &[u8]) -> bool {
        other.len() == self.len
            && self
                .as_ref()
                .iter()
                .zip(other)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

impl AsRef<[u8]> for Digest {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({} bytes)", self.len)
    }
}

/// Why a `DHHC-1` secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// It does not start with `DHHC-1:NN:`.
    #[error(
        "a DH-HMAC-CHAP secret looks like DHHC-1:01:<base64>: (as `nvme gen-dhchap-key` prints it)"
    )]
    Format,
    /// The transform field is not 00, 01, 02 or 03.
    #[error(
        "the secret's transform {0:?} is not 00 (none), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512)"
    )]
    Transform(String),
    /// The key part is not base64.
    #[error("the secret's key part is not valid base64")]
    Base64,
    /// The key is not 32, 48 or 64 bytes long.
    #[error("the secret's key is {0} bytes long; DH-HMAC-CHAP keys are 32, 48 or 64 bytes")]
    Length(usize),
    /// The CRC-32 after the key does not match it.
    #[error("the secret's checksum does not match its key (mistyped or truncated?)")]
    Checksum,
}

/// A DH-HMAC-CHAP secret (NVMe Base 2.0, section 8.13.5.8): a key and the
/// hash it is transformed with before use (none for `DHHC-1:00:`).
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapSecret {
    key: Vec<u8>,
    transform: Option<HashFunction>,
}

impl DhchapSecret {
    /// Parses `DHHC-1:NN:<base64 of key and its CRC-32>:` (the final colon is optional).
    pub fn parse(text: &str) -> Result<DhchapSecret, SecretError> {
        let rest = text.strip_prefix("DHHC-1:").ok_or(SecretError::Format)?;
        let (transform, encoded) = rest.split_once(':').ok_or(SecretError::Format)?;
        let transform = match transform {
            "00" => None,
            "01" | "02" | "03" => HashFunction::from_id(transform.as_bytes()[1] - b'0'),
            other => return Err(SecretError::Transform(other.to_string())),
        };
        let encoded = encoded.strip_suffix(':').unwrap_or(encoded);
        let mut decoded = base64_decode(encoded).ok_or(SecretError::Base64)?;
        let key_len = decoded.len().saturating_sub(4);
        if ![32, 48, 64].contains(&key_len) || decoded.len() != key_len + 4 {
            return Err(SecretError::Length(key_len));
        }
        let crc = u32::from_le_bytes(decoded[key_len..].try_into().expect("four bytes"));
        decoded.truncate(key_len);
        if crc32(&decoded) != crc {
            return Err(SecretError::Checksum);
        }
        Ok(DhchapSecret {
            key: decoded,
            transform,
        })
    }

    /// A 32-byte secret derived from a shared `seed` for one `purpose`
    /// (HMAC-SHA-256 of the purpose under the seed), transformed with
    /// SHA-256: parties that share the seed (a cluster's nodes, from its
    /// token) agree on it without another secret to distribute.
    pub fn derived(seed: &[u8], purpose: &str) -> DhchapSecret {
        let key = HashFunction::Sha256.hmac(seed, &[purpose.as_bytes()]);
        DhchapSecret {
            key: key.as_ref().to_vec(),
            transform: Some(HashFunction::Sha256),
        }
    }

    /// A new random secret of `key_len` bytes (32, 48 or 64).
    pub fn generate(
        random: &dyn SecureRandom,
        key_len: usize,
        transform: Option<HashFunction>,
    ) -> DhchapSecret {
        assert!([32, 48, 64].contains(&key_len), "DH-HMAC-CHAP key lengths");
        let mut key = vec![0u8; key_len];
        random.fill(&mut key);
        DhchapSecret { key, transform }
    }

    /// The key the HMAC uses for `nqn` (the host's NQN for the host key, the
    /// subsystem's for the controller key): the key itself, or
    /// HMAC(key, NQN || "NVMe-over-Fabrics") with the transform hash.
    fn transformed(&self, nqn: &str) -> Digest {
        match self.transform {
            None => Digest::from_slice(&self.key),
            Some(hash) => hash.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

impl fmt::Display for DhchapSecret {
    /// The `DHHC-1` text form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bytes = self.key.clone();
        bytes.extend_from_slice(&crc32(&self.key).to_le_bytes());
        let transform = self.transform.map_or(0, HashFunction::id);
        write!(f, "DHHC-1:{transform:02}:{}:", base64_encode(&bytes))
    }
}

impl fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DhchapSecret")
            .field("key", &format_args!("<{} bytes>", self.key.len()))
            .field("transform", &self.transform)
            .finish()
    }
}

/// The secrets of one host: its own, and the controller's when the host
/// also authenticates the controller (bidirectional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKeys {
    /// The host proves it knows this one.
    pub host: DhchapSecret,
    /// The controller proves it knows this one, when the host asks.
    pub controller: Option<DhchapSecret>,
    /// The DH group a controller picks for this host (the host must offer
    /// it); a host follows the controller's choice whatever this says.
    pub dh_group: DhGroup,
}

/// Failure reason code explanations (NVMe Base 2.0, Figure 446).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FailureReason {
    /// The response did not match: wrong secret.
    #[error("authentication failed (wrong secret?)")]
    Failed,
    /// The protocol cannot be used.
    #[error("authentication protocol not usable")]
    NotUsable,
    /// Secure channel concatenation was asked for and is not supported.
    #[error("secure channel concatenation mismatch")]
    ConcatMismatch,
    /// No offered hash function is supported.
    #[error("no usable hash function")]
    HashUnusable,
    /// No offered Diffie-Hellman group is supported.
    #[error("no usable Diffie-Hellman group")]
    DhGroupUnusable,
    /// A message field was wrong.
    #[error("incorrect payload")]
    IncorrectPayload,
    /// A message came out of sequence.
    #[error("incorrect message")]
    IncorrectMessage,
    /// An explanation code this crate does not know.
    #[error("reason code explanation {0:#04x}")]
    Other(u8),
}

impl FailureReason {
    fn code(self) -> u8 {
        match self {
            FailureReason::Failed => 0x01,
            FailureReason::NotUsable => 0x02,
            FailureReason::ConcatMismatch => 0x03,
            FailureReason::HashUnusable => 0x04,
            FailureReason::DhGroupUnusable => 0x05,
            FailureReason::IncorrectPayload => 0x06,
            FailureReason::IncorrectMessage => 0x07,
            FailureReason::Other(code) => code,
        }
    }

    fn from_code(code: u8) -> FailureReason {
        match code {
            0x01 => FailureReason::Failed,
            0x02 => FailureReason::NotUsable,
            0x03 => FailureReason::ConcatMismatch,
            0x04 => FailureReason::HashUnusable,
            0x05 => FailureReason::DhGroupUnusable,
            0x06 => FailureReason::IncorrectPayload,
            0x07 => FailureReason::IncorrectMessage,
            other => FailureReason::Other(other),
        }
    }
}

/// Who is proving what in one response: the host (C1 from the controller) or
/// the controller (C2 from the host). Section 8.13.5.4/8.13.5.5.
#[derive(Debug, Clone, Copy)]
enum Prover {
    Host,
    Controller,
}

/// The names and numbers a response binds.
#[derive(Debug, Clone, Copy)]
struct Binding<'a> {
    hash: HashFunction,
    transaction: u16,
    host_nqn: &'a str,
    subsystem_nqn: &'a str,
}

impl Binding<'_> {
    /// Ca = HMAC(Kh, C1 || S1 || T_ID || SC_C || "HostHost" || NQNh || 00h || NQNc), or
    /// Rc = HMAC(Kc, C2 || S2 || T_ID || SC_C || "Controller" || NQNc || 00h || NQNh),
    /// with the NULL group's challenge used as is.
    fn response(
        &self,
        prover: Prover,
        secret: &DhchapSecret,
        challenge: &[u8],
        seqnum: u32,
    ) -> Digest {
        let (label, first, second): (&[u8], &str, &str) = match prover {
            Prover::Host => (b"HostHost", self.host_nqn, self.subsystem_nqn),
            Prover::Controller => (b"Controller", self.subsystem_nqn, self.host_nqn),
        };
        let key = secret.transformed(first);
        self.hash.hmac(
            key.as_ref(),
            &[
                challenge,
                &seqnum.to_le_bytes(),
                &self.transaction.to_le_bytes(),
                &[0], // SC_C: no secure channel concatenation
                label,
                first.as_bytes(),
                &[0],
                second.as_bytes(),
            ],
        )
    }
}

/// The controller side of the exchange on one queue.
#[derive(Debug)]
pub struct ControllerExchange {
    keys: Arc<HostKeys>,
    host_nqn: String,
    subsystem_nqn: String,
    step: ControllerStep,
    authenticated: bool,
}

#[derive(Debug, Clone, Copy)]
enum ControllerStep {
    /// Waiting for Negotiate (also accepted at any time to start over).
    Negotiate,
    /// Negotiate accepted: the host reads the Challenge next.
    Challenge {
        transaction: u16,
        hash: HashFunction,
        group: DhGroup,
    },
    /// Challenge sent: the host sends its Reply next.
    Reply {
        transaction: u16,
        hash: HashFunction,
        challenge: Digest,
        seqnum: u32,
        /// The group and our private exponent, unless NULL.
        exchange: Option<(DhGroup, PrivateValue)>,
    },
    /// The host is authenticated: it reads Success1 next, with our
    /// response to its challenge (augmented) if any.
    Success1 {
        transaction: u16,
        hash: HashFunction,
        host_challenge: Option<(Digest, u32)>,
    },
    /// Success1 carried our response: the host sends Success2 (or Failure2).
    Success2 { transaction: u16 },
    /// The host reads Failure1 next.
    Failure1 {
        transaction: u16,
        reason: FailureReason,
    },
    /// The transaction ended.
    Done,
}

impl ControllerExchange {
    /// A queue of `host_nqn` on `subsystem_nqn` that must authenticate with `keys`.
    pub fn new(keys: Arc<HostKeys>, host_nqn: &str, subsystem_nqn: &str) -> ControllerExchange {
        ControllerExchange {
            keys,
            host_nqn: host_nqn.to_string(),
            subsystem_nqn: subsystem_nqn.to_string(),
            step: ControllerStep::Negotiate,
            authenticated: false,
        }
    }

    /// Whether the queue may carry commands other than Fabrics ones.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// The payload of an Authentication Send. Protocol failures do not fail
    /// the command: they become the Failure1 the host reads next (section 8.13.5.7).
    pub fn on_send(&mut self, payload: &[u8]) {
        let (auth_type, auth_id) = match payload {
            [auth_type, auth_id, ..] => (*auth_type, *auth_id),
            _ => return self.fail(0, FailureReason::IncorrectPayload),
        };
        let transaction = read_u16(payload, 4);
        if (auth_type, auth_id) == (COMMON_MESSAGES, message::NEGOTIATE) {
            self.step = match negotiate(payload, self.keys.dh_group) {
                Ok(hash) => ControllerStep::Challenge {
                    transaction,
                    hash,
                    group: self.keys.dh_group,
                },
                Err(reason) => ControllerStep::Failure1 {
                    transaction,
                    reason,
                },
            };
            return;
        }
        let expected = match self.step {
            ControllerStep::Reply { transaction, .. } => (message::REPLY, transaction),
            ControllerStep::Success2 { transaction } => (message::SUCCESS2, transaction),
            _ => return self.fail(transaction, FailureReason::IncorrectMessage),
        };
        if (auth_type, auth_id) == (COMMON_MESSAGES, message::FAILURE2) {
            // The host did not accept our response: this transaction failed.
            self.authenticated = false;
            self.step = ControllerStep::Done;
            return;
        }
        if auth_type != DHCHAP_MESSAGES || auth_id != expected.0 {
            return self.fail(transaction, FailureReason::IncorrectMessage);
        }
        if transaction != expected.1 {
            return self.fail(expected.1, FailureReason::IncorrectPayload);
        }
        match self.step {
            ControllerStep::Reply {
                hash,
                challenge,
                seqnum,
                exchange,
                ..
            } => self.on_reply(payload, transaction, hash, (challenge, seqnum), exchange),
            _ => {
                self.authenticated = true;
                self.step = ControllerStep::Done;
            }
        }
    }

    fn on_reply(
        &mut self,
        payload: &[u8],
        transaction: u16,
        hash: HashFunction,
        (challenge, seqnum): (Digest, u32),
        exchange: Option<(DhGroup, PrivateValue)>,
    ) {
        let hl = usize::from(*payload.get(6).unwrap_or(&0));
        let cvalid = payload.get(8).is_some_and(|&v| v != 0);
        let dhvlen = usize::from(read_u16(payload, 10));
        if hl != hash.output_len() || payload.len() < HEADER_LEN + 2 * hl + dhvlen {
            return self.fail(transaction, FailureReason::IncorrectPayload);
        }
        // The host's DH value, of the group's length (none for NULL).
        if dhvlen != exchange.map_or(0, |(group, _)| group.value_len()) {
            return self.fail(transaction, FailureReason::IncorrectPayload);
        }
        let session_key = match exchange {
            None => None,
            Some((group, private)) => {
                let theirs = &payload[HEADER_LEN + 2 * hl..HEADER_LEN + 2 * hl + dhvlen];
                match private.session_key(group, theirs) {
                    Some(key) => Some(key),
                    None => return self.fail(transaction, FailureReason::IncorrectPayload),
                }
            }
        };
        let challenge = hash.augmented(session_key.as_deref(), challenge);
        let binding = Binding {
            hash,
            transaction,
            host_nqn: &self.host_nqn,
            subsystem_nqn: &self.subsystem_nqn,
        };
        let expected = binding.response(Prover::Host, &self.keys.host, challenge.as_ref(), seqnum);
        if !expected.matches(&payload[HEADER_LEN..HEADER_LEN + hl]) {
            return self.fail(transaction, FailureReason::Failed);
        }
        let host_seqnum = read_u32(payload, 12);
        // A zero sequence number means no controller authentication (section 8.13.5.4).
        let host_challenge = (cvalid && host_seqnum != 0).then(|| {
            let theirs = Digest::from_slice(&payload[HEADER_LEN + hl..HEADER_LEN + 2 * hl]);
            (hash.augmented(session_key.as_deref(), theirs), host_seqnum)
        });
        if host_challenge.is_some() && self.keys.controller.is_none() {
            // The host wants us to prove a secret we were not given.
            return self.fail(transaction, FailureReason::Failed);
        }
        if host_challenge.is_none() {
            self.authenticated = true;
        }
        self.step = ControllerStep::Success1 {
            transaction,
            hash,
            host_challenge,
        };
    }

    /// Fills an Authentication Receive: the message the host reads now.
    /// Returns its length, or `None` when it does not fit in `out`.
    pub fn on_receive(&mut self, out: &mut [u8], random: &dyn SecureRandom) -> Option<usize> {
        match self.step {
            ControllerStep::Challenge {
                transaction,
                hash,
                group,
            } => {
                let hl = hash.output_len();
                let dhvlen = group.value_len();
                let out = out.get_mut(..HEADER_LEN + hl + dhvlen)?;
                let challenge = Digest::random(random, hl);
                let seqnum = nonzero_seqnum(random);
                let exchange =
                    (group != DhGroup::Null).then(|| (group, PrivateValue::random(random)));
                write_header(out, DHCHAP_MESSAGES, message::CHALLENGE, transaction);
                out[6] = hl as u8;
                out[8] = hash.id();
                out[9] = group.id();
                out[10..12].copy_from_slice(&(dhvlen as u16).to_le_bytes());
                out[12..16].copy_from_slice(&seqnum.to_le_bytes());
                out[HEADER_LEN..HEADER_LEN + hl].copy_from_slice(challenge.as_ref());
                if let Some((group, private)) = &exchange {
                    out[HEADER_LEN + hl..].copy_from_slice(&private.public(*group));
                }
                self.step = ControllerStep::Reply {
                    transaction,
                    hash,
                    challenge,
                    seqnum,
                    exchange,
                };
                Some(out.len())
            }
            ControllerStep::Success1 {
                transaction,
                hash,
                host_challenge,
            } => {
                let len = HEADER_LEN + host_challenge.map_or(0, |_| hash.output_len());
                let out = out.get_mut(..len)?;
                write_header(out, DHCHAP_MESSAGES, message::SUCCESS1, transaction);
                out[6] = hash.output_len() as u8;
                self.step = ControllerStep::Done;
                if let Some((challenge, seqnum)) = host_challenge {
                    let binding = Binding {
                        hash,
                        transaction,
                        host_nqn: &self.host_nqn,
                        subsystem_nqn: &self.subsystem_nqn,
                    };
                    let secret = self.keys.controller.as_ref().expect("checked at Reply");
                    let response =
                        binding.response(Prover::Controller, secret, challenge.as_ref(), seqnum);
                    out[8] = 1; // RVALID
                    out[HEADER_LEN..].copy_from_slice(response.as_ref());
                    self.step = ControllerStep::Success2 { transaction };
                }
                Some(len)
            }
            ControllerStep::Failure1 {
                transaction,
                reason,
            } => {
                let out = out.get_mut(..FAILURE_LEN)?;
                encode_failure(out, message::FAILURE1, transaction, reason);
                self.step = ControllerStep::Done;
                Some(FAILURE_LEN)
            }
            ControllerStep::Negotiate
            | ControllerStep::Reply { .. }
            | ControllerStep::Success2 { .. }
            | ControllerStep::Done => {
                let out = out.get_mut(..FAILURE_LEN)?;
                self.authenticated = false;
                encode_failure(out, message::FAILURE1, 0, FailureReason::IncorrectMessage);
                self.step = ControllerStep::Done;
                Some(FAILURE_LEN)
            }
        }
    }

    /// Ends the transaction with a failure the host reads next; the queue is
    /// not authenticated any more.
    fn fail(&mut self, transaction: u16, reason: FailureReason) {
        self.authenticated = false;
        self.step = ControllerStep::Failure1 {
            transaction,
            reason,
        };
    }
}

/// Checks a Negotiate message and picks the hash function: the first the
/// host lists. The DH group `group` must be among those offered.
fn negotiate(payload: &[u8], group: DhGroup) -> Result<HashFunction, FailureReason> {
    if payload.len() < NEGOTIATE_HEADER_LEN {
        return Err(FailureReason::IncorrectPayload);
    }
    if payload[6] != 0 {
        return Err(FailureReason::ConcatMismatch);
    }
    let descriptors = usize::from(payload[7]);
    if descriptors == 0 || payload.len() < NEGOTIATE_HEADER_LEN + descriptors * DESCRIPTOR_LEN {
        return Err(FailureReason::IncorrectPayload);
    }
    let descriptor = payload[NEGOTIATE_HEADER_LEN..]
        .chunks_exact(DESCRIPTOR_LEN)
        .take(descriptors)
        .find(|d| d[0] == DHCHAP_AUTH_ID)
        .ok_or(FailureReason::NotUsable)?;
    let (halen, dhlen) = (usize::from(descriptor[2]), usize::from(descriptor[3]));
    if halen > 30 || dhlen > 30 {
        return Err(FailureReason::IncorrectPayload);
    }
    let hash = descriptor[4..4 + halen]
        .iter()
        .find_map(|&id| HashFunction::from_id(id))
        .ok_or(FailureReason::HashUnusable)?;
    if !descriptor[34..34 + dhlen].contains(&group.id()) {
        return Err(FailureReason::DhGroupUnusable);
    }
    Ok(hash)
}

/// Zeroes `out` and writes AUTH-TYPE, AUTH-ID and T_ID, which start every message.
fn write_header(out: &mut [u8], auth_type: u8, auth_id: u8, transaction: u16) {
    out.fill(0);
    out[0] = auth_type;
    out[1] = auth_id;
    out[4..6].copy_from_slice(&transaction.to_le_bytes());
}

fn encode_failure(out: &mut [u8], auth_id: u8, transaction: u16, reason: FailureReason) {
    write_header(out, COMMON_MESSAGES, auth_id, transaction);
    out[6] = REASON_FAILED;
    out[7] = reason.code();
}

/// Why the host side gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostAuthError {
    /// The controller sent Failure1.
    #[error("the controller refused the authentication: {0}")]
    Refused(FailureReason),
    /// The controller's message was not what the exchange expects.
    #[error("unexpected authentication message from the controller: {0}")]
    Malformed(&'static str),
    /// The controller did not prove it knows the controller secret.
    #[error("the controller's response does not match the controller secret")]
    ControllerNotAuthenticated,
    /// The controller chose a hash function this host does not know.
    #[error("the controller chose hash function {0}, which is not SHA-256, -384 or -512")]
    UnusableHash(u8),
    /// The controller chose a Diffie-Hellman group DH-HMAC-CHAP does not define.
    #[error("the controller chose Diffie-Hellman group {0}, which DH-HMAC-CHAP does not define (0 to 5)")]
    UnusableDhGroup(u8),
}

impl HostAuthError {
    /// The reason a Failure2 gives for this error; none when the controller
    /// ended the transaction itself.
    fn failure2_reason(&self) -> Option<FailureReason> {
        match self {
            HostAuthError::Refused(_) => None,
            HostAuthError::Malformed(_) => Some(FailureReason::IncorrectPayload),
            HostAuthError::ControllerNotAuthenticated => Some(FailureReason::Failed),
            HostAuthError::UnusableHash(_) => Some(FailureReason::HashUnusable),
            HostAuthError::UnusableDhGroup(_) => Some(FailureReason::DhGroupUnusable),
        }
    }
}

/// The host side of the exchange on one queue, as the Linux host runs it:
/// Negotiate, read Challenge, Reply, read Success1, and Success2 when it
/// authenticates the controller too.
#[derive(Debug)]
pub struct HostExchange {
    keys: HostKeys,
    host_nqn: String,
    subsystem_nqn: String,
    transaction: u16,
    hash: Option<HashFunction>,
    /// Our challenge to the controller and its sequence number.
    challenge: Option<(Digest, u32)>,
}

impl HostExchange {
    /// A transaction with ID `transaction` on a queue of `host_nqn` to `subsystem_nqn`.
    pub fn new(
        keys: HostKeys,
        host_nqn: &str,
        subsystem_nqn: &str,
        transaction: u16,
    ) -> HostExchange {
        HostExchange {
            keys,
            host_nqn: host_nqn.to_string(),
            subsystem_nqn: subsystem_nqn.to_string(),
            transaction,
            hash: None,
            challenge: None,
        }
    }

    /// The Negotiate message: every hash function, and the DH groups the
    /// Linux host lists (NULL and FFDHE 2048..8192).
    pub fn negotiate(&self) -> Vec<u8> {
        let mut out = vec![0u8; NEGOTIATE_HEADER_LEN + DESCRIPTOR_LEN];
        write_header(
            &mut out,
            COMMON_MESSAGES,
            message::NEGOTIATE,
            self.transaction,
        );
        out[7] = 1; // NAPD
        let descriptor = &mut out[NEGOTIATE_HEADER_LEN..];
        descriptor[0] = DHCHAP_AUTH_ID;
        descriptor[2] = HashFunction::ALL.len() as u8;
        descriptor[3] = OFFERED_DH_GROUPS.len() as u8;
        for (slot, hash) in descriptor[4..].iter_mut().zip(HashFunction::ALL) {
            *slot = hash.id();
        }
        for (slot, group) in descriptor[34..].iter_mut().zip(OFFERED_DH_GROUPS) {
            *slot = group.id();
        }
        out
    }

    /// The message to send after `error` before giving up: a Failure2 with
    /// its reason (NVMe Base 2.0, section 8.13.5.7), or nothing when the
    /// controller ended the transaction.
    pub fn abort(&self, error: &HostAuthError) -> Option<Vec<u8>> {
        let reason = error.failure2_reason()?;
        let mut out = vec![0u8; FAILURE_LEN];
        encode_failure(&mut out, message::FAILURE2, self.transaction, reason);
        Some(out)
    }

    /// Answers the Challenge with the Reply to send (on error, send [`HostExchange::abort`]).
    pub fn reply(
        &mut self,
        challenge: &[u8],
        random: &dyn SecureRandom,
    ) -> Result<Vec<u8>, HostAuthError> {
        check_failure1(challenge)?;
        if challenge.len() < HEADER_LEN
            || challenge[0] != DHCHAP_MESSAGES
            || challenge[1] != message::CHALLENGE
            || read_u16(challenge, 4) != self.transaction
        {
            return Err(HostAuthError::Malformed("expected a Challenge"));
        }
        let hash =
            HashFunction::from_id(challenge[8]).ok_or(HostAuthError::UnusableHash(challenge[8]))?;
        let hl = usize::from(challenge[6]);
        if hl != hash.output_len() || challenge.len() < HEADER_LEN + hl {
            return Err(HostAuthError::Malformed("challenge length"));
        }
        let group =
            DhGroup::from_id(challenge[9]).ok_or(HostAuthError::UnusableDhGroup(challenge[9]))?;
        let dhvlen = usize::from(read_u16(challenge, 10));
        if dhvlen != group.value_len() || challenge.len() < HEADER_LEN + hl + dhvlen {
            return Err(HostAuthError::Malformed("DH value length"));
        }
        // Our half of the exchange, and its session key (none for NULL).
        let (public, session_key) = match group {
            DhGroup::Null => (Vec::new(), None),
            group => {
                let private = PrivateValue::random(random);
                let theirs = &challenge[HEADER_LEN + hl..HEADER_LEN + hl + dhvlen];
                let key = private
                    .session_key(group, theirs)
                    .ok_or(HostAuthError::Malformed("the controller's DH value"))?;
                (private.public(group), Some(key))
            }
        };
        let binding = self.binding(hash);
        let response = binding.response(
            Prover::Host,
            &self.keys.host,
            hash.augmented(
                session_key.as_deref(),
                Digest::from_slice(&challenge[HEADER_LEN..HEADER_LEN + hl]),
            )
            .as_ref(),
            read_u32(challenge, 12),
        );
        let mut out = vec![0u8; HEADER_LEN + 2 * hl + public.len()];
        write_header(&mut out, DHCHAP_MESSAGES, message::REPLY, self.transaction);
        out[6] = hl as u8;
        out[10..12].copy_from_slice(&(public.len() as u16).to_le_bytes());
        out[HEADER_LEN..HEADER_LEN + hl].copy_from_slice(response.as_ref());
        out[HEADER_LEN + 2 * hl..].copy_from_slice(&public);
        if self.keys.controller.is_some() {
            let ours = Digest::random(random, hl);
            let seqnum = nonzero_seqnum(random);
            out[8] = 1; // CVALID
            out[12..16].copy_from_slice(&seqnum.to_le_bytes());
            out[HEADER_LEN + hl..HEADER_LEN + 2 * hl].copy_from_slice(ours.as_ref());
            // The controller answers the augmented challenge.
            self.challenge = Some((hash.augmented(session_key.as_deref(), ours), seqnum));
        }
        self.hash = Some(hash);
        Ok(out)
    }

    /// Checks Success1 and returns what to send last with the outcome:
    /// Success2 when the controller proved its secret, Failure2 when it did
    /// not or its message was wrong, nothing when it refused us or had
    /// nothing to prove.
    pub fn conclude(&self, success1: &[u8]) -> (Option<Vec<u8>>, Result<(), HostAuthError>) {
        match self.success1(success1) {
            Ok(last) => (last, Ok(())),
            Err(error) => (self.abort(&error), Err(error)),
        }
    }

    /// Checks Success1; returns the Success2 to send when the controller was
    /// authenticated too (nothing more is sent otherwise).
    fn success1(&self, success1: &[u8]) -> Result<Option<Vec<u8>>, HostAuthError> {
        check_failure1(success1)?;
        let hash = self
            .hash
            .ok_or(HostAuthError::Malformed("Success1 before any Reply"))?;
        if success1.len() < HEADER_LEN
            || success1[0] != DHCHAP_MESSAGES
            || success1[1] != message::SUCCESS1
            || read_u16(success1, 4) != self.transaction
        {
            return Err(HostAuthError::Malformed("expected Success1"));
        }
        let Some((challenge, seqnum)) = self.challenge else {
            return Ok(None);
        };
        let hl = hash.output_len();
        let rvalid = success1[8] != 0;
        if !rvalid || usize::from(success1[6]) != hl || success1.len() < HEADER_LEN + hl {
            return Err(HostAuthError::ControllerNotAuthenticated);
        }
        let secret = self
            .keys
            .controller
            .as_ref()
            .expect("a challenge needs the key");
        let expected =
            self.binding(hash)
                .response(Prover::Controller, secret, challenge.as_ref(), seqnum);
        if !expected.matches(&success1[HEADER_LEN..HEADER_LEN + hl]) {
            return Err(HostAuthError::ControllerNotAuthenticated);
        }
        let mut out = vec![0u8; HEADER_LEN];
        write_header(
            &mut out,
            DHCHAP_MESSAGES,
            message::SUCCESS2,
            self.transaction,
        );
        Ok(Some(out))
    }

    fn binding(&self, hash: HashFunction) -> Binding<'_> {
        Binding {
            hash,
            transaction: self.transaction,
            host_nqn: &self.host_nqn,
            subsystem_nqn: &self.subsystem_nqn,
        }
    }
}

fn check_failure1(message: &[u8]) -> Result<(), HostAuthError> {
    match message {
        [COMMON_MESSAGES, message::FAILURE1, _, _, _, _, _, explanation, ..] => Err(
            HostAuthError::Refused(FailureReason::from_code(*explanation)),
        ),
        _ => Ok(()),
    }
}

fn nonzero_seqnum(random: &dyn SecureRandom) -> u32 {
    let mut bytes = [0u8; 4];
    random.fill(&mut bytes);
    u32::from_le_bytes(bytes).max(1)
}

fn read_u16(bytes: &[u8], at: usize) -> u16 {
    bytes
        .get(at..at + 2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]))
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::CountingRandom;

    /// The example secret of the NVMe Base specification (section 8.13.5.8).
    const SPEC_SECRET: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    const SUBSYSTEM: &str = "nqn.2026-11.io.weft:vol:db1";

    fn keys(bidirectional: bool) -> HostKeys {
        HostKeys {
            host: DhchapSecret::parse(SPEC_SECRET).unwrap(),
            controller: bidirectional.then(|| {
                DhchapSecret::parse("DHHC-1:02:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:")
                    .unwrap()
            }),
            dh_group: DhGroup::Null,
        }
    }

    #[test]
    fn secrets_parse_check_their_crc_and_print_back() {
        let secret = DhchapSecret::parse(SPEC_SECRET).unwrap();
        assert_eq!(secret.key.len(), 32);
        assert_eq!(secret.transform, None);
        assert_eq!(secret.to_string(), SPEC_SECRET);
        let without_colon = SPEC_SECRET.trim_end_matches(':');
        assert_eq!(DhchapSecret::parse(without_colon).unwrap(), secret);
        let sha384 = DhchapSecret::parse(&SPEC_SECRET.replace(":00:", ":02:")).unwrap();
        assert_eq!(sha384.transform, Some(HashFunction::Sha384));
        // blktests' "invalid key": its CRC does not match.
        assert_eq!(
            DhchapSecret::parse("DHHC-1:00:Jc/My1o0qtLCWRp+sHhAVafdfaS7YQOMYhk9zSmlatobqB8C:"),
            Err(SecretError::Checksum)
        );
        assert_eq!(DhchapSecret::parse("secret"), Err(SecretError::Format));
        assert!(matches!(
            DhchapSecret::parse(&SPEC_SECRET.replace(":00:", ":04:")),
            Err(SecretError::Transform(_))
        ));
        assert_eq!(
            DhchapSecret::parse("DHHC-1:00:a$==:"),
            Err(SecretError::Base64)
        );
        assert_eq!(
            DhchapSecret::parse("DHHC-1:00:AAAAAAAA:"),
            Err(SecretError::Length(2))
        );
        let random = CountingRandom::default();
        for len in [32, 48, 64] {
            let generated = DhchapSecret::generate(&random, len, Some(HashFunction::Sha256));
            assert_eq!(
                DhchapSecret::parse(&generated.to_string()).unwrap(),
                generated
            );
        }
    }

    #[test]
    fn base64_round_trips_every_padding() {
        for len in 0..10 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 200) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&bytes)).unwrap(), bytes);
        }
        assert_eq!(base64_encode(b"weft"), "d2VmdA==");
        assert_eq!(base64_decode("d2VmdA=="), Some(b"weft".to_vec()));
        assert_eq!(base64_decode("d2V=dA=="), None);
        assert_eq!(base64_decode("d2VmdA="), None);
    }

    #[test]
    fn crc32_is_the_ieee_one() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    /// The host response for fixed inputs, computed independently with
    /// Python's hmac module:
    /// `hmac.new(key, c1 + s1 + tid + b"\0" + b"HostHost" + host + b"\0" + subsys, sha256)`
    /// with the spec secret's key, C1 = 32 bytes 0x01..0x20, S1 = 7, T_ID = 3.
    #[test]
    fn the_host_response_matches_an_independent_computation() {
        let binding = Binding {
            hash: HashFunction::Sha256,
            transaction: 3,
            host_nqn: HOST,
            subsystem_nqn: SUBSYSTEM,
        };
        let challenge: Vec<u8> = (1..=32).collect();
        let secret = DhchapSecret::parse(SPEC_SECRET).unwrap();
        let response = binding.response(Prover::Host, &secret, &challenge, 7);
        assert_eq!(hex(response.as_ref()), HOST_RESPONSE_SHA256);
        let transformed = DhchapSecret::parse(&SPEC_SECRET.replace(":00:", ":01:")).unwrap();
        assert_eq!(
            hex(transformed.transformed(HOST).as_ref()),
            TRANSFORMED_KEY_SHA256
        );
    }

    const HOST_RESPONSE_SHA256: &str =
        "5964b16219c121ec8f6aed8eb18f2e8f80023c65fcd58827ad5f64f180623d1f";
    const TRANSFORMED_KEY_SHA256: &str =
        "bc105402882c8dda20d4fdafcbe1176965b975e7c5024a8477f9d0a6584c680c";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Runs a whole exchange between the two sides; returns whether the
    /// controller ended authenticated and what the host concluded.
    fn exchange(
        controller_keys: HostKeys,
        host_keys: HostKeys,
    ) -> (bool, Result<(), HostAuthError>) {
        let random = CountingRandom::default();
        let mut controller = ControllerExchange::new(Arc::new(controller_keys), HOST, SUBSYSTEM);
        let mut host = HostExchange::new(host_keys, HOST, SUBSYSTEM, 9);
        let mut buffer = [0u8; 4096];
        controller.on_send(&host.negotiate());
        let len = controller.on_receive(&mut buffer, &random).unwrap();
        let outcome = host.reply(&buffer[..len], &random).and_then(|reply| {
            controller.on_send(&reply);
            let len = controller.on_receive(&mut buffer, &random).unwrap();
            let (last, outcome) = host.conclude(&buffer[..len]);
            if let Some(last) = last {
                controller.on_send(&last);
            }
            outcome
        });
        (controller.is_authenticated(), outcome)
    }

    #[test]
    fn the_right_secret_authenticates_one_or_both_ways() {
        assert_eq!(exchange(keys(false), keys(false)), (true, Ok(())));
        assert_eq!(exchange(keys(true), keys(true)), (true, Ok(())));
    }

    #[test]
    fn a_wrong_secret_fails_on_the_side_that_checks_it() {
        let wrong_host = HostKeys {
            host: DhchapSecret::parse(&SPEC_SECRET.replace(":00:", ":01:")).unwrap(),
            controller: None,
            dh_group: DhGroup::Null,
        };
        assert_eq!(
            exchange(keys(false), wrong_host),
            (false, Err(HostAuthError::Refused(FailureReason::Failed)))
        );
        // The controller knows a different controller secret than the host expects.
        let mut other_controller = keys(true);
        other_controller.controller = Some(DhchapSecret::parse(SPEC_SECRET).unwrap());
        assert_eq!(
            exchange(other_controller, keys(true)),
            (false, Err(HostAuthError::ControllerNotAuthenticated))
        );
        // The host asks the controller to prove a secret it was not given.
        assert_eq!(
            exchange(keys(false), keys(true)),
            (false, Err(HostAuthError::Refused(FailureReason::Failed)))
        );
    }

    #[test]
    fn negotiation_failures_name_the_reason() {
        let random = CountingRandom::default();
        let host = HostExchange::new(keys(false), HOST, SUBSYSTEM, 1);
        let refused = |negotiate: &[u8]| {
            let mut controller = ControllerExchange::new(Arc::new(keys(false)), HOST, SUBSYSTEM);
            controller.on_send(negotiate);
            let mut out = [0u8; 64];
            let len = controller.on_receive(&mut out, &random).unwrap();
            assert!(!controller.is_authenticated());
            match check_failure1(&out[..len]) {
                Err(HostAuthError::Refused(reason)) => reason,
                other => panic!("expected Failure1, got {other:?}"),
            }
        };
        let mut only_ffdhe = host.negotiate();
        only_ffdhe[NEGOTIATE_HEADER_LEN + 34] = 1;
        assert_eq!(refused(&only_ffdhe), FailureReason::DhGroupUnusable);
        let mut unknown_hash = host.negotiate();
        unknown_hash[NEGOTIATE_HEADER_LEN + 2] = 1;
        unknown_hash[NEGOTIATE_HEADER_LEN + 4] = 9;
        assert_eq!(refused(&unknown_hash), FailureReason::HashUnusable);
        let mut concat = host.negotiate();
        concat[6] = 1;
        assert_eq!(refused(&concat), FailureReason::ConcatMismatch);
        assert_eq!(
            refused(&host.negotiate()[..20]),
            FailureReason::IncorrectPayload
        );
        // A Reply before any Negotiate is out of sequence.
        let mut reply = vec![0u8; HEADER_LEN + 64];
        reply[0] = DHCHAP_MESSAGES;
        reply[1] = message::REPLY;
        assert_eq!(refused(&reply), FailureReason::IncorrectMessage);
    }

    /// With each FFDHE group configured for the host, the controller picks
    /// it and both sides authenticate, one way and both ways, over the
    /// augmented challenges; a wrong secret still fails.
    #[test]
    fn every_ffdhe_group_authenticates_over_augmented_challenges() {
        for group in DhGroup::ALL {
            let with = |bidirectional| HostKeys {
                dh_group: group,
                ..keys(bidirectional)
            };
            assert_eq!(
                exchange(with(false), keys(false)),
                (true, Ok(())),
                "{group:?}"
            );
            assert_eq!(
                exchange(with(true), keys(true)),
                (true, Ok(())),
                "{group:?}"
            );
            let mut other_controller = with(true);
            other_controller.controller = Some(DhchapSecret::parse(SPEC_SECRET).unwrap());
            assert_eq!(
                exchange(other_controller, keys(true)),
                (false, Err(HostAuthError::ControllerNotAuthenticated)),
                "{group:?}"
            );
        }
        let mut wrong_host = keys(false);
        wrong_host.host = DhchapSecret::parse(&SPEC_SECRET.replace(":00:", ":01:")).unwrap();
        let ffdhe = HostKeys {
            dh_group: DhGroup::Ffdhe3072,
            ..keys(false)
        };
        assert_eq!(
            exchange(ffdhe, wrong_host),
            (false, Err(HostAuthError::Refused(FailureReason::Failed)))
        );
    }

    /// The public value and an augmented challenge for fixed inputs,
    /// computed independently with Python's pow, hashlib and hmac:
    /// `sha256(pow(2, e, p).to_bytes(256))` and
    /// `hmac(sha256(pow(3, e, p).to_bytes(256)), C1, sha256)` with RFC 7919's
    /// ffdhe2048 p, e = 0x0123456789abcdef repeated to 512 bits, C1 = 01..20.
    #[test]
    fn ffdhe_values_match_an_independent_computation() {
        let private = PrivateValue::from_hex(&"0123456789abcdef".repeat(8));
        let public = private.public(DhGroup::Ffdhe2048);
        assert_eq!(
            hex(HashFunction::Sha256.digest(&public).as_ref()),
            "227d859e6eb29d2d454dd405d9b9741b1b37bf8c1f494a7b97f850bd81cd9976"
        );
        let mut three = vec![0u8; 256];
        three[255] = 3;
        let key = private.session_key(DhGroup::Ffdhe2048, &three).unwrap();
        let challenge = Digest::from_slice(&(1..=32).collect::<Vec<u8>>());
        let augmented = HashFunction::Sha256.augmented(Some(&key), challenge);
        assert_eq!(
            hex(augmented.as_ref()),
            "bf41a5a051334d385ac0925ab3a67df62dd69d0e63cf00ec016cf7dff2de3aa0"
        );
    }

    /// A host's public value of 1 or p-1 (which would make the session key
    /// known to anyone), or of the wrong length, is refused.
    #[test]
    fn a_degenerate_or_misfit_dh_value_is_refused() {
        let random = CountingRandom::default();
        let group = DhGroup::Ffdhe2048;
        let reply_with = |value: Vec<u8>| {
            let keys = HostKeys {
                dh_group: group,
                ..keys(false)
            };
            let mut controller = ControllerExchange::new(Arc::new(keys), HOST, SUBSYSTEM);
            let mut host = HostExchange::new(self::keys(false), HOST, SUBSYSTEM, 2);
            controller.on_send(&host.negotiate());
            let mut buffer = [0u8; 1024];
            let len = controller.on_receive(&mut buffer, &random).unwrap();
            let mut reply = host.reply(&buffer[..len], &random).unwrap();
            reply.truncate(HEADER_LEN + 64);
            reply[10..12].copy_from_slice(&(value.len() as u16).to_le_bytes());
            reply.extend_from_slice(&value);
            controller.on_send(&reply);
            let len = controller.on_receive(&mut buffer, &random).unwrap();
            check_failure1(&buffer[..len])
        };
        let mut one = vec![0u8; 256];
        one[255] = 1;
        let mut p_minus_one = vec![0xFF; 256];
        p_minus_one[255] = 0xFE;
        for value in [one, p_minus_one, vec![7u8; 255]] {
            assert_eq!(
                reply_with(value),
                Err(HostAuthError::Refused(FailureReason::IncorrectPayload))
            );
        }
    }

    /// A host that does not offer the group configured for it is refused
    /// with "DH group unusable"; a controller that picks a group
    /// DH-HMAC-CHAP does not define gets Failure2 "DH group unusable".
    #[test]
    fn a_group_not_offered_or_not_defined_is_unusable() {
        let random = CountingRandom::default();
        let mut host = HostExchange::new(keys(false), HOST, SUBSYSTEM, 4);
        let negotiate = host.negotiate();
        assert_eq!(
            &negotiate[NEGOTIATE_HEADER_LEN + 34..NEGOTIATE_HEADER_LEN + 40],
            &[0, 1, 2, 3, 4, 5],
            "the groups the Linux host lists, NULL first"
        );
        let mut only_null = negotiate.clone();
        only_null[NEGOTIATE_HEADER_LEN + 3] = 1;
        let ffdhe = HostKeys {
            dh_group: DhGroup::Ffdhe4096,
            ..keys(false)
        };
        let mut controller = ControllerExchange::new(Arc::new(ffdhe), HOST, SUBSYSTEM);
        controller.on_send(&only_null);
        let mut out = [0u8; 64];
        let len = controller.on_receive(&mut out, &random).unwrap();
        assert_eq!(
            check_failure1(&out[..len]),
            Err(HostAuthError::Refused(FailureReason::DhGroupUnusable))
        );
        let mut controller = ControllerExchange::new(Arc::new(keys(false)), HOST, SUBSYSTEM);
        controller.on_send(&negotiate);
        let mut challenge = [0u8; 256];
        let len = controller.on_receive(&mut challenge, &random).unwrap();
        challenge[9] = 6;
        let error = host.reply(&challenge[..len], &random).unwrap_err();
        assert_eq!(error, HostAuthError::UnusableDhGroup(6));
        let abort = host.abort(&error).unwrap();
        assert_eq!(abort, hex_bytes("00f0 0000 0400 0105"));
        controller.on_send(&abort);
        assert!(!controller.is_authenticated());
        assert_eq!(
            host.abort(&HostAuthError::Refused(FailureReason::Failed)),
            None
        );
    }

    fn hex_bytes(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    #[test]
    fn a_reply_for_another_transaction_is_refused() {
        let random = CountingRandom::default();
        let mut controller = ControllerExchange::new(Arc::new(keys(false)), HOST, SUBSYSTEM);
        let mut host = HostExchange::new(keys(false), HOST, SUBSYSTEM, 5);
        controller.on_send(&host.negotiate());
        let mut buffer = [0u8; 256];
        let len = controller.on_receive(&mut buffer, &random).unwrap();
        let mut reply = host.reply(&buffer[..len], &random).unwrap();
        reply[4] = 6;
        controller.on_send(&reply);
        let len = controller.on_receive(&mut buffer, &random).unwrap();
        assert_eq!(
            check_failure1(&buffer[..len]),
            Err(HostAuthError::Refused(FailureReason::IncorrectPayload))
        );
        assert!(!controller.is_authenticated());
    }

    #[test]
    fn a_receive_buffer_too_small_for_the_challenge_is_reported() {
        let random = CountingRandom::default();
        let mut controller = ControllerExchange::new(Arc::new(keys(false)), HOST, SUBSYSTEM);
        let host = HostExchange::new(keys(false), HOST, SUBSYSTEM, 5);
        controller.on_send(&host.negotiate());
        assert_eq!(controller.on_receive(&mut [0u8; 20], &random), None);
    }
}
