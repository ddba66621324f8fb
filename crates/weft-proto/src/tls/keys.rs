//! TLS 1.3's key schedule for an external PSK with (EC)DHE (RFC 8446
//! section 7.1) over SHA-256, and the record protection its traffic secrets
//! key (section 5.2-5.3): AES-128-GCM or ChaCha20-Poly1305.

use super::hkdf;
use super::Alert;
use crate::auth::{Digest, HashFunction};
use ring::aead;
use sha2::{Digest as _, Sha256};

/// The cipher suites this profile speaks, both over SHA-256: the NVMe/TCP
/// specification's mandatory TLS_AES_128_GCM_SHA256, and
/// TLS_CHACHA20_POLY1305_SHA256 (what the Linux host's tlshd offers with a
/// 48-byte PSK, whose binder GnuTLS still computes with SHA-256).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CipherSuite {
    /// TLS_AES_128_GCM_SHA256 (0x1301).
    Aes128GcmSha256,
    /// TLS_CHACHA20_POLY1305_SHA256 (0x1303).
    Chacha20Poly1305Sha256,
}

impl CipherSuite {
    /// Its code point.
    pub fn code(self) -> u16 {
        match self {
            CipherSuite::Aes128GcmSha256 => 0x1301,
            CipherSuite::Chacha20Poly1305Sha256 => 0x1303,
        }
    }

    /// The first of `offered` (the client's order of preference) this profile speaks.
    pub(crate) fn choose(offered: &[u16]) -> Option<CipherSuite> {
        offered.iter().find_map(|&code| match code {
            0x1301 => Some(CipherSuite::Aes128GcmSha256),
            0x1303 => Some(CipherSuite::Chacha20Poly1305Sha256),
            _ => None,
        })
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            CipherSuite::Aes128GcmSha256 => &aead::AES_128_GCM,
            CipherSuite::Chacha20Poly1305Sha256 => &aead::CHACHA20_POLY1305,
        }
    }
}

const HASH: HashFunction = HashFunction::Sha256;
const HASH_LEN: usize = 32;

/// A SHA-256 secret of the schedule.
pub(crate) type Secret = [u8; HASH_LEN];

/// SHA-256 of nothing: Derive-Secret's transcript where none is bound.
fn empty_hash() -> [u8; HASH_LEN] {
    Sha256::digest([]).into()
}

/// Derive-Secret(secret, label, transcript hash).
pub(crate) fn derive_secret(secret: &[u8], label: &[u8], transcript: &[u8; HASH_LEN]) -> Secret {
    let mut out = [0u8; HASH_LEN];
    hkdf::expand_label(HASH, secret, label, transcript, &mut out);
    out
}

fn extract(salt: &[u8], ikm: &[u8]) -> Secret {
    let prk: Digest = hkdf::extract(HASH, salt, ikm);
    prk.as_ref().try_into().expect("SHA-256 output")
}

/// The early secret of an external PSK.
pub(crate) fn early_secret(psk: &[u8]) -> Secret {
    extract(&[], psk)
}

/// The binder of an external PSK over `truncated_hello_hash` (RFC 8446
/// section 4.2.11.2): HMAC under the finished key of "ext binder".
pub(crate) fn binder(early: &Secret, truncated_hello_hash: &[u8; HASH_LEN]) -> Digest {
    let binder_key = derive_secret(early, b"ext binder", &empty_hash());
    finished_mac(&binder_key, truncated_hello_hash)
}

/// HMAC under `base_key`'s finished key (RFC 8446 section 4.4.4).
pub(crate) fn finished_mac(base_key: &Secret, transcript: &[u8; HASH_LEN]) -> Digest {
    let mut finished_key = [0u8; HASH_LEN];
    hkdf::expand_label(HASH, base_key, b"finished", &[], &mut finished_key);
    HASH.hmac(&finished_key, &[transcript])
}

/// The handshake secret after the early one, mixed with the (EC)DHE secret.
pub(crate) fn handshake_secret(early: &Secret, shared: &[u8]) -> Secret {
    extract(&derive_secret(early, b"derived", &empty_hash()), shared)
}

