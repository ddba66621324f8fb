//! Keys: a volume's data key, random, kept on the pool only wrapped
//! (AES-256-GCM) by a key-encryption key (KEK) that weft never stores; the
//! KEKs a node holds form its keyring. The first KEK wraps new and rotated
//! keys; every KEK unwraps (rotation: put the new KEK first, rewrap, then
//! drop the old one — the way Kubernetes' encryption providers rotate).
//!
//! A KEK is derived (HKDF-SHA256) from whatever the operator supplies — a
//! line of a key file, or of a command's output — so its format is free,
//! but it must carry at least 32 bytes (e.g. `openssl rand -hex 32`). Its
//! id (8 bytes of an HMAC under it) is stored next to each wrapped key, so
//! that a missing KEK is named rather than guessed.
//!
//! What this module does not do: read files or run commands (the node
//! does, and hands the text to [`Keyring::parse`]).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::fmt;
use thiserror::Error;
use zeroize::Zeroize;

/// Bytes of a data key: two AES-256 keys (data and tweak).
pub const DATA_KEY_BYTES: usize = 64;
/// Fewest bytes of key material a KEK is derived from.
pub const KEK_MATERIAL_BYTES_MIN: usize = 32;
const TAG_BYTES: usize = 16;
/// Bytes of a wrapped key on the pool.
pub const WRAPPED_KEY_BYTES: usize = 8 + NONCE_LEN + DATA_KEY_BYTES + TAG_BYTES;

/// A volume's data key (erased from memory when dropped).
#[derive(Clone)]
pub struct DataKey([u8; DATA_KEY_BYTES]);

impl Drop for DataKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl DataKey {
    /// A fresh random key.
    pub fn generate() -> Result<DataKey, KeyError> {
        let mut key = [0u8; DATA_KEY_BYTES];
        SystemRandom::new()
            .fill(&mut key)
            .map_err(|_| KeyError::Random)?;
        Ok(DataKey(key))
    }

    /// A given key (tests).
    pub fn from_bytes(bytes: [u8; DATA_KEY_BYTES]) -> DataKey {
        DataKey(bytes)
    }

    /// The data and tweak halves.
    pub(super) fn halves(&self) -> (&[u8; 32], &[u8; 32]) {
        let (data, tweak) = self.0.split_at(32);
        (
            data.try_into().expect("32 bytes"),
            tweak.try_into().expect("32 bytes"),
        )
    }
}

/// The id of a key-encryption key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub [u8; 8]);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// A key-encryption key.
pub struct Kek {
    key: [u8; 32],
    id: KeyId,
}

impl Drop for Kek {
    fn drop(&mut self) {
        self.key.zeroize();
    }
}

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key-encryption key {}", self.id)
    }
}

impl Kek {
    /// Derives a KEK from `material` (surrounding whitespace ignored).
    pub fn derive(material: &[u8]) -> Result<Kek, KeyError> {
        let material = material.trim_ascii();
        if material.len() < KEK_MATERIAL_BYTES_MIN {
            return Err(KeyError::Short {
                bytes: material.len(),
            });
        }
        let salt = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"weft kek v1");
        let mut key = [0u8; 32];
        salt.extract(material)
            .expand(&[b"weft key-encryption key"], ring::hkdf::HKDF_SHA256)
            .and_then(|okm| okm.fill(&mut key))
            .expect("32 bytes is a valid HKDF-SHA256 output length");
        let tag = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
            b"weft key id",
        );
        let id = KeyId(tag.as_ref()[..8].try_into().expect("8 bytes"));
        Ok(Kek { key, id })
    }

    /// Its id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &self.key).expect("a 32-byte key"))
    }

    /// Wraps `key` for the pool `pool_uuid` (bound to it: a wrapped key
    /// copied to another pool does not unwrap).
    pub fn wrap(&self, key: &DataKey, pool_uuid: &[u8; 16]) -> Result<WrappedKey, KeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| KeyError::Random)?;
        let mut sealed = key.0.to_vec();
        self.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(pool_uuid),
                &mut sealed,
            )
            .map_err(|_| KeyError::Random)?;
        let mut bytes = [0u8; WRAPPED_KEY_BYTES];
        bytes[..8].copy_from_slice(&self.id.0);
        bytes[8..8 + NONCE_LEN].copy_from_slice(&nonce);
        bytes[8 + NONCE_LEN..].copy_from_slice(&sealed);
        sealed.zeroize();
        Ok(WrappedKey(bytes))
    }

    fn unwrap(&self, wrapped: &WrappedKey, pool_uuid: &[u8; 16]) -> Option<DataKey> {
        let nonce = wrapped.0[8..8 + NONCE_LEN].try_into().expect("nonce");
        let mut sealed = wrapped.0[8 + NONCE_LEN..].to_vec();
        let opened = self
            .aead()
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(pool_uuid),
                &mut sealed,
            )
            .ok()
            .map(|plain| DataKey(plain.try_into().expect("64 bytes")));
        sealed.zeroize();
        opened
    }
}

/// A data key as the pool stores it: the KEK's id, the nonce, the sealed
/// key and its tag.
#[derive(Clone, PartialEq, Eq)]
pub struct WrappedKey(pub [u8; WRAPPED_KEY_BYTES]);

impl fmt::Debug for WrappedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "data key wrapped by {}", self.kek_id())
    }
}

impl WrappedKey {
    /// The KEK it is wrapped with.
    pub fn kek_id(&self) -> KeyId {
        KeyId(self.0[..8].try_into().expect("8 bytes"))
    }
}

