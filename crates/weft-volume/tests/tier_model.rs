//! Crash model of the write tier's log: writes gathered by three rings'
//! writers at once (their pool orders interleave, as concurrent
//! reactors'), group-committed appends, destages in pool order and power
//! cuts (each unsynced write kept, dropped or torn), with device failures
//! injected in the middle of appends and destages. After every cut the tier
//! is opened again, and every block must read back (from the tier, or from
//! the capacity device it was destaged to) as the acknowledged write of the
//! highest pool order left it; a write whose append failed may read either
//! way, and then keeps what it read. `WEFT_TIER_MODEL_SEEDS` sets how many
//! seeds (default 8), each of 2000 steps.

use std::collections::HashMap;
use weft_volume::testing::{FaultyMedia, Rng};
use weft_volume::tier::{TierError, TierLog, TierWrite, TIER_BLOCK_BYTES};
use weft_volume::Media;

const BLOCK: usize = TIER_BLOCK_BYTES as usize;
const ID: [u8; 16] = *b"tier-model-id-01";
const TIER: usize = 0;
const CAPACITY: usize = 1;
const VOLUMES: u32 = 2;
const BLOCKS: u64 = 16;
/// Three rings of 14 blocks: a few batches each, so that they fill and wrap.
const TIER_BLOCKS: usize = 44;
const RINGS: usize = 3;
const STEPS: usize = 2000;
/// The most data blocks a writer appends at once (a ring holds 12 with
/// the batch's header).
const BATCH_BLOCKS_MAX: usize = 8;

/// A block holding version `v` (version 0: never written, zeroes).
fn pattern(v: u32) -> Vec<u8> {
    v.to_le_bytes().repeat(BLOCK / 4)
}

/// Volume `volume`'s identity in the tier.
fn volume_id(volume: u32) -> [u8; 16] {
    [u8::try_from(volume).expect("a few volumes"); 16]
}

fn capacity_offset(volume: u32, block: u64) -> u64 {
    (u64::from(volume) * BLOCKS + block) * TIER_BLOCK_BYTES
}

/// A write gathered for a ring's next batch: (volume, first block, a
/// version per block, its pool order).
type Gathered = (u32, u64, Vec<u32>, u64);

/// A block's last acknowledged version and the pool order that wrote it.
type Version = (u32, u64);

struct Model {
    rng: Rng,
    media: FaultyMedia,
    log: TierLog,
    /// Each ring's writes taken but not appended yet (its writer gathering
    /// them): the rings' pool orders interleave, as concurrent reactors'.
    gathered: Vec<Vec<Gathered>>,
    /// Each block's acknowledged version of the highest pool order (the
    /// newer of two writes of a block is the one with the higher order).
    acked: HashMap<(u32, u64), Version>,
    /// Blocks of a batch whose append failed: (block, its version then,
    /// the batch's if newer).
    unsure: Vec<((u32, u64), Version, Version)>,
    version: u32,
    crashes: u64,
    failures: u64,
}

impl Model {
    fn new(seed: u64) -> Model {
        let mut media = FaultyMedia::new(1, TIER_BLOCKS * BLOCK, seed);
        // The capacity device: every block of every volume.
        let capacity_bytes = (u64::from(VOLUMES) * BLOCKS) as usize * BLOCK;
        media
            .add_member(FaultyMedia::new(1, capacity_bytes, seed))
            .unwrap();
        let log = TierLog::format(&mut media, TIER, ID, RINGS).unwrap();
        Model {
            rng: Rng(seed | 1),
            media,
            log,
            gathered: vec![Vec::new(); RINGS],
            acked: HashMap::new(),
            unsure: Vec::new(),
            version: 0,
            crashes: 0,
            failures: 0,
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=34 => self.gather(),
            35..=59 => self.append(),
            60..=79 => self.destage(),
            80..=84 => self.crash(),
            _ => self.check("at run time"),
        }
    }

