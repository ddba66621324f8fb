//! NVMe/TCP's TLS pre-shared keys (NVMe/TCP Transport Specification,
//! section 3.6.1.3), as the Linux host derives them: a *configured* PSK
//! (`NVMeTLSkey-1:01:<base64 of key and CRC-32>:`, what `nvme gen-tls-key`
//! prints and `weft host add --tls` makes), the *retained* PSK bound to the
//! host's NQN, the PSK identity the host offers in its ClientHello
//! (`NVMe0R01 <hostnqn> <subnqn>`, or version 1 with a digest), and the TLS
//! PSK the handshake uses, derived from the retained PSK and the identity.
//!
//! Two forms of the derivation are in use: libnvme up to 1.15 (nvme-cli
//! 2.13, Debian trixie) writes HKDF-Expand-Label's info as a little-endian
//! length followed by "tls13 ", the label and the context, without their
//! length bytes; libnvme 1.16 on writes RFC 8446's form. A target cannot
//! tell which a host used, so it offers both candidates and the PSK
//! binder picks (see [`Identity::tls_psks`]).
//!
//! What this does not do: keep keys (the target's configuration does) or
//! run the handshake (`tls::server`).

use super::hkdf;
use crate::auth::{HashFunction, SecureRandom};
use crate::keytext::{base64_decode, base64_encode, crc32};
use std::fmt;
use thiserror::Error;

/// A configured PSK: 32 bytes for SHA-256 (hash 01), 48 for SHA-384 (02).
#[derive(Clone, PartialEq, Eq)]
pub struct ConfiguredPsk {
    hash: HashFunction,
    key: Vec<u8>,
}

/// Why a configured PSK's text was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PskError {
    /// Not the interchange format.
    #[error("a TLS PSK looks like NVMeTLSkey-1:01:<base64>: (as `nvme gen-tls-key` prints it)")]
    Format,
    /// A hash other than 01 (SHA-256) or 02 (SHA-384).
    #[error("the PSK's hash must be 01 (SHA-256) or 02 (SHA-384)")]
    Hash,
    /// The key part is not base64, or not as long as its hash needs.
    #[error(
        "the PSK's key part must be base64 of 32 bytes (hash 01) or 48 (hash 02) and their CRC-32"
    )]
    Length,
    /// The CRC-32 does not match: a key mistyped or cut.
    #[error("the PSK's CRC-32 does not match its key: it was mistyped or cut")]
    Crc,
}

impl ConfiguredPsk {
    /// A SHA-256 configured PSK (hash 01) of the 32 bytes `key`: one two
    /// parties derived from a secret they share.
    pub fn from_key(key: [u8; 32]) -> ConfiguredPsk {
        ConfiguredPsk {
            hash: HashFunction::Sha256,
            key: key.to_vec(),
        }
    }

    /// Parses the interchange format `NVMeTLSkey-1:HH:<base64>:`.
    pub fn parse(text: &str) -> Result<ConfiguredPsk, PskError> {
        let rest = text.strip_prefix("NVMeTLSkey-1:").ok_or(PskError::Format)?;
        let (hash, rest) = rest.split_once(':').ok_or(PskError::Format)?;
        let encoded = rest.strip_suffix(':').ok_or(PskError::Format)?;
        let hash = match hash {
            "01" => HashFunction::Sha256,
            "02" => HashFunction::Sha384,
            _ => return Err(PskError::Hash),
        };
        let decoded = base64_decode(encoded).ok_or(PskError::Length)?;
        if decoded.len() != hash.output_len() + 4 {
            return Err(PskError::Length);
        }
        let (key, crc) = decoded.split_at(hash.output_len());
        if crc32(key).to_le_bytes() != crc {
            return Err(PskError::Crc);
        }
        Ok(ConfiguredPsk {
            hash,
            key: key.to_vec(),
        })
    }

