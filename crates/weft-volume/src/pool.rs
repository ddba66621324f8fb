//! A pool: chunks striped over member devices, the volumes carved from them,
//! and the journal that makes every metadata change crash-atomic.
//!
//! Every change is applied to the in-memory state and staged as a record;
//! `commit` makes staged records durable (data syncs first, for chunks that
//! were copied or zeroed, then the journal write and its sync). Admin
//! operations commit before they return; `prepare_write` leaves the commit to
//! the caller so that the manager can group the allocations of many writes
//! into one journal write. A chunk released by a staged record is not reused
//! until that record is durable, and a fresh chunk is zeroed before a record
//! maps it, so a crash at any point opens to the last committed state with
//! no volume seeing another's data.
//!
//! If a metadata write fails the pool stops accepting changes (memory may be
//! ahead of the disk); reopening recovers the last committed state.

use crate::codec::{Decoder, Encoder};
use crate::compression::Compression;
use crate::crypt::{Keyring, VolumeCipher};
use crate::format::{
    Extension, FormatError, Frame, Layout, Superblock, CHECKPOINT_MAGIC, MEMBERS_MAX, META_BLOCK,
    RECORD_MAGIC, SUPERBLOCK_BYTES,
};
use crate::map::{ChunkMap, Lookup};
use crate::media::Media;
use crate::state::{runs_of, Origin, PoolState, Record, Run, Volume, NO_CHUNK};
use crate::{check_name, VolumeError, SNAPSHOTS_PER_VOLUME_MAX, VOLUMES_MAX, VOLUME_CHUNKS_MAX};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

mod checkpoints;
mod compressed;
mod encryption;
mod tier;
mod tier_room;
use checkpoints::{read_checkpoint, write_checkpoint_frame, write_zeroes};
pub use compressed::CompressionUsage;
pub use encryption::{Encryption, Rewrapped};
pub use tier::{GroupWrite, TierInfo};

/// Largest payload of one journal record; bigger commits span several.
const RECORD_PAYLOAD_MAX: usize = 256 * 1024;
/// Fixed bytes a checkpoint needs per volume or snapshot (see `encoded_len_bound`).
const OBJECT_BYTES: u64 = 300;

/// What `weft pool create` chooses.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Pool name.
    pub name: String,
    /// Allocation unit in bytes: a power of two from 64 KiB to 1 GiB.
    pub chunk_bytes: u32,
    /// Random identity.
    pub uuid: [u8; 16],
}

/// A volume to create.
#[derive(Debug, Clone)]
pub struct VolumeSpec {
    /// Name.
    pub name: String,
    /// Size in bytes (a multiple of the block size).
    pub size_bytes: u64,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// Preallocate every chunk now.
    pub thick: bool,
    /// Encrypt it at rest (needs the node's keyring, see [`Pool::unlock`]).
    pub encrypted: bool,
    /// Compress its writes (a thin volume only).
    pub compression: Compression,
}

/// Capacity and usage of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInfo {
    /// Name.
    pub name: String,
    /// Identity.
    pub uuid: [u8; 16],
    /// Allocation unit.
    pub chunk_bytes: u32,
    /// Member devices.
    pub members: u16,
    /// Bytes of data chunks.
    pub capacity_bytes: u64,
    /// Bytes of chunks in use.
    pub allocated_bytes: u64,
    /// Sum of volume sizes (thin volumes may promise more than the capacity).
    pub provisioned_bytes: u64,
    /// Volumes (clones included).
    pub volumes: usize,
    /// Snapshots.
    pub snapshots: usize,
    /// What its compressed volumes' units would take uncompressed.
    pub compressed_logical_bytes: u64,
    /// What they take compressed.
    pub compressed_stored_bytes: u64,
    /// Bytes of the allocation units holding them (with the space the
    /// cleaner has yet to reclaim).
    pub segment_bytes: u64,
}

/// One member device's share of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberUsage {
    /// Device size in bytes.
    pub size_bytes: u64,
    /// Bytes of data chunks on it.
    pub capacity_bytes: u64,
    /// Bytes of its chunks in use.
    pub allocated_bytes: u64,
    /// Whether it holds a copy of the pool's checkpoints and journal.
    pub metadata_copy: bool,
}

/// One volume as `weft volume show` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Name.
    pub name: String,
    /// Identity.
    pub id: [u8; 16],
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Preallocated.
    pub thick: bool,
    /// Bytes of chunks the volume maps (shared ones included).
    pub allocated_bytes: u64,
    /// Clone source, until flattened.
    pub origin: Option<Origin>,
    /// Snapshots, by name: (name, id, size in bytes).
    pub snapshots: Vec<(String, [u8; 16], u64)>,
    /// Encryption at rest, if any.
    pub encryption: Option<Encryption>,
    /// Compression, if any, and what it saves.
    pub compression: Option<CompressionUsage>,
}

/// A pool opened on its media.
#[derive(Debug)]
pub struct Pool<M: Media> {
    media: M,
    superblock: Superblock,
    state: PoolState,
    /// Sequence number of the last durable record (or of the checkpoint).
    sequence: u64,
    /// Bytes of the journal used since the last checkpoint.
    journal_used: u64,
    checkpoint_slot: usize,
    pending: Vec<Record>,
    /// Chunks were copied or zeroed since the last data sync.
    data_dirty: bool,
    failed: Option<String>,
    warned_percent: u64,
    /// The node's KEKs (none: encrypted volumes stay locked).
    keyring: Option<Arc<Keyring>>,
    /// Ciphers of the unlocked encrypted volumes, by volume id.
    ciphers: BTreeMap<[u8; 16], Arc<VolumeCipher>>,
    /// The write tier, if the pool has one (see `tier`).
    tier: Option<tier::PoolTier<M>>,
    /// Its device while its log is not open (a reload's open failed).
    unopened_tier: Option<tier::UnopenedTier<M>>,
    /// Which regions of the volumes have blocks in the tier: kept across
    /// the tier's opens (the data plane holds it).
    tier_presence: Option<Arc<crate::tier::TierPresence>>,
    /// Sectors of the open segment used (compressed volumes' extents).
    segment_fill: u32,
    /// Units of compressed volumes written to the write tier since it was
    /// last empty: each may take a whole unit of segment room when it is
    /// destaged, which is kept free for it (see `compressed`).
    tier_pending_units: u64,
    /// Of those, the units of the group of writes being written (not in
    /// the tier yet: a destage that empties it leaves them counted).
    tier_units_in_group: u64,
    /// Blocks of compressed volumes the destage round under way took from
    /// the tier, by volume and unit: (offset in the unit, plain bytes), in
    /// the order taken; placed when the round syncs.
    destaging: compressed::Destaging,
}

impl<M: Media> Pool<M> {
    /// The superblock of each member, where one is readable (to refuse to
    /// overwrite a device that belongs to a pool).
    pub fn probe(media: &mut M) -> Vec<Option<Superblock>> {
        (0..media.members())
            .map(|member| read_superblock(media, member).ok())
            .collect()
    }

    /// Formats `media` as a new, empty pool.
    pub fn create(media: M, options: PoolOptions) -> Result<Pool<M>, VolumeError> {
        Pool::create_planned(media, options, Layout::plan)
    }

    /// As [`Pool::create`], with checkpoint slots of `checkpoint_bytes` (a
    /// multiple of 4 KiB): small slots make checkpoints outgrow them early.
    #[cfg(any(test, feature = "testing"))]
    pub fn create_with_checkpoints(
        media: M,
        options: PoolOptions,
        checkpoint_bytes: u64,
    ) -> Result<Pool<M>, VolumeError> {
        Pool::create_planned(media, options, |members, bytes, chunk| {
            Layout::plan_with_checkpoints(members, bytes, chunk, checkpoint_bytes)
        })
    }

    fn create_planned(
        mut media: M,
        options: PoolOptions,
        plan: impl Fn(u16, u64, u32) -> Result<Layout, String>,
    ) -> Result<Pool<M>, VolumeError> {
        check_name("pool", &options.name)?;
        if !options.chunk_bytes.is_power_of_two()
            || !(64 << 10..=1 << 30).contains(&options.chunk_bytes)
        {
            return Err(VolumeError::invalid(
                format!("allocation unit {}", options.chunk_bytes),
                "use a power of two from 64KiB to 1GiB, e.g. 1MiB",
            ));
        }
        let members = media.members();
        let members_u16 = u16::try_from(members)
            .ok()
            .filter(|&m| (1..=64).contains(&m))
            .ok_or_else(|| VolumeError::invalid("device list", "give 1 to 64 devices"))?;
        let smallest = (0..members).map(|m| media.size_bytes(m)).min().unwrap_or(0);
        let layout = plan(members_u16, smallest, options.chunk_bytes)
            .map_err(|reason| VolumeError::invalid("devices", reason))?;
        let superblock = Superblock {
            pool_uuid: options.uuid,
            pool_name: options.name.clone(),
            member: 0,
            generation: 0,
            layout,
            extension: Extension::default(),
            tier: None,
        };
        let state = PoolState::new(layout.chunks(), layout.chunk_shift());
        let io = |context: &str| {
            let context = format!("creating pool {}: {context}", options.name);
            move |source| VolumeError::Io { context, source }
        };
        // Metadata first, superblocks last: a pool whose creation was cut
        // short has no superblock and does not open.
        let checkpoint = Frame {
            sequence: 0,
            payload: state.encode(),
        }
        .encode(CHECKPOINT_MAGIC, &options.uuid);
        let empty = vec![0u8; META_BLOCK];
        for member in 0..layout.metadata_copies() {
            media
                .write_at(member, layout.checkpoint_offset(0), &checkpoint)
                .map_err(io("checkpoint"))?;
            media
                .write_at(member, layout.checkpoint_offset(1), &empty)
                .map_err(io("checkpoint"))?;
            media
                .write_at(member, layout.journal_offset(), &empty)
                .map_err(io("journal"))?;
            media.sync(member).map_err(io("sync"))?;
        }
        for member in 0..members {
            let block = Superblock {
                member: member as u16,
                ..superblock.clone()
            }
            .encode();
            media
                .write_at(member, 0, &block)
                .map_err(io("superblock"))?;
            media
                .write_at(member, SUPERBLOCK_BYTES as u64, &block)
                .map_err(io("superblock"))?;
            media.sync(member).map_err(io("sync"))?;
        }
        Ok(Pool {
            media,
            superblock,
            state,
            sequence: 0,
            journal_used: 0,
            checkpoint_slot: 0,
            pending: Vec::new(),
            data_dirty: false,
            failed: None,
            warned_percent: 0,
            keyring: None,
            ciphers: BTreeMap::new(),
            tier: None,
            unopened_tier: None,
            tier_presence: None,
            segment_fill: 0,
            tier_pending_units: 0,
            tier_units_in_group: 0,
            destaging: BTreeMap::new(),
        })
    }

