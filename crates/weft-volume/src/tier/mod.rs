//! A write tier's log: writes made durable on a small fast device, in a
//! circular log of group-committed batches, and moved ("destaged") to the
//! capacity devices later (docs/DATA-SERVICES-DESIGN.md, "the write tier").
//!
//! - `format`: the tier's superblock and a batch's header (bytes on disk).
//! - `ring`: one ring: where its batches are, where the next one goes, and
//!   its replay from its tail after a crash.
//! - `log`: the tier: its rings (one per writer), appending batches (one
//!   write and one sync each: the group commit), each block's newest copy,
//!   destage in pool order, and the superblock that records it.
//! - `presence`: which regions of the volumes have blocks in the tier, for
//!   the data plane's reads.
//!
//! The device:
//!
//! ```text
//! | super A | super B | ring 0: batch | batch | wrap ... | ring 1: ... |
//! ```
//!
//! A batch is one header block (its ring's sequence, its extents: volume,
//! first block, block count, the pool-wide order of each write; CRCs of
//! the header and of the data) followed by the data. The superblock (two
//! copies written in turn, so that a torn one leaves the other) names each
//! ring's tail and the pool order up to which every write is on the
//! capacity devices. Replay starts at each ring's tail and follows
//! consecutive sequences; the first batch whose header or data does not
//! check ends the ring (it was never acknowledged: a batch is acknowledged
//! only once it and every batch before it in its ring are durable).
//!
//! What this does not do (yet): run in the data plane's reactors (a ring
//! each), know about pools and volumes beyond their numbers, or trim (a
//! deallocation must destage a volume's batches first).

pub mod format;
mod log;
mod presence;
mod ring;

pub use format::VolumeId;
pub use presence::TierPresence;

/// Whether member `member` of `media` holds a write tier's superblock (of
/// any tier): a device to keep from being formatted over.
pub fn probe<M: crate::Media>(media: &mut M, member: usize) -> bool {
    let mut block = vec![0; TIER_BLOCK_BYTES as usize];
    (0..2).any(|copy| {
        media
            .read_at(member, copy * TIER_BLOCK_BYTES, &mut block)
            .is_ok_and(|()| format::is_superblock(&block))
    })
}
pub use log::{Destaged, TierLog, TierWrite};

use thiserror::Error;

/// The tier's unit: a batch's header, and each block of data, is this long.
pub const TIER_BLOCK_BYTES: u64 = 4096;

/// What went wrong with a tier.
#[derive(Debug, Error)]
pub enum TierError {
    /// A batch that does not fit the free part of the ring: destage first
    /// (the caller slows writes to the destage rate).
    #[error(
        "the write tier is full: {needed} bytes needed, {free} free; writes wait for the destage"
    )]
    Full {
        /// Bytes the batch needs.
        needed: u64,
        /// Bytes free.
        free: u64,
    },
    /// A batch the tier cannot take at all.
    #[error("invalid write for the tier: {0}")]
    Invalid(String),
    /// The device failed; the tier (and its pool) refuses everything since.
    #[error("write tier device: {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A write or sync failed earlier: what the ring holds past the last
    /// durable batch is unknown until it is opened again.
    #[error("the write tier has failed ({0}); it must be opened again once its device works")]
    Failed(String),
    /// The device holds no tier, or another pool's.
    #[error("{0}")]
    Corrupt(String),
}
