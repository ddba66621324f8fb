//! The small types of replication: who (nodes), when (epochs and fencing
//! tokens), which command (op ids) and where (extents, regions).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A storage node, by its cluster ordinal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u16);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.0)
    }
}

/// A primary's term. Every promotion bumps it, by compare-and-swap on the
/// volume's record, so at most one primary holds each epoch.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The next epoch.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

/// What a replica is fenced with: the epoch of the primary that attached it
/// and that primary's attachment session to it. Tokens are ordered (epoch
/// first), and a replica accepts a new fence only with a larger token, so a
/// deposed primary, or an older attachment of the same primary, is shut out
/// for good.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Token {
    /// The primary's epoch.
    pub epoch: Epoch,
    /// The primary's attachment of this replica, counted within the epoch from 1.
    pub session: u32,
}

/// A command the primary tracks: a host command, a rebuild copy or a fence.
/// The driver holds the data that goes with it (the host's buffer, the
/// copied region) under the same id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// A run of logical blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// First block.
    pub block: u64,
    /// Number of blocks, at least 1.
    pub blocks: u32,
}

impl Extent {
    /// The block after the last one.
    pub fn end(&self) -> u64 {
        self.block + u64::from(self.blocks)
    }

    /// Whether the two extents share a block.
    pub fn overlaps(&self, other: &Extent) -> bool {
        self.block < other.end() && other.block < self.end()
    }
}

/// How a volume is cut into regions: the unit of the dirty and write-intent
/// bitmaps and of rebuild copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Volume size in blocks.
    pub blocks: u64,
    /// Blocks per region (the last region may be shorter).
    pub region_blocks: u64,
}

impl Geometry {
    /// Number of regions.
    pub fn regions(&self) -> u32 {
        u32::try_from(self.blocks.div_ceil(self.region_blocks)).expect("fewer than 2^32 regions")
    }

    /// The regions `extent` touches.
    pub fn regions_of(&self, extent: &Extent) -> std::ops::Range<u32> {
        debug_assert!(extent.blocks > 0 && extent.end() <= self.blocks);
        let first = extent.block / self.region_blocks;
        let last = (extent.end() - 1) / self.region_blocks;
        first as u32..last as u32 + 1
    }

    /// The blocks of region `region`.
    pub fn extent_of(&self, region: u32) -> Extent {
        let block = u64::from(region) * self.region_blocks;
        let blocks = self.region_blocks.min(self.blocks - block);
        Extent {
            block,
            blocks: blocks as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_order_by_epoch_then_session() {
        let old = Token {
            epoch: Epoch(1),
            session: 9,
        };
        let new = Token {
            epoch: Epoch(2),
            session: 1,
        };
        assert!(new > old);
    }

    #[test]
    fn extents_map_to_the_regions_they_touch() {
        let g = Geometry {
            blocks: 10,
            region_blocks: 4,
        };
        assert_eq!(g.regions(), 3);
        assert_eq!(
            g.regions_of(&Extent {
                block: 3,
                blocks: 2
            }),
            0..2
        );
        assert_eq!(
            g.regions_of(&Extent {
                block: 8,
                blocks: 2
            }),
            2..3
        );
        assert_eq!(
            g.extent_of(2),
            Extent {
                block: 8,
                blocks: 2
            }
        );
        assert!(Extent {
            block: 3,
            blocks: 2
        }
        .overlaps(&Extent {
            block: 4,
            blocks: 1
        }));
        assert!(!Extent {
            block: 3,
            blocks: 1
        }
        .overlaps(&Extent {
            block: 4,
            blocks: 1
        }));
    }
}
