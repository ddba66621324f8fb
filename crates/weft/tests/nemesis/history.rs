//! What the writer knows of each block it owns, and the checks on what it
//! reads back. Every write carries its block number and a generation (a
//! per-block counter); a write is *acknowledged* when the target completed
//! it successfully, *indeterminate* when it failed or timed out (it may have
//! landed, now or later). A read is correct when it returns the newest
//! acknowledged generation or a newer indeterminate one; anything older is
//! stale data (an acknowledged write lost, or overwritten by a late one),
//! anything else is corruption. A generation read is from then on the
//! oldest one a later read may return (no read goes back in time).

use std::collections::BTreeSet;

/// Bytes per block of the volumes under test.
pub const BLOCK: u32 = 4096;

/// The data of generation `generation` of `block` of volume `volume`
/// (generation 0 is a block never written: zeroes).
pub fn pattern(volume: u8, block: u64, generation: u64) -> Vec<u8> {
    if generation == 0 {
        return vec![0; BLOCK as usize];
    }
    let mut data = vec![(generation as u8) ^ volume; BLOCK as usize];
    data[..8].copy_from_slice(&block.to_le_bytes());
    data[8..16].copy_from_slice(&generation.to_le_bytes());
    data[16] = volume;
    data
}

/// What a read returned, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// A generation of this block (0: never written).
    Generation(u64),
    /// Not any write of this block: another block's, torn, or garbage.
    Corrupt,
}

/// Decodes what was read at `block` of volume `volume`.
pub fn decode(volume: u8, block: u64, data: &[u8]) -> Decoded {
    if data.iter().all(|&b| b == 0) {
        return Decoded::Generation(0);
    }
    let generation = u64::from_le_bytes(data[8..16].try_into().unwrap());
    if generation != 0 && data == pattern(volume, block, generation).as_slice() {
        Decoded::Generation(generation)
    } else {
        Decoded::Corrupt
    }
}

/// A read that broke the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The block.
    pub block: u64,
    /// What was read.
    pub read: Decoded,
    /// The oldest generation it could have been.
    pub acknowledged: u64,
    /// The newer generations it could also have been.
    pub indeterminate: Vec<u64>,
}

impl Violation {
    /// Whether an acknowledged write was missing (as opposed to corruption).
    pub fn is_stale(&self) -> bool {
        matches!(self.read, Decoded::Generation(g) if g < self.acknowledged)
    }
}

/// The history of one block.
#[derive(Debug, Clone, Default)]
pub struct BlockHistory {
    /// Newest generation written (acknowledged or not).
    last: u64,
    /// Newest generation acknowledged (or read back).
    acknowledged: u64,
    /// Generations newer than `acknowledged` whose writes failed.
    indeterminate: BTreeSet<u64>,
}

impl BlockHistory {
    /// The generation the next write carries.
    pub fn next(&mut self) -> u64 {
        self.last += 1;
        self.last
    }

    /// Write `generation` was acknowledged.
    pub fn acknowledged(&mut self, generation: u64) {
        self.settle(generation);
    }

    /// Write `generation` failed: it may land or not.
    pub fn indeterminate(&mut self, generation: u64) {
        if generation > self.acknowledged {
            self.indeterminate.insert(generation);
        }
    }

    /// Checks a read of `block` that returned `read`.
    pub fn check(&mut self, block: u64, read: Decoded) -> Result<(), Violation> {
        match read {
            Decoded::Generation(g) if g == self.acknowledged || self.indeterminate.contains(&g) => {
                self.settle(g);
                Ok(())
            }
            _ => Err(Violation {
                block,
                read,
                acknowledged: self.acknowledged,
                indeterminate: self.indeterminate.iter().copied().collect(),
            }),
        }
    }

    /// Whether the block was ever written successfully.
    pub fn written(&self) -> bool {
        self.acknowledged > 0
    }

    fn settle(&mut self, generation: u64) {
        if generation > self.acknowledged {
            self.acknowledged = generation;
        }
        self.indeterminate.retain(|&g| g > self.acknowledged);
    }
}

#[test]
fn a_read_may_return_the_acknowledged_or_a_newer_failed_write_and_never_goes_back() {
    let mut block = BlockHistory::default();
    let first = block.next();
    block.acknowledged(first);
    let failed = block.next();
    block.indeterminate(failed);
    assert!(block.check(7, Decoded::Generation(first)).is_ok());
    assert!(block.check(7, Decoded::Generation(failed)).is_ok());
    let stale = block.check(7, Decoded::Generation(first)).unwrap_err();
    assert!(stale.is_stale(), "{stale:?}");
    assert!(!block.check(7, Decoded::Corrupt).unwrap_err().is_stale());
    let data = pattern(2, 7, 3);
    assert_eq!(decode(2, 7, &data), Decoded::Generation(3));
    assert_eq!(decode(2, 8, &data), Decoded::Corrupt);
    assert_eq!(decode(2, 7, &[0; BLOCK as usize]), Decoded::Generation(0));
}
