//! Snapshots of replicated volumes, as the manager sees them. The volume
//! record lists them (`ReplicationRecord::snapshots`): the record is the
//! one word on which exist and which nodes' copies hold each.
//!
//! - Create (on the primary's node): the record announces it as being
//!   taken, then the volume's replicator takes it on every copy in sync at
//!   one point of the write stream (`crate::replication::snapshot`) and
//!   answers the caller once the record names the nodes that hold it.
//! - Delete: this node's copy first (where a clone of it refuses), then the
//!   record's entry; every other node deletes its copy when it reconciles.
//! - Reconcile: a copy's snapshot the record does not list (deleted, or a
//!   copy the record says does not hold it) is deleted.
//!
//! What this does not do: take snapshots of volumes of one copy (the
//! volume manager does, directly).

use super::{AdminError, Manager};
use crate::replication::barrier::BarrierOp;
use weft_control::{DesiredState, ReplicatedSnapshot, ReplicationRecord, StoreError, VolumeRecord};
use weft_volume::{check_name, FileMedia, Pool, VolumeError};

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

    /// Takes snapshot `name` of replicated `volume` on every copy in sync;
    /// the caller (`reply`) hears back from the volume's replicator.
    pub(super) fn create_replicated_snapshot(
        &mut self,
        volume: &str,
        name: &str,
        reply: std::sync::mpsc::Sender<Result<(), AdminError>>,
    ) -> Result<(), AdminError> {
        check_name("snapshot", name)?;
        let me = self.cluster_node.clone().unwrap_or_default();
        let not_serving = || {
            AdminError::Unavailable(format!(
                "volume {volume}: this node ({me}) does not serve it now (it fails over, or another node is its primary); try again in a moment"
            ))
        };
        if !self.replicators.get(volume).is_some_and(|r| r.is_running()) {
            return Err(not_serving());
        }
        let (volume_key, snapshot) = (format!("volumes/{volume}"), name.to_string());
        self.store_write(move |desired| announce(desired, &volume_key, &snapshot))?;
        match self.replicators.get(volume) {
            Some(replicator) => replicator.barrier(BarrierOp::Snapshot(name.to_string()), reply),
            None => {
                let _ = reply.send(Err(not_serving()));
            }
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
        if let Ok(pool) = self.pool_of(volume) {
            if self.has_local_snapshot(&pool, volume, name) {
                self.pool_mut(&pool)?.delete_snapshot(volume, name)?;
            }
        }
        let (key, snapshot) = (format!("volumes/{volume}"), name.to_string());
        self.store_write(move |desired| forget(desired, &key, &snapshot))?;
        log::info!("snapshot {volume}@{name} deleted (every copy's, as its node reconciles)");
        Ok(())
    }

    /// Deletes the snapshots of this node's replicated copies that the
    /// records no longer give them.
    pub(super) fn drop_stale_snapshots(&mut self) {
        let Some(me) = self.cluster_node.clone() else {
            return;
        };
        for (pool, volume, snapshot) in self.local_snapshots() {
            let Ok(Some(replication)) = self.replicated_record(&volume) else {
                continue;
            };
            if replication.member(&me).is_none() {
                continue; // the copy itself goes (drop_removed_replicas)
            }
            let kept = replication
                .snapshot(&snapshot)
                .is_some_and(|s| s.taking || s.nodes.contains(&me));
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
                    "snapshot {volume}@{snapshot}: deleted from the volume, but this node's copy cannot drop it yet: {error}"
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
            Some(s) if !s.nodes.contains(&me) => Err(AdminError::Invalid(format!(
                "snapshot {volume}@{snapshot} is held by the copies on {}, not on {me}: clone it on one of them (--node)",
                s.nodes.join(", ")
            ))),
            Some(_) => Ok(()),
        }
    }

    /// A replicated volume is deleted only once its record lists no
    /// snapshot; what its copy here still has then is stale (a taking that
    /// failed, a deletion not reconciled yet) and goes with it.
    pub(super) fn check_replicated_snapshots_gone(
        &mut self,
        volume: &str,
        pool: &str,
    ) -> Result<(), AdminError> {
        if !self.intents.contains_key(volume) {
            return Ok(()); // a volume of one copy: the pool checks
        }
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
            _ => self.drop_copy_snapshots(pool, volume),
        }
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
/// primary's word makes a replicated volume's snapshots.
pub(super) fn replica_snapshot(
    pool: &mut Pool<FileMedia>,
    volume: &str,
    name: &str,
) -> Result<(), VolumeError> {
    let info = pool.volume_info(volume)?;
    if info.snapshots.iter().any(|(taken, ..)| taken == name) {
        pool.delete_snapshot(volume, name)?;
    }
    pool.create_snapshot(volume, name)?;
    log::info!("snapshot {volume}@{name} taken for its primary");
    Ok(())
}

/// Adds snapshot `name` to the record at `key` as being taken (kept if
/// an earlier attempt left it so; refused if it was taken).
fn announce(desired: &DesiredState, key: &str, name: &str) -> Result<(), AdminError> {
    change_record(desired, key, |volume, snapshots| {
        match snapshots.iter().find(|s| s.name == name) {
            Some(s) if !s.taking => Err(VolumeError::Exists {
                kind: "snapshot",
                name: format!("{volume}@{name}"),
            }
            .into()),
            Some(_) => Ok(()),
            None => {
                snapshots.push(ReplicatedSnapshot {
                    name: name.to_string(),
                    nodes: Vec::new(),
                    taking: true,
                });
                Ok(())
            }
        }
    })
}

/// Drops snapshot `name` from the record at `key`.
fn forget(desired: &DesiredState, key: &str, name: &str) -> Result<(), AdminError> {
    change_record(desired, key, |_, snapshots| {
        snapshots.retain(|s| s.name != name);
        Ok(())
    })
}

/// Changes the snapshot list of the replicated volume at `key`.
pub(crate) fn change_record(
    desired: &DesiredState,
    key: &str,
    change: impl Fn(&str, &mut Vec<ReplicatedSnapshot>) -> Result<(), AdminError>,
) -> Result<(), AdminError> {
    let volume = key.trim_start_matches("volumes/");
    change_replication(desired, key, |replication| {
        change(volume, &mut replication.snapshots)
    })
}

/// Changes the replication record of the volume at `key`
/// (compare-and-swap, tried again while others change the record).
pub(crate) fn change_replication(
    desired: &DesiredState,
    key: &str,
    change: impl Fn(&mut ReplicationRecord) -> Result<(), AdminError>,
) -> Result<(), AdminError> {
    let volume = key.trim_start_matches("volumes/");
    loop {
        let found = desired
            .read::<VolumeRecord>(key)?
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} was deleted")))?;
        let mut record = found.record;
        let replication = record
            .replication
            .as_mut()
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} is not replicated")))?;
        change(replication)?;
        match desired.update(key, &record, found.revision) {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
}
