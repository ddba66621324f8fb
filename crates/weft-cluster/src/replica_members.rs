//! Which nodes hold a replicated volume's replicas, and changing that: the
//! operator's `volume set --replicas N` ([`set_replica_count`]), and the
//! replacement of replicas whose node is lost for good (`node remove`,
//! [`replace_replicas_on`]) or has been down longer than the cluster's
//! replace delay (the controller's duty, [`replace_lost_replicas`]).
//!
//! A new replica enters the record faulted under epoch 0 (it never held
//! anything): the primary rebuilds it in full, then puts it in sync itself.
//! A removed one leaves the record, and its node deletes its copy when it
//! sees that. Every change needs the primary's node up: the primary holds
//! every acknowledged write, so a copy that may be the last complete one
//! (a down primary's in-sync replica) is never dropped. The primary's
//! replicator starts again on a change of members, under a new epoch, as
//! after a restart (what the failover simulation covers): the host's I/O
//! pauses for its fencing, well under a second.
//!
//! What this does not do: create, copy or delete any data (the nodes do).

use crate::election;
use crate::nodes::{self, NodeView};
use crate::placement::{place_more, volumes_by_node, Placement, PlacementError, PlacementRequest};
use std::collections::BTreeMap;
use weft_control::records::{encode, read, Versioned};
use weft_control::{
    Change, Condition, LeaseId, ReplicaRecord, ReplicaState, ReplicationRecord, Store, StoreError,
    Txn, VolumeRecord,
};

/// The most replicas a volume may have.
pub const REPLICAS_MAX: usize = 3;

/// Compare-and-swap attempts before giving up on a busy record.
const CAS_ATTEMPTS: usize = 5;

/// Why a change of replicas was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaChangeError {
    /// No such volume.
    #[error("volume {0} does not exist")]
    NotFound(String),
    /// A volume created with one copy.
    #[error("volume {0} was created with one copy, which serves its own identity; replicas can be added to volumes created with --replicas 2 or 3")]
    NotReplicated(String),
    /// Fewer than one or more than [`REPLICAS_MAX`].
    #[error("a volume has 1 to {REPLICAS_MAX} replicas, not {0}")]
    Count(usize),
    /// The primary's node is down: no copy may be dropped or added now.
    #[error("the primary of {volume} is on {node}, which is down: its replicas change only while it is up (the controller promotes another within seconds if one is in sync)")]
    PrimaryDown {
        /// The volume.
        volume: String,
        /// The primary's node.
        node: String,
    },
    /// A node that holds the volume's primary cannot be given up.
    #[error("node {node} holds the primary of {volume}: move it first (`weft volume move-primary {volume}`)")]
    HoldsPrimary {
        /// The volume.
        volume: String,
        /// The node.
        node: String,
    },
    /// Nowhere to put a new replica.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a change did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaChange {
    /// New replicas (to be built in full).
    pub added: Vec<Placement>,
    /// Nodes whose replicas left the volume.
    pub removed: Vec<String>,
}

