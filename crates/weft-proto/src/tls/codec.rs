//! TLS 1.3's wire forms that a PSK-only server reads and writes (RFC 8446
//! section 4): the ClientHello with the extensions this profile looks at,
//! and the ServerHello, EncryptedExtensions and Finished it sends.
//! Everything else a ClientHello carries is skipped.

use super::Alert;

/// TLS record content types (RFC 8446 section 5.1).
pub(crate) mod content {
    pub const CHANGE_CIPHER_SPEC: u8 = 20;
    pub const ALERT: u8 = 21;
    pub const HANDSHAKE: u8 = 22;
    pub const APPLICATION_DATA: u8 = 23;
}

/// Handshake message types (RFC 8446 section 4).
pub(crate) mod handshake {
    pub const CLIENT_HELLO: u8 = 1;
    pub const SERVER_HELLO: u8 = 2;
    pub const ENCRYPTED_EXTENSIONS: u8 = 8;
    pub const FINISHED: u8 = 20;
}

/// Extension types (RFC 8446 section 4.2).
mod extension {
    pub const PRE_SHARED_KEY: u16 = 41;
    pub const EARLY_DATA: u16 = 42;
    pub const SUPPORTED_VERSIONS: u16 = 43;
    pub const PSK_KEY_EXCHANGE_MODES: u16 = 45;
    pub const KEY_SHARE: u16 = 51;
}

/// TLS 1.3 (supported_versions).
pub(crate) const TLS13: u16 = 0x0304;
/// The legacy version field's value (RFC 8446 section 4.1.2).
pub(crate) const LEGACY_VERSION: u16 = 0x0303;
/// Named group x25519 (RFC 8446 section 4.2.7).
pub(crate) const X25519: u16 = 0x001d;
/// psk_dhe_ke (RFC 8446 section 4.2.9).
const PSK_DHE_KE: u8 = 1;

/// Reads big-endian fields and length-prefixed vectors; every miss is a decode_error.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, at: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.at
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], Alert> {
        let end = self.at.checked_add(len).ok_or(Alert::DecodeError)?;
        let taken = self.bytes.get(self.at..end).ok_or(Alert::DecodeError)?;
        self.at = end;
        Ok(taken)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Alert> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, Alert> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn u24(&mut self) -> Result<usize, Alert> {
        let b = self.take(3)?;
        Ok(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }

    /// A vector with a one-byte length.
    pub(crate) fn vec8(&mut self) -> Result<&'a [u8], Alert> {
        let len = self.u8()?;
        self.take(usize::from(len))
    }

    /// A vector with a two-byte length.
    pub(crate) fn vec16(&mut self) -> Result<&'a [u8], Alert> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// Fails unless everything was read.
    pub(crate) fn finish(&self) -> Result<(), Alert> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(Alert::DecodeError)
        }
    }
}

/// A PSK identity offered and its binder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OfferedPsk<'a> {
    pub identity: &'a [u8],
    pub binder: &'a [u8],
}

/// What a PSK-only TLS 1.3 server needs of a ClientHello.
#[derive(Debug)]
pub(crate) struct ClientHello<'a> {
    pub session_id: &'a [u8],
    pub cipher_suites: Vec<u16>,
    pub tls13: bool,
    pub psk_dhe_ke: bool,
    pub x25519_share: Option<&'a [u8]>,
    pub early_data: bool,
    pub psks: Vec<OfferedPsk<'a>>,
    /// Length of the message (handshake header included) up to its binders
    /// list: what the binders are computed over (RFC 8446 section 4.2.11.2).
    pub binders_at: usize,
}

