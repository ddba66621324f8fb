//! A write tier on one member of a [`Media`]: its rings (one per writer,
//! so that writers never share a head), each block's newest copy found in
//! memory, destage in pool order, and the superblock that records it.
//!
//! Why a watermark: two rings may hold copies of one block, and the newer
//! one (the higher pool order) may be destaged and released first. Were
//! the older one then replayed, the block would go back in time. So the
//! superblock records the pool order up to which every write is on the
//! capacity devices (`destaged`), and replay passes over every write at or
//! below it. A destage round takes the lowest of the rings' highest orders
//! among their oldest batches (as many as the caller asks) as the new
//! watermark, writes every batch that
//! has an order at or below it, syncs the capacity devices, then writes
//! the watermark and every ring's new tail in one superblock (the rings'
//! tails move past the batches wholly at or below it).
//!
//! What this does not do: own the media (the caller passes it, with the
//! capacity devices a destage writes to), run appends concurrently (the
//! data plane's rings will), or trim.

use super::format::{
    BatchHeader, BatchKind, Extent, Invalid, RingTail, Superblock, TierId, VolumeId, EXTENTS_MAX,
    RINGS_MAX, RINGS_START, RING_BLOCKS_MIN,
};
use super::presence::TierPresence;
use super::ring::{Live, Ring};
use super::{TierError, TIER_BLOCK_BYTES};
use crate::media::Media;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

const BLOCK: u64 = TIER_BLOCK_BYTES;

/// One host write for the tier: whole blocks of one volume.
#[derive(Debug, Clone, Copy)]
pub struct TierWrite<'a> {
    /// The volume.
    pub volume: VolumeId,
    /// The first block written ([`TIER_BLOCK_BYTES`] each).
    pub first_block: u64,
    /// The bytes: whole blocks.
    pub data: &'a [u8],
    /// The write's place in the pool's order of writes, from
    /// [`TierLog::take_order`] when it arrived: a write issued after
    /// another was acknowledged has a higher one, and the newer of two
    /// copies of a block is the one with the higher.
    pub pool_order: u64,
}

/// Consecutive blocks on their way to the capacity devices.
#[derive(Debug, Clone, Copy)]
pub struct Destaged<'a> {
    /// The volume.
    pub volume: VolumeId,
    /// The first block.
    pub block: u64,
    /// The blocks' newest bytes (whole blocks).
    pub data: &'a [u8],
}

/// Where a block's newest copy is.
#[derive(Debug, Clone, Copy)]
struct Newest {
    data_offset: u64,
    pool_order: u64,
}

/// A write tier (see the module's docs).
#[derive(Debug)]
pub struct TierLog {
    member: usize,
    id: TierId,
    rings: Vec<Ring>,
    ring_bytes: u64,
    generation: u64,
    /// Every write of this pool order or lower is on the capacity devices.
    destaged: u64,
    /// The next pool order to take.
    next_order: u64,
    /// This open's count (see [`Superblock::opens`]): its batches carry it.
    opens: u64,
    newest: HashMap<(VolumeId, u64), Newest>,
    /// The regions `newest` has blocks in, for the data plane.
    presence: Arc<TierPresence>,
    /// Why the tier failed: a write or sync of the tier device did not
    /// complete, so what its rings hold is unknown until it is opened again.
    failed: Option<String>,
}

impl TierLog {
    /// Makes member `member` of `media` an empty tier `id` of `rings`
    /// rings of equal size (the device's size rounded down to whole blocks).
    pub fn format<M: Media>(
        media: &mut M,
        member: usize,
        id: TierId,
        rings: usize,
    ) -> Result<TierLog, TierError> {
        let device_bytes = media.size_bytes(member);
        if rings == 0 || rings > RINGS_MAX {
            return Err(TierError::Invalid(format!(
                "{rings} rings: a tier has 1 to {RINGS_MAX}"
            )));
        }
        let ring_bytes = device_bytes.saturating_sub(RINGS_START) / rings as u64 / BLOCK * BLOCK;
        if ring_bytes < RING_BLOCKS_MIN * BLOCK {
            let least = RINGS_START + rings as u64 * RING_BLOCKS_MIN * BLOCK;
            return Err(TierError::Invalid(format!(
                "a write tier device of {device_bytes} bytes for {rings} rings: it needs at least {least}"
            )));
        }
        let ring_start = |i: u64| RINGS_START + i * ring_bytes;
        let sb = Superblock {
            id,
            ring_start: RINGS_START,
            ring_bytes,
            generation: 1,
            destaged: 0,
            opens: 1,
            tails: (0..rings as u64)
                .map(|i| RingTail {
                    offset: ring_start(i),
                    seq: 1,
                })
                .collect(),
        };
        let zeroes = vec![0; BLOCK as usize];
        // A batch of an earlier tier at a ring's start is another tier's,
        // but zero it anyway: the first replay reads nothing but zeroes.
        for i in 0..rings as u64 {
            io_step(
                media.write_at(member, ring_start(i), &zeroes),
                "clear a ring's start",
            )?;
        }
        let copy = superblock_offset(sb.generation);
        io_step(
            media.write_at(member, BLOCK - copy, &zeroes),
            "clear the other superblock",
        )?;
        io_step(
            media.write_at(member, copy, &sb.encode()),
            "write the superblock",
        )?;
        io_step(media.sync(member), "sync the new tier")?;
        Ok(TierLog::empty(member, &sb))
    }

