//! Stable identities: a node ID created once in the data directory, and the
//! serial numbers, NGUIDs, UUIDs and EUI-64s derived from it, so a host that
//! reconnects after a restart sees the same disks.

use std::fs;
use std::io::{self, Read};
use std::path::Path;

/// File name of the node identity in the data directory.
pub const FILE_NAME: &str = "node-id";

/// 16 random bytes, persisted as hex in `<data dir>/node-id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeId(pub [u8; 16]);

impl NodeId {
    /// Loads the node ID, creating it (and the data directory) on first start.
    /// A file that exists but does not hold an ID (e.g. emptied by a power cut
    /// on a filesystem that lost its data) is an error, never a reason to make
    /// a new one: new serial numbers and NGUIDs would show every host new disks.
    pub fn load_or_create(data_dir: &Path) -> io::Result<NodeId> {
        let path = data_dir.join(FILE_NAME);
        match fs::read_to_string(&path) {
            Ok(text) => parse_hex16(text.trim()).map(NodeId).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is damaged (it should hold 32 hex digits, it holds {} bytes). \
                         Hosts know this node's disks by serial numbers and namespace IDs derived \
                         from it: restore it from a backup or from weft's log (\"node id ...\" at \
                         every start). Only to give every disk of this node a new identity on \
                         purpose, remove it.",
                        path.display(),
                        text.len()
                    ),
                )
            }),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                let bytes = random_bytes()?;
                weft_control::durable::write_file(
                    &path,
                    format!("{}\n", hex(&bytes)).as_bytes(),
                    0o644,
                )?;
                Ok(NodeId(bytes))
            }
            Err(error) => Err(error),
        }
    }

    /// A 128-bit value derived from this node and `parts` (FNV-1a, 128 bit).
    pub fn derive(&self, parts: &[&[u8]]) -> [u8; 16] {
        const OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
        const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
        let mut hash = OFFSET_BASIS;
        for part in std::iter::once(&self.0[..]).chain(parts.iter().copied()) {
            for &byte in part {
                hash ^= u128::from(byte);
                hash = hash.wrapping_mul(PRIME);
            }
            // Separator, so ("ab","c") and ("a","bc") differ.
            hash ^= 0xff;
            hash = hash.wrapping_mul(PRIME);
        }
        hash.to_be_bytes()
    }

    /// A 20-character serial number for `subnqn`.
    pub fn serial(&self, subnqn: &str) -> String {
        hex(&self.derive(&[b"serial", subnqn.as_bytes()]))[..20].to_string()
    }

    /// NGUID, UUID (version 4 layout) and EUI-64 of namespace `nsid` in `subnqn`.
    pub fn namespace_ids(&self, subnqn: &str, nsid: u32) -> ([u8; 16], [u8; 16], [u8; 8]) {
        let nsid = nsid.to_be_bytes();
        let nguid = self.derive(&[b"nguid", subnqn.as_bytes(), &nsid]);
        let mut uuid = self.derive(&[b"uuid", subnqn.as_bytes(), &nsid]);
        uuid[6] = (uuid[6] & 0x0f) | 0x40;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(&self.derive(&[b"eui64", subnqn.as_bytes(), &nsid])[..8]);
        (nguid, uuid, eui64)
    }
}

/// `N` bytes from the kernel's random source.
pub fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // One allocation: this runs for every volume at every exports rebuild.
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(DIGITS[usize::from(byte >> 4)]));
        text.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    text
}

/// 16 bytes from 32 hex digits (dashes, as in a UUID, are skipped).
pub fn parse_hex16(text: &str) -> Option<[u8; 16]> {
    let text: String = text.chars().filter(|c| *c != '-').collect();
    parse_hex(&text)?.try_into().ok()
}

/// Bytes from hex digits (an even number of them).
pub fn parse_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_persists_and_derivations_are_stable() {
        let dir = std::env::temp_dir().join(format!("weft-identity-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = NodeId::load_or_create(&dir).unwrap();
        let second = NodeId::load_or_create(&dir).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.serial("nqn.a"), second.serial("nqn.a"));
        assert_ne!(first.serial("nqn.a"), first.serial("nqn.b"));
        let (nguid, uuid, _) = first.namespace_ids("nqn.a", 1);
        assert_ne!(nguid, first.namespace_ids("nqn.a", 2).0);
        assert_eq!(uuid[6] >> 4, 4, "UUID version 4 layout");
        assert!(!dir.join("node-id.tmp").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A power cut that left the file empty or torn: an error that says how to
    /// recover, and the file is left alone (no new identity).
    #[test]
    fn a_damaged_identity_is_an_error_not_a_new_node() {
        let dir = std::env::temp_dir().join(format!("weft-identity-torn-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for damaged in ["", "3f2a", "garbage\n"] {
            fs::write(dir.join("node-id"), damaged).unwrap();
            let error = NodeId::load_or_create(&dir).unwrap_err().to_string();
            assert!(error.contains("is damaged"), "{error}");
            assert!(error.contains("restore it from a backup"), "{error}");
            assert_eq!(fs::read_to_string(dir.join("node-id")).unwrap(), damaged);
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fixed_vector() {
        let node = NodeId([0; 16]);
        assert_eq!(node.serial("nqn.2026-11.io.weft:default").len(), 20);
        assert_eq!(node.derive(&[]), NodeId([0; 16]).derive(&[]));
    }
}
