//! TLS 1.3 for NVMe/TCP (NVMe/TCP Transport Specification section 3.6, TP
//! 8011), sans-IO: the handshake of an external pre-shared key with
//! ephemeral x25519 (psk_dhe_ke) on the target's side and on the
//! initiator's, the record protection of the stream after it, and its key
//! updates.
//!
//! Why its own and not a library's: rustls has no external PSKs, and the
//! handshake this profile needs is small (no certificates, no X.509, no
//! resumption, no 0-RTT, no HelloRetryRequest: the Linux host's tlshd
//! always sends an x25519 share), so it is written here on `ring`'s AEADs
//! and SHA-256, fuzzed like every other decoder, with no C library in the
//! target. The keys (`psk`) are derived as the Linux host derives them.
//!
//! What this does not do: sockets, buffers of the data plane, or deciding
//! which hosts may connect (the caller's [`PskStore`] answers that).

mod client;
mod codec;
mod hkdf;
mod incoming;
mod key_update;
mod keys;
pub mod psk;
mod server;

pub use client::ClientHandshake;
pub use key_update::{KeyUpdates, ASK_AFTER_RECORDS, KEY_UPDATE_RECORD};
pub use keys::{
    record_len, CipherSuite, RecordKeys, HEADER_LEN, MAX_PLAINTEXT, MAX_RECORD, OVERHEAD,
};
pub use server::{PskStore, ServerHandshake};

/// Record content type of application data (what [`RecordKeys::seal`] is given for the stream).
pub const APPLICATION_DATA: u8 = codec::content::APPLICATION_DATA;

/// Why a handshake or a protected stream ended: the alert this side sent
/// (RFC 8446 section 6.2), or the one the peer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Alert {
    /// A message that does not belong here.
    #[error("TLS: unexpected message")]
    UnexpectedMessage,
    /// A record that does not decrypt.
    #[error("TLS: a record failed its integrity check")]
    BadRecordMac,
    /// A record longer than TLS allows.
    #[error("TLS: record too long")]
    RecordOverflow,
    /// Nothing acceptable on offer (cipher suites, key exchange modes, groups).
    #[error("TLS: no acceptable parameters offered (this target speaks TLS 1.3 with a PSK, psk_dhe_ke over x25519, AES-128-GCM or ChaCha20-Poly1305)")]
    HandshakeFailure,
    /// A field with a value it may not have.
    #[error("TLS: illegal parameter")]
    IllegalParameter,
    /// A message that does not parse.
    #[error("TLS: malformed message")]
    DecodeError,
    /// A binder or Finished that does not verify: the peer holds another key.
    #[error("TLS: the peer's PSK binder or Finished does not verify (another key)")]
    DecryptError,
    /// No TLS 1.3 on offer.
    #[error("TLS: the peer does not offer TLS 1.3")]
    ProtocolVersion,
    /// Something this side cannot do (a sequence number would wrap).
    #[error("TLS: internal error")]
    InternalError,
    /// An extension the peer may not send here.
    #[error("TLS: an extension that was not asked for")]
    UnsupportedExtension,
    /// A required extension is missing.
    #[error("TLS: a required extension is missing (pre_shared_key, psk_key_exchange_modes or key_share)")]
    MissingExtension,
    /// No offered PSK identity is known.
    #[error("TLS: no PSK identity offered is known here")]
    UnknownPskIdentity,
    /// The peer ended it with this alert description.
    #[error("TLS: the peer sent alert {0}")]
    Received(u8),
}

impl Alert {
    /// Its description code (RFC 8446 section 6); none for one received.
    pub fn code(self) -> Option<u8> {
        Some(match self {
            Alert::UnexpectedMessage => 10,
            Alert::BadRecordMac => 20,
            Alert::RecordOverflow => 22,
            Alert::HandshakeFailure => 40,
            Alert::IllegalParameter => 47,
            Alert::DecodeError => 50,
            Alert::DecryptError => 51,
            Alert::ProtocolVersion => 70,
            Alert::InternalError => 80,
            Alert::MissingExtension => 109,
            Alert::UnsupportedExtension => 110,
            Alert::UnknownPskIdentity => 115,
            Alert::Received(_) => return None,
        })
    }
}

/// A finished handshake: the stream's record protection in each direction.
#[derive(Debug)]
pub struct Established {
    /// The cipher suite agreed.
    pub suite: CipherSuite,
    /// The PSK identity used (on a target: the host's NQN is in it).
    pub identity: Vec<u8>,
    /// Opens what the peer sends.
    pub receive: RecordKeys,
    /// Seals what this side sends.
    pub send: RecordKeys,
    /// Bytes received after the handshake: the protected stream's first records.
    pub leftover: Vec<u8>,
}

#[cfg(test)]
mod tests;
