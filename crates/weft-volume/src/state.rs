//! The pool's metadata as a deterministic state machine: volumes, their
//! snapshots, chunk maps and per-chunk reference counts, changed only by
//! applying [`Record`]s. The same `apply` runs when an operation is staged
//! and when the journal is replayed at open, so what is on disk and what is
//! in memory cannot drift apart. Checkpoints serialise the whole state.
//!
//! Sharing is by reference count, not by chains: a snapshot or clone holds
//! its own reference to every chunk it shares, so a lookup is always one map
//! entry however many snapshots or clones exist, and a snapshot can be
//! deleted while clones made from it live on. What this module does not do:
//! I/O, choosing free chunks for new data (the pool does, and records the
//! choice), or validating user input beyond what keeps the state consistent.

use crate::codec::{Decoder, Encoder};
use crate::compression::Compression;
use crate::crypt::keys::{WrappedKey, WRAPPED_KEY_BYTES};
use crate::extents::{Extent, ExtentMap};
use crate::format::FormatError;
use crate::map::{ChunkMap, Lookup, WriteGate};
use std::collections::BTreeMap;
use std::sync::Arc;
use thiserror::Error;

mod compressed;

/// "No chunk" in a snapshot's chunk list.
pub const NO_CHUNK: u32 = u32::MAX;

/// A run of consecutive logical chunks mapped to consecutive physical chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First logical chunk.
    pub logical: u32,
    /// First physical chunk.
    pub physical: u32,
    /// Chunks in the run.
    pub len: u32,
}

/// Where a clone came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// Source volume.
    pub volume: String,
    /// Source snapshot.
    pub snapshot: String,
}

/// One metadata change; the journal is a sequence of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A new volume; `runs` are its preallocated chunks (thick volumes).
    CreateVolume {
        /// Volume identity (namespace NGUID/UUID).
        id: [u8; 16],
        /// Name.
        name: String,
        /// Size in bytes.
        size_bytes: u64,
        /// Logical block size.
        block_size: u32,
        /// Preallocated.
        thick: bool,
        /// Preallocated chunks.
        runs: Vec<Run>,
        /// An encrypted volume's wrapped data key: in the record that
        /// creates it, so that no replay ever sees it unencrypted.
        key: Option<WrappedKey>,
    },
    /// A volume (without snapshots) is gone; its chunks are released.
    DeleteVolume {
        /// Name.
        name: String,
    },
    /// A volume grows to `size_bytes`; `runs` preallocate the new tail (thick).
    ResizeVolume {
        /// Name.
        name: String,
        /// New size in bytes.
        size_bytes: u64,
        /// Preallocated chunks of the new tail.
        runs: Vec<Run>,
    },
    /// A read-only point-in-time copy of a volume.
    CreateSnapshot {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
        /// Snapshot identity.
        id: [u8; 16],
    },
    /// A snapshot is gone; its references are released.
    DeleteSnapshot {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// A writable volume sharing every chunk of a snapshot.
    CloneVolume {
        /// New volume's identity.
        id: [u8; 16],
        /// New volume's name.
        name: String,
        /// Source.
        origin: Origin,
    },
    /// Logical chunks now map to fresh physical chunks (first write or copy on
    /// write); previous mappings are released.
    Map {
        /// Volume.
        volume: String,
        /// New mappings.
        runs: Vec<Run>,
    },
    /// Logical chunks are deallocated.
    Unmap {
        /// Volume.
        volume: String,
        /// First logical chunk.
        first: u32,
        /// Number of chunks.
        count: u32,
    },
    /// A clone no longer shares chunks with its origin.
    Flattened {
        /// Volume.
        volume: String,
    },
    /// An encrypted volume's data key, wrapped anew (KEK rotation).
    SetVolumeKey {
        /// Volume.
        volume: String,
        /// The key.
        key: WrappedKey,
    },
    /// A volume's writes from now on are compressed (staged with its
    /// creation, before any write).
    SetCompression {
        /// Volume.
        volume: String,
        /// The algorithm.
        compression: Compression,
    },
    /// Units of a compressed volume are now stored in these extents (None:
    /// deallocated); what they were stored in before is released.
    SetExtents {
        /// Volume.
        volume: String,
        /// By unit.
        extents: Vec<(u32, Option<Extent>)>,
    },
    /// The cleaner copied extents out of segment `from`: every reference
    /// (volumes' and snapshots') to one of them now names its copy.
    MoveExtents {
        /// The segment emptied.
        from: u32,
        /// By first sector in `from`: the chunk and sector of the copy.
        moves: Vec<(u32, u32, u32)>,
    },
}

/// A record or checkpoint that cannot be applied: the metadata is corrupt
/// in a way checksums cannot see (or written by a buggy version).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("inconsistent metadata: {0}")]
pub struct Inconsistent(pub String);

fn inconsistent(message: impl Into<String>) -> Inconsistent {
    Inconsistent(message.into())
}

