//! Clones of an erasure-coded volume's snapshots. A clone is an
//! erasure-coded volume of the same layout on the same members: each
//! member that holds the snapshot makes its shard from its own shard of it
//! (its pool shares the allocation units), in sync from the start; a
//! member that does not hold it starts empty, faulted, and the clone's
//! primary rebuilds it from the others. Its record names the source
//! (`ReplicationRecord::cloned_from`) so that every member's node knows
//! how to make its shard.
//!
//! - Made through a node that holds the snapshot: that node is the
//!   clone's first primary. At least `k` members must hold it.
//! - Its size is the source's when the snapshot was taken (the source may
//!   have grown since: the snapshot's shards tell).
//!
//! What this does not do: copy data (the pools share it), or rebuild the
//! members that lack the snapshot (the clone's primary does).

use super::{AdminError, Manager};
use weft_control::{ReplicaRecord, ReplicaState, ReplicationRecord, SnapshotSource, VolumeRecord};
use weft_volume::VolumeError;

impl Manager {
    /// Clones snapshot `snapshot` of erasure-coded `volume` (`source` is
    /// its record) into the new volume `name`, this node its primary.
    pub(super) fn clone_erasure_coded(
        &mut self,
        volume: &str,
        snapshot: &str,
        name: &str,
        source: &ReplicationRecord,
    ) -> Result<(), AdminError> {
        let erasure = source.erasure.expect("an erasure-coded source");
        let me = self.cluster_node.clone().unwrap_or_default();
        let holders = clonable_holders(source, volume, snapshot, &me)?;
        let pool = source
            .member(&me)
            .expect("a holder is a member")
            .pool
            .clone();
        let size_bytes = self.snapshot_volume_bytes(&pool, volume, snapshot, source)?;
        let members = source
            .members
            .iter()
            .map(|m| ReplicaRecord {
                node: m.node.clone(),
                pool: m.pool.clone(),
                state: if holders.contains(&m.node) {
                    ReplicaState::InSync
                } else {
                    ReplicaState::Faulted { epoch: 0 }
                },
            })
            .collect();
        let replication = ReplicationRecord {
            epoch: 1,
            primary: me,
            members,
            size_bytes,
            block_size: source.block_size,
            thick: source.thick,
            encrypted: source.encrypted,
            move_to: None,
            previous: None,
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure: Some(erasure),
            cloned_from: Some(SnapshotSource {
                volume: volume.to_string(),
                snapshot: snapshot.to_string(),
            }),
        };
        let chosen = VolumeRecord {
            replication: Some(replication),
            ..VolumeRecord::default()
        };
        self.claimed(name, &pool, chosen, |manager| {
            Ok(manager
                .pool_mut(&pool)?
                .clone_volume(volume, snapshot, name)?)
        })
    }

    /// The size the source volume had when `snapshot` was taken: what
    /// this node's shard of it holds (never more than the volume now).
    fn snapshot_volume_bytes(
        &self,
        pool: &str,
        volume: &str,
        snapshot: &str,
        source: &ReplicationRecord,
    ) -> Result<u64, AdminError> {
        let erasure = source.erasure.expect("an erasure-coded source");
        let info = self.pools[pool].volume_info(volume)?;
        let shard_bytes = info
            .snapshots
            .iter()
            .find(|(taken, ..)| taken == snapshot)
            .map(|(.., size_bytes)| *size_bytes)
            .ok_or_else(|| VolumeError::NotFound {
                kind: "snapshot",
                name: format!("{volume}@{snapshot} on this node's member"),
            })?;
        let (geometry, journal) = crate::erasure::shape(source, &erasure)
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
        let stripes =
            shard_bytes.saturating_sub(journal.data_base()) / u64::from(erasure.chunk_bytes);
        Ok(source.size_bytes.min(stripes * geometry.stripe_bytes()))
    }
}

