//! Test support: in-memory media that behaves like a device with a volatile
//! write cache, fails on command, tears the failing write, and on a
//! simulated power cut keeps, drops or tears each write that was not synced.
//! Used by the crash tests and the fuzz target; not for production.

use crate::media::Media;
use std::io;

/// Sector size a torn write is torn at.
pub const SECTOR_BYTES: usize = 512;

#[derive(Debug, Clone)]
struct Member {
    /// What reads see (the cache).
    current: Vec<u8>,
    /// What survives a power cut for sure.
    durable: Vec<u8>,
    /// Writes since the last sync, oldest first.
    unsynced: Vec<(u64, Vec<u8>)>,
}

/// The crash models' random numbers: xorshift64 from a nonzero seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// Fault-injecting in-memory media.
#[derive(Debug, Clone)]
pub struct FaultyMedia {
    members: Vec<Member>,
    writes_until_failure: Option<u64>,
    syncs_to_fail: u32,
    /// A failed sync loses some of the writes it was to make durable (as a
    /// device's write-back error: the cache dropped them).
    failed_syncs_lose_writes: bool,
    failed: bool,
    rng: u64,
}

impl FaultyMedia {
    /// `members` zeroed devices of `size_bytes` each; `seed` drives tearing.
    pub fn new(members: usize, size_bytes: usize, seed: u64) -> FaultyMedia {
        let member = Member {
            current: vec![0; size_bytes],
            durable: vec![0; size_bytes],
            unsynced: Vec::new(),
        };
        FaultyMedia {
            members: vec![member; members],
            writes_until_failure: None,
            syncs_to_fail: 0,
            failed_syncs_lose_writes: false,
            failed: false,
            rng: seed | 1,
        }
    }

    /// The `count`-th write from now fails half done, and every write or sync after it fails.
    pub fn fail_after_writes(&mut self, count: u64) {
        self.writes_until_failure = Some(count);
    }

    /// The next `count` syncs fail with EIO (and lose nothing yet: like
    /// Linux, a sync after them succeeds, whatever was dropped meanwhile).
    pub fn fail_next_syncs(&mut self, count: u32) {
        self.syncs_to_fail = count;
        self.failed_syncs_lose_writes = false;
    }

    /// The next `count` syncs fail with EIO, each losing every write it was
    /// to make durable at random (each kept or dropped); a sync after them
    /// succeeds.
    pub fn fail_next_syncs_losing_writes(&mut self, count: u32) {
        self.syncs_to_fail = count;
        self.failed_syncs_lose_writes = true;
    }

    /// Detaches the last member with what it holds (e.g. to add it to another pool).
    pub fn take_last_member(&mut self) -> Option<FaultyMedia> {
        let member = self.members.pop()?;
        Some(FaultyMedia {
            members: vec![member],
            writes_until_failure: None,
            syncs_to_fail: 0,
            failed_syncs_lose_writes: false,
            failed: false,
            rng: self.rng,
        })
    }

    /// Whether any member holds `needle` anywhere (what reads would see).
    pub fn contains(&self, needle: &[u8]) -> bool {
        self.members
            .iter()
            .any(|member| member.current.windows(needle.len()).any(|w| w == needle))
    }

    /// Whether the injected failure happened.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// A power cut: what the devices hold afterwards. Each unsynced write is
    /// independently kept, dropped or torn at a sector boundary.
    pub fn crash(mut self) -> FaultyMedia {
        for index in 0..self.members.len() {
            let unsynced = std::mem::take(&mut self.members[index].unsynced);
            for (offset, data) in unsynced {
                let keep = match self.next() % 3 {
                    0 => 0,
                    1 => data.len(),
                    _ => self.torn_len(data.len()),
                };
                let member = &mut self.members[index];
                let at = offset as usize;
                member.durable[at..at + keep].copy_from_slice(&data[..keep]);
            }
            let member = &mut self.members[index];
            member.current.clone_from(&member.durable);
        }
        self.writes_until_failure = None;
        self.failed = false;
        self
    }

