//! Encryption at rest: a volume's blocks in AES-256-XTS (IEEE 1619, the mode
//! dm-crypt, BitLocker and self-encrypting drives use for block devices),
//! one data unit per logical block, the unit's number the tweak.
//!
//! XTS because a block device rewrites blocks in place and has no room for
//! a nonce or a tag per block: the ciphertext of a block is the size of its
//! plaintext, the same plaintext at two addresses encrypts differently, and
//! a block can be read or written alone. It does not authenticate (no mode
//! without room per block can): a changed ciphertext decrypts to garbage in
//! that one block, as on dm-crypt.
//!
//! The tweak is the block's number on the *volume*, not where it lies on the
//! pool: copy on write, snapshots and clones move or share chunks as they
//! are, and a chunk copied somewhere else still decrypts.
//!
//! A block whose stored bytes are all zero reads as zeroes (it is not
//! decrypted): the pool zeroes (or punches) fresh chunks and Write Zeroes
//! ranges without knowing any key. What this reveals to whoever holds the
//! devices is which blocks were never written or were zeroed — what
//! dm-crypt with discards reveals. Zeroes written by a host are encrypted
//! like any data. (The ciphertext of a block is all zero with probability
//! 2^-4096 per 512 bytes: never.)
//!
//! What this module does not do: keep keys (see [`keys`]) or decide which
//! volume is encrypted (the pool's records do).

pub mod keys;

use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use aes::{Aes256, Block};
pub use keys::{DataKey, Kek, KeyError, KeyId, Keyring, WrappedKey};

/// Blocks of 16 bytes XTS processes per batch (AES-NI pipelines them).
const BATCH_BLOCKS: usize = 32;
const BATCH_BYTES: usize = BATCH_BLOCKS * 16;

/// One volume's cipher: AES-256-XTS keyed by its data key, with the volume's
/// logical block as the data unit.
pub struct VolumeCipher {
    data: Aes256,
    tweak: Aes256,
    unit_shift: u32,
    /// Kept to wrap it anew while its old KEK is gone from the keyring.
    key: DataKey,
}

impl std::fmt::Debug for VolumeCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AES-256-XTS ({}-byte units)", self.unit_bytes())
    }
}

impl VolumeCipher {
    /// The cipher of a volume of `block_size`-byte blocks (512 or 4096).
    pub fn new(key: &DataKey, block_size: u32) -> VolumeCipher {
        assert!(
            block_size.is_power_of_two() && block_size as usize >= BATCH_BYTES,
            "a data unit is a power of two of at least {BATCH_BYTES} bytes"
        );
        let (data, tweak) = key.halves();
        VolumeCipher {
            data: Aes256::new(data.into()),
            tweak: Aes256::new(tweak.into()),
            unit_shift: block_size.trailing_zeros(),
            key: key.clone(),
        }
    }

    /// The data key (to wrap it anew).
    pub(crate) fn data_key(&self) -> &DataKey {
        &self.key
    }

    /// Whether `[volume_offset, + len)` is in whole units.
    pub fn aligned(&self, volume_offset: u64, len: usize) -> bool {
        let unit = u64::from(self.unit_bytes());
        volume_offset.is_multiple_of(unit) && (len as u64).is_multiple_of(unit)
    }

    /// Bytes per data unit (the volume's block size).
    pub fn unit_bytes(&self) -> u32 {
        1 << self.unit_shift
    }

    /// Encrypts `data`, the bytes at `volume_offset` of the volume, in place.
    /// Both are whole units (NVMe I/O is in whole logical blocks).
    pub fn encrypt(&self, volume_offset: u64, data: &mut [u8]) {
        for (index, unit) in self.units(volume_offset, data) {
            self.crypt_unit(index, unit, Direction::Encrypt);
        }
    }

    /// Decrypts `data`, read at `volume_offset` of the volume, in place; a
    /// unit stored as all zeroes stays zeroes (module docs).
    pub fn decrypt(&self, volume_offset: u64, data: &mut [u8]) {
        for (index, unit) in self.units(volume_offset, data) {
            if !is_zero(unit) {
                self.crypt_unit(index, unit, Direction::Decrypt);
            }
        }
    }