/// A served volume.
#[derive(Debug)]
pub struct Volume {
    /// Identity, stable for the volume's life.
    pub id: [u8; 16],
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Preallocated.
    pub thick: bool,
    /// The snapshot it was cloned from, until flattened.
    pub origin: Option<Origin>,
    /// Chunk map (shared with the data plane).
    pub map: Arc<ChunkMap>,
    /// In-flight I/O gate (shared with the data plane, kept across resizes).
    pub gate: Arc<WriteGate>,
    /// Snapshots by name.
    pub snapshots: BTreeMap<String, Snapshot>,
    /// Chunks mapped.
    pub mapped_chunks: u32,
    /// Its wrapped data key, if it is encrypted (a clone shares its
    /// source's: they share blocks).
    pub key: Option<WrappedKey>,
    /// How its writes are compressed (a clone's as its source's).
    pub compression: Compression,
    /// Where its units are, once written compressed (never mapped chunks:
    /// a compressed volume's data lives in extents only).
    pub extents: ExtentMap,
}

/// A read-only point-in-time copy of a volume.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Identity.
    pub id: [u8; 16],
    /// Size of the volume when it was taken.
    pub size_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Physical chunk per logical chunk, [`NO_CHUNK`] where unmapped.
    pub chunks: Vec<u32>,
    /// A compressed volume's extents when it was taken.
    pub extents: ExtentMap,
}

/// Volumes, snapshots and chunk reference counts of one pool.
#[derive(Debug)]
pub struct PoolState {
    chunk_shift: u32,
    /// Volumes by name.
    pub volumes: BTreeMap<String, Volume>,
    refcounts: Vec<u32>,
    /// Chunks free to allocate now.
    free: Vec<u32>,
    /// Chunks released by records not yet durable: not reused until they are.
    released: Vec<u32>,
    references: u64,
    allocated: u32,
    /// A wrapped key was dropped or replaced: older metadata on the devices
    /// still holds it until the pool scrubs it (see `Pool::scrub_metadata`).
    pub scrub_owed: bool,
    /// Chunks holding extents, with the sectors referenced in each (a
    /// shared extent once per reference). Each holds one reference to its
    /// chunk while it is here.
    segments: BTreeMap<u32, u64>,
    /// The segment the pool fills now: kept even while nothing in it is
    /// referenced.
    open_segment: Option<u32>,
    /// References to extents, all maps together (bounds the checkpoint).
    extent_refs: u64,
}

impl PoolState {
    /// An empty pool of `chunks` chunks of `1 << chunk_shift` bytes.
    pub fn new(chunks: u32, chunk_shift: u32) -> PoolState {
        PoolState {
            chunk_shift,
            volumes: BTreeMap::new(),
            refcounts: vec![0; chunks as usize],
            // Popped from the end: the lowest chunk first, so thick volumes are contiguous.
            free: (0..chunks).rev().collect(),
            released: Vec::new(),
            references: 0,
            allocated: 0,
            scrub_owed: false,
            segments: BTreeMap::new(),
            open_segment: None,
            extent_refs: 0,
        }
    }

    /// The pool grew to `chunks` chunks: the new ones are free at once (after
    /// the free chunks it had, which are still allocated first).
    pub fn grow(&mut self, chunks: u32) {
        let old = self.chunks();
        assert!(chunks >= old, "pools only grow");
        self.refcounts.resize(chunks as usize, 0);
        self.free.splice(0..0, (old..chunks).rev());
    }

    /// Gives every volume a copy of its map and retires the old one: whoever
    /// still holds an old map must ask the manager from now on, and the
    /// manager updates only the new ones.
    pub fn renew_maps(&mut self) {
        for volume in self.volumes.values_mut() {
            let map = Arc::new(volume.map.resized(volume.map.len()));
            volume.map.retire();
            volume.map = map;
        }
    }

    /// Chunks in the pool.
    pub fn chunks(&self) -> u32 {
        self.refcounts.len() as u32
    }

    /// Chunks referenced by at least one volume or snapshot.
    pub fn allocated(&self) -> u32 {
        self.allocated
    }

    /// Chunks that can be allocated now.
    pub fn free_now(&self) -> u32 {
        self.free.len() as u32
    }

    /// Sum over all maps of mapped entries, and one per segment held
    /// (bounds the checkpoint size).
    pub fn references(&self) -> u64 {
        self.references
    }

    /// References to physical chunk `chunk`.
    pub fn refcount(&self, chunk: u32) -> u32 {
        self.refcounts[chunk as usize]
    }

    /// Logical chunks of a volume of `size_bytes`.
    pub fn chunks_for(&self, size_bytes: u64) -> u32 {
        let chunk = 1u64 << self.chunk_shift;
        u32::try_from(size_bytes.div_ceil(chunk)).expect("sizes are validated against the limit")
    }

    /// Takes a free chunk for new data (recorded by the caller in a `Map` or
    /// `CreateVolume`/`ResizeVolume` record), or a segment to fill (held
    /// until nothing in it is referenced: see `open_segment`).
    pub fn allocate(&mut self) -> Option<u32> {
        let chunk = self.free.pop()?;
        assert_eq!(
            self.refcounts[chunk as usize], 0,
            "free chunk {chunk} in use"
        );
        Some(chunk)
    }

    /// Gives back a chunk from `allocate` that no record took after all.
    pub fn unallocate(&mut self, chunk: u32) {
        assert_eq!(self.refcounts[chunk as usize], 0, "chunk {chunk} in use");
        self.free.push(chunk);
    }

    /// Whether chunks wait for the records that released them to be durable.
    pub fn has_released(&self) -> bool {
        !self.released.is_empty()
    }

    /// The records staged with the released chunks are durable: reuse them.
    pub fn release_committed(&mut self) {
        self.free.append(&mut self.released);
    }

