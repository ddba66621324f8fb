//! weft's volume manager: pools of member devices carved into thin (or
//! thick) volumes with snapshots, clones, flatten and online growth, on a
//! versioned, checksummed, crash-atomic on-disk format (docs/VOLUME-FORMAT.md).
//!
//! - `format`: superblock, journal record and checkpoint framing (bytes on disk).
//! - `state`: the metadata state machine (volumes, snapshots, chunk maps,
//!   reference counts) changed only by records, so replay equals run time.
//! - `pool`: the operations, allocation, copy-on-write, zeroing and commit.
//! - `map`: the lock-free chunk map and I/O gate the data plane shares.
//! - `media`: the devices (files or block devices) the pool lives on.
//! - `crypt`: encryption at rest (AES-256-XTS per volume) and its keys.
//! - `compression`, `extents`: compressed volumes' units (lz4 or zstd)
//!   and where their extents are.
//! - `tier`: a write tier's log (a ring of group-committed batches on a
//!   fast device, destaged to the pool later).
//! - `testing`: in-memory media that fails, tears and loses writes, for the
//!   crash tests and the fuzz target.
//!
//! The manager's own I/O is synchronous and runs off the data path; the data
//! plane looks chunks up in memory (one atomic load) and does volume I/O
//! itself. This crate knows nothing about NVMe, the network or the API.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod codec;
pub mod compression;
pub mod crypt;
pub mod extents;
pub mod format;
pub mod map;
pub mod media;
pub mod pool;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tier;

pub use map::{ChunkMap, Lookup, WriteGate};
pub use media::{DevicePath, FileMedia, Media};
pub use pool::{
    GroupWrite, MemberUsage, Pool, PoolInfo, PoolOptions, TierInfo, VolumeInfo, VolumeSpec,
};

use thiserror::Error;

/// Volumes (clones included) one pool holds at most.
pub const VOLUMES_MAX: usize = 1024;
/// Snapshots one volume holds at most.
pub const SNAPSHOTS_PER_VOLUME_MAX: usize = 256;
/// Longest pool, volume or snapshot name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;
/// Largest volume, in allocation units (16 TiB at 1 MiB): bounds the
/// in-memory map (8 bytes per unit).
pub const VOLUME_CHUNKS_MAX: u64 = 1 << 24;

/// What went wrong with a volume operation. Each message says what to do.
#[derive(Debug, Error)]
pub enum VolumeError {
    /// No such pool, volume or snapshot.
    #[error("{kind} {name} does not exist")]
    NotFound {
        /// "pool", "volume" or "snapshot".
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// The name is taken.
    #[error("{kind} {name} already exists; choose another name")]
    Exists {
        /// "pool", "volume" or "snapshot".
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A parameter is out of range or malformed.
    #[error("invalid {what}: {hint}")]
    Invalid {
        /// What was wrong.
        what: String,
        /// What to do instead.
        hint: String,
    },
    /// A stated limit would be exceeded.
    #[error("{0}")]
    Limit(String),
    /// Deleting a volume that still has snapshots.
    #[error("volume {volume} has snapshots ({snapshots}); delete them first with `weft snapshot delete {volume}@NAME`")]
    HasSnapshots {
        /// The volume.
        volume: String,
        /// Its snapshots.
        snapshots: String,
    },
    /// Not enough free allocation units.
    #[error("pool {pool} is full: {needed} allocation units needed, {free} free; delete snapshots or volumes, or move volumes to another pool")]
    PoolFull {
        /// The pool.
        pool: String,
        /// Units the operation needs.
        needed: u64,
        /// Units free.
        free: u64,
    },
    /// The change would not fit in a checkpoint, and the checkpoints cannot be extended.
    #[error("pool {pool} has no room left for metadata: its checkpoints need more allocation units and none is free; delete snapshots, clones or volumes, or add devices with `weft pool add-device`")]
    MetadataFull {
        /// The pool.
        pool: String,
    },
    /// A device failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A metadata write or a sync failed earlier; the pool refuses changes and flushes.
    #[error("pool {pool} has failed ({reason}) and refuses changes and flushes; once its devices work, run `weft pool clear-failure {pool}` to reopen it at its last committed state")]
    Failed {
        /// The pool.
        pool: String,
        /// The failure.
        reason: String,
    },
    /// The devices do not hold an openable pool.
    #[error("{0}")]
    Corrupt(String),
    /// An encrypted volume whose data key this node cannot unwrap.
    #[error("volume {volume} is encrypted and locked: {source}")]
    Locked {
        /// The volume.
        volume: String,
        /// Why its key does not unwrap.
        #[source]
        source: crypt::KeyError,
    },
    /// Encryption asked of a node that holds no key-encryption key.
    #[error("volume {volume} cannot be encrypted: this node has no key-encryption key; start weft serve with --kek-file PATH (one key per line, e.g. from `openssl rand -hex 32`) or --kek-command CMD")]
    NoKeyring {
        /// The volume.
        volume: String,
    },
}

impl VolumeError {
    /// An `Invalid` error.
    pub fn invalid(what: impl Into<String>, hint: impl Into<String>) -> VolumeError {
        VolumeError::Invalid {
            what: what.into(),
            hint: hint.into(),
        }
    }
}

/// Checks a pool, volume or snapshot name: 1 to 64 bytes of ASCII letters,
/// digits, '.', '_' and '-', starting with a letter or digit (it becomes part
/// of an NQN, a file name and a URL path).
pub fn check_name(kind: &str, name: &str) -> Result<(), VolumeError> {
    let problem = if name.is_empty() || name.len() > NAME_BYTES_MAX {
        Some(format!("use 1 to {NAME_BYTES_MAX} characters"))
    } else if !name.as_bytes()[0].is_ascii_alphanumeric() {
        Some("start with a letter or digit".to_string())
    } else {
        name.chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
            .map(|c| format!("{c:?} is not allowed: use letters, digits, '.', '_' and '-'"))
    };
    match problem {
        Some(hint) => Err(VolumeError::invalid(format!("{kind} name {name:?}"), hint)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_with_a_reason() {
        for good in ["db1", "a", "x.y_z-1", &"n".repeat(64)] {
            assert!(check_name("volume", good).is_ok(), "{good}");
        }
        let message = |name: &str| check_name("volume", name).unwrap_err().to_string();
        assert!(message("").contains("1 to 64"));
        assert!(message(&"n".repeat(65)).contains("1 to 64"));
        assert!(message("-x").contains("start with"));
        assert!(message("db@1").contains("'@' is not allowed"));
        assert!(message("a/b").contains("'/' is not allowed"));
    }
}
