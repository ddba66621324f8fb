//! Snapshots of replicated volumes, as the manager sees them. The volume
//! record lists them (`ReplicationRecord::snapshots`): the record is the
//! one word on which exist and which nodes' copies hold each.
//!
//! - Create (on the primary's node): the volume's replicator announces it
//!   in the record as being taken, takes it on every copy in sync at one
//!   point of the write stream (`crate::replication::barrier`) and answers
//!   the caller once the record names the nodes that hold it.
//! - Delete: the record's entry first, then this node's copy; every other
//!   node deletes its copy's when it reconciles. Clones made from it keep
//!   their data (the pool shares allocation units).
//! - Reconcile: a copy's snapshot the record does not give it (deleted, or
//!   a copy the record says does not hold it) is deleted; except one taken
//!   for a primary a moment ago that this node has not seen listed yet (the
//!   command can outrun the store's announcement), for up to 30 s.
//!
//! What this does not do: take snapshots of volumes of one copy (the
//! volume manager does, directly).

use super::{AdminError, Manager};
use crate::replication::barrier::BarrierOp;
use crate::replication::records::change_record;
use std::time::Duration;
use weft_control::{DesiredState, ReplicaState, VolumeRecord};
use weft_volume::{check_name, FileMedia, Pool, VolumeError};

/// How long a snapshot taken for a primary is kept while this node's copy
/// of the store does not list it yet.
const FRESH_SNAPSHOT_GRACE: Duration = Duration::from_secs(30);

impl Manager {
    /// The record of `volume` if it is replicated.
    pub(super) fn replicated_record(
        &self,
        volume: &str,
    ) -> Result<Option<weft_control::ReplicationRecord>, AdminError> {
        let found = self
            .desired
            .read::<VolumeRecord>(&format!("volumes/{volume}"))?;
        Ok(found.and_then(|found| found.record.replication))
    }

    /// Whether `volume` is erasure-coded and this node one of its members
    /// (its local copy a shard).
    pub(super) fn is_erasure_coded(&self, volume: &str) -> bool {
        let me = self.cluster_node.as_deref().unwrap_or_default();
        matches!(self.replicated_record(volume), Ok(Some(r)) if r.erasure.is_some() && r.member(me).is_some())
    }

    /// Takes snapshot `name` of replicated `volume` on every copy in sync;
    /// the caller (`reply`) hears back from the volume's replicator.
    pub(super) fn create_replicated_snapshot(
        &mut self,
        volume: &str,
        name: &str,
        reply: std::sync::mpsc::Sender<Result<(), AdminError>>,
    ) -> Result<(), AdminError> {
        check_name("snapshot", name)?;
        let op = BarrierOp::Snapshot(name.to_string());
        match self.erasures.get(volume).filter(|e| e.is_running()) {
            Some(erasure) => erasure.barrier(op, reply),
            None => self.serving_replicator(volume)?.barrier(op, reply),
        }
        Ok(())
    }