    /// Opens tier `id` on member `member` of `media`: the newer valid
    /// superblock copy, then each ring's batches from its tail that check,
    /// in sequence (the first that does not ends the ring).
    pub fn open<M: Media>(media: &mut M, member: usize, id: TierId) -> Result<TierLog, TierError> {
        let device_bytes = media.size_bytes(member);
        let mut copies = Vec::new();
        for copy in 0..2 {
            let mut block = vec![0; BLOCK as usize];
            io_step(
                media.read_at(member, copy * BLOCK, &mut block),
                "read a superblock",
            )?;
            copies.push(Superblock::decode(&block, &id, device_bytes));
        }
        let [a, b]: [Result<Superblock, Invalid>; 2] = copies.try_into().expect("two copies");
        let sb = match (a, b) {
            (Ok(a), Ok(b)) => {
                if a.generation >= b.generation {
                    a
                } else {
                    b
                }
            }
            (Ok(a), Err(_)) => a,
            (Err(_), Ok(b)) => b,
            (Err(a), Err(b)) => {
                return Err(TierError::Corrupt(format!(
                    "no write tier superblock of this pool on the device (first copy: {}; second: {}); is it the right device?",
                    describe(&a),
                    describe(&b)
                )))
            }
        };
        let mut log = TierLog::empty(member, &sb);
        for ring in &mut log.rings {
            ring.replay(media, member, &id, sb.opens)?;
        }
        // A new count before anything is written: what this open writes
        // can never be mistaken for what the last one left half done.
        log.opens = sb.opens + 1;
        log.write_superblock(media, log.destaged, &[])?;
        let replayed: Vec<Vec<(Extent, u64)>> = log
            .rings
            .iter()
            .flat_map(|r| r.live.iter().map(|l| l.extents.clone()))
            .collect();
        for extents in &replayed {
            log.index(extents);
        }
        let highest = log.rings.iter().map(|r| r.last_order).max().unwrap_or(0);
        log.next_order = log.next_order.max(highest + 1);
        Ok(log)
    }

    fn empty(member: usize, sb: &Superblock) -> TierLog {
        TierLog {
            member,
            id: sb.id,
            rings: (0..sb.tails.len())
                .map(|i| Ring::new(sb.ring(i), sb.tails[i]))
                .collect(),
            ring_bytes: sb.ring_bytes,
            generation: sb.generation,
            destaged: sb.destaged,
            next_order: sb.destaged + 1,
            opens: sb.opens,
            newest: HashMap::new(),
            presence: Arc::default(),
            failed: None,
        }
    }

    /// Takes the next pool order for a write of ring `ring` (see
    /// [`TierWrite::pool_order`]): it goes in the ring's next batches, in
    /// the order taken.
    pub fn take_order(&mut self, ring: usize) -> Result<u64, TierError> {
        self.ring(ring)?;
        let order = self.next_order;
        self.next_order += 1;
        self.rings[ring].taken.push_back(order);
        Ok(order)
    }

    fn ring(&self, ring: usize) -> Result<&Ring, TierError> {
        self.rings.get(ring).ok_or_else(|| {
            TierError::Invalid(format!("ring {ring} of a tier of {}", self.rings.len()))
        })
    }