/// The master secret after the handshake secret.
pub(crate) fn master_secret(handshake: &Secret) -> Secret {
    extract(
        &derive_secret(handshake, b"derived", &empty_hash()),
        &[0u8; HASH_LEN],
    )
}

/// Compares in time independent of where the bytes differ.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One direction's record protection: the key and IV of a traffic secret,
/// and the sequence number of the next record.
pub struct RecordKeys {
    suite: CipherSuite,
    /// The traffic secret the key and IV come from: the next is derived
    /// from it at a key update.
    secret: Secret,
    key: aead::LessSafeKey,
    iv: [u8; aead::NONCE_LEN],
    sequence: u64,
}

impl std::fmt::Debug for RecordKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordKeys(record {})", self.sequence)
    }
}

/// The largest plaintext of a record (RFC 8446 section 5.1).
pub const MAX_PLAINTEXT: usize = 1 << 14;
/// A record's header.
pub const HEADER_LEN: usize = 5;
/// What protection adds to a record's plaintext: its content type and the tag.
pub const OVERHEAD: usize = 1 + 16;
/// The largest record a peer may send (RFC 8446 section 5.2: 2^14 + 256).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;

impl RecordKeys {
    /// The keys of traffic secret `secret` under `suite`.
    pub(crate) fn new(suite: CipherSuite, secret: &Secret) -> RecordKeys {
        let (key, iv) = Self::key_and_iv(suite, secret);
        RecordKeys {
            suite,
            secret: *secret,
            key,
            iv,
            sequence: 0,
        }
    }

    /// Moves to the next traffic secret (RFC 8446 section 7.2:
    /// application_traffic_secret_N+1 = HKDF-Expand-Label(secret_N, "traffic
    /// upd", "", Hash.length)), its key and IV, and record 0.
    pub(crate) fn update(&mut self) {
        let mut next = [0u8; HASH_LEN];
        hkdf::expand_label(HASH, &self.secret, b"traffic upd", &[], &mut next);
        self.secret = next;
        (self.key, self.iv) = Self::key_and_iv(self.suite, &self.secret);
        self.sequence = 0;
    }

    /// The records protected or opened under the current key.
    pub fn records(&self) -> u64 {
        self.sequence
    }

    fn key_and_iv(
        suite: CipherSuite,
        secret: &Secret,
    ) -> (aead::LessSafeKey, [u8; aead::NONCE_LEN]) {
        let algorithm = suite.algorithm();
        let mut key = [0u8; 32];
        let key = &mut key[..algorithm.key_len()];
        hkdf::expand_label(HASH, secret, b"key", &[], key);
        let mut iv = [0u8; aead::NONCE_LEN];
        hkdf::expand_label(HASH, secret, b"iv", &[], &mut iv);
        let key = aead::UnboundKey::new(algorithm, key).expect("key of the algorithm's length");
        (aead::LessSafeKey::new(key), iv)
    }

    /// The next record's nonce (RFC 8446 section 5.3); a connection whose
    /// sequence would wrap must end instead.
    fn next_nonce(&mut self) -> Result<aead::Nonce, Alert> {
        let sequence = self.sequence;
        self.sequence = sequence.checked_add(1).ok_or(Alert::InternalError)?;
        let mut nonce = self.iv;
        for (byte, seq) in nonce[4..].iter_mut().zip(sequence.to_be_bytes()) {
            *byte ^= seq;
        }
        Ok(aead::Nonce::assume_unique_for_key(nonce))
    }

