//! What a storage node does as a member of a cluster, beside serving: it
//! follows the shared desired state and converges its data plane to it,
//! and reports its pools at each heartbeat.
//!
//! - Records another node changed (a host's NQN or secrets, an attachment
//!   or limit of a volume this node serves) reach the volume manager as one
//!   [`AdminOp::Reconcile`], which rebuilds the exports from the store's
//!   records: a node that was down, or cut off from the store, catches up
//!   the same way once its copy of the store (weft-control's `Mirror`) has
//!   caught up. Only the volume records that concern the node count (it
//!   holds a copy, or the record names it): a reconcile passes over every
//!   record, so with every node reconciling at every change a cluster's
//!   cost grew with nodes x changes x volumes. Others only move the status
//!   generation (hosts' attachments are read from the store). Every
//!   [`RESYNC`] the node reconciles and reads the members anyway, as
//!   controllers resync; a copy that read the whole store again (its
//!   watch was lost) counts as a change of everything.
//! - A change of the cluster's members (a node joined, left, went down)
//!   calls the caller's `on_members`, which updates the referrals of the
//!   node's discovery controller.
//!
//! - [`join`]: joining at start (token, cluster identity, node name).
//! - [`silence`]: a replica taking over from a primary gone silent.
//!
//! What it does not do: keep the lease (weft-cluster's agent), or decide
//! anything cluster-wide.

pub mod join;
pub mod silence;

use crate::link_keys::Peer;
use crate::manager::{AdminOp, ManagerHandle};
use crate::status::StatusReader;
use std::net::SocketAddr;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use weft_cluster::membership::NodeStatus;
use weft_cluster::records::{PoolSummary, ALIVE_PREFIX, MEMBERS_PREFIX};
use weft_control::records::{HOSTS_PREFIX, VOLUMES_PREFIX};
use weft_control::Store;

/// How long changes are gathered before one reconcile (a burst of record
/// changes, e.g. a relist after the store came back, costs one rebuild).
const GATHER: Duration = Duration::from_millis(50);

/// Wait between attempts while a reconcile fails (the manager is busy).
const RETRY: Duration = Duration::from_secs(1);

/// The longest between two reconciles, changes or not: a safety net, as
/// the resync period of a Kubernetes controller.
pub const RESYNC: Duration = Duration::from_secs(60);

/// Which changed records concern this node.
pub struct Interest {
    /// The node's name in the cluster.
    pub node: String,
    /// The node's copy of the store.
    pub store: Arc<dyn Store>,
    /// What the node holds.
    pub status: StatusReader,
}

impl Interest {
    /// Whether a change of volume record `key` concerns the node: it holds
    /// a copy of the volume (a change, or its deletion), or the record names
    /// it (a copy to make here, a primary or move to take). A record that
    /// cannot be read counts.
    fn concerns_volume(&self, key: &str, volume: &str) -> bool {
        if self.status.holds(volume) {
            return true;
        }
        match self.store.get(key) {
            Ok(Some(entry)) => names(&entry.value, &self.node),
            Ok(None) => false,
            Err(_) => true,
        }
    }
}

/// Whether `value` holds the string `node` anywhere. Looser than the
/// record's fields on purpose: a field added later that names a node is
/// not missed, and a host that shares the node's name costs a reconcile.
fn names(value: &serde_json::Value, node: &str) -> bool {
    match value {
        serde_json::Value::String(text) => text == node,
        serde_json::Value::Array(items) => items.iter().any(|item| names(item, node)),
        serde_json::Value::Object(fields) => fields.values().any(|field| names(field, node)),
        _ => false,
    }
}

/// What kinds of records changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Changed {
    /// Records the node serves from changed: reconcile.
    served: bool,
    /// Records of others changed: what hosts' status answers moved.
    others: bool,
    members: bool,
}

impl Changed {
    /// Notes a change of `key`; `concerns(key, volume)` tells whether a
    /// volume record concerns the node.
    fn note(&mut self, key: &str, concerns: impl Fn(&str, &str) -> bool) {
        if key.is_empty() {
            // The copy read the whole store again (its watch was lost):
            // any record may have changed.
            self.served = true;
            self.members = true;
        } else if key.starts_with(HOSTS_PREFIX) {
            self.served = true;
        } else if let Some(volume) = key.strip_prefix(VOLUMES_PREFIX) {
            if concerns(key, volume) {
                self.served = true;
            } else {
                self.others = true;
            }
        } else if key.starts_with(MEMBERS_PREFIX) || key.starts_with(ALIVE_PREFIX) {
            self.members = true;
        }
    }
}