    fn next(&mut self) -> u64 {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Drops each unsynced write of `member` at random: reads see what is
    /// left.
    fn lose_unsynced(&mut self, member: usize) {
        let unsynced = std::mem::take(&mut self.members[member].unsynced);
        let kept: Vec<(u64, Vec<u8>)> = unsynced
            .into_iter()
            .filter(|_| self.next().is_multiple_of(2))
            .collect();
        let m = &mut self.members[member];
        m.current.clone_from(&m.durable);
        for (offset, data) in &kept {
            let at = *offset as usize;
            m.current[at..at + data.len()].copy_from_slice(data);
        }
        m.unsynced = kept;
    }

    fn torn_len(&mut self, len: usize) -> usize {
        let sectors = len.div_ceil(SECTOR_BYTES).max(1) as u64;
        ((self.next() % sectors) as usize * SECTOR_BYTES).min(len)
    }

    fn check_alive(&self) -> io::Result<()> {
        if self.failed {
            return Err(injected());
        }
        Ok(())
    }

    fn store(&mut self, member: usize, offset: u64, data: Vec<u8>) -> io::Result<()> {
        self.check_alive()?;
        check_bounds(&self.members[member], offset, data.len())?;
        let mut data = data;
        let failing = match &mut self.writes_until_failure {
            Some(0) => true,
            Some(left) => {
                *left -= 1;
                false
            }
            None => false,
        };
        if failing {
            let kept = self.torn_len(data.len());
            data.truncate(kept);
            self.failed = true;
        }
        let at = offset as usize;
        let target = &mut self.members[member];
        target.current[at..at + data.len()].copy_from_slice(&data);
        target.unsynced.push((offset, data));
        if failing {
            return Err(injected());
        }
        Ok(())
    }
}

fn injected() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

fn check_bounds(member: &Member, offset: u64, len: usize) -> io::Result<()> {
    if offset as usize + len > member.current.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "access beyond the device",
        ));
    }
    Ok(())
}

impl Media for FaultyMedia {
    fn members(&self) -> usize {
        self.members.len()
    }

    fn size_bytes(&self, member: usize) -> u64 {
        self.members[member].current.len() as u64
    }

