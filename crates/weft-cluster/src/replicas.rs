//! Replicated volumes in the cluster: the volume record's replication part
//! as the replication core sees it (a `ReplicaSet`, nodes numbered by their
//! position in the record's member list), and the controller's duty of
//! promoting a new primary when a primary's node has been down for the
//! promotion delay (`weft_replication::controller::promote`, committed by
//! compare-and-swap on the volume record while holding the controller key).
//! An in-sync replica that has not heard its primary for a read grant takes
//! over itself ([`take_over`], by compare-and-swap too), without waiting for
//! the primary's lease or for a controller (the primary's node may have
//! been the controller).
//!
//! What this does not do: serve, fence or copy anything (the primary's
//! replicator in `weft-node` does).

use crate::election;
use crate::nodes::{self, NodeView};
use std::collections::BTreeMap;
use weft_control::records::{encode, read};
use weft_control::{
    LeaseId, ReplicaRecord, ReplicaState, ReplicationRecord, Store, StoreError, Txn, VolumeRecord,
};
use weft_replication::{Epoch, Member, MemberState, NodeId, ReplicaSet};

/// The volume records' key prefix.
const VOLUMES: &str = "volumes/";

/// The record's replica set: node `i` is the record's member `i`.
pub fn replica_set(record: &ReplicationRecord) -> ReplicaSet {
    let id = |name: &str| node_id(record, name).expect("a member");
    ReplicaSet {
        epoch: Epoch(record.epoch),
        primary: id(&record.primary),
        members: record
            .members
            .iter()
            .enumerate()
            .map(|(index, member)| Member {
                node: NodeId(index as u16),
                state: match member.state {
                    ReplicaState::InSync => MemberState::InSync,
                    ReplicaState::Faulted { epoch } => MemberState::Faulted {
                        epoch: Epoch(epoch),
                    },
                },
            })
            .collect(),
        move_to: record.move_to.as_deref().and_then(|n| node_id(record, n)),
        previous: record.previous.as_deref().and_then(|n| node_id(record, n)),
        retire: record
            .retire
            .iter()
            .filter_map(|n| node_id(record, n))
            .collect(),
    }
}

/// `record` changed as `set` says (its members, or some of them, in order).
pub fn with_replica_set(record: &ReplicationRecord, set: &ReplicaSet) -> ReplicationRecord {
    let name = |n: NodeId| node_name(record, n).to_string();
    let mut next = record.clone();
    next.epoch = set.epoch.0;
    next.primary = name(set.primary);
    next.move_to = set.move_to.map(name);
    next.previous = set.previous.map(name);
    next.retire = set.retire.iter().map(|&n| name(n)).collect();
    next.members = set
        .members
        .iter()
        .map(|member| ReplicaRecord {
            state: match member.state {
                MemberState::InSync => ReplicaState::InSync,
                MemberState::Faulted { epoch } => ReplicaState::Faulted { epoch: epoch.0 },
            },
            ..record.members[usize::from(member.node.0)].clone()
        })
        .collect();
    next
}

/// The replication core's id of node `name`.
pub fn node_id(record: &ReplicationRecord, name: &str) -> Option<NodeId> {
    let index = record.members.iter().position(|m| m.node == name)?;
    Some(NodeId(index as u16))
}

/// The name of the replication core's node `id`.
pub fn node_name(record: &ReplicationRecord, id: NodeId) -> &str {
    &record.members[usize::from(id.0)].node
}