    /// Opens the pool on `media` (members in stripe order) at its last
    /// committed state. A pool with a write tier needs
    /// [`Pool::open_with_tier`].
    pub fn open(media: M) -> Result<Pool<M>, VolumeError> {
        Pool::open_with_tier(media, None)
    }

    /// As [`Pool::open`], with the device of the pool's write tier (the
    /// first member of `tier`), whose rings are replayed.
    pub fn open_with_tier(mut media: M, tier: Option<M>) -> Result<Pool<M>, VolumeError> {
        let loaded = load(&mut media)?;
        let resync = loaded.resync.clone();
        let mut pool = Pool {
            media,
            superblock: loaded.superblock,
            state: loaded.state,
            sequence: loaded.sequence,
            journal_used: loaded.journal_used,
            checkpoint_slot: loaded.checkpoint_slot,
            pending: Vec::new(),
            data_dirty: false,
            failed: None,
            warned_percent: 0,
            keyring: None,
            ciphers: BTreeMap::new(),
            tier: None,
            unopened_tier: None,
            tier_presence: None,
            segment_fill: 0,
            tier_pending_units: 0,
            tier_units_in_group: 0,
            destaging: BTreeMap::new(),
        };
        pool.repair_superblocks(&loaded.superblock_repairs)?;
        pool.resync_copies(resync)?;
        pool.unlock_volumes();
        // A crash before a crypto-erase finished: finished now.
        pool.scrub_if_owed()?;
        pool.open_tier(tier)?;
        Ok(pool)
    }

    /// Rewrites the superblock copies of `members` with the committed one:
    /// copy A of each, synced, then copy B of each, synced, so that one of
    /// each member's copies is whole at any instant.
    fn repair_superblocks(&mut self, members: &[usize]) -> Result<(), VolumeError> {
        if members.is_empty() {
            return Ok(());
        }
        log::warn!(
            "pool {}: rewriting the superblocks of device(s) {:?} (generation {}: a growth was cut short or a copy is damaged)",
            self.name(),
            members.iter().map(|m| m + 1).collect::<Vec<_>>(),
            self.superblock.generation
        );
        let superblock = self.superblock.clone();
        write_superblocks(&mut self.media, &superblock, members).map_err(|source| VolumeError::Io {
            context: format!("pool {}: rewriting superblocks", self.name()),
            source,
        })
    }

    /// Adds `devices` to the pool as one new stripe group, online: their
    /// chunks are numbered after every existing one (nothing moves) and are
    /// free to allocate when this returns.
    ///
    /// Each device must hold at least the metadata region and one allocation
    /// unit, and must not be a member already or carry another pool's
    /// superblock. The pool keeps at most 64 devices and fewer than 2^32
    /// allocation units. The checkpoints grow into free units as the pool
    /// holds more (see `checkpoints`); a metadata copy a growth adds takes
    /// its share of them from its own device.
    ///
    /// Crash-atomic: the new devices' superblocks (and metadata copies, when
    /// the pool had fewer than three members) are written and synced first;
    /// the growth commits when the first old member's new superblock is
    /// durable. An error before that leaves the pool as it was (usable; the
    /// devices are closed again); an error after it fails the pool, and
    /// `reload` (clear-failure) opens whichever layout is committed.
    ///
    /// Every volume gets a new map (the old one is retired): a reactor that
    /// still holds the old layout must ask the manager rather than find a
    /// chunk of the new group in a map it would locate with the old layout.
    /// The caller publishes new exports (layout, member descriptors, maps)
    /// right after.
    pub fn add_members(&mut self, devices: Vec<M::Device>) -> Result<(), VolumeError> {
        self.check_usable()?;
        let old = *self.layout();
        if devices.is_empty() {
            return Err(VolumeError::invalid(
                "device list",
                "give 1 or more devices to add",
            ));
        }
        if usize::from(old.members) + devices.len() > MEMBERS_MAX {
            return Err(VolumeError::Limit(format!(
                "pool {} has {} devices and may have {MEMBERS_MAX} at most; {} more do not fit",
                self.name(),
                old.members,
                devices.len()
            )));
        }
        self.commit()?;
        let first_new = usize::from(old.members);
        // Devices a growth that did not commit left behind are not members.
        while self.media.members() > first_new {
            self.media.remove_last_member();
        }
        for device in devices {
            if let Err(error) = self.media.add_member(device) {
                let added = self.media.members() - first_new;
                self.detach_from(first_new);
                return Err(match error.kind() {
                    io::ErrorKind::AlreadyExists => {
                        VolumeError::invalid(format!("device {}", added + 1), error.to_string())
                    }
                    _ => VolumeError::Io {
                        context: format!(
                            "pool {}: opening device {} to add",
                            self.name(),
                            added + 1
                        ),
                        source: error,
                    },
                });
            }
        }
        let new = match self.plan_growth(first_new) {
            Ok(layout) => layout,
            Err(error) => {
                self.detach_from(first_new);
                return Err(error);
            }
        };
        let (extension, new_units) = match self.extension_for_growth(&new) {
            Ok(planned) => planned,
            Err(error) => {
                self.detach_from(first_new);
                return Err(error);
            }
        };
        let grown = Superblock {
            generation: self.superblock.generation + 1,
            layout: new,
            extension,
            ..self.superblock.clone()
        };
        if let Err(source) = self.prepare_new_members(&grown, first_new) {
            self.detach_from(first_new);
            return Err(VolumeError::Io {
                context: format!("pool {}: writing the new devices' metadata", self.name()),
                source,
            });
        }
        let old_members: Vec<usize> = (0..first_new).collect();
        if let Err(error) = write_superblocks(&mut self.media, &grown, &old_members) {
            let reason = format!("growth to {} devices in doubt: {error}", new.members);
            log::error!("pool {}: {reason}", self.name());
            self.failed = Some(reason);
            return Err(self.failed_error());
        }
        self.superblock = grown;
        self.state.grow(new.chunks());
        self.state
            .reserve(&new_units)
            .expect("a new device's units are free");
        self.state.renew_maps();
        if new.metadata_copies() > old.metadata_copies() {
            // The new copies hold a checkpoint of this state already; this
            // makes every copy identical (same slot, empty journal).
            if let Err(error) = self.write_checkpoint(false) {
                self.failed = Some(format!("writing the metadata copies after growth: {error}"));
                return Err(self.failed_error());
            }
        }
        log::info!(
            "pool {}: grew to {} devices, {} allocation units (generation {})",
            self.name(),
            new.members,
            new.chunks(),
            self.superblock.generation
        );
        self.warned_percent = 0;
        Ok(())
    }

    fn detach_from(&mut self, first_new: usize) {
        while self.media.members() > first_new {
            self.media.remove_last_member();
        }
    }

    /// Checks the devices attached from `first_new` on and plans the layout with them.
    fn plan_growth(&mut self, first_new: usize) -> Result<Layout, VolumeError> {
        let old = *self.layout();
        for member in first_new..self.media.members() {
            let device = member - first_new + 1;
            for copy in read_superblock_copies(&mut self.media, member)
                .into_iter()
                .flatten()
            {
                if copy.pool_uuid != self.superblock.pool_uuid {
                    return Err(VolumeError::invalid(
                        format!("device {device}"),
                        format!("it belongs to pool {}; delete that pool first, or erase the device's first 8 KiB if it is no longer used", copy.pool_name),
                    ));
                }
                if usize::from(copy.member) < first_new && copy.layout.is_prefix_of(&old) {
                    return Err(VolumeError::invalid(
                        format!("device {device}"),
                        format!(
                            "it is device {} of pool {} already",
                            copy.member + 1,
                            self.name()
                        ),
                    ));
                }
                log::info!(
                    "pool {}: device {device} was being added when a growth was cut short; adding it again",
                    self.name()
                );
            }
        }
        let smallest = (first_new..self.media.members())
            .map(|member| self.media.size_bytes(member))
            .min()
            .expect("devices were given");
        let added = (self.media.members() - first_new) as u16;
        old.grow(added, smallest, growth_tag(&self.superblock))
            .map_err(|reason| VolumeError::invalid("devices", reason))
    }

    /// Writes what the new members carry before the growth commits: a
    /// checkpoint of the current state where they become metadata copies,
    /// then both superblock copies; all synced.
    fn prepare_new_members(&mut self, grown: &Superblock, first_new: usize) -> io::Result<()> {
        let layout = grown.layout;
        let members = usize::from(layout.members);
        if first_new < layout.metadata_copies() {
            let checkpoint = Frame {
                sequence: self.sequence,
                payload: self.state.encode(),
            }
            .encode(CHECKPOINT_MAGIC, &grown.pool_uuid);
            let empty = vec![0u8; META_BLOCK];
            let slot = 1 - self.checkpoint_slot;
            for member in first_new..layout.metadata_copies() {
                write_checkpoint_frame(&mut self.media, grown, member, slot, &checkpoint, false)?;
                self.media
                    .write_at(member, layout.checkpoint_offset(1 - slot), &empty)?;
                self.media
                    .write_at(member, layout.journal_offset(), &empty)?;
            }
        }
        for member in first_new..members {
            let block = Superblock {
                member: member as u16,
                ..grown.clone()
            }
            .encode();
            self.media.write_at(member, 0, &block)?;
            self.media
                .write_at(member, SUPERBLOCK_BYTES as u64, &block)?;
        }
        for member in first_new..members {
            self.media.sync(member)?;
        }
        Ok(())
    }

    /// Rewrites every metadata copy from the state just loaded when the copies
    /// disagreed (one missing, damaged or behind): a checkpoint of that state
    /// on each, so that they are identical again.
    fn resync_copies(&mut self, resync: Option<String>) -> Result<(), VolumeError> {
        let Some(reason) = resync else {
            return Ok(());
        };
        log::warn!(
            "pool {}: metadata copies differ ({reason}); rewriting every copy from the newest (record {})",
            self.name(),
            self.sequence
        );
        // Numbered past every checkpoint on any copy: a copy behind may have
        // its newest in the other slot, and a tie would leave the copies
        // picking different slots (and disagreeing at every open).
        self.sequence += 1;
        self.write_checkpoint(false)
            .map_err(|source| VolumeError::Io {
                context: format!("pool {}: rewriting its metadata copies", self.name()),
                source,
            })
    }

