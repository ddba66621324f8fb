//! Model-based crash test: random operations on a pool and on a simple
//! reference model (each volume and snapshot is a byte vector), on media
//! that fail and tear a write after N writes. On failure the media lose
//! power, the pool is reopened and must equal the model — except that the
//! one operation in doubt may have happened or not (and a data operation
//! may have reached some sectors and not others). Every acknowledged
//! operation must survive.

use std::collections::BTreeMap;
use std::sync::Arc;
use weft_volume::compression::Compression;
use weft_volume::crypt::Keyring;
use weft_volume::testing::{FaultyMedia, Rng, SECTOR_BYTES};
use weft_volume::{GroupWrite, Media, Pool, PoolOptions, VolumeError, VolumeSpec};

const CHUNK: u64 = 64 * 1024;
const MEMBER_BYTES: usize = 10 << 20;
const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const SNAPSHOTS: [&str; 2] = ["s1", "s2"];
/// More snapshots per volume, for states that outgrow small checkpoint slots.
const MORE_SNAPSHOTS: [&str; 8] = ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"];

/// A volume as the model expects it. Contents are shared between the
/// states the model keeps (before and after each operation) and copied only
/// when changed: cloning whole volumes at every step was most of the
/// model's run time.
#[derive(Debug, Clone, Default, PartialEq)]
struct ModelVolume {
    data: Arc<Vec<u8>>,
    snapshots: BTreeMap<String, Arc<Vec<u8>>>,
}

type Model = BTreeMap<String, ModelVolume>;

#[derive(Debug, Clone)]
enum Op {
    Create {
        name: String,
        size: u64,
        thick: bool,
        encrypted: bool,
        compression: Compression,
    },
    Delete {
        name: String,
    },
    Write {
        name: String,
        offset: u64,
        len: u64,
        seed: u8,
    },
    Deallocate {
        name: String,
        offset: u64,
        len: u64,
    },
    Resize {
        name: String,
        size: u64,
    },
    Snapshot {
        name: String,
        snapshot: String,
    },
    DeleteSnapshot {
        name: String,
        snapshot: String,
    },
    Clone {
        name: String,
        snapshot: String,
        into: String,
    },
    Flatten {
        name: String,
    },
    /// The keyring's other KEK becomes current and every key is rewrapped.
    Rotate,
    /// Destage rounds of the write tier (a pool with one).
    Destage {
        rounds: usize,
    },
    /// Writes of distinct sectors, as one group (`Pool::write_group`: one
    /// commit, shared tier batches), then a flush.
    WriteGroup {
        writes: Vec<GroupedWrite>,
    },
    /// The cleaner empties up to this many sparse segments.
    Clean {
        segments: usize,
    },
}

/// One write of an `Op::WriteGroup`.
#[derive(Debug, Clone)]
struct GroupedWrite {
    name: String,
    offset: u64,
    len: u64,
    seed: u8,
}

const KEK_A: &str = "a7c3e1f09b8d6a4c2e0f1d3b5a79e8c6d4b2a0f1e3d5c7b9a8f6e4d2c0b1a3f5";
const KEK_B: &str = "0b1a3f5a7c3e1f09b8d6a4c2e0f1d3b5a79e8c6d4b2a0f1e3d5c7b9a8f6e4d2c";

/// Both KEKs, `first` current.
fn keyring(first: bool) -> Arc<Keyring> {
    let (a, b) = if first {
        (KEK_A, KEK_B)
    } else {
        (KEK_B, KEK_A)
    };
    Arc::new(Keyring::parse(&format!("{a}\n{b}\n")).unwrap())
}

/// Opens `media` and unlocks its encrypted volumes (with either KEK current).
fn open(media: FaultyMedia) -> Result<Pool<FaultyMedia>, VolumeError> {
    open_tiered(media, None)
}

/// As `open`, with the pool's write tier.
fn open_tiered(
    media: FaultyMedia,
    tier: Option<FaultyMedia>,
) -> Result<Pool<FaultyMedia>, VolumeError> {
    let mut pool = Pool::open_with_tier(media, tier)?;
    let locked = pool.unlock(keyring(true));
    assert!(locked.is_empty(), "locked after open: {locked:?}");
    Ok(pool)
}