    /// Holds `chunks` for metadata (checkpoint extensions): never free,
    /// never mapped. Each must be free now or unused (at open, before
    /// `rebuild_free`): a volume mapping one is corrupt metadata.
    pub fn reserve(&mut self, chunks: &[u32]) -> Result<(), Inconsistent> {
        for &chunk in chunks {
            let count = self
                .refcounts
                .get_mut(chunk as usize)
                .ok_or_else(|| inconsistent(format!("metadata chunk {chunk} beyond the pool")))?;
            if *count != 0 {
                return Err(inconsistent(format!(
                    "chunk {chunk} holds metadata but is mapped or held already"
                )));
            }
            *count = 1;
            self.allocated += 1;
        }
        let refcounts = &self.refcounts;
        self.free.retain(|&chunk| refcounts[chunk as usize] == 0);
        Ok(())
    }

    /// The chunks free to allocate now.
    pub fn free_chunks(&self) -> &[u32] {
        &self.free
    }

    /// Rebuilds the free list from the reference counts (after replay).
    pub fn rebuild_free(&mut self) {
        self.released.clear();
        self.free = (0..self.chunks())
            .rev()
            .filter(|&c| self.refcounts[c as usize] == 0)
            .collect();
    }

    /// Sets the writable bit of `volume`'s chunk `index` if only it references
    /// the chunk now (e.g. after the snapshot that shared it was deleted).
    pub fn claim_if_exclusive(&mut self, volume: &str, index: usize) -> bool {
        let Some(v) = self.volumes.get(volume) else {
            return false;
        };
        match v.map.lookup(index) {
            Lookup::Mapped {
                chunk,
                writable: false,
            } if self.refcounts[chunk as usize] == 1 => {
                v.map.set(
                    index,
                    Lookup::Mapped {
                        chunk,
                        writable: true,
                    },
                );
                true
            }
            Lookup::Mapped { writable, .. } => writable,
            Lookup::Unmapped => false,
        }
    }

