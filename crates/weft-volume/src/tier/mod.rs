//! A write tier's log: writes made durable on a small fast device, in a
//! circular log of group-committed batches, and moved ("destaged") to the
//! capacity devices later (docs/DATA-SERVICES-DESIGN.md, "the write tier").
//!
//! - `format`: the tier's superblock and a batch's header (bytes on disk).
//! - `log`: one ring: appending batches (one write and one sync each),
//!   finding a block's newest copy, destaging the oldest batches in order,
//!   and replaying the ring after a crash.
//!
//! The ring on the device, after two superblock copies (written in turn, so
//! that a torn one leaves the other):
//!
//! ```text
//! | super A | super B | batch | batch | wrap .... | batch | batch | (free) |
//!                       ^ tail (oldest live)                        ^ head
//! ```
//!
//! A batch is one header block (its sequence, its extents: volume, first
//! block, block count, the pool-wide order of each write; CRCs of the
//! header and of the data) followed by the data. Replay starts at the tail
//! the superblock names and follows consecutive sequences; the first batch
//! whose header or data does not check ends the ring (it was never
//! acknowledged: a batch is acknowledged only once it and every batch
//! before it are durable).
//!
//! What this does not do (yet): share the data plane's reactors (one ring
//! per reactor), know about pools and volumes beyond their numbers, or
//! trim (a deallocation must destage a volume's batches first).

pub mod format;
mod log;

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
