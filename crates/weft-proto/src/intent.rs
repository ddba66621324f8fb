//! A replica's write intent, as its target serves it: which regions of the
//! replica may hold a write that not every in-sync replica holds (md's
//! write-intent bitmap, kept on every copy). A primary reads it when it
//! fences the replica, and resyncs those regions from its own copy, hosts'
//! I/O to each of them waiting for its copy (docs/REPLICATION-DESIGN.md,
//! "As built").
//!
//! - A write to a region not in the intent is not applied until the region
//!   is marked durably; marking is the node's job (the data plane hands the
//!   write to its slow path, which persists the region and marks it here).
//! - The primary drops regions whose writes every in-sync replica completed
//!   with the vendor I/O command Clean ([`CLEAN_OPCODE`], 81h, in the vendor
//!   range 80h-FFh of NVMe Base 2.0, Figure 81: bits 1:0 = 01b, data from
//!   host to controller). It travels on the same I/O queue as the writes,
//!   behind them: a write sent after the Clean finds its region cleared and
//!   marks it again. The node persists cleared regions lazily (a region left
//!   marked costs a needless copy, never a lost write).
//! - The primary reads the intent with the vendor log page [`INTENT_LOG`]
//!   (C0h, in the vendor range C0h-FFh, Figure 202): a 16-byte header
//!   (marked region count, flags with bit 0 `unclean`, region size in
//!   bytes), then the marked regions as little-endian u32s, ascending.
//! - `unclean`: the node lost power since a primary last wrote to this
//!   replica, so its unflushed writes may be gone anywhere; the primary
//!   rebuilds it in full. Every write goes to the slow path until a write
//!   clears it.
//! - The primary takes a snapshot of the replica's copy with the vendor I/O
//!   command Snapshot ([`SNAPSHOT_OPCODE`], 85h, data from host to
//!   controller: the snapshot's name, CDW10 its length in bytes). It too
//!   travels behind the writes; the primary sends it once every write before
//!   it completed, so that every copy's snapshot holds the same writes. The
//!   node takes it (replacing one of that name) in its slow path.
//! - The primary grows the replica's copy with the vendor I/O command Grow
//!   ([`GROW_OPCODE`], 84h, no data: the new size in bytes in CDW10 (low)
//!   and CDW11 (high)), sent the same way: a volume grows on every copy in
//!   sync before the primary writes past the old end.
//!
//! Lock-free: one relaxed atomic load per region to check a write.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Log page identifier of the replica write intent (vendor specific).
pub const INTENT_LOG: u8 = 0xC0;

/// I/O opcode of Clean (vendor specific): CDW10 holds the number of regions,
/// the data their indices as little-endian u32s.
pub const CLEAN_OPCODE: u8 = 0x81;

/// I/O opcode of Snapshot (vendor specific; bits 1:0 = 01b, data from
/// host to controller, as Figure 81 requires): CDW10 holds the name's
/// length, the data the name.
pub const SNAPSHOT_OPCODE: u8 = 0x85;

/// I/O opcode of Grow (vendor specific; bits 1:0 = 00b, no data): the new
/// size in bytes in CDW10 (low half) and CDW11 (high half).
pub const GROW_OPCODE: u8 = 0x84;

/// The longest snapshot name a Snapshot command carries (the volume
/// manager's name limit).
pub const SNAPSHOT_NAME_BYTES_MAX: u32 = 64;

/// Bytes before the region list in the intent log page.
pub const INTENT_LOG_HEADER_LEN: usize = 16;

/// Regions one Clean command may carry (16 KiB of data).
pub const CLEAN_REGIONS_MAX: u32 = 4096;

/// A replica's write intent.
#[derive(Debug)]
pub struct WriteIntent {
    region_shift: u32,
    regions: u32,
    words: Box<[AtomicU64]>,
    unclean: AtomicBool,
    /// Regions were cleared since the node last persisted the intent.
    cleared: AtomicBool,
}

