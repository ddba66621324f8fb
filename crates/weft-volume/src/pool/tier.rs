//! A pool's write tier (docs/DATA-SERVICES-DESIGN.md, "the write tier"):
//! a volume's writes are made durable in the tier's log and acknowledged
//! from there; destage rounds move them to the capacity devices later;
//! reads find each block's newest copy wherever it is.
//!
//! - A write first maps its chunks (allocation, copy-on-write) as any write
//!   does, so that a full pool refuses it now rather than fail its destage
//!   later, then appends the blocks it covers (whole 4 KiB blocks: a partial
//!   block is read, patched and appended whole) as one batch or several.
//! - A full tier makes the write destage first: it slows down to the
//!   destage rate and never fails for it.
//! - Deallocation, snapshots and deletes destage everything first, so that
//!   no write replayed later lands over them (a resize only grows: nothing
//!   in the tier lies past the old end).
//! - The pool's superblock names the tier (format version 4): the pool does
//!   not open without it, nor with another tier.
//! - A failed write or sync of the tier device fails the pool, as a
//!   member's does; `reload` (clear-failure) opens the tier again.
//!
//! What this does not do (yet): append from the data plane's reactors (this
//! is the manager's synchronous path, its writes in ring 0), or remove a
//! tier.

use super::Pool;
use crate::media::Media;
use crate::tier::format::TierId;
use crate::tier::{Destaged, TierError, TierLog, TierWrite, VolumeId, TIER_BLOCK_BYTES};
use crate::VolumeError;
use std::collections::HashMap;
use std::io;

const BLOCK: u64 = TIER_BLOCK_BYTES;
/// The ring the manager's synchronous writes append to.
const MANAGER_RING: usize = 0;
/// The most bytes one batch carries (a quarter of a ring at most, so that
/// one always fits an empty ring): a longer write is appended as several
/// (NVMe promises atomicity per block only).
const BATCH_BYTES_MAX: u64 = 256 * 1024;
/// Destage rounds a full ring waits for before it tries again.
const ROUNDS_WHEN_FULL: usize = 4;

/// A pool's write tier: its device and its log.
#[derive(Debug)]
pub(super) struct PoolTier<M: Media> {
    pub(super) media: M,
    log: TierLog,
}

/// The tier's device while its log is not open (its open failed at a
/// reload): kept for the next one.
#[derive(Debug)]
pub(super) struct UnopenedTier<M: Media>(pub(super) M);

/// A write tier as `weft pool list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierInfo {
    /// Bytes of the tier's rings.
    pub capacity_bytes: u64,
    /// Bytes its batches take (waiting for destage, or destaged and not
    /// released yet).
    pub used_bytes: u64,
    /// Blocks whose newest copy is in the tier.
    pub blocks: usize,
}

impl<M: Media> Pool<M> {
    /// Gives the pool a write tier on `media` (its first member): formats
    /// it as tier `id` of `rings` rings, then names it in the pool's
    /// superblocks (a new generation). Crash-safe: the pool has the tier
    /// once the first member's superblock says so, and not before.
    ///
    /// Every volume gets a new map (the old one is retired): a reactor that
    /// still writes the devices directly must ask the manager instead. The
    /// caller publishes new exports right after.
    pub fn attach_tier(
        &mut self,
        mut media: M,
        id: TierId,
        rings: usize,
    ) -> Result<(), VolumeError> {
        self.check_usable()?;
        if self.tier.is_some() {
            return Err(VolumeError::invalid(
                format!("write tier for pool {}", self.name()),
                "it has one already",
            ));
        }
        let log = TierLog::format(&mut media, 0, id, rings).map_err(|error| match error {
            TierError::Invalid(reason) => VolumeError::invalid("write tier device", reason),
            other => VolumeError::Corrupt(format!("formatting the write tier: {other}")),
        })?;
        let mut named = self.superblock.clone();
        named.generation += 1;
        named.tier = Some(id);
        let members: Vec<usize> = (0..usize::from(self.layout().members)).collect();
        let written = super::write_superblocks(&mut self.media, &named, &members);
        // Kept even if the superblocks failed: `reload` opens it if the
        // first member's says the pool has it.
        self.tier = Some(PoolTier { media, log });
        if let Err(source) = written {
            let reason = format!("naming its write tier in the superblocks failed: {source}");
            self.failed = Some(reason);
            return Err(self.failed_error());
        }
        self.superblock = named;
        self.state.renew_maps();
        // Direct I/O that entered through the old maps drains: a write
        // still on its way to the devices would otherwise land after a
        // later write of its block read the block for the tier.
        for volume in self.state.volumes.values() {
            drop(volume.gate.quiesce());
        }
        log::info!("pool {}: a write tier of {rings} ring(s)", self.name());
        Ok(())
    }