    fn read_at(&mut self, member: usize, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let m = &self.members[member];
        check_bounds(m, offset, buf.len())?;
        let at = offset as usize;
        buf.copy_from_slice(&m.current[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&mut self, member: usize, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.store(member, offset, buf.to_vec())
    }

    fn zero(&mut self, member: usize, offset: u64, len: u64) -> io::Result<()> {
        self.store(member, offset, vec![0; len as usize])
    }

    fn sync(&mut self, member: usize) -> io::Result<()> {
        self.check_alive()?;
        if self.syncs_to_fail > 0 {
            self.syncs_to_fail -= 1;
            if self.failed_syncs_lose_writes {
                self.lose_unsynced(member);
            }
            return Err(injected());
        }
        let m = &mut self.members[member];
        for (offset, data) in m.unsynced.drain(..) {
            let at = offset as usize;
            m.durable[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    /// Media of one member (what it holds included): `FaultyMedia::new(1, size, seed)`
    /// for a blank device.
    type Device = FaultyMedia;

    fn add_member(&mut self, device: FaultyMedia) -> io::Result<()> {
        self.check_alive()?;
        let [member] = <[Member; 1]>::try_from(device.members)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "add one device at a time"))?;
        self.members.push(member);
        Ok(())
    }

    fn remove_last_member(&mut self) {
        self.members.pop();
    }
}

/// Fuzz entry point: damages the metadata of a small pool (a volume with
/// data, a snapshot and a clone, encrypted volumes, one of them deleted so
/// that its key was scrubbed) with `data` — the first byte picks the
/// region (superblock, either checkpoint, journal), whether to re-seal its
/// checksum, and the sample (with bit 3: one whose checkpoints outgrew their
/// slots, a version 3 superblock), the next two an offset in it — then
/// opens it and reads everything. Opening may fail; it must never panic or
/// allocate without bound.
pub fn fuzz_open(data: &[u8]) {
    use crate::Pool;
    thread_local! {
        static SAMPLES: [(FaultyMedia, crate::format::Layout); 2] =
            [fuzz_sample(false), fuzz_sample(true)];
    }
    let Some((&[region, low, high], damage)) = data.split_first_chunk::<3>() else {
        return;
    };
    let extended = usize::from(region & 8 != 0);
    let (mut media, layout) =
        SAMPLES.with(|samples| (samples[extended].0.clone(), samples[extended].1));
    let (start, len) = match region % 4 {
        0 => (0, 8192),
        1 => (layout.checkpoint_offset(0), layout.checkpoint_bytes),
        2 => (layout.checkpoint_offset(1), layout.checkpoint_bytes),
        _ => (layout.journal_offset(), layout.journal_bytes),
    };
    let offset = start + u64::from(u16::from_le_bytes([low, high])) % len;
    let room = (start + len - offset) as usize;
    let damage = &damage[..damage.len().min(room)];
    media
        .write_at(0, offset, damage)
        .expect("within the device");
    if region & 4 != 0 {
        // Re-seal so that decoding goes past the checksum.
        match region % 4 {
            0 => reseal_superblocks(&mut media),
            _ => reseal_frame(&mut media, start, len),
        }
    }
    media.sync(0).expect("sync");
    let Ok(mut pool) = Pool::open(media) else {
        return;
    };
    pool.unlock(fuzz_keyring());
    type Sizes = Vec<(String, u64)>;
    let volumes: Vec<(String, u64, Sizes)> = pool
        .volumes()
        .map(|v| {
            let snapshots = v
                .snapshots
                .iter()
                .map(|(n, s)| (n.clone(), s.size_bytes))
                .collect();
            (v.name.clone(), v.size_bytes, snapshots)
        })
        .collect();
    for (name, size, snapshots) in volumes {
        let mut buf = vec![0u8; size.min(1 << 20) as usize];
        let _ = pool.read(&name, 0, &mut buf);
        let _ = pool.write(&name, 0, &[1; 512]);
        for (snapshot, size) in snapshots {
            let mut buf = vec![0u8; size.min(1 << 20) as usize];
            let _ = pool.read_snapshot(&name, &snapshot, 0, &mut buf);
        }
    }
}

/// The pool `fuzz_open` damages, and its layout; with `extended`, its
/// checkpoint slots are one block and its checkpoints reach past them.
fn fuzz_sample(extended: bool) -> (FaultyMedia, crate::format::Layout) {
    use crate::{Pool, PoolOptions, VolumeSpec};
    let options = PoolOptions {
        name: "fuzz".into(),
        chunk_bytes: 64 << 10,
        uuid: [3; 16],
    };
    let media = FaultyMedia::new(1, 4 << 20, 1);
    let mut pool = match extended {
        true => Pool::create_with_checkpoints(media, options, 4096),
        false => Pool::create(media, options),
    }
    .expect("sample pool");
    pool.unlock(fuzz_keyring());
    let spec = |name: &str, encrypted| VolumeSpec {
        name: name.into(),
        size_bytes: 256 << 10,
        block_size: 512,
        thick: false,
        encrypted,
        compression: crate::compression::Compression::None,
    };
    for (name, encrypted) in [("e", true), ("d", true)] {
        pool.create_volume(&spec(name, encrypted)).expect("volume");
    }
    pool.write("e", 4 << 10, &[7; 4096]).expect("write");
    pool.delete_volume("d").expect("delete");
    pool.create_volume(&spec("f", true)).expect("volume");
    pool.create_volume(&spec("v", false)).expect("volume");
    pool.write("v", 70 << 10, &[9; 4096]).expect("write");
    pool.create_snapshot("v", "s").expect("snapshot");
    pool.clone_volume("v", "s", "c").expect("clone");
    pool.deallocate("v", 64 << 10, 64 << 10)
        .expect("deallocate");
    // A compressed volume: its records (compression, extents, moves) in
    // the journal and its section in the checkpoints.
    let compressed = VolumeSpec {
        compression: crate::compression::Compression::Zstd,
        ..spec("z", false)
    };
    pool.create_volume(&compressed).expect("volume");
    pool.write("z", 0, &[5; 128 << 10]).expect("write");
    pool.create_snapshot("z", "s").expect("snapshot");
    pool.write("z", 512, &[6; 512]).expect("write");
    pool.clean_segments(4).expect("clean");
    if extended {
        for index in 0..60 {
            let name = format!("a-long-name-that-makes-the-checkpoint-grow-{index}");
            pool.create_snapshot("c", &name).expect("snapshot");
        }
        // A checkpoint now, over the slot and its extension.
        pool.delete_volume("f").expect("delete");
        assert!(pool.checkpoint_bytes() > 4096, "reaches past its slot");
    }
    pool.flush().expect("flush");
    let layout = *pool.layout();
    (pool.into_media(), layout)
}

/// Recomputes the CRC of both superblock copies of member 0.
fn reseal_superblocks(media: &mut FaultyMedia) {
    use crate::format::SUPERBLOCK_BYTES;
    for copy in 0..2u64 {
        let at = copy * SUPERBLOCK_BYTES as u64;
        let mut block = vec![0u8; SUPERBLOCK_BYTES];
        media.read_at(0, at, &mut block).expect("within the device");
        let crc = crc32c::crc32c(&block[..SUPERBLOCK_BYTES - 4]);
        media
            .write_at(0, at + SUPERBLOCK_BYTES as u64 - 4, &crc.to_le_bytes())
            .expect("within the device");
    }
}

/// The fuzz sample's key-encryption key.
fn fuzz_keyring() -> std::sync::Arc<crate::crypt::Keyring> {
    let keyring = crate::crypt::Keyring::parse(&"fuzz-kek-".repeat(4)).expect("a key");
    std::sync::Arc::new(keyring)
}

/// Recomputes the CRC of the frame at `start` (payload length clamped to the region).
fn reseal_frame(media: &mut FaultyMedia, start: u64, len: u64) {
    use crate::format::FRAME_HEADER_BYTES;
    let mut header = [0u8; FRAME_HEADER_BYTES];
    media
        .read_at(0, start, &mut header)
        .expect("within the device");
    let payload_len = u32::from_le_bytes(header[4..8].try_into().expect("4")) as u64;
    let payload_len = payload_len.min(len - FRAME_HEADER_BYTES as u64) as usize;
    let mut frame = vec![0u8; FRAME_HEADER_BYTES + payload_len];
    media
        .read_at(0, start, &mut frame)
        .expect("within the device");
    frame[32..36].fill(0);
    let crc = crc32c::crc32c(&frame);
    media
        .write_at(0, start + 32, &crc.to_le_bytes())
        .expect("within the device");
}

/// The tier [`fuzz_tier_open`] damages.
const FUZZ_TIER_ID: [u8; 16] = [9; 16];

/// Fuzz entry point: damages a write tier's device (two superblock copies
/// and two rings holding batches and a wrap) with `data` — the first two
/// bytes an offset (in two-byte steps), the rest the bytes written there —
/// then opens it and reads every block it holds. Opening may fail; it must
/// never panic or allocate without bound.
pub fn fuzz_tier_open(data: &[u8]) {
    use crate::tier::{TierLog, TIER_BLOCK_BYTES};
    thread_local! {
        static SAMPLE: FaultyMedia = fuzz_tier_sample();
    }
    let Some((&[low, high], damage)) = data.split_first_chunk::<2>() else {
        return;
    };
    let mut media = SAMPLE.with(Clone::clone);
    let size = media.size_bytes(0);
    // In two-byte steps: the whole device.
    let offset = u64::from(u16::from_le_bytes([low, high])) * 2 % size;
    let damage = &damage[..damage.len().min((size - offset) as usize)];
    media
        .write_at(0, offset, damage)
        .expect("within the device");
    let Ok(log) = TierLog::open(&mut media, 0, FUZZ_TIER_ID) else {
        return;
    };
    let mut buf = vec![0; TIER_BLOCK_BYTES as usize];
    for block in 0..16 {
        let _ = log.read(&mut media, [0; 16], block, &mut buf);
    }
}

/// A tier of two rings of ten blocks: the first wrapped (two batches
/// before its end, a wrap, one at its start), the second holding a copy of
/// a block the first holds too, the watermark past the oldest batches.
fn fuzz_tier_sample() -> FaultyMedia {
    use crate::tier::TierLog;
    let mut media = FaultyMedia::new(1, 22 * 4096, 1);
    let mut log = TierLog::format(&mut media, 0, FUZZ_TIER_ID, 2).expect("format");
    for first in 1..4 {
        fuzz_tier_append(&mut log, &mut media, 0, first * 2);
    }
    fuzz_tier_append(&mut log, &mut media, 1, 4);
    log.destage(&mut media, 2, 1, |_, _| Ok(()), |_| Ok(()))
        .expect("destage");
    fuzz_tier_append(&mut log, &mut media, 0, 8);
    media
}

/// Appends two blocks at `first_block` of volume 0 to ring `ring`.
fn fuzz_tier_append(
    log: &mut crate::tier::TierLog,
    media: &mut FaultyMedia,
    ring: usize,
    first_block: u64,
) {
    let data = vec![0x5A; 2 * 4096];
    let write = crate::tier::TierWrite {
        volume: [0; 16],
        first_block,
        data: &data,
        pool_order: log.take_order(ring).expect("a ring"),
    };
    log.append(media, ring, &[write]).expect("append");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_writes_survive_a_crash_and_unsynced_ones_may_not() {
        let mut media = FaultyMedia::new(1, 8192, 3);
        media.write_at(0, 0, &[1; 4096]).unwrap();
        media.sync(0).unwrap();
        media.write_at(0, 4096, &[2; 4096]).unwrap();
        let mut buf = [0u8; 4096];
        media.read_at(0, 4096, &mut buf).unwrap();
        assert_eq!(buf, [2; 4096], "reads see the cache");
        let mut crashed = media.crash();
        crashed.read_at(0, 0, &mut buf).unwrap();
        assert_eq!(buf, [1; 4096]);
        crashed.read_at(0, 4096, &mut buf).unwrap();
        assert!(
            buf.chunks(SECTOR_BYTES)
                .all(|s| s.iter().all(|&b| b == 2) || s.iter().all(|&b| b == 0)),
            "whole sectors, old or new"
        );
    }

    #[test]
    fn the_failing_write_is_torn_and_the_device_stays_dead() {
        let mut media = FaultyMedia::new(1, 8192, 5);
        media.fail_after_writes(1);
        media.write_at(0, 0, &[1; 512]).unwrap();
        assert!(media.write_at(0, 512, &[1; 4096]).is_err());
        assert!(media.has_failed());
        assert!(media.sync(0).is_err());
        assert!(media.write_at(0, 0, &[1; 512]).is_err());
        let crashed = media.crash();
        assert!(!crashed.has_failed());
    }
}