    /// Deletes snapshot `name` of replicated `volume`: this node's copy
    /// now, the others' when they reconcile.
    pub(super) fn delete_replicated_snapshot(
        &mut self,
        volume: &str,
        name: &str,
    ) -> Result<(), AdminError> {
        let replication = self
            .replicated_record(volume)?
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} is not replicated")))?;
        if replication.snapshot(name).is_none() {
            return Err(VolumeError::NotFound {
                kind: "snapshot",
                name: format!("{volume}@{name}"),
            }
            .into());
        }
        let taking = self
            .replicators
            .get(volume)
            .and_then(|r| r.snapshot_taken());
        if taking.as_deref() == Some(name) {
            return Err(AdminError::Unavailable(format!(
                "snapshot {volume}@{name} is being taken; delete it once that is done"
            )));
        }
        let (key, snapshot) = (format!("volumes/{volume}"), name.to_string());
        self.store_write(move |desired| forget(desired, &key, &snapshot))?;
        if let Ok(pool) = self.pool_of(volume) {
            if self.has_local_snapshot(&pool, volume, name) && !self.needed_by_a_clone(volume, name)
            {
                if let Err(error) = self.pool_mut(&pool)?.delete_snapshot(volume, name) {
                    log::warn!("snapshot {volume}@{name}: this node's copy is deleted at its next reconcile: {error}");
                }
            }
        }
        log::info!("snapshot {volume}@{name} deleted (every copy's, as its node reconciles)");
        Ok(())
    }

    /// The running replicator of `volume` (this node is its primary and
    /// serves it), or why not.
    pub(super) fn serving_replicator(
        &self,
        volume: &str,
    ) -> Result<&crate::replication::replicator::ReplicatorHandle, AdminError> {
        self.replicators
            .get(volume)
            .filter(|r| r.is_running())
            .ok_or_else(|| {
                let me = self.cluster_node.clone().unwrap_or_default();
                AdminError::Unavailable(format!(
                    "volume {volume}: this node ({me}) does not serve it now (it fails over, or another node is its primary); try again in a moment"
                ))
            })
    }

    /// Deletes the snapshots of this node's replicated copies that the
    /// records no longer give them.
    pub(super) fn drop_stale_snapshots(&mut self) {
        let Some(me) = self.cluster_node.clone() else {
            return;
        };
        self.fresh_snapshots
            .retain(|_, taken| taken.elapsed() < FRESH_SNAPSHOT_GRACE);
        for (pool, volume, snapshot) in self.local_snapshots() {
            let Ok(Some(replication)) = self.replicated_record(&volume) else {
                continue;
            };
            if replication.member(&me).is_none() {
                continue; // the copy itself goes (drop_removed_replicas)
            }
            let fresh = (volume.clone(), snapshot.clone());
            let kept = match replication.snapshot(&snapshot) {
                Some(listed) => {
                    // Seen listed: from now on the record alone decides.
                    self.fresh_snapshots.remove(&fresh);
                    listed.taking || replication.holders(listed).contains(&me)
                }
                None => {
                    self.fresh_snapshots.contains_key(&fresh)
                        || self.needed_by_a_clone(&volume, &snapshot)
                }
            };
            if kept {
                continue;
            }
            match self
                .pool_mut(&pool)
                .and_then(|p| Ok(p.delete_snapshot(&volume, &snapshot)?))
            {
                Ok(()) => log::info!(
                    "snapshot {volume}@{snapshot}: deleted from this node's copy (the volume's record does not give it to this copy)"
                ),
                Err(error) => log::warn!(
                    "snapshot {volume}@{snapshot}: not given to this node's copy by the volume's record, but it cannot be deleted yet: {error}"
                ),
            }
        }
    }

    /// A clone of `volume@snapshot` is made from this node's copy: if the
    /// volume is replicated, that copy must hold the snapshot, as the
    /// record says (the clone is a volume of one copy, on this node).
    pub(super) fn check_replicated_clone(
        &self,
        volume: &str,
        snapshot: &str,
    ) -> Result<(), AdminError> {
        let Some(replication) = self.replicated_record(volume)? else {
            return Ok(());
        };
        let me = self.cluster_node.clone().unwrap_or_default();
        match replication.snapshot(snapshot) {
            None => Err(VolumeError::NotFound {
                kind: "snapshot",
                name: format!("{volume}@{snapshot}"),
            }
            .into()),
            Some(s) if s.taking => Err(AdminError::Unavailable(format!(
                "snapshot {volume}@{snapshot} is still being taken (or its taking failed: delete it and take it again)"
            ))),
            Some(s) if !replication.holders(s).contains(&me) => Err(AdminError::Invalid(format!(
                "snapshot {volume}@{snapshot} is held by the copies on {}, not on {me}: clone it on one of them (--node)",
                replication.holders(s).join(", ")
            ))),
            Some(_) => Ok(()),
        }
    }

    /// Refuses to delete replicated `volume` while its record lists
    /// snapshots (none for a volume of one copy: its pool checks).
    pub(super) fn check_no_replicated_snapshots(&self, volume: &str) -> Result<(), AdminError> {
        match self.replicated_record(volume)? {
            Some(replication) if !replication.snapshots.is_empty() => {
                let names: Vec<&str> = replication
                    .snapshots
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect();
                Err(VolumeError::HasSnapshots {
                    volume: volume.to_string(),
                    snapshots: names.join(", "),
                }
                .into())
            }
            _ => Ok(()),
        }
    }

    /// Before a replicated copy or an erasure-coded shard is deleted (its
    /// record lists no snapshot, or is gone): the snapshots it still has
    /// are stale (a taking that failed, a deletion not reconciled yet) and
    /// go first. A copy is known for replicated by its write intent; a
    /// shard by its record, or in a cluster by its record's absence (the
    /// primary's node deletes the record before the members' shards; a
    /// volume of one copy always has its record there).
    pub(super) fn drop_stale_copy_snapshots(
        &mut self,
        volume: &str,
        pool: &str,
    ) -> Result<(), AdminError> {
        let key = format!("volumes/{volume}");
        let orphan = self.cluster_node.is_some()
            && matches!(self.desired.read::<VolumeRecord>(&key), Ok(None));
        if self.intents.contains_key(volume) || orphan || self.is_erasure_coded(volume) {
            let names = self.pools[pool].volume_info(volume)?.snapshots;
            if let Some((owed, ..)) = names
                .iter()
                .find(|(n, ..)| self.needed_by_a_clone(volume, n))
            {
                return Err(AdminError::Unavailable(format!(
                    "volume {volume}: this node's copy of snapshot {owed} is still to make a member of a clone from; try again in a moment"
                )));
            }
            self.drop_copy_snapshots(pool, volume)?;
        }
        Ok(())
    }

    /// Deletes every snapshot of a copy about to be discarded.
    pub(super) fn drop_copy_snapshots(
        &mut self,
        pool: &str,
        volume: &str,
    ) -> Result<(), AdminError> {
        let names: Vec<String> = self.pools[pool]
            .volume_info(volume)?
            .snapshots
            .into_iter()
            .map(|(name, ..)| name)
            .collect();
        for name in names {
            self.pool_mut(pool)?.delete_snapshot(volume, &name)?;
        }
        Ok(())
    }

    /// Whether this node's copy of `volume@snapshot` is still to make a
    /// member of an erasure-coded clone from (one its record gives this
    /// node in sync, not made yet): the snapshot outlives its listing until
    /// then.
    pub(super) fn needed_by_a_clone(&self, volume: &str, snapshot: &str) -> bool {
        let Some(me) = self.cluster_node.as_deref() else {
            return false;
        };
        let Ok(records) = self.desired.volumes() else {
            return true; // Unknown now: the next reconcile decides.
        };
        records.into_iter().any(|(name, record)| {
            let Some(replication) = record.replication else {
                return false;
            };
            let from_it = replication
                .cloned_from
                .as_ref()
                .is_some_and(|s| s.volume == volume && s.snapshot == snapshot);
            let owed = replication
                .member(me)
                .is_some_and(|m| m.state == ReplicaState::InSync);
            from_it && owed && self.pool_of(&name).is_err()
        })
    }

    fn has_local_snapshot(&self, pool: &str, volume: &str, name: &str) -> bool {
        self.pools[pool]
            .volume_info(volume)
            .is_ok_and(|info| info.snapshots.iter().any(|(n, ..)| n == name))
    }

    /// Every snapshot of every local volume: (pool, volume, snapshot).
    fn local_snapshots(&self) -> Vec<(String, String, String)> {
        let mut found = Vec::new();
        for (pool, p) in &self.pools {
            for volume in p.volumes() {
                let Ok(info) = p.volume_info(&volume.name) else {
                    continue;
                };
                for (snapshot, ..) in info.snapshots {
                    found.push((pool.clone(), volume.name.clone(), snapshot));
                }
            }
        }
        found
    }
}

/// A replica's snapshot, as its primary asks (`weft_proto::intent`): one
/// of that name left by an attempt that failed is replaced, since only the
/// primary's word makes a replicated volume's snapshots. The pool is
/// flushed first: a snapshot holds every write acknowledged before it,
/// through a power loss too (no rebuild repairs a snapshot).
pub(super) fn replica_snapshot(
    pool: &mut Pool<FileMedia>,
    volume: &str,
    name: &str,
) -> Result<(), VolumeError> {
    pool.flush()?;
    let info = pool.volume_info(volume)?;
    if info.snapshots.iter().any(|(taken, ..)| taken == name) {
        pool.delete_snapshot(volume, name)?;
    }
    pool.create_snapshot(volume, name)?;
    log::info!("snapshot {volume}@{name} taken for its primary");
    Ok(())
}

/// Drops snapshot `name` from the record at `key`.
fn forget(desired: &DesiredState, key: &str, name: &str) -> Result<(), AdminError> {
    change_record(desired, key, |_, snapshots| {
        snapshots.retain(|s| s.name != name);
        Ok(())
    })
}