    /// Opens the tier the superblock names on `media`, replaying its rings.
    pub(super) fn open_tier(&mut self, media: Option<M>) -> Result<(), VolumeError> {
        let name = self.name().to_string();
        let (id, mut media) = match (self.superblock.tier, media) {
            (None, None) => return Ok(()),
            (Some(id), Some(media)) => (id, media),
            (Some(_), None) => {
                return Err(VolumeError::Corrupt(format!(
                    "pool {name} has a write tier, and its device was not given: the tier may hold writes not on the capacity devices yet, so the pool does not open without it"
                )))
            }
                        (None, Some(_)) => {
                // An attach cut short before the superblocks named it.
                log::warn!("pool {name}: a write tier device was given, but the pool has none (its attach did not complete); the device is not used");
                return Ok(());
            }
        };
        match TierLog::open(&mut media, 0, id) {
            Ok(log) => {
                self.tier = Some(PoolTier { media, log });
                Ok(())
            }
            Err(error) => {
                self.unopened_tier = Some(UnopenedTier(media));
                Err(VolumeError::Corrupt(format!(
                    "pool {name}: its write tier: {error}"
                )))
            }
        }
    }

    /// Opens the tier again on its device (after a failure), if the
    /// superblock names it (a tier whose naming did not commit is let go).
    pub(super) fn reopen_tier(&mut self) -> Result<(), VolumeError> {
        let unopened = self.unopened_tier.take().map(|UnopenedTier(media)| media);
        let media = self.tier.take().map(|tier| tier.media).or(unopened);
        match self.superblock.tier {
            Some(_) => self.open_tier(media),
            None => Ok(()),
        }
    }

    /// The write tier's size and use, if the pool has one.
    pub fn tier_info(&self) -> Option<TierInfo> {
        self.tier.as_ref().map(|tier| TierInfo {
            capacity_bytes: tier.log.capacity_bytes(),
            used_bytes: tier.log.used_bytes(),
            blocks: tier.log.blocks(),
        })
    }

    /// Runs up to `rounds` destage rounds (see `TierLog::destage`): returns
    /// the batches released. A failure fails the pool.
    pub fn destage_tier(&mut self, rounds: usize) -> Result<usize, VolumeError> {
        self.check_usable()?;
        let Some(mut tier) = self.tier.take() else {
            return Ok(0);
        };
        let names: HashMap<VolumeId, String> = self
            .state
            .volumes
            .values()
            .map(|v| (v.id, v.name.clone()))
            .collect();
        // The two callbacks take turns with the pool, never at once.
        let pool = std::cell::RefCell::new(&mut *self);
        let result = tier.log.destage(
            &mut tier.media,
            rounds,
            |_, block| pool.borrow_mut().destage_block(&names, block),
            |_| pool.borrow_mut().sync_members(),
        );
        self.tier = Some(tier);
        result.map_err(|error| self.fail_tier("destaging", error))
    }

    /// Destages everything the tier holds (before an operation a replayed
    /// write must not land over).
    pub(super) fn settle_tier(&mut self) -> Result<(), VolumeError> {
        while self.tier.as_ref().is_some_and(|t| t.log.live_batches() > 0) {
            if self.destage_tier(usize::MAX)? == 0 {
                return Err(VolumeError::Corrupt(format!(
                    "pool {}: its write tier released nothing in a destage",
                    self.name()
                )));
            }
        }
        Ok(())
    }

    /// Whether writes to the pool go to a tier (its superblock names one;
    /// while it is not open, the pool has failed and refuses them).
    pub(super) fn has_tier(&self) -> bool {
        self.superblock.tier.is_some()
    }

    /// Erases the tier's superblocks (the pool is being deleted), so that
    /// its device can be another pool's tier.
    pub(super) fn erase_tier(&mut self) -> Result<(), VolumeError> {
        let name = self.name().to_string();
        let media = match (&mut self.tier, &mut self.unopened_tier) {
            (Some(tier), _) => &mut tier.media,
            (None, Some(UnopenedTier(media))) => media,
            (None, None) => return Ok(()),
        };
        let empty = vec![0; 2 * BLOCK as usize];
        media
            .write_at(0, 0, &empty)
            .and_then(|()| media.sync(0))
            .map_err(|source| VolumeError::Io {
                context: format!("erasing the write tier of pool {name}"),
                source,
            })
    }

