//! Where a new volume goes.
//!
//! Policy: among the pools of nodes that are up and not cordoned (or of the
//! node the operator names, which must be up and not cordoned), not failed
//! (or the pool the operator names), large enough to ever hold the volume
//! (a thick volume: with that much free), the pool with the most room
//! wins: for a thick volume the most free bytes, for a thin one the most
//! bytes not yet promised to volumes (capacity less provisioned sizes, as a
//! thin volume's size is a promise: otherwise every thin volume would go to
//! one node until hosts write). Ties go to the node with the fewest volumes
//! recorded in the store (fresher than heartbeats: a burst of creates
//! between two heartbeats spreads), then to the first node and pool by name,
//! so that the choice is the same on every node for the same cluster state.
//!
//! A replicated volume's first replica (its primary) is placed that way;
//! each further one the same way among the nodes not chosen yet, in zones
//! not chosen yet (a node without a zone is a zone of its own), so that one
//! zone's loss never takes every replica. Too few zones is an error, not a
//! silent doubling up.

use crate::nodes::{NodeState, NodeView};
use std::collections::BTreeMap;
use weft_control::{Store, StoreError, VolumeRecord};

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementRequest<'a> {
    /// The volume's size.
    pub size_bytes: u64,
    /// Whether its space is allocated at creation.
    pub thick: bool,
    /// Whether it is encrypted: only nodes holding keys take it.
    pub encrypted: bool,
    /// The node the operator chose.
    pub node: Option<&'a str>,
    /// The pool the operator chose.
    pub pool: Option<&'a str>,
    /// How many volumes the store records on each node.
    pub volumes_by_node: &'a BTreeMap<String, usize>,
}

/// The chosen node and pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Node name.
    pub node: String,
    /// Pool name on that node.
    pub pool: String,
}

/// Why no place was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The named node does not exist.
    #[error("no node named {0}; `weft node list` shows the cluster's nodes")]
    NoSuchNode(String),
    /// The named node cannot take volumes.
    #[error("node {node} is {state}: {hint}")]
    NodeUnavailable {
        /// The node.
        node: String,
        /// Its state.
        state: NodeState,
        /// What to do.
        hint: &'static str,
    },
    /// The named pool is nowhere to be found on the eligible nodes.
    #[error(
        "no pool named {0} on a node that is up and not cordoned; `weft pool list` shows the pools"
    )]
    NoSuchPool(String),
    /// No node can take volumes.
    #[error("no node is up and uncordoned with a pool: create a pool (`weft pool create`) or start or uncordon a node")]
    NoNode,
    /// No node that could take it holds key-encryption keys.
    #[error("an encrypted volume goes only to nodes holding key-encryption keys, and {0}: start weft serve with --kek-file or --kek-command there")]
    NoKeys(String),
    /// Fewer eligible zones than replicas.
    #[error("{replicas} replicas need {replicas} nodes in distinct zones with a pool that can hold the volume (and key-encryption keys, for an encrypted one); only {found} were found: ask for fewer replicas, or add, start or uncordon nodes (in other zones)")]
    TooFewZones {
        /// Replicas asked for.
        replicas: usize,
        /// Nodes found in distinct zones.
        found: usize,
    },
    /// No pool is large enough.
    #[error("no pool can hold {size_bytes} bytes{}: the largest {} has {best_bytes}; add devices (`weft pool add-device`) or ask for less", if *thick { " allocated now (thick)" } else { "" }, if *thick { "free space" } else { "capacity" })]
    NoRoom {
        /// Requested size.
        size_bytes: u64,
        /// Whether it was thick.
        thick: bool,
        /// The best a pool offers.
        best_bytes: u64,
    },
}