impl ReplicaChange {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// A replacement of a volume's lost replicas, or why it found no place.
pub type Replacement = (String, Result<ReplicaChange, ReplicaChangeError>);

/// Gives `volume` `count` replicas: new ones placed on other nodes in other
/// zones, or the least useful ones removed (faulted first, then those on
/// down nodes; never the primary).
pub fn set_replica_count(
    store: &dyn Store,
    volume: &str,
    count: usize,
) -> Result<ReplicaChange, ReplicaChangeError> {
    if !(1..=REPLICAS_MAX).contains(&count) {
        return Err(ReplicaChangeError::Count(count));
    }
    change_members(store, volume, |replication, nodes| {
        let members = replication.members.len();
        let removed = removable(replication, nodes)
            .into_iter()
            .take(members.saturating_sub(count))
            .collect();
        Ok((removed, count.saturating_sub(members)))
    })
}

/// Replaces the replicas node `lost` holds (lost for good) by new ones on
/// other nodes: the volumes changed. Refused if it holds a primary.
pub fn replace_replicas_on(
    store: &dyn Store,
    lost: &str,
) -> Result<Vec<(String, ReplicaChange)>, ReplicaChangeError> {
    let mut changed = Vec::new();
    for (volume, replication) in replicated_volumes(store)? {
        if replication.member(lost).is_none() {
            continue;
        }
        if replication.primary == lost {
            return Err(ReplicaChangeError::HoldsPrimary {
                volume,
                node: lost.to_string(),
            });
        }
        let change = change_members(store, &volume, |replication, _| {
            Ok(match replication.member(lost) {
                Some(_) => (vec![lost.to_string()], 1),
                None => (Vec::new(), 0),
            })
        })?;
        if !change.is_empty() {
            changed.push((volume, change));
        }
    }
    Ok(changed)
}

/// The controller's duty: replaces every replica whose node has been down
/// for `after_ms` (or was forgotten), on volumes whose primary is up. Does
/// nothing unless `lease` holds the controller key. The replacements made,
/// and those that found no place (with why).
pub fn replace_lost_replicas(
    store: &dyn Store,
    lease: LeaseId,
    now_unix_ms: u64,
    after_ms: u64,
) -> Result<Vec<Replacement>, StoreError> {
    let Some(held) = election::held_at(store, lease)? else {
        return Ok(Vec::new());
    };
    let nodes = nodes::list(store)?;
    let lost = |name: &str| {
        nodes.get(name).is_none_or(|view| {
            !view.is_alive()
                && view
                    .member
                    .down_since_unix_ms
                    .is_some_and(|since| now_unix_ms >= since.saturating_add(after_ms))
        })
    };
    let mut outcomes = Vec::new();
    for (volume, replication) in replicated_volumes(store)? {
        let gone: Vec<String> = replication
            .members
            .iter()
            .filter(|m| m.node != replication.primary && lost(&m.node))
            .map(|m| m.node.clone())
            .collect();
        if gone.is_empty() || !up(&nodes, &replication.primary) {
            continue;
        }
        let outcome = change_members_as(store, &volume, Some(held), |replication, _| {
            let still: Vec<String> = gone
                .iter()
                .filter(|node| replication.member(node).is_some())
                .cloned()
                .collect();
            let replacements = still.len();
            Ok((still, replacements))
        });
        match outcome {
            Ok(change) if change.is_empty() => {}
            // Changed meanwhile, or no longer the controller: next time.
            Err(ReplicaChangeError::Store(StoreError::Conflict { .. })) => {}
            Err(ReplicaChangeError::Store(error)) => return Err(error),
            outcome => outcomes.push((volume, outcome)),
        }
    }
    Ok(outcomes)
}

/// The volume's non-primary replicas, the first to go first: faulted ones,
/// then those on down nodes, then the rest; the last in the record first
/// among equals.
fn removable(replication: &ReplicationRecord, nodes: &BTreeMap<String, NodeView>) -> Vec<String> {
    let mut candidates: Vec<(usize, &ReplicaRecord)> = replication
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.node != replication.primary)
        .collect();
    let rank = |m: &ReplicaRecord| match (m.state, up(nodes, &m.node)) {
        (ReplicaState::Faulted { .. }, _) => 0,
        (ReplicaState::InSync, false) => 1,
        (ReplicaState::InSync, true) => 2,
    };
    candidates.sort_by_key(|(index, m)| (rank(m), std::cmp::Reverse(*index)));
    candidates
        .into_iter()
        .map(|(_, m)| m.node.clone())
        .collect()
}

fn up(nodes: &BTreeMap<String, NodeView>, name: &str) -> bool {
    nodes.get(name).is_some_and(NodeView::is_alive)
}

/// Every replicated volume's name and replication record.
fn replicated_volumes(store: &dyn Store) -> Result<Vec<(String, ReplicationRecord)>, StoreError> {
    let mut volumes = Vec::new();
    for entry in store.list("volumes/")?.entries {
        let Some(found) = read::<VolumeRecord>(store, &entry.key)? else {
            continue;
        };
        if let Some(replication) = found.record.replication {
            volumes.push((entry.key["volumes/".len()..].to_string(), replication));
        }
    }
    Ok(volumes)
}

/// What a change decides from the record and the nodes: the nodes to drop
/// and how many replicas to add.
type Decision = Result<(Vec<String>, usize), ReplicaChangeError>;

fn change_members(
    store: &dyn Store,
    volume: &str,
    decide: impl Fn(&ReplicationRecord, &BTreeMap<String, NodeView>) -> Decision,
) -> Result<ReplicaChange, ReplicaChangeError> {
    change_members_as(store, volume, None, decide)
}