    /// A new random SHA-256 PSK (hash 01, as `nvme gen-tls-key` makes).
    pub fn generate(random: &dyn SecureRandom) -> ConfiguredPsk {
        let mut key = vec![0u8; 32];
        random.fill(&mut key);
        ConfiguredPsk {
            hash: HashFunction::Sha256,
            key,
        }
    }

    /// The PSK retained for `host_nqn`: HKDF of the configured key with
    /// label "HostNQN" and the NQN as context.
    fn retained(&self, host_nqn: &str, form: LabelForm) -> Vec<u8> {
        let prk = hkdf::extract(self.hash, &[], &self.key);
        let mut retained = vec![0u8; self.key.len()];
        form.expand(
            self.hash,
            prk.as_ref(),
            b"HostNQN",
            host_nqn.as_bytes(),
            &mut retained,
        );
        retained
    }
}

impl fmt::Display for ConfiguredPsk {
    /// The interchange format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut bytes = self.key.clone();
        bytes.extend_from_slice(&crc32(&self.key).to_le_bytes());
        write!(
            f,
            "NVMeTLSkey-1:{:02}:{}:",
            self.hash.id(),
            base64_encode(&bytes)
        )
    }
}

impl fmt::Debug for ConfiguredPsk {
    /// Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfiguredPsk({:?})", self.hash)
    }
}

/// The two ways HKDF-Expand-Label's info has been written (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LabelForm {
    /// libnvme up to 1.15: u16 little-endian length, "tls13 ", label, context.
    Libnvme,
    /// RFC 8446 section 7.1.
    Rfc8446,
}

impl LabelForm {
    fn expand(self, hash: HashFunction, prk: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
        match self {
            LabelForm::Libnvme => {
                let length = (out.len() as u16).to_le_bytes();
                hkdf::expand(hash, prk, &[&length, b"tls13 ", label, context], out);
            }
            LabelForm::Rfc8446 => hkdf::expand_label(hash, prk, label, context, out),
        }
    }
}

/// A PSK identity as the host offers it: `NVMe<v>R<hh> <hostnqn> <subnqn>`
/// and, in version 1, ` <digest>` (base64 of an HMAC of both NQNs under
/// the retained PSK).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// 0 or 1.
    pub version: u8,
    /// The hash of the configured PSK it names.
    pub hash: HashFunction,
    /// The host's NQN: the Connect's host NQN must be the same.
    pub host_nqn: String,
    /// The subsystem the host connects to.
    pub subsystem_nqn: String,
    /// Version 1's digest, as sent.
    digest: Option<String>,
}

