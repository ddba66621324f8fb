//! The nodes as an operator sees them, and the operator's changes to them.
//!
//! A node is `up` while its liveness record exists (its lease is kept
//! alive), `down` otherwise, and `cordoned` when up but closed to new
//! volumes. The controller notes when it sees a node go down
//! ([`note_down_nodes`]), which `weft node list` shows.

use crate::election;
use crate::records::{
    alive_key, member_key, AliveRecord, MemberRecord, ALIVE_PREFIX, MEMBERS_PREFIX,
};
use serde::Serialize;
use std::collections::BTreeMap;
use weft_control::records::{decode, encode, read};
use weft_control::{Condition, LeaseId, Store, StoreError, Txn};

/// Compare-and-swap attempts of a change before giving up (each failed
/// attempt means someone else changed the record in between).
const CAS_ATTEMPTS: usize = 8;

/// A node's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Its lease is alive and it takes new volumes.
    Up,
    /// Its lease is alive but no new volume is placed on it.
    Cordoned,
    /// Its lease ended.
    Down,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeState::Up => "up",
            NodeState::Cordoned => "cordoned",
            NodeState::Down => "down",
        })
    }
}

/// One node: its membership and, while up, its liveness.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Membership.
    pub member: MemberRecord,
    /// Liveness (heartbeat, pools), while up.
    pub alive: Option<AliveRecord>,
    /// Whether it is the controller.
    pub controller: bool,
}

impl NodeView {
    /// Its state.
    pub fn state(&self) -> NodeState {
        match (&self.alive, self.member.cordoned) {
            (None, _) => NodeState::Down,
            (Some(_), true) => NodeState::Cordoned,
            (Some(_), false) => NodeState::Up,
        }
    }

    /// Whether its lease is alive.
    pub fn is_alive(&self) -> bool {
        self.alive.is_some()
    }
}

/// Why an operator's change to a node was refused.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No such node.
    #[error("no node named {0}; `weft node list` shows the cluster's nodes")]
    NotFound(String),
    /// The node is up.
    #[error("node {0} is up: stop weft on it first (a node that is up would join again at once)")]
    Up(String),
    /// The node still holds volumes.
    #[error("node {name} still holds volumes: {}; delete them (or, later, move their replicas) first", volumes.join(", "))]
    HoldsVolumes {
        /// The node.
        name: String,
        /// Its volumes.
        volumes: Vec<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Every node, by name.
pub fn list(store: &dyn Store) -> Result<BTreeMap<String, NodeView>, StoreError> {
    let controller = election::controller(store)?.map(|c| c.node);
    let mut alive: BTreeMap<String, AliveRecord> = BTreeMap::new();
    for entry in store.list(ALIVE_PREFIX)?.entries {
        let name = entry.key[ALIVE_PREFIX.len()..].to_string();
        alive.insert(name, decode(&entry.key, entry.value)?);
    }
    let mut nodes = BTreeMap::new();
    for entry in store.list(MEMBERS_PREFIX)?.entries {
        let member: MemberRecord = decode(&entry.key, entry.value)?;
        // A record under another node's key (a writer of the store) would
        // send calls meant for one node to another: left out.
        if entry.key[MEMBERS_PREFIX.len()..] != member.name {
            log::warn!(
                "{}: names node {}, not its key's: ignored",
                entry.key,
                member.name
            );
            continue;
        }
        let view = NodeView {
            alive: alive
                .remove(&member.name)
                .filter(|a| a.node_id == member.node_id),
            controller: controller.as_deref() == Some(member.name.as_str()),
            member,
        };
        nodes.insert(view.member.name.clone(), view);
    }
    Ok(nodes)
}

/// Node `name`.
pub fn get(store: &dyn Store, name: &str) -> Result<NodeView, NodeError> {
    let member = read::<MemberRecord>(store, &member_key(name))?
        .map(|found| found.record)
        .filter(|member| member.name == name)
        .ok_or_else(|| NodeError::NotFound(name.to_string()))?;
    let alive = read::<AliveRecord>(store, &alive_key(name))?
        .map(|found| found.record)
        .filter(|a| a.node_id == member.node_id);
    let controller = election::controller(store)?.is_some_and(|c| c.node == name);
    Ok(NodeView {
        member,
        alive,
        controller,
    })
}

/// Cordons (no new volumes) or uncordons node `name`.
pub fn set_cordoned(store: &dyn Store, name: &str, cordoned: bool) -> Result<(), NodeError> {
    change_member(store, name, |member| member.cordoned = cordoned)
}

/// Forgets node `name`, which must be down and hold no volume
/// (`volumes`: the volumes the cluster places on it). Its other records
/// (`node_records`: e.g. its pools) go in the same transaction.
pub fn remove(
    store: &dyn Store,
    name: &str,
    volumes: Vec<String>,
    node_records: Vec<String>,
) -> Result<(), NodeError> {
    let found = read::<MemberRecord>(store, &member_key(name))?
        .ok_or_else(|| NodeError::NotFound(name.to_string()))?;
    if store.get(&alive_key(name))?.is_some() {
        return Err(NodeError::Up(name.to_string()));
    }
    if !volumes.is_empty() {
        return Err(NodeError::HoldsVolumes {
            name: name.to_string(),
            volumes,
        });
    }
    let mut txn = Txn::new()
        .require(Condition::Absent(alive_key(name)))
        .remove(member_key(name), found.revision);
    let ordinal = found.record.ordinal.map(crate::records::ordinal_key);
    for key in ordinal.into_iter().chain(node_records) {
        if let Some(entry) = store.get(&key)? {
            txn = txn.remove(key, entry.revision);
        }
    }
    store.commit(txn)?;
    Ok(())
}

/// The controller's duty: records when each node was first seen down.
/// Does nothing unless `lease` holds the controller key, in the same
/// transaction as each change.
pub fn note_down_nodes(
    store: &dyn Store,
    lease: LeaseId,
    now_unix_ms: u64,
) -> Result<Vec<String>, StoreError> {
    let Some(held) = election::held_at(store, lease)? else {
        return Ok(Vec::new());
    };
    let mut noted = Vec::new();
    for (name, view) in list(store)? {
        if view.is_alive() || view.member.down_since_unix_ms.is_some() {
            continue;
        }
        let Some(found) = read::<MemberRecord>(store, &member_key(&name))? else {
            continue;
        };
        let mut member = found.record;
        member.down_since_unix_ms = Some(now_unix_ms);
        let txn = Txn::new()
            .require(election::holds(held))
            .require(Condition::Absent(alive_key(&name)))
            .update(member_key(&name), encode(&member), found.revision);
        match store.commit(txn) {
            Ok(_) => {
                log::warn!("node {name} is down (its lease ended)");
                noted.push(name);
            }
            // It came back, or we are no longer the controller: next time.
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(noted)
}

/// Applies `change` to node `name`'s membership record by compare-and-swap.
fn change_member(
    store: &dyn Store,
    name: &str,
    change: impl Fn(&mut MemberRecord),
) -> Result<(), NodeError> {
    for _ in 0..CAS_ATTEMPTS {
        let found = read::<MemberRecord>(store, &member_key(name))?
            .ok_or_else(|| NodeError::NotFound(name.to_string()))?;
        let mut member = found.record;
        change(&mut member);
        let txn = Txn::new().update(member_key(name), encode(&member), found.revision);
        match store.commit(txn) {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(StoreError::Conflict {
        key: member_key(name),
    }
    .into())
}
