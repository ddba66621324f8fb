//! Where a volume's bytes live in an erasure-coded layout: the volume is
//! cut into stripes of `k` data chunks; stripe `s` keeps shard `i` (data
//! 0..k, then P, then Q) on member `(i + s) mod (k + m)`, so that parity
//! rotates over every member as in RAID-5/6, and each member keeps its
//! chunk of stripe `s` at `s * chunk` in its own shard volume.
//!
//! What this does not do: read or write (the caller sends each piece to
//! its member), or know which members are up.

use crate::{EcError, Layout};

/// The smallest chunk: a page, so that a chunk is whole blocks of any
/// block size a volume has.
const CHUNK_MIN: u32 = 4096;

/// A layout and its chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    layout: Layout,
    chunk_bytes: u32,
}

/// The part of a volume range that falls in one data chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Where it starts in the volume.
    pub volume_offset: u64,
    /// Its bytes.
    pub len: u32,
    /// Its stripe.
    pub stripe: u64,
    /// Its data shard in the stripe (0..k).
    pub shard: usize,
    /// The member that keeps it (0..k+m).
    pub member: usize,
    /// Where it starts in that member's shard volume.
    pub member_offset: u64,
}

impl Geometry {
    /// `layout` with chunks of `chunk_bytes` (a power of two, 4 KiB at least).
    pub fn new(layout: Layout, chunk_bytes: u32) -> Result<Geometry, EcError> {
        if !chunk_bytes.is_power_of_two() || chunk_bytes < CHUNK_MIN {
            return Err(EcError::Chunk(chunk_bytes));
        }
        Ok(Geometry {
            layout,
            chunk_bytes,
        })
    }

    /// Its layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// A chunk's bytes.
    pub fn chunk_bytes(&self) -> u32 {
        self.chunk_bytes
    }

    /// A stripe's data bytes: `k` chunks.
    pub fn stripe_bytes(&self) -> u64 {
        self.layout.data() as u64 * u64::from(self.chunk_bytes)
    }

    /// The member that keeps shard `shard` (data 0..k, P at k, Q at k + 1)
    /// of stripe `stripe`.
    pub fn member_of(&self, stripe: u64, shard: usize) -> usize {
        let members = self.layout.shards() as u64;
        ((shard as u64 + stripe % members) % members) as usize
    }

    /// The bytes each member's shard volume holds for a volume of
    /// `volume_bytes`: a chunk per stripe, the last stripe whole.
    pub fn shard_volume_bytes(&self, volume_bytes: u64) -> u64 {
        volume_bytes.div_ceil(self.stripe_bytes()) * u64::from(self.chunk_bytes)
    }

    /// The pieces of volume range `offset..offset + len`, in order: one per
    /// data chunk it touches.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let chunk = u64::from(self.chunk_bytes);
        let end = offset + len;
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let stripe = at / self.stripe_bytes();
            let within = at % self.stripe_bytes();
            let shard = (within / chunk) as usize;
            let in_chunk = within % chunk;
            let piece_len = (chunk - in_chunk).min(end - at);
            let piece = Piece {
                volume_offset: at,
                len: piece_len as u32,
                stripe,
                shard,
                member: self.member_of(stripe, shard),
                member_offset: stripe * chunk + in_chunk,
            };
            at += piece_len;
            Some(piece)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(k: usize, m: usize) -> Geometry {
        Geometry::new(Layout::new(k, m).unwrap(), 64 * 1024).unwrap()
    }

    #[test]
    fn a_range_is_cut_into_chunk_pieces_that_cover_it_in_order() {
        let g = geometry(4, 2);
        assert_eq!(g.stripe_bytes(), 256 * 1024);
        let (offset, len) = (60 * 1024, 300 * 1024);
        let pieces: Vec<Piece> = g.pieces(offset, len).collect();
        let mut at = offset;
        for piece in &pieces {
            assert_eq!(piece.volume_offset, at);
            assert!(piece.len > 0 && piece.len <= g.chunk_bytes());
            // Within one chunk of one stripe.
            let chunk = u64::from(g.chunk_bytes());
            assert_eq!(at / chunk, (at + u64::from(piece.len) - 1) / chunk);
            at += u64::from(piece.len);
        }
        assert_eq!(at, offset + len);
        let first = pieces[0];
        assert_eq!((first.stripe, first.shard, first.len), (0, 0, 4096));
        assert_eq!(first.member_offset, 60 * 1024);
        let last = pieces[pieces.len() - 1];
        assert_eq!((last.stripe, last.shard), (1, 1));
        // 320 KiB..360 KiB: stripe 1's second chunk, from its start.
        assert_eq!((last.member_offset, last.len), (64 * 1024, 40 * 1024));
        assert_eq!(g.pieces(5, 0).count(), 0);
    }

    #[test]
    fn a_stripes_shards_are_on_distinct_members_and_parity_rotates() {
        for (k, m) in [(2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2)] {
            let g = geometry(k, m);
            let n = k + m;
            let mut parity_held = vec![0; n];
            for stripe in 0..n as u64 {
                let mut members: Vec<usize> = (0..n).map(|i| g.member_of(stripe, i)).collect();
                for j in 0..m {
                    parity_held[members[k + j]] += 1;
                }
                members.sort_unstable();
                members.dedup();
                assert_eq!(members.len(), n, "{k}+{m} stripe {stripe}");
            }
            // Over n stripes every member holds each parity once.
            assert!(parity_held.iter().all(|&held| held == m), "{parity_held:?}");
            let volume = 10 * g.stripe_bytes() + 1;
            let shard = g.shard_volume_bytes(volume);
            assert_eq!(shard, 11 * u64::from(g.chunk_bytes()));
            // Raw per usable: (k + m) / k, the last stripe aside.
            let raw = shard * n as u64;
            assert_eq!(raw, 11 * g.stripe_bytes() * n as u64 / k as u64);
        }
    }

    #[test]
    fn a_chunk_is_a_power_of_two_of_a_page_or_more() {
        let layout = Layout::new(4, 2).unwrap();
        for bad in [0, 512, 3 * 4096, 100_000] {
            assert_eq!(Geometry::new(layout, bad), Err(EcError::Chunk(bad)));
        }
        assert!(Geometry::new(layout, 4096).is_ok());
    }
}
