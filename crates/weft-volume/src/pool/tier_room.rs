//! The room kept for compressed units waiting in a write tier: a
//! compressed volume's write is compressed when the tier destages it, and
//! that destage must never find the pool full (it would fail the pool), so
//! the room its units may take is kept when the write is accepted.
//!
//! - A unit may take a whole unit's sectors (one that does not compress).
//!   A segment holds at least `units_per_segment` of those whatever the
//!   sizes of the extents before them, and what is left of the open segment
//!   counts, with one more free allocation unit kept: the open segment is
//!   not reopened after a restart, and what was left of it is lost then.
//! - Units are counted once per write, and once more for each place a
//!   write's tier batches split one (so a unit written twice counts twice),
//!   and never more than the blocks the tier holds: each is in one unit.
//! - Chunk allocations (uncompressed volumes, checkpoint extensions) leave
//!   the kept units free, with the cleaner's; metadata checks count two
//!   references for each unit waiting.
//! - A write that finds too little room settles the tier, then runs the
//!   cleaner, and is refused only then; an allocation settles the tier
//!   when the kept units are in its way.
//!
//! What this does not do: place anything (see `compressed`), or count the
//! units of uncompressed volumes, whose chunks are mapped when written.

use super::compressed::{units_touched, CLEANER_RESERVE};
use super::Pool;
use crate::compression::{Compression, SECTOR_BYTES, UNIT_BYTES};
use crate::media::Media;
use crate::VolumeError;

/// Sectors a unit takes at most (stored as it came).
const UNIT_SECTORS: u64 = UNIT_BYTES / SECTOR_BYTES;

/// Segments a write that finds too little room for its units in a settled
/// pool has the cleaner empty before it gives up.
const SEGMENTS_CLEANED_FOR_ROOM: usize = 4;

/// Free allocation units kept beyond the units' own: what is left of the
/// open segment counts now and is lost at a restart.
const OPEN_SEGMENT_SLACK: u64 = 1;

impl<M: Media> Pool<M> {
    /// Keeps the room a write of `len` bytes at `offset` of compressed
    /// volume `name` may take when destaged, its blocks split in tier
    /// batches of `piece_bytes` (see the module docs); refuses it when even
    /// a settled and cleaned pool has not that room.
    pub(super) fn keep_room_for_tier(
        &mut self,
        name: &str,
        offset: u64,
        len: u64,
        piece_bytes: u64,
    ) -> Result<(), VolumeError> {
        self.check_usable()?;
        super::check_range(self.existing(name)?, offset, len)?;
        let splits = len.div_ceil(piece_bytes).saturating_sub(1);
        let units = units_touched(offset, len).len() as u64 + splits;
        self.bound_tier_pending();
        if !self.has_room_for_tier(units)? {
            // A settled tier still holds the group's writes before this one
            // (counted again by the destage).
            self.settle_tier()?;
            if !self.has_room_for_tier(units)? {
                self.commit()?;
                self.clean_segments(SEGMENTS_CLEANED_FOR_ROOM)?;
            }
            if !self.has_room_for_tier(units)? {
                return Err(VolumeError::PoolFull {
                    pool: self.name().to_string(),
                    needed: units.div_ceil(self.units_per_segment()),
                    free: u64::from(self.state.free_now()),
                });
            }
        }
        self.tier_pending_units = self.tier_pending_units.saturating_add(units);
        self.tier_units_in_group += units;
        Ok(())
    }

    /// Whether `units` more units fit beside those waiting: in segments,
    /// and in the checkpoints (extended if they can be; a pool whose free
    /// units are all kept cannot extend them).
    fn has_room_for_tier(&mut self, units: u64) -> Result<bool, VolumeError> {
        // The checkpoints first: extending them takes free units.
        match self.check_references(2 * units) {
            Ok(()) => {}
            Err(VolumeError::MetadataFull { .. }) => return Ok(false),
            Err(error) => return Err(error),
        }
        let waiting = self.tier_pending_units.saturating_add(units);
        let room = self
            .free_for_units()
            .saturating_mul(self.units_per_segment());
        Ok(self.open_segment_units().saturating_add(room) >= waiting)
    }

    /// Bounds the units counted waiting by the blocks the tier holds (each
    /// is in one unit) and those of the group being written.
    pub(super) fn bound_tier_pending(&mut self) {
        if let Some(tier) = self.tier_info() {
            let bound = (tier.blocks as u64).saturating_add(self.tier_units_in_group);
            self.tier_pending_units = self.tier_pending_units.min(bound);
        }
    }

    /// What an open finds waiting in a tier that holds writes: as many
    /// units as it holds blocks (none in a pool with no compressed volume).
    pub(super) fn tier_pending_at_open(&self, blocks: u64) -> u64 {
        let compressed = self
            .state
            .volumes
            .values()
            .any(|v| v.compression != Compression::None);
        if compressed {
            blocks
        } else {
            0
        }
    }

    /// References the destage of the units waiting may add to the
    /// checkpoints: two each (its extent, and its segment's count).
    pub(super) fn tier_pending_references(&self) -> u64 {
        self.tier_pending_units.saturating_mul(2)
    }

    /// Free allocation units an allocation of `count` chunks may take: all
    /// but those kept for the units waiting, the tier settled first when
    /// they are in its way.
    pub(super) fn free_for_chunks(&mut self, count: u32) -> Result<u32, VolumeError> {
        let short = self.state.free_now() < count.saturating_add(self.chunks_kept_for_tier());
        if short && self.tier_pending_units > self.tier_units_in_group {
            self.settle_tier()?;
        }
        Ok(self
            .state
            .free_now()
            .saturating_sub(self.chunks_kept_for_tier()))
    }