impl Identity {
    /// Parses an identity as a ClientHello carries it; `None` if it is not
    /// one of NVMe's.
    pub fn parse(bytes: &[u8]) -> Option<Identity> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut fields = text.split(' ');
        let tag = fields.next()?;
        let (version, hash) = match tag.as_bytes() {
            [b'N', b'V', b'M', b'e', v @ (b'0' | b'1'), b'R', b'0', h @ (b'1' | b'2')] => {
                (v - b'0', HashFunction::from_id(h - b'0')?)
            }
            _ => return None,
        };
        let host_nqn = fields.next().filter(|f| !f.is_empty())?.to_string();
        let subsystem_nqn = fields.next().filter(|f| !f.is_empty())?.to_string();
        let digest = match version {
            0 => None,
            _ => Some(fields.next().filter(|f| !f.is_empty())?.to_string()),
        };
        if fields.next().is_some() {
            return None;
        }
        Some(Identity {
            version,
            hash,
            host_nqn,
            subsystem_nqn,
            digest,
        })
    }

    /// The identity a host with `psk` offers to connect to `subsystem_nqn`
    /// (as `nvme check-tls-key --insert --identity=V` writes it).
    pub fn of(psk: &ConfiguredPsk, version: u8, host_nqn: &str, subsystem_nqn: &str) -> Identity {
        assert!(version <= 1, "identity versions are 0 and 1");
        let mut identity = Identity {
            version,
            hash: psk.hash,
            host_nqn: host_nqn.to_string(),
            subsystem_nqn: subsystem_nqn.to_string(),
            digest: None,
        };
        if version == 1 {
            let retained = psk.retained(host_nqn, LabelForm::Libnvme);
            identity.digest = Some(identity.digest_under(&retained));
        }
        identity
    }

    /// The TLS PSKs this identity may stand for under `psk`, the host's
    /// configured key: one per form of the derivation whose version-1
    /// digest (if any) matches; the handshake's binder tells which one the
    /// host holds. Empty if `psk` is not the key the identity names.
    pub fn tls_psks(&self, psk: &ConfiguredPsk) -> Vec<Vec<u8>> {
        if psk.hash != self.hash {
            return Vec::new();
        }
        [LabelForm::Libnvme, LabelForm::Rfc8446]
            .into_iter()
            .filter_map(|form| {
                let retained = psk.retained(&self.host_nqn, form);
                let context = match &self.digest {
                    None => self.to_string().into_bytes(),
                    Some(digest) => {
                        if *digest != self.digest_under(&retained) {
                            return None;
                        }
                        format!("{:02} {digest}", self.hash.id()).into_bytes()
                    }
                };
                let prk = hkdf::extract(self.hash, &[], &retained);
                let mut tls_psk = vec![0u8; retained.len()];
                form.expand(
                    self.hash,
                    prk.as_ref(),
                    b"nvme-tls-psk",
                    &context,
                    &mut tls_psk,
                );
                Some(tls_psk)
            })
            .collect()
    }

    fn digest_under(&self, retained: &[u8]) -> String {
        let mac = self.hash.hmac(
            retained,
            &[
                self.host_nqn.as_bytes(),
                b" ",
                self.subsystem_nqn.as_bytes(),
                b" NVMe-over-Fabrics",
            ],
        );
        base64_encode(mac.as_ref())
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NVMe{}R{:02} {} {}",
            self.version,
            self.hash.id(),
            self.host_nqn,
            self.subsystem_nqn
        )?;
        match &self.digest {
            Some(digest) => write!(f, " {digest}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Vectors: libnvme's test/psk.c keys, derived by nvme-cli 2.13 itself
    //! (`nvme check-tls-key --insert --keytype=user`, read back with keyctl).
    use super::*;

    const HOST: &str = "nqn.psk-test-host";
    const SUBSYSTEM: &str = "nqn.psk-test-subsys";
    const KEY_01: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const KEY_02: &str =
        "NVMeTLSkey-1:02:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwP/w0S89ELi3W2LxIcLXVsDn8kXZQ==:";

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn configured_keys_parse_check_their_crc_and_print_back() {
        for text in [KEY_01, KEY_02] {
            assert_eq!(ConfiguredPsk::parse(text).unwrap().to_string(), text);
        }
        let key = ConfiguredPsk::parse(KEY_01).unwrap();
        assert_eq!(
            hex(&key.key),
            "5512dbb6737d0106f65975b773dfb011ffc344bcf442e2dd6d8bc4870b5d5b03"
        );
        let mistyped = KEY_01.replace("VRLb", "VRLc");
        assert_eq!(ConfiguredPsk::parse(&mistyped), Err(PskError::Crc));
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:03:AAAA:"),
            Err(PskError::Hash)
        );
        assert_eq!(
            ConfiguredPsk::parse("NVMeTLSkey-1:01:AAAA:"),
            Err(PskError::Length)
        );
        assert_eq!(
            ConfiguredPsk::parse("DHHC-1:01:AAAA:"),
            Err(PskError::Format)
        );
        assert!(
            !format!("{key:?}").contains("VRLb"),
            "Debug never shows the key"
        );
    }

    #[test]
    fn retained_keys_are_nvme_clis() {
        let key = ConfiguredPsk::parse(KEY_01).unwrap();
        assert_eq!(
            hex(&key.retained(HOST, LabelForm::Libnvme)),
            "ad4cdadfcbaf4e353fcbd09aac891c4d75c5300fe5ee7bb04ae87726a312eddc"
        );
        let key = ConfiguredPsk::parse(KEY_02).unwrap();
        assert_eq!(
            hex(&key.retained(HOST, LabelForm::Libnvme)),
            "12d2452bc4783f50286bf940ad1caa05a304065e379024d9278ca7c9d8a42400c47029f198bfcdf5f14c07cb04eb7306"
        );
    }

    #[test]
    fn identities_and_tls_psks_are_nvme_clis() {
        let cases = [
            (KEY_01, 0, "NVMe0R01 nqn.psk-test-host nqn.psk-test-subsys",
             "09fb1983ac6d6d0353e7cae4f23daddd651c367fa347c59d9cf6936f5a83eafb"),
            (KEY_01, 1, "NVMe1R01 nqn.psk-test-host nqn.psk-test-subsys 66GuqV08TsAGII39teWUfwQwizjv06Jy8jOcX3NAAzM=",
             "b9f5ab2a41ba6e72a23a12066302a2f775fa6c0942c8e0b18ca8ac07edf305e2"),
            (KEY_02, 0, "NVMe0R02 nqn.psk-test-host nqn.psk-test-subsys",
             "2ee4754186a625b28a3936ef4a40d839c3ad958b2e017562ee07e2501f172ce999dc9c29033ea7ee33f814f192c13f47"),
            (KEY_02, 1, "NVMe1R02 nqn.psk-test-host nqn.psk-test-subsys RsKmYJ3nAn1ApjjMloJFbAkLPivONDAX/xW327YBUsn2eGShXSjCZvBaOxscLqmz",
             "fcefe2e2a2e682b1447dcabf1ec268f78f08c63cd075753abcc8bda2c5c34d48d3014aa8d76ad80107e4f5c9f27e2149"),
        ];
        for (text, version, identity, tls_psk) in cases {
            let key = ConfiguredPsk::parse(text).unwrap();
            let made = Identity::of(&key, version, HOST, SUBSYSTEM);
            assert_eq!(made.to_string(), identity);
            let parsed = Identity::parse(identity.as_bytes()).unwrap();
            assert_eq!(parsed, made);
            assert_eq!(parsed.host_nqn, HOST);
            assert_eq!(parsed.subsystem_nqn, SUBSYSTEM);
            let candidates = parsed.tls_psks(&key);
            assert_eq!(hex(&candidates[0]), tls_psk, "{identity}");
        }
    }

    #[test]
    fn the_rfc_form_is_a_second_candidate() {
        let key = ConfiguredPsk::parse(KEY_01).unwrap();
        let identity = Identity::of(&key, 0, HOST, SUBSYSTEM);
        let candidates = identity.tls_psks(&key);
        assert_eq!(candidates.len(), 2);
        // libnvme 1.16's form, computed by the same steps with RFC 8446 labels.
        assert_eq!(
            hex(&candidates[1]),
            "05c6503551ad136e6ee32e6eeb3f6d500b69701d84ec71e328f65c7f51566f68"
        );
    }

    #[test]
    fn another_key_or_a_forged_digest_gives_no_psk() {
        let key = ConfiguredPsk::parse(KEY_01).unwrap();
        let other = ConfiguredPsk::parse(KEY_02).unwrap();
        let identity = Identity::of(&key, 1, HOST, SUBSYSTEM);
        assert!(identity.tls_psks(&other).is_empty(), "another hash");
        let forged = identity.to_string().replace("66Gu", "77Gu");
        let forged = Identity::parse(forged.as_bytes()).unwrap();
        assert!(forged.tls_psks(&key).is_empty());
    }

    #[test]
    fn only_nvmes_identities_parse() {
        for bad in [
            "",
            "NVMe0R01",
            "NVMe0R01 host",
            "NVMe0R03 host sub",
            "NVMe2R01 host sub",
            "NVMe0G01 host sub",
            "NVMe0R01 host sub extra",
            "NVMe1R01 host sub",
            "NVMe0R01  sub",
        ] {
            assert_eq!(Identity::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }
}