fn random_op(rng: &mut Rng, model: &Model, snapshots: &[&str]) -> Op {
    let name = rng.pick(&NAMES).to_string();
    let size_of = |name: &str| model.get(name).map_or(0, |v| v.data.len() as u64);
    let size = size_of(&name);
    match rng.below(20) {
        0..=2 => Op::Create {
            name,
            size: (1 + rng.below(48)) * 32 * 1024,
            thick: rng.below(5) == 0,
            encrypted: rng.below(2) == 0,
            compression: Compression::None,
        },
        3 => Op::Delete { name },
        4..=10 if size > 0 => {
            let len = (1 + rng.below(64)) * SECTOR_BYTES as u64;
            let offset = rng.below(size.saturating_sub(len) / 512 + 1) * 512;
            Op::Write {
                name,
                offset,
                len: len.min(size - offset),
                seed: rng.below(250) as u8 + 1,
            }
        }
        11 | 12 if size > 0 => {
            // One whole chunk or part of one chunk: either way one piece.
            let chunk = rng.below(size.div_ceil(CHUNK));
            let chunk_end = ((chunk + 1) * CHUNK).min(size);
            let (offset, len) = if rng.below(2) == 0 {
                (chunk * CHUNK, chunk_end - chunk * CHUNK)
            } else {
                let start = chunk * CHUNK + rng.below((chunk_end - chunk * CHUNK) / 512) * 512;
                (start, (1 + rng.below((chunk_end - start) / 512)) * 512)
            };
            Op::Deallocate { name, offset, len }
        }
        13 if size > 0 => Op::Resize {
            name,
            size: size + rng.below(8) * 32 * 1024,
        },
        14 | 15 => Op::Snapshot {
            name,
            snapshot: rng.pick(snapshots).to_string(),
        },
        16 => Op::DeleteSnapshot {
            name,
            snapshot: rng.pick(snapshots).to_string(),
        },
        17 | 18 => Op::Clone {
            name,
            snapshot: rng.pick(snapshots).to_string(),
            into: rng.pick(&NAMES).to_string(),
        },
        19 if rng.below(4) == 0 => Op::Rotate,
        _ => Op::Flatten { name },
    }
}

/// A write's bytes: runs of 7 equal bytes (they compress) for most seeds,
/// noise (it does not) for seeds above 200.
fn pattern(seed: u8, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|i| match seed > 200 {
            true => {
                let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ((x ^ x >> 29).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 56) as u8 ^ seed | 1
            }
            false => seed.wrapping_mul(31).wrapping_add((i / 7) as u8) | 1,
        })
        .collect()
}

fn run(pool: &mut Pool<FaultyMedia>, op: &Op) -> Result<(), VolumeError> {
    match op {
        Op::Create {
            name,
            size,
            thick,
            encrypted,
            compression,
        } => pool.create_volume(&VolumeSpec {
            name: name.clone(),
            size_bytes: *size,
            block_size: 512,
            thick: *thick,
            encrypted: *encrypted,
            compression: *compression,
        }),
        Op::Delete { name } => pool.delete_volume(name),
        Op::Write {
            name,
            offset,
            len,
            seed,
        } => {
            pool.write(name, *offset, &pattern(*seed, *offset, *len))?;
            pool.flush()
        }
        Op::Deallocate { name, offset, len } => {
            pool.deallocate(name, *offset, *len)?;
            pool.flush()
        }
        Op::Resize { name, size } => pool.resize_volume(name, *size),
        Op::Snapshot { name, snapshot } => pool.create_snapshot(name, snapshot),
        Op::DeleteSnapshot { name, snapshot } => pool.delete_snapshot(name, snapshot),
        Op::Clone {
            name,
            snapshot,
            into,
        } => pool.clone_volume(name, snapshot, into),
        Op::Flatten { name } => pool.flatten(name),
        Op::Rotate => {
            let current = pool.volumes().find_map(|v| Some(v.key.as_ref()?.kek_id()));
            let a_is_current = current == Some(keyring(true).ids()[0]);
            pool.unlock(keyring(!a_is_current));
            pool.rewrap().map(|_| ())
        }
        Op::Destage { rounds } => pool.destage_tier(*rounds).map(|_| ()),
        Op::Clean { segments } => pool.clean_segments(*segments).map(|_| ()),
        Op::WriteGroup { writes } => {
            let (_, result) = write_group(pool, writes);
            result
        }
    }
}

