//! A set of regions, as a bitmap: the regions a faulted replica missed (the
//! primary's dirty bitmap for it) and the regions a node may hold writes
//! that not every replica has (its write-intent bitmap).

use serde::{Deserialize, Serialize};

/// A set of region numbers below a fixed count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionSet {
    words: Vec<u64>,
    regions: u32,
}

impl RegionSet {
    /// An empty set of `regions` regions.
    pub fn new(regions: u32) -> RegionSet {
        RegionSet {
            words: vec![0; (regions as usize).div_ceil(64)],
            regions,
        }
    }

    /// The set of every region.
    pub fn full(regions: u32) -> RegionSet {
        let mut set = RegionSet::new(regions);
        for region in 0..regions {
            set.insert(region);
        }
        set
    }

    /// Adds `region`; whether it was absent.
    pub fn insert(&mut self, region: u32) -> bool {
        assert!(region < self.regions, "region {region} of {}", self.regions);
        let (word, bit) = (region as usize / 64, 1u64 << (region % 64));
        let absent = self.words[word] & bit == 0;
        self.words[word] |= bit;
        absent
    }

    /// Removes `region`; whether it was present.
    pub fn remove(&mut self, region: u32) -> bool {
        let (word, bit) = (region as usize / 64, 1u64 << (region % 64));
        let present = self.words[word] & bit != 0;
        self.words[word] &= !bit;
        present
    }

    /// Whether `region` is in the set.
    pub fn contains(&self, region: u32) -> bool {
        self.words[region as usize / 64] & (1u64 << (region % 64)) != 0
    }

    /// Adds every region of `other`.
    pub fn union_with(&mut self, other: &RegionSet) {
        assert_eq!(self.regions, other.regions, "sets of one volume");
        for (word, theirs) in self.words.iter_mut().zip(&other.words) {
            *word |= theirs;
        }
    }

    /// Number of regions in the set.
    pub fn len(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The regions in the set, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.regions).filter(|&r| self.contains(r))
    }

    /// How many regions the set can hold.
    pub fn capacity(&self) -> u32 {
        self.regions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_union() {
        let mut a = RegionSet::new(130);
        assert!(a.insert(0) && a.insert(129) && !a.insert(129));
        let mut b = RegionSet::new(130);
        b.insert(64);
        a.union_with(&b);
        assert_eq!(a.iter().collect::<Vec<_>>(), [0, 64, 129]);
        assert!(a.remove(64) && !a.remove(64));
        assert_eq!(a.len(), 2);
        assert_eq!(RegionSet::full(3).len(), 3);
    }
}
