//! Pools with a write tier, on the node: attaching a tier (at creation or
//! online), opening a pool with its tier, and serving the I/O of its
//! volumes. While a pool has a tier, the data plane hands every I/O of its
//! volumes but the reads of blocks the tier does not hold (the tier's
//! presence counters say which) to the manager (`TierSink`, through the
//! path a replicated volume's I/O takes to its replicator), which writes
//! through the tier and reads the newest copies (`weft_volume`'s pool
//! tier). The writes the manager finds waiting together are written as one
//! group (one commit, as few tier batches and syncs as fit): the group
//! commit.
//!
//! When it destages: a round at a time whenever the manager is idle, while
//! a tier is at least half full or once writes have paused for half a
//! second (so a steady light load stays in the tier and reads do not wait
//! behind destage rounds); and at once when a write finds the tier full.
//!
//! What this does not do (yet): append from the reactors (each write waits
//! for the manager thread), or
//! hold copies of replicated and erasure-coded volumes (their writes reach
//! the pool's devices without the manager: refused on such pools).

use super::{outcome, AdminError, Manager, SlowIo};
use crate::identity::hex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_control::{DesiredState, PoolRecord, StoreError};
use weft_target::replicated::{Replicated, ReplicatedIo, ReplicatedSink, ReplicatedWork, Serving};
use weft_target::{DataPlane, VolumeOutcome, VolumeReply};
use weft_volume::compression::Compression;
use weft_volume::tier::TierPresence;
use weft_volume::{FileMedia, GroupWrite, Pool, VolumeError};

/// Rings of a tier: the manager's writes take one (the reactors will take
/// one each).
const TIER_RINGS: usize = 1;
/// Destage rounds the manager runs each time it is idle and a destage is
/// due: one, so that an I/O waits for one round at most.
const IDLE_ROUNDS: usize = 1;
/// A tier this full (in percent of its rings) is destaged whenever the
/// manager is idle; below it, once writes have paused for `QUIET`, so that
/// a steady light load is absorbed by the tier and reads do not wait behind
/// destage rounds.
const PRESSURE_PERCENT: u64 = 50;
/// How long writes to tiered pools must pause before a tier below
/// `PRESSURE_PERCENT` is destaged.
const QUIET: Duration = Duration::from_millis(500);

/// A write tier's device, as `weft pool create --write-tier` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierDevice {
    /// A file or block device.
    pub path: PathBuf,
    /// Creates a missing regular file sparse with this size.
    pub size_bytes: Option<u64>,
}

/// An I/O of a volume in a pool with a write tier, for the manager.
#[derive(Debug)]
pub(super) struct TieredIo {
    pub(super) pool: String,
    pub(super) volume: String,
    /// The volume's identity when the path was made: a volume of the same
    /// name made since is another volume.
    id: [u8; 16],
    pub(super) io: ReplicatedIo,
}

/// Writes of tiered pools' volumes waiting for their group, by pool.
#[derive(Default)]
pub(super) struct TierWrites(BTreeMap<String, Vec<Waiting>>);

/// A write waiting for its pool's group.
struct Waiting {
    volume: String,
    offset: u64,
    data: weft_uring::SharedBuf,
    fua: bool,
    reply: VolumeReply,
}

/// The data plane's path to the manager for a tiered pool's volume.
struct TierSink {
    handle: super::ManagerHandle,
    pool: String,
    volume: String,
    id: [u8; 16],
}

impl ReplicatedSink for TierSink {
    fn submit(&self, io: ReplicatedIo) {
        self.handle.push_io(SlowIo::Tiered(TieredIo {
            pool: self.pool.clone(),
            volume: self.volume.clone(),
            id: self.id,
            io,
        }));
    }
}

/// Refuses a tier device that is one of `devices` or already belongs to a pool.
pub(super) fn check_tier_free(
    tier: &TierDevice,
    devices: &[PathBuf],
    pools: &BTreeMap<String, PoolRecord>,
) -> Result<(), AdminError> {
    let path = canonical(&tier.path);
    if devices.iter().any(|device| canonical(device) == path) {
        return Err(VolumeError::invalid(
            format!("write tier device {}", tier.path.display()),
            "it is also one of the pool's devices; give the tier a device of its own",
        )
        .into());
    }
    super::check_devices_free(std::slice::from_ref(&tier.path), pools)
}

