//! One ring of a write tier on one member of a [`Media`]: batches appended
//! at the head (one write and one sync: the group commit), each block's
//! newest copy found in memory, the oldest batches destaged in order and
//! released by a superblock naming the new tail, and the ring replayed from
//! that tail when opened.
//!
//! Invariants (asserted in the tests, relied on by replay):
//! - The superblock's tail is always the start of a batch on the chain the
//!   head grew from: space is reused only after a superblock naming a tail
//!   past it is durable, and the next batch is always written at the head.
//! - Only one append is in flight, and it returns once durable: a batch is
//!   never acknowledged before the batches ahead of it.
//! - Live batches never reach the tail again: a block of room is kept
//!   between the head and the tail.
//!
//! What this does not do: own the media (the caller passes it, with the
//! capacity devices a destage writes to), run several rings, or trim.

use super::format::{BatchHeader, BatchKind, Extent, Invalid, Superblock, TierId, EXTENTS_MAX};
use super::{TierError, TIER_BLOCK_BYTES};
use crate::media::Media;
use std::collections::{HashMap, VecDeque};
use std::io;

const BLOCK: u64 = TIER_BLOCK_BYTES;
/// The ring starts after the two superblock copies.
const RING_START: u64 = 2 * BLOCK;
/// The smallest ring: room for a batch of one block beside a wrap and the gap.
const RING_BLOCKS_MIN: u64 = 4;

/// One host write for the tier: whole blocks of one volume.
#[derive(Debug, Clone, Copy)]
pub struct TierWrite<'a> {
    /// The volume's number in its pool.
    pub volume: u32,
    /// The first block written ([`TIER_BLOCK_BYTES`] each).
    pub first_block: u64,
    /// The bytes: whole blocks.
    pub data: &'a [u8],
    /// The write's place in the pool's order of writes (given when it was
    /// submitted: the newer of two copies of a block has the higher).
    pub pool_order: u64,
}

/// A block on its way to the capacity devices.
#[derive(Debug, Clone, Copy)]
pub struct Destaged<'a> {
    /// The volume.
    pub volume: u32,
    /// The block.
    pub block: u64,
    /// Its newest bytes.
    pub data: &'a [u8],
}

/// A batch (or wrap) still in the ring, oldest first.
#[derive(Debug)]
struct Live {
    offset: u64,
    /// The ring bytes it holds (a wrap: up to the ring's end).
    bytes: u64,
    seq: u64,
    /// Its extents, with where each one's data starts on the device.
    extents: Vec<(Extent, u64)>,
}

/// Where a block's newest copy is.
#[derive(Debug, Clone, Copy)]
struct Newest {
    data_offset: u64,
    pool_order: u64,
}

/// One ring of a write tier (see the module's docs).
#[derive(Debug)]
pub struct TierLog {
    member: usize,
    id: TierId,
    ring_end: u64,
    /// Where the next batch goes (never the ring's end: the start then).
    head: u64,
    next_seq: u64,
    generation: u64,
    live: VecDeque<Live>,
    newest: HashMap<(u32, u64), Newest>,
    /// Why the tier failed: a write or sync of the tier device did not
    /// complete, so what the ring holds is unknown until it is opened again.
    failed: Option<String>,
}