    /// Free allocation units kept for the units waiting.
    pub(super) fn chunks_kept_for_tier(&self) -> u32 {
        if self.tier_pending_units == 0 {
            return 0;
        }
        let beyond_open = self
            .tier_pending_units
            .saturating_sub(self.open_segment_units());
        let kept = beyond_open.div_ceil(self.units_per_segment())
            + u64::from(CLEANER_RESERVE)
            + OPEN_SEGMENT_SLACK;
        u32::try_from(kept).unwrap_or(u32::MAX)
    }

    /// Free allocation units a destage may fill with units (the cleaner's
    /// and the slack left).
    fn free_for_units(&self) -> u64 {
        u64::from(self.state.free_now())
            .saturating_sub(u64::from(CLEANER_RESERVE) + OPEN_SEGMENT_SLACK)
    }

    /// Whole units that fit in what is left of the open segment.
    fn open_segment_units(&self) -> u64 {
        match self.state.filling() {
            Some(_) => u64::from(self.state.segment_sectors() - self.segment_fill) / UNIT_SECTORS,
            None => 0,
        }
    }

    /// Whole units a segment holds at least.
    fn units_per_segment(&self) -> u64 {
        (u64::from(self.state.segment_sectors()) / UNIT_SECTORS).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FaultyMedia, Rng};
    use crate::{PoolOptions, VolumeSpec};

    const CHUNK: u64 = 256 * 1024;
    const VOLUME_BYTES: u64 = 4 << 20;

    fn spec(name: &str, size_bytes: u64, thick: bool, compression: Compression) -> VolumeSpec {
        VolumeSpec {
            name: name.into(),
            size_bytes,
            block_size: 512,
            thick,
            encrypted: false,
            compression,
        }
    }

    /// A pool of 256 KiB units (four whole units a segment) with small
    /// checkpoint slots and a write tier, all but `spare` of its free units
    /// taken by a thick volume, and a compressed volume `v`.
    fn nearly_full(spare: u32) -> Pool<FaultyMedia> {
        let options = PoolOptions {
            name: "tight".into(),
            chunk_bytes: CHUNK as u32,
            uuid: [6; 16],
        };
        let media = FaultyMedia::new(1, 16 << 20, 3);
        let mut pool = Pool::create_with_checkpoints(media, options, 4096).unwrap();
        pool.attach_tier(FaultyMedia::new(1, 8192 + 2 * 128 * 4096, 4), [6; 16], 2)
            .unwrap();
        pool.create_volume(&spec("v", VOLUME_BYTES, false, Compression::Lz4))
            .unwrap();
        let taken = u64::from(pool.state.free_now() - spare) * CHUNK;
        pool.create_volume(&spec("thick", taken, true, Compression::None))
            .unwrap();
        pool
    }

    fn power_cut(pool: Pool<FaultyMedia>) -> Pool<FaultyMedia> {
        let (media, tier) = pool.into_media_and_tier();
        Pool::open_with_tier(media.crash(), tier.map(FaultyMedia::crash)).unwrap()
    }

    /// `len` bytes at `offset`: text for even seeds, noise for odd ones.
    fn data(rng: &mut Rng, len: usize) -> Vec<u8> {
        match rng.below(2) {
            0 => (0..len).map(|i| b"weft keeps room "[i % 16]).collect(),
            _ => (0..len).map(|_| rng.next_u64() as u8).collect(),
        }
    }

    #[test]
    fn destages_never_find_a_nearly_full_pool_full_whatever_the_writes_and_power_cuts() {
        for seed in 1..=40u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
            let mut pool = nearly_full(4 + rng.below(4) as u32);
            let mut model = vec![0u8; VOLUME_BYTES as usize];
            let mut refused = 0;
            for step in 0..120 {
                match rng.below(10) {
                    0 => pool.settle_tier().unwrap(),
                    1 => {
                        pool.destage_tier(1).unwrap();
                    }
                    2 => pool = power_cut(pool),
                    // The cleaner may find no room to move into.
                    3 => match pool.clean_segments(2) {
                        Ok(_)
                        | Err(VolumeError::PoolFull { .. } | VolumeError::MetadataFull { .. }) => {}
                        Err(error) => panic!("seed {seed} step {step}: cleaning: {error}"),
                    },
                    _ => {
                        // 4 KiB to 512 KiB, anywhere: parts of units, and
                        // writes split in several tier batches.
                        let len = 4096 * (1 + rng.below(128));
                        let offset = 4096 * rng.below((VOLUME_BYTES - len) / 4096);
                        let bytes = data(&mut rng, len as usize);
                        match pool.write("v", offset, &bytes) {
                            Ok(()) => {
                                model[offset as usize..][..bytes.len()].copy_from_slice(&bytes)
                            }
                            Err(VolumeError::PoolFull { .. }) => refused += 1,
                            Err(error) => panic!("seed {seed} step {step}: {error}"),
                        }
                    }
                }
                assert_eq!(pool.failure(), None, "seed {seed} step {step}");
            }
            assert!(refused > 0, "seed {seed}: the pool never filled");
            let mut pool = power_cut(pool);
            pool.settle_tier().unwrap();
            let mut seen = vec![0; VOLUME_BYTES as usize];
            pool.read("v", 0, &mut seen).unwrap();
            assert!(
                seen == model,
                "seed {seed}: the volume differs from what was acknowledged"
            );
        }
    }
}