    /// Protects `plaintext` of `content_type` as one record written to the
    /// front of `out` (which must hold `HEADER_LEN + plaintext.len() +
    /// OVERHEAD` bytes); returns the record's length.
    pub fn seal(
        &mut self,
        content_type: u8,
        plaintext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, Alert> {
        out[HEADER_LEN..HEADER_LEN + plaintext.len()].copy_from_slice(plaintext);
        self.seal_in_place(content_type, plaintext.len(), out)
    }

    /// Protects the `len` bytes of plaintext of `content_type` that follow
    /// room for a header at the front of `out` (which must hold
    /// `HEADER_LEN + len + OVERHEAD` bytes) as one record there; returns
    /// the record's length.
    pub fn seal_in_place(
        &mut self,
        content_type: u8,
        len: usize,
        out: &mut [u8],
    ) -> Result<usize, Alert> {
        assert!(len <= MAX_PLAINTEXT, "one record's plaintext");
        let inner = len + 1;
        let total = HEADER_LEN + inner + 16;
        let header = record_header(super::codec::content::APPLICATION_DATA, inner + 16);
        out[..HEADER_LEN].copy_from_slice(&header);
        out[HEADER_LEN + len] = content_type;
        let nonce = self.next_nonce()?;
        let tag = self
            .key
            .seal_in_place_separate_tag(
                nonce,
                aead::Aad::from(header),
                &mut out[HEADER_LEN..HEADER_LEN + inner],
            )
            .map_err(|_| Alert::InternalError)?;
        out[HEADER_LEN + inner..total].copy_from_slice(tag.as_ref());
        Ok(total)
    }

    /// Appends `plaintext` of `content_type` to `out` as records.
    pub fn seal_to(
        &mut self,
        content_type: u8,
        plaintext: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Alert> {
        for piece in plaintext.chunks(MAX_PLAINTEXT) {
            let at = out.len();
            out.resize(at + HEADER_LEN + piece.len() + OVERHEAD, 0);
            self.seal(content_type, piece, &mut out[at..])?;
        }
        Ok(())
    }

    /// Opens `record` (header included) in place: its inner content type
    /// and the range of its plaintext within `record`.
    pub fn open(&mut self, record: &mut [u8]) -> Result<(u8, std::ops::Range<usize>), Alert> {
        let header: [u8; HEADER_LEN] = record[..HEADER_LEN].try_into().expect("a header");
        if header[0] != super::codec::content::APPLICATION_DATA {
            return Err(Alert::UnexpectedMessage);
        }
        let nonce = self.next_nonce()?;
        let plaintext = self
            .key
            .open_in_place(nonce, aead::Aad::from(header), &mut record[HEADER_LEN..])
            .map_err(|_| Alert::BadRecordMac)?;
        // RFC 8446 section 5.4: the content type is the last non-zero byte.
        let end = plaintext
            .iter()
            .rposition(|&b| b != 0)
            .ok_or(Alert::UnexpectedMessage)?;
        let content_type = plaintext[end];
        Ok((content_type, HEADER_LEN..HEADER_LEN + end))
    }
}

/// A record header of `content_type` over `len` bytes.
pub(crate) fn record_header(content_type: u8, len: usize) -> [u8; HEADER_LEN] {
    let len = (len as u16).to_be_bytes();
    [content_type, 0x03, 0x03, len[0], len[1]]
}

/// The length of the record that starts `bytes` (header included), once
/// its header is there; an error if it cannot be a TLS 1.3 record.
pub fn record_len(bytes: &[u8]) -> Result<Option<usize>, Alert> {
    let Some(header) = bytes.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if header[1] != 0x03 || HEADER_LEN + len > MAX_RECORD {
        return Err(Alert::RecordOverflow);
    }
    Ok(Some(HEADER_LEN + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_open_what_they_sealed_and_refuse_a_changed_byte() {
        let secret = [7u8; 32];
        for suite in [
            CipherSuite::Aes128GcmSha256,
            CipherSuite::Chacha20Poly1305Sha256,
        ] {
            let (mut send, mut receive) = (
                RecordKeys::new(suite, &secret),
                RecordKeys::new(suite, &secret),
            );
            let mut wire = Vec::new();
            send.seal_to(23, &[0xAB; 20_000], &mut wire).unwrap();
            let first = record_len(&wire).unwrap().unwrap();
            assert_eq!(first, HEADER_LEN + MAX_PLAINTEXT + OVERHEAD);
            let (a, b) = wire.split_at_mut(first);
            let (kind, range) = receive.open(a).unwrap();
            assert_eq!((kind, range.len()), (23, MAX_PLAINTEXT));
            b[10] ^= 1;
            assert_eq!(receive.open(b).unwrap_err(), Alert::BadRecordMac);
        }
    }
}
