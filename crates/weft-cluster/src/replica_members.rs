//! Which nodes hold a replicated volume's replicas, and changing that: the
//! operator's `volume set --replicas N` ([`set_replica_count`]), and the
//! replacement of replicas whose node is lost for good (`node remove`,
//! [`replace_replicas_on`]) or has been down longer than the cluster's
//! replace delay (the controller's duty, [`replace_lost_replicas`]).
//!
//! A new replica enters the record faulted under epoch 0 (it never held
//! anything): the primary rebuilds it in full, then puts it in sync itself.
//! A replica to remove is retired (the record's `retire`): the primary
//! takes it out of the in-sync set, flushing first if it is left the only
//! copy in sync, and then it leaves the record ([`finish_retirements`], by
//! whoever comes next: the call that asked, or the controller). Removing an
//! in-sync replica outright could lose writes the primary acknowledged but
//! had not flushed, if the primary then lost power: the simulation found it.
//! Its node deletes its copy when it sees it gone. Changes are asked for
//! only while the primary's node is up. The primary's replicator starts
//! again on a change of members, under a new epoch, as after a restart
//! (what the failover simulation covers): the host's I/O pauses for its
//! fencing, well under a second.
//!
//! An erasure-coded volume has one member per shard: its count is fixed
//! (`set_replica_count` refuses it), and a lost member is replaced in its
//! place at once (no other member holds its shard; the primary rebuilds
//! the new one in full from the others).
//!
//! What this does not do: create, copy or delete any data (the nodes do).

use crate::election;
use crate::nodes::{self, NodeView};
use crate::placement::{place_more, volumes_by_node, Placement, PlacementError, PlacementRequest};
use crate::replicas::{replica_set, replicated_volumes, with_replica_set, CAS_ATTEMPTS};
use std::collections::BTreeMap;
use weft_control::records::{encode, read, Versioned};
use weft_control::{
    LeaseId, ReplicaRecord, ReplicaState, ReplicationRecord, Store, StoreError, Txn, VolumeRecord,
};

/// The most replicas a volume may have.
pub const REPLICAS_MAX: usize = 3;

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
    /// An erasure-coded volume has one member per shard, always.
    #[error("volume {volume} is erasure-coded ({layout}): it has one member per shard, always; a member whose node is lost for good is replaced in its place (`weft node remove`, or by the controller after the replace delay)")]
    ErasureCoded {
        /// The volume.
        volume: String,
        /// Its layout, e.g. `4+2`.
        layout: String,
    },
    /// Replacing these members would leave fewer than `k` members in sync
    /// to rebuild the new ones from.
    #[error("volume {volume} has {in_sync} members in sync besides those to replace ({lost}), and an erasure-coded volume needs {needed} to rebuild them from: start the lost members' nodes again first (their shards are not dropped)")]
    TooFewInSync {
        /// The volume.
        volume: String,
        /// The members to replace.
        lost: String,
        /// The members in sync besides them.
        in_sync: usize,
        /// The volume's `k`.
        needed: usize,
    },
    /// The primary's node is down: no copy may be dropped or added now.
    #[error("the primary of {volume} is on {node}, which is down: its replicas change only while it is up (the controller promotes another within seconds if one is in sync)")]
    PrimaryDown {
        /// The volume.
        volume: String,
        /// The primary's node.
        node: String,
    },
    /// A node that holds the volume's primary cannot be given up.
    #[error("node {node} holds the primary of {volume}, and no in-sync replica of it is up to be promoted: start {node} again (or the node of an in-sync replica), then retry")]
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
    /// Nodes whose replicas are retired (they leave the record once out of sync).
    pub removed: Vec<String>,
}