/// Runs a group: which writes were acknowledged, and the first failure
/// (or the flush's).
fn write_group(
    pool: &mut Pool<FaultyMedia>,
    writes: &[GroupedWrite],
) -> (Vec<GroupedWrite>, Result<(), VolumeError>) {
    let data: Vec<Vec<u8>> = writes
        .iter()
        .map(|w| pattern(w.seed, w.offset, w.len))
        .collect();
    let group: Vec<GroupWrite> = writes
        .iter()
        .zip(&data)
        .map(|(w, data)| GroupWrite {
            volume: &w.name,
            offset: w.offset,
            data,
        })
        .collect();
    let mut acked = Vec::new();
    let mut first_error = None;
    for (w, result) in writes.iter().zip(pool.write_group(&group)) {
        match result {
            Ok(()) => acked.push(w.clone()),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    let result = match first_error {
        Some(error) => Err(error),
        None => pool.flush(),
    };
    (acked, result)
}

/// A group of 2 to 6 writes of distinct sectors, in any of the volumes.
fn random_group(rng: &mut Rng, model: &Model) -> Op {
    let mut writes: Vec<GroupedWrite> = Vec::new();
    for _ in 0..2 + rng.below(5) {
        let name = rng.pick(&NAMES).to_string();
        let size = model.get(&name).map_or(0, |v| v.data.len() as u64);
        if size == 0 {
            continue;
        }
        let len = (1 + rng.below(24)) * SECTOR_BYTES as u64;
        let offset = rng.below(size.saturating_sub(len) / 512 + 1) * 512;
        let len = len.min(size - offset);
        let overlaps = writes
            .iter()
            .any(|w| w.name == name && w.offset < offset + len && offset < w.offset + w.len);
        if !overlaps {
            writes.push(GroupedWrite {
                name,
                offset,
                len,
                seed: rng.below(250) as u8 + 1,
            });
        }
    }
    Op::WriteGroup { writes }
}

/// The model after `op` succeeded.
fn apply(model: &Model, op: &Op) -> Model {
    let mut next = model.clone();
    match op {
        Op::Create { name, size, .. } => {
            next.insert(
                name.clone(),
                ModelVolume {
                    data: Arc::new(vec![0; *size as usize]),
                    snapshots: BTreeMap::new(),
                },
            );
        }
        Op::Delete { name } => {
            next.remove(name);
        }
        Op::Write {
            name,
            offset,
            len,
            seed,
        } => {
            let at = *offset as usize;
            let data = Arc::make_mut(&mut next.get_mut(name).unwrap().data);
            data[at..at + *len as usize].copy_from_slice(&pattern(*seed, *offset, *len));
        }
        Op::Deallocate { name, offset, len } => {
            let at = *offset as usize;
            Arc::make_mut(&mut next.get_mut(name).unwrap().data)[at..at + *len as usize].fill(0);
        }
        Op::Resize { name, size } => {
            Arc::make_mut(&mut next.get_mut(name).unwrap().data).resize(*size as usize, 0)
        }
        Op::Snapshot { name, snapshot } => {
            let v = next.get_mut(name).unwrap();
            v.snapshots.insert(snapshot.clone(), v.data.clone());
        }
        Op::DeleteSnapshot { name, snapshot } => {
            next.get_mut(name).unwrap().snapshots.remove(snapshot);
        }
        Op::Clone {
            name,
            snapshot,
            into,
        } => {
            let data = next[name].snapshots[snapshot].clone();
            next.insert(
                into.clone(),
                ModelVolume {
                    data,
                    snapshots: BTreeMap::new(),
                },
            );
        }
        Op::WriteGroup { writes } => {
            for w in writes {
                let at = w.offset as usize;
                let data = Arc::make_mut(&mut next.get_mut(&w.name).unwrap().data);
                data[at..at + w.len as usize].copy_from_slice(&pattern(w.seed, w.offset, w.len));
            }
        }
        Op::Flatten { .. } | Op::Rotate | Op::Destage { .. } | Op::Clean { .. } => {}
    }
    next
}

/// Reads the whole pool into a model.
fn observe(pool: &mut Pool<FaultyMedia>) -> Model {
    let names: Vec<String> = pool.volumes().map(|v| v.name.clone()).collect();
    let mut model = Model::new();
    for name in names {
        let info = pool.volume_info(&name).unwrap();
        let mut data = vec![0u8; info.size_bytes as usize];
        pool.read(&name, 0, &mut data).unwrap();
        let mut snapshots = BTreeMap::new();
        for (snapshot, _, size) in info.snapshots {
            let mut content = vec![0u8; size as usize];
            pool.read_snapshot(&name, &snapshot, 0, &mut content)
                .unwrap();
            snapshots.insert(snapshot, Arc::new(content));
        }
        let data = Arc::new(data);
        model.insert(name, ModelVolume { data, snapshots });
    }
    model
}

/// Whether the pool read as the data plane reads a tiered pool's volume
/// (the devices alone where the tier's presence says it holds no block)
/// shows `model`, block by block.
fn data_plane_reads(pool: &mut Pool<FaultyMedia>, model: &Model) -> Result<(), String> {
    for (name, volume) in model {
        for (i, expected) in volume.data.chunks(4096).enumerate() {
            let mut seen = vec![0; expected.len()];
            pool.read_as_the_data_plane(name, i as u64 * 4096, &mut seen)
                .map_err(|e| format!("volume {name} block {i}: {e}"))?;
            if seen != expected {
                return Err(format!(
                    "volume {name} block {i}: the data plane's read differs from the model"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `seen` is `before` or `after`, sector by sector.
fn consistent(seen: &Model, before: &Model, after: &Model) -> Result<(), String> {
    let names = |m: &Model| m.keys().cloned().collect::<Vec<_>>();
    if names(seen) != names(before) && names(seen) != names(after) {
        return Err(format!(
            "volumes {:?}, expected {:?} or {:?}",
            names(seen),
            names(before),
            names(after)
        ));
    }
    for (name, volume) in seen {
        let candidates: Vec<&ModelVolume> = [before.get(name), after.get(name)]
            .into_iter()
            .flatten()
            .collect();
        let same_bytes = |a: &[u8], options: Vec<&Vec<u8>>| {
            options.iter().any(|o| o.len() == a.len())
                && a.chunks(SECTOR_BYTES).enumerate().all(|(i, sector)| {
                    options.iter().any(|o| {
                        o.len() == a.len()
                            && &o[i * SECTOR_BYTES..i * SECTOR_BYTES + sector.len()] == sector
                    })
                })
        };
        if !same_bytes(&volume.data, candidates.iter().map(|c| &*c.data).collect()) {
            return Err(format!("volume {name}: content differs from the model"));
        }
        for (snapshot, content) in &volume.snapshots {
            let options: Vec<&Vec<u8>> = candidates
                .iter()
                .filter_map(|c| c.snapshots.get(snapshot).map(|s| &**s))
                .collect();
            if !same_bytes(content, options) {
                return Err(format!("snapshot {name}@{snapshot}: content differs"));
            }
        }
        let snapshot_names: Vec<&String> = volume.snapshots.keys().collect();
        if !candidates
            .iter()
            .any(|c| c.snapshots.keys().collect::<Vec<_>>() == snapshot_names)
        {
            return Err(format!(
                "volume {name}: snapshots {snapshot_names:?} unexpected"
            ));
        }
    }
    Ok(())
}

fn options() -> PoolOptions {
    PoolOptions {
        name: "model".into(),
        chunk_bytes: CHUNK as u32,
        uuid: [0x5A; 16],
    }
}

/// Checkpoint slots of one metadata block: the pool's checkpoints outgrow
/// them within a few operations and continue into allocation units.
const SMALL_SLOTS: u64 = 4096;

/// A pool on `members` fresh devices, with checkpoint slots as planned or
/// `SMALL_SLOTS` small.
fn create(members: usize, seed: u64, small_slots: bool) -> Pool<FaultyMedia> {
    let media = FaultyMedia::new(members, MEMBER_BYTES, seed);
    match small_slots {
        true => Pool::create_with_checkpoints(media, options(), SMALL_SLOTS).unwrap(),
        false => Pool::create(media, options()).unwrap(),
    }
}

/// A write tier of two rings of 16 blocks: small, so that writes fill it
/// and wait for destages, and its rings wrap often.
const TIER_BYTES: usize = 8192 + 2 * 16 * 4096;

/// How a seed's pool is made.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Plain,
    /// Checkpoints that outgrow their slots early.
    SmallSlots,
    /// A write tier in front of the devices; a third of the volumes
    /// compressed (at destage), the cleaner run between operations.
    Tiered,
    /// Most volumes compressed (lz4 or zstd), the cleaner run between
    /// operations.
    Compressed,
}

/// One seed: `ops` operations, with a failure injected after a random number
/// of writes in every round; after each failure: power cut, reopen, compare.
/// With `Kind::SmallSlots` the checkpoints outgrow their slots early, so
/// that extending them (and writing and reading checkpoints over their
/// extensions) is among what crashes cut short. With `Kind::Tiered` writes
/// go to a write tier, destages come between the operations, and the
/// failure is injected in the tier's device or the pool's.
fn exercise(seed: u64, ops: usize, kind: Kind) {
    let small_slots = kind == Kind::SmallSlots;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut pool = create(2, seed, small_slots);
    if kind == Kind::Tiered {
        let tier = FaultyMedia::new(1, TIER_BYTES, seed ^ 0x7E);
        pool.attach_tier(tier, [0x7E; 16], 2).unwrap();
    }
    pool.unlock(keyring(true));
    let mut model = Model::new();
    let mut crashes = 0;
    let mut most_spilled = 0;
    let arm = |pool: Pool<FaultyMedia>, rng: &mut Rng| {
        let (mut media, mut tier) = pool.into_media_and_tier();
        match tier.as_mut() {
            Some(tier) if rng.below(2) == 0 => tier.fail_after_writes(1 + rng.below(40)),
            _ => media.fail_after_writes(1 + rng.below(80)),
        }
        open_tiered(media, tier)
            .unwrap_or_else(|e| panic!("seed {seed}: reopen of an intact pool: {e}"))
    };
    pool = arm(pool, &mut rng);
    for step in 0..ops {
        let snapshots: &[&str] = if small_slots {
            &MORE_SNAPSHOTS
        } else {
            &SNAPSHOTS
        };
        let tiered = kind == Kind::Tiered;
        let compressed = kind == Kind::Compressed;
        let op = match if tiered || compressed {
            rng.below(6)
        } else {
            6
        } {
            0 if tiered => Op::Destage {
                rounds: 1 + rng.below(3) as usize,
            },
            0 if compressed => Op::Clean {
                segments: 1 + rng.below(3) as usize,
            },
            2 if tiered => Op::Clean {
                segments: 1 + rng.below(3) as usize,
            },
            1 => random_group(&mut rng, &model),
            _ => match random_op(&mut rng, &model, snapshots) {
                // Volumes whose last 4 KiB block is partial, for the tier's
                // read-modify-write of whole blocks; a third compressed
                // (when destaged), unless thick.
                Op::Create {
                    name,
                    size,
                    thick,
                    encrypted,
                    ..
                } if kind == Kind::Tiered => Op::Create {
                    name,
                    size: size + 512 * rng.below(8),
                    thick,
                    encrypted,
                    compression: match rng.below(6) {
                        0 if !thick => Compression::Lz4,
                        1 if !thick => Compression::Zstd,
                        _ => Compression::None,
                    },
                },
                // Volumes whose last unit is partial, and a few thick
                // ones (refused when compressed).
                Op::Create {
                    name,
                    size,
                    thick,
                    encrypted,
                    ..
                } if compressed => Op::Create {
                    name,
                    size: size + 512 * rng.below(8),
                    thick,
                    encrypted,
                    compression: [Compression::None, Compression::Lz4, Compression::Zstd]
                        [rng.below(5) as usize % 3],
                },
                // Noise over whole units, which are stored as they are.
                Op::Write {
                    name, offset, seed, ..
                } if compressed && seed > 200 => {
                    let size = model[&name].data.len() as u64;
                    let offset = offset / CHUNK * CHUNK;
                    Op::Write {
                        name,
                        offset,
                        len: (2 * CHUNK).min(size - offset),
                        seed,
                    }
                }
                op => op,
            },
        };
        // What is acknowledged even if the operation fails: a group's
        // writes that succeeded.
        let (result, acked) = match &op {
            Op::WriteGroup { writes } => {
                // Durable when acknowledged only from a tier: otherwise a
                // write waits for the flush, which a failed group does not
                // reach.
                let durable = pool.tier_info().is_some();
                let (acked, result) = write_group(&mut pool, writes);
                let acked = if durable { acked } else { Vec::new() };
                (result, apply(&model, &Op::WriteGroup { writes: acked }))
            }
            op => (run(&mut pool, op), model.clone()),
        };
        match result {
            Ok(()) => model = apply(&model, &op),
            Err(VolumeError::Io { .. } | VolumeError::Failed { .. }) => {
                crashes += 1;
                let (media, tier) = pool.into_media_and_tier();
                pool = match open_tiered(media.crash(), tier.map(FaultyMedia::crash)) {
                    Ok(pool) => pool,
                    Err(error) => panic!("seed {seed} step {step}: reopen after a crash during {op:?} failed: {error}"),
                };
                let seen = observe(&mut pool);
                if let Err(problem) = consistent(&seen, &acked, &apply(&model, &op)) {
                    panic!("seed {seed} step {step}: after a crash during {op:?}: {problem}");
                }
                model = seen;
                if tiered {
                    data_plane_reads(&mut pool, &model).unwrap_or_else(|p| {
                        panic!("seed {seed} step {step}: after a crash during {op:?}: {p}")
                    });
                }
                pool = arm(pool, &mut rng);
            }
            // Refused (no space, no such volume, limits...): nothing changed
            // but a group's writes that succeeded.
            Err(_) => model = acked,
        }
        most_spilled = most_spilled.max(pool.checkpoint_bytes());
        if step % 16 == 0 {
            let seen = observe(&mut pool);
            if let Err(problem) = consistent(&seen, &model, &model) {
                panic!("seed {seed} step {step}: live pool after {op:?}: {problem}");
            }
            if tiered {
                if let Err(problem) = data_plane_reads(&mut pool, &model) {
                    panic!("seed {seed} step {step}: live pool after {op:?}: {problem}");
                }
            }
        }
    }
    // A last clean reopen must show exactly the model.
    let (media, tier) = pool.into_media_and_tier();
    let mut pool = open_tiered(media.crash(), tier.map(FaultyMedia::crash)).unwrap();
    let seen = observe(&mut pool);
    consistent(&seen, &model, &model).unwrap_or_else(|p| panic!("seed {seed} at the end: {p}"));
    assert!(
        crashes > 0 || ops < 100,
        "seed {seed}: no failure was injected"
    );
    if small_slots {
        assert!(
            most_spilled > SMALL_SLOTS as usize,
            "seed {seed}: no checkpoint reached past its slot"
        );
    }
}

#[test]
fn random_operations_survive_injected_crashes() {
    for seed in 1..=12 {
        exercise(seed, 1000, Kind::Plain);
    }
}

/// The same on a pool with a write tier: writes are acknowledged from the
/// tier, destaged between operations, and a failure cuts the tier's
/// appends and destages as well as the pool's own writes.
#[test]
fn random_operations_on_a_pool_with_a_write_tier_survive_injected_crashes() {
    for seed in 31..=38 {
        exercise(seed, 1000, Kind::Tiered);
    }
}

/// The same with compressed volumes: units read, modified, compressed and
/// placed in segments, the cleaner moving what is left of sparse ones, and
/// failures cutting all of it.
#[test]
fn random_operations_on_compressed_volumes_survive_injected_crashes() {
    for seed in 41..=44 {
        exercise(seed, 1000, Kind::Compressed);
    }
}

/// The same with checkpoints that outgrow their slots: the extensions are
/// made, written and read back through crashes at random writes.
#[test]
fn random_operations_survive_injected_crashes_with_growing_checkpoints() {
    for seed in 21..=26 {
        exercise(seed, 1000, Kind::SmallSlots);
    }
}

#[test]
fn a_pool_reopens_with_its_volumes_snapshots_and_data() {
    let mut pool = Pool::create(FaultyMedia::new(1, MEMBER_BYTES, 1), options()).unwrap();
    let spec = VolumeSpec {
        name: "db1".into(),
        size_bytes: 1 << 20,
        block_size: 4096,
        thick: false,
        encrypted: false,
        compression: weft_volume::compression::Compression::None,
    };
    pool.create_volume(&spec).unwrap();
    pool.write("db1", 4096, &[7; 4096]).unwrap();
    pool.create_snapshot("db1", "s1").unwrap();
    pool.write("db1", 4096, &[8; 4096]).unwrap();
    pool.clone_volume("db1", "s1", "copy").unwrap();
    pool.resize_volume("db1", 2 << 20).unwrap();
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_media().crash()).unwrap();
    let mut buf = [0u8; 4096];
    pool.read("db1", 4096, &mut buf).unwrap();
    assert_eq!(buf, [8; 4096]);
    pool.read("copy", 4096, &mut buf).unwrap();
    assert_eq!(buf, [7; 4096], "the clone shows the snapshot");
    pool.read_snapshot("db1", "s1", 4096, &mut buf).unwrap();
    assert_eq!(buf, [7; 4096]);
    let info = pool.volume_info("db1").unwrap();
    assert_eq!(info.size_bytes, 2 << 20);
    assert_eq!(info.snapshots.len(), 1);
    assert_eq!(
        pool.volume_info("copy").unwrap().origin.unwrap().snapshot,
        "s1"
    );
    assert_ne!(info.id, pool.volume_info("copy").unwrap().id);
}

#[test]
fn a_full_pool_refuses_only_writes_that_need_space() {
    let mut pool = Pool::create(FaultyMedia::new(1, MEMBER_BYTES, 1), options()).unwrap();
    let capacity = pool.info().capacity_bytes;
    let spec = |name: &str, size_bytes| VolumeSpec {
        name: name.into(),
        size_bytes,
        block_size: 4096,
        thick: false,
        encrypted: false,
        compression: weft_volume::compression::Compression::None,
    };
    pool.create_volume(&spec("big", capacity * 2)).unwrap();
    pool.write("big", 0, &vec![1; capacity as usize]).unwrap();
    let error = pool.write("big", capacity, &[2; 4096]).unwrap_err();
    assert!(matches!(error, VolumeError::PoolFull { .. }), "{error}");
    assert!(error.to_string().contains("is full"));
    pool.write("big", 0, &[3; 4096]).unwrap();
    let mut buf = [0u8; 4096];
    pool.read("big", capacity - 4096, &mut buf).unwrap();
    assert_eq!(buf, [1; 4096], "nothing else harmed");
    pool.deallocate("big", 0, CHUNK).unwrap();
    pool.write("big", capacity, &[2; 4096]).unwrap();
    let error = pool.create_volume(&VolumeSpec {
        thick: true,
        encrypted: false,
        ..spec("thick", 4 * CHUNK)
    });
    assert!(matches!(error, Err(VolumeError::PoolFull { .. })));
}

#[test]
fn limits_and_mistakes_get_clear_errors() {
    let mut pool = Pool::create(FaultyMedia::new(1, MEMBER_BYTES, 1), options()).unwrap();
    let spec = VolumeSpec {
        name: "v".into(),
        size_bytes: 1 << 20,
        block_size: 4096,
        thick: false,
        encrypted: false,
        compression: weft_volume::compression::Compression::None,
    };
    pool.create_volume(&spec).unwrap();
    let message = |r: Result<(), VolumeError>| r.unwrap_err().to_string();
    assert!(message(pool.create_volume(&spec)).contains("already exists"));
    assert!(message(pool.resize_volume("v", 4096)).contains("only grow"));
    assert!(message(pool.create_volume(&VolumeSpec {
        name: "w".into(),
        size_bytes: 1000,
        ..spec.clone()
    }))
    .contains("multiple of the block size"));
    pool.create_snapshot("v", "s").unwrap();
    assert!(message(pool.delete_volume("v")).contains("weft snapshot delete v@NAME"));
    assert!(message(pool.clone_volume("v", "nope", "c")).contains("snapshot v@nope does not exist"));
    assert!(message(pool.create_snapshot("v", "bad@name")).contains("not allowed"));
}

/// A pool with volumes, a snapshot, a clone and data (flushed), on
/// `members` devices, and the model of what it holds. With `small_slots`,
/// more snapshots: its checkpoints have outgrown their slots.
fn pool_with_data(members: usize, seed: u64, small_slots: bool) -> (FaultyMedia, Model) {
    let mut pool = create(members, seed, small_slots);
    pool.unlock(keyring(true));
    let mut model = Model::new();
    let ops = [
        Op::Create {
            name: "a".into(),
            size: 2 << 20,
            thick: false,
            encrypted: true,
            compression: Compression::None,
        },
        Op::Write {
            name: "a".into(),
            offset: 4096,
            len: 300 << 10,
            seed: 3,
        },
        Op::Snapshot {
            name: "a".into(),
            snapshot: "s1".into(),
        },
        Op::Write {
            name: "a".into(),
            offset: 8192,
            len: 4096,
            seed: 4,
        },
        Op::Clone {
            name: "a".into(),
            snapshot: "s1".into(),
            into: "b".into(),
        },
        Op::Create {
            name: "c".into(),
            size: 1 << 20,
            thick: true,
            encrypted: false,
            compression: Compression::None,
        },
    ];
    let more = ["a", "b", "c"].iter().flat_map(|name| {
        (0..20).map(|index| Op::Snapshot {
            name: name.to_string(),
            snapshot: format!("a-long-name-that-makes-the-checkpoint-grow-{index}"),
        })
    });
    let more: Vec<Op> = if small_slots { more.collect() } else { vec![] };
    for op in ops.iter().chain(&more) {
        run(&mut pool, op).unwrap();
        model = apply(&model, op);
    }
    if small_slots {
        assert!(
            pool.checkpoint_bytes() > SMALL_SLOTS as usize,
            "the checkpoint reaches past its slot: {} bytes",
            pool.checkpoint_bytes()
        );
    }
    pool.flush().unwrap();
    (pool.into_media(), model)
}

/// Growth crashes at every write it makes (on pools of one and two devices,
/// so that metadata copies are added too, and with checkpoints that
/// outgrew their slots, so that a new copy takes its share of the
/// extension): the pool always reopens with every committed volume and
/// byte, in the old layout or the new one, never a mix; a growth that did
/// not commit can be done again; and once grown, the pool allocates beyond
/// its old capacity and all of it survives a crash.
#[test]
fn growth_survives_a_crash_at_every_write() {
    for (members, small_slots) in [(1, false), (2, false), (1, true), (2, true)] {
        // Fewer seeds with small slots: 60 more snapshots to read back each time.
        for seed in 1..=if small_slots { 2 } else { 4 } {
            let (base, model) = pool_with_data(members, seed, small_slots);
            let old_chunks = open(base.clone()).unwrap().layout().chunks();
            let mut grown_cleanly = false;
            for failing_write in 0.. {
                let mut media = base.clone();
                media.fail_after_writes(failing_write);
                let mut pool = open(media).unwrap();
                let result = pool.add_members(vec![FaultyMedia::new(1, MEMBER_BYTES, seed)]);
                let failed = pool.media().has_failed();
                assert_eq!(result.is_err(), failed, "{result:?}");
                let media = pool.into_media().crash();
                let context = format!(
                    "{members} device(s), small slots {small_slots}, seed {seed}, write {failing_write}"
                );
                let mut pool =
                    open(media).unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
                let layout = *pool.layout();
                assert!(
                    layout.members as usize == members || layout.members as usize == members + 1,
                    "{context}: {layout:?}"
                );
                let expected = if layout.members as usize == members {
                    old_chunks
                } else {
                    old_chunks + layout.groups()[1].chunks()
                };
                assert_eq!(layout.chunks(), expected, "{context}");
                let seen = observe(&mut pool);
                consistent(&seen, &model, &model)
                    .unwrap_or_else(|p| panic!("{context}: after the crash: {p}"));
                if layout.members as usize == members {
                    pool.add_members(vec![FaultyMedia::new(1, MEMBER_BYTES, seed)])
                        .unwrap_or_else(|e| panic!("{context}: growing again: {e}"));
                }
                check_new_copy_alone(&mut pool, &model, members, &context);
                check_new_capacity(pool, model.clone(), old_chunks, &context);
                if !failed {
                    grown_cleanly = true;
                    break;
                }
            }
            assert!(grown_cleanly);
        }
    }
}

/// Damages every metadata copy but the one growth added last (on the pool
/// grown from `members` devices) and checks that the pool opens whole from
/// that copy alone (its checkpoint over its own slot and extension).
fn check_new_copy_alone(
    pool: &mut Pool<FaultyMedia>,
    model: &Model,
    members: usize,
    context: &str,
) {
    let layout = *pool.layout();
    let mut media = pool.media().clone();
    for member in 0..members {
        let start = layout.checkpoint_offset(0);
        let len = layout.journal_offset() + layout.journal_bytes - start;
        media
            .write_at(member, start, &vec![0xEE; len as usize])
            .unwrap();
    }
    let mut alone = open(media).unwrap_or_else(|e| panic!("{context}: from the new copy: {e}"));
    let seen = observe(&mut alone);
    consistent(&seen, model, model)
        .unwrap_or_else(|p| panic!("{context}: opened from the new copy: {p}"));
}

/// Allocates every free unit of a grown pool (past its old capacity) to a
/// thick volume, crashes, and checks everything.
fn check_new_capacity(
    mut pool: Pool<FaultyMedia>,
    mut model: Model,
    old_chunks: u32,
    context: &str,
) {
    let info = pool.info();
    assert_eq!(
        info.capacity_bytes,
        u64::from(pool.layout().chunks()) * CHUNK
    );
    let free = info.capacity_bytes - info.allocated_bytes;
    assert!(
        free > u64::from(old_chunks) * CHUNK / 2,
        "{context}: {free} bytes free"
    );
    let op = Op::Create {
        name: "big".into(),
        size: free,
        thick: true,
        encrypted: false,
        compression: Compression::None,
    };
    run(&mut pool, &op).unwrap_or_else(|e| panic!("{context}: allocating the new units: {e}"));
    model = apply(&model, &op);
    let info = pool.info();
    assert_eq!(info.allocated_bytes, info.capacity_bytes, "{context}");
    let write = Op::Write {
        name: "big".into(),
        offset: free - 8192,
        len: 8192,
        seed: 9,
    };
    run(&mut pool, &write).unwrap();
    model = apply(&model, &write);
    let mut pool = open(pool.into_media().crash()).unwrap();
    let seen = observe(&mut pool);
    consistent(&seen, &model, &model).unwrap_or_else(|p| panic!("{context}: grown pool: {p}"));
}

/// The case that metadata growth is for: a pool created on one device and
/// grown eight times holds more references than the checkpoint slots sized
/// at its creation can (a thick volume over most of it and six snapshots;
/// before format version 3 this failed with "no room left for metadata"),
/// keeps them across a power cut, and refuses a change only when no free
/// unit is left to extend its checkpoints with. The thick volume fills the
/// first devices, so the copies' extensions land on the last one.
#[test]
fn a_pool_grown_many_times_keeps_room_for_its_metadata() {
    const SLOT: u64 = 64 << 10;
    let media = FaultyMedia::new(1, MEMBER_BYTES, 1);
    let mut pool = Pool::create_with_checkpoints(media, options(), SLOT).unwrap();
    for seed in 2..=9 {
        pool.add_members(vec![FaultyMedia::new(1, MEMBER_BYTES, seed)])
            .unwrap();
    }
    let info = pool.info();
    let size = info.capacity_bytes - 40 * CHUNK;
    let mut model = Model::new();
    let mut ops = vec![
        Op::Create {
            name: "big".into(),
            size,
            thick: true,
            encrypted: false,
            compression: Compression::None,
        },
        Op::Write {
            name: "big".into(),
            offset: size - 8192,
            len: 8192,
            seed: 5,
        },
    ];
    for index in 0..6 {
        ops.push(Op::Snapshot {
            name: "big".into(),
            snapshot: format!("s{index}"),
        });
        ops.push(Op::Write {
            name: "big".into(),
            offset: index * 3 * CHUNK,
            len: 4096,
            seed: index as u8 + 10,
        });
    }
    for op in &ops {
        run(&mut pool, op).unwrap_or_else(|e| panic!("{op:?}: {e}"));
        model = apply(&model, op);
    }
    assert!(pool.checkpoint_room() > SLOT, "the slots were extended");
    let held = pool.info().allocated_bytes / CHUNK - size / CHUNK - 6;
    assert!(held > 0, "the extension's units count as allocated");
    let mut pool = open(pool.into_media().crash()).unwrap();
    let seen = observe(&mut pool);
    consistent(&seen, &model, &model).unwrap();

    let mut refused = None;
    for index in 6..256 {
        if let Err(error) = pool.create_snapshot("big", &format!("s{index}")) {
            refused = Some(error);
            break;
        }
    }
    let error = refused.expect("the free units run out").to_string();
    assert!(error.contains("no room left for metadata"), "{error}");
    let mut pool = open(pool.into_media().crash()).unwrap();
    let seen = observe(&mut pool);
    for (name, volume) in &model {
        assert_eq!(seen[name].data, volume.data, "{name}");
    }
}