/// Chooses a node and pool for a new volume among `nodes`.
pub fn place(
    nodes: &BTreeMap<String, NodeView>,
    request: PlacementRequest<'_>,
) -> Result<Placement, PlacementError> {
    if let Some(name) = request.node {
        let node = nodes
            .get(name)
            .ok_or_else(|| PlacementError::NoSuchNode(name.to_string()))?;
        match node.state() {
            NodeState::Up => {}
            state @ NodeState::Down => {
                return Err(PlacementError::NodeUnavailable {
                    node: name.to_string(),
                    state,
                    hint: "start it, or leave out --node to let weft choose",
                })
            }
            state @ NodeState::Cordoned => {
                return Err(PlacementError::NodeUnavailable {
                    node: name.to_string(),
                    state,
                    hint: "`weft node uncordon` it first, or choose another node",
                })
            }
        }
    }
    let candidates: Vec<(&str, &crate::records::PoolSummary)> = nodes
        .values()
        .filter(|node| node.state() == NodeState::Up)
        .filter(|node| request.node.is_none_or(|name| node.member.name == name))
        .filter_map(|node| Some((node.member.name.as_str(), node.alive.as_ref()?)))
        .flat_map(|(name, alive)| alive.pools.iter().map(move |pool| (name, pool)))
        .filter(|(_, pool)| !pool.failed)
        .filter(|(_, pool)| request.pool.is_none_or(|name| pool.name == name))
        .collect();
    let unkeyed = |name: &str| {
        !nodes
            .get(name)
            .and_then(|n| n.alive.as_ref())
            .is_some_and(|a| a.keys)
    };
    if request.encrypted && !candidates.is_empty() {
        if let Some(node) = request.node.filter(|name| unkeyed(name)) {
            return Err(PlacementError::NoKeys(format!("node {node} holds none")));
        }
        if candidates.iter().all(|(name, _)| unkeyed(name)) {
            return Err(PlacementError::NoKeys(
                "no node that could take it holds any".into(),
            ));
        }
    }
    let candidates: Vec<_> = candidates
        .into_iter()
        .filter(|(name, _)| !request.encrypted || !unkeyed(name))
        .collect();
    if candidates.is_empty() {
        return Err(match request.pool {
            Some(pool) => PlacementError::NoSuchPool(pool.to_string()),
            None => PlacementError::NoNode,
        });
    }
    let room = |pool: &crate::records::PoolSummary| {
        if request.thick {
            pool.free_bytes()
        } else {
            pool.capacity_bytes
        }
    };
    let score = |pool: &crate::records::PoolSummary| {
        if request.thick {
            pool.free_bytes()
        } else {
            pool.unpromised_bytes()
        }
    };
    let volumes = |node: &str| request.volumes_by_node.get(node).copied().unwrap_or(0);
    let best_bytes = candidates.iter().map(|(_, p)| room(p)).max().unwrap_or(0);
    // Most room first; then fewest volumes; by name (node, then pool) among equals.
    candidates
        .iter()
        .filter(|(_, pool)| room(pool) >= request.size_bytes)
        .min_by(|(node_a, a), (node_b, b)| {
            score(b)
                .cmp(&score(a))
                .then_with(|| volumes(node_a).cmp(&volumes(node_b)))
                .then_with(|| node_a.cmp(node_b))
                .then_with(|| a.name.cmp(&b.name))
        })
        .map(|(node, pool)| Placement {
            node: node.to_string(),
            pool: pool.name.clone(),
        })
        .ok_or(PlacementError::NoRoom {
            size_bytes: request.size_bytes,
            thick: request.thick,
            best_bytes,
        })
}

/// Chooses a node and pool for each of `replicas` replicas of a new volume:
/// the first as [`place`] does (it honours the operator's node), the others
/// on other nodes in other zones (the operator's pool name, if given, on each).
pub fn place_replicas(
    nodes: &BTreeMap<String, NodeView>,
    request: PlacementRequest<'_>,
    replicas: usize,
) -> Result<Vec<Placement>, PlacementError> {
    assert!(replicas >= 1, "a volume has a replica");
    let first = place(nodes, request)?;
    // A pool that encrypts its volumes makes this one encrypted: its
    // other members go only where keys are.
    let encrypts = nodes
        .get(&first.node)
        .and_then(|node| node.alive.as_ref())
        .is_some_and(|alive| {
            alive
                .pools
                .iter()
                .any(|p| p.name == first.pool && p.encrypt)
        });
    let others = PlacementRequest {
        node: None,
        encrypted: request.encrypted || encrypts,
        ..request
    };
    let mut chosen = place_more(nodes, others, &[first.node.as_str()], replicas - 1)?;
    chosen.insert(0, first);
    Ok(chosen)
}