    /// Applies one record. At run time the pool validated it first, so an
    /// error here is a bug; at replay it means corrupt metadata.
    pub fn apply(&mut self, record: &Record) -> Result<(), Inconsistent> {
        match record {
            Record::CreateVolume {
                id,
                name,
                size_bytes,
                block_size,
                thick,
                runs,
                key,
            } => {
                if self.volumes.contains_key(name) {
                    return Err(inconsistent(format!("volume {name} created twice")));
                }
                self.check_geometry(*size_bytes, *block_size)?;
                let map = ChunkMap::new(self.chunks_for(*size_bytes) as usize);
                self.volumes.insert(
                    name.clone(),
                    Volume {
                        id: *id,
                        name: name.clone(),
                        size_bytes: *size_bytes,
                        block_size: *block_size,
                        thick: *thick,
                        origin: None,
                        map: Arc::new(map),
                        gate: Arc::default(),
                        snapshots: BTreeMap::new(),
                        mapped_chunks: 0,
                        key: key.clone(),
                        compression: Compression::None,
                        extents: ExtentMap::new(),
                    },
                );
                self.map_runs(name, runs)
            }
            Record::DeleteVolume { name } => {
                let volume = self.volume(name)?;
                if !volume.snapshots.is_empty() {
                    return Err(inconsistent(format!(
                        "volume {name} deleted with snapshots"
                    )));
                }
                let volume = self.volumes.remove(name).expect("checked");
                // Its key is still in the metadata on the devices.
                self.scrub_owed |= volume.key.is_some();
                self.unref_extents(&volume.extents);
                for lookup in volume.map.iter() {
                    if let Lookup::Mapped { chunk, .. } = lookup {
                        self.unref(chunk);
                    }
                }
                Ok(())
            }
            Record::ResizeVolume {
                name,
                size_bytes,
                runs,
            } => {
                let block_size = self.volume(name)?.block_size;
                self.check_geometry(*size_bytes, block_size)?;
                let len = self.chunks_for(*size_bytes) as usize;
                let volume = self.volume_mut(name)?;
                if *size_bytes < volume.size_bytes {
                    return Err(inconsistent(format!("volume {name} shrunk")));
                }
                let map = Arc::new(volume.map.resized(len));
                volume.map.retire();
                volume.map = map;
                volume.size_bytes = *size_bytes;
                self.map_runs(name, runs)
            }
            Record::CreateSnapshot { volume, name, id } => {
                let v = self.volume(volume)?;
                if v.snapshots.contains_key(name) {
                    return Err(inconsistent(format!(
                        "snapshot {volume}@{name} created twice"
                    )));
                }
                let mut chunks = Vec::with_capacity(v.map.len());
                for (index, lookup) in v.map.iter().enumerate() {
                    match lookup {
                        Lookup::Mapped { chunk, .. } => {
                            v.map.set(
                                index,
                                Lookup::Mapped {
                                    chunk,
                                    writable: false,
                                },
                            );
                            chunks.push(chunk);
                        }
                        Lookup::Unmapped => chunks.push(NO_CHUNK),
                    }
                }
                let snapshot = Snapshot {
                    id: *id,
                    size_bytes: v.size_bytes,
                    block_size: v.block_size,
                    chunks,
                    extents: v.extents.clone(),
                };
                self.add_snapshot(volume, name, snapshot)
            }
            Record::DeleteSnapshot { volume, name } => {
                let snapshot = self
                    .volume_mut(volume)?
                    .snapshots
                    .remove(name)
                    .ok_or_else(|| inconsistent(format!("no snapshot {volume}@{name}")))?;
                for &chunk in snapshot.chunks.iter().filter(|&&c| c != NO_CHUNK) {
                    self.unref(chunk);
                }
                self.unref_extents(&snapshot.extents);
                Ok(())
            }
            Record::CloneVolume { id, name, origin } => {
                if self.volumes.contains_key(name) {
                    return Err(inconsistent(format!("volume {name} created twice")));
                }
                let snapshot = self
                    .volume(&origin.volume)?
                    .snapshots
                    .get(&origin.snapshot)
                    .ok_or_else(|| {
                        inconsistent(format!(
                            "clone of missing {}@{}",
                            origin.volume, origin.snapshot
                        ))
                    })?
                    .clone();
                let source = self.volume(&origin.volume)?;
                let (key, compression) = (source.key.clone(), source.compression);
                self.ref_extents(&snapshot.extents)?;
                let map = ChunkMap::new(snapshot.chunks.len());
                let mut mapped = 0;
                for (index, &chunk) in snapshot.chunks.iter().enumerate() {
                    if chunk != NO_CHUNK {
                        map.set(
                            index,
                            Lookup::Mapped {
                                chunk,
                                writable: false,
                            },
                        );
                        self.add_ref(chunk)?;
                        mapped += 1;
                    }
                }
                self.volumes.insert(
                    name.clone(),
                    Volume {
                        id: *id,
                        name: name.clone(),
                        size_bytes: snapshot.size_bytes,
                        block_size: snapshot.block_size,
                        thick: false,
                        origin: Some(origin.clone()),
                        map: Arc::new(map),
                        gate: Arc::default(),
                        snapshots: BTreeMap::new(),
                        mapped_chunks: mapped,
                        key,
                        compression,
                        extents: snapshot.extents,
                    },
                );
                Ok(())
            }
            Record::Map { volume, runs } => self.map_runs(volume, runs),
            Record::SetVolumeKey { volume, key } => {
                let volume = self.volume_mut(volume)?;
                if volume.key.replace(key.clone()).is_none() {
                    return Err(inconsistent(format!(
                        "volume {} given a key after its creation",
                        volume.name
                    )));
                }
                // The old wrapping is still in the metadata on the devices.
                self.scrub_owed = true;
                Ok(())
            }
            Record::Unmap {
                volume,
                first,
                count,
            } => {
                let v = self.volume(volume)?;
                let end = first
                    .checked_add(*count)
                    .filter(|&e| e as usize <= v.map.len());
                let Some(end) = end else {
                    return Err(inconsistent(format!("unmap beyond volume {volume}")));
                };
                let map = Arc::clone(&v.map);
                for index in *first..end {
                    if let Lookup::Mapped { chunk, .. } = map.lookup(index as usize) {
                        map.set(index as usize, Lookup::Unmapped);
                        self.unref(chunk);
                        self.volume_mut(volume)?.mapped_chunks -= 1;
                    }
                }
                Ok(())
            }
            Record::Flattened { volume } => {
                self.volume_mut(volume)?.origin = None;
                Ok(())
            }
            Record::SetCompression {
                volume,
                compression,
            } => self.set_compression(volume, *compression),
            Record::SetExtents { volume, extents } => self.set_extents(volume, extents),
            Record::MoveExtents { from, moves } => self.move_extents(*from, moves),
        }
    }

    /// Sizes the pool validated at run time; checked again for what replay reads.
    fn check_geometry(&self, size_bytes: u64, block_size: u32) -> Result<(), Inconsistent> {
        let max = crate::VOLUME_CHUNKS_MAX << self.chunk_shift;
        let valid = matches!(block_size, 512 | 4096)
            && size_bytes > 0
            && size_bytes.is_multiple_of(u64::from(block_size))
            && size_bytes <= max;
        if !valid {
            return Err(inconsistent(format!(
                "volume of {size_bytes} bytes in blocks of {block_size}"
            )));
        }
        Ok(())
    }

    fn volume(&self, name: &str) -> Result<&Volume, Inconsistent> {
        self.volumes
            .get(name)
            .ok_or_else(|| inconsistent(format!("no volume {name}")))
    }

    fn volume_mut(&mut self, name: &str) -> Result<&mut Volume, Inconsistent> {
        self.volumes
            .get_mut(name)
            .ok_or_else(|| inconsistent(format!("no volume {name}")))
    }

    fn add_snapshot(
        &mut self,
        volume: &str,
        name: &str,
        snapshot: Snapshot,
    ) -> Result<(), Inconsistent> {
        for &chunk in snapshot.chunks.iter().filter(|&&c| c != NO_CHUNK) {
            self.add_ref(chunk)?;
        }
        self.ref_extents(&snapshot.extents)?;
        self.volume_mut(volume)?
            .snapshots
            .insert(name.to_string(), snapshot);
        Ok(())
    }