impl<'a> ClientHello<'a> {
    /// Parses `message`, the whole handshake message (4-byte header included).
    pub(crate) fn parse(message: &'a [u8]) -> Result<ClientHello<'a>, Alert> {
        let mut r = Reader::new(message);
        if r.u8()? != handshake::CLIENT_HELLO {
            return Err(Alert::UnexpectedMessage);
        }
        let len = r.u24()?;
        if len != message.len() - 4 {
            return Err(Alert::DecodeError);
        }
        let _legacy_version = r.u16()?;
        r.take(32)?; // random
        let session_id = r.vec8()?;
        if session_id.len() > 32 {
            return Err(Alert::DecodeError);
        }
        let suites = r.vec16()?;
        if suites.len() % 2 != 0 {
            return Err(Alert::DecodeError);
        }
        let cipher_suites = suites
            .chunks(2)
            .map(|s| u16::from_be_bytes([s[0], s[1]]))
            .collect();
        // RFC 8446 section 4.1.2: exactly one method, null.
        if r.vec8()? != [0] {
            return Err(Alert::IllegalParameter);
        }
        let extensions_len = usize::from(r.u16()?);
        let extensions_start = r.position();
        if extensions_start + extensions_len != message.len() {
            return Err(Alert::DecodeError);
        }
        let mut hello = ClientHello {
            session_id,
            cipher_suites,
            tls13: false,
            psk_dhe_ke: false,
            x25519_share: None,
            early_data: false,
            psks: Vec::new(),
            binders_at: 0,
        };
        let mut seen = Vec::new();
        while !r.is_empty() {
            let kind = r.u16()?;
            let data_start = r.position() + 2;
            let data = r.vec16()?;
            // RFC 8446 section 4.2: no extension twice.
            if seen.contains(&kind) {
                return Err(Alert::IllegalParameter);
            }
            seen.push(kind);
            match kind {
                extension::SUPPORTED_VERSIONS => hello.tls13 = versions_have_tls13(data)?,
                extension::PSK_KEY_EXCHANGE_MODES => {
                    let mut e = Reader::new(data);
                    hello.psk_dhe_ke = e.vec8()?.contains(&PSK_DHE_KE);
                    e.finish()?;
                }
                extension::KEY_SHARE => hello.x25519_share = x25519_share(data)?,
                extension::EARLY_DATA => hello.early_data = true,
                extension::PRE_SHARED_KEY => {
                    // RFC 8446 section 4.2.11: the last extension.
                    if !r.is_empty() {
                        return Err(Alert::IllegalParameter);
                    }
                    let (psks, binders_offset) = offered_psks(data)?;
                    hello.psks = psks;
                    hello.binders_at = data_start + binders_offset;
                }
                _ => {}
            }
        }
        Ok(hello)
    }
}

fn versions_have_tls13(data: &[u8]) -> Result<bool, Alert> {
    let mut r = Reader::new(data);
    let versions = r.vec8()?;
    r.finish()?;
    if versions.len() % 2 != 0 {
        return Err(Alert::DecodeError);
    }
    Ok(versions
        .chunks(2)
        .any(|v| u16::from_be_bytes([v[0], v[1]]) == TLS13))
}

/// The x25519 key share, if one was sent (RFC 8446 section 4.2.8).
fn x25519_share(data: &[u8]) -> Result<Option<&[u8]>, Alert> {
    let mut r = Reader::new(data);
    let mut shares = Reader::new(r.vec16()?);
    r.finish()?;
    let mut found = None;
    while !shares.is_empty() {
        let group = shares.u16()?;
        let key = shares.vec16()?;
        if group == X25519 && found.is_none() {
            if key.len() != 32 {
                return Err(Alert::IllegalParameter);
            }
            found = Some(key);
        }
    }
    Ok(found)
}

/// The identities and binders of a pre_shared_key extension, and where its
/// binders list starts within `data`.
fn offered_psks(data: &[u8]) -> Result<(Vec<OfferedPsk<'_>>, usize), Alert> {
    let mut r = Reader::new(data);
    let mut identities = Reader::new(r.vec16()?);
    let binders_offset = r.position();
    let mut binders = Reader::new(r.vec16()?);
    r.finish()?;
    let mut psks = Vec::new();
    while !identities.is_empty() {
        let identity = identities.vec16()?;
        let _obfuscated_ticket_age = identities.take(4)?;
        let binder = binders.vec8()?;
        if identity.is_empty() || binder.len() < 32 {
            return Err(Alert::DecodeError);
        }
        psks.push(OfferedPsk { identity, binder });
    }
    // As many binders as identities, and at least one.
    if psks.is_empty() || !binders.is_empty() {
        return Err(Alert::IllegalParameter);
    }
    Ok((psks, binders_offset))
}

/// The SHA-256 of "HelloRetryRequest": a ServerHello with this random is one
/// (RFC 8446 section 4.1.3).
const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xCF, 0x21, 0xAD, 0x74, 0xE5, 0x9A, 0x61, 0x11, 0xBE, 0x1D, 0x8C, 0x02, 0x1E, 0x65, 0xB8, 0x91,
    0xC2, 0xA2, 0x11, 0x16, 0x7A, 0xBB, 0x8C, 0x5E, 0x07, 0x9E, 0x09, 0xE2, 0xC8, 0xA8, 0x33, 0x9C,
];