    /// Reads the pool again from its media, at its last committed state, and
    /// accepts changes again: an operator's way out of a failure (the media
    /// may be fine again, e.g. a path to a device came back). Volumes get new
    /// maps and gates; the caller retires the old maps first. On error the
    /// pool stays as it was (failed).
    pub fn reload(&mut self) -> Result<(), VolumeError> {
        let loaded = load(&mut self.media)?;
        let resync = loaded.resync.clone();
        if loaded.superblock.pool_uuid != self.superblock.pool_uuid {
            return Err(VolumeError::Corrupt(format!(
                "pool {}: its devices now hold another pool ({})",
                self.name(),
                loaded.superblock.pool_name
            )));
        }
        self.superblock = loaded.superblock.clone();
        self.state = loaded.state;
        self.sequence = loaded.sequence;
        self.journal_used = loaded.journal_used;
        self.checkpoint_slot = loaded.checkpoint_slot;
        self.pending.clear();
        self.data_dirty = false;
        self.failed = None;
        self.unlock_volumes();
        self.repair_superblocks(&loaded.superblock_repairs)?;
        self.resync_copies(resync)?;
        self.scrub_if_owed()?;
        if let Err(error) = self.reopen_tier() {
            // Its writes may be in the tier alone: nothing is served
            // without it (the device is kept for the next try).
            self.failed = Some(format!("its write tier did not open: {error}"));
            return Err(error);
        }
        Ok(())
    }

    /// Pool name.
    pub fn name(&self) -> &str {
        &self.superblock.pool_name
    }

    /// Region sizes and stripe geometry.
    pub fn layout(&self) -> &Layout {
        &self.superblock.layout
    }

    /// The media.
    pub fn media(&self) -> &M {
        &self.media
    }

    /// The media, to change (e.g. to inject failures in tests).
    pub fn media_mut(&mut self) -> &mut M {
        &mut self.media
    }

    /// Gives the media back (e.g. to simulate a crash in tests).
    pub fn into_media(self) -> M {
        self.media
    }

    /// Gives the media back, and the write tier's if the pool has one.
    pub fn into_media_and_tier(self) -> (M, Option<M>) {
        (self.media, self.tier.map(|tier| tier.media))
    }

    /// Each member's size, capacity and allocation, in stripe order.
    pub fn member_usage(&self) -> Vec<MemberUsage> {
        let layout = *self.layout();
        let chunk_bytes = u64::from(layout.chunk_bytes);
        let mut usage: Vec<MemberUsage> = (0..self.media.members())
            .map(|member| MemberUsage {
                size_bytes: self.media.size_bytes(member),
                capacity_bytes: 0,
                allocated_bytes: 0,
                metadata_copy: member < layout.metadata_copies(),
            })
            .collect();
        for chunk in 0..layout.chunks() {
            let member = &mut usage[layout.locate(chunk).0];
            member.capacity_bytes += chunk_bytes;
            if self.state.refcount(chunk) > 0 {
                member.allocated_bytes += chunk_bytes;
            }
        }
        usage
    }

    /// Erases the superblocks of a pool that holds no volume, so that its
    /// devices can be used again (for a new pool without --force). The pool
    /// is gone afterwards; its data chunks are not overwritten.
    pub fn erase(mut self) -> Result<M, VolumeError> {
        if let Some(volume) = self.state.volumes.keys().next() {
            return Err(VolumeError::invalid(
                format!("deleting pool {}", self.name()),
                format!("it holds volume {volume}"),
            ));
        }
        let empty = vec![0u8; 2 * SUPERBLOCK_BYTES];
        self.erase_tier()?;
        for member in 0..self.media.members() {
            self.media
                .write_at(member, 0, &empty)
                .and_then(|()| self.media.sync(member))
                .map_err(|source| VolumeError::Io {
                    context: format!("erasing pool {} from device {}", self.name(), member + 1),
                    source,
                })?;
        }
        Ok(self.media)
    }

