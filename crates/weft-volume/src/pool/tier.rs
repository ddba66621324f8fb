//! A pool's write tier (docs/DATA-SERVICES-DESIGN.md, "the write tier"):
//! a volume's writes are made durable in the tier's log and acknowledged
//! from there; destage rounds move them to the capacity devices later;
//! reads find each block's newest copy wherever it is.
//!
//! - A write first maps its chunks (allocation, copy-on-write) as any write
//!   does, so that a full pool refuses it now rather than fail its destage
//!   later, then appends the blocks it covers (whole 4 KiB blocks: a partial
//!   block is read, patched and appended whole) as one batch or several.
//! - `write_group` writes the writes in flight together with one commit
//!   and as few batches (one sync of the tier each) as fit: the group
//!   commit. A write that reads a partial block appends the batch gathered
//!   so far first, so that it reads what the writes before it left.
//! - A full tier makes the write destage first: it slows down to the
//!   destage rate and never fails for it.
//! - A compressed volume's blocks are compressed when destaged (see
//!   `compressed`): its writes keep room for that instead of mapping
//!   chunks, and a destage round commits the units it placed before the
//!   tier lets their blocks go.
//! - Deallocation, snapshots and deletes destage everything first, so that
//!   no write replayed later lands over them (a resize only grows: nothing
//!   in the tier lies past the old end).
//! - The pool's superblock names the tier (format version 4): the pool does
//!   not open without it, nor with another tier.
//! - A failed write or sync of the tier device fails the pool, as a
//!   member's does; `reload` (clear-failure) opens the tier again.
//!
//! - `detach_tier` takes the tier away: everything destaged first, then
//!   superblocks that name none.
//!
//! What this does not do (yet): append from the data plane's reactors (this
//! is the manager's synchronous path, its writes in ring 0).

use super::Pool;
use crate::crypt::VolumeCipher;
use crate::media::Media;
use crate::tier::format::TierId;
use crate::tier::format::EXTENTS_MAX;
use crate::tier::{
    Destaged, TierError, TierLog, TierPresence, TierWrite, VolumeId, TIER_BLOCK_BYTES,
};
use crate::VolumeError;
use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

const BLOCK: u64 = TIER_BLOCK_BYTES;
/// The ring the manager's synchronous writes append to.
const MANAGER_RING: usize = 0;
/// The most bytes one batch carries (a quarter of a ring at most, so that
/// one always fits an empty ring): a longer write is appended as several
/// (NVMe promises atomicity per block only).
const BATCH_BYTES_MAX: u64 = 256 * 1024;
/// The most batches of the ring one destage round writes, with one sync of
/// the members and one superblock of the tier for all of them.
const BATCHES_PER_ROUND: usize = 16;
/// Destage rounds a full ring waits for before it tries again.
const ROUNDS_WHEN_FULL: usize = 4;

/// One write of a group (see [`Pool::write_group`]).
#[derive(Debug, Clone, Copy)]
pub struct GroupWrite<'a> {
    /// The volume's name.
    pub volume: &'a str,
    /// Where in the volume, in bytes.
    pub offset: u64,
    /// The bytes, as the host wrote them.
    pub data: &'a [u8],
}

/// Whole blocks of one write for a tier batch.
#[derive(Debug)]
struct Piece<'a> {
    /// The write of the group it is part of.
    write: usize,
    volume: VolumeId,
    first_block: u64,
    data: Cow<'a, [u8]>,
}