impl TierLog {
    /// Makes member `member` of `media` an empty tier `id` (its size
    /// rounded down to whole blocks; at least six).
    pub fn format<M: Media>(
        media: &mut M,
        member: usize,
        id: TierId,
    ) -> Result<TierLog, TierError> {
        let ring_end = ring_end(media, member)?;
        let sb = Superblock {
            id,
            ring_start: RING_START,
            ring_end,
            generation: 1,
            tail: RING_START,
            tail_seq: 1,
        };
        let zeroes = vec![0; BLOCK as usize];
        // A batch of an earlier tier at the ring's start is another tier's,
        // but zero it anyway: the first replay reads nothing but zeroes.
        io_step(
            media.write_at(member, RING_START, &zeroes),
            "clear the ring's start",
        )?;
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
    /// superblock copy, then every batch from its tail that checks, in
    /// sequence (the first that does not ends the ring).
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
        let sb = match (&copies[0], &copies[1]) {
            (Ok(a), Ok(b)) => *if a.generation >= b.generation { a } else { b },
            (Ok(a), Err(_)) => *a,
            (Err(_), Ok(b)) => *b,
            (Err(a), Err(b)) => {
                return Err(TierError::Corrupt(format!(
                    "no write tier superblock of this pool on the device (first copy: {}; second: {}); is it the right device?",
                    describe(a),
                    describe(b)
                )))
            }
        };
        let mut log = TierLog::empty(member, &sb);
        log.replay(media, sb.tail, sb.tail_seq)?;
        Ok(log)
    }

    fn empty(member: usize, sb: &Superblock) -> TierLog {
        TierLog {
            member,
            id: sb.id,
            ring_end: sb.ring_end,
            head: sb.tail,
            next_seq: sb.tail_seq,
            generation: sb.generation,
            live: VecDeque::new(),
            newest: HashMap::new(),
            failed: None,
        }
    }

    /// Reads the chain of batches from `offset`, the one with `seq` first.
    fn replay<M: Media>(
        &mut self,
        media: &mut M,
        mut offset: u64,
        mut seq: u64,
    ) -> Result<(), TierError> {
        let room = self.ring_bytes() - BLOCK;
        let mut used = 0;
        loop {
            if offset == self.ring_end {
                offset = RING_START;
            }
            let mut block = vec![0; BLOCK as usize];
            io_step(
                media.read_at(self.member, offset, &mut block),
                "replay: read a batch header",
            )?;
            let Ok(header) = BatchHeader::decode(&block, &self.id) else {
                break;
            };
            if header.seq != seq {
                break;
            }
            let (bytes, extents) = match &header.kind {
                BatchKind::Wrap => (self.ring_end - offset, Vec::new()),
                BatchKind::Data { extents, data_crc } => {
                    let bytes = BLOCK + header.kind.data_bytes();
                    if offset + bytes > self.ring_end || used + bytes > room {
                        break;
                    }
                    let mut data = vec![0; (bytes - BLOCK) as usize];
                    io_step(
                        media.read_at(self.member, offset + BLOCK, &mut data),
                        "replay: read a batch",
                    )?;
                    if crc32c::crc32c(&data) != *data_crc {
                        break;
                    }
                    (bytes, place_extents(extents, offset))
                }
            };
            if used + bytes > room {
                break;
            }
            used += bytes;
            self.admit(Live {
                offset,
                bytes,
                seq,
                extents,
            });
            offset += bytes;
            seq += 1;
        }
        self.head = if offset == self.ring_end {
            RING_START
        } else {
            offset
        };
        self.next_seq = seq;
        Ok(())
    }