/// What a PSK-only client needs of a ServerHello.
#[derive(Debug)]
pub(crate) struct ServerHello<'a> {
    pub session_id: &'a [u8],
    pub cipher_suite: u16,
    pub x25519_share: &'a [u8],
    pub selected_identity: u16,
}

impl<'a> ServerHello<'a> {
    /// Parses `message`, the whole handshake message (header included).
    pub(crate) fn parse(message: &'a [u8]) -> Result<ServerHello<'a>, Alert> {
        let mut r = Reader::new(message);
        if r.u8()? != handshake::SERVER_HELLO {
            return Err(Alert::UnexpectedMessage);
        }
        if r.u24()? != message.len() - 4 {
            return Err(Alert::DecodeError);
        }
        let _legacy_version = r.u16()?;
        if r.take(32)? == HELLO_RETRY_RANDOM {
            // This profile offers x25519 alone: a retry cannot help.
            return Err(Alert::HandshakeFailure);
        }
        let session_id = r.vec8()?;
        let cipher_suite = r.u16()?;
        if r.u8()? != 0 {
            return Err(Alert::IllegalParameter);
        }
        let mut extensions = Reader::new(r.vec16()?);
        r.finish()?;
        let (mut tls13, mut share, mut selected) = (false, None, None);
        while !extensions.is_empty() {
            let kind = extensions.u16()?;
            let mut data = Reader::new(extensions.vec16()?);
            match kind {
                extension::SUPPORTED_VERSIONS => tls13 = data.u16()? == TLS13,
                extension::KEY_SHARE => {
                    if data.u16()? != X25519 {
                        return Err(Alert::IllegalParameter);
                    }
                    share = Some(data.vec16()?);
                }
                extension::PRE_SHARED_KEY => selected = Some(data.u16()?),
                _ => return Err(Alert::UnsupportedExtension),
            }
            data.finish()?;
        }
        if !tls13 {
            return Err(Alert::ProtocolVersion);
        }
        let (Some(x25519_share), Some(selected_identity)) = (share, selected) else {
            return Err(Alert::MissingExtension);
        };
        if x25519_share.len() != 32 {
            return Err(Alert::IllegalParameter);
        }
        Ok(ServerHello {
            session_id,
            cipher_suite,
            x25519_share,
            selected_identity,
        })
    }
}

/// A ClientHello offering one external PSK with psk_dhe_ke over x25519;
/// its binder (the last 32 bytes) is zero, for the caller to fill in over
/// everything before [`BINDERS_LEN`] from the end.
pub(crate) fn client_hello(
    random: &[u8; 32],
    session_id: &[u8; 32],
    x25519_public: &[u8; 32],
    identity: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(256 + identity.len());
    handshake_message(&mut out, handshake::CLIENT_HELLO, |out| {
        out.extend_from_slice(&LEGACY_VERSION.to_be_bytes());
        out.extend_from_slice(random);
        out.push(32);
        out.extend_from_slice(session_id);
        // TLS_AES_128_GCM_SHA256, TLS_CHACHA20_POLY1305_SHA256.
        out.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x03]);
        out.extend_from_slice(&[1, 0]);
        vec16(out, |out| {
            extension_with(out, extension::SUPPORTED_VERSIONS, &[2, 0x03, 0x04]);
            extension_with(out, SUPPORTED_GROUPS, &[0, 2, 0x00, 0x1d]);
            extension_with(out, extension::PSK_KEY_EXCHANGE_MODES, &[1, PSK_DHE_KE]);
            let mut share = vec![0, 36, 0x00, 0x1d, 0, 32];
            share.extend_from_slice(x25519_public);
            extension_with(out, extension::KEY_SHARE, &share);
            out.extend_from_slice(&extension::PRE_SHARED_KEY.to_be_bytes());
            vec16(out, |out| {
                vec16(out, |out| {
                    vec16(out, |out| out.extend_from_slice(identity));
                    out.extend_from_slice(&[0; 4]);
                });
                vec16(out, |out| {
                    out.push(32);
                    out.extend_from_slice(&[0; 32]);
                });
            });
        });
    });
    out
}

/// The binders list of [`client_hello`]: its length, the binder's, the binder.
pub(crate) const BINDERS_LEN: usize = 2 + 1 + 32;

