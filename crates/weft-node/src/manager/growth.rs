//! Growing a replicated volume. Its primary's replicator grows every copy
//! in sync at one point of the write stream (`crate::replication::barrier`),
//! then records the new size; it then serves again under the next epoch,
//! with the new size. Every other copy (out of sync, or on a node that was
//! down) grows when its node reconciles with the record.
//!
//! An erasure-coded volume grows the same way: its primary grows every
//! member's shard in sync at one point of its write stream
//! (`crate::erasure`), records the new size, and the next primary serves
//! it; shards out of sync grow when their nodes reconcile.
//!
//! What this does not do: shrink (no volume does).

use super::{AdminError, Manager};
use crate::replication::barrier::BarrierOp;
use std::sync::mpsc::Sender;
use weft_volume::VolumeError;

impl Manager {
    /// Grows replicated `volume` to `size_bytes`; `reply` hears back from
    /// its replicator once every copy in sync grew and the record says so.
    pub(super) fn grow_replicated(
        &mut self,
        volume: &str,
        size_bytes: u64,
        reply: Sender<Result<(), AdminError>>,
    ) -> Result<(), AdminError> {
        let replication = self
            .replicated_record(volume)?
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} is not replicated")))?;
        let current = replication.size_bytes;
        super::intents::check_replicated_size(volume, size_bytes)?;
        if size_bytes < current {
            return Err(VolumeError::invalid(
                format!("size {size_bytes} for volume {volume}"),
                format!("volumes only grow (it is {current} bytes); shrinking would drop data — clone into a smaller volume instead"),
            )
            .into());
        }
        if !size_bytes.is_multiple_of(u64::from(replication.block_size)) {
            return Err(VolumeError::invalid(
                format!("size {size_bytes} for volume {volume}"),
                format!(
                    "give a multiple of its {}-byte blocks",
                    replication.block_size
                ),
            )
            .into());
        }
        if size_bytes == current {
            let _ = reply.send(Ok(()));
            return Ok(());
        }
        let op = BarrierOp::Grow(size_bytes);
        let erasure = self.erasures.get(volume).filter(|e| e.is_running());
        match self.replicators.get(volume).filter(|r| r.is_running()) {
            Some(replicator) => replicator.barrier(op, reply),
            None if erasure.is_some() => erasure.expect("checked").barrier(op, reply),
            None => {
                let me = self.cluster_node.clone().unwrap_or_default();
                return Err(AdminError::Unavailable(format!(
                    "volume {volume}: this node ({me}) does not serve it now (it fails over, or another node is its primary); try again in a moment"
                )));
            }
        }
        Ok(())
    }

    /// Grows this node's copies of replicated volumes, and its shards of
    /// erasure-coded ones, to their records' size (those out of sync when
    /// their primary grew the volume).
    pub(super) fn grow_copies_to_records(&mut self) {
        let copies: Vec<(String, String, u64)> = self
            .pools
            .iter()
            .flat_map(|(pool, p)| {
                p.volumes()
                    .map(move |v| (pool.clone(), v.name.clone(), v.size_bytes))
            })
            .collect();
        for (pool, volume, size_bytes) in copies {
            let Ok(Some(replication)) = self.replicated_record(&volume) else {
                continue;
            };
            let me = self.cluster_node.as_deref().unwrap_or_default();
            let wanted = match &replication.erasure {
                Some(_) if replication.member(me).is_none() => None,
                Some(erasure) => crate::erasure::shard_bytes(&replication, erasure),
                None if self.intents.contains_key(&volume) => Some(replication.size_bytes),
                None => None,
            };
            if let Some(wanted) = wanted.filter(|&wanted| wanted > size_bytes) {
                let _ = self.grow_copy(&pool, &volume, wanted);
            }
        }
    }

    /// Grows this node's copy of a replicated volume to `size_bytes` (as
    /// its primary asks, or its record says) and its write intent with it;
    /// the caller updates the exports. The pool is flushed first: the
    /// primary faults the replicas that did not grow, and may be left the
    /// only copy in sync, which must then hold every acknowledged write
    /// through a power loss (as the core's flush before it is left alone).
    pub(super) fn grow_copy(
        &mut self,
        pool: &str,
        volume: &str,
        size_bytes: u64,
    ) -> Result<(), weft_proto::IoError> {
        if size_bytes > super::intents::REPLICATED_SIZE_MAX_BYTES {
            log::warn!("volume {volume}: refused to grow this node's copy to {size_bytes} bytes: more than a replicated volume can hold");
            return Err(weft_proto::IoError::Other);
        }
        let grown = self.pool_mut(pool).and_then(|p| {
            let current = p.volume_info(volume)?.size_bytes;
            if size_bytes > current {
                p.flush()?;
                p.resize_volume(volume, size_bytes)?;
            }
            Ok(current)
        });
        let current = grown.map_err(|error| {
            log::warn!(
                "volume {volume}: this node's copy not grown to {size_bytes} bytes: {error}"
            );
            weft_proto::IoError::Other
        })?;
        // A shard of an erasure-coded volume has no intent (its primary
        // rebuilds a member that was out).
        if !self.is_erasure_coded(volume) {
            let dir = self.cluster_dir.clone();
            super::intents::intent_of(&mut self.intents, dir.as_deref(), volume, size_bytes);
        }
        if size_bytes > current {
            log::info!("volume {volume}: this node's copy grown to {size_bytes} bytes");
        }
        Ok(())
    }
}