/// The controller's duty: for every replicated volume whose primary's node
/// has been down for `delay_ms`, promote an in-sync replica on a live node.
/// Does nothing unless `lease` holds the controller key, in the same
/// transaction as each change. The volumes promoted.
pub fn promote_primaries(
    store: &dyn Store,
    lease: LeaseId,
    now_unix_ms: u64,
    delay_ms: u64,
) -> Result<Vec<String>, StoreError> {
    let Some(held) = election::held_at(store, lease)? else {
        return Ok(Vec::new());
    };
    let nodes = nodes::list(store)?;
    let mut promoted = Vec::new();
    for entry in store.list(VOLUMES)?.entries {
        let name = entry.key[VOLUMES.len()..].to_string();
        let Some(found) = read::<VolumeRecord>(store, &entry.key)? else {
            continue;
        };
        let Some(replication) = &found.record.replication else {
            continue;
        };
        let Some(next) = promotion(replication, &nodes, now_unix_ms, delay_ms) else {
            continue;
        };
        let mut record = found.record.clone();
        record.replication = Some(next.clone());
        let txn = Txn::new().require(election::holds(held)).update(
            entry.key.clone(),
            encode(&record),
            found.revision,
        );
        match store.commit(txn) {
            Ok(_) => {
                log::warn!(
                    "volume {name}: primary {} is down; {} is primary of epoch {}",
                    replication.primary,
                    next.primary,
                    next.epoch
                );
                promoted.push(name);
            }
            // Changed meanwhile, or no longer the controller: next time.
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(promoted)
}

/// The record after replica `me` takes over from its primary, which it has
/// not heard for a read grant (`weft_proto::fence::Fences::holder_silent`):
/// the next epoch, `me` primary, the old primary faulted, as a promotion
/// makes it. None unless the volume is mirrored (an erasure-coded primary
/// asks no grants) and `me` is an in-sync replica that is not primary nor
/// being retired (the operator's removal stands: the lease's end promotes
/// another).
/// Safe without the primary's lease ending: the primary serves reads only
/// while every in-sync replica grants them, and `me` no longer does (nor
/// does any replica the new primary fences: each waits out its grant).
pub fn take_over(record: &ReplicationRecord, me: &str) -> Option<ReplicationRecord> {
    if record.erasure.is_some() || record.primary == me || record.retire.iter().any(|r| r == me) {
        return None;
    }
    let set = replica_set(record);
    let me = node_id(record, me)?;
    let next = weft_replication::controller::promote(&set, |node| node == me)?;
    Some(with_replica_set(record, &next))
}

/// Why a planned move of a primary was refused.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// No such volume.
    #[error("volume {0} does not exist")]
    NotFound(String),
    /// A volume of one copy.
    #[error("volume {0} has one copy: it has no primary to move")]
    NotReplicated(String),
    /// The target holds no replica.
    #[error("node {to} holds no replica of {volume} (its replicas are on {members})")]
    NotAMember {
        /// The volume.
        volume: String,
        /// The node asked for.
        to: String,
        /// The nodes that hold one.
        members: String,
    },
    /// The target's replica is not in sync (being rebuilt).
    #[error("the replica of {volume} on {to} is not in sync (it is being rebuilt)")]
    NotInSync {
        /// The volume.
        volume: String,
        /// The node asked for.
        to: String,
    },
    /// The target's node is down.
    #[error("node {0} is down")]
    TargetDown(String),
    /// No replica can take over.
    #[error("no in-sync replica of {0} is on another node that is up")]
    NoTarget(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Where a planned move stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveOutcome {
    /// The target is primary.
    Done,
    /// The primary has not handed over yet.
    Pending,
    /// The primary dropped the move (the target did not answer, or fell
    /// out of sync), or another primary took over meanwhile: who is primary now.
    Dropped(String),
}

/// Asks the primary of `volume` to hand its role to `to` (or, if none, to
/// the in-sync replica on an up node, uncordoned ones first): sets the
/// record's `move_to` by compare-and-swap; the primary drains and hands
/// over itself. The target, and whether it is primary already.
pub fn request_move(
    store: &dyn Store,
    volume: &str,
    to: Option<&str>,
) -> Result<(String, bool), MoveError> {
    let key = format!("{VOLUMES}{volume}");
    let found = read::<VolumeRecord>(store, &key)?
        .ok_or_else(|| MoveError::NotFound(volume.to_string()))?;
    let mut record = found.record;
    let replication = record
        .replication
        .as_mut()
        .ok_or_else(|| MoveError::NotReplicated(volume.to_string()))?;
    let nodes = nodes::list(store)?;
    let up = |name: &str| nodes.get(name).is_some_and(NodeView::is_alive);
    let target = match to {
        Some(to) => {
            let member = replication
                .member(to)
                .ok_or_else(|| MoveError::NotAMember {
                    volume: volume.to_string(),
                    to: to.to_string(),
                    members: replication
                        .members
                        .iter()
                        .map(|m| m.node.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            if member.state != ReplicaState::InSync {
                return Err(MoveError::NotInSync {
                    volume: volume.to_string(),
                    to: to.to_string(),
                });
            }
            if !up(to) {
                return Err(MoveError::TargetDown(to.to_string()));
            }
            to.to_string()
        }
        None => {
            let cordoned = |name: &str| nodes.get(name).is_some_and(|n| n.member.cordoned);
            let mut candidates: Vec<&str> = replication
                .members
                .iter()
                .filter(|m| m.node != replication.primary && m.state == ReplicaState::InSync)
                .map(|m| m.node.as_str())
                .filter(|name| up(name))
                .collect();
            candidates.sort_by_key(|name| cordoned(name));
            let first = candidates
                .first()
                .ok_or_else(|| MoveError::NoTarget(volume.to_string()))?;
            first.to_string()
        }
    };
    if replication.primary == target {
        return Ok((target, true));
    }
    replication.move_to = Some(target.clone());
    let txn = Txn::new().update(key, encode(&record), found.revision);
    store.commit(txn)?;
    Ok((target, false))
}

/// Where the move of `volume`'s primary to `to` stands.
pub fn move_outcome(store: &dyn Store, volume: &str, to: &str) -> Result<MoveOutcome, MoveError> {
    let found = read::<VolumeRecord>(store, &format!("{VOLUMES}{volume}"))?
        .ok_or_else(|| MoveError::NotFound(volume.to_string()))?;
    let replication = found
        .record
        .replication
        .ok_or_else(|| MoveError::NotReplicated(volume.to_string()))?;
    Ok(if replication.primary == to {
        MoveOutcome::Done
    } else if replication.move_to.as_deref() == Some(to) {
        MoveOutcome::Pending
    } else {
        MoveOutcome::Dropped(replication.primary)
    })
}

/// The replicated volumes whose primary is on `node`.
pub fn primaries_on(store: &dyn Store, node: &str) -> Result<Vec<String>, StoreError> {
    Ok(replicated_volumes(store)?
        .into_iter()
        .filter(|(_, replication)| replication.primary == node)
        .map(|(volume, _)| volume)
        .collect())
}

/// Every replicated volume's name and replication record, from one listing
/// (its values decoded: no read per volume).
pub(crate) fn replicated_volumes(
    store: &dyn Store,
) -> Result<Vec<(String, ReplicationRecord)>, StoreError> {
    let mut volumes = Vec::new();
    for entry in store.list(VOLUMES)?.entries {
        let Ok(record) = serde_json::from_value::<VolumeRecord>(entry.value) else {
            continue;
        };
        if let Some(replication) = record.replication {
            volumes.push((entry.key[VOLUMES.len()..].to_string(), replication));
        }
    }
    Ok(volumes)
}

/// After a power loss (writes this node acknowledged since its last flush
/// may be gone, anywhere): takes `node` out of the in-sync set of `volume`
/// before the node joins the cluster again, so that nobody promotes it or
/// counts on its copy (the simulation's rule, `weft-sim`'s node). If it is
/// the primary, the role goes to the previous primary when this node never
/// served the epoch (`served_epoch` is the last it did) and that one held
/// every write; else to another in-sync replica; with none, this copy is all
/// there is and stays. Whether the record changed.
pub fn leave_in_sync_set(
    store: &dyn Store,
    volume: &str,
    node: &str,
    served_epoch: u64,
) -> Result<bool, StoreError> {
    let key = format!("{VOLUMES}{volume}");
    for _ in 0..CAS_ATTEMPTS {
        let Some(found) = read::<VolumeRecord>(store, &key)? else {
            return Ok(false);
        };
        let Some(replication) = &found.record.replication else {
            return Ok(false);
        };
        let Some(me) = node_id(replication, node) else {
            return Ok(false);
        };
        let set = replica_set(replication);
        if !set.is_in_sync(me) {
            return Ok(false);
        }
        let Some(next) = without_unclean(&set, me, served_epoch) else {
            return Ok(false);
        };
        let mut record = found.record.clone();
        record.replication = Some(with_replica_set(replication, &next));
        let txn = Txn::new().update(key.clone(), encode(&record), found.revision);
        match store.commit(txn) {
            Ok(_) => {
                log::warn!(
                    "volume {volume}: this node may have lost power: its replica left the in-sync set (primary {}, epoch {})",
                    node_name(replication, next.primary),
                    next.epoch.0
                );
                return Ok(true);
            }
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
    Err(StoreError::Conflict { key })
}

/// Compare-and-swap attempts before giving up on a busy record.
pub(crate) const CAS_ATTEMPTS: usize = 5;

/// The replica set without unclean node `me` in sync (none: `me` is the
/// only copy in sync, which carries on with what it has).
fn without_unclean(set: &ReplicaSet, me: NodeId, served_epoch: u64) -> Option<ReplicaSet> {
    let mut next = set.clone();
    if set.primary == me {
        let never_served = served_epoch < set.epoch.0;
        // The previous primary holds every acknowledged write if it was in
        // sync until this epoch (faulted only by the promotion).
        let complete = |p: NodeId| {
            set.is_in_sync(p) || set.state_of(p) == Some(MemberState::Faulted { epoch: set.epoch })
        };
        let previous = set
            .previous
            .filter(|&p| never_served && p != me && complete(p));
        let other = previous.or_else(|| set.in_sync_secondaries().next())?;
        next.epoch = set.epoch.next();
        next.primary = other;
        next.previous = Some(me);
        next.move_to = None;
        next.retire.retain(|&n| n != other);
        next.set_state(other, MemberState::InSync);
    }
    next.set_state(me, MemberState::Faulted { epoch: next.epoch });
    Some(next)
}

/// The record after a promotion, if one is due.
fn promotion(
    record: &ReplicationRecord,
    nodes: &BTreeMap<String, NodeView>,
    now_unix_ms: u64,
    delay_ms: u64,
) -> Option<ReplicationRecord> {
    let down_long_enough = |name: &str| {
        nodes.get(name).is_none_or(|view| {
            !view.is_alive()
                && view
                    .member
                    .down_since_unix_ms
                    .is_some_and(|since| now_unix_ms >= since + delay_ms)
        })
    };
    if !down_long_enough(&record.primary) {
        return None;
    }
    let set = replica_set(record);
    let up = |id: NodeId| {
        let name = node_name(record, id);
        name != record.primary && nodes.get(name).is_some_and(NodeView::is_alive)
    };
    // An erasure-coded volume's old primary keeps its member in sync: it
    // holds a shard, not a copy another can do without (`weft_ec::controller`).
    let next = match record.erasure {
        Some(_) => weft_ec::controller::promote(&set, up)?,
        None => weft_replication::controller::promote(&set, up)?,
    };
    Some(with_replica_set(record, &next))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::ReplicaRecord;

    fn record() -> ReplicationRecord {
        ReplicationRecord {
            epoch: 3,
            primary: "n2".into(),
            members: ["n1", "n2", "n3"]
                .iter()
                .map(|node| ReplicaRecord {
                    node: node.to_string(),
                    pool: "p".into(),
                    state: ReplicaState::InSync,
                })
                .collect(),
            size_bytes: 1 << 30,
            block_size: 4096,
            thick: false,
            encrypted: false,
            move_to: None,
            previous: Some("n1".into()),
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure: None,
            cloned_from: None,
        }
    }

    #[test]
    fn an_unclean_node_leaves_the_in_sync_set_and_gives_back_a_never_served_primary_role() {
        let set = replica_set(&record());
        // A secondary: faulted, under the same epoch.
        let next = without_unclean(&set, NodeId(2), 0).unwrap();
        assert_eq!((next.primary, next.epoch), (NodeId(1), Epoch(3)));
        assert_eq!(
            next.state_of(NodeId(2)),
            Some(MemberState::Faulted { epoch: Epoch(3) })
        );
        // The primary, promoted while it was down (never served epoch 3):
        // back to the previous primary, which held every write.
        let mut promoted = set.clone();
        promoted.set_state(NodeId(0), MemberState::Faulted { epoch: Epoch(3) });
        let next = without_unclean(&promoted, NodeId(1), 2).unwrap();
        assert_eq!((next.primary, next.epoch), (NodeId(0), Epoch(4)));
        assert_eq!(
            next.state_of(NodeId(1)),
            Some(MemberState::Faulted { epoch: Epoch(4) })
        );
        // It served epoch 3: another in-sync replica takes over.
        let next = without_unclean(&promoted, NodeId(1), 3).unwrap();
        assert_eq!(next.primary, NodeId(2));
        // The only copy in sync carries on.
        let mut alone = promoted.clone();
        alone.set_state(NodeId(2), MemberState::Faulted { epoch: Epoch(3) });
        assert_eq!(without_unclean(&alone, NodeId(1), 3), None);
    }

    #[test]
    fn an_in_sync_replica_takes_over_from_a_silent_primary_and_no_other_does() {
        let record = record();
        let next = take_over(&record, "n3").expect("n3 is in sync");
        assert_eq!((next.epoch, next.primary.as_str()), (4, "n3"));
        assert_eq!(next.members[1].state, ReplicaState::Faulted { epoch: 4 });
        assert_eq!(next.previous.as_deref(), Some("n2"));
        assert_eq!(next.members[0].state, ReplicaState::InSync, "n1 stays");
        assert_eq!(take_over(&record, "n2"), None, "the primary itself");
        assert_eq!(take_over(&record, "n9"), None, "not a member");
        let mut retiring = record.clone();
        retiring.retire = vec!["n3".into()];
        assert_eq!(take_over(&retiring, "n3"), None, "being removed");
        let mut faulted = record.clone();
        faulted.members[2].state = ReplicaState::Faulted { epoch: 3 };
        assert_eq!(take_over(&faulted, "n3"), None, "out of sync");
        let mut erasure = record.clone();
        erasure.erasure = Some(weft_control::ErasureRecord {
            data_shards: 2,
            parity_shards: 1,
            chunk_bytes: 4096,
            journal_slots: 4,
        });
        assert_eq!(take_over(&erasure, "n3"), None, "erasure-coded");
    }

    #[test]
    fn the_replica_set_numbers_nodes_by_their_place_in_the_record() {
        let record = record();
        let set = replica_set(&record);
        assert_eq!((set.epoch, set.primary), (Epoch(3), NodeId(1)));
        assert_eq!(set.previous, Some(NodeId(0)));
        let mut next = set.clone();
        next.epoch = Epoch(4);
        next.primary = NodeId(2);
        next.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(4) });
        let changed = with_replica_set(&record, &next);
        assert_eq!((changed.epoch, changed.primary.as_str()), (4, "n3"));
        assert_eq!(changed.members[1].state, ReplicaState::Faulted { epoch: 4 });
        assert_eq!(replica_set(&changed), next);
    }
}