/// Chooses a node and pool for each of `count` more replicas of a volume
/// whose replicas are on the nodes `taken` (up or not, even forgotten):
/// each on another node in another zone, as [`place`] chooses among those.
pub fn place_more(
    nodes: &BTreeMap<String, NodeView>,
    request: PlacementRequest<'_>,
    taken: &[&str],
    count: usize,
) -> Result<Vec<Placement>, PlacementError> {
    let mut zones: Vec<String> = taken
        .iter()
        .map(|name| nodes.get(*name).map_or(*name, zone).to_string())
        .collect();
    let mut chosen: Vec<Placement> = Vec::new();
    while chosen.len() < count {
        let rest: BTreeMap<String, NodeView> = nodes
            .iter()
            .filter(|(_, view)| !zones.iter().any(|z| z == zone(view)))
            .map(|(name, view)| (name.clone(), view.clone()))
            .collect();
        match place(&rest, request) {
            Ok(placement) => {
                zones.push(zone(&nodes[&placement.node]).to_string());
                chosen.push(placement);
            }
            Err(
                PlacementError::NoNode
                | PlacementError::NoSuchPool(_)
                | PlacementError::NoRoom { .. }
                | PlacementError::NoKeys(_),
            ) => {
                return Err(PlacementError::TooFewZones {
                    replicas: taken.len() + count,
                    found: taken.len() + chosen.len(),
                })
            }
            Err(other) => return Err(other),
        }
    }
    Ok(chosen)
}

/// How many volumes (replicas included) the store records on each node:
/// placement's tie-breaker.
pub fn volumes_by_node(store: &dyn Store) -> Result<BTreeMap<String, usize>, StoreError> {
    let mut counts = BTreeMap::new();
    for entry in store.list("volumes/")?.entries {
        let Ok(record) = serde_json::from_value::<VolumeRecord>(entry.value) else {
            continue;
        };
        let mut holders: Vec<String> = record.node.into_iter().collect();
        if let Some(replication) = record.replication {
            holders.extend(replication.members.into_iter().map(|m| m.node));
        }
        holders.sort_unstable();
        holders.dedup();
        for node in holders {
            *counts.entry(node).or_insert(0) += 1;
        }
    }
    Ok(counts)
}