    /// Makes `writes` durable in one batch, in their order (a later one of
    /// a block is its newer copy only if its pool order is higher).
    /// Returns once the batch and every one before it is durable. Refused,
    /// with nothing written, when the ring has no room: destage first.
    pub fn append<M: Media>(
        &mut self,
        media: &mut M,
        writes: &[TierWrite<'_>],
    ) -> Result<(), TierError> {
        self.check()?;
        let extents = extents_of(writes)?;
        let data_bytes: u64 = writes.iter().map(|w| w.data.len() as u64).sum();
        let needed = BLOCK + data_bytes;
        if self.live.is_empty() && self.head + needed > self.ring_end && self.head != RING_START {
            // An empty ring whose head is too near its end: the tail (and
            // the head) go back to its start, rather than wrap (a wrap
            // would leave the batch less room than the ring has).
            self.write_superblock(media, RING_START, self.next_seq)?;
            self.head = RING_START;
        }
        let (wrap_at, offset) = self.place(needed)?;
        let mut seq = self.next_seq;
        if let Some(at) = wrap_at {
            let wrap = BatchHeader {
                id: self.id,
                seq,
                kind: BatchKind::Wrap,
            };
            self.step(
                media.write_at(self.member, at, &wrap.encode()),
                "append: write a wrap",
            )?;
            seq += 1;
        }
        let mut data = Vec::with_capacity(data_bytes as usize);
        for w in writes {
            data.extend_from_slice(w.data);
        }
        let kind = BatchKind::Data {
            extents,
            data_crc: crc32c::crc32c(&data),
        };
        let mut bytes = BatchHeader {
            id: self.id,
            seq,
            kind: kind.clone(),
        }
        .encode();
        bytes.extend_from_slice(&data);
        self.step(
            media.write_at(self.member, offset, &bytes),
            "append: write a batch",
        )?;
        self.step(media.sync(self.member), "append: sync")?;
        if let Some(at) = wrap_at {
            self.admit(Live {
                offset: at,
                bytes: self.ring_end - at,
                seq: seq - 1,
                extents: Vec::new(),
            });
        }
        let BatchKind::Data { extents, .. } = kind else {
            unreachable!("a data batch")
        };
        self.admit(Live {
            offset,
            bytes: needed,
            seq,
            extents: place_extents(&extents, offset),
        });
        self.head = offset + needed;
        if self.head == self.ring_end {
            self.head = RING_START;
        }
        self.next_seq = seq + 1;
        Ok(())
    }

    /// Where a batch of `needed` bytes goes: (a wrap first at, the batch at).
    fn place(&self, needed: u64) -> Result<(Option<u64>, u64), TierError> {
        let room = self.ring_bytes() - BLOCK;
        if needed > room - BLOCK {
            return Err(TierError::Invalid(format!(
                "a batch of {needed} bytes does not fit a tier ring of {} bytes: write less at once",
                self.ring_bytes()
            )));
        }
        let head = self.head;
        // The ring is free up to the tail, less a block of room (an empty
        // ring: up to its head, where a wrap would go).
        let limit = match self.live.front() {
            Some(front) => front.offset,
            None => head,
        };
        let full = || TierError::Full {
            needed,
            free: room.saturating_sub(self.used_bytes()),
        };
        let fits_before = |end: u64| end + BLOCK <= limit;
        // What the ring holds afterwards stays within its room too: a batch
        // that ends at the ring's end puts the head at its start, which
        // may be the tail.
        let fits_room = |bytes: u64| self.used_bytes() + bytes <= room;
        if self.live.is_empty() || head > limit {
            if head + needed <= self.ring_end && fits_room(needed) {
                return Ok((None, head));
            }
            let waste = self.ring_end - head;
            if fits_before(RING_START + needed) && fits_room(waste + needed) {
                return Ok((Some(head), RING_START));
            }
            return Err(full());
        }
        if head < limit && fits_before(head + needed) {
            return Ok((None, head));
        }
        Err(full())
    }

    /// Reads block `block` of volume `volume` into `buf` (one block) if the
    /// tier holds it: whether it did.
    pub fn read<M: Media>(
        &self,
        media: &mut M,
        volume: u32,
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

    /// Destages the oldest `batches` batches: gives every block of theirs
    /// that is still its newest copy to `write` (the capacity devices, in
    /// ring order), then `sync` (they are durable there), then releases them
    /// with a superblock naming the next batch as the tail. Returns how many
    /// it released. A failure of `write` or `sync` releases nothing (the
    /// ring is intact: try again, or fail the pool).
    pub fn destage<M: Media>(
        &mut self,
        media: &mut M,
        batches: usize,
        mut write: impl FnMut(&mut M, Destaged<'_>) -> io::Result<()>,
        mut sync: impl FnMut(&mut M) -> io::Result<()>,
    ) -> Result<usize, TierError> {
        self.check()?;
        let count = batches.min(self.live.len());
        if count == 0 {
            return Ok(0);
        }
        let mut buf = vec![0; BLOCK as usize];
        for live in self.live.iter().take(count) {
            for (extent, data_offset) in &live.extents {
                for i in 0..u64::from(extent.blocks) {
                    let block = extent.first_block + i;
                    let at = data_offset + i * BLOCK;
                    if self
                        .newest
                        .get(&(extent.volume, block))
                        .map(|n| n.data_offset)
                        != Some(at)
                    {
                        continue;
                    }
                    io_step(
                        media.read_at(self.member, at, &mut buf),
                        "destage: read a block",
                    )?;
                    let destaged = Destaged {
                        volume: extent.volume,
                        block,
                        data: &buf,
                    };
                    write(media, destaged)
                        .map_err(|source| capacity("destage: write a block", source))?;
                }
            }
        }
        sync(media).map_err(|source| capacity("destage: sync", source))?;
        let (tail, tail_seq) = match self.live.get(count) {
            Some(next) => (next.offset, next.seq),
            None => (self.head, self.next_seq),
        };
        self.write_superblock(media, tail, tail_seq)?;
        for live in self.live.drain(..count) {
            for (extent, data_offset) in &live.extents {
                for i in 0..u64::from(extent.blocks) {
                    let key = (extent.volume, extent.first_block + i);
                    if self.newest.get(&key).map(|n| n.data_offset) == Some(data_offset + i * BLOCK)
                    {
                        self.newest.remove(&key);
                    }
                }
            }
        }
        Ok(count)
    }

    /// Makes a superblock naming `tail` durable, in the copy the current
    /// one is not in.
    fn write_superblock<M: Media>(
        &mut self,
        media: &mut M,
        tail: u64,
        tail_seq: u64,
    ) -> Result<(), TierError> {
        let sb = Superblock {
            id: self.id,
            ring_start: RING_START,
            ring_end: self.ring_end,
            generation: self.generation + 1,
            tail,
            tail_seq,
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

    /// Bytes the live batches hold (what a destage of them all frees).
    pub fn used_bytes(&self) -> u64 {
        self.live.iter().map(|l| l.bytes).sum()
    }

    /// Batches (and wraps) in the ring.
    pub fn live_batches(&self) -> usize {
        self.live.len()
    }

    /// Blocks whose newest copy is in the tier.
    pub fn blocks(&self) -> usize {
        self.newest.len()
    }

    fn ring_bytes(&self) -> u64 {
        self.ring_end - RING_START
    }

    /// Takes a batch in (replayed or appended): its blocks' newest copies.
    fn admit(&mut self, live: Live) {
        for (extent, data_offset) in &live.extents {
            for i in 0..u64::from(extent.blocks) {
                let newest = Newest {
                    data_offset: data_offset + i * BLOCK,
                    pool_order: extent.pool_order,
                };
                let slot = self
                    .newest
                    .entry((extent.volume, extent.first_block + i))
                    .or_insert(newest);
                if newest.pool_order >= slot.pool_order {
                    *slot = newest;
                }
            }
        }
        self.live.push_back(live);
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

/// The extents of `writes`, checked.
fn extents_of(writes: &[TierWrite<'_>]) -> Result<Vec<Extent>, TierError> {
    if writes.is_empty() || writes.len() > EXTENTS_MAX {
        return Err(TierError::Invalid(format!(
            "a batch holds 1 to {EXTENTS_MAX} writes, not {}",
            writes.len()
        )));
    }
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
            Ok(Extent {
                volume: w.volume,
                first_block: w.first_block,
                blocks,
                pool_order: w.pool_order,
            })
        })
        .collect()
}

/// Each extent with where its data starts, for a batch at `offset`.
fn place_extents(extents: &[Extent], offset: u64) -> Vec<(Extent, u64)> {
    let mut at = offset + BLOCK;
    extents
        .iter()
        .map(|e| {
            let placed = (*e, at);
            at += u64::from(e.blocks) * BLOCK;
            placed
        })
        .collect()
}

fn ring_end<M: Media>(media: &M, member: usize) -> Result<u64, TierError> {
    let end = media.size_bytes(member) / BLOCK * BLOCK;
    let least = RING_START + RING_BLOCKS_MIN * BLOCK;
    if end < least {
        return Err(TierError::Invalid(format!(
            "a write tier device of {} bytes: it needs at least {least}",
            media.size_bytes(member)
        )));
    }
    Ok(end)
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

    fn write(volume: u32, first_block: u64, data: &[u8], pool_order: u64) -> TierWrite<'_> {
        TierWrite {
            volume,
            first_block,
            data,
            pool_order,
        }
    }

    fn read(log: &TierLog, media: &mut FaultyMedia, volume: u32, b: u64) -> Option<u8> {
        let mut buf = block(0);
        log.read(media, volume, b, &mut buf)
            .unwrap()
            .then(|| buf[0])
    }

    fn destage_all(log: &mut TierLog, media: &mut FaultyMedia) -> usize {
        log.destage(
            media,
            usize::MAX,
            |m, d| m.write_at(CAPACITY, d.block * BLOCK, d.data),
            |m| m.sync(CAPACITY),
        )
        .unwrap()
    }

    #[test]
    fn appended_blocks_read_back_the_newest_and_survive_a_power_cut() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 1);
        let mut log = TierLog::format(&mut media, TIER, ID).unwrap();
        let (a, b) = (block(0xA), block(0xB));
        log.append(&mut media, &[write(1, 5, &a, 1), write(2, 5, &a, 2)])
            .unwrap();
        log.append(&mut media, &[write(1, 5, &b, 3)]).unwrap();
        assert_eq!(read(&log, &mut media, 1, 5), Some(0xB));
        assert_eq!(read(&log, &mut media, 2, 5), Some(0xA));
        assert_eq!(read(&log, &mut media, 1, 6), None);
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(log.live_batches(), 2);
        assert_eq!(read(&log, &mut media, 1, 5), Some(0xB));
        assert_eq!(read(&log, &mut media, 2, 5), Some(0xA));
    }

    #[test]
    fn a_destage_writes_each_blocks_newest_copy_once_and_frees_the_ring() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 2);
        let mut log = TierLog::format(&mut media, TIER, ID).unwrap();
        log.append(&mut media, &[write(0, 3, &block(1), 1)])
            .unwrap();
        log.append(&mut media, &[write(0, 3, &block(2), 2)])
            .unwrap();
        let mut written = Vec::new();
        log.destage(
            &mut media,
            9,
            |m, d| {
                written.push((d.block, d.data[0]));
                m.write_at(CAPACITY, d.block * BLOCK, d.data)
            },
            |m| m.sync(CAPACITY),
        )
        .unwrap();
        assert_eq!(written, [(3, 2)]);
        assert_eq!((log.used_bytes(), log.blocks()), (0, 0));
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(log.live_batches(), 0);
        let mut buf = block(0);
        media.read_at(CAPACITY, 3 * BLOCK, &mut buf).unwrap();
        assert_eq!(buf, block(2));
    }

    #[test]
    fn a_full_ring_refuses_until_destaged_and_wraps_with_a_marker() {
        // Ten ring blocks: room for eight, a block kept free.
        let mut media = FaultyMedia::new(2, 12 * BLOCK as usize, 3);
        let mut log = TierLog::format(&mut media, TIER, ID).unwrap();
        let two = [block(1), block(1)].concat();
        for order in 0..3 {
            log.append(&mut media, &[write(0, order, &two, order)])
                .unwrap();
        }
        let refused = log.append(&mut media, &[write(0, 9, &two, 9)]);
        assert!(
            matches!(refused, Err(TierError::Full { needed: 12288, .. })),
            "{refused:?}"
        );
        // One batch destaged is not enough: the ring's start up to the
        // tail is three blocks, with a block of room to keep.
        assert_eq!(
            log.destage(&mut media, 1, |_, _| Ok(()), |_| Ok(()))
                .unwrap(),
            1
        );
        let refused = log.append(&mut media, &[write(0, 9, &two, 9)]);
        assert!(
            matches!(refused, Err(TierError::Full { .. })),
            "{refused:?}"
        );
        assert_eq!(
            log.destage(&mut media, 1, |_, _| Ok(()), |_| Ok(()))
                .unwrap(),
            1
        );
        // One block left before the end: a wrap there, the batch at the
        // ring's start.
        log.append(&mut media, &[write(0, 9, &two, 9)]).unwrap();
        assert_eq!(log.live_batches(), 3);
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        assert_eq!(log.live_batches(), 3);
        assert_eq!(read(&log, &mut media, 0, 9), Some(1));
        assert_eq!(read(&log, &mut media, 0, 0), None);
    }

    #[test]
    fn bad_writes_are_refused_with_the_reason_and_a_failed_device_fails_the_tier() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 4);
        let mut log = TierLog::format(&mut media, TIER, ID).unwrap();
        let half = vec![0; 2048];
        let error = log
            .append(&mut media, &[write(0, 0, &half, 1)])
            .unwrap_err();
        assert!(
            error.to_string().contains("whole blocks of 4096 bytes"),
            "{error}"
        );
        let error = log.append(&mut media, &[]).unwrap_err();
        assert!(error.to_string().contains("1 to 144 writes"), "{error}");
        media.fail_after_writes(0);
        assert!(matches!(
            log.append(&mut media, &[write(0, 0, &block(1), 1)]),
            Err(TierError::Io { .. })
        ));
        let error = log
            .append(&mut media, &[write(0, 0, &block(1), 2)])
            .unwrap_err();
        assert!(matches!(error, TierError::Failed(_)), "{error}");
    }

    #[test]
    fn a_device_without_this_tier_is_refused_with_what_it_holds() {
        let mut media = FaultyMedia::new(2, 64 * BLOCK as usize, 5);
        let error = TierLog::open(&mut media, TIER, ID).unwrap_err();
        assert!(error.to_string().contains("first copy: none"), "{error}");
        TierLog::format(&mut media, TIER, [8; 16]).unwrap();
        let error = TierLog::open(&mut media, TIER, ID).unwrap_err();
        assert!(error.to_string().contains("another pool's tier"), "{error}");
        let mut small = FaultyMedia::new(1, 5 * BLOCK as usize, 5);
        let error = TierLog::format(&mut small, 0, ID).unwrap_err();
        assert!(error.to_string().contains("at least 24576"), "{error}");
    }

    #[test]
    fn destaging_everything_then_appending_replays_from_the_new_tail() {
        let mut media = FaultyMedia::new(2, 16 * BLOCK as usize, 6);
        let mut log = TierLog::format(&mut media, TIER, ID).unwrap();
        for round in 0..20u64 {
            log.append(
                &mut media,
                &[write(0, round % 4, &block(round as u8), round)],
            )
            .unwrap();
            if round % 3 == 2 {
                destage_all(&mut log, &mut media);
            }
        }
        let mut media = media.crash();
        let log = TierLog::open(&mut media, TIER, ID).unwrap();
        // Rounds 18 and 19 are in the tier, the rest on the capacity device.
        assert_eq!(read(&log, &mut media, 0, 2), Some(18));
        assert_eq!(read(&log, &mut media, 0, 3), Some(19));
        let mut buf = block(0);
        media.read_at(CAPACITY, BLOCK, &mut buf).unwrap();
        assert_eq!(buf[0], 17);
    }
}