    /// Maps fresh chunks into `volume`, releasing what the entries held before.
    fn map_runs(&mut self, volume: &str, runs: &[Run]) -> Result<(), Inconsistent> {
        let v = self.volume(volume)?;
        if v.compression != Compression::None && !runs.is_empty() {
            return Err(inconsistent(format!(
                "chunks mapped into compressed volume {volume}"
            )));
        }
        let map = Arc::clone(&v.map);
        for run in runs {
            for step in 0..run.len {
                let logical = run.logical.checked_add(step).map(|l| l as usize);
                let physical = run.physical.checked_add(step);
                let (Some(logical), Some(physical)) = (logical, physical) else {
                    return Err(inconsistent("run overflows"));
                };
                if logical >= map.len() {
                    return Err(inconsistent(format!("map beyond volume {volume}")));
                }
                if self.refcounts.get(physical as usize) != Some(&0) {
                    return Err(inconsistent(format!(
                        "chunk {physical} mapped while in use or beyond the pool"
                    )));
                }
                match map.lookup(logical) {
                    Lookup::Mapped { chunk, .. } => self.unref(chunk),
                    Lookup::Unmapped => self.volume_mut(volume)?.mapped_chunks += 1,
                }
                self.add_ref(physical)?;
                map.set(
                    logical,
                    Lookup::Mapped {
                        chunk: physical,
                        writable: true,
                    },
                );
            }
        }
        Ok(())
    }

    fn add_ref(&mut self, chunk: u32) -> Result<(), Inconsistent> {
        let count = self
            .refcounts
            .get_mut(chunk as usize)
            .ok_or_else(|| inconsistent(format!("chunk {chunk} beyond the pool")))?;
        if *count == 0 {
            self.allocated += 1;
        }
        *count += 1;
        self.references += 1;
        Ok(())
    }

    fn unref(&mut self, chunk: u32) {
        let count = &mut self.refcounts[chunk as usize];
        assert!(
            *count > 0,
            "chunk {chunk} released more often than referenced"
        );
        *count -= 1;
        self.references -= 1;
        if *count == 0 {
            self.allocated -= 1;
            self.released.push(chunk);
        }
    }

    /// Serialises the state for a checkpoint.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::new();
        e.u32(self.volumes.len() as u32);
        for volume in self.volumes.values() {
            e.bytes(&volume.id);
            e.name(&volume.name);
            e.u64(volume.size_bytes);
            e.u32(volume.block_size);
            e.u8(u8::from(volume.thick));
            match &volume.origin {
                Some(origin) => {
                    e.u8(1);
                    e.name(&origin.volume);
                    e.name(&origin.snapshot);
                }
                None => e.u8(0),
            }
            let chunks: Vec<u32> = volume
                .map
                .iter()
                .map(|l| match l {
                    Lookup::Mapped { chunk, .. } => chunk,
                    Lookup::Unmapped => NO_CHUNK,
                })
                .collect();
            encode_runs(&mut e, &chunks);
            e.u32(volume.snapshots.len() as u32);
            for (name, snapshot) in &volume.snapshots {
                e.bytes(&snapshot.id);
                e.name(name);
                e.u64(snapshot.size_bytes);
                e.u32(snapshot.block_size);
                encode_runs(&mut e, &snapshot.chunks);
            }
        }
        // Keys last, and only when a volume has one (or one was dropped):
        // a pool that never held an encrypted volume stays readable by
        // builds from before encryption.
        let keyed: Vec<_> = self
            .volumes
            .values()
            .filter_map(|v| Some((&v.name, v.key.as_ref()?)))
            .collect();
        // Then compression, only when a volume is compressed or holds
        // extents (after a keys section, empty if need be).
        let compressed = self.has_compression();
        if !keyed.is_empty() || self.scrub_owed || compressed {
            e.u32(keyed.len() as u32);
            for (name, key) in keyed {
                e.name(name);
                e.bytes(&key.0);
            }
            e.u8(u8::from(self.scrub_owed));
        }
        if compressed {
            self.encode_compression(&mut e);
        }
        e.into_bytes()
    }

    /// An upper bound of `encode().len()`: 12 bytes per reference plus the
    /// fixed part of every volume and snapshot, the volume keys, and the
    /// compression section.
    pub fn encoded_len_bound(&self) -> u64 {
        let objects = self.volumes.len() as u64
            + self
                .volumes
                .values()
                .map(|v| v.snapshots.len() as u64)
                .sum::<u64>();
        let keys = 5 + self.volumes.len() as u64 * (65 + WRAPPED_KEY_BYTES as u64);
        4 + objects * 300 + 12 * self.references + keys + self.compression_len_bound()
    }

    /// Rebuilds a state from a checkpoint.
    pub fn decode(
        bytes: &[u8],
        chunks: u32,
        chunk_shift: u32,
    ) -> Result<PoolState, CheckpointError> {
        let mut state = PoolState::new(chunks, chunk_shift);
        let mut d = Decoder::new(bytes);
        for _ in 0..d.u32()? {
            let id = d.array()?;
            let name = d.name()?;
            let size_bytes = d.u64()?;
            let block_size = d.u32()?;
            let thick = d.flag()?;
            let origin = if d.flag()? {
                Some(Origin {
                    volume: d.name()?,
                    snapshot: d.name()?,
                })
            } else {
                None
            };
            state.apply(&Record::CreateVolume {
                id,
                name: name.clone(),
                size_bytes,
                block_size,
                thick,
                runs: Vec::new(),
                key: None,
            })?;
            let volume_chunks = state.chunks_for(size_bytes);
            let runs = decode_runs(&mut d, volume_chunks)?;
            state.restore_map(&name, &runs)?;
            state.volume_mut(&name)?.origin = origin;
            for _ in 0..d.u32()? {
                let id = d.array()?;
                let snapshot_name = d.name()?;
                let size_bytes = d.u64()?;
                let block_size = d.u32()?;
                state.check_geometry(size_bytes, block_size)?;
                let mut snapshot_chunks = vec![NO_CHUNK; state.chunks_for(size_bytes) as usize];
                for run in decode_runs(&mut d, snapshot_chunks.len() as u32)? {
                    for step in 0..run.len {
                        snapshot_chunks[(run.logical + step) as usize] = run.physical + step;
                    }
                }
                let snapshot = Snapshot {
                    id,
                    size_bytes,
                    block_size,
                    chunks: snapshot_chunks,
                    extents: ExtentMap::new(),
                };
                state.add_snapshot(&name, &snapshot_name, snapshot)?;
            }
        }
        if !d.is_done() {
            for _ in 0..d.u32()? {
                let name = d.name()?;
                let key = WrappedKey(d.array::<WRAPPED_KEY_BYTES>()?);
                state.volume_mut(&name)?.key = Some(key);
            }
            state.scrub_owed = d.flag()?;
        }
        if !d.is_done() {
            state.decode_compression(&mut d)?;
        }
        if !d.is_done() {
            return Err(FormatError::Malformed("bytes after the compressed volumes").into());
        }
        state.settle_writable();
        Ok(state)
    }

    /// Maps chunks that may already be shared (checkpoint restore).
    fn restore_map(&mut self, volume: &str, runs: &[Run]) -> Result<(), Inconsistent> {
        let map = Arc::clone(&self.volume(volume)?.map);
        let mut mapped = 0;
        for run in runs {
            for step in 0..run.len {
                let chunk = run.physical + step;
                self.add_ref(chunk)?;
                map.set(
                    (run.logical + step) as usize,
                    Lookup::Mapped {
                        chunk,
                        writable: false,
                    },
                );
                mapped += 1;
            }
        }
        self.volume_mut(volume)?.mapped_chunks = mapped;
        Ok(())
    }

    /// Sets the writable bit exactly where a volume holds the only reference.
    pub fn settle_writable(&mut self) {
        for volume in self.volumes.values() {
            for index in 0..volume.map.len() {
                if let Lookup::Mapped { chunk, .. } = volume.map.lookup(index) {
                    let writable = self.refcounts[chunk as usize] == 1;
                    volume.map.set(index, Lookup::Mapped { chunk, writable });
                }
            }
        }
    }
}