    fn units<'a>(
        &self,
        volume_offset: u64,
        data: &'a mut [u8],
    ) -> impl Iterator<Item = (u64, &'a mut [u8])> {
        let unit = self.unit_bytes() as usize;
        assert!(
            volume_offset.is_multiple_of(unit as u64) && data.len().is_multiple_of(unit),
            "encrypted I/O is in whole {unit}-byte blocks"
        );
        let first = volume_offset >> self.unit_shift;
        data.chunks_exact_mut(unit)
            .enumerate()
            .map(move |(n, unit)| (first + n as u64, unit))
    }

    /// XTS over one unit: each 16-byte block XORed with its tweak, through
    /// AES, XORed again; the tweak starts as the unit's number encrypted
    /// with the tweak key and is multiplied by x in GF(2^128) per block.
    fn crypt_unit(&self, index: u64, unit: &mut [u8], direction: Direction) {
        let mut start = Block::from(u128::from(index).to_le_bytes());
        self.tweak.encrypt_block(&mut start);
        let mut tweak = u128::from_le_bytes(start.into());
        let mut tweaks = [[0u8; 16]; BATCH_BLOCKS];
        let mut blocks = [Block::default(); BATCH_BLOCKS];
        for batch in unit.chunks_exact_mut(BATCH_BYTES) {
            for t in tweaks.iter_mut() {
                *t = tweak.to_le_bytes();
                tweak = times_x(tweak);
            }
            // Byte-wise XORs over whole blocks: the compiler vectorises them.
            for ((block, t), bytes) in blocks.iter_mut().zip(&tweaks).zip(batch.chunks_exact(16)) {
                for ((b, t), x) in block.iter_mut().zip(t).zip(bytes) {
                    *b = x ^ t;
                }
            }
            match direction {
                Direction::Encrypt => self.data.encrypt_blocks(&mut blocks),
                Direction::Decrypt => self.data.decrypt_blocks(&mut blocks),
            }
            for ((block, t), bytes) in blocks.iter().zip(&tweaks).zip(batch.chunks_exact_mut(16)) {
                for ((x, t), b) in bytes.iter_mut().zip(t).zip(block) {
                    *x = b ^ t;
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Direction {
    Encrypt,
    Decrypt,
}

fn le(bytes: &[u8]) -> u128 {
    u128::from_le_bytes(bytes.try_into().expect("16 bytes"))
}

/// Multiplication by x in GF(2^128) modulo x^128 + x^7 + x^2 + x + 1, the
/// block read little-endian (IEEE 1619 section 5.2).
fn times_x(value: u128) -> u128 {
    (value << 1) ^ ((value >> 127) * 0x87)
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.chunks_exact(16).all(|block| le(block) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cipher(block_size: u32) -> VolumeCipher {
        let key: [u8; 64] = std::array::from_fn(|i| i as u8);
        VolumeCipher::new(&DataKey::from_bytes(key), block_size)
    }

    fn counting(len: usize) -> Vec<u8> {
        (0..len).map(|i| i as u8).collect()
    }

    /// The key 00..3f, data unit 5, the plaintext 00..ff twice: OpenSSL's
    /// EVP_aes_256_xts (the IV the unit number, little-endian) gives these
    /// first and last 32 bytes.
    #[test]
    fn matches_openssl_aes_256_xts() {
        let mut data = counting(512);
        cipher(512).encrypt(5 * 512, &mut data);
        assert_eq!(
            hex(&data[..32]),
            "f87ca2f29b117c1b024a6ec8e8c5994e76f7d16b43eed21e6936126969e00dab"
        );
        assert_eq!(
            hex(&data[480..]),
            "eb6523fbfb5ca033725f703578b7dbb0e790ce5900c47286caaef5e457fecc4b"
        );
    }

    #[test]
    fn round_trips_and_differs_per_unit_and_key() {
        let cipher = cipher(4096);
        let plain = vec![7u8; 3 * 4096];
        let mut data = plain.clone();
        cipher.encrypt(8192, &mut data);
        assert_ne!(data[..4096], data[4096..8192], "the tweak differs per unit");
        assert!(!data.windows(16).any(|w| w == [7u8; 16]));
        // Units are independent: the middle one alone decrypts the same.
        let mut middle = data[4096..8192].to_vec();
        cipher.decrypt(12288, &mut middle);
        assert_eq!(middle, plain[..4096]);
        cipher.decrypt(8192, &mut data);
        assert_eq!(data, plain);
    }

    #[test]
    fn stored_zeroes_read_as_zeroes_and_written_zeroes_are_encrypted() {
        let cipher = cipher(512);
        let mut written = vec![0u8; 1024];
        cipher.encrypt(0, &mut written);
        assert!(written.iter().any(|&b| b != 0));
        let mut stored = vec![0u8; 1024];
        stored[512..].copy_from_slice(&written[512..]);
        cipher.decrypt(0, &mut stored);
        assert_eq!(stored, vec![0u8; 1024]);
    }

    #[test]
    #[should_panic(expected = "whole 4096-byte blocks")]
    fn refuses_partial_units() {
        cipher(4096).encrypt(512, &mut [0u8; 4096]);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