/// `path` with its symbolic links resolved, where it exists (two names of
/// one device compare equal).
pub(super) fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Opens pool `name` on `media`, with the tier on `tier` if the record
/// names one (offered: the pool's superblocks say whether it is its tier).
pub(super) fn open_pool(
    name: &str,
    media: FileMedia,
    tier: Option<&Path>,
) -> Result<Pool<FileMedia>, String> {
    let tier = tier
        .map(|path| FileMedia::open(&[path.to_path_buf()], None))
        .transpose()
        .map_err(|e| format!("pool {name}: its write tier: {e}"))?;
    Pool::open_with_tier(media, tier).map_err(|e| format!("pool {name}: {e}"))
}

/// Makes pool `name`'s record name a tier only if the pool has one (an
/// attach cut short before the superblocks named it is forgotten).
pub(super) fn reconcile_tier(
    desired: &DesiredState,
    name: &str,
    pool: &Pool<FileMedia>,
) -> Result<(), StoreError> {
    let named = desired
        .pools()?
        .get(name)
        .and_then(|r| r.write_tier.clone());
    if pool.tier_info().is_some() || named.is_none() {
        return Ok(());
    }
    let forgotten = desired.change_pool(name, |record| {
        let record = record?;
        let Some(path) = record.write_tier.clone() else {
            return Some(record);
        };
        log::warn!(
            "pool {name}: its record names {} as its write tier, but its superblocks name none (an attach or a removal cut short): forgotten; to give the pool a tier, set it again (weft pool set {name} --write-tier {})",
            path.display(),
            path.display()
        );
        Some(PoolRecord {
            write_tier: None,
            ..record
        })
    });
    forgotten.map(|_| ())
}

impl Manager {
    /// Formats `tier` as `pool`'s write tier and names it in the pool's
    /// superblocks.
    pub(super) fn attach_tier(
        &mut self,
        pool: &mut Pool<FileMedia>,
        tier: &TierDevice,
    ) -> Result<(), AdminError> {
        let mut media = FileMedia::open(std::slice::from_ref(&tier.path), tier.size_bytes)
            .map_err(|e| {
                VolumeError::invalid(
                    "write tier device",
                    format!("{e} (a missing file is created when --write-tier-size is given)"),
                )
            })?;
        if let Some(Some(superblock)) = Pool::probe(&mut media).first() {
            return Err(VolumeError::invalid(
                format!("write tier device {}", tier.path.display()),
                format!(
                    "it holds weft pool {}; delete that pool first",
                    superblock.pool_name
                ),
            )
            .into());
        }
        if weft_volume::tier::probe(&mut media, 0) {
            return Err(VolumeError::invalid(
                format!("write tier device {}", tier.path.display()),
                "it holds a weft write tier (another pool's, or one a pool deleted without erasing it left); if no pool uses it, wipe its first 8 KiB (dd if=/dev/zero of=DEVICE bs=4k count=2)",
            )
            .into());
        }
        let id = self
            .node
            .derive(&[b"write tier", pool.name().as_bytes(), &super::nonce()]);
        pool.attach_tier(media, id, TIER_RINGS)?;
        log::info!(
            "pool {}: write tier {} ({}), id {}",
            pool.name(),
            tier.path.display(),
            weft_storage::human_bytes(pool.tier_info().map_or(0, |t| t.capacity_bytes)),
            hex(&id)
        );
        Ok(())
    }

    /// Gives pool `name` a write tier, online: recorded first, then
    /// attached; its volumes' maps are renewed, so that a reactor that
    /// still holds the exports of before asks the manager, and every I/O
    /// takes the tier's path once the new exports are out.
    pub(super) fn set_write_tier(
        &mut self,
        name: &str,
        tier: TierDevice,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        let pools = self.desired.pools()?;
        let record = pools
            .get(name)
            .ok_or_else(|| super::not_found("pool", name))?;
        if let Some(path) = &record.write_tier {
            return Err(VolumeError::invalid(
                format!("write tier for pool {name}"),
                format!("it has one already ({})", path.display()),
            )
            .into());
        }
        check_tier_free(&tier, &record.devices, &pools)?;
        self.refuse_copies_on(name)?;
        let path = tier.path.clone();
        self.store_write(|d| {
            d.change_pool(name, |record| {
                record.map(|record| PoolRecord {
                    write_tier: Some(path.clone()),
                    ..record
                })
            })
        })?;
        let mut pool = self
            .pools
            .remove(name)
            .ok_or_else(|| super::not_found("pool", name))?;
        let attached = self.attach_tier(&mut pool, &tier);
        super::note_pool_failure(&pool, &self.health[name]);
        let has_tier = pool.tier_info().is_some();
        self.pools.insert(name.to_string(), pool);
        if !has_tier {
            reconcile_tier(&self.desired, name, &self.pools[name])?;
        }
        plane.update_exports(self.exports());
        attached
    }