/// supported_groups (RFC 8446 section 4.2.7).
const SUPPORTED_GROUPS: u16 = 10;

fn extension_with(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u16).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends a handshake message of `kind` whose body `body` writes.
pub(crate) fn handshake_message(out: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    out.push(kind);
    let at = out.len();
    out.extend_from_slice(&[0; 3]);
    body(out);
    let len = out.len() - at - 3;
    out[at..at + 3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
}

/// Appends `body`'s bytes behind a two-byte length.
pub(crate) fn vec16(out: &mut Vec<u8>, body: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 2]);
    body(out);
    let len = (out.len() - at - 2) as u16;
    out[at..at + 2].copy_from_slice(&len.to_be_bytes());
}

/// The ServerHello of a psk_dhe_ke handshake (RFC 8446 section 4.1.3).
pub(crate) fn server_hello(
    random: &[u8; 32],
    session_id: &[u8],
    cipher_suite: u16,
    x25519_public: &[u8; 32],
    selected_identity: u16,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    handshake_message(&mut out, handshake::SERVER_HELLO, |out| {
        out.extend_from_slice(&LEGACY_VERSION.to_be_bytes());
        out.extend_from_slice(random);
        out.push(session_id.len() as u8);
        out.extend_from_slice(session_id);
        out.extend_from_slice(&cipher_suite.to_be_bytes());
        out.push(0); // legacy compression method
        vec16(out, |out| {
            out.extend_from_slice(&extension::SUPPORTED_VERSIONS.to_be_bytes());
            out.extend_from_slice(&2u16.to_be_bytes());
            out.extend_from_slice(&TLS13.to_be_bytes());
            out.extend_from_slice(&extension::KEY_SHARE.to_be_bytes());
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&X25519.to_be_bytes());
            out.extend_from_slice(&32u16.to_be_bytes());
            out.extend_from_slice(x25519_public);
            out.extend_from_slice(&extension::PRE_SHARED_KEY.to_be_bytes());
            out.extend_from_slice(&2u16.to_be_bytes());
            out.extend_from_slice(&selected_identity.to_be_bytes());
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ClientHello weft's initiator sends, with `binder` filled in.
    fn client_hello(identity: &[u8], binder: &[u8; 32]) -> Vec<u8> {
        let mut message = super::client_hello(&[7; 32], &[9; 32], &[5; 32], identity);
        let at = message.len() - 32;
        message[at..].copy_from_slice(binder);
        message
    }

    #[test]
    fn a_client_hello_gives_what_the_server_needs() {
        let message = client_hello(b"NVMe0R01 h s", &[0xBB; 32]);
        let hello = ClientHello::parse(&message).unwrap();
        assert!(hello.tls13 && hello.psk_dhe_ke && !hello.early_data);
        assert_eq!(hello.cipher_suites, [0x1301, 0x1303]);
        assert_eq!(hello.session_id, [9; 32]);
        assert_eq!(hello.x25519_share, Some(&[5u8; 32][..]));
        assert_eq!(hello.psks.len(), 1);
        assert_eq!(hello.psks[0].identity, b"NVMe0R01 h s");
        assert_eq!(hello.psks[0].binder, [0xBB; 32]);
        // The binders list (2 + 1 + 32 bytes) ends the message.
        assert_eq!(hello.binders_at, message.len() - 35);
    }

    #[test]
    fn every_cut_of_a_client_hello_is_refused_not_panicked_on() {
        let message = client_hello(b"NVMe0R01 h s", &[0xBB; 32]);
        for len in 0..message.len() {
            assert!(ClientHello::parse(&message[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn a_pre_shared_key_extension_not_last_is_refused() {
        let mut message = client_hello(b"NVMe0R01 h s", &[0xBB; 32]);
        // An empty extension (type 0xFFFF) after pre_shared_key.
        message.extend_from_slice(&[0xFF, 0xFF, 0, 0]);
        let len = message.len() - 4;
        message[1..4].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
        let extensions_at = 4 + 2 + 32 + 33 + 6 + 2;
        assert_eq!(extensions_at, 79);
        let extensions_len =
            u16::from_be_bytes([message[extensions_at], message[extensions_at + 1]]);
        message[extensions_at..extensions_at + 2]
            .copy_from_slice(&(extensions_len + 4).to_be_bytes());
        assert_eq!(
            ClientHello::parse(&message).unwrap_err(),
            Alert::IllegalParameter
        );
    }
}