/// The KEKs a node holds; the first wraps.
#[derive(Debug, Default)]
pub struct Keyring {
    keys: Vec<Kek>,
}

impl Keyring {
    /// A keyring of these KEKs, the first current.
    pub fn new(keys: Vec<Kek>) -> Keyring {
        Keyring { keys }
    }

    /// One KEK per line of `text` (blank lines and `#` comments skipped).
    pub fn parse(text: &str) -> Result<Keyring, KeyError> {
        let keys = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .enumerate()
            .map(|(n, line)| {
                Kek::derive(line.as_bytes()).map_err(|error| KeyError::Line {
                    line: n + 1,
                    reason: error.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Keyring { keys })
    }

    /// The KEK that wraps.
    pub fn current(&self) -> Option<&Kek> {
        self.keys.first()
    }

    /// The ids of every KEK, the current first.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys.iter().map(Kek::id).collect()
    }

    /// The data key in `wrapped`, if a KEK here wraps it.
    pub fn unwrap(&self, wrapped: &WrappedKey, pool_uuid: &[u8; 16]) -> Result<DataKey, KeyError> {
        let id = wrapped.kek_id();
        let kek = self
            .keys
            .iter()
            .find(|kek| kek.id == id)
            .ok_or(KeyError::Missing { id })?;
        kek.unwrap(wrapped, pool_uuid)
            .ok_or(KeyError::Damaged { id })
    }
}

/// What is wrong with a key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// Key material too short to derive a KEK from.
    #[error("a key-encryption key needs at least {KEK_MATERIAL_BYTES_MIN} bytes of key material, this one has {bytes}; make one with `openssl rand -hex 32`")]
    Short {
        /// Bytes given.
        bytes: usize,
    },
    /// A keyring line that is not a key.
    #[error("key {line}: {reason}")]
    Line {
        /// The key's position (blank and comment lines not counted).
        line: usize,
        /// Why.
        reason: String,
    },
    /// A keyring source that holds no key.
    #[error("the key source holds no key; put one key per line (`openssl rand -hex 32`)")]
    Empty,
    /// The KEK a data key is wrapped with is not in the keyring.
    #[error("key-encryption key {id} is not in this node's keyring; start weft serve with a --kek-file or --kek-command that provides it")]
    Missing {
        /// The KEK's id.
        id: KeyId,
    },
    /// The KEK is there but the wrapped key does not open: damaged metadata.
    #[error(
        "the data key wrapped by key-encryption key {id} does not unwrap: its metadata is damaged"
    )]
    Damaged {
        /// The KEK's id.
        id: KeyId,
    },
    /// The system's random source failed.
    #[error("the system's random number generator failed")]
    Random,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATERIAL: &str = "2f1c6b0a9e8d7c6b5a4f3e2d1c0b0a09f8e7d6c5b4a392817f6e5d4c3b2a1908";

    #[test]
    fn wraps_and_unwraps_bound_to_the_pool_and_the_kek() {
        let ring = Keyring::parse(&format!("# node key\n\n{MATERIAL}\n")).unwrap();
        let key = DataKey::from_bytes([9; 64]);
        let wrapped = ring.current().unwrap().wrap(&key, &[1; 16]).unwrap();
        assert_eq!(wrapped.kek_id(), ring.ids()[0]);
        assert!(!wrapped.0.windows(8).any(|w| w == [9; 8]), "sealed");
        assert_eq!(ring.unwrap(&wrapped, &[1; 16]).unwrap().0, [9; 64]);
        assert_eq!(
            ring.unwrap(&wrapped, &[2; 16]).err(),
            Some(KeyError::Damaged { id: ring.ids()[0] })
        );
        let mut damaged = wrapped.clone();
        damaged.0[40] ^= 1;
        assert!(matches!(
            ring.unwrap(&damaged, &[1; 16]),
            Err(KeyError::Damaged { .. })
        ));
        let other = Keyring::parse(&MATERIAL.replace('2', "3")).unwrap();
        assert_eq!(
            other.unwrap(&wrapped, &[1; 16]).err(),
            Some(KeyError::Missing { id: ring.ids()[0] })
        );
    }

    #[test]
    fn the_first_kek_wraps_and_every_kek_unwraps() {
        let old = Keyring::parse(MATERIAL).unwrap();
        let wrapped = old
            .current()
            .unwrap()
            .wrap(&DataKey::from_bytes([3; 64]), &[0; 16])
            .unwrap();
        let rotated = Keyring::parse(&format!("{}\n{MATERIAL}", "n".repeat(40))).unwrap();
        assert_ne!(rotated.ids()[0], old.ids()[0]);
        assert_eq!(rotated.ids()[1], old.ids()[0]);
        assert_eq!(rotated.unwrap(&wrapped, &[0; 16]).unwrap().0, [3; 64]);
    }

    #[test]
    fn refuses_short_material_and_empty_sources() {
        assert_eq!(Keyring::parse("# nothing\n").err(), Some(KeyError::Empty));
        let error = Keyring::parse(&format!("{MATERIAL}\nshort\n")).unwrap_err();
        assert!(error.to_string().starts_with("key 2: "), "{error}");
        assert!(error.to_string().contains("openssl rand -hex 32"));
    }

    #[test]
    fn the_id_is_stable() {
        // Stored next to every wrapped key: it must never change.
        let id = Kek::derive(MATERIAL.as_bytes()).unwrap().id();
        assert_eq!(id.to_string(), "f0a8e0aa7211dcd2");
        assert_eq!(
            id,
            Kek::derive(format!(" {MATERIAL}\n").as_bytes())
                .unwrap()
                .id()
        );
    }
}