    /// A volume's state (its map and gate are what the data plane uses).
    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.state.volumes.get(name)
    }

    /// Every volume, by name.
    pub fn volumes(&self) -> impl Iterator<Item = &Volume> {
        self.state.volumes.values()
    }

    /// Capacity and usage.
    pub fn info(&self) -> PoolInfo {
        let chunk = u64::from(self.layout().chunk_bytes);
        let usages: Vec<_> = self
            .volumes()
            .filter_map(|v| self.compression_usage(&v.name))
            .collect();
        PoolInfo {
            name: self.name().to_string(),
            uuid: self.superblock.pool_uuid,
            chunk_bytes: self.layout().chunk_bytes,
            members: self.layout().members,
            capacity_bytes: u64::from(self.state.chunks()) * chunk,
            allocated_bytes: u64::from(self.state.allocated()) * chunk,
            provisioned_bytes: self.volumes().map(|v| v.size_bytes).sum(),
            volumes: self.state.volumes.len(),
            snapshots: self.volumes().map(|v| v.snapshots.len()).sum(),
            compressed_logical_bytes: usages.iter().map(|u| u.logical_bytes).sum(),
            compressed_stored_bytes: usages.iter().map(|u| u.stored_bytes).sum(),
            segment_bytes: self.segment_bytes(),
        }
    }

    /// One volume's description.
    pub fn volume_info(&self, name: &str) -> Result<VolumeInfo, VolumeError> {
        let volume = self.existing(name)?;
        Ok(VolumeInfo {
            name: volume.name.clone(),
            id: volume.id,
            size_bytes: volume.size_bytes,
            block_size: volume.block_size,
            thick: volume.thick,
            allocated_bytes: u64::from(volume.mapped_chunks) << self.layout().chunk_shift(),
            origin: volume.origin.clone(),
            snapshots: volume
                .snapshots
                .iter()
                .map(|(name, s)| (name.clone(), s.id, s.size_bytes))
                .collect(),
            encryption: self.encryption(name),
            compression: self.compression_usage(name),
        })
    }

    /// Bytes a checkpoint may take now: its slot, sized at creation, and
    /// the allocation units the slots grew into since.
    pub fn checkpoint_room(&self) -> u64 {
        self.superblock.checkpoint_room()
    }

    /// Bytes a checkpoint of the pool's state takes now (the crash tests
    /// check that checkpoints reach into their extensions).
    #[cfg(any(test, feature = "testing"))]
    pub fn checkpoint_bytes(&self) -> usize {
        Frame::encoded_len(self.state.encode().len())
    }

    /// Why the pool stopped accepting changes, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Creates a volume (thin, or thick with every chunk allocated and zeroed).
    pub fn create_volume(&mut self, spec: &VolumeSpec) -> Result<(), VolumeError> {
        self.check_usable()?;
        check_name("volume", &spec.name)?;
        self.check_new_volume(&spec.name)?;
        self.check_geometry(spec.size_bytes, spec.block_size)?;
        if spec.compression != Compression::None {
            check_compressed_size(&spec.name, spec.size_bytes)?;
        }
        if spec.thick && spec.compression != Compression::None {
            return Err(VolumeError::invalid(
                format!("a thick volume compressed with {}", spec.compression),
                "a compressed volume is thin (its units take what they compress to): drop --thick or the compression",
            ));
        }
        // The key first: nothing is staged when it cannot be made.
        let key = match spec.encrypted {
            true => Some(self.new_volume_key(&spec.name, spec.block_size)?),
            false => None,
        };
        let chunks = self.state.chunks_for(spec.size_bytes);
        let runs = if spec.thick {
            self.check_references(u64::from(chunks) + 1)?;
            self.allocate_zeroed(0, chunks)?
        } else {
            self.check_references(1)?;
            Vec::new()
        };
        let record = Record::CreateVolume {
            id: self.next_id(),
            name: spec.name.clone(),
            size_bytes: spec.size_bytes,
            block_size: spec.block_size,
            thick: spec.thick,
            runs,
            key: key.as_ref().map(|(wrapped, _)| wrapped.clone()),
        };
        self.stage(record);
        if spec.compression != Compression::None {
            self.stage(Record::SetCompression {
                volume: spec.name.clone(),
                compression: spec.compression,
            });
        }
        self.commit()?;
        self.keep_cipher(&spec.name, key.map(|(_, cipher)| cipher));
        Ok(())
    }

    /// Whether `delete_volume` would accept `name` (it exists and has no snapshots).
    pub fn check_deletable(&self, name: &str) -> Result<(), VolumeError> {
        let volume = self.existing(name)?;
        if volume.snapshots.is_empty() {
            return Ok(());
        }
        Err(VolumeError::HasSnapshots {
            volume: name.to_string(),
            snapshots: volume
                .snapshots
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// Deletes a volume that has no snapshots, releasing its chunks.
    ///
    /// A reactor may still hold the volume's map (exports updates reach
    /// reactors asynchronously). Its chunks may be given to another volume
    /// once the delete is durable, so the map is retired before the I/O in
    /// flight drains: every I/O that passes the gate afterwards sees the map
    /// retired and asks the manager, which no longer knows the volume.
    pub fn delete_volume(&mut self, name: &str) -> Result<(), VolumeError> {
        self.check_usable()?;
        self.check_deletable(name)?;
        self.settle_tier()?;
        let volume = self.existing(name)?;
        let (map, gate, id) = (Arc::clone(&volume.map), Arc::clone(&volume.gate), volume.id);
        map.retire();
        let _quiet = gate.quiesce();
        self.stage(Record::DeleteVolume {
            name: name.to_string(),
        });
        self.commit()?;
        self.ciphers.remove(&id);
        self.scrub_if_owed()
    }

    /// Grows a volume to `size_bytes` (shrinking is refused: it would drop data).
    pub fn resize_volume(&mut self, name: &str, size_bytes: u64) -> Result<(), VolumeError> {
        self.check_usable()?;
        let volume = self.existing(name)?;
        let (current, block_size, thick) = (volume.size_bytes, volume.block_size, volume.thick);
        if size_bytes < current {
            return Err(VolumeError::invalid(
                format!("size {size_bytes} for volume {name}"),
                format!("volumes only grow (it is {current} bytes); shrinking would drop data — clone into a smaller volume instead"),
            ));
        }
        self.check_geometry(size_bytes, block_size)?;
        if self.is_compressed(name) {
            check_compressed_size(name, size_bytes)?;
        }
        let old_chunks = self.state.chunks_for(current);
        let new_chunks = self.state.chunks_for(size_bytes);
        let runs = if thick && new_chunks > old_chunks {
            self.check_references(u64::from(new_chunks - old_chunks))?;
            self.allocate_zeroed(old_chunks, new_chunks - old_chunks)?
        } else {
            Vec::new()
        };
        self.stage(Record::ResizeVolume {
            name: name.to_string(),
            size_bytes,
            runs,
        });
        self.commit()
    }

    /// Takes a snapshot: waits for the volume's in-flight I/O, then shares
    /// every chunk with the snapshot (later writes copy).
    pub fn create_snapshot(&mut self, volume: &str, name: &str) -> Result<(), VolumeError> {
        self.check_usable()?;
        check_name("snapshot", name)?;
        let v = self.existing(volume)?;
        if v.snapshots.contains_key(name) {
            return Err(VolumeError::Exists {
                kind: "snapshot",
                name: format!("{volume}@{name}"),
            });
        }
        if v.snapshots.len() >= SNAPSHOTS_PER_VOLUME_MAX {
            return Err(VolumeError::Limit(format!(
                "volume {volume} has {SNAPSHOTS_PER_VOLUME_MAX} snapshots, the most a volume may have; delete one first"
            )));
        }
        // The snapshot shares the capacity devices' chunks (or a compressed
        // volume's extents): what the tier holds goes there first, and is
        // among what it shares.
        self.settle_tier()?;
        let v = self.existing(volume)?;
        let references = u64::from(v.mapped_chunks) + 2 * v.extents.len() as u64;
        let gate = Arc::clone(&v.gate);
        self.check_references(references + 1)?;
        let _quiet = gate.quiesce();
        let record = Record::CreateSnapshot {
            volume: volume.to_string(),
            name: name.to_string(),
            id: self.next_id(),
        };
        self.stage(record);
        self.commit()
    }

    /// Deletes a snapshot (clones made from it keep their data).
    pub fn delete_snapshot(&mut self, volume: &str, name: &str) -> Result<(), VolumeError> {
        self.check_usable()?;
        self.existing_snapshot(volume, name)?;
        self.stage(Record::DeleteSnapshot {
            volume: volume.to_string(),
            name: name.to_string(),
        });
        self.commit()
    }

    /// A writable volume `name` sharing every chunk of `volume@snapshot`.
    pub fn clone_volume(
        &mut self,
        volume: &str,
        snapshot: &str,
        name: &str,
    ) -> Result<(), VolumeError> {
        self.check_usable()?;
        check_name("volume", name)?;
        self.check_new_volume(name)?;
        let source = self.existing_snapshot(volume, snapshot)?;
        let shared =
            source.chunks.iter().filter(|&&c| c != NO_CHUNK).count() + 2 * source.extents.len();
        self.check_references(shared as u64 + 1)?;
        let record = Record::CloneVolume {
            id: self.next_id(),
            name: name.to_string(),
            origin: Origin {
                volume: volume.to_string(),
                snapshot: snapshot.to_string(),
            },
        };
        self.stage(record);
        self.commit()?;
        let cipher = self.cipher(volume).ok().flatten();
        self.keep_cipher(name, cipher);
        Ok(())
    }

    /// Copies up to `max_chunks` chunks that `name` shares, from logical chunk
    /// `from`; returns where to continue, or None once the volume shares
    /// nothing (then its origin is cleared).
    pub fn flatten_step(
        &mut self,
        name: &str,
        from: usize,
        max_chunks: usize,
    ) -> Result<Option<usize>, VolumeError> {
        self.check_usable()?;
        let map = Arc::clone(&self.existing(name)?.map);
        let mut copied = 0;
        let mut index = from;
        while index < map.len() && copied < max_chunks {
            if let Lookup::Mapped {
                chunk,
                writable: false,
            } = map.lookup(index)
            {
                if !self.state.claim_if_exclusive(name, index) {
                    let fresh = self.take_chunks(1)?[0];
                    self.copy_chunk(chunk, fresh).inspect_err(|_| {
                        self.state.unallocate(fresh);
                    })?;
                    self.stage(Record::Map {
                        volume: name.to_string(),
                        runs: vec![Run {
                            logical: index as u32,
                            physical: fresh,
                            len: 1,
                        }],
                    });
                    copied += 1;
                }
            }
            index += 1;
        }
        if index < map.len() {
            self.commit()?;
            return Ok(Some(index));
        }
        if self.existing(name)?.origin.is_some() {
            self.stage(Record::Flattened {
                volume: name.to_string(),
            });
        }
        self.commit()?;
        Ok(None)
    }

    /// Flattens a clone in one go.
    pub fn flatten(&mut self, name: &str) -> Result<(), VolumeError> {
        let mut from = 0;
        while let Some(next) = self.flatten_step(name, from, 64)? {
            from = next;
        }
        Ok(())
    }

    /// Makes every chunk under `[offset, offset + len)` of `name` mapped and
    /// writable: allocates (zeroed) chunks for unwritten ranges and copies
    /// shared ones. Staged only: `commit` before writing data there.
    /// Fails whole, allocating nothing, when the pool has too few free chunks.
    pub fn prepare_write(&mut self, name: &str, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.check_usable()?;
        let volume = self.existing(name)?;
        check_range(volume, offset, len)?;
        if volume.compression != Compression::None {
            return Err(VolumeError::invalid(
                format!("allocation units for compressed volume {name}"),
                "a compressed volume's data lives in extents: write it through the pool",
            ));
        }
        let map = Arc::clone(&volume.map);
        let (first, end) = self.chunk_span(offset, len);
        let needs_chunk = |state: &PoolState, index: usize| match map.lookup(index) {
            Lookup::Unmapped => true,
            Lookup::Mapped { writable: true, .. } => false,
            Lookup::Mapped { chunk, .. } => state.refcount(chunk) > 1,
        };
        let needed = (first..end)
            .filter(|&i| needs_chunk(&self.state, i))
            .count() as u32;
        if needed == 0 {
            for index in first..end {
                self.state.claim_if_exclusive(name, index);
            }
            return Ok(());
        }
        self.check_references(u64::from(needed))?;
        let fresh = self.take_chunks(needed)?;
        let mut chunks = vec![NO_CHUNK; end - first];
        let mut next = fresh.iter();
        for index in first..end {
            if !needs_chunk(&self.state, index) {
                self.state.claim_if_exclusive(name, index);
                continue;
            }
            let chunk = *next.next().expect("counted");
            let filled = match map.lookup(index) {
                Lookup::Mapped { chunk: shared, .. } => self.copy_chunk(shared, chunk),
                Lookup::Unmapped => self.zero_chunk(chunk),
            };
            if let Err(error) = filled {
                for &chunk in &fresh {
                    self.state.unallocate(chunk);
                }
                return Err(error);
            }
            chunks[index - first] = chunk;
        }
        let runs = runs_of(&chunks)
            .into_iter()
            .map(|run| Run {
                logical: run.logical + first as u32,
                ..run
            })
            .collect();
        self.stage(Record::Map {
            volume: name.to_string(),
            runs,
        });
        Ok(())
    }

    /// Deallocates `[offset, offset + len)`: whole chunks of a thin volume
    /// are released, the rest is zeroed in place (copying a shared chunk
    /// first). Reads of the range return zeroes afterwards.
    pub fn deallocate(&mut self, name: &str, offset: u64, len: u64) -> Result<(), VolumeError> {
        self.check_usable()?;
        check_range(self.existing(name)?, offset, len)?;
        self.settle_tier()?;
        if self.is_compressed(name) {
            return self.deallocate_compressed(name, offset, len);
        }
        let volume = self.existing(name)?;
        let (map, gate, thick) = (
            Arc::clone(&volume.map),
            Arc::clone(&volume.gate),
            volume.thick,
        );
        let _quiet = gate.quiesce();
        // Whatever part was done is committed even if a later part failed.
        let result = self.deallocate_pieces(name, &map, thick, offset, len);
        self.commit()?;
        result
    }

    fn deallocate_pieces(
        &mut self,
        name: &str,
        map: &ChunkMap,
        thick: bool,
        offset: u64,
        len: u64,
    ) -> Result<(), VolumeError> {
        let chunk_bytes = u64::from(self.layout().chunk_bytes);
        let mut position = offset;
        let end = offset + len;
        while position < end {
            let index = (position / chunk_bytes) as usize;
            let chunk_end = ((index as u64 + 1) * chunk_bytes).min(end);
            let whole = position.is_multiple_of(chunk_bytes) && chunk_end - position == chunk_bytes;
            match map.lookup(index) {
                Lookup::Unmapped => {}
                Lookup::Mapped { .. } if whole && !thick => self.stage(Record::Unmap {
                    volume: name.to_string(),
                    first: index as u32,
                    count: 1,
                }),
                Lookup::Mapped { .. } => {
                    self.prepare_write(name, position, chunk_end - position)?;
                    let Lookup::Mapped { chunk, .. } = map.lookup(index) else {
                        unreachable!("prepared")
                    };
                    let (member, base) = self.layout().locate(chunk);
                    let within = position % chunk_bytes;
                    self.data_dirty = true;
                    self.media
                        .zero(member, base + within, chunk_end - position)
                        .map_err(|source| VolumeError::Io {
                            context: format!("zeroing part of volume {name}"),
                            source,
                        })?;
                }
            }
            position = chunk_end;
        }
        Ok(())
    }

    /// Writes `data` at `offset` (synchronously; the data plane has its own path).
    pub fn write(&mut self, name: &str, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        if self.is_compressed(name) && !self.has_tier() {
            return self.write_compressed(name, offset, data);
        }
        if self.has_tier() {
            let write = GroupWrite {
                volume: name,
                offset,
                data,
            };
            return self.write_group(&[write]).pop().expect("one result");
        }
        let data = self.stored_bytes(name, offset, data)?;
        self.prepare_write(name, offset, data.len() as u64)?;
        self.commit()?;
        self.write_placed(name, offset, &data)
    }

    /// `data`, to be written at `offset` of volume `name`, as the devices
    /// are to hold it: encrypted if the volume is.
    fn stored_bytes<'a>(
        &self,
        name: &str,
        offset: u64,
        data: &'a [u8],
    ) -> Result<Cow<'a, [u8]>, VolumeError> {
        let cipher = self.cipher(name)?;
        check_aligned(cipher.as_deref(), name, offset, data.len())?;
        Ok(match cipher {
            Some(cipher) => {
                let mut stored = data.to_vec();
                cipher.encrypt(offset, &mut stored);
                Cow::Owned(stored)
            }
            None => Cow::Borrowed(data),
        })
    }

    /// Writes `data` (as stored: encrypted already) where the volume's
    /// chunks are (mapped and writable: prepared and committed).
    fn write_placed(&mut self, name: &str, offset: u64, data: &[u8]) -> Result<(), VolumeError> {
        let map = Arc::clone(&self.existing(name)?.map);
        self.for_each_piece(offset, data.len(), |pool, index, within, range| {
            // Prepared by the caller (a destage: by the write, its chunks
            // unshared since, as snapshots settle the tier first).
            let Lookup::Mapped {
                chunk,
                writable: true,
            } = map.lookup(index)
            else {
                return Err(io::Error::other(format!(
                    "allocation unit {index} is not mapped writable"
                )));
            };
            let (member, base) = pool.layout().locate(chunk);
            pool.media.write_at(member, base + within, &data[range])
        })
        .map_err(|source| VolumeError::Io {
            context: format!("writing volume {name}"),
            source,
        })
    }

    /// Reads `buf.len()` bytes at `offset`; unwritten ranges read as zeroes.
    pub fn read(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        if self.is_compressed(name) {
            self.read_compressed(name, offset, buf)?;
            let (id, cipher) = (self.existing(name)?.id, self.cipher(name)?);
            return self.overlay_tier(id, offset, buf, cipher.as_deref());
        }
        let cipher = self.cipher(name)?;
        check_aligned(cipher.as_deref(), name, offset, buf.len())?;
        self.read_stored(name, offset, buf)?;
        if let Some(cipher) = cipher {
            cipher.decrypt(offset, buf);
        }
        Ok(())
    }

    /// Reads what the volume stores at `offset` (encrypted, if it is): its
    /// newest copy, in the write tier or on the capacity devices.
    fn read_stored(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        if self.is_compressed(name) {
            // Its extents hold it compressed: as a block the tier holds.
            self.read_compressed(name, offset, buf)?;
            if let Some(cipher) = self.cipher(name)? {
                cipher.encrypt(offset, buf);
            }
        } else {
            self.read_devices(name, offset, buf)?;
        }
        let id = self.existing(name)?.id;
        self.overlay_tier(id, offset, buf, None)
    }

    /// Reads what the volume's chunks on the devices hold at `offset`
    /// (encrypted, if it is), whatever the write tier holds.
    fn read_devices(&mut self, name: &str, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError> {
        let volume = self.existing(name)?;
        check_range(volume, offset, buf.len() as u64)?;
        let map = Arc::clone(&volume.map);
        self.for_each_piece(offset, buf.len(), |pool, index, within, range| {
            match map.lookup(index) {
                Lookup::Unmapped => {
                    buf[range].fill(0);
                    Ok(())
                }
                Lookup::Mapped { chunk, .. } => {
                    let (member, base) = pool.layout().locate(chunk);
                    pool.media.read_at(member, base + within, &mut buf[range])
                }
            }
        })
        .map_err(|source| VolumeError::Io {
            context: format!("reading volume {name}"),
            source,
        })
    }

    /// Reads `buf.len()` bytes at `offset` of snapshot `volume@snapshot`.
    pub fn read_snapshot(
        &mut self,
        volume: &str,
        snapshot: &str,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), VolumeError> {
        let source = self.existing_snapshot(volume, snapshot)?;
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|end| end > source.size_bytes)
        {
            return Err(VolumeError::invalid(
                format!(
                    "range {offset}+{} of snapshot {volume}@{snapshot}",
                    buf.len()
                ),
                format!("the snapshot is {} bytes", source.size_bytes),
            ));
        }
        let chunks = source.chunks.clone();
        let extents = compressed::extents_under(&source.extents, offset, buf.len() as u64);
        let cipher = self.cipher(volume)?;
        check_aligned(cipher.as_deref(), volume, offset, buf.len())?;
        if self.is_compressed(volume) {
            let name = format!("{volume}@{snapshot}");
            return self.read_extents(&name, &extents, cipher.as_deref(), offset, buf);
        }
        self.for_each_piece(
            offset,
            buf.len(),
            |pool, index, within, range| match chunks[index] {
                NO_CHUNK => {
                    buf[range].fill(0);
                    Ok(())
                }
                chunk => {
                    let (member, base) = pool.layout().locate(chunk);
                    pool.media.read_at(member, base + within, &mut buf[range])
                }
            },
        )
        .map_err(|source| VolumeError::Io {
            context: format!("reading snapshot {volume}@{snapshot}"),
            source,
        })?;
        if let Some(cipher) = cipher {
            cipher.decrypt(offset, buf);
        }
        Ok(())
    }

    /// Makes every completed write durable (data on every member, then metadata).
    /// A failed sync fails the pool: a later sync may succeed while the writes
    /// it should have covered are lost (Linux drops dirty pages after EIO), so
    /// no later flush may report success.
    pub fn flush(&mut self) -> Result<(), VolumeError> {
        self.check_usable()?;
        self.commit()?;
        for member in 0..usize::from(self.layout().members) {
            if let Err(error) = self.media.sync(member) {
                let reason = format!("syncing device {member} failed: {error}");
                log::error!(
                    "pool {}: {reason}; every flush fails until the failure is cleared",
                    self.name()
                );
                self.failed = Some(reason);
                return Err(VolumeError::Io {
                    context: format!("flushing pool {}", self.name()),
                    source: error,
                });
            }
        }
        Ok(())
    }

    /// Syncs every member (the data written to them).
    fn sync_members(&mut self) -> io::Result<()> {
        for member in 0..usize::from(self.layout().members) {
            self.media.sync(member)?;
        }
        Ok(())
    }

    /// Makes the staged records durable. On failure the pool stops accepting
    /// changes: reopen it to recover its last committed state. A failed
    /// pool commits nothing more (what was staged may name data a failed
    /// sync lost), and says so even when nothing is staged.
    pub fn commit(&mut self) -> Result<(), VolumeError> {
        self.commit_with(true)
    }

    /// As [`Pool::commit`], but the journal's frames are written without a
    /// sync when they release no chunk: the data they name is synced
    /// first, so a power cut keeps them or not (the writes then lost, as
    /// any not flushed), and a killed process keeps them (they are in the
    /// kernel's cache). The next flush, or the next commit that writes
    /// frames with a sync, syncs them. Frames that release chunks are
    /// synced at once: a released chunk is reused as soon as it is free,
    /// and a power cut must not keep its new data and drop the record that
    /// released it (the unit would name data that is no longer there).
    pub(super) fn commit_unsynced(&mut self) -> Result<(), VolumeError> {
        self.commit_with(false)
    }

    fn commit_with(&mut self, sync_journal: bool) -> Result<(), VolumeError> {
        self.check_usable()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let sync_journal = sync_journal || self.state.has_released();
        if let Err(error) = self.write_pending(sync_journal) {
            let reason = format!("{error}");
            log::error!(
                "pool {}: metadata write failed: {reason}; no further changes until weft restarts",
                self.name()
            );
            self.failed = Some(reason);
            return Err(self.failed_error());
        }
        self.state.release_committed();
        self.warn_on_usage();
        Ok(())
    }

    fn write_pending(&mut self, sync_journal: bool) -> io::Result<()> {
        if self.data_dirty {
            for member in 0..usize::from(self.layout().members) {
                self.media.sync(member)?;
            }
            self.data_dirty = false;
        }
        let records = std::mem::take(&mut self.pending);
        let mut frames = Vec::new();
        let mut payload = Encoder::new();
        for record in &records {
            record.encode(&mut payload);
            if payload.len() >= RECORD_PAYLOAD_MAX {
                frames.push(std::mem::take(&mut payload).into_bytes());
            }
        }
        if !payload.is_empty() {
            frames.push(payload.into_bytes());
        }
        let needed: u64 = frames
            .iter()
            .map(|f| Frame::encoded_len(f.len()) as u64)
            .sum();
        if self.journal_used + needed > self.layout().journal_bytes {
            // The state in memory includes these records: a checkpoint covers
            // them. It takes the next sequence number, so that it is newer than
            // the checkpoint in the other slot even when no record was
            // journaled since that one (a commit larger than the journal).
            self.sequence += 1;
            return self.write_checkpoint(false);
        }
        let mut bytes = Vec::with_capacity(needed as usize);
        for frame in frames {
            self.sequence += 1;
            bytes.extend(
                Frame {
                    sequence: self.sequence,
                    payload: frame,
                }
                .encode(RECORD_MAGIC, &self.superblock.pool_uuid),
            );
        }
        let at = self.layout().journal_offset() + self.journal_used;
        for member in 0..self.layout().metadata_copies() {
            self.media.write_at(member, at, &bytes)?;
            if sync_journal {
                self.media.sync(member)?;
            }
        }
        self.journal_used += needed;
        Ok(())
    }

    /// Writes the whole state to the older checkpoint slot (with `whole`,
    /// zeroing the rest of the slot too); the journal then starts over.
    /// Records after the checkpoint are numbered on from it.
    fn write_checkpoint(&mut self, whole: bool) -> io::Result<()> {
        let bytes = Frame {
            sequence: self.sequence,
            payload: self.state.encode(),
        }
        .encode(CHECKPOINT_MAGIC, &self.superblock.pool_uuid);
        let slot = 1 - self.checkpoint_slot;
        for copy in 0..self.layout().metadata_copies() {
            write_checkpoint_frame(&mut self.media, &self.superblock, copy, slot, &bytes, whole)?;
        }
        self.checkpoint_slot = slot;
        self.journal_used = 0;
        log::debug!(
            "pool {}: checkpoint {} ({} bytes) in slot {slot}",
            self.name(),
            self.sequence,
            bytes.len()
        );
        Ok(())
    }

    fn stage(&mut self, record: Record) {
        if let Err(error) = self.state.apply(&record) {
            panic!("a validated record did not apply: {error}: {record:?}");
        }
        self.pending.push(record);
    }

    fn next_id(&self) -> [u8; 16] {
        // Unique within the pool (sequence numbers only grow) and across
        // pools (the pool UUID is random).
        let counter = self.sequence + 1 + self.pending.len() as u64;
        let mut id = self.superblock.pool_uuid;
        for (byte, c) in id[8..].iter_mut().zip(counter.to_be_bytes()) {
            *byte ^= c;
        }
        id
    }

    fn check_usable(&self) -> Result<(), VolumeError> {
        match self.failed {
            Some(_) => Err(self.failed_error()),
            None => Ok(()),
        }
    }

    fn failed_error(&self) -> VolumeError {
        VolumeError::Failed {
            pool: self.name().to_string(),
            reason: self.failed.clone().unwrap_or_default(),
        }
    }

    fn existing(&self, name: &str) -> Result<&Volume, VolumeError> {
        self.state
            .volumes
            .get(name)
            .ok_or_else(|| VolumeError::NotFound {
                kind: "volume",
                name: name.to_string(),
            })
    }

    fn existing_snapshot(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<&crate::state::Snapshot, VolumeError> {
        self.existing(volume)?
            .snapshots
            .get(name)
            .ok_or_else(|| VolumeError::NotFound {
                kind: "snapshot",
                name: format!("{volume}@{name}"),
            })
    }

    fn check_new_volume(&self, name: &str) -> Result<(), VolumeError> {
        if self.state.volumes.contains_key(name) {
            return Err(VolumeError::Exists {
                kind: "volume",
                name: name.to_string(),
            });
        }
        if self.state.volumes.len() >= VOLUMES_MAX {
            return Err(VolumeError::Limit(format!(
                "pool {} has {VOLUMES_MAX} volumes, the most a pool may hold",
                self.name()
            )));
        }
        Ok(())
    }

    fn check_geometry(&self, size_bytes: u64, block_size: u32) -> Result<(), VolumeError> {
        if !matches!(block_size, 512 | 4096) {
            return Err(VolumeError::invalid(
                format!("block size {block_size}"),
                "use 512 or 4096",
            ));
        }
        let max = VOLUME_CHUNKS_MAX << self.layout().chunk_shift();
        if size_bytes == 0 || !size_bytes.is_multiple_of(u64::from(block_size)) || size_bytes > max
        {
            return Err(VolumeError::invalid(
                format!("size {size_bytes}"),
                format!("give a multiple of the block size ({block_size}) up to {max} bytes ({VOLUME_CHUNKS_MAX} allocation units)"),
            ));
        }
        Ok(())
    }

    /// Takes `count` free chunks, all or none.
    fn take_chunks(&mut self, count: u32) -> Result<Vec<u32>, VolumeError> {
        let free = self.free_for_chunks(count)?;
        if free < count {
            return Err(VolumeError::PoolFull {
                pool: self.name().to_string(),
                needed: u64::from(count),
                free: u64::from(free),
            });
        }
        Ok((0..count)
            .map(|_| self.state.allocate().expect("counted"))
            .collect())
    }

    /// Allocates and zeroes `count` chunks for logical chunks from `first`.
    fn allocate_zeroed(&mut self, first: u32, count: u32) -> Result<Vec<Run>, VolumeError> {
        let chunks = self.take_chunks(count)?;
        for &chunk in &chunks {
            if let Err(error) = self.zero_chunk(chunk) {
                for &chunk in &chunks {
                    self.state.unallocate(chunk);
                }
                return Err(error);
            }
        }
        Ok(runs_of(&chunks)
            .into_iter()
            .map(|run| Run {
                logical: run.logical + first,
                ..run
            })
            .collect())
    }

    fn zero_chunk(&mut self, chunk: u32) -> Result<(), VolumeError> {
        let (member, offset) = self.layout().locate(chunk);
        let len = u64::from(self.layout().chunk_bytes);
        self.data_dirty = true;
        self.media
            .zero(member, offset, len)
            .map_err(|source| VolumeError::Io {
                context: format!("zeroing a new allocation unit in pool {}", self.name()),
                source,
            })
    }

    fn copy_chunk(&mut self, from: u32, to: u32) -> Result<(), VolumeError> {
        let mut buffer = vec![0u8; self.layout().chunk_bytes as usize];
        let (from_member, from_offset) = self.layout().locate(from);
        let (to_member, to_offset) = self.layout().locate(to);
        self.data_dirty = true;
        self.media
            .read_at(from_member, from_offset, &mut buffer)
            .and_then(|()| self.media.write_at(to_member, to_offset, &buffer))
            .map_err(|source| VolumeError::Io {
                context: format!("copying a shared allocation unit in pool {}", self.name()),
                source,
            })
    }

    fn chunk_span(&self, offset: u64, len: u64) -> (usize, usize) {
        let shift = self.layout().chunk_shift();
        let first = (offset >> shift) as usize;
        let end = if len == 0 {
            first
        } else {
            ((offset + len - 1) >> shift) as usize + 1
        };
        (first, end)
    }

    /// Calls `f(pool, logical chunk, offset within it, range of the buffer)`
    /// for each chunk-sized piece of `[offset, offset + len)`.
    fn for_each_piece(
        &mut self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(&mut Self, usize, u64, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let chunk_bytes = u64::from(self.layout().chunk_bytes);
        let mut done = 0usize;
        while done < len {
            let position = offset + done as u64;
            let within = position % chunk_bytes;
            let step = ((chunk_bytes - within) as usize).min(len - done);
            f(
                self,
                (position / chunk_bytes) as usize,
                within,
                done..done + step,
            )?;
            done += step;
        }
        Ok(())
    }

    fn warn_on_usage(&mut self) {
        let percent = u64::from(self.state.allocated()) * 100 / u64::from(self.state.chunks());
        let level = [90, 80]
            .into_iter()
            .find(|&level| percent >= level)
            .unwrap_or(0);
        if level > self.warned_percent {
            log::warn!(
                "pool {} is {percent}% allocated ({} of {} allocation units); writes that need space fail when it is full",
                self.name(),
                self.state.allocated(),
                self.state.chunks()
            );
        }
        self.warned_percent = level;
    }
}

/// An encrypted volume is read and written in whole blocks (its data units).
fn check_aligned(
    cipher: Option<&VolumeCipher>,
    volume: &str,
    offset: u64,
    len: usize,
) -> Result<(), VolumeError> {
    match cipher {
        Some(cipher) if !cipher.aligned(offset, len) => Err(VolumeError::invalid(
            format!("range {offset}+{len} of encrypted volume {volume}"),
            format!("use whole {}-byte blocks", cipher.unit_bytes()),
        )),
        _ => Ok(()),
    }
}

/// A compressed volume's units are counted in 32 bits: 256 TiB at most.
fn check_compressed_size(name: &str, size_bytes: u64) -> Result<(), VolumeError> {
    let max = u64::from(u32::MAX) * crate::compression::UNIT_BYTES;
    match size_bytes <= max {
        true => Ok(()),
        false => Err(VolumeError::invalid(
            format!("size {size_bytes} for compressed volume {name}"),
            format!("a compressed volume holds at most {max} bytes (2^32 - 1 units of 64 KiB)"),
        )),
    }
}

fn check_range(volume: &Volume, offset: u64, len: u64) -> Result<(), VolumeError> {
    if offset
        .checked_add(len)
        .is_none_or(|end| end > volume.size_bytes)
    {
        return Err(VolumeError::invalid(
            format!("range {offset}+{len} of volume {}", volume.name),
            format!("the volume is {} bytes", volume.size_bytes),
        ));
    }
    Ok(())
}

/// A pool's metadata as read from its media.
struct Loaded {
    superblock: Superblock,
    /// Members whose superblock copies are not both the committed one.
    superblock_repairs: Vec<usize>,
    state: PoolState,
    sequence: u64,
    journal_used: u64,
    checkpoint_slot: usize,
    /// Why the metadata copies must be rewritten (they disagree), if they must.
    resync: Option<String>,
}

/// One metadata copy's state, as its checkpoint and journal give it.
struct Copy {
    state: PoolState,
    sequence: u64,
    journal_used: u64,
    checkpoint_slot: usize,
}

/// Reads the superblocks and every metadata copy; the newest readable copy
/// (highest record sequence) is the last committed state.
fn load<M: Media>(media: &mut M) -> Result<Loaded, VolumeError> {
    let (superblock, superblock_repairs) = load_superblocks(media)?;
    let mut copies = Vec::new();
    let mut problems = Vec::new();
    for member in 0..superblock.layout.metadata_copies() {
        match load_copy(media, member, &superblock) {
            Ok(copy) => copies.push(copy),
            Err(problem) => problems.push(format!("device {}: {problem}", member + 1)),
        }
    }
    let key = |copy: &Copy| (copy.sequence, copy.checkpoint_slot, copy.journal_used);
    let disagree = copies.windows(2).any(|pair| key(&pair[0]) != key(&pair[1]));
    // The first copy wins a tie: ties only differ where none is newer.
    let best = copies
        .into_iter()
        .reduce(|best, copy| {
            if copy.sequence > best.sequence {
                copy
            } else {
                best
            }
        })
        .ok_or_else(|| {
            VolumeError::Corrupt(format!(
                "pool {}: no readable metadata copy ({})",
                superblock.pool_name,
                problems.join("; ")
            ))
        })?;
    let resync = if !problems.is_empty() {
        Some(problems.join("; "))
    } else if disagree {
        Some("a copy is behind the others".to_string())
    } else {
        None
    };
    Ok(Loaded {
        superblock,
        superblock_repairs,
        state: best.state,
        sequence: best.sequence,
        journal_used: best.journal_used,
        checkpoint_slot: best.checkpoint_slot,
        resync,
    })
}

/// The state metadata copy `member` holds: its newest checkpoint, then its
/// journal records in sequence.
fn load_copy<M: Media>(
    media: &mut M,
    member: usize,
    superblock: &Superblock,
) -> Result<Copy, String> {
    let layout = superblock.layout;
    let uuid = superblock.pool_uuid;
    let (checkpoint_slot, checkpoint) = (0..2)
        .filter_map(|slot| {
            read_checkpoint(media, superblock, member, slot)
                .ok()
                .map(|frame| (slot, frame))
        })
        .max_by_key(|(_, frame)| frame.sequence)
        .ok_or("neither checkpoint is readable")?;
    let mut state = PoolState::decode(&checkpoint.payload, layout.chunks(), layout.chunk_shift())
        .map_err(|error| format!("checkpoint {}: {error}", checkpoint.sequence))?;
    let mut sequence = checkpoint.sequence;
    let mut journal_used = 0u64;
    while let Ok(frame) = read_frame(
        media,
        member,
        layout.journal_offset() + journal_used,
        layout.journal_bytes - journal_used,
        RECORD_MAGIC,
        &uuid,
    ) {
        if frame.sequence != sequence + 1 {
            break; // a record from before the last checkpoint: the end
        }
        apply_payload(&mut state, &frame.payload)
            .map_err(|error| format!("journal record {}: {error}", frame.sequence))?;
        sequence = frame.sequence;
        journal_used += Frame::encoded_len(frame.payload.len()) as u64;
    }
    state
        .reserve(&superblock.extension.chunks_held(&layout))
        .map_err(|error| format!("checkpoint extension: {error}"))?;
    state.rebuild_free();
    state.settle_writable();
    Ok(Copy {
        state,
        sequence,
        journal_used,
        checkpoint_slot,
    })
}

fn apply_payload(state: &mut PoolState, payload: &[u8]) -> Result<(), String> {
    let mut d = Decoder::new(payload);
    while !d.is_done() {
        let record = Record::decode(&mut d).map_err(|e| e.to_string())?;
        state.apply(&record).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Writes copy A of `superblock` on each of `members` and syncs each, then
/// copy B likewise.
fn write_superblocks<M: Media>(
    media: &mut M,
    superblock: &Superblock,
    members: &[usize],
) -> io::Result<()> {
    for copy in 0..2 {
        for &member in members {
            let block = Superblock {
                member: member as u16,
                ..superblock.clone()
            }
            .encode();
            media.write_at(member, (copy * SUPERBLOCK_BYTES) as u64, &block)?;
            media.sync(member)?;
        }
    }
    Ok(())
}

/// A nonzero tag for a new group, different from any an interrupted growth
/// may have left on a device (random; 0 is group 0's).
fn growth_tag(superblock: &Superblock) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write(&superblock.pool_uuid);
    hasher.write_u64(superblock.generation);
    if let Ok(elapsed) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        hasher.write_u128(elapsed.as_nanos());
    }
    (hasher.finish() as u32).max(1)
}

/// Both superblock copies of `member`, decoded.
fn read_superblock_copies<M: Media>(
    media: &mut M,
    member: usize,
) -> [Result<Superblock, FormatError>; 2] {
    let mut read = |copy: usize| {
        let mut block = vec![0u8; SUPERBLOCK_BYTES];
        media
            .read_at(member, (copy * SUPERBLOCK_BYTES) as u64, &mut block)
            .map_err(|_| FormatError::Truncated)?;
        Superblock::decode(&block)
    };
    [read(0), read(1)]
}

/// The newest readable superblock copy of `member`.
fn read_superblock<M: Media>(media: &mut M, member: usize) -> Result<Superblock, FormatError> {
    let [a, b] = read_superblock_copies(media, member);
    match (a, b) {
        (Ok(a), Ok(b)) if b.generation > a.generation => Ok(b),
        (Ok(a), _) => Ok(a),
        (Err(_), Ok(b)) => Ok(b),
        (Err(error), Err(_)) => Err(error),
    }
}

/// Whether a superblock copy can commit its generation: it was written on a
/// device that was a member before the generation's group was added (see
/// docs/VOLUME-FORMAT.md, "Growth"). The superblocks a growth writes on its
/// new devices first do not count until a device of the old layout says so.
fn votes(superblock: &Superblock) -> bool {
    let layout = &superblock.layout;
    layout.groups().len() == 1 || superblock.member < layout.last_group().first_member
}

/// The committed superblock (the newest generation any voting copy of this
/// pool holds) and the members whose copies are not both that one (a growth
/// cut short, a torn or damaged copy): those are rewritten at open. Devices
/// beyond the committed layout (added by a growth that did not commit) are
/// ignored.
fn load_superblocks<M: Media>(media: &mut M) -> Result<(Superblock, Vec<usize>), VolumeError> {
    if media.members() == 0 {
        return Err(VolumeError::Corrupt("no devices were given".into()));
    }
    let copies: Vec<_> = (0..media.members())
        .map(|member| read_superblock_copies(media, member))
        .collect();
    let anchor = match &copies[0] {
        [Ok(a), Ok(b)] if b.generation > a.generation => b,
        [Ok(a), _] | [Err(_), Ok(a)] => a,
        [Err(error), Err(_)] => {
            return Err(VolumeError::Corrupt(format!(
                "the devices hold no readable weft pool: device 1: {error}"
            )))
        }
    };
    let committed = copies
        .iter()
        .flatten()
        .filter_map(|copy| copy.as_ref().ok())
        .filter(|copy| copy.pool_uuid == anchor.pool_uuid && votes(copy))
        .max_by_key(|copy| copy.generation)
        .expect("device 1 is in group 0, its copies vote")
        .clone();
    let layout = committed.layout;
    let name = &committed.pool_name;
    let expected = usize::from(layout.members);
    if media.members() < expected {
        return Err(VolumeError::Corrupt(format!(
            "pool {name} has {expected} devices but {} were given (a device added last must be listed too, after the others)",
            media.members()
        )));
    }
    let mut repairs = Vec::new();
    for (member, [a, b]) in copies.iter().enumerate().take(expected) {
        let wanted = Superblock {
            member: member as u16,
            ..committed.clone()
        };
        let valid: Vec<&Superblock> = [a, b].into_iter().filter_map(|c| c.as_ref().ok()).collect();
        let lagging = |copy: &&Superblock| {
            copy.pool_uuid == committed.pool_uuid
                && usize::from(copy.member) == member
                && copy.generation < committed.generation
                && member < usize::from(copy.layout.members)
                && copy.layout.is_prefix_of(&layout)
        };
        if !valid.contains(&&wanted) && !valid.iter().any(lagging) {
            let device = member + 1;
            let problem = match valid.iter().max_by_key(|c| c.generation) {
                None => {
                    let error = a.as_ref().err().copied().unwrap_or(FormatError::Truncated);
                    format!("device {device} of pool {name}: no readable superblock ({error})")
                }
                Some(copy) if copy.pool_uuid != committed.pool_uuid => format!(
                    "device {device} belongs to pool {}, not to pool {name}",
                    copy.pool_name
                ),
                Some(copy) if usize::from(copy.member) != member => format!(
                    "device {device} of pool {name} is its member {}: list the devices in their original order",
                    copy.member + 1
                ),
                Some(copy) => format!(
                    "device {device} carries pool {name}'s superblock of generation {} but not its layout of generation {}: it is a device left over from an interrupted growth, not the member added in its place",
                    copy.generation, committed.generation
                ),
            };
            return Err(VolumeError::Corrupt(problem));
        }
        if !matches!((a, b), (Ok(a), Ok(b)) if *a == wanted && *b == wanted) {
            repairs.push(member);
        }
        if media.size_bytes(member) < layout.member_bytes_needed(member) {
            return Err(VolumeError::Corrupt(format!(
                "device {} of pool {name} is smaller than when it joined the pool",
                member + 1
            )));
        }
    }
    if media.members() > expected {
        log::warn!(
            "pool {name}: ignoring {} device(s) after its {expected} members (added by a growth that did not commit; add them again)",
            media.members() - expected
        );
    }
    Ok((committed, repairs))
}

/// Reads a frame at `offset` of `member` within a region of `room` bytes.
fn read_frame<M: Media>(
    media: &mut M,
    member: usize,
    offset: u64,
    room: u64,
    magic: u32,
    uuid: &[u8; 16],
) -> Result<Frame, FormatError> {
    if room < META_BLOCK as u64 {
        return Err(FormatError::Truncated);
    }
    let mut first = vec![0u8; META_BLOCK];
    media
        .read_at(member, offset, &mut first)
        .map_err(|_| FormatError::Truncated)?;
    let total = Frame::peek_len(&first, magic, uuid)?;
    if total as u64 > room {
        return Err(FormatError::Truncated);
    }
    let mut bytes = first;
    bytes.resize(total, 0);
    if total > META_BLOCK {
        media
            .read_at(member, offset + META_BLOCK as u64, &mut bytes[META_BLOCK..])
            .map_err(|_| FormatError::Truncated)?;
    }
    Frame::decode(&bytes, magic, uuid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FaultyMedia;

    fn pool() -> Pool<FaultyMedia> {
        let media = FaultyMedia::new(2, 64 << 20, 7);
        let options = PoolOptions {
            name: "p".into(),
            chunk_bytes: 1 << 20,
            uuid: [9; 16],
        };
        let mut pool = Pool::create(media, options).unwrap();
        let spec = VolumeSpec {
            name: "v".into(),
            size_bytes: 8 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: crate::compression::Compression::None,
        };
        pool.create_volume(&spec).unwrap();
        pool
    }

    /// A sync that failed once must not be followed by a flush that reports
    /// success (the retried sync would succeed over lost writes), until an
    /// operator reloads the pool.
    #[test]
    fn a_failed_sync_fails_every_later_flush_until_reloaded() {
        let mut pool = pool();
        pool.write("v", 0, &[5u8; 4096]).unwrap();
        pool.media_mut().fail_next_syncs(1);
        assert!(pool.flush().is_err());
        let error = pool.flush().unwrap_err().to_string();
        assert!(error.contains("has failed"), "{error}");
        assert!(error.contains("weft pool clear-failure p"), "{error}");
        assert!(pool.failure().is_some());
        assert!(
            pool.write("v", 4096, &[6u8; 4096]).is_err(),
            "no changes either"
        );
        let old_map = Arc::clone(&pool.volume("v").unwrap().map);
        pool.reload().unwrap();
        assert!(pool.failure().is_none());
        assert!(!Arc::ptr_eq(&old_map, &pool.volume("v").unwrap().map));
        pool.flush().unwrap();
        let mut back = [0u8; 4096];
        pool.read("v", 0, &mut back).unwrap();
        assert_eq!(back, [5u8; 4096]);
    }

    /// Overwrites the checkpoints and journal of `member` (superblocks stay).
    fn damage_metadata(media: &mut FaultyMedia, layout: &Layout, member: usize, byte: u8) {
        let start = layout.checkpoint_offset(0);
        let len = layout.journal_offset() + layout.journal_bytes - start;
        media
            .write_at(member, start, &vec![byte; len as usize])
            .unwrap();
        media.sync(member).unwrap();
    }

    /// The metadata lives on every member of a small pool: with one copy
    /// zeroed (missing) or overwritten (corrupt), the pool opens with every
    /// committed change, and the open rewrites the bad copy so that the other
    /// one may fail next.
    #[test]
    fn a_pool_opens_with_one_metadata_copy_missing_or_corrupt() {
        let mut pool = pool();
        pool.write("v", 0, &[5u8; 4096]).unwrap();
        pool.create_snapshot("v", "s1").unwrap();
        pool.write("v", 1 << 20, &[6u8; 4096]).unwrap();
        pool.flush().unwrap();
        let layout = *pool.layout();
        assert_eq!(layout.metadata_copies(), 2);
        let mut media = pool.into_media();
        for (member, byte) in [(0, 0u8), (1, 0xa5), (0, 0x5a)] {
            damage_metadata(&mut media, &layout, member, byte);
            let mut pool = Pool::open(media).unwrap();
            let mut back = [0u8; 4096];
            pool.read("v", 0, &mut back).unwrap();
            assert_eq!(back, [5u8; 4096]);
            pool.read("v", 1 << 20, &mut back).unwrap();
            assert_eq!(back, [6u8; 4096]);
            assert!(pool.volume_info("v").unwrap().snapshots.len() == 1);
            media = pool.into_media();
        }
        damage_metadata(&mut media, &layout, 0, 0);
        damage_metadata(&mut media, &layout, 1, 0);
        assert!(Pool::probe(&mut media).iter().all(Option::is_some));
        let error = Pool::open(media).unwrap_err().to_string();
        assert!(error.contains("no readable metadata copy"), "{error}");
    }

    #[test]
    fn usage_per_member_and_erase_of_an_empty_pool() {
        let mut pool = pool();
        pool.write("v", 0, &[1u8; 4096]).unwrap();
        pool.write("v", 1 << 20, &[1u8; 4096]).unwrap();
        let usage = pool.member_usage();
        assert_eq!(usage.len(), 2);
        assert!(usage
            .iter()
            .all(|m| m.allocated_bytes == 1 << 20 && m.metadata_copy));
        assert_eq!(
            usage.iter().map(|m| m.capacity_bytes).sum::<u64>(),
            pool.info().capacity_bytes
        );
        let error = pool.erase().unwrap_err().to_string();
        assert!(error.contains("it holds volume v"), "{error}");
        let mut pool = self::pool();
        pool.delete_volume("v").unwrap();
        let mut media = pool.erase().unwrap();
        assert!(Pool::probe(&mut media).iter().all(Option::is_none));
    }

    /// A commit that does not fit in the journal goes into a checkpoint; when
    /// nothing was journaled since the other slot's checkpoint (e.g. a commit
    /// larger than the whole journal), the new one must still be the newer,
    /// or the open would take the older state and lose the commit.
    #[test]
    fn a_checkpoint_right_after_a_checkpoint_is_the_newer_one() {
        let mut pool = pool();
        pool.write_checkpoint(false).unwrap();
        if pool.checkpoint_slot == 0 {
            pool.write_checkpoint(false).unwrap();
        }
        // The next checkpoint lands in slot 0, the one an open prefers less
        // on a tie; a full journal sends the next commit there.
        pool.journal_used = pool.layout().journal_bytes;
        let spec = VolumeSpec {
            name: "w".into(),
            size_bytes: 4 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: crate::compression::Compression::None,
        };
        pool.create_volume(&spec).unwrap();
        assert_eq!(pool.checkpoint_slot, 0);
        let pool = Pool::open(pool.into_media()).unwrap();
        assert!(pool.volume("w").is_some(), "the commit was lost at reopen");
    }

    #[test]
    fn metadata_copies_are_three_at_most() {
        let layout = |members| Layout::plan(members, 256 << 20, 1 << 20).unwrap();
        assert_eq!(layout(1).metadata_copies(), 1);
        assert_eq!(layout(3).metadata_copies(), 3);
        assert_eq!(layout(8).metadata_copies(), 3);
    }

    /// A reactor that still holds a deleted volume's map (its exports update
    /// is on its way) must not write into chunks the delete released: the
    /// map says retired, so the reactor asks the manager instead.
    #[test]
    fn a_deleted_volumes_map_is_retired_before_its_chunks_are_reused() {
        let mut pool = pool();
        pool.write("v", 0, &[5u8; 4096]).unwrap();
        let stale = Arc::clone(&pool.volume("v").unwrap().map);
        let gate = Arc::clone(&pool.volume("v").unwrap().gate);
        pool.delete_volume("v").unwrap();
        assert!(gate.enter(), "the gate reopens after the delete");
        assert!(stale.is_retired(), "a stale reactor must not use the map");
        gate.leave();
    }

    const SMALL: usize = 16 << 20;

    fn options(name: &str, uuid: u8) -> PoolOptions {
        PoolOptions {
            name: name.into(),
            chunk_bytes: 1 << 20,
            uuid: [uuid; 16],
        }
    }

    fn blank(size: usize) -> FaultyMedia {
        FaultyMedia::new(1, size, 11)
    }

    fn version(media: &mut FaultyMedia, member: usize, copy: u64) -> u8 {
        let mut block = [0u8; 16];
        media
            .read_at(member, copy * SUPERBLOCK_BYTES as u64, &mut block)
            .unwrap();
        block[8]
    }

    /// A full one-device pool gains a device: the new units are allocatable at
    /// once, old data stays where it was, and everything survives a reopen
    /// (which also finds a second metadata copy on the new device).
    #[test]
    fn a_full_pool_grows_and_the_new_capacity_is_usable_at_once() {
        let mut pool = Pool::create(FaultyMedia::new(1, SMALL, 3), options("g", 1)).unwrap();
        let old_capacity = pool.info().capacity_bytes;
        assert_eq!(old_capacity, 12 << 20, "16 MiB less 4 MiB of metadata");
        let spec = VolumeSpec {
            name: "v".into(),
            size_bytes: 64 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: crate::compression::Compression::None,
        };
        pool.create_volume(&spec).unwrap();
        let fill = |pool: &mut Pool<FaultyMedia>, from: u64, to: u64| {
            for at in (from..to).step_by(1 << 20) {
                pool.write("v", at, &[(at >> 20) as u8 + 1; 4096])?;
            }
            Ok::<(), VolumeError>(())
        };
        fill(&mut pool, 0, old_capacity).unwrap();
        let full = fill(&mut pool, old_capacity, old_capacity + (1 << 20)).unwrap_err();
        assert!(matches!(full, VolumeError::PoolFull { .. }), "{full}");
        let stale_map = Arc::clone(&pool.volume("v").unwrap().map);
        assert_eq!(
            version(pool.media_mut(), 0, 0),
            1,
            "a pool that never grew is version 1"
        );

        pool.add_members(vec![blank(SMALL)]).unwrap();
        assert!(
            stale_map.is_retired(),
            "reactors with the old layout must ask"
        );
        assert_eq!(pool.info().members, 2);
        assert_eq!(pool.info().capacity_bytes, 2 * old_capacity);
        assert_eq!(pool.layout().metadata_copies(), 2);
        fill(&mut pool, old_capacity, 2 * old_capacity).unwrap();
        let (member, _) = pool.layout().locate(pool.layout().chunks() - 1);
        assert_eq!(member, 1, "the new units are on the new device");
        pool.flush().unwrap();
        for member in 0..2 {
            for copy in 0..2 {
                assert_eq!(version(pool.media_mut(), member, copy), 2);
            }
        }

        let layout = *pool.layout();
        let mut media = pool.into_media().crash();
        damage_metadata(&mut media, &layout, 0, 0);
        let mut pool = Pool::open(media).unwrap();
        assert_eq!(*pool.layout(), layout);
        for at in (0..2 * old_capacity).step_by(1 << 20) {
            let mut back = [0u8; 4096];
            pool.read("v", at, &mut back).unwrap();
            assert!(back == [(at >> 20) as u8 + 1; 4096], "at {at}");
        }
    }

    #[test]
    fn adding_refuses_members_other_pools_small_devices_and_too_many() {
        let mut pool = Pool::create(FaultyMedia::new(2, SMALL, 3), options("g", 1)).unwrap();
        let mut other = Pool::create(FaultyMedia::new(1, SMALL, 4), options("other", 2))
            .unwrap()
            .into_media();
        let message = |pool: &mut Pool<FaultyMedia>, device| {
            pool.add_members(vec![device]).unwrap_err().to_string()
        };
        let error = message(&mut pool, other.take_last_member().unwrap());
        assert!(error.contains("belongs to pool other"), "{error}");
        let error = message(&mut pool, blank(4 << 20));
        assert!(error.contains("no room for data"), "{error}");
        let mut copy = blank(SMALL);
        let mut block = vec![0u8; 2 * SUPERBLOCK_BYTES];
        pool.media_mut().read_at(1, 0, &mut block).unwrap();
        copy.write_at(0, 0, &block).unwrap();
        let error = message(&mut pool, copy);
        assert!(error.contains("device 2 of pool g already"), "{error}");
        let many = (0..63).map(|_| blank(0)).collect();
        let error = pool.add_members(many).unwrap_err();
        assert!(matches!(error, VolumeError::Limit(_)), "{error}");
        assert!(error.to_string().contains("64 at most"), "{error}");
        assert_eq!(
            pool.media().members(),
            2,
            "refused devices are closed again"
        );
        assert!(pool.failure().is_none());
        pool.add_members(vec![blank(SMALL), blank(SMALL)]).unwrap();
        assert_eq!(pool.layout().groups().len(), 2);
        assert_eq!(pool.layout().members, 4);
        Pool::open(pool.into_media()).unwrap();
    }

    /// A device whose superblock a growth wrote before it was cut short is
    /// not a member: listed at open it is ignored, and it can be added again.
    #[test]
    fn a_device_left_by_an_interrupted_growth_is_ignored_and_can_be_added_again() {
        let mut pool = Pool::create(FaultyMedia::new(1, SMALL, 3), options("g", 1)).unwrap();
        pool.create_volume(&VolumeSpec {
            name: "v".into(),
            size_bytes: 4 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: crate::compression::Compression::None,
        })
        .unwrap();
        pool.write("v", 0, &[7; 4096]).unwrap();
        pool.flush().unwrap();
        // Fail the first write to an old member: the new device is written.
        pool.media_mut().fail_after_writes(5);
        assert!(pool.add_members(vec![blank(SMALL)]).is_err());
        assert!(pool.failure().is_some(), "the growth is in doubt");
        let mut media = pool.into_media().crash();
        assert_eq!(media.members(), 2);
        assert_eq!(
            version(&mut media, 1, 0),
            2,
            "the new device has its superblock"
        );
        let mut pool = Pool::open(media).unwrap();
        assert_eq!(pool.layout().members, 1, "not committed: the old pool");
        let leftover = pool.media_mut().take_last_member().unwrap();
        pool.add_members(vec![leftover]).unwrap();
        assert_eq!(pool.layout().members, 2);
        let mut back = [0u8; 4096];
        pool.read("v", 0, &mut back).unwrap();
        assert!(back == [7; 4096]);
        let mut pool = Pool::open(pool.into_media().crash()).unwrap();
        assert_eq!(pool.layout().members, 2);
        pool.read("v", 0, &mut back).unwrap();
        assert!(back == [7; 4096], "data written before the growth survives");
    }
}