/// A node's zone: the one it carries, else its name (a zone of its own).
fn zone(node: &NodeView) -> &str {
    node.member.zone.as_deref().unwrap_or(&node.member.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{AliveRecord, MemberRecord, PoolSummary};

    const GIB: u64 = 1 << 30;

    fn node(name: &str, up: bool, cordoned: bool, pools: &[(&str, u64, u64)]) -> NodeView {
        NodeView {
            member: MemberRecord {
                name: name.into(),
                node_id: format!("id-{name}"),
                nvme: vec![],
                peer_nvme: Vec::new(),
                api: String::new(),
                zone: None,
                cordoned,
                joined_unix_ms: 0,
                down_since_unix_ms: None,
                ordinal: None,
                certificate: None,
            },
            alive: up.then(|| AliveRecord {
                node_id: format!("id-{name}"),
                heartbeat_unix_ms: 0,
                pools: pools
                    .iter()
                    .map(|&(name, capacity, allocated)| PoolSummary {
                        name: name.into(),
                        capacity_bytes: capacity * GIB,
                        allocated_bytes: allocated * GIB,
                        provisioned_bytes: allocated * GIB,
                        failed: false,
                        encrypt: false,
                    })
                    .collect(),
                volumes: 0,
                keys: true,
                version: String::new(),
            }),
            controller: false,
        }
    }

    fn cluster() -> BTreeMap<String, NodeView> {
        [
            node("n1", true, false, &[("fast", 100, 90), ("slow", 100, 50)]),
            node("n2", true, false, &[("fast", 100, 20)]),
            node("n3", false, false, &[]),
            node("n4", true, true, &[("fast", 1000, 0)]),
        ]
        .into_iter()
        .map(|n| (n.member.name.clone(), n))
        .collect()
    }

    static NO_VOLUMES: BTreeMap<String, usize> = BTreeMap::new();

    fn request(size_gib: u64) -> PlacementRequest<'static> {
        PlacementRequest {
            size_bytes: size_gib * GIB,
            thick: false,
            encrypted: false,
            node: None,
            pool: None,
            volumes_by_node: &NO_VOLUMES,
        }
    }

    fn placed(node: &str, pool: &str) -> Result<Placement, PlacementError> {
        Ok(Placement {
            node: node.into(),
            pool: pool.into(),
        })
    }

    /// Encrypted volumes go only to nodes holding keys, or are refused
    /// saying so.
    #[test]
    fn encrypted_volumes_go_only_to_nodes_holding_keys() {
        let mut nodes = cluster();
        nodes.get_mut("n2").unwrap().alive.as_mut().unwrap().keys = false;
        let encrypted = PlacementRequest {
            encrypted: true,
            ..request(10)
        };
        assert_eq!(place(&nodes, encrypted), placed("n1", "slow"));
        assert_eq!(place(&nodes, request(10)), placed("n2", "fast"));
        let on_n2 = PlacementRequest {
            node: Some("n2"),
            ..encrypted
        };
        let error = place(&nodes, on_n2).unwrap_err();
        assert!(error.to_string().contains("node n2 holds none"), "{error}");
        nodes.get_mut("n1").unwrap().alive.as_mut().unwrap().keys = false;
        let error = place(&nodes, encrypted).unwrap_err();
        assert!(matches!(error, PlacementError::NoKeys(_)), "{error}");
        assert!(error.to_string().contains("--kek-file"), "{error}");
        // A pool that is not there is named as such, keys or none.
        let nope = PlacementRequest {
            pool: Some("nope"),
            ..encrypted
        };
        let error = place(&nodes, nope).unwrap_err();
        assert_eq!(error, PlacementError::NoSuchPool("nope".into()));
    }

    /// A volume whose first member lands in a pool that encrypts is
    /// encrypted: its other members go only to nodes holding keys; too few
    /// of them is too few zones (so a replacement may fall back as usual).
    #[test]
    fn a_pool_that_encrypts_sends_the_other_members_to_nodes_holding_keys() {
        let mut nodes = cluster();
        let n2 = nodes.get_mut("n2").unwrap().alive.as_mut().unwrap();
        n2.pools[0].encrypt = true;
        nodes.get_mut("n1").unwrap().alive.as_mut().unwrap().keys = false;
        let error = place_replicas(&nodes, request(10), 2).unwrap_err();
        assert!(
            matches!(error, PlacementError::TooFewZones { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("key-encryption keys"), "{error}");
        nodes.get_mut("n1").unwrap().alive.as_mut().unwrap().keys = true;
        let placed = place_replicas(&nodes, request(10), 2).unwrap();
        let on: Vec<&str> = placed.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(on, ["n2", "n1"]);
    }

    #[test]
    fn the_pool_with_most_free_bytes_on_an_up_uncordoned_node_wins() {
        assert_eq!(place(&cluster(), request(10)), placed("n2", "fast"));
        let on_n1 = PlacementRequest {
            node: Some("n1"),
            ..request(10)
        };
        assert_eq!(place(&cluster(), on_n1), placed("n1", "slow"));
        let fast = PlacementRequest {
            pool: Some("fast"),
            ..request(10)
        };
        assert_eq!(place(&cluster(), fast), placed("n2", "fast"));
    }

    #[test]
    fn equal_pools_go_by_name_so_every_node_chooses_the_same() {
        let nodes: BTreeMap<_, _> = [
            node("b", true, false, &[("p", 10, 0)]),
            node("a", true, false, &[("q", 10, 0), ("p", 10, 0)]),
        ]
        .into_iter()
        .map(|n| (n.member.name.clone(), n))
        .collect();
        assert_eq!(place(&nodes, request(1)), placed("a", "p"));
        // Between heartbeats, volumes recorded since spread the next ones.
        let recorded = BTreeMap::from([("a".to_string(), 2)]);
        let spread = PlacementRequest {
            volumes_by_node: &recorded,
            ..request(1)
        };
        assert_eq!(place(&nodes, spread), placed("b", "p"));
    }

    #[test]
    fn thin_volumes_go_where_least_is_promised() {
        let mut nodes: BTreeMap<_, _> = [
            node("a", true, false, &[("p", 10, 1)]),
            node("b", true, false, &[("p", 10, 1)]),
        ]
        .into_iter()
        .map(|n| (n.member.name.clone(), n))
        .collect();
        let pools = &mut nodes.get_mut("a").unwrap().alive.as_mut().unwrap().pools;
        pools[0].provisioned_bytes = 8 * GIB;
        assert_eq!(place(&nodes, request(1)), placed("b", "p"));
        let thick = PlacementRequest {
            thick: true,
            encrypted: false,
            ..request(1)
        };
        assert_eq!(
            place(&nodes, thick),
            placed("a", "p"),
            "equal free space: by name"
        );
    }

    #[test]
    fn thin_volumes_need_capacity_and_thick_ones_free_space() {
        assert_eq!(place(&cluster(), request(100)), placed("n2", "fast"));
        let thick = PlacementRequest {
            thick: true,
            encrypted: false,
            ..request(85)
        };
        assert_eq!(
            place(&cluster(), thick),
            Err(PlacementError::NoRoom {
                size_bytes: 85 * GIB,
                thick: true,
                best_bytes: 80 * GIB
            })
        );
        let message = place(&cluster(), request(101)).unwrap_err().to_string();
        assert!(message.contains("add devices"), "{message}");
    }

    #[test]
    fn replicas_go_to_distinct_nodes_and_zones() {
        let nodes = cluster();
        let two = place_replicas(&nodes, request(10), 2).unwrap();
        assert_eq!(
            two,
            [placed("n2", "fast").unwrap(), placed("n1", "slow").unwrap()]
        );
        let pinned = PlacementRequest {
            node: Some("n1"),
            ..request(10)
        };
        let on_n1 = place_replicas(&nodes, pinned, 2).unwrap();
        assert_eq!(
            (on_n1[0].node.as_str(), on_n1[1].node.as_str()),
            ("n1", "n2")
        );
        assert_eq!(
            place_replicas(&nodes, request(10), 3),
            Err(PlacementError::TooFewZones {
                replicas: 3,
                found: 2
            }),
            "n3 is down and n4 cordoned"
        );
        let mut zoned = cluster();
        zoned.get_mut("n1").unwrap().member.zone = Some("rack-a".into());
        zoned.get_mut("n2").unwrap().member.zone = Some("rack-a".into());
        let message = place_replicas(&zoned, request(10), 2)
            .unwrap_err()
            .to_string();
        assert!(message.contains("distinct zones"), "{message}");
    }

    #[test]
    fn down_cordoned_and_unknown_nodes_are_refused_with_what_to_do() {
        for (name, expected) in [
            ("n3", "is down"),
            ("n4", "uncordon"),
            ("n9", "no node named"),
        ] {
            let message = place(
                &cluster(),
                PlacementRequest {
                    node: Some(name),
                    ..request(1)
                },
            )
            .unwrap_err()
            .to_string();
            assert!(message.contains(expected), "{name}: {message}");
        }
        let none: BTreeMap<_, _> = [node("n3", false, false, &[])]
            .into_iter()
            .map(|n| (n.member.name.clone(), n))
            .collect();
        assert_eq!(place(&none, request(1)), Err(PlacementError::NoNode));
        let pool = PlacementRequest {
            pool: Some("nvme"),
            ..request(1)
        };
        assert_eq!(
            place(&cluster(), pool),
            Err(PlacementError::NoSuchPool("nvme".into()))
        );
    }
}
