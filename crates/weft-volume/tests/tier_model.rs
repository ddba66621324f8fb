//! Crash model of the write tier's log: random group-committed appends,
//! destages and power cuts (each unsynced write kept, dropped or torn), with
//! device failures injected in the middle of appends and destages. After
//! every cut the tier is opened again, and every block must read back (from
//! the tier, or from the capacity device it was destaged to) as the last
//! acknowledged write left it; a write whose append failed may read either
//! way, and then keeps what it read. `WEFT_TIER_MODEL_SEEDS` sets how many
//! seeds (default 8), each of 2000 steps.

use std::collections::HashMap;
use weft_volume::testing::FaultyMedia;
use weft_volume::tier::{TierError, TierLog, TierWrite, TIER_BLOCK_BYTES};
use weft_volume::Media;

const BLOCK: usize = TIER_BLOCK_BYTES as usize;
const ID: [u8; 16] = *b"tier-model-id-01";
const TIER: usize = 0;
const CAPACITY: usize = 1;
const VOLUMES: u32 = 2;
const BLOCKS: u64 = 16;
/// Ring of 22 blocks: a few batches at once, so that it fills and wraps.
const TIER_BLOCKS: usize = 24;
const STEPS: usize = 2000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A block holding version `v` (version 0: never written, zeroes).
fn pattern(v: u32) -> Vec<u8> {
    v.to_le_bytes().repeat(BLOCK / 4)
}

fn capacity_offset(volume: u32, block: u64) -> u64 {
    (u64::from(volume) * BLOCKS + block) * TIER_BLOCK_BYTES
}

struct Model {
    rng: Rng,
    media: FaultyMedia,
    log: TierLog,
    /// Each block's last acknowledged version.
    acked: HashMap<(u32, u64), u32>,
    /// Blocks of a batch whose append failed: (block, its version then, the batch's).
    unsure: Vec<((u32, u64), u32, u32)>,
    version: u32,
    order: u64,
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
        let log = TierLog::format(&mut media, TIER, ID).unwrap();
        Model {
            rng: Rng(seed | 1),
            media,
            log,
            acked: HashMap::new(),
            unsure: Vec::new(),
            version: 0,
            order: 0,
            crashes: 0,
            failures: 0,
        }
    }

    fn step(&mut self) {
        match self.rng.below(100) {
            0..=59 => self.append(),
            60..=79 => self.destage(),
            80..=84 => self.crash(),
            _ => self.check("at run time"),
        }
    }

    fn append(&mut self) {
        let count = 1 + self.rng.below(3);
        let mut writes = Vec::new();
        for _ in 0..count {
            let volume = self.rng.below(u64::from(VOLUMES)) as u32;
            let first = self.rng.below(BLOCKS);
            let blocks = 1 + self.rng.below(3.min(BLOCKS - first));
            let versions: Vec<u32> = (0..blocks)
                .map(|_| {
                    self.version += 1;
                    self.version
                })
                .collect();
            self.order += 1;
            writes.push((volume, first, versions, self.order));
        }
        let data: Vec<Vec<u8>> = writes
            .iter()
            .map(|(_, _, versions, _)| versions.iter().flat_map(|&v| pattern(v)).collect())
            .collect();
        let batch: Vec<TierWrite<'_>> = writes
            .iter()
            .zip(&data)
            .map(|((volume, first, _, order), data)| TierWrite {
                volume: *volume,
                first_block: *first,
                data,
                pool_order: *order,
            })
            .collect();
        let failing = self.rng.below(20) == 0;
        if failing {
            self.media.fail_after_writes(self.rng.below(3));
        }
        let mut result = self.log.append(&mut self.media, &batch);
        if matches!(result, Err(TierError::Full { .. })) {
            // A full tier: writes wait for the destage.
            result = self
                .destage_all()
                .and_then(|_| self.log.append(&mut self.media, &batch));
        }
        if failing {
            self.media.fail_after_writes(u64::MAX);
        }
        let blocks = writes.iter().flat_map(|(volume, first, versions, _)| {
            versions
                .iter()
                .enumerate()
                .map(move |(i, &v)| ((*volume, first + i as u64), v))
        });
        match result {
            Ok(()) => {
                for (block, v) in blocks {
                    self.acked.insert(block, v);
                }
            }
            Err(TierError::Io { .. }) if failing => {
                self.failures += 1;
                self.unsure = blocks
                    .map(|(block, v)| (block, self.acked.get(&block).copied().unwrap_or(0), v))
                    .collect();
                self.crash();
            }
            Err(error) => panic!("append: {error}"),
        }
    }

    fn destage(&mut self) {
        let batches = 1 + self.rng.below(3) as usize;
        let failing = self.rng.below(10) == 0;
        if failing {
            self.media.fail_after_writes(self.rng.below(4));
        }
        let result = self.log.destage(
            &mut self.media,
            batches,
            |m, d| m.write_at(CAPACITY, capacity_offset(d.volume, d.block), d.data),
            |m| m.sync(CAPACITY),
        );
        if failing {
            self.media.fail_after_writes(u64::MAX);
        }
        match result {
            Ok(_) => {}
            Err(TierError::Io { .. }) if failing => {
                self.failures += 1;
                self.crash();
            }
            Err(error) => panic!("destage: {error}"),
        }
    }

    fn destage_all(&mut self) -> Result<usize, TierError> {
        self.log.destage(
            &mut self.media,
            usize::MAX,
            |m, d| m.write_at(CAPACITY, capacity_offset(d.volume, d.block), d.data),
            |m| m.sync(CAPACITY),
        )
    }

    fn crash(&mut self) {
        self.crashes += 1;
        let media = std::mem::replace(&mut self.media, FaultyMedia::new(0, 0, 0));
        self.media = media.crash();
        self.log = TierLog::open(&mut self.media, TIER, ID).unwrap();
        for (block, before, after) in std::mem::take(&mut self.unsure) {
            let found = self.read(block);
            assert!(
                found == before || found == after,
                "block {block:?} of a failed append reads version {found}, neither {before} nor {after}"
            );
            self.acked.insert(block, found);
        }
        self.check("after a power cut");
    }

    /// The version block `block` reads as (the tier's copy first).
    fn read(&mut self, (volume, block): (u32, u64)) -> u32 {
        let mut buf = vec![0; BLOCK];
        let in_tier = self
            .log
            .read(&mut self.media, volume, block, &mut buf)
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
                let expected = self.acked.get(&(volume, block)).copied().unwrap_or(0);
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