    /// Takes pool `name`'s write tier away, online: destaged and unnamed
    /// in the pool's superblocks first, then forgotten by the record (a
    /// crash between leaves a record naming a device the superblocks do
    /// not: forgotten at the next open), then the volumes' I/O goes to the
    /// devices directly again.
    pub(super) fn remove_write_tier(
        &mut self,
        name: &str,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        let pool = self
            .pools
            .get_mut(name)
            .ok_or_else(|| super::not_found("pool", name))?;
        let detached = pool.detach_tier();
        super::note_pool_failure(pool, &self.health[name]);
        drop(detached?);
        // The exports first: until they are out, writes still come this way
        // (served by the devices, FUA synced).
        self.forget_tier_paths();
        plane.update_exports(self.exports());
        self.store_write(|d| {
            d.change_pool(name, |record| {
                record.map(|record| PoolRecord {
                    write_tier: None,
                    ..record
                })
            })
        })?;
        Ok(())
    }

    /// Refuses a tier for a pool that holds copies of replicated or
    /// erasure-coded volumes (their writes do not pass the manager).
    fn refuse_copies_on(&self, name: &str) -> Result<(), AdminError> {
        let Some(pool) = self.pools.get(name) else {
            return Ok(());
        };
        let records = self.desired.volumes()?;
        let copies: Vec<&str> = pool
            .volumes()
            .filter(|v| {
                records
                    .get(&v.name)
                    .is_some_and(|r| r.replication.is_some())
            })
            .map(|v| v.name.as_str())
            .collect();
        if copies.is_empty() {
            return Ok(());
        }
        Err(AdminError::Invalid(format!(
            "pool {name} holds copies of replicated or erasure-coded volumes ({}): a write tier holds the volumes of one copy only, for now; give the tier to a pool without them",
            copies.join(", ")
        )))
    }

    /// Refuses a copy of a replicated or erasure-coded volume in a pool
    /// with a write tier.
    pub(super) fn refuse_copy_in_tiered(&self, pool: &str, volume: &str) -> Result<(), AdminError> {
        match self.pools.get(pool).and_then(Pool::tier_info) {
            Some(_) => Err(AdminError::Invalid(format!(
                "volume {volume}: pool {pool} has a write tier, which holds volumes of one copy only, for now; place replicated and erasure-coded volumes on pools without one"
            ))),
            None => Ok(()),
        }
    }

    /// The data plane's path for `volume` of `pool` through the manager:
    /// for a pool with a tier, whose `presence` says which reads stay in
    /// the reactors (every other I/O to the manager); for a compressed
    /// volume (no `presence`), every I/O. Made once and kept.
    pub(super) fn tier_path(
        &mut self,
        pool: &str,
        volume: &str,
        id: [u8; 16],
        presence: Option<Arc<TierPresence>>,
    ) -> Arc<Replicated> {
        let handle = self.handle.clone();
        let path = self
            .tier_paths
            .entry((pool.to_string(), volume.to_string(), id))
            .or_insert_with(|| {
                let sink = TierSink {
                    handle,
                    pool: pool.to_string(),
                    volume: volume.to_string(),
                    id,
                };
                let path = match presence {
                    Some(presence) => Replicated::tiered(Box::new(sink), presence, id),
                    None => Replicated::with_reads(Box::new(sink)),
                };
                path.set_serving(Serving::Yes);
                Arc::new(path)
            });
        Arc::clone(path)
    }

    /// Drops the paths of volumes deleted (a volume made again under its
    /// name is another: its own path, its own identity), or of pools that
    /// no longer have a tier (but for compressed volumes).
    pub(super) fn forget_tier_paths(&mut self) {
        let pools = &self.pools;
        self.tier_paths.retain(|(pool, volume, id), _| {
            pools.get(pool).is_some_and(|p| {
                p.volume(volume).is_some_and(|v| {
                    v.id == *id && (p.tier_info().is_some() || v.compression != Compression::None)
                })
            })
        });
    }