/// Why a checkpoint could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CheckpointError {
    /// Undecodable bytes.
    #[error("{0}")]
    Format(#[from] FormatError),
    /// Decodable but impossible content.
    #[error("{0}")]
    Inconsistent(#[from] Inconsistent),
}

fn encode_runs(e: &mut Encoder, chunks: &[u32]) {
    let runs = runs_of(chunks);
    e.u32(runs.len() as u32);
    for run in runs {
        e.u32(run.logical);
        e.u32(run.physical);
        e.u32(run.len);
    }
}

/// Runs of a chunk list: consecutive logical chunks on consecutive physical ones.
pub fn runs_of(chunks: &[u32]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (logical, &physical) in chunks.iter().enumerate() {
        if physical == NO_CHUNK {
            continue;
        }
        let logical = logical as u32;
        match runs.last_mut() {
            Some(run)
                if run.logical + run.len == logical
                    && run.physical.checked_add(run.len) == Some(physical) =>
            {
                run.len += 1
            }
            _ => runs.push(Run {
                logical,
                physical,
                len: 1,
            }),
        }
    }
    runs
}

fn decode_runs(d: &mut Decoder<'_>, logical_len: u32) -> Result<Vec<Run>, FormatError> {
    let count = d.u32()?;
    let mut runs = Vec::new();
    for _ in 0..count {
        let run = Run {
            logical: d.u32()?,
            physical: d.u32()?,
            len: d.u32()?,
        };
        let fits = run
            .logical
            .checked_add(run.len)
            .is_some_and(|end| end <= logical_len)
            && run.physical.checked_add(run.len).is_some();
        if !fits {
            return Err(FormatError::Malformed("run beyond its volume"));
        }
        runs.push(run);
    }
    Ok(runs)
}

impl Record {
    /// Appends the record's encoding.
    pub fn encode(&self, e: &mut Encoder) {
        match self {
            Record::CreateVolume {
                id,
                name,
                size_bytes,
                block_size,
                thick,
                runs,
                key,
            } => {
                // Type 11 is type 1 with the key last: a pool without
                // encrypted volumes stays readable by older builds.
                e.u8(if key.is_some() { 11 } else { 1 });
                e.bytes(id);
                e.name(name);
                e.u64(*size_bytes);
                e.u32(*block_size);
                e.u8(u8::from(*thick));
                encode_run_list(e, runs);
                if let Some(key) = key {
                    e.bytes(&key.0);
                }
            }
            Record::DeleteVolume { name } => {
                e.u8(2);
                e.name(name);
            }
            Record::ResizeVolume {
                name,
                size_bytes,
                runs,
            } => {
                e.u8(3);
                e.name(name);
                e.u64(*size_bytes);
                encode_run_list(e, runs);
            }
            Record::CreateSnapshot { volume, name, id } => {
                e.u8(4);
                e.name(volume);
                e.name(name);
                e.bytes(id);
            }
            Record::DeleteSnapshot { volume, name } => {
                e.u8(5);
                e.name(volume);
                e.name(name);
            }
            Record::CloneVolume { id, name, origin } => {
                e.u8(6);
                e.bytes(id);
                e.name(name);
                e.name(&origin.volume);
                e.name(&origin.snapshot);
            }
            Record::Map { volume, runs } => {
                e.u8(7);
                e.name(volume);
                encode_run_list(e, runs);
            }
            Record::Unmap {
                volume,
                first,
                count,
            } => {
                e.u8(8);
                e.name(volume);
                e.u32(*first);
                e.u32(*count);
            }
            Record::Flattened { volume } => {
                e.u8(9);
                e.name(volume);
            }
            Record::SetVolumeKey { volume, key } => {
                e.u8(10);
                e.name(volume);
                e.bytes(&key.0);
            }
            Record::SetCompression {
                volume,
                compression,
            } => {
                e.u8(12);
                e.name(volume);
                e.u8(compression.code());
            }
            Record::SetExtents { volume, extents } => {
                e.u8(13);
                e.name(volume);
                compressed::encode_set_extents(e, extents);
            }
            Record::MoveExtents { from, moves } => {
                e.u8(14);
                e.u32(*from);
                compressed::encode_moves(e, moves);
            }
        }
    }

    /// Decodes one record.
    pub fn decode(d: &mut Decoder<'_>) -> Result<Record, FormatError> {
        Ok(match d.u8()? {
            kind @ (1 | 11) => Record::CreateVolume {
                id: d.array()?,
                name: d.name()?,
                size_bytes: d.u64()?,
                block_size: d.u32()?,
                thick: d.flag()?,
                runs: decode_run_list(d)?,
                key: match kind {
                    11 => Some(WrappedKey(d.array()?)),
                    _ => None,
                },
            },
            2 => Record::DeleteVolume { name: d.name()? },
            3 => Record::ResizeVolume {
                name: d.name()?,
                size_bytes: d.u64()?,
                runs: decode_run_list(d)?,
            },
            4 => Record::CreateSnapshot {
                volume: d.name()?,
                name: d.name()?,
                id: d.array()?,
            },
            5 => Record::DeleteSnapshot {
                volume: d.name()?,
                name: d.name()?,
            },
            6 => Record::CloneVolume {
                id: d.array()?,
                name: d.name()?,
                origin: Origin {
                    volume: d.name()?,
                    snapshot: d.name()?,
                },
            },
            7 => Record::Map {
                volume: d.name()?,
                runs: decode_run_list(d)?,
            },
            8 => Record::Unmap {
                volume: d.name()?,
                first: d.u32()?,
                count: d.u32()?,
            },
            9 => Record::Flattened { volume: d.name()? },
            10 => Record::SetVolumeKey {
                volume: d.name()?,
                key: WrappedKey(d.array()?),
            },
            12 => Record::SetCompression {
                volume: d.name()?,
                compression: Compression::from_code(d.u8()?)
                    .ok_or(FormatError::Malformed("unknown compression"))?,
            },
            13 => Record::SetExtents {
                volume: d.name()?,
                extents: compressed::decode_set_extents(d)?,
            },
            14 => Record::MoveExtents {
                from: d.u32()?,
                moves: compressed::decode_moves(d)?,
            },
            _ => return Err(FormatError::Malformed("unknown record type")),
        })
    }
}

fn encode_run_list(e: &mut Encoder, runs: &[Run]) {
    e.u32(runs.len() as u32);
    for run in runs {
        e.u32(run.logical);
        e.u32(run.physical);
        e.u32(run.len);
    }
}

fn decode_run_list(d: &mut Decoder<'_>) -> Result<Vec<Run>, FormatError> {
    decode_runs(d, u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create(name: &str, size_bytes: u64) -> Record {
        Record::CreateVolume {
            id: [1; 16],
            name: name.into(),
            size_bytes,
            block_size: 4096,
            thick: false,
            runs: Vec::new(),
            key: None,
        }
    }

    fn map(volume: &str, logical: u32, physical: u32, len: u32) -> Record {
        Record::Map {
            volume: volume.into(),
            runs: vec![Run {
                logical,
                physical,
                len,
            }],
        }
    }

    #[test]
    fn snapshots_and_clones_share_chunks_by_reference() {
        let mut state = PoolState::new(16, 20);
        state.apply(&create("db1", 4 << 20)).unwrap();
        state.apply(&map("db1", 0, 0, 2)).unwrap();
        assert_eq!(state.allocated(), 2);
        let v = &state.volumes["db1"];
        assert_eq!(
            v.map.lookup(0),
            Lookup::Mapped {
                chunk: 0,
                writable: true
            }
        );
        state
            .apply(&Record::CreateSnapshot {
                volume: "db1".into(),
                name: "s1".into(),
                id: [2; 16],
            })
            .unwrap();
        assert_eq!(state.refcount(0), 2);
        assert_eq!(
            state.volumes["db1"].map.lookup(0),
            Lookup::Mapped {
                chunk: 0,
                writable: false
            },
            "shared: writes must copy"
        );
        state
            .apply(&Record::CloneVolume {
                id: [3; 16],
                name: "copy".into(),
                origin: Origin {
                    volume: "db1".into(),
                    snapshot: "s1".into(),
                },
            })
            .unwrap();
        assert_eq!(state.refcount(1), 3);
        // Copy on write of chunk 0 in db1 to chunk 5.
        state.apply(&map("db1", 0, 5, 1)).unwrap();
        assert_eq!(state.refcount(0), 2);
        state
            .apply(&Record::DeleteSnapshot {
                volume: "db1".into(),
                name: "s1".into(),
            })
            .unwrap();
        assert_eq!(state.refcount(0), 1, "the clone keeps it");
        assert!(state.claim_if_exclusive("db1", 1) || state.refcount(1) == 2);
        state
            .apply(&Record::DeleteVolume {
                name: "copy".into(),
            })
            .unwrap();
        assert_eq!(state.refcount(0), 0);
        assert_eq!(state.allocated(), 2, "db1 holds 5 and 1");
        assert!(state.claim_if_exclusive("db1", 1));
        state
            .apply(&Record::Unmap {
                volume: "db1".into(),
                first: 0,
                count: 4,
            })
            .unwrap();
        assert_eq!((state.allocated(), state.references()), (0, 0));
        assert_eq!(state.volumes["db1"].mapped_chunks, 0);
    }

    #[test]
    fn released_chunks_are_reused_only_after_commit() {
        let mut state = PoolState::new(2, 20);
        state.apply(&create("a", 2 << 20)).unwrap();
        let first = state.allocate().unwrap();
        assert_eq!(first, 0, "lowest first");
        state.apply(&map("a", 0, first, 1)).unwrap();
        state
            .apply(&Record::Unmap {
                volume: "a".into(),
                first: 0,
                count: 1,
            })
            .unwrap();
        assert_eq!(state.allocate(), Some(1));
        assert_eq!(state.allocate(), None, "chunk 0 waits for the commit");
        state.release_committed();
        assert_eq!(state.allocate(), Some(0));
    }

    #[test]
    fn impossible_records_are_refused() {
        let mut state = PoolState::new(4, 20);
        state.apply(&create("a", 1 << 20)).unwrap();
        assert!(state.apply(&create("a", 1 << 20)).is_err());
        assert!(
            state.apply(&map("a", 1, 0, 1)).is_err(),
            "beyond the volume"
        );
        assert!(state.apply(&map("a", 0, 9, 1)).is_err(), "beyond the pool");
        state.apply(&map("a", 0, 0, 1)).unwrap();
        state.apply(&create("b", 1 << 20)).unwrap();
        assert!(state.apply(&map("b", 0, 0, 1)).is_err(), "chunk in use");
        assert!(state
            .apply(&Record::DeleteVolume { name: "x".into() })
            .is_err());
    }

    #[test]
    fn checkpoint_round_trips_state_and_records_round_trip() {
        let mut state = PoolState::new(64, 20);
        let records = vec![
            create("db1", 8 << 20),
            map("db1", 0, 0, 3),
            map("db1", 6, 10, 1),
            Record::CreateSnapshot {
                volume: "db1".into(),
                name: "s1".into(),
                id: [9; 16],
            },
            Record::CloneVolume {
                id: [3; 16],
                name: "copy".into(),
                origin: Origin {
                    volume: "db1".into(),
                    snapshot: "s1".into(),
                },
            },
            map("copy", 1, 20, 1),
            Record::ResizeVolume {
                name: "db1".into(),
                size_bytes: 12 << 20,
                runs: vec![Run {
                    logical: 11,
                    physical: 30,
                    len: 1,
                }],
            },
            Record::Unmap {
                volume: "db1".into(),
                first: 2,
                count: 1,
            },
            Record::Flattened {
                volume: "copy".into(),
            },
        ];
        for record in &records {
            let mut e = Encoder::new();
            record.encode(&mut e);
            let bytes = e.into_bytes();
            let mut d = Decoder::new(&bytes);
            assert_eq!(&Record::decode(&mut d).unwrap(), record);
            assert!(d.is_done());
            state.apply(record).unwrap();
        }
        let bytes = state.encode();
        assert!(bytes.len() as u64 <= state.encoded_len_bound());
        let restored = PoolState::decode(&bytes, 64, 20).unwrap();
        assert_eq!(restored.encode(), bytes);
        assert_eq!(restored.refcount(0), 3, "db1, s1 and copy");
        assert_eq!(restored.allocated(), state.allocated());
        assert_eq!(
            restored.volumes["db1"].map.lookup(11),
            Lookup::Mapped {
                chunk: 30,
                writable: true
            }
        );
        assert_eq!(
            restored.volumes["db1"].map.lookup(0),
            Lookup::Mapped {
                chunk: 0,
                writable: false
            }
        );
        assert_eq!(
            PoolState::decode(&bytes[..bytes.len() - 1], 64, 20).unwrap_err(),
            CheckpointError::Format(FormatError::Truncated)
        );
        assert!(
            PoolState::decode(&bytes, 8, 20).is_err(),
            "chunks beyond a smaller pool"
        );
    }

    #[test]
    fn runs_group_consecutive_chunks() {
        assert_eq!(
            runs_of(&[4, 5, NO_CHUNK, 7, 9]),
            vec![
                Run {
                    logical: 0,
                    physical: 4,
                    len: 2
                },
                Run {
                    logical: 3,
                    physical: 7,
                    len: 1
                },
                Run {
                    logical: 4,
                    physical: 9,
                    len: 1
                },
            ]
        );
    }
}