    /// Makes `writes` durable in one batch of ring `ring`. Returns once the
    /// batch, and every one before it in the ring, is durable. Refused,
    /// with nothing written, when the ring has no room (destage first), or
    /// a pool order is not above the ring's last.
    pub fn append<M: Media>(
        &mut self,
        media: &mut M,
        ring: usize,
        writes: &[TierWrite<'_>],
    ) -> Result<(), TierError> {
        self.check()?;
        let extents = match self.extents_of(ring, writes) {
            Ok(extents) => extents,
            Err(error) => {
                self.forget_orders(ring, writes);
                return Err(error);
            }
        };
        let data_bytes: u64 = writes.iter().map(|w| w.data.len() as u64).sum();
        let needed = BLOCK + data_bytes;
        if !self.rings[ring].fits_ever(needed) {
            self.forget_orders(ring, writes);
            return Err(TierError::Invalid(format!(
                "a batch of {needed} bytes does not fit a tier ring of {} bytes: write less at once",
                self.ring_bytes
            )));
        }
        if self.rings[ring].rewinds_for(needed) {
            let start = self.rings[ring].span.start;
            self.rings[ring].head = start;
            self.write_superblock(media, self.destaged, &[])?;
        }
        let (wrap_at, offset) = self.rings[ring].place(needed)?;
        let mut seq = self.rings[ring].next_seq;
        let mut wrap = None;
        if let Some(at) = wrap_at {
            let header = BatchHeader {
                id: self.id,
                seq,
                opens: self.opens,
                kind: BatchKind::Wrap,
            };
            self.step(
                media.write_at(self.member, at, &header.encode()),
                "append: write a wrap",
            )?;
            // Durable before the batch at the ring's start: a batch kept
            // without its wrap would be left beyond where replay stops.
            self.step(media.sync(self.member), "append: sync a wrap")?;
            wrap = Some(Live::wrap(at, self.rings[ring].span.end, seq));
            seq += 1;
        }
        let mut data = Vec::with_capacity(data_bytes as usize);
        for w in writes {
            data.extend_from_slice(w.data);
        }
        let header = BatchHeader {
            id: self.id,
            seq,
            opens: self.opens,
            kind: BatchKind::Data {
                extents: extents.clone(),
                data_crc: crc32c::crc32c(&data),
            },
        };
        let mut bytes = header.encode();
        bytes.extend_from_slice(&data);
        self.step(
            media.write_at(self.member, offset, &bytes),
            "append: write a batch",
        )?;
        self.step(media.sync(self.member), "append: sync")?;
        let batch = Live::batch(offset, seq, &extents);
        self.index(&batch.extents);
        let taken = &mut self.rings[ring].taken;
        taken.retain(|order| !extents.iter().any(|e| e.pool_order == *order));
        self.rings[ring].appended(wrap, batch);
        Ok(())
    }

    /// The extents of `writes` for ring `ring`, checked: whole blocks, pool
    /// orders taken for the ring and above its batches'.
    fn extents_of(&self, ring: usize, writes: &[TierWrite<'_>]) -> Result<Vec<Extent>, TierError> {
        let r = self.ring(ring)?;
        if writes.is_empty() || writes.len() > EXTENTS_MAX {
            return Err(TierError::Invalid(format!(
                "a batch holds 1 to {EXTENTS_MAX} writes, not {}",
                writes.len()
            )));
        }
        let floor = r.last_order.max(self.destaged);
        writes
            .iter()
            .map(|w| {
                let len = w.data.len() as u64;
                let blocks = u32::try_from(len / BLOCK)
                    .ok()
                    .filter(|&b| b > 0 && len.is_multiple_of(BLOCK));
                let blocks = blocks.ok_or_else(|| {
                    TierError::Invalid(format!(
                        "a write of {len} bytes: whole blocks of {BLOCK} bytes only"
                    ))
                })?;
                if w.pool_order <= floor {
                    return Err(TierError::Invalid(format!(
                        "pool order {} is not above ring {ring}'s batches' ({floor})",
                        w.pool_order
                    )));
                }
                Ok(Extent {
                    volume: w.volume,
                    first_block: w.first_block,
                    blocks,
                    pool_order: w.pool_order,
                })
            })
            .collect::<Result<Vec<Extent>, TierError>>()
            .and_then(|extents| {
                // The ring's oldest orders taken, all of them: appended in
                // the order taken, none left behind to hold the watermark.
                let mut orders: Vec<u64> = extents.iter().map(|e| e.pool_order).collect();
                orders.sort_unstable();
                if !orders.iter().eq(r.taken.iter().take(orders.len())) {
                    return Err(TierError::Invalid(format!(
                        "pool orders {orders:?} are not the oldest taken for ring {ring}: append its writes in the order their orders were taken"
                    )));
                }
                Ok(extents)
            })
    }

    /// Lets the orders of `writes` go (a refused batch: its writes fail).
    fn forget_orders(&mut self, ring: usize, writes: &[TierWrite<'_>]) {
        if let Some(r) = self.rings.get_mut(ring) {
            r.taken
                .retain(|order| !writes.iter().any(|w| w.pool_order == *order));
        }
    }

    /// Reads block `block` of volume `volume` into `buf` (one block) if the
    /// tier holds it: whether it did.
    pub fn read<M: Media>(
        &self,
        media: &mut M,
        volume: VolumeId,
        block: u64,
        buf: &mut [u8],
    ) -> Result<bool, TierError> {
        self.check()?;
        let Some(newest) = self.newest.get(&(volume, block)) else {
            return Ok(false);
        };
        io_step(
            media.read_at(self.member, newest.data_offset, &mut buf[..BLOCK as usize]),
            "read a block",
        )?;
        Ok(true)
    }

    /// Runs up to `rounds` destage rounds (see the module's docs) of up to
    /// `batches` batches of each ring: each gives the runs of blocks still
    /// newest in the batches it destages to `write` (the capacity
    /// devices), then `sync` once, then releases what it can with one
    /// superblock. Stops early when a round releases nothing (a write on
    /// its way holds the watermark back). Returns the batches released. A
    /// failure of `write` or `sync` releases nothing (the rings are intact:
    /// try again, or fail the pool).
    pub fn destage<M: Media>(
        &mut self,
        media: &mut M,
        rounds: usize,
        batches: usize,
        mut write: impl FnMut(&mut M, Destaged<'_>) -> io::Result<()>,
        mut sync: impl FnMut(&mut M) -> io::Result<()>,
    ) -> Result<usize, TierError> {
        self.check()?;
        let mut released = 0;
        for _ in 0..rounds {
            // The lowest of the rings' highest orders among their oldest
            // `batches` batches, below every order taken for a
            // write not in a batch yet, and never below what a superblock
            // already says (batches replayed at or below it are released
            // with this round).
            let oldest = self
                .rings
                .iter()
                .filter_map(|r| {
                    let orders = r.live.iter().filter_map(|l| l.orders);
                    orders.take(batches).last()
                })
                .map(|(_, highest)| highest)
                .min();
            let Some(oldest) = oldest else {
                // Nothing to destage; wraps alone may still be released.
                released += self.release(media, self.destaged)?;
                break;
            };
            let on_their_way = self.rings.iter().filter_map(|r| r.taken.front()).min();
            let watermark = on_their_way
                .map_or(oldest, |&order| oldest.min(order - 1))
                .max(self.destaged);
            let written = self.write_batches(media, watermark, &mut write)?;
            sync(media).map_err(|source| capacity("destage: sync", source))?;
            // Only now: a failed sync may have lost what was written.
            for (ring, index) in written {
                self.rings[ring].live[index].destaged = true;
            }
            let gone = self.release(media, watermark)?;
            released += gone;
            if gone == 0 {
                // Held back by a write on its way: nothing more until it lands.
                break;
            }
        }
        Ok(released)
    }

    /// Gives `write` every block still newest of each batch not destaged
    /// yet with an order at or below `watermark`: the batches it wrote
    /// (ring, place), to be marked destaged once the capacity is synced.
    fn write_batches<M: Media>(
        &mut self,
        media: &mut M,
        watermark: u64,
        write: &mut impl FnMut(&mut M, Destaged<'_>) -> io::Result<()>,
    ) -> Result<Vec<(usize, usize)>, TierError> {
        let mut buf = Vec::new();
        let mut written = Vec::new();
        for (r, ring) in self.rings.iter().enumerate() {
            for (index, live) in ring.live.iter().enumerate() {
                let Some((lowest, _)) = live.orders else {
                    continue;
                };
                if lowest > watermark {
                    break;
                }
                if live.destaged {
                    continue;
                }
                for (extent, data_offset) in &live.extents {
                    let blocks = u64::from(extent.blocks);
                    buf.resize((blocks * BLOCK) as usize, 0);
                    io_step(
                        media.read_at(self.member, *data_offset, &mut buf),
                        "destage: read an extent",
                    )?;
                    // Runs of the blocks whose newest copy this is, each
                    // written at once.
                    let newest_here = |i: u64| {
                        let newest = self.newest.get(&(extent.volume, extent.first_block + i));
                        newest.map(|n| n.data_offset) == Some(data_offset + i * BLOCK)
                    };
                    let mut i = 0;
                    while i < blocks {
                        if !newest_here(i) {
                            i += 1;
                            continue;
                        }
                        let start = i;
                        while i < blocks && newest_here(i) {
                            i += 1;
                        }
                        let destaged = Destaged {
                            volume: extent.volume,
                            block: extent.first_block + start,
                            data: &buf[(start * BLOCK) as usize..(i * BLOCK) as usize],
                        };
                        write(media, destaged)
                            .map_err(|source| capacity("destage: write blocks", source))?;
                    }
                }
                written.push((r, index));
            }
        }
        Ok(written)
    }

    /// Makes `watermark` and the tails past every batch wholly at or
    /// below it durable, then lets their space go. Returns how many went.
    fn release<M: Media>(&mut self, media: &mut M, watermark: u64) -> Result<usize, TierError> {
        let counts: Vec<usize> = self
            .rings
            .iter()
            .map(|r| {
                r.live
                    .iter()
                    .take_while(|l| l.orders.is_none_or(|(_, highest)| highest <= watermark))
                    .count()
            })
            .collect();
        if watermark == self.destaged && counts.iter().all(|&c| c == 0) {
            return Ok(0);
        }
        self.write_superblock(media, watermark, &counts)?;
        self.destaged = watermark;
        for (ring, &count) in self.rings.iter_mut().zip(&counts) {
            for live in ring.release(count) {
                for (extent, data_offset) in &live.extents {
                    for i in 0..u64::from(extent.blocks) {
                        let key = (extent.volume, extent.first_block + i);
                        if self.newest.get(&key).map(|n| n.data_offset)
                            == Some(data_offset + i * BLOCK)
                        {
                            self.newest.remove(&key);
                            self.presence.remove(&key.0, key.1);
                        }
                    }
                }
            }
        }
        Ok(counts.iter().sum())
    }

    /// Makes durable a superblock with `destaged` and each ring's tail once
    /// its first `released[ring]` batches are gone (none if not given), in
    /// the copy the current one is not in.
    fn write_superblock<M: Media>(
        &mut self,
        media: &mut M,
        destaged: u64,
        released: &[usize],
    ) -> Result<(), TierError> {
        let sb = Superblock {
            id: self.id,
            ring_start: RINGS_START,
            ring_bytes: self.ring_bytes,
            generation: self.generation + 1,
            destaged,
            opens: self.opens,
            tails: self
                .rings
                .iter()
                .enumerate()
                .map(|(i, r)| r.tail_after(released.get(i).copied().unwrap_or(0)))
                .collect(),
        };
        let copy = superblock_offset(sb.generation);
        self.step(
            media.write_at(self.member, copy, &sb.encode()),
            "write the superblock",
        )?;
        self.step(media.sync(self.member), "sync the superblock")?;
        self.generation = sb.generation;
        Ok(())
    }

    /// Which regions of the volumes have blocks in the tier (shared with
    /// the data plane).
    pub fn presence(&self) -> &Arc<TierPresence> {
        &self.presence
    }

    /// Takes `presence` (an earlier open's, which the data plane holds)
    /// as this one's, its counters set to what this open found.
    pub fn adopt_presence(&mut self, presence: Arc<TierPresence>) {
        presence.reset(self.newest.keys());
        self.presence = presence;
    }

    /// Bytes the rings' live batches hold (what a destage of them all frees).
    pub fn used_bytes(&self) -> u64 {
        self.rings.iter().map(Ring::used_bytes).sum()
    }

    /// Batches (and wraps) in the rings.
    pub fn live_batches(&self) -> usize {
        self.rings.iter().map(|r| r.live.len()).sum()
    }

    /// Blocks whose newest copy is in the tier.
    pub fn blocks(&self) -> usize {
        self.newest.len()
    }

    /// Its rings.
    pub fn rings(&self) -> usize {
        self.rings.len()
    }

    /// Bytes of each ring.
    pub fn ring_bytes(&self) -> u64 {
        self.ring_bytes
    }

    /// Bytes of all its rings.
    pub fn capacity_bytes(&self) -> u64 {
        self.ring_bytes * self.rings.len() as u64
    }

    /// Takes a batch's extents in (replayed or appended): its blocks' newest
    /// copies. Replay passes over writes at or below the watermark.
    fn index(&mut self, extents: &[(Extent, u64)]) {
        for (extent, data_offset) in extents {
            if extent.pool_order <= self.destaged {
                continue;
            }
            for i in 0..u64::from(extent.blocks) {
                let newest = Newest {
                    data_offset: data_offset + i * BLOCK,
                    pool_order: extent.pool_order,
                };
                let block = extent.first_block + i;
                match self.newest.entry((extent.volume, block)) {
                    Entry::Vacant(vacant) => {
                        vacant.insert(newest);
                        self.presence.add(&extent.volume, block);
                    }
                    Entry::Occupied(mut slot) => {
                        if newest.pool_order >= slot.get().pool_order {
                            slot.insert(newest);
                        }
                    }
                }
            }
        }
    }

    fn check(&self) -> Result<(), TierError> {
        match &self.failed {
            Some(reason) => Err(TierError::Failed(reason.clone())),
            None => Ok(()),
        }
    }

    /// A tier device write or sync: its failure fails the tier.
    fn step(&mut self, result: io::Result<()>, context: &str) -> Result<(), TierError> {
        result.map_err(|source| {
            self.failed = Some(format!("{context}: {source}"));
            TierError::Io {
                context: context.to_string(),
                source,
            }
        })
    }
}

/// Where the superblock of generation `generation` goes: the two copies in
/// turn, so that the one being written is never the current one.
fn superblock_offset(generation: u64) -> u64 {
    generation % 2 * BLOCK
}

fn describe(invalid: &Invalid) -> String {
    match invalid {
        Invalid::Magic => "none".into(),
        Invalid::Crc => "damaged (checksum)".into(),
        Invalid::OtherTier => "another pool's tier".into(),
        Invalid::Field(what) => what.clone(),
    }
}

fn io_step(result: io::Result<()>, context: &str) -> Result<(), TierError> {
    result.map_err(|source| TierError::Io {
        context: context.to_string(),
        source,
    })
}

fn capacity(context: &str, source: io::Error) -> TierError {
    TierError::Io {
        context: format!("{context} to the capacity devices"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FaultyMedia;

    const ID: TierId = [7; 16];
    const TIER: usize = 0;
    const CAPACITY: usize = 1;

    fn block(seed: u8) -> Vec<u8> {
        vec![seed; BLOCK as usize]
    }

    /// Appends `writes` (volume, first block, data) to ring `ring` in one
    /// batch, each with the next pool order.
    fn put(
        log: &mut TierLog,
        media: &mut FaultyMedia,
        ring: usize,
        writes: &[(u8, u64, &[u8])],
    ) -> Result<(), TierError> {
        let mut batch = Vec::new();
        for &(volume, first_block, data) in writes {
            batch.push(TierWrite {
                volume: [volume; 16],
                first_block,
                data,
                pool_order: log.take_order(ring)?,
            });
        }
        log.append(media, ring, &batch)
    }

    fn read(log: &TierLog, media: &mut FaultyMedia, volume: u8, b: u64) -> Option<u8> {
        let mut buf = block(0);
        let found = log.read(media, [volume; 16], b, &mut buf).unwrap();
        found.then_some(buf[0])
    }

    fn capacity_byte(media: &mut FaultyMedia, b: u64) -> u8 {
        let mut buf = block(0);
        media.read_at(CAPACITY, b * BLOCK, &mut buf).unwrap();
        buf[0]
    }

    fn destage(log: &mut TierLog, media: &mut FaultyMedia, rounds: usize) -> usize {
        log.destage(
            media,
            rounds,
            1,
            |m, d| m.write_at(CAPACITY, d.block * BLOCK, d.data),
            |m| m.sync(CAPACITY),
        )
        .unwrap()
    }

    #[test]
    fn appended_blocks_read_back_the_newest_and_survive_a_power_cut() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 1);
        let mut log = TierLog::format(&mut media, TIER, ID, 2).unwrap();
        let (a, b) = (block(0xA), block(0xB));
        put(&mut log, &mut media, 0, &[(1, 5, &a), (2, 5, &a)]).unwrap();
        put(&mut log, &mut media, 1, &[(1, 5, &b)]).unwrap();
        assert_eq!(read(&log, &mut media, 1, 5), Some(0xB));
        assert_eq!(read(&log, &mut media, 2, 5), Some(0xA));
        assert_eq!(read(&log, &mut media, 1, 6), None);
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!((log.rings(), log.live_batches()), (2, 2));
        assert_eq!(read(&log, &mut media, 1, 5), Some(0xB));
        assert_eq!(read(&log, &mut media, 2, 5), Some(0xA));
    }

    #[test]
    fn a_newer_copy_in_another_ring_is_never_undone_by_an_older_one_replayed() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 2);
        let mut log = TierLog::format(&mut media, TIER, ID, 2).unwrap();
        // Ring 0: block 3 at order 1, then block 9 at order 3; ring 1:
        // block 3 at order 2.
        put(&mut log, &mut media, 0, &[(0, 3, &block(1))]).unwrap();
        put(&mut log, &mut media, 1, &[(0, 3, &block(2))]).unwrap();
        put(&mut log, &mut media, 0, &[(0, 9, &block(3))]).unwrap();
        // The first round's watermark is 1 (ring 0's oldest): block 3's
        // copy there is not its newest, so nothing is written, and ring 0's
        // first batch goes. The second's is 2: ring 1's copy of block 3.
        assert_eq!(destage(&mut log, &mut media, 1), 1);
        assert_eq!(capacity_byte(&mut media, 3), 0);
        assert_eq!(destage(&mut log, &mut media, 1), 1);
        assert_eq!(capacity_byte(&mut media, 3), 2);
        assert_eq!(read(&log, &mut media, 0, 3), None);
        let mut media = media.crash();
        let mut log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(log.live_batches(), 1);
        assert_eq!(read(&log, &mut media, 0, 3), None);
        assert_eq!(read(&log, &mut media, 0, 9), Some(3));
        assert_eq!(destage(&mut log, &mut media, 9), 1);
        assert_eq!((log.used_bytes(), log.blocks()), (0, 0));
        assert_eq!(capacity_byte(&mut media, 9), 3);
    }

    #[test]
    fn the_watermark_stays_below_a_write_on_its_way() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 7);
        let mut log = TierLog::format(&mut media, TIER, ID, 2).unwrap();
        // Ring 0 takes order 1 for a write still being gathered; ring 1
        // appends order 2: its batch cannot be destaged (the watermark
        // stays at 0, or a replay would pass over order 1 once it lands).
        let early = log.take_order(0).unwrap();
        put(&mut log, &mut media, 1, &[(0, 4, &block(2))]).unwrap();
        assert_eq!(destage(&mut log, &mut media, 1), 0);
        assert_eq!(capacity_byte(&mut media, 4), 0);
        let data = block(1);
        let late = TierWrite {
            volume: [0; 16],
            first_block: 4,
            data: &data,
            pool_order: early,
        };
        log.append(&mut media, 0, &[late]).unwrap();
        let mut media = media.crash();
        let mut log = TierLog::open(&mut media, TIER, ID).unwrap();
        // Block 4's newer copy is order 2's, wherever it is read from.
        assert_eq!(read(&log, &mut media, 0, 4), Some(2));
        assert_eq!(destage(&mut log, &mut media, 9), 2);
        assert_eq!(read(&log, &mut media, 0, 4), None);
        assert_eq!(capacity_byte(&mut media, 4), 2);
    }

    #[test]
    fn a_batch_left_beyond_where_replay_stopped_is_never_taken_in_later() {
        // One ring of ten blocks (device blocks 2 to 12).
        let mut media = FaultyMedia::new(2, 12 * BLOCK as usize, 8);
        let mut log = TierLog::format(&mut media, TIER, ID, 1).unwrap();
        let two = [block(1), block(1)].concat();
        put(&mut log, &mut media, 0, &[(0, 0, &two)]).unwrap();
        put(&mut log, &mut media, 0, &[(0, 2, &two)]).unwrap();
        put(&mut log, &mut media, 0, &[(0, 4, &block(1))]).unwrap();
        assert_eq!(destage(&mut log, &mut media, 2), 2);
        // Its head two blocks before the end: a wrap there, the batch
        // (block 7 = 2) at the ring's start. Then the wrap is lost, as
        // a power cut could lose it were it not synced first.
        let stale = [block(2), block(2)].concat();
        put(&mut log, &mut media, 0, &[(0, 7, &stale)]).unwrap();
        media.write_at(TIER, 10 * BLOCK, &block(0)).unwrap();
        media.sync(TIER).unwrap();
        let mut media = media.crash();
        let mut log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(read(&log, &mut media, 0, 7), None);
        // Block 7 = 3 fills the ring to its end: the head is at the start,
        // with the sequence the batch left there has.
        put(&mut log, &mut media, 0, &[(0, 7, &block(3))]).unwrap();
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(read(&log, &mut media, 0, 7), Some(3));
        assert_eq!(read(&log, &mut media, 0, 8), None);
    }

    #[test]
    fn a_destage_whose_sync_failed_writes_its_batches_again() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 9);
        let mut log = TierLog::format(&mut media, TIER, ID, 1).unwrap();
        put(&mut log, &mut media, 0, &[(0, 3, &block(7))]).unwrap();
        // The capacity device's sync fails and its cache lost the write.
        let failed = log.destage(
            &mut media,
            1,
            1,
            |m, d| m.write_at(CAPACITY, d.block * BLOCK, d.data),
            |m| {
                m.write_at(CAPACITY, 3 * BLOCK, &block(0))?;
                Err(io::Error::from_raw_os_error(5))
            },
        );
        assert!(matches!(failed, Err(TierError::Io { .. })), "{failed:?}");
        assert_eq!(read(&log, &mut media, 0, 3), Some(7));
        assert_eq!(destage(&mut log, &mut media, 1), 1);
        assert_eq!(read(&log, &mut media, 0, 3), None);
        assert_eq!(capacity_byte(&mut media, 3), 7);
    }

    #[test]
    fn a_full_ring_refuses_until_destaged_and_wraps_with_a_marker() {
        // One ring of ten blocks: room for nine, a block kept free.
        let mut media = FaultyMedia::new(2, 12 * BLOCK as usize, 3);
        let mut log = TierLog::format(&mut media, TIER, ID, 1).unwrap();
        let two = [block(1), block(1)].concat();
        for first in 1..4 {
            put(&mut log, &mut media, 0, &[(0, first, &two)]).unwrap();
        }
        let refused = put(&mut log, &mut media, 0, &[(0, 9, &two)]);
        assert!(
            matches!(refused, Err(TierError::Full { needed: 12288, .. })),
            "{refused:?}"
        );
        // One batch destaged is not enough: the ring's start up to the
        // tail is three blocks, with a block of room to keep. (The refused
        // write's order is still taken: it holds the watermark back until
        // it is appended.)
        let mut log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(destage(&mut log, &mut media, 1), 1);
        let refused = put(&mut log, &mut media, 0, &[(0, 9, &two)]);
        assert!(
            matches!(refused, Err(TierError::Full { .. })),
            "{refused:?}"
        );
        let mut log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(destage(&mut log, &mut media, 1), 1);
        // One block left before the end: a wrap there, the batch at the
        // ring's start.
        put(&mut log, &mut media, 0, &[(0, 9, &two)]).unwrap();
        assert_eq!(log.live_batches(), 3);
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(log.live_batches(), 3);
        assert_eq!(read(&log, &mut media, 0, 9), Some(1));
        assert_eq!(read(&log, &mut media, 0, 1), None);
    }

    #[test]
    fn bad_writes_are_refused_with_the_reason_and_a_failed_device_fails_the_tier() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 4);
        let mut log = TierLog::format(&mut media, TIER, ID, 2).unwrap();
        let message = |result: Result<(), TierError>| result.unwrap_err().to_string();
        let half = vec![0; 2048];
        let error = message(put(&mut log, &mut media, 0, &[(0, 0, &half)]));
        assert!(error.contains("whole blocks of 4096 bytes"), "{error}");
        let error = message(log.append(&mut media, 0, &[]));
        assert!(error.contains("1 to 100 writes"), "{error}");
        let error = message(put(&mut log, &mut media, 2, &[(0, 0, &block(1))]));
        assert!(error.contains("ring 2 of a tier of 2"), "{error}");
        let data = block(1);
        let untaken = TierWrite {
            volume: [0; 16],
            first_block: 0,
            data: &data,
            pool_order: 99,
        };
        let error = message(log.append(&mut media, 0, &[untaken]));
        assert!(
            error.contains("pool orders [99] are not the oldest taken for ring 0"),
            "{error}"
        );
        // A refused batch's orders let the watermark go: ring 0's batch
        // below is destaged and released.
        let refused = log.take_order(1).unwrap();
        let error = message(log.append(
            &mut media,
            1,
            &[TierWrite {
                pool_order: refused,
                data: &half,
                ..untaken
            }],
        ));
        assert!(error.contains("whole blocks"), "{error}");
        put(&mut log, &mut media, 0, &[(0, 0, &block(1))]).unwrap();
        assert_eq!(destage(&mut log, &mut media, 9), 1);
        media.fail_after_writes(0);
        assert!(matches!(
            put(&mut log, &mut media, 1, &[(0, 0, &block(1))]),
            Err(TierError::Io { .. })
        ));
        let error = message(put(&mut log, &mut media, 1, &[(0, 0, &block(1))]));
        assert!(error.contains("has failed"), "{error}");
    }

    #[test]
    fn a_device_without_this_tier_is_refused_with_what_it_holds() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 5);
        let error = TierLog::open(&mut media, TIER, ID).unwrap_err();
        assert!(error.to_string().contains("first copy: none"), "{error}");
        TierLog::format(&mut media, TIER, [8; 16], 1).unwrap();
        let error = TierLog::open(&mut media, TIER, ID).unwrap_err();
        assert!(error.to_string().contains("another pool's tier"), "{error}");
        let mut small = FaultyMedia::new(1, 9 * BLOCK as usize, 5);
        let error = TierLog::format(&mut small, 0, ID, 2).unwrap_err();
        assert!(error.to_string().contains("at least 40960"), "{error}");
    }

    #[test]
    fn destaging_everything_then_appending_replays_from_the_new_tails() {
        let mut media = FaultyMedia::new(2, 30 * BLOCK as usize, 6);
        let mut log = TierLog::format(&mut media, TIER, ID, 2).unwrap();
        for round in 1..=20u64 {
            let ring = (round % 2) as usize;
            put(
                &mut log,
                &mut media,
                ring,
                &[(0, round % 4, &block(round as u8))],
            )
            .unwrap();
            if round % 3 == 0 {
                destage(&mut log, &mut media, usize::MAX);
            }
        }
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        // Rounds 19 and 20 are in the tier, the rest on the capacity device.
        assert_eq!(read(&log, &mut media, 0, 3), Some(19));
        assert_eq!(read(&log, &mut media, 0, 0), Some(20));
        assert_eq!(read(&log, &mut media, 0, 2), None);
        assert_eq!(capacity_byte(&mut media, 2), 18);
    }
}