impl ReplicaChange {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// A replacement of a volume's lost replicas, or why it found no place.
pub type Replacement = (String, Result<ReplicaChange, ReplicaChangeError>);

/// Gives `volume` `count` replicas: replicas being retired are kept again
/// first, then new ones placed on other nodes in other zones; or the least
/// useful ones retired (faulted first, then those on down nodes; never the
/// primary).
pub fn set_replica_count(
    store: &dyn Store,
    volume: &str,
    count: usize,
) -> Result<ReplicaChange, ReplicaChangeError> {
    if !(1..=REPLICAS_MAX).contains(&count) {
        return Err(ReplicaChangeError::Count(count));
    }
    change_members(store, volume, |replication, nodes| {
        if let Some(erasure) = &replication.erasure {
            return Err(ReplicaChangeError::ErasureCoded {
                volume: volume.to_string(),
                layout: format!("{}+{}", erasure.data_shards, erasure.parity_shards),
            });
        }
        let staying = replication.members.len() - replication.retire.len();
        if count >= staying {
            let kept: Vec<String> = replication
                .retire
                .iter()
                .take(count - staying)
                .cloned()
                .collect();
            let added = count - staying - kept.len();
            return Ok(Decision {
                retire: Vec::new(),
                keep: kept,
                add: added,
            });
        }
        let retire = removable(replication, nodes)
            .into_iter()
            .take(staying - count)
            .collect();
        Ok(Decision {
            retire,
            keep: Vec::new(),
            add: 0,
        })
    })
}

/// Replaces the replicas node `lost` holds (lost for good) by new ones on
/// other nodes: the volumes changed. Refused if it holds a primary.
pub fn replace_replicas_on(
    store: &dyn Store,
    lost: &str,
) -> Result<Vec<(String, ReplicaChange)>, ReplicaChangeError> {
    let volumes = replicated_volumes(store)?;
    // Nothing changes unless every volume can give the node up.
    if let Some((volume, _)) = volumes.iter().find(|(_, r)| r.primary == lost) {
        return Err(ReplicaChangeError::HoldsPrimary {
            volume: volume.clone(),
            node: lost.to_string(),
        });
    }
    let mut changed = Vec::new();
    for (volume, replication) in volumes {
        if replication.member(lost).is_none() {
            continue;
        }
        let change = change_members(store, &volume, |replication, _| {
            let replace =
                replication.member(lost).is_some() && !replication.retire.iter().any(|n| n == lost);
            Ok(Decision {
                retire: if replace {
                    vec![lost.to_string()]
                } else {
                    Vec::new()
                },
                keep: Vec::new(),
                add: usize::from(replace),
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
            .filter(|m| !replication.retire.contains(&m.node))
            .map(|m| m.node.clone())
            .collect();
        if gone.is_empty() || !up(&nodes, &replication.primary) {
            continue;
        }
        let outcome = change_members_as(
            store,
            &volume,
            Some(held),
            &|replication: &ReplicationRecord, _: &BTreeMap<String, NodeView>| {
                let still: Vec<String> = gone
                    .iter()
                    .filter(|node| replication.member(node).is_some())
                    .filter(|node| !replication.retire.contains(node))
                    .cloned()
                    .collect();
                Ok(Decision {
                    add: still.len(),
                    retire: still,
                    keep: Vec::new(),
                })
            },
        );
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

/// The volume's non-primary replicas not being retired, the first to go
/// first: faulted ones,
/// then those on down nodes, then the rest; the last in the record first
/// among equals.
fn removable(replication: &ReplicationRecord, nodes: &BTreeMap<String, NodeView>) -> Vec<String> {
    let mut candidates: Vec<(usize, &ReplicaRecord)> = replication
        .members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.node != replication.primary && !replication.retire.contains(&m.node))
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

/// What a change decides from the record and the nodes.
#[derive(Debug, Default)]
struct Decision {
    /// Replicas to retire.
    retire: Vec<String>,
    /// Replicas being retired to keep after all.
    keep: Vec<String>,
    /// How many new replicas to add.
    add: usize,
}

impl Decision {
    fn is_empty(&self) -> bool {
        self.retire.is_empty() && self.keep.is_empty() && self.add == 0
    }
}

type Decide<'a> = dyn Fn(&ReplicationRecord, &BTreeMap<String, NodeView>) -> Result<Decision, ReplicaChangeError>
    + 'a;

fn change_members(
    store: &dyn Store,
    volume: &str,
    decide: impl Fn(
        &ReplicationRecord,
        &BTreeMap<String, NodeView>,
    ) -> Result<Decision, ReplicaChangeError>,
) -> Result<ReplicaChange, ReplicaChangeError> {
    change_members_as(store, volume, None, &decide)
}

/// Applies `decide` to `volume`'s record by compare-and-swap (as the
/// controller holding `controller`, if given: then a conflict is returned,
/// not retried).
fn change_members_as(
    store: &dyn Store,
    volume: &str,
    controller: Option<weft_control::Revision>,
    decide: &Decide<'_>,
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
        let decision = decide(replication, &nodes)?;
        if decision.is_empty() {
            return Ok(ReplicaChange::default());
        }
        if !up(&nodes, &replication.primary) {
            return Err(ReplicaChangeError::PrimaryDown {
                volume: volume.to_string(),
                node: replication.primary.clone(),
            });
        }
        if let Some(erasure) = &replication.erasure {
            check_rebuildable(volume, replication, erasure, &decision.retire)?;
        }
        let (next, change) = changed(store, &found, &nodes, &decision)?;
        let mut txn = Txn::new().update(key.clone(), encode(&next), found.revision);
        if let Some(controller) = controller {
            txn = txn.require(election::holds(controller));
        }
        match store.commit(txn) {
            Ok(_) => {
                log::info!(
                    "volume {volume}: replicas added on {:?}, retired on {:?}",
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

/// The record with `decision` applied: a replicated volume's new replicas
/// are added beside it and the retired ones leave later; an erasure-coded
/// volume's (one per shard) take the lost members' places at once.
fn changed(
    store: &dyn Store,
    found: &Versioned<VolumeRecord>,
    nodes: &BTreeMap<String, NodeView>,
    decision: &Decision,
) -> Result<(VolumeRecord, ReplicaChange), ReplicaChangeError> {
    let mut record = found.record.clone();
    let replication = record.replication.as_mut().expect("replicated");
    let placed = place_new(store, nodes, replication, decision)?;
    let fresh = |placement: &Placement| ReplicaRecord {
        node: placement.node.clone(),
        pool: placement.pool.clone(),
        state: ReplicaState::Faulted { epoch: 0 },
    };
    if replication.erasure.is_some() {
        // Its shard in place of the lost one: nothing else holds it, and
        // the primary rebuilds it in full from the others.
        assert_eq!(placed.len(), decision.retire.len(), "a member per shard");
        for (lost, placement) in decision.retire.iter().zip(&placed) {
            let member = replication.members.iter_mut().find(|m| &m.node == lost);
            *member.expect("a lost member") = fresh(placement);
        }
    } else {
        replication.retire.retain(|n| !decision.keep.contains(n));
        replication.retire.extend(decision.retire.iter().cloned());
        replication.members.extend(placed.iter().map(fresh));
    }
    if replication
        .move_to
        .as_ref()
        .is_some_and(|to| decision.retire.contains(to) || replication.retire.contains(to))
    {
        replication.move_to = None;
    }
    // A new copy holds no snapshot, even on a node whose earlier copy did.
    for snapshot in &mut replication.snapshots {
        snapshot
            .nodes
            .retain(|node| !placed.iter().any(|p| &p.node == node));
    }
    Ok((
        record,
        ReplicaChange {
            added: placed,
            removed: decision.retire.clone(),
        },
    ))
}

/// Refuses to replace `lost` members of an erasure-coded volume unless
/// `k` others stay in sync: the new ones are rebuilt from those, and a
/// lost member replaced is dropped for good (a node down a long while may
/// still hold a shard the volume cannot do without).
fn check_rebuildable(
    volume: &str,
    replication: &ReplicationRecord,
    erasure: &weft_control::ErasureRecord,
    lost: &[String],
) -> Result<(), ReplicaChangeError> {
    let in_sync = replication
        .members
        .iter()
        .filter(|m| m.state == ReplicaState::InSync && !lost.contains(&m.node))
        .count();
    let needed = erasure.data_shards as usize;
    if in_sync < needed {
        return Err(ReplicaChangeError::TooFewInSync {
            volume: volume.to_string(),
            lost: lost.join(", "),
            in_sync,
            needed,
        });
    }
    Ok(())
}

/// Places `decision.add` new members of `replication` on nodes and in
/// zones none of its members (retired or not) is on: a retired node may
/// come back. When replacing and no other zone is left, the retired
/// nodes' zones may take them. An erasure-coded member takes a shard's
/// bytes.
fn place_new(
    store: &dyn Store,
    nodes: &BTreeMap<String, NodeView>,
    replication: &ReplicationRecord,
    decision: &Decision,
) -> Result<Vec<Placement>, ReplicaChangeError> {
    let taken: Vec<&str> = replication
        .members
        .iter()
        .map(|m| m.node.as_str())
        .collect();
    let size_bytes = match &replication.erasure {
        Some(erasure) => crate::erasure::shard_bytes(replication, erasure)
            .expect("a layout its creation checked"),
        None => replication.size_bytes,
    };
    let volumes = volumes_by_node(store)?;
    let request = PlacementRequest {
        size_bytes,
        thick: replication.thick,
        encrypted: replication.encrypted,
        node: None,
        pool: None,
        volumes_by_node: &volumes,
    };
    match place_more(nodes, request, &taken, decision.add) {
        Err(PlacementError::TooFewZones { .. }) if !decision.retire.is_empty() => {
            let kept: Vec<&str> = taken
                .iter()
                .copied()
                .filter(|n| !decision.retire.iter().any(|r| r == n))
                .collect();
            let others: BTreeMap<String, NodeView> = nodes
                .iter()
                .filter(|(name, _)| !decision.retire.contains(name))
                .map(|(name, view)| (name.clone(), view.clone()))
                .collect();
            Ok(place_more(&others, request, &kept, decision.add)?)
        }
        placed => Ok(placed?),
    }
}

/// Drops from `volume`'s record the retired replicas the primary took out
/// of the in-sync set (anyone may: they hold nothing another copy lacks).
/// Whether every replica retired is gone.
pub fn finish_retirements(store: &dyn Store, volume: &str) -> Result<bool, StoreError> {
    let key = format!("volumes/{volume}");
    for _ in 0..CAS_ATTEMPTS {
        let Some(found) = read::<VolumeRecord>(store, &key)? else {
            return Ok(true);
        };
        let Some(replication) = &found.record.replication else {
            return Ok(true);
        };
        let set = replica_set(replication);
        let Some(next) = set.without_retired() else {
            return Ok(replication.retire.is_empty());
        };
        let mut record = found.record.clone();
        let left = with_replica_set(replication, &next);
        let gone: Vec<&str> = replication
            .members
            .iter()
            .map(|m| m.node.as_str())
            .filter(|n| left.member(n).is_none())
            .collect();
        let done = left.retire.is_empty();
        log::info!("volume {volume}: retired replicas on {gone:?} leave");
        record.replication = Some(left);
        let txn = Txn::new().update(key.clone(), encode(&record), found.revision);
        match store.commit(txn) {
            Ok(_) => return Ok(done),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(false)
}

/// The controller's duty: [`finish_retirements`] of every volume.
pub fn finish_all_retirements(store: &dyn Store) -> Result<(), StoreError> {
    for (volume, replication) in replicated_volumes(store)? {
        if !replication.retire.is_empty() {
            finish_retirements(store, &volume)?;
        }
    }
    Ok(())
}