    /// A write arrives at a ring's writer: it takes its pool order now.
    fn gather(&mut self) {
        let ring = self.rng.below(RINGS as u64) as usize;
        let volume = self.rng.below(u64::from(VOLUMES)) as u32;
        let first = self.rng.below(BLOCKS);
        let blocks = 1 + self.rng.below(3.min(BLOCKS - first));
        let versions: Vec<u32> = (0..blocks)
            .map(|_| {
                self.version += 1;
                self.version
            })
            .collect();
        let order = self.log.take_order(ring).unwrap();
        self.gathered[ring].push((volume, first, versions, order));
    }

    /// A ring's writer appends what it gathered in one batch.
    fn append(&mut self) {
        let ring = self.rng.below(RINGS as u64) as usize;
        let mut writes = std::mem::take(&mut self.gathered[ring]);
        if writes.is_empty() {
            return;
        }
        // The oldest it gathered, up to a batch of BATCH_BLOCKS_MAX blocks.
        let mut blocks = 0;
        let fit = writes
            .iter()
            .take_while(|(_, _, versions, _)| {
                blocks += versions.len();
                blocks <= BATCH_BLOCKS_MAX
            })
            .count();
        self.gathered[ring] = writes.split_off(fit.max(1));
        let data: Vec<Vec<u8>> = writes
            .iter()
            .map(|(_, _, versions, _)| versions.iter().flat_map(|&v| pattern(v)).collect())
            .collect();
        let batch: Vec<TierWrite<'_>> = writes
            .iter()
            .zip(&data)
            .map(|((volume, first, _, order), data)| TierWrite {
                volume: volume_id(*volume),
                first_block: *first,
                data,
                pool_order: *order,
            })
            .collect();
        let failing = self.rng.below(10) == 0 && self.arm(3);
        let mut result = self.log.append(&mut self.media, ring, &batch);
        if matches!(result, Err(TierError::Full { .. })) {
            // A full tier: writes wait for the destage.
            result = self
                .destage_all()
                .and_then(|_| self.log.append(&mut self.media, ring, &batch));
        }
        self.disarm();
        let blocks: Vec<((u32, u64), Version)> = writes
            .iter()
            .flat_map(|(volume, first, versions, order)| {
                versions
                    .iter()
                    .enumerate()
                    .map(move |(i, &v)| ((*volume, first + i as u64), (v, *order)))
            })
            .collect();
        let newer = |acked: &HashMap<(u32, u64), Version>, block, written: Version| {
            let before = acked.get(&block).copied().unwrap_or((0, 0));
            (
                before,
                if written.1 > before.1 {
                    written
                } else {
                    before
                },
            )
        };
        match result {
            Ok(()) => {
                for (block, written) in blocks {
                    let (_, after) = newer(&self.acked, block, written);
                    self.acked.insert(block, after);
                }
            }
            // Still full: another ring's writes hold the destage back; this
            // one waits (its orders stay taken).
            Err(TierError::Full { .. }) if !failing => {
                writes.append(&mut self.gathered[ring]);
                self.gathered[ring] = writes;
            }
            Err(TierError::Io { .. } | TierError::Full { .. }) if failing => {
                self.failures += 1;
                // A block the batch wrote twice: its newest write counts.
                let mut newest: HashMap<(u32, u64), Version> = HashMap::new();
                for (block, written) in blocks {
                    let slot = newest.entry(block).or_insert(written);
                    if written.1 > slot.1 {
                        *slot = written;
                    }
                }
                self.unsure = newest
                    .into_iter()
                    .map(|(block, written)| {
                        let (before, after) = newer(&self.acked, block, written);
                        (block, before, after)
                    })
                    .collect();
                self.crash();
            }
            Err(error) => panic!("append: {error}"),
        }
    }

    fn destage(&mut self) {
        let rounds = 1 + self.rng.below(3) as usize;
        let failing = self.rng.below(5) == 0 && self.arm(4);
        let result = self.destage_rounds(rounds);
        self.disarm();
        match result {
            Ok(_) => {}
            Err(TierError::Io { .. }) if failing => {
                self.failures += 1;
                // Either the power goes, or (the device still working: a
                // sync failed) the destage is tried again at once: what the
                // failed sync lost must be written again.
                if self.media.has_failed() || self.rng.below(2) == 0 {
                    return self.crash();
                }
                match self.destage_rounds(rounds) {
                    Ok(_) => self.check("after a destage tried again"),
                    Err(TierError::Failed(_)) => self.crash(),
                    Err(error) => panic!("destage again: {error}"),
                }
            }
            Err(error) => panic!("destage: {error}"),
        }
    }