/// Follows `changes` (keys changed in the store) on a thread of its own
/// until the store's copy goes away: records that concern the node become
/// reconciles of `manager`, member changes calls of `on_members` (called
/// once at start).
pub fn follow(
    changes: Receiver<String>,
    manager: ManagerHandle,
    interest: Interest,
    on_members: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("cluster-follow".into())
        .spawn(move || {
            on_members();
            // What changed while the node was away (e.g. its replica
            // replaced) is in the store's copy already: serve it.
            reconcile(&manager);
            let mut reconciled = Instant::now();
            loop {
                let wait = RESYNC.saturating_sub(reconciled.elapsed());
                let first = match changes.recv_timeout(wait) {
                    Ok(key) => Some(key),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                };
                let mut changed = Changed::default();
                let concerns = |key: &str, volume: &str| interest.concerns_volume(key, volume);
                if let Some(first) = first {
                    changed.note(&first, concerns);
                    std::thread::sleep(GATHER);
                    for key in changes.try_iter() {
                        changed.note(&key, concerns);
                    }
                }
                let resync = reconciled.elapsed() >= RESYNC;
                // At a resync too: telling the manager of the members may
                // have failed (it was busy), and members rarely change now
                // that liveness records are rewritten only with news.
                if changed.members || resync {
                    on_members();
                }
                if changed.others {
                    interest.status.note_desired_change();
                }
                if changed.served || resync {
                    reconcile(&manager);
                    reconciled = Instant::now();
                }
            }
        })
        .map(drop)
}

/// Asks the manager to serve what the store says, until it has.
fn reconcile(manager: &ManagerHandle) {
    let mut failing = false;
    loop {
        match manager.call(AdminOp::Reconcile) {
            Ok(()) => {
                if failing {
                    log::info!("the node serves the cluster's desired state again");
                }
                return;
            }
            Err(error) => {
                if !failing {
                    log::warn!("applying the cluster's desired state: {error}; retrying");
                    failing = true;
                }
                std::thread::sleep(RETRY);
            }
        }
    }
}

/// Keeps the discovery log's referrals on the other nodes that are up, and
/// the other nodes' names and addresses (for whom replica subsystems and
/// the controllers kept for nodes are): called when members change, it
/// tells `manager` only when they differ from what it last told. Nodes
/// that are down are left out of the referrals (a host's `nvme
/// connect-all` would wait for each).
///
/// Which nodes: nvme-cli's `connect-all` follows referrals recursively and
/// skips discovery controllers it is connected to, but disconnects each
/// referred one when its recursion returns, so it visits one discovery
/// controller per simple path through the referrals: 5 connections for 3
/// nodes referring to each other, 16 for 4, 65 for 5, 13,700 for 8. Up to
/// [`MESH_NODES_MAX`] nodes every node refers to all others; beyond, to its
/// successor in the ring of up nodes by name, which reaches all of them in
/// as many connections as nodes (a ring of 4 costs 4 where a mesh costs 16).
pub fn referral_keeper(
    store: Arc<dyn Store>,
    own: String,
    manager: ManagerHandle,
) -> impl Fn() + Send + 'static {
    type Told = (Vec<SocketAddr>, Vec<Peer>, Vec<std::net::IpAddr>);
    let told: Mutex<Option<Told>> = Mutex::new(None);
    move || {
        let nodes = match weft_cluster::nodes::list(store.as_ref()) {
            Ok(nodes) => nodes,
            Err(error) => return log::warn!("referrals not updated: {error}"),
        };
        let up: Vec<&weft_cluster::NodeView> = nodes
            .values()
            .filter(|node| node.member.name == own || node.is_alive())
            .collect();
        let mut referrals: Vec<SocketAddr> = referred(&up, &own)
            .flat_map(|node| node.member.nvme.iter().filter_map(|a| a.parse().ok()))
            .collect();
        referrals.sort();
        let peers: Vec<Peer> = nodes
            .values()
            .filter(|node| node.member.name != own)
            .map(|node| Peer {
                name: node.member.name.clone(),
                certificate: node.member.certificate.clone(),
            })
            .collect();
        let addresses = node_addresses(nodes.values().filter(|node| node.member.name != own));
        let now = (referrals, peers, addresses);
        let mut told = told.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if told.as_ref() == Some(&now) {
            return;
        }
        let op = AdminOp::SetPeers {
            referrals: now.0.clone(),
            nodes: now.1.clone(),
            addresses: now.2.clone(),
        };
        match manager.call(op) {
            Ok(()) => *told = Some(now),
            Err(error) => log::warn!("referrals not updated: {error}"),
        }
    }
}

/// The addresses `nodes` listen at (for hosts and for the other nodes),
/// sorted, each once: where their Connects come from.
fn node_addresses<'a>(
    nodes: impl Iterator<Item = &'a weft_cluster::NodeView>,
) -> Vec<std::net::IpAddr> {
    let mut addresses: Vec<std::net::IpAddr> = nodes
        .flat_map(|node| node.member.nvme.iter().chain(&node.member.peer_nvme))
        .filter_map(|address| address.parse::<SocketAddr>().ok())
        .map(|address| address.ip())
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
}

