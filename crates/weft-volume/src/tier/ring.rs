//! One ring of a write tier: where its batches are, where the next one
//! goes, and how it is read back from its tail after a crash. The tier
//! (`log`) owns the rings, the index of newest copies and the superblock.
//!
//! Invariants (relied on by replay):
//! - The superblock's tail is always the start of a batch on the chain the
//!   head grew from, or the head itself: space is reused only after a
//!   superblock naming a tail past it is durable, and the next batch is
//!   always written at the head.
//! - Live batches never reach the tail again: a block of room is kept
//!   between the head and the tail, so that what the ring holds stays
//!   within `bytes - BLOCK`.
//! - The pool orders of a ring's batches grow: each batch's lowest is above
//!   the one before's highest (its writer takes them in the order it forms
//!   batches, and appends them in that order).

use super::format::{BatchHeader, BatchKind, Extent, RingTail, TierId};
use super::{TierError, TIER_BLOCK_BYTES};
use crate::media::Media;
use std::collections::VecDeque;
use std::ops::Range;

const BLOCK: u64 = TIER_BLOCK_BYTES;

/// A batch (or wrap) still in a ring, oldest first.
#[derive(Debug)]
pub(super) struct Live {
    pub offset: u64,
    /// The ring bytes it holds (a wrap: up to the ring's end).
    pub bytes: u64,
    pub seq: u64,
    /// Its extents, with where each one's data starts on the device.
    pub extents: Vec<(Extent, u64)>,
    /// Its lowest and highest pool order (none: a wrap).
    pub orders: Option<(u64, u64)>,
    /// Its newest copies are on the capacity devices (synced).
    pub destaged: bool,
}

impl Live {
    pub fn wrap(offset: u64, end: u64, seq: u64) -> Live {
        Live {
            offset,
            bytes: end - offset,
            seq,
            extents: Vec::new(),
            orders: None,
            destaged: true,
        }
    }

    pub fn batch(offset: u64, seq: u64, extents: &[Extent]) -> Live {
        let mut at = offset + BLOCK;
        let placed: Vec<(Extent, u64)> = extents
            .iter()
            .map(|e| {
                let placed = (*e, at);
                at += u64::from(e.blocks) * BLOCK;
                placed
            })
            .collect();
        let orders = extents.iter().map(|e| e.pool_order);
        let lowest = orders.clone().min().expect("a batch has extents");
        Live {
            offset,
            bytes: at - offset,
            seq,
            extents: placed,
            orders: Some((lowest, orders.max().expect("a batch has extents"))),
            destaged: false,
        }
    }
}

/// One ring.
#[derive(Debug)]
pub(super) struct Ring {
    /// Its bytes on the device.
    pub span: Range<u64>,
    /// Where the next batch goes (never the ring's end: its start then).
    pub head: u64,
    pub next_seq: u64,
    pub live: VecDeque<Live>,
    /// The bytes of `live`, kept as they come and go (asked for at every
    /// turn of the node's manager: a sum over thousands of batches was not
    /// free).
    used_bytes: u64,
    /// The highest pool order of its batches.
    pub last_order: u64,
    /// Pool orders taken for its writes that are not in a batch yet, in
    /// order: the watermark stays below them (a write still on its way
    /// must not be passed over by replay once it lands).
    pub taken: VecDeque<u64>,
}

impl Ring {
    pub fn new(span: Range<u64>, tail: RingTail) -> Ring {
        Ring {
            span,
            head: tail.offset,
            next_seq: tail.seq,
            live: VecDeque::new(),
            used_bytes: 0,
            last_order: 0,
            taken: VecDeque::new(),
        }
    }

    /// The tail once the batches up to `released` (exclusive) are gone.
    pub fn tail_after(&self, released: usize) -> RingTail {
        match self.live.get(released) {
            Some(next) => RingTail {
                offset: next.offset,
                seq: next.seq,
            },
            None => RingTail {
                offset: self.head,
                seq: self.next_seq,
            },
        }
    }

