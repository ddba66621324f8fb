//! Which regions of a pool's volumes have blocks in its write tier, for the
//! data plane: a read of a range whose regions hold none goes to the
//! capacity devices directly, without the manager.
//!
//! Counters, one per hashed (volume, region): the tier adds one for each
//! block that gets its newest copy in the tier and takes one away when that
//! copy is released (destaged and synced). Two regions may share a counter:
//! a read then goes the slow way for nothing, never the fast way wrongly.
//!
//! Ordering: a write is acknowledged after its blocks are counted
//! (`Release`), and a read that follows it loads the counters with
//! `Acquire`, so it sees them. A read concurrent with a write may go either
//! way (NVMe orders nothing between them).
//!
//! What this does not do: say where a block is (the tier's index does), or
//! shrink (a fixed number of counters per pool).

use super::format::VolumeId;
use super::TIER_BLOCK_BYTES;
use std::sync::atomic::{AtomicU32, Ordering};

/// Counters per pool.
const COUNTERS: usize = 1 << 16;
/// Blocks of a region (256 KiB).
const REGION_BLOCKS: u64 = 64;

/// See the module's docs.
pub struct TierPresence {
    counters: Box<[AtomicU32]>,
}

impl std::fmt::Debug for TierPresence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierPresence").finish_non_exhaustive()
    }
}

impl Default for TierPresence {
    fn default() -> Self {
        TierPresence {
            counters: (0..COUNTERS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

impl TierPresence {
    /// Whether any block of `[offset, offset + len)` of `volume` may be in
    /// the tier (false: none is).
    pub fn may_hold(&self, volume: &VolumeId, offset: u64, len: u64) -> bool {
        let first = offset / TIER_BLOCK_BYTES / REGION_BLOCKS;
        let last = (offset + len.max(1) - 1) / TIER_BLOCK_BYTES / REGION_BLOCKS;
        (first..=last).any(|region| self.counter(volume, region).load(Ordering::Acquire) > 0)
    }

    /// Block `block` of `volume` has its newest copy in the tier now.
    pub(super) fn add(&self, volume: &VolumeId, block: u64) {
        let counter = self.counter(volume, block / REGION_BLOCKS);
        counter.fetch_add(1, Ordering::Release);
    }

    /// Block `block` of `volume` has its newest copy on the capacity
    /// devices again.
    pub(super) fn remove(&self, volume: &VolumeId, block: u64) {
        let counter = self.counter(volume, block / REGION_BLOCKS);
        let before = counter.fetch_sub(1, Ordering::Release);
        assert!(before > 0, "a tier presence counter went below zero");
    }

    /// Sets every counter to what `blocks` (each block whose newest copy
    /// is in the tier, after a replay) counts. Only ever lowers a counter
    /// that counts blocks still in the tier (a replay finds no block the
    /// tier did not hold before), so a read never goes the fast way wrongly
    /// meanwhile.
    pub(super) fn reset<'a>(&self, blocks: impl Iterator<Item = &'a (VolumeId, u64)>) {
        let mut counts = vec![0u32; COUNTERS];
        for (volume, block) in blocks {
            counts[self.slot(volume, block / REGION_BLOCKS)] += 1;
        }
        for (counter, count) in self.counters.iter().zip(counts) {
            counter.store(count, Ordering::Release);
        }
    }

    fn counter(&self, volume: &VolumeId, region: u64) -> &AtomicU32 {
        &self.counters[self.slot(volume, region)]
    }

    fn slot(&self, volume: &VolumeId, region: u64) -> usize {
        // All 16 bytes: a pool's volume ids share their first 8 (its UUID)
        // and differ in the last (a counter mixed in).
        let low = u64::from_le_bytes(volume[..8].try_into().expect("16 bytes"));
        let high = u64::from_le_bytes(volume[8..].try_into().expect("16 bytes"));
        let seed = low ^ high.rotate_left(29).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let mixed = (seed ^ region).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed >> 48) as usize % COUNTERS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_held_while_any_of_its_blocks_is_counted() {
        let presence = TierPresence::default();
        let (a, b) = ([1; 16], [2; 16]);
        let at = |block: u64| block * TIER_BLOCK_BYTES;
        assert!(!presence.may_hold(&a, 0, 1 << 30));
        presence.add(&a, 10);
        presence.add(&a, 10 + REGION_BLOCKS);
        assert!(presence.may_hold(&a, at(10), 4096));
        assert!(presence.may_hold(&a, 0, 512), "the same region");
        assert!(!presence.may_hold(&b, at(10), 4096), "another volume");
        // Another volume of the same pool: ids that differ in their last
        // byte only.
        let mut sibling = a;
        sibling[15] ^= 1;
        assert!(
            !presence.may_hold(&sibling, at(10), 4096),
            "a sibling volume"
        );
        presence.remove(&a, 10);
        assert!(!presence.may_hold(&a, at(10), 4096));
        assert!(presence.may_hold(&a, 0, 1 << 30), "the second region");
        presence.reset([(a, 7)].iter());
        assert!(presence.may_hold(&a, at(7), 4096));
        assert!(!presence.may_hold(&a, at(10 + REGION_BLOCKS), 4096));
    }
}