    fn destage_rounds(&mut self, rounds: usize) -> Result<usize, TierError> {
        // Rounds of one batch of each ring, or of several.
        let batches = 1 + self.rng.below(4) as usize;
        self.log.destage(
            &mut self.media,
            rounds,
            batches,
            |m, d| {
                m.write_at(
                    CAPACITY,
                    capacity_offset(u32::from(d.volume[0]), d.block),
                    d.data,
                )
            },
            |m| m.sync(CAPACITY),
        )
    }

    /// Arms a device failure: one of the next `writes` writes fails half
    /// done (and the device with it), or the next sync fails losing some
    /// of the writes it was to make durable.
    fn arm(&mut self, writes: u64) -> bool {
        if self.rng.below(2) == 0 {
            self.media.fail_after_writes(self.rng.below(writes));
        } else {
            self.media.fail_next_syncs_losing_writes(1);
        }
        true
    }

    fn disarm(&mut self) {
        self.media.fail_after_writes(u64::MAX);
        self.media.fail_next_syncs(0);
    }

    fn destage_all(&mut self) -> Result<usize, TierError> {
        self.log.destage(
            &mut self.media,
            usize::MAX,
            usize::MAX,
            |m, d| {
                m.write_at(
                    CAPACITY,
                    capacity_offset(u32::from(d.volume[0]), d.block),
                    d.data,
                )
            },
            |m| m.sync(CAPACITY),
        )
    }

    fn crash(&mut self) {
        self.crashes += 1;
        let media = std::mem::replace(&mut self.media, FaultyMedia::new(0, 0, 0));
        self.media = media.crash();
        self.log = TierLog::open(&mut self.media, TIER, ID).unwrap();
        // What the writers gathered was never acknowledged.
        self.gathered = vec![Vec::new(); RINGS];
        for (block, before, after) in std::mem::take(&mut self.unsure) {
            let found = self.read(block);
            let now = [before, after].into_iter().find(|(v, _)| *v == found);
            let now = now.unwrap_or_else(|| {
                panic!("block {block:?} of a failed append reads version {found}, neither {before:?} nor {after:?}")
            });
            self.acked.insert(block, now);
        }
        self.check("after a power cut");
    }

    /// The version block `block` reads as (the tier's copy first).
    fn read(&mut self, (volume, block): (u32, u64)) -> u32 {
        let mut buf = vec![0; BLOCK];
        let in_tier = self
            .log
            .read(&mut self.media, volume_id(volume), block, &mut buf)
            .unwrap();
        if !in_tier {
            self.media
                .read_at(CAPACITY, capacity_offset(volume, block), &mut buf)
                .unwrap();
        }
        let v = u32::from_le_bytes(buf[..4].try_into().unwrap());
        assert_eq!(buf, pattern(v), "block {volume}/{block} is torn");
        v
    }

    fn check(&mut self, when: &str) {
        for volume in 0..VOLUMES {
            for block in 0..BLOCKS {
                let expected = self.acked.get(&(volume, block)).map_or(0, |&(v, _)| v);
                let found = self.read((volume, block));
                assert_eq!(
                    found, expected,
                    "block {volume}/{block} {when}: version {found}, acknowledged {expected}"
                );
            }
        }
    }
}

#[test]
fn acknowledged_tier_writes_survive_power_cuts_and_failures_at_any_step() {
    let seeds: u64 = std::env::var("WEFT_TIER_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let (mut crashes, mut failures) = (0, 0);
    for seed in 1..=seeds {
        let mut model = Model::new(seed);
        for step in 0..STEPS {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.step()));
            if let Err(panic) = outcome {
                eprintln!("seed {seed} failed at step {step}");
                std::panic::resume_unwind(panic);
            }
        }
        model.crash();
        crashes += model.crashes;
        failures += model.failures;
    }
    eprintln!(
        "{seeds} seeds of {STEPS} steps: {crashes} power cuts, {failures} injected device failures"
    );
    assert!(crashes > seeds * 50 && failures > seeds * 10);
}