    /// Serves one I/O of a tiered pool's volume; a write joins `writes`,
    /// its pool's group (see [`Manager::write_tiered`]).
    pub(super) fn serve_tiered(&mut self, tiered: TieredIo, writes: &mut TierWrites) {
        let TieredIo {
            pool,
            volume,
            id,
            io,
        } = tiered;
        let current = self
            .pools
            .get(&pool)
            .and_then(|p| p.volume(&volume))
            .map(|v| v.id);
        if current != Some(id) {
            // Sent through exports of before (the volume deleted, or made
            // again): the reactor asks its current exports.
            io.reply.send(VolumeOutcome::Retry);
            return;
        }
        let (Some(p), Some(health)) = (self.pools.get_mut(&pool), self.health.get(&pool)) else {
            io.reply.send(VolumeOutcome::Done(Err(
                weft_proto::IoError::PathInaccessible,
            )));
            return;
        };
        if health.is_failed() {
            io.reply
                .send(VolumeOutcome::Done(Err(weft_proto::IoError::Failed)));
            return;
        }
        let result = match io.work {
            ReplicatedWork::Read { offset, len } => {
                let mut data = vec![0; len as usize];
                match p.read(&volume, offset, &mut data) {
                    Ok(()) => return io.reply.send_read(data),
                    Err(error) => Err(error),
                }
            }
            ReplicatedWork::Write { offset, data, fua } => {
                let write = Waiting {
                    volume,
                    offset,
                    data,
                    fua,
                    reply: io.reply,
                };
                writes.0.entry(pool).or_default().push(write);
                return;
            }
            ReplicatedWork::Zeroes {
                offset, len, fua, ..
            } => p
                .deallocate(&volume, offset, len)
                .and_then(|()| if fua { p.flush() } else { Ok(()) }),
            ReplicatedWork::Flush => p.flush(),
        };
        super::note_pool_failure(p, health);
        io.reply.send(outcome(&volume, result));
    }

    /// Writes each pool's group of writes (those of one batch of the
    /// inbox: all in flight together, so their order is the host's to
    /// choose) with one commit and as few tier batches as fit, then
    /// answers them.
    pub(super) fn write_tiered(&mut self, writes: TierWrites) {
        for (pool, waiting) in writes.0 {
            let (Some(p), Some(health)) = (self.pools.get_mut(&pool), self.health.get(&pool))
            else {
                continue;
            };
            self.last_tier_write = Some(Instant::now());
            self.tiers_stalled_until = None;
            let group: Vec<GroupWrite<'_>> = waiting
                .iter()
                .map(|w| GroupWrite {
                    volume: &w.volume,
                    offset: w.offset,
                    data: &w.data,
                })
                .collect();
            let mut results = p.write_group(&group);
            // Durable in the tier once written (a compressed volume's too:
            // it is compressed when destaged): FUA asks nothing more. A
            // write sent on this path just after the tier was removed went
            // to the devices, or a compressed volume's to its extents: FUA
            // commits and syncs them.
            let untiered = p.tier_info().is_none();
            if untiered && waiting.iter().any(|w| w.fua) {
                if let Err(error) = p.flush() {
                    let reason = error.to_string();
                    for (write, result) in waiting.iter().zip(&mut results) {
                        if write.fua && result.is_ok() {
                            *result = Err(VolumeError::Io {
                                context: "flushing a FUA write".into(),
                                source: std::io::Error::other(reason.clone()),
                            });
                        }
                    }
                }
            }
            super::note_pool_failure(p, health);
            for (write, result) in waiting.into_iter().zip(results) {
                write.reply.send(outcome(&write.volume, result));
            }
        }
    }

    /// When the tiers are to be destaged next: at once while one is at
    /// least `PRESSURE_PERCENT` full, else `QUIET` after the last write
    /// (at once after the start: what the tiers replayed); None when no
    /// usable tier holds writes. After a destage that released nothing,
    /// not before `QUIET` has passed.
    pub(super) fn next_destage(&self) -> Option<Instant> {
        let mut due = None;
        for (name, pool) in &self.pools {
            let Some(tier) = pool.tier_info().filter(|t| t.used_bytes > 0) else {
                continue;
            };
            if pool.failure().is_some() || self.health[name].is_failed() {
                continue;
            }
            let now = Instant::now();
            let pool_due = match tier.used_bytes * 100 >= tier.capacity_bytes * PRESSURE_PERCENT {
                true => now,
                false => self.last_tier_write.map_or(now, |at| at + QUIET),
            };
            due = Some(due.map_or(pool_due, |d: Instant| d.min(pool_due)));
        }
        due.map(|due| self.tiers_stalled_until.map_or(due, |until| due.max(until)))
    }