/// The nodes whose members hold `snapshot`, if a clone can be made from
/// it through node `me`.
fn clonable_holders(
    source: &ReplicationRecord,
    volume: &str,
    snapshot: &str,
    me: &str,
) -> Result<Vec<String>, AdminError> {
    let erasure = source.erasure.expect("an erasure-coded source");
    let listed = source
        .snapshot(snapshot)
        .ok_or_else(|| VolumeError::NotFound {
            kind: "snapshot",
            name: format!("{volume}@{snapshot}"),
        })?;
    if listed.taking {
        return Err(AdminError::Unavailable(format!(
            "snapshot {volume}@{snapshot} is still being taken (or its taking failed: delete it and take it again)"
        )));
    }
    let holders = source.holders(listed);
    let needed = erasure.data_shards as usize;
    if holders.len() < needed {
        return Err(AdminError::Invalid(format!(
            "snapshot {volume}@{snapshot} is held by {} members ({}), and {needed} are needed to read it: it cannot be cloned",
            holders.len(),
            holders.join(", ")
        )));
    }
    if !holders.iter().any(|h| h == me) {
        return Err(AdminError::Invalid(format!(
            "snapshot {volume}@{snapshot} is held by the members on {}, not on {me}: clone it through one of them (--node)",
            holders.join(", ")
        )));
    }
    Ok(holders)
}

#[cfg(test)]
mod tests {
    use super::super::claims::tests::{member, scratch};
    use super::*;
    use std::sync::Arc;
    use weft_control::{ErasureRecord, MemoryStore, Store, Txn};
    use weft_volume::VolumeSpec;

    /// A 2+1 record on n1, n2, n3, all in sync.
    fn erasure_coded(cloned_from: Option<SnapshotSource>) -> VolumeRecord {
        let members = ["n1", "n2", "n3"]
            .map(|node| ReplicaRecord {
                node: node.into(),
                pool: "p".into(),
                state: ReplicaState::InSync,
            })
            .to_vec();
        VolumeRecord {
            id: "ab".into(),
            replication: Some(ReplicationRecord {
                epoch: 1,
                primary: "n1".into(),
                members,
                size_bytes: 1 << 20,
                block_size: 4096,
                thick: false,
                encrypted: false,
                move_to: None,
                previous: None,
                retire: Vec::new(),
                snapshots: Vec::new(),
                erasure: Some(ErasureRecord {
                    data_shards: 2,
                    parity_shards: 1,
                    chunk_bytes: 65536,
                    journal_slots: 4,
                }),
                cloned_from,
            }),
            ..VolumeRecord::default()
        }
    }

    /// A clone acknowledged through n1 while n2 has not made its member
    /// yet, and the source snapshot deleted from the record meanwhile: n2
    /// keeps its copy of the snapshot until its member is made from it.
    #[test]
    fn a_snapshot_a_clone_member_is_owed_from_outlives_its_listing() {
        let dir = scratch("shard-clones");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n2 = member(&store, "n2", &dir);
        let shard = VolumeSpec {
            name: "ec".into(),
            size_bytes: 4 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: weft_volume::compression::Compression::None,
        };
        let pool = n2.pool_mut("p").unwrap();
        pool.create_volume(&shard).unwrap();
        pool.create_snapshot("ec", "s1").unwrap();
        let source = SnapshotSource {
            volume: "ec".into(),
            snapshot: "s1".into(),
        };
        let encode = weft_control::records::encode;
        let txn = Txn::new()
            .create("volumes/ec", encode(&erasure_coded(None)))
            .create("volumes/c1", encode(&erasure_coded(Some(source))));
        store.commit(txn).unwrap();
        let snapshots = |n: &Manager| n.pools["p"].volume_info("ec").unwrap().snapshots.len();

        n2.drop_stale_snapshots();
        assert_eq!(snapshots(&n2), 1, "owed to the clone's member");
        n2.create_missing_replicas();
        assert!(n2.pool_of("c1").is_ok(), "the member made from it");
        n2.drop_stale_snapshots();
        assert_eq!(snapshots(&n2), 0, "not listed, owed to nobody: gone");
    }
}