/// Up to this many nodes, each refers to all the others (5 discovery
/// connections for 3 nodes, where a ring would make 3, but a node that died
/// and is not yet listed down hides no other).
pub const MESH_NODES_MAX: usize = 3;

/// The nodes `own` refers to among `up` (sorted by name, `own` included).
fn referred<'a>(
    up: &'a [&'a weft_cluster::NodeView],
    own: &'a str,
) -> Box<dyn Iterator<Item = &'a weft_cluster::NodeView> + 'a> {
    let others = up
        .iter()
        .copied()
        .filter(move |node| node.member.name != own);
    if up.len() <= MESH_NODES_MAX {
        return Box::new(others);
    }
    let position = up.iter().position(|node| node.member.name == own);
    let successor = position.map(|index| up[(index + 1) % up.len()]);
    Box::new(successor.into_iter())
}

/// The node's pools and volume count, as its heartbeat publishes them.
pub fn node_status(status: &StatusReader) -> NodeStatus {
    let pools = status.pools();
    NodeStatus {
        keys: status.holds_keys(),
        volumes: pools
            .iter()
            .map(|pool| u32::try_from(pool.info.volumes).unwrap_or(u32::MAX))
            .sum(),
        pools: pools
            .into_iter()
            .map(|pool| PoolSummary {
                name: pool.info.name,
                capacity_bytes: pool.info.capacity_bytes,
                allocated_bytes: pool.info.allocated_bytes,
                provisioned_bytes: pool.info.provisioned_bytes,
                failed: pool.failure.is_some(),
                encrypt: pool.encrypt,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str) -> weft_cluster::NodeView {
        weft_cluster::NodeView {
            member: weft_cluster::MemberRecord {
                name: name.into(),
                ..Default::default()
            },
            alive: None,
            controller: false,
        }
    }

    #[test]
    fn small_clusters_refer_to_all_others_larger_ones_to_a_ring() {
        let names = |count: usize, own: &str| {
            let nodes: Vec<_> = (1..=count).map(|i| view(&format!("n{i}"))).collect();
            let up: Vec<_> = nodes.iter().collect();
            referred(&up, own)
                .map(|n| n.member.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(3, "n1"), ["n2", "n3"]);
        assert_eq!(
            names(4, "n2"),
            ["n3"],
            "16 connections as a mesh, 4 as a ring"
        );
        assert_eq!(names(6, "n2"), ["n3"]);
        assert_eq!(names(6, "n6"), ["n1"], "the ring closes");
    }

    #[test]
    fn nodes_are_known_by_every_address_they_listen_at() {
        let mut n2 = view("n2");
        n2.member.nvme = vec!["10.0.0.2:4420".into(), "10.0.0.2:4421".into()];
        n2.member.peer_nvme = vec!["10.2.0.2:4420".into()];
        let mut n3 = view("n3");
        n3.member.nvme = vec!["[fd00::3]:4420".into(), "not an address".into()];
        let addresses: Vec<String> = node_addresses([n3, n2].iter())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            addresses,
            ["10.0.0.2", "10.2.0.2", "fd00::3"],
            "sorted, once each"
        );
    }

    #[test]
    fn changes_are_sorted_into_served_records_others_and_members() {
        let ours = |_: &str, volume: &str| volume == "db1";
        let mut changed = Changed::default();
        changed.note("nodes/n1/pools/fast", ours);
        assert_eq!(changed, Changed::default(), "pools are the node's own");
        changed.note("hosts/web1", ours);
        assert!(changed.served && !changed.members && !changed.others);
        let mut changed = Changed::default();
        changed.note("volumes/logs", ours);
        assert!(changed.others && !changed.served, "another node's volume");
        changed.note("volumes/db1", ours);
        assert!(changed.served);
        let mut changed = Changed::default();
        changed.note("cluster/alive/n2", ours);
        assert!(changed.members && !changed.served);
        let mut changed = Changed::default();
        changed.note("", ours);
        assert!(
            changed.members && changed.served,
            "the copy read everything again"
        );
    }

    #[test]
    fn a_record_concerns_the_nodes_it_names_anywhere() {
        let record = serde_json::json!({
            "id": "00", "hosts": ["web1"], "qos": {"iops_max": 10},
            "replication": {"epoch": 3, "primary": "n2",
                "members": [{"node": "n2"}, {"node": "n5"}], "move_to": "n7"}
        });
        for node in ["n2", "n5", "n7", "web1"] {
            assert!(names(&record, node), "{node}");
        }
        for node in ["n1", "n", "web", "3"] {
            assert!(!names(&record, node), "{node}");
        }
    }
}