    /// Runs destage rounds on every pool whose tier holds writes (when
    /// the manager is idle), and publishes their tiers' new figures.
    pub(super) fn destage_tiers(&mut self) {
        let mut released = 0;
        let mut touched = super::publish::Touched::default();
        for (name, pool) in &mut self.pools {
            let failed = pool.failure().is_some() || self.health[name].is_failed();
            if failed || pool.tier_info().is_none_or(|t| t.used_bytes == 0) {
                continue;
            }
            touched.note_pool(name);
            // Compressed volumes' units are placed at the destage: what
            // they store changes with it.
            for volume in pool.volumes() {
                if pool.compression_usage(&volume.name).is_some() {
                    touched.note_volume(name, &volume.name);
                }
            }
            match pool.destage_tier(IDLE_ROUNDS) {
                Ok(batches) => released += batches,
                Err(error) => {
                    log::error!("pool {name}: {error}");
                    super::note_pool_failure(pool, &self.health[name]);
                }
            }
        }
        self.tiers_stalled_until = (released == 0).then(|| Instant::now() + QUIET);
        self.publish_touched(&touched);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{idle_manager, pool_with_volume};
    use super::*;
    use weft_volume::VolumeSpec;

    /// An idle manager whose pool "p" (volume "v") has a 1 MiB write tier.
    fn tiered_manager(name: &str) -> (Manager, std::path::PathBuf) {
        let (desired, dir) = pool_with_volume(name);
        let mut manager = idle_manager(desired);
        let tier = TierDevice {
            path: dir.join("t0.img"),
            size_bytes: Some(1 << 20),
        };
        let mut pool = manager.pools.remove("p").unwrap();
        manager.attach_tier(&mut pool, &tier).unwrap();
        manager.pools.insert("p".into(), pool);
        (manager, dir)
    }

    /// The path the exports give a tiered pool's volume sends a read to
    /// the manager only while the tier may hold one of its blocks.
    #[test]
    fn a_tiered_volumes_reads_stay_in_the_reactors_while_the_tier_holds_none_of_their_blocks() {
        let (mut manager, dir) = tiered_manager("tier-reads");
        manager.exports();
        let id = manager.pools["p"].volume("v").unwrap().id;
        let path = Arc::clone(&manager.tier_paths[&("p".to_string(), "v".to_string(), id)]);
        let read = Some((65536, 4096));
        assert_eq!(path.route(read, 0), Ok(false), "the devices");
        assert_eq!(path.route(None, 0), Ok(true), "a write: the manager");
        let pool = manager.pools.get_mut("p").unwrap();
        pool.write("v", 65536, &[1; 4096]).unwrap();
        assert_eq!(path.route(read, 0), Ok(true), "the tier holds it");
        pool.destage_tier(usize::MAX).unwrap();
        assert_eq!(path.route(read, 0), Ok(false), "destaged");
        // Made again under its name (before the exports forgot the first):
        // another volume, another path.
        pool.delete_volume("v").unwrap();
        pool.create_volume(&VolumeSpec {
            name: "v".into(),
            size_bytes: 8 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: weft_volume::compression::Compression::None,
        })
        .unwrap();
        let again = pool.volume("v").unwrap().id;
        manager.exports();
        let keys: Vec<_> = manager.tier_paths.keys().map(|(_, _, id)| *id).collect();
        assert_eq!(keys, [again]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a compressed volume stores is published once the tier destages
    /// it (its units are placed then, not when written).
    #[test]
    fn a_destage_publishes_what_its_compressed_volumes_store() {
        let (mut manager, dir) = tiered_manager("tier-compressed-figures");
        let pool = manager.pools.get_mut("p").unwrap();
        pool.create_volume(&VolumeSpec {
            name: "z".into(),
            size_bytes: 8 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: weft_volume::compression::Compression::Lz4,
        })
        .unwrap();
        pool.write("z", 0, &[7; 65536]).unwrap();
        manager.publish();
        let stored = |manager: &Manager| {
            let snapshot = manager.published.load();
            let info = &snapshot.pools["p"].volumes["z"].info;
            info.compression.expect("compressed").stored_bytes
        };
        assert_eq!(stored(&manager), 0, "still in the tier");
        manager.destage_tiers();
        let placed = manager.pools["p"]
            .compression_usage("z")
            .unwrap()
            .stored_bytes;
        assert!(placed > 0);
        assert_eq!(stored(&manager), placed, "published with the destage");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