/// A tier batch being gathered.
#[derive(Debug, Default)]
struct Gathered<'a> {
    pieces: Vec<Piece<'a>>,
    bytes: u64,
}

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
        let log = self.keep_presence(log);
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

    /// Takes the write tier away: destages everything, writes a new
    /// generation of superblocks that names none, then erases the tier's
    /// superblocks (its device can serve again). Crash-safe: the pool has
    /// its tier, empty, until the first member's superblock says it has
    /// none. Returns the tier's device.
    ///
    /// The caller publishes new exports right after: the volumes' I/O may
    /// go to the devices directly again.
    pub fn detach_tier(&mut self) -> Result<M, VolumeError> {
        self.check_usable()?;
        if self.tier.is_none() {
            return Err(VolumeError::invalid(
                format!("write tier of pool {}", self.name()),
                "it has none",
            ));
        }
        self.settle_tier()?;
        let mut unnamed = self.superblock.clone();
        unnamed.generation += 1;
        unnamed.tier = None;
        let members: Vec<usize> = (0..usize::from(self.layout().members)).collect();
        if let Err(source) = super::write_superblocks(&mut self.media, &unnamed, &members) {
            let reason = format!("taking its write tier out of the superblocks failed: {source}");
            self.failed = Some(reason);
            return Err(self.failed_error());
        }
        self.superblock = unnamed;
        if let Err(error) = self.erase_tier() {
            // The pool no longer names it: only reusing the device as a
            // tier is refused until it is wiped.
            log::warn!("pool {}: {error}", self.name());
        }
        log::info!("pool {}: its write tier is removed", self.name());
        Ok(self.tier.take().expect("a tiered pool").media)
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
                let log = self.keep_presence(log);
                self.tier_pending_units = self.tier_pending_at_open(log.blocks() as u64);
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

    /// `log` with the pool's presence counters (the first tier's own, kept
    /// for the pool's life: the data plane holds them).
    fn keep_presence(&mut self, mut log: TierLog) -> TierLog {
        match &self.tier_presence {
            Some(presence) => log.adopt_presence(Arc::clone(presence)),
            None => self.tier_presence = Some(Arc::clone(log.presence())),
        }
        log
    }

    /// Which regions of the volumes have blocks in the write tier, if the
    /// pool has one: a read of a range whose regions hold none may go to
    /// the devices directly.
    pub fn tier_presence(&self) -> Option<Arc<TierPresence>> {
        self.tier
            .as_ref()
            .map(|tier| Arc::clone(tier.log.presence()))
    }

    /// Reads as the data plane reads a tiered pool's volume: from the
    /// devices alone where the tier's presence says it holds no block of
    /// the range, else as [`Pool::read`] (for the crash model's checks).
    #[cfg(any(test, feature = "testing"))]
    pub fn read_as_the_data_plane(
        &mut self,
        name: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), VolumeError> {
        let id = self.existing(name)?.id;
        let presence = self.tier_presence();
        // A compressed volume's I/O all goes to the manager.
        if self.is_compressed(name)
            || presence.is_none_or(|p| p.may_hold(&id, offset, buf.len() as u64))
        {
            return self.read(name, offset, buf);
        }
        self.read_devices(name, offset, buf)?;
        if let Some(cipher) = self.cipher(name)? {
            cipher.decrypt(offset, buf);
        }
        Ok(())
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
        // What a failed round took and did not place: still in the tier.
        self.destaging.clear();
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
            BATCHES_PER_ROUND,
            |_, blocks| pool.borrow_mut().destage_blocks(&names, blocks),
            |_| pool.borrow_mut().settle_destaged(),
        );
        self.tier = Some(tier);
        self.bound_tier_pending();
        result.map_err(|error| self.fail_tier("destaging", error))
    }

    /// Makes a destage round's blocks durable before the tier lets them
    /// go: compressed volumes' units placed, the members synced, then the
    /// records of those units committed.
    fn settle_destaged(&mut self) -> io::Result<()> {
        self.place_destaged().map_err(io::Error::other)?;
        self.sync_members()?;
        self.data_dirty = false;
        self.commit().map_err(io::Error::other)
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

    /// Writes `writes` as [`Pool::write`] would one after another, with one
    /// commit of the metadata they need and their blocks in as few tier
    /// batches (one sync of the tier each) as fit: the group commit. Each
    /// write's result, in order; none is durable before this returns.
    pub fn write_group(&mut self, writes: &[GroupWrite<'_>]) -> Vec<Result<(), VolumeError>> {
        if !self.has_tier() {
            // Compressed volumes' writes go to their extents, with one
            // commit.
            let mut compressed: Vec<_> = writes.iter().map(|_| None).collect();
            self.write_compressed_group(writes, &mut compressed);
            return writes
                .iter()
                .zip(compressed)
                .map(|(w, done)| done.unwrap_or_else(|| self.write(w.volume, w.offset, w.data)))
                .collect();
        }
        let results = self.write_group_to_tier(writes);
        self.tier_units_in_group = 0;
        results
    }

    /// [`Pool::write_group`] on a pool with a write tier.
    fn write_group_to_tier(&mut self, writes: &[GroupWrite<'_>]) -> Vec<Result<(), VolumeError>> {
        let mut results = Vec::with_capacity(writes.len());
        let mut stored = Vec::with_capacity(writes.len());
        for w in writes {
            // A compressed volume's units are compressed when destaged: the
            // room they may take then is kept now.
            let prepared = self.stored_bytes(w.volume, w.offset, w.data).and_then(|s| {
                match self.is_compressed(w.volume) {
                    true => {
                        let piece_bytes = self.piece_bytes();
                        self.keep_room_for_tier(w.volume, w.offset, s.len() as u64, piece_bytes)?
                    }
                    false => self.prepare_write(w.volume, w.offset, s.len() as u64)?,
                }
                Ok(s)
            });
            match prepared {
                Ok(s) => {
                    results.push(Ok(()));
                    stored.push(Some(s));
                }
                Err(error) => {
                    results.push(Err(error));
                    stored.push(None);
                }
            }
        }
        if self.commit().is_err() {
            return results
                .into_iter()
                .map(|r| r.and_then(|()| Err(self.failed_error())))
                .collect();
        }
        let mut batch = Gathered::default();
        for (i, (w, s)) in writes.iter().zip(stored).enumerate() {
            let Some(s) = s.filter(|s| !s.is_empty()) else {
                continue;
            };
            if let Err(error) = self.gather(&mut batch, i, w, s, &mut results) {
                results[i] = Err(error);
            }
        }
        self.append_gathered(&mut batch, &mut results);
        results
    }

    /// Adds write `i` (`stored`: as the devices are to hold it) to `batch`,
    /// appending the batch first when it would not fit, or when the write
    /// reads a partial block (which must find the batch's writes).
    fn gather<'a>(
        &mut self,
        batch: &mut Gathered<'a>,
        i: usize,
        w: &GroupWrite<'_>,
        stored: Cow<'a, [u8]>,
        results: &mut [Result<(), VolumeError>],
    ) -> Result<(), VolumeError> {
        if self.tier.is_none() {
            return Err(self.failed_error());
        }
        if !whole(w.offset, stored.len()) {
            self.append_gathered(batch, results);
        }
        let volume = self.existing(w.volume)?.id;
        let first_block = w.offset / BLOCK;
        let blocks = self.whole_blocks(w.volume, w.offset, stored)?;
        let piece_bytes = self.piece_bytes();
        for (n, data) in pieces(blocks, piece_bytes as usize).into_iter().enumerate() {
            let full = batch.pieces.len() == EXTENTS_MAX;
            if full || batch.bytes + data.len() as u64 > piece_bytes {
                self.append_gathered(batch, results);
            }
            batch.bytes += data.len() as u64;
            batch.pieces.push(Piece {
                write: i,
                volume,
                first_block: first_block + n as u64 * (piece_bytes / BLOCK),
                data,
            });
        }
        Ok(())
    }

    /// The most bytes of a write one tier batch carries (see
    /// `BATCH_BYTES_MAX`): a longer write is split in pieces of this size.
    fn piece_bytes(&self) -> u64 {
        let ring_bytes = self.tier.as_ref().map_or(0, |tier| tier.log.ring_bytes());
        BATCH_BYTES_MAX
            .min(ring_bytes / 4 / BLOCK * BLOCK)
            .max(BLOCK)
    }

    /// Appends what `batch` gathered as one tier batch; a failure is each
    /// of its writes' result.
    fn append_gathered(
        &mut self,
        batch: &mut Gathered<'_>,
        results: &mut [Result<(), VolumeError>],
    ) {
        let pieces = std::mem::take(&mut batch.pieces);
        batch.bytes = 0;
        if pieces.is_empty() {
            return;
        }
        let Err(error) = self.append_to_tier(&pieces) else {
            return;
        };
        let reason = error.to_string();
        for piece in &pieces {
            if results[piece.write].is_ok() {
                results[piece.write] = Err(match self.failed {
                    Some(_) => self.failed_error(),
                    None => VolumeError::Io {
                        context: "appending to the write tier".into(),
                        source: io::Error::other(reason.clone()),
                    },
                });
            }
        }
    }

    /// Overlays on `buf` (the stored bytes at `offset` of volume `id`, as
    /// the capacity devices hold them) the blocks whose newest copy is in
    /// the tier.
    pub(super) fn overlay_tier(
        &mut self,
        id: VolumeId,
        offset: u64,
        buf: &mut [u8],
        decrypt: Option<&VolumeCipher>,
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
            if let Some(cipher) = decrypt {
                cipher.decrypt(block * BLOCK, &mut block_buf);
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
        stored: Cow<'a, [u8]>,
    ) -> Result<Cow<'a, [u8]>, VolumeError> {
        if whole(offset, stored.len()) {
            return Ok(stored);
        }
        let first_block = offset / BLOCK;
        let end = offset + stored.len() as u64;
        let head = (offset - first_block * BLOCK) as usize;
        let blocks = end.div_ceil(BLOCK) - first_block;
        let mut whole = vec![0; (blocks * BLOCK) as usize];
        if head != 0 {
            self.read_block(name, first_block, &mut whole[..BLOCK as usize])?;
        }
        if !end.is_multiple_of(BLOCK) && (blocks > 1 || head == 0) {
            let last = whole.len() - BLOCK as usize;
            self.read_block(name, first_block + blocks - 1, &mut whole[last..])?;
        }
        whole[head..head + stored.len()].copy_from_slice(&stored);
        Ok(Cow::Owned(whole))
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

    /// Appends `pieces` as one batch of the manager's ring, destaging
    /// first while the ring is full.
    fn append_to_tier(&mut self, pieces: &[Piece<'_>]) -> Result<(), VolumeError> {
        let mut writes = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let tier = self.tier.as_mut().expect("a tiered pool");
            let taken = tier.log.take_order(MANAGER_RING);
            let pool_order = taken.map_err(|error| self.fail_tier("taking an order", error))?;
            writes.push(TierWrite {
                volume: piece.volume,
                first_block: piece.first_block,
                data: &piece.data,
                pool_order,
            });
        }
        loop {
            // A full ring keeps the writes' orders taken (they are still on
            // their way): the destage below stops short of them, and the
            // append is tried again with them.
            let tier = self.tier.as_mut().expect("a tiered pool");
            match tier.log.append(&mut tier.media, MANAGER_RING, &writes) {
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

    /// Writes destaged blocks to their place (their chunks are mapped
    /// since their writes; a volume deleted since has settled the tier
    /// before); the part past the volume's end is not written.
    fn destage_blocks(
        &mut self,
        names: &HashMap<VolumeId, String>,
        blocks: Destaged<'_>,
    ) -> io::Result<()> {
        let Some(name) = names.get(&blocks.volume) else {
            return Ok(());
        };
        let size = self.existing(name).map_err(io::Error::other)?.size_bytes;
        let start = blocks.block * BLOCK;
        if start >= size {
            return Ok(());
        }
        let len = (size - start).min(blocks.data.len() as u64) as usize;
        match self.is_compressed(name) {
            true => self.destage_compressed(name, start, &blocks.data[..len]),
            false => self.write_placed(name, start, &blocks.data[..len]),
        }
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

/// Whether `len` bytes at `offset` are whole tier blocks.
fn whole(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(BLOCK) && (len as u64).is_multiple_of(BLOCK)
}

/// `blocks` in pieces of at most `piece_bytes` (whole blocks), without a
/// copy where they are borrowed or one piece.
fn pieces(blocks: Cow<'_, [u8]>, piece_bytes: usize) -> Vec<Cow<'_, [u8]>> {
    match blocks {
        Cow::Borrowed(bytes) => bytes.chunks(piece_bytes).map(Cow::Borrowed).collect(),
        Cow::Owned(bytes) if bytes.len() <= piece_bytes => vec![Cow::Owned(bytes)],
        Cow::Owned(bytes) => bytes
            .chunks(piece_bytes)
            .map(|piece| Cow::Owned(piece.to_vec()))
            .collect(),
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
            compression: crate::compression::Compression::None,
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
    fn a_group_of_writes_shares_batches_and_each_gets_its_own_result() {
        let mut pool = pool();
        pool.attach_tier(FaultyMedia::new(1, TIER_BYTES, 2), [9; 16], 2)
            .unwrap();
        let write = |offset, data| GroupWrite {
            volume: "v",
            offset,
            data,
        };
        let results = pool.write_group(&[
            write(0, &[1; 4096]),
            write(8192, &[2; 4096]),
            // Reads block 0 as the first write left it: that batch is
            // appended before.
            write(512, &[3; 512]),
            write(1 << 20, &[4; 4096]),
            write(4096, &[5; 4096]),
        ]);
        assert!(results[3]
            .as_ref()
            .is_err_and(|e| e.to_string().contains("the volume is 1048576 bytes")));
        assert!(results.iter().enumerate().all(|(i, r)| i == 3 || r.is_ok()));
        // Two batches: the first write's, then the three others' (a header
        // block and the data blocks each).
        assert_eq!(pool.tier_info().unwrap().used_bytes, (2 + 4) * BLOCK);
        let expected = [
            vec![1; 512],
            vec![3; 512],
            vec![1; 3072],
            vec![5; 4096],
            vec![2; 4096],
        ];
        assert_eq!(read(&mut pool, 0, 3 * 4096), expected.concat());
        let (media, tier) = pool.into_media_and_tier();
        let mut pool = Pool::open_with_tier(media.crash(), tier.map(FaultyMedia::crash)).unwrap();
        assert_eq!(read(&mut pool, 0, 3 * 4096), expected.concat(), "replayed");
    }

    #[test]
    fn a_tier_removed_is_destaged_first_and_the_pool_opens_without_it() {
        let mut pool = pool();
        pool.attach_tier(FaultyMedia::new(1, TIER_BYTES, 2), [9; 16], 2)
            .unwrap();
        pool.write("v", 4096, &[6; 8192]).unwrap();
        let mut tier = pool.detach_tier().unwrap();
        assert_eq!(pool.tier_info(), None);
        assert!(!crate::tier::probe(&mut tier, 0), "its superblocks erased");
        let error = pool.detach_tier().unwrap_err().to_string();
        assert!(error.contains("it has none"), "{error}");
        pool.write("v", 0, &[7; 4096]).unwrap();
        pool.flush().unwrap();
        let (media, _) = pool.into_media_and_tier();
        let mut pool = Pool::open(media.crash()).unwrap();
        assert_eq!(
            read(&mut pool, 0, 3 * 4096),
            [vec![7; 4096], vec![6; 8192]].concat()
        );
        // And it takes a tier again.
        pool.attach_tier(tier, [8; 16], 1).unwrap();
        assert_eq!(read(&mut pool, 4096, 4096), [6; 4096]);
    }

    #[test]
    fn the_tiers_presence_follows_its_blocks_and_outlives_a_reload() {
        let mut pool = pool();
        pool.attach_tier(FaultyMedia::new(1, TIER_BYTES, 2), [9; 16], 2)
            .unwrap();
        let id = pool.volume("v").unwrap().id;
        let presence = pool.tier_presence().unwrap();
        assert!(!presence.may_hold(&id, 0, 1 << 20));
        pool.write("v", 8192, &[4; 4096]).unwrap();
        assert!(presence.may_hold(&id, 8192, 4096));
        // A failure and a reload: the tier's log is opened again, and the
        // counters the data plane holds say what it found.
        pool.media_mut().fail_next_syncs(1);
        assert!(pool.flush().is_err());
        pool.reload().unwrap();
        assert!(Arc::ptr_eq(&presence, &pool.tier_presence().unwrap()));
        assert!(presence.may_hold(&id, 8192, 4096), "replayed");
        pool.settle_tier().unwrap();
        assert!(!presence.may_hold(&id, 0, 1 << 20), "destaged");
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