impl WriteIntent {
    /// The intent of a replica of `size_bytes` in regions of `1 << region_shift`
    /// bytes, with `marked` regions marked (as persisted).
    pub fn new(
        size_bytes: u64,
        region_shift: u32,
        marked: impl IntoIterator<Item = u32>,
        unclean: bool,
    ) -> WriteIntent {
        // A volume too large for 2^32 regions (refused by the node before
        // it gets here) is covered up to the last region only: `covers`
        // is false past it, so nothing there is written unmarked.
        let regions = u32::try_from(size_bytes.div_ceil(1 << region_shift)).unwrap_or(u32::MAX);
        let words = (0..regions.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        let intent = WriteIntent {
            region_shift,
            regions,
            words,
            unclean: AtomicBool::new(unclean),
            cleared: AtomicBool::new(false),
        };
        for region in marked.into_iter().filter(|&r| r < regions) {
            intent.set(region);
        }
        intent
    }

    /// Number of regions.
    pub fn regions(&self) -> u32 {
        self.regions
    }

    /// Bytes per region.
    pub fn region_bytes(&self) -> u64 {
        1 << self.region_shift
    }

    /// The regions under `[offset, offset + len)` (at least one).
    pub fn regions_of(&self, offset: u64, len: u64) -> Range<u32> {
        let first = offset >> self.region_shift;
        let last = (offset + len.max(1) - 1) >> self.region_shift;
        let end = (last + 1).min(u64::from(self.regions));
        (first.min(end) as u32)..(end as u32)
    }

    /// Whether a write to `[offset, offset + len)` may be applied at once:
    /// every region under it is marked, and the replica is not unclean.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        let last = (offset + len.max(1) - 1) >> self.region_shift;
        !self.unclean.load(Ordering::Relaxed)
            && last < u64::from(self.regions)
            && self
                .regions_of(offset, len)
                .all(|region| self.is_marked(region))
    }

    /// Whether `region` is marked.
    pub fn is_marked(&self, region: u32) -> bool {
        let word = &self.words[(region / 64) as usize];
        word.load(Ordering::Relaxed) & (1 << (region % 64)) != 0
    }

    /// Marks `regions` (the caller persisted them first).
    pub fn mark(&self, regions: Range<u32>) {
        for region in regions.filter(|&r| r < self.regions) {
            self.set(region);
        }
    }

    fn set(&self, region: u32) {
        self.words[(region / 64) as usize].fetch_or(1 << (region % 64), Ordering::Release);
    }

    /// Drops `regions` (Clean); out-of-range ones are ignored.
    pub fn clean(&self, regions: impl IntoIterator<Item = u32>) {
        for region in regions.into_iter().filter(|&r| r < self.regions) {
            self.words[(region / 64) as usize].fetch_and(!(1 << (region % 64)), Ordering::Release);
        }
        self.cleared.store(true, Ordering::Release);
    }

    /// The marked regions, ascending.
    pub fn marked(&self) -> Vec<u32> {
        (0..self.regions).filter(|&r| self.is_marked(r)).collect()
    }

    /// Whether power was lost since a primary last wrote here.
    pub fn unclean(&self) -> bool {
        self.unclean.load(Ordering::Acquire)
    }

    /// A write was persisted under the current boot: no longer unclean.
    pub fn set_clean(&self) {
        self.unclean.store(false, Ordering::Release);
    }

    /// Whether regions were cleared since the last call (the node then
    /// persists the intent again).
    pub fn take_cleared(&self) -> bool {
        self.cleared.swap(false, Ordering::AcqRel)
    }

    /// The intent log page, generated for the window `[offset, offset + out.len())`
    /// (bytes past its end stay zero).
    pub fn log_page(&self, offset: u64, out: &mut [u8]) {
        let marked = self.marked();
        let mut header = [0u8; INTENT_LOG_HEADER_LEN];
        header[0..4].copy_from_slice(&(marked.len() as u32).to_le_bytes());
        header[4] = u8::from(self.unclean());
        header[8..16].copy_from_slice(&self.region_bytes().to_le_bytes());
        let page = header
            .into_iter()
            .chain(marked.iter().flat_map(|r| r.to_le_bytes()));
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (slot, byte) in out.iter_mut().zip(page.skip(start)) {
            *slot = byte;
        }
    }
}