    /// Makes `stored` (what the devices are to hold: encrypted already)
    /// durable at `offset` of volume `name` in the tier.
    pub(super) fn write_to_tier(
        &mut self,
        name: &str,
        offset: u64,
        stored: &[u8],
    ) -> Result<(), VolumeError> {
        self.prepare_write(name, offset, stored.len() as u64)?;
        self.commit()?;
        if stored.is_empty() {
            return Ok(());
        }
        if self.tier.is_none() {
            return Err(self.failed_error());
        }
        let volume = self.existing(name)?.id;
        let first_block = offset / BLOCK;
        let whole = self.whole_blocks(name, offset, stored)?;
        let ring_bytes = self.tier.as_ref().expect("a tiered pool").log.ring_bytes();
        let piece_bytes = BATCH_BYTES_MAX
            .min(ring_bytes / 4 / BLOCK * BLOCK)
            .max(BLOCK);
        for (i, piece) in whole.chunks(piece_bytes as usize).enumerate() {
            let first = first_block + i as u64 * (piece_bytes / BLOCK);
            self.append_to_tier(volume, first, piece)?;
        }
        Ok(())
    }

    /// Overlays on `buf` (the stored bytes at `offset` of volume `id`, as
    /// the capacity devices hold them) the blocks whose newest copy is in
    /// the tier.
    pub(super) fn overlay_tier(
        &mut self,
        id: VolumeId,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), VolumeError> {
        let Some(tier) = self.tier.as_mut() else {
            return Ok(());
        };
        let end = offset + buf.len() as u64;
        let mut block_buf = vec![0; BLOCK as usize];
        for block in offset / BLOCK..end.div_ceil(BLOCK) {
            let found = tier
                .log
                .read(&mut tier.media, id, block, &mut block_buf)
                .map_err(|error| VolumeError::Corrupt(format!("reading the write tier: {error}")));
            if !found? {
                continue;
            }
            let (from, to) = ((block * BLOCK).max(offset), ((block + 1) * BLOCK).min(end));
            buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                &block_buf[(from - block * BLOCK) as usize..(to - block * BLOCK) as usize],
            );
        }
        Ok(())
    }

    /// `stored`, to be written at `offset` of volume `name`, as the whole
    /// blocks it touches: as it is when it is whole blocks already, else
    /// with its partial first and last blocks read and patched.
    fn whole_blocks<'a>(
        &mut self,
        name: &str,
        offset: u64,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, VolumeError> {
        let first_block = offset / BLOCK;
        let end = offset + stored.len() as u64;
        let head = (offset - first_block * BLOCK) as usize;
        if head == 0 && end.is_multiple_of(BLOCK) {
            return Ok(std::borrow::Cow::Borrowed(stored));
        }
        let blocks = end.div_ceil(BLOCK) - first_block;
        let mut whole = vec![0; (blocks * BLOCK) as usize];
        if head != 0 {
            self.read_block(name, first_block, &mut whole[..BLOCK as usize])?;
        }
        if !end.is_multiple_of(BLOCK) && (blocks > 1 || head == 0) {
            let last = whole.len() - BLOCK as usize;
            self.read_block(name, first_block + blocks - 1, &mut whole[last..])?;
        }
        whole[head..head + stored.len()].copy_from_slice(stored);
        Ok(std::borrow::Cow::Owned(whole))
    }

    /// Block `block` of volume `name` as stored (the part past the
    /// volume's end reads as zeroes).
    fn read_block(&mut self, name: &str, block: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        let size = self.existing(name)?.size_bytes;
        let start = block * BLOCK;
        let len = (size.min(start + BLOCK) - start) as usize;
        buf.fill(0);
        self.read_stored(name, start, &mut buf[..len])
    }

    fn append_to_tier(
        &mut self,
        volume: VolumeId,
        first_block: u64,
        data: &[u8],
    ) -> Result<(), VolumeError> {
        let tier = self.tier.as_mut().expect("a tiered pool");
        let taken = tier.log.take_order(MANAGER_RING);
        let pool_order = taken.map_err(|error| self.fail_tier("taking an order", error))?;
        let write = TierWrite {
            volume,
            first_block,
            data,
            pool_order,
        };
        loop {
            // A full ring keeps the write's order taken (it is still on its
            // way): the destage below stops short of it, and the append is
            // tried again with it.
            let tier = self.tier.as_mut().expect("a tiered pool");
            match tier.log.append(&mut tier.media, MANAGER_RING, &[write]) {
                Ok(()) => return Ok(()),
                Err(TierError::Full { needed, free }) => {
                    if self.destage_tier(ROUNDS_WHEN_FULL)? == 0 {
                        let error = TierError::Full { needed, free };
                        return Err(self.fail_tier("appending (a destage freed nothing)", error));
                    }
                }
                Err(error) => return Err(self.fail_tier("appending", error)),
            }
        }
    }

    /// Writes one destaged block to its place (its chunk is mapped since
    /// its write; a volume deleted since has settled the tier before).
    fn destage_block(
        &mut self,
        names: &HashMap<VolumeId, String>,
        block: Destaged<'_>,
    ) -> io::Result<()> {
        let Some(name) = names.get(&block.volume) else {
            return Ok(());
        };
        let size = self.existing(name).map_err(io::Error::other)?.size_bytes;
        let start = block.block * BLOCK;
        if start >= size {
            return Ok(());
        }
        let len = (size - start).min(BLOCK) as usize;
        self.write_placed(name, start, &block.data[..len])
            .map_err(io::Error::other)
    }

    fn fail_tier(&mut self, doing: &str, error: TierError) -> VolumeError {
        if self.failed.is_none() {
            let reason = format!("its write tier failed {doing}: {error}");
            log::error!("pool {}: {reason}", self.name());
            self.failed = Some(reason);
        }
        self.failed_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FaultyMedia;
    use crate::{PoolOptions, VolumeSpec};

    const TIER_BYTES: usize = 8192 + 2 * 32 * 4096;

    fn pool() -> Pool<FaultyMedia> {
        let options = PoolOptions {
            name: "fast".into(),
            chunk_bytes: 64 * 1024,
            uuid: [3; 16],
        };
        let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, 1), options).unwrap();
        pool.create_volume(&VolumeSpec {
            name: "v".into(),
            size_bytes: 1 << 20,
            block_size: 512,
            thick: false,
            encrypted: false,
        })
        .unwrap();
        pool
    }

    fn read(pool: &mut Pool<FaultyMedia>, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        pool.read("v", offset, &mut buf).unwrap();
        buf
    }

    #[test]
    fn writes_wait_in_the_tier_read_back_and_reach_the_devices_by_destage() {
        let mut pool = pool();
        pool.attach_tier(FaultyMedia::new(1, TIER_BYTES, 2), [9; 16], 2)
            .unwrap();
        pool.write("v", 512, &[5; 1024]).unwrap();
        assert_eq!(pool.tier_info().unwrap().blocks, 1, "one 4 KiB block");
        assert_eq!(
            read(&mut pool, 0, 2048),
            [[0; 512], [5; 512], [5; 512], [0; 512]].concat()
        );
        let (media, tier) = pool.into_media_and_tier();
        let mut pool = Pool::open_with_tier(media.crash(), tier.map(FaultyMedia::crash)).unwrap();
        assert_eq!(read(&mut pool, 512, 1024), [5; 1024], "replayed");
        assert!(pool.destage_tier(4).unwrap() > 0);
        assert_eq!(pool.tier_info().unwrap().blocks, 0);
        assert_eq!(read(&mut pool, 512, 1024), [5; 1024], "destaged");
        // A write larger than a quarter ring goes in several batches, and
        // one larger than the tier waits for destages.
        let big = vec![7; 512 * 1024];
        pool.write("v", 4096, &big).unwrap();
        assert_eq!(read(&mut pool, 4096, big.len()), big);
        assert_eq!(read(&mut pool, 512, 1024), [5; 1024]);
    }

    #[test]
    fn a_pool_with_a_tier_does_not_open_without_it_nor_one_without_with_one() {
        let mut pool = pool();
        pool.attach_tier(FaultyMedia::new(1, TIER_BYTES, 2), [9; 16], 2)
            .unwrap();
        let error = pool
            .attach_tier(FaultyMedia::new(1, TIER_BYTES, 3), [8; 16], 2)
            .unwrap_err();
        assert!(error.to_string().contains("it has one already"), "{error}");
        let (media, tier) = pool.into_media_and_tier();
        let error = Pool::open(media.crash()).unwrap_err().to_string();
        assert!(
            error.contains("has a write tier, and its device was not given"),
            "{error}"
        );
        // A tier device offered to a pool whose superblocks name none (an
        // attach cut short) is let go.
        let plain = Pool::open_with_tier(pool_media(), tier).unwrap();
        assert_eq!(plain.tier_info(), None);
        let small = FaultyMedia::new(1, 8192 + 4096, 4);
        let error = self::pool()
            .attach_tier(small, [9; 16], 2)
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs at least"), "{error}");
    }

    fn pool_media() -> FaultyMedia {
        pool().into_media()
    }

    #[test]
    fn a_failed_tier_fails_the_pool_until_it_is_reloaded() {
        let mut pool = pool();
        let mut tier = FaultyMedia::new(1, TIER_BYTES, 2);
        // Formatting writes four blocks; the first batch is the fifth write.
        tier.fail_after_writes(5);
        pool.attach_tier(tier, [9; 16], 2).unwrap();
        pool.write("v", 0, &[1; 4096]).unwrap();
        let error = pool.write("v", 0, &[2; 4096]).unwrap_err().to_string();
        assert!(error.contains("write tier failed appending"), "{error}");
        assert!(pool.write("v", 0, &[3; 4096]).is_err(), "failed");
        let (media, tier) = pool.into_media_and_tier();
        let mut pool = Pool::open_with_tier(media, tier.map(FaultyMedia::crash)).unwrap();
        assert_eq!(read(&mut pool, 0, 4096), [1; 4096]);
    }
}
