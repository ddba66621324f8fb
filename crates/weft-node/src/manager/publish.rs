//! How the manager publishes the node's status (a [`NodeSnapshot`]) for
//! readers: all of it after an admin operation, only what a batch of I/O
//! changed after the batch, and the member usage it held back once it is due.

use super::Manager;
use crate::status::{NodeSnapshot, PoolSnapshot, VolumeSnapshot, WriteTierStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_target::{VolumeRequest, VolumeWork};
use weft_volume::{FileMedia, MemberUsage, Pool, PoolInfo};

/// How often a pool's member usage is recomputed at most while I/O changes
/// its allocation: computing it reads every allocation unit's count, which
/// must not slow the slow path down.
const MEMBER_USAGE_REFRESH: Duration = Duration::from_secs(1);

/// What a batch of slow-path I/O may have changed: per pool, the volumes
/// whose allocation it may have changed (a pool without any: only its state,
/// e.g. a failed flush).
#[derive(Debug, Default)]
pub(super) struct Touched {
    pools: BTreeMap<String, BTreeSet<String>>,
}

impl Touched {
    /// Notes what an I/O of a pool with a write tier may change (a write
    /// may allocate and fills the tier, a flush commits, a read nothing).
    pub(super) fn note_tiered(&mut self, tiered: &super::tier::TieredIo) {
        use weft_target::replicated::ReplicatedWork;
        match tiered.io.work {
            ReplicatedWork::Read { .. } => {}
            ReplicatedWork::Flush => {
                self.pools.entry(tiered.pool.clone()).or_default();
            }
            ReplicatedWork::Write { .. } | ReplicatedWork::Zeroes { .. } => {
                self.pools
                    .entry(tiered.pool.clone())
                    .or_default()
                    .insert(tiered.volume.clone());
            }
        }
    }

    /// Notes pool `name` (its figures, its tier's use).
    pub(super) fn note_pool(&mut self, name: &str) {
        self.pools.entry(name.to_string()).or_default();
    }

    /// Notes volume `volume` of pool `pool` (its figures: allocation,
    /// what it stores compressed).
    pub(super) fn note_volume(&mut self, pool: &str, volume: &str) {
        self.pools
            .entry(pool.to_string())
            .or_default()
            .insert(volume.to_string());
    }

    /// Notes what `request` may change.
    pub(super) fn note(&mut self, request: &VolumeRequest) {
        match request.work {
            VolumeWork::Wait
            | VolumeWork::MarkIntent {
                allocate: false, ..
            }
            | VolumeWork::Reserve { .. } => {}
            VolumeWork::Flush => {
                self.pools.entry(request.pool.clone()).or_default();
            }
            VolumeWork::PrepareWrite { .. }
            | VolumeWork::MarkIntent { allocate: true, .. }
            | VolumeWork::Deallocate { .. }
            | VolumeWork::Snapshot(_)
            | VolumeWork::Grow { .. } => {
                self.pools
                    .entry(request.pool.clone())
                    .or_default()
                    .insert(request.volume.clone());
            }
        }
    }
}

/// Each pool's member usage as last computed.
#[derive(Debug, Default)]
pub(super) struct MemberUsageCache {
    pools: BTreeMap<String, CachedUsage>,
}

#[derive(Debug)]
struct CachedUsage {
    usage: Arc<[MemberUsage]>,
    computed: Instant,
    /// The pool's identity and figures it was computed at.
    figures: ([u8; 16], u64, u64, u16),
    /// The pool's allocation may have changed since.
    stale: bool,
}

impl MemberUsageCache {
    /// Pool `name`'s member usage, recomputed if its allocation may have
    /// changed: at once when `at_once`, else when the last computation is
    /// [`MEMBER_USAGE_REFRESH`] old (until then the last one is returned).
    fn get(
        &mut self,
        name: &str,
        pool: &Pool<FileMedia>,
        info: &PoolInfo,
        at_once: bool,
    ) -> Arc<[MemberUsage]> {
        let figures = (
            info.uuid,
            info.allocated_bytes,
            info.capacity_bytes,
            info.members,
        );
        if let Some(cached) = self.pools.get_mut(name) {
            cached.stale |= cached.figures != figures;
            let due = at_once || cached.computed.elapsed() >= MEMBER_USAGE_REFRESH;
            if !(cached.stale && due) {
                return Arc::clone(&cached.usage);
            }
        }
        let usage: Arc<[MemberUsage]> = pool.member_usage().into();
        let cached = CachedUsage {
            usage: Arc::clone(&usage),
            computed: Instant::now(),
            figures,
            stale: false,
        };
        self.pools.insert(name.to_string(), cached);
        usage
    }

    /// Notes that I/O may have changed pool `name`'s allocation.
    fn mark_stale(&mut self, name: &str) {
        if let Some(cached) = self.pools.get_mut(name) {
            cached.stale = true;
        }
    }

    /// When the earliest usage held back is due, if any is.
    pub(super) fn refresh_due(&self) -> Option<Instant> {
        self.pools
            .values()
            .filter(|cached| cached.stale)
            .map(|cached| cached.computed + MEMBER_USAGE_REFRESH)
            .min()
    }

    /// The pools whose held-back usage is due now.
    fn due(&self) -> Vec<String> {
        let now = Instant::now();
        self.pools
            .iter()
            .filter(|(_, cached)| cached.stale && cached.computed + MEMBER_USAGE_REFRESH <= now)
            .map(|(name, _)| name.clone())
            .collect()
    }
}

impl Manager {
    /// Publishes everything anew (after an admin operation). If the desired
    /// state cannot be read, the last snapshot stays (and the error is logged).
    pub(super) fn publish(&mut self) {
        let records = match self.desired.pools() {
            Ok(records) => records,
            Err(error) => {
                log::error!("the node's status is not updated: {error}");
                return;
            }
        };
        let volume_records = self.volume_records();
        let mut pools = BTreeMap::new();
        for (name, pool) in &self.pools {
            let volumes = pool
                .volumes()
                .filter_map(|volume| {
                    let info = pool.volume_info(&volume.name).ok()?;
                    let record = volume_records.get(&volume.name)?;
                    let snapshot = VolumeSnapshot {
                        identity: super::ServedIdentity::of(&volume.name, &volume.id, record),
                        info,
                        hosts: record.hosts.iter().cloned().collect(),
                        qos: record.qos,
                        replication: record.replication.clone(),
                    };
                    Some((volume.name.clone(), Arc::new(snapshot)))
                })
                .collect();
            let info = pool.info();
            let tier_device = records.get(name).and_then(|r| r.write_tier.clone());
            let snapshot = PoolSnapshot {
                write_tier: tier_status(tier_device, pool),
                devices: records.get(name).map(|record| record.devices.clone()),
                encrypt: records.get(name).is_some_and(|record| record.encrypt),
                compression: records
                    .get(name)
                    .and_then(|record| record.compression.clone()),
                members: self.member_usage.get(name, pool, &info, true),
                info,
                failure: pool.failure().map(str::to_string),
                health: self.health.get(name).cloned().unwrap_or_default(),
                volumes,
            };
            pools.insert(name.clone(), Arc::new(snapshot));
        }
        self.member_usage
            .pools
            .retain(|name, _| self.pools.contains_key(name));
        self.published.store(NodeSnapshot { pools });
    }

    /// Publishes what a batch of I/O may have changed: the figures of its
    /// pools and volumes, and a failure a pool noticed.
    pub(super) fn publish_touched(&mut self, touched: &Touched) {
        let old = self.published.load();
        let mut pools = old.pools.clone();
        let mut changed = false;
        let mut failed = false;
        for (name, volumes) in &touched.pools {
            let (Some(pool), Some(previous)) = (self.pools.get(name), old.pools.get(name)) else {
                continue;
            };
            let failure = pool.failure().map(str::to_string);
            let device = previous.write_tier.as_ref().map(|t| t.device.clone());
            let write_tier = tier_status(device, pool);
            if volumes.is_empty()
                && failure == previous.failure
                && write_tier == previous.write_tier
            {
                continue;
            }
            let mut snapshot = PoolSnapshot::clone(previous);
            for volume in volumes {
                let (Some(before), Ok(info)) =
                    (previous.volumes.get(volume), pool.volume_info(volume))
                else {
                    continue;
                };
                let after = VolumeSnapshot {
                    identity: before.identity.clone(),
                    info,
                    hosts: before.hosts.clone(),
                    qos: before.qos,
                    replication: before.replication.clone(),
                };
                snapshot.volumes.insert(volume.clone(), Arc::new(after));
            }
            if !volumes.is_empty() {
                self.member_usage.mark_stale(name);
            }
            snapshot.info = pool.info();
            snapshot.members = self.member_usage.get(name, pool, &snapshot.info, false);
            failed |= failure != previous.failure;
            snapshot.failure = failure;
            snapshot.write_tier = write_tier;
            pools.insert(name.clone(), Arc::new(snapshot));
            changed = true;
        }
        if changed {
            let snapshot = NodeSnapshot { pools };
            // Only a pool's failure is news; allocation figures are not.
            if failed {
                self.published.store(snapshot);
            } else {
                self.published.refresh_figures(snapshot);
            }
        }
    }

    /// Publishes the member usage held back while I/O allocated, now due.
    pub(super) fn publish_member_usage(&mut self) {
        let due = self.member_usage.due();
        if due.is_empty() {
            return;
        }
        let old = self.published.load();
        let mut pools = old.pools.clone();
        for name in due {
            let (Some(pool), Some(previous)) = (self.pools.get(&name), old.pools.get(&name)) else {
                self.member_usage.pools.remove(&name);
                continue;
            };
            let mut snapshot = PoolSnapshot::clone(previous);
            snapshot.info = pool.info();
            snapshot.members = self.member_usage.get(&name, pool, &snapshot.info, true);
            pools.insert(name, Arc::new(snapshot));
        }
        self.published.refresh_figures(NodeSnapshot { pools });
    }
}

/// A pool's write tier as the status shows it (`device` as its record names it).
fn tier_status(device: Option<PathBuf>, pool: &Pool<FileMedia>) -> Option<WriteTierStatus> {
    Some(WriteTierStatus {
        device: device?,
        info: pool.tier_info()?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{idle_manager, pool_with_volume};
    use super::*;

    /// A batch's first write shows in the pool's and the volume's figures as
    /// soon as the batch is published; the member usage, costly to compute,
    /// follows once it is due.
    #[test]
    fn a_batch_publishes_its_figures_and_member_usage_follows_when_due() {
        let (desired, dir) = pool_with_volume("publish");
        let mut manager = idle_manager(desired);
        let before = manager.published.load();
        assert_eq!(before.pools["p"].info.allocated_bytes, 0);
        let pool = manager.pools.get_mut("p").unwrap();
        pool.prepare_write("v", 0, 4096).unwrap();
        pool.commit().unwrap();
        let touched = Touched {
            pools: [("p".to_string(), ["v".to_string()].into())].into(),
        };
        manager.publish_touched(&touched);
        let after = manager.published.load();
        let chunk = u64::from(after.pools["p"].info.chunk_bytes);
        assert_eq!(after.pools["p"].info.allocated_bytes, chunk);
        assert_eq!(after.pools["p"].volumes["v"].info.allocated_bytes, chunk);
        assert_eq!(after.pools["p"].volumes["v"].hosts, ["h"], "kept");
        assert_eq!(after.pools["p"].members[0].allocated_bytes, 0, "held back");
        let due = manager
            .member_usage
            .refresh_due()
            .expect("a refresh is due");
        assert!(due > Instant::now());
        // As if the second passed.
        manager.member_usage.pools.get_mut("p").unwrap().computed -= MEMBER_USAGE_REFRESH;
        manager.publish_member_usage();
        let later = manager.published.load();
        assert_eq!(later.pools["p"].members[0].allocated_bytes, chunk);
        assert_eq!(manager.member_usage.refresh_due(), None);
        // An admin operation's publication computes it at once.
        let pool = manager.pools.get_mut("p").unwrap();
        pool.prepare_write("v", 1 << 20, 4096).unwrap();
        pool.commit().unwrap();
        manager.publish();
        let now = manager.published.load();
        assert_eq!(now.pools["p"].members[0].allocated_bytes, 2 * chunk);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A batch of flushes that changed nothing publishes nothing.
    #[test]
    fn a_batch_that_changed_nothing_publishes_nothing() {
        let (desired, dir) = pool_with_volume("unchanged");
        let mut manager = idle_manager(desired);
        let before = manager.published.load();
        let touched = Touched {
            pools: [("p".to_string(), BTreeSet::new())].into(),
        };
        manager.publish_touched(&touched);
        assert!(Arc::ptr_eq(&before, &manager.published.load()));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