/// Two intents are equal when they are the same object (a configuration
/// compares equal only if it shares the replica's live intent).
impl PartialEq for WriteIntent {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for WriteIntent {}

/// The intent log page's header, as a primary reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntentLogHeader {
    /// Marked regions (the list that follows).
    pub marked: u32,
    /// Power was lost since a primary last wrote here.
    pub unclean: bool,
    /// Bytes per region.
    pub region_bytes: u64,
}

impl IntentLogHeader {
    /// Decodes the first [`INTENT_LOG_HEADER_LEN`] bytes of the page.
    pub fn decode(bytes: &[u8; INTENT_LOG_HEADER_LEN]) -> IntentLogHeader {
        IntentLogHeader {
            marked: u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")),
            unclean: bytes[4] & 1 != 0,
            region_bytes: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
        }
    }
}

/// The regions of a Clean command's data (`count` little-endian u32s).
pub fn clean_regions(data: &[u8], count: u32) -> impl Iterator<Item = u32> + '_ {
    data.chunks_exact(4)
        .take(count as usize)
        .map(|bytes| u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_covered_only_when_every_region_under_it_is_marked() {
        // 10 MiB in 1 MiB regions.
        let intent = WriteIntent::new(10 << 20, 20, [2], false);
        assert_eq!(intent.regions(), 10);
        assert!(intent.covers(2 << 20, 4096));
        assert!(
            !intent.covers((2 << 20) + (1 << 20) - 4096, 8192),
            "spills into 3"
        );
        intent.mark(intent.regions_of((3 << 20) - 4096, 8192));
        assert!(intent.covers((3 << 20) - 4096, 8192));
        intent.clean([2]);
        assert!(!intent.covers(2 << 20, 4096));
        assert!(intent.take_cleared());
        assert!(!intent.take_cleared());
        assert_eq!(intent.marked(), vec![3]);
    }

    #[test]
    fn an_unclean_replica_covers_nothing_until_set_clean() {
        let intent = WriteIntent::new(4 << 20, 20, [0, 1, 2, 3], true);
        assert!(!intent.covers(0, 4096));
        intent.set_clean();
        assert!(intent.covers(0, 4096));
    }

    #[test]
    fn the_last_region_may_be_short_and_ranges_past_the_end_are_clipped() {
        let intent = WriteIntent::new((2 << 20) + 4096, 20, [], false);
        assert_eq!(intent.regions(), 3);
        assert_eq!(intent.regions_of(2 << 20, 4096), 2..3);
        assert_eq!(intent.regions_of(5 << 20, 4096), 3..3);
        intent.mark(0..70);
        assert_eq!(intent.marked(), vec![0, 1, 2]);
        assert!(intent.covers(2 << 20, 4096));
        assert!(
            !intent.covers(3 << 20, 4096),
            "past the end: never unmarked"
        );
        assert!(
            !intent.covers((3 << 20) - 4096, 8192),
            "spills past the end"
        );
    }

    #[test]
    fn the_log_page_lists_the_marked_regions_after_its_header() {
        let intent = WriteIntent::new(200 << 20, 20, [1, 65, 130], true);
        let mut page = [0u8; 32];
        intent.log_page(0, &mut page);
        assert_eq!(
            hex(&page),
            "03000000010000000000100000000000010000004100000082000000000000000000000000"[..64]
        );
        let header = IntentLogHeader::decode(page[..16].try_into().unwrap());
        assert_eq!(
            header,
            IntentLogHeader {
                marked: 3,
                unclean: true,
                region_bytes: 1 << 20
            }
        );
        let regions: Vec<u32> = clean_regions(&page[16..], header.marked).collect();
        assert_eq!(regions, vec![1, 65, 130]);
        // A window: the second region onwards.
        let mut window = [0xFFu8; 8];
        intent.log_page(20, &mut window);
        assert_eq!(hex(&window), "4100000082000000");
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