    pub fn used_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.used_bytes,
            self.live.iter().map(|l| l.bytes).sum::<u64>()
        );
        self.used_bytes
    }

    /// Lets its `count` oldest batches go.
    pub fn release(&mut self, count: usize) -> std::collections::vec_deque::Drain<'_, Live> {
        self.used_bytes -= self.live.iter().take(count).map(|l| l.bytes).sum::<u64>();
        self.live.drain(..count)
    }

    /// The most a ring holds: all of it but the block of room.
    fn room(&self) -> u64 {
        self.span.end - self.span.start - BLOCK
    }

    /// Whether a batch of `needed` bytes could ever fit.
    pub fn fits_ever(&self, needed: u64) -> bool {
        needed + BLOCK <= self.room()
    }

    /// Whether an empty ring must go back to its start for a batch of
    /// `needed` bytes (rather than wrap: a wrap would leave the batch less
    /// room than the ring has).
    pub fn rewinds_for(&self, needed: u64) -> bool {
        self.live.is_empty() && self.head + needed > self.span.end && self.head != self.span.start
    }

    /// Where a batch of `needed` bytes goes: (a wrap first at, the batch at).
    pub fn place(&self, needed: u64) -> Result<(Option<u64>, u64), TierError> {
        let (start, end, head) = (self.span.start, self.span.end, self.head);
        // Free up to the tail, less a block of room (an empty ring: up to
        // its head, where a wrap would go).
        let limit = self.live.front().map_or(head, |front| front.offset);
        let full = || TierError::Full {
            needed,
            free: self.room().saturating_sub(self.used_bytes()),
        };
        let fits_before = |at: u64| at + BLOCK <= limit;
        // What the ring holds afterwards stays within its room too: a batch
        // that ends at the ring's end puts the head at its start, which may
        // be the tail.
        let fits_room = |bytes: u64| self.used_bytes() + bytes <= self.room();
        if self.live.is_empty() || head > limit {
            if head + needed <= end && fits_room(needed) {
                return Ok((None, head));
            }
            if fits_before(start + needed) && fits_room(end - head + needed) {
                return Ok((Some(head), start));
            }
            return Err(full());
        }
        if head < limit && fits_before(head + needed) {
            return Ok((None, head));
        }
        Err(full())
    }

    /// Takes an appended wrap and batch in: the head moves past them.
    pub fn appended(&mut self, wrap: Option<Live>, batch: Live) {
        self.used_bytes += wrap.as_ref().map_or(0, |w| w.bytes) + batch.bytes;
        self.live.extend(wrap);
        self.head = batch.offset + batch.bytes;
        if self.head == self.span.end {
            self.head = self.span.start;
        }
        self.next_seq = batch.seq + 1;
        self.last_order = batch.orders.map_or(self.last_order, |(_, highest)| highest);
        self.live.push_back(batch);
    }

    /// Reads the chain of batches of tier `id` from the ring's tail (as
    /// `new` set it): each one whose header and data check, whose sequence
    /// follows and whose opens count neither goes back nor passes `opens`,
    /// until the first that does not.
    pub fn replay<M: Media>(
        &mut self,
        media: &mut M,
        member: usize,
        id: &TierId,
        opens: u64,
    ) -> Result<(), TierError> {
        let (mut offset, mut seq) = (self.head, self.next_seq);
        let (mut used, mut opened) = (0, 0);
        loop {
            if offset == self.span.end {
                offset = self.span.start;
            }
            let mut block = vec![0; BLOCK as usize];
            read(media, member, offset, &mut block)?;
            let Ok(header) = BatchHeader::decode(&block, id) else {
                break;
            };
            if header.seq != seq || !(opened..=opens).contains(&header.opens) {
                break;
            }
            opened = header.opens;
            let live = match &header.kind {
                BatchKind::Wrap => Live::wrap(offset, self.span.end, seq),
                BatchKind::Data { extents, data_crc } => {
                    let bytes = BLOCK + header.kind.data_bytes();
                    // Within the ring before anything is read (a damaged
                    // length allocates nothing).
                    if offset + bytes > self.span.end || used + bytes > self.room() {
                        break;
                    }
                    let mut data = vec![0; (bytes - BLOCK) as usize];
                    read(media, member, offset + BLOCK, &mut data)?;
                    if crc32c::crc32c(&data) != *data_crc {
                        break;
                    }
                    Live::batch(offset, seq, extents)
                }
            };
            if used + live.bytes > self.room() {
                break;
            }
            used += live.bytes;
            offset += live.bytes;
            seq += 1;
            if let Some((_, highest)) = live.orders {
                self.last_order = highest;
            }
            self.used_bytes += live.bytes;
            self.live.push_back(live);
        }
        self.head = if offset == self.span.end {
            self.span.start
        } else {
            offset
        };
        self.next_seq = seq;
        Ok(())
    }
}

fn read<M: Media>(
    media: &mut M,
    member: usize,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), TierError> {
    media
        .read_at(member, offset, buf)
        .map_err(|source| TierError::Io {
            context: "replay: read a batch".to_string(),
            source,
        })
}