/// Applies `decide` to `volume`'s record by compare-and-swap (as the
/// controller holding `controller`, if given: then a conflict is returned,
/// not retried).
fn change_members_as(
    store: &dyn Store,
    volume: &str,
    controller: Option<weft_control::Revision>,
    decide: impl Fn(&ReplicationRecord, &BTreeMap<String, NodeView>) -> Decision,
) -> Result<ReplicaChange, ReplicaChangeError> {
    let key = format!("volumes/{volume}");
    let attempts = if controller.is_some() {
        1
    } else {
        CAS_ATTEMPTS
    };
    for _ in 0..attempts {
        let found = read::<VolumeRecord>(store, &key)?
            .ok_or_else(|| ReplicaChangeError::NotFound(volume.to_string()))?;
        let replication = found
            .record
            .replication
            .as_ref()
            .ok_or_else(|| ReplicaChangeError::NotReplicated(volume.to_string()))?;
        let nodes = nodes::list(store)?;
        let (removed, added) = decide(replication, &nodes)?;
        if removed.is_empty() && added == 0 {
            return Ok(ReplicaChange::default());
        }
        if !up(&nodes, &replication.primary) {
            return Err(ReplicaChangeError::PrimaryDown {
                volume: volume.to_string(),
                node: replication.primary.clone(),
            });
        }
        let (next, change) = changed(store, &found, &nodes, &removed, added)?;
        let mut conditions = vec![Condition::At(key.clone(), found.revision)];
        conditions.extend(controller.map(election::holds));
        let txn = Txn {
            conditions,
            changes: vec![Change::put(key.clone(), encode(&next))],
        };
        match store.commit(txn) {
            Ok(_) => {
                log::info!(
                    "volume {volume}: replicas added on {:?}, removed from {:?}",
                    change.added.iter().map(|p| &p.node).collect::<Vec<_>>(),
                    change.removed
                );
                return Ok(change);
            }
            Err(StoreError::Conflict { .. }) if controller.is_none() => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(StoreError::Conflict { key }.into())
}

/// The record without the replicas on `removed`, with `added` new ones.
fn changed(
    store: &dyn Store,
    found: &Versioned<VolumeRecord>,
    nodes: &BTreeMap<String, NodeView>,
    removed: &[String],
    added: usize,
) -> Result<(VolumeRecord, ReplicaChange), ReplicaChangeError> {
    let mut record = found.record.clone();
    let replication = record.replication.as_mut().expect("replicated");
    replication.members.retain(|m| !removed.contains(&m.node));
    if replication
        .move_to
        .as_ref()
        .is_some_and(|to| removed.contains(to))
    {
        replication.move_to = None;
    }
    if replication
        .previous
        .as_ref()
        .is_some_and(|p| removed.contains(p))
    {
        replication.previous = None;
    }
    // The new ones go to zones none of the replicas kept or dropped is in
    // (a dropped node may come back).
    let taken: Vec<&str> = found
        .record
        .replication
        .iter()
        .flat_map(|r| r.members.iter().map(|m| m.node.as_str()))
        .collect();
    let volumes = volumes_by_node(store)?;
    let request = PlacementRequest {
        size_bytes: replication.size_bytes,
        thick: replication.thick,
        node: None,
        pool: None,
        volumes_by_node: &volumes,
    };
    let placed = match place_more(nodes, request, &taken, added) {
        Err(PlacementError::TooFewZones { .. }) if !removed.is_empty() => {
            // Replacing: the dropped node's zone may take the new one.
            let kept: Vec<&str> = replication
                .members
                .iter()
                .map(|m| m.node.as_str())
                .collect();
            let without_dropped: BTreeMap<String, NodeView> = nodes
                .iter()
                .filter(|(name, _)| !removed.contains(name))
                .map(|(name, view)| (name.clone(), view.clone()))
                .collect();
            place_more(&without_dropped, request, &kept, added)?
        }
        placed => placed?,
    };
    replication
        .members
        .extend(placed.iter().map(|placement| ReplicaRecord {
            node: placement.node.clone(),
            pool: placement.pool.clone(),
            state: ReplicaState::Faulted { epoch: 0 },
        }));
    Ok((
        record,
        ReplicaChange {
            added: placed,
            removed: removed.to_vec(),
        },
    ))
}
