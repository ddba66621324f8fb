//! Topology: the segments a Kubernetes node reports (`weft.io/node`, its
//! name, and `weft.io/zone` when it was given one) and what the controller
//! makes of a volume's accessibility requirements.
//!
//! Every weft volume is reachable over the storage network from every node,
//! so a requirement never refuses a volume and a volume's accessible
//! topology is empty ("equally accessible from all nodes"): Kubernetes may
//! move its pod anywhere, which is what a compute node's failover needs.
//! Requirements steer where the data goes instead: the first segment (the
//! preferred ones first, then the requisite ones) that names weft storage
//! nodes — the node itself when a storage node has the name (a node that
//! both computes and stores), else the storage nodes of its zone — places
//! the volume on the roomiest of them. GetCapacity answers for the storage
//! nodes a segment names in the same way (every pool when it names none).
//!
//! What this does not do: place anything on a single node without a
//! cluster (it has one place), or constrain a replicated volume's other
//! replicas (placement keeps them on distinct nodes and zones).

use crate::csi::{Topology, TopologyRequirement};
use serde_json::Value;
use std::collections::HashMap;

/// The segment key of a node's name.
pub const NODE_KEY: &str = "weft.io/node";
/// The segment key of a node's zone.
pub const ZONE_KEY: &str = "weft.io/zone";

/// The topology a Kubernetes node reports in NodeGetInfo.
pub(crate) fn of_node(name: &str, zone: Option<&str>) -> Topology {
    let mut segments = HashMap::from([(NODE_KEY.to_string(), name.to_string())]);
    if let Some(zone) = zone {
        segments.insert(ZONE_KEY.to_string(), zone.to_string());
    }
    Topology { segments }
}

/// The storage nodes (the API's node views) that are up and that `segment`
/// names; none when it names none.
pub(crate) fn named<'a>(nodes: &'a [Value], segment: &HashMap<String, String>) -> Vec<&'a Value> {
    let up = nodes.iter().filter(|node| node["state"] == "up");
    if let Some(name) = segment.get(NODE_KEY) {
        let itself: Vec<&Value> = up.clone().filter(|node| node["name"] == *name).collect();
        if !itself.is_empty() {
            return itself;
        }
    }
    match segment.get(ZONE_KEY) {
        Some(zone) => up.filter(|node| node["zone"] == *zone).collect(),
        None => Vec::new(),
    }
}

/// Where a volume with `requirement` goes: the roomiest storage node the
/// first segment that names any names (preferred segments first); for an
/// `encrypted` one, only nodes holding key-encryption keys count.
pub(crate) fn choose(
    nodes: &[Value],
    requirement: &TopologyRequirement,
    encrypted: bool,
) -> Option<String> {
    requirement
        .preferred
        .iter()
        .chain(&requirement.requisite)
        .map(|topology| {
            let mut named = named(nodes, &topology.segments);
            named.retain(|node| !encrypted || node["keys"] == true);
            named
        })
        .find(|named| !named.is_empty())?
        .into_iter()
        .max_by_key(|node| free_bytes(node, None))
        .and_then(|node| node["name"].as_str())
        .map(str::to_string)
}

/// Free bytes of `node`'s pools that have not failed (only `pool`, if given).
pub(crate) fn free_bytes(node: &Value, pool: Option<&str>) -> u64 {
    node["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["failed"] != true && pool.is_none_or(|name| p["name"] == name))
        .map(|p| {
            let capacity = p["capacity_bytes"].as_u64().unwrap_or(0);
            capacity.saturating_sub(p["allocated_bytes"].as_u64().unwrap_or(0))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nodes() -> Vec<Value> {
        let node = |name: &str, zone: &str, state: &str, free: u64| {
            json!({"name": name, "zone": zone, "state": state, "keys": name != "s2", "pools": [
                {"name": "p", "capacity_bytes": 100 + free, "allocated_bytes": 100, "failed": false},
                {"name": "q", "capacity_bytes": 1000, "allocated_bytes": 0, "failed": true},
            ]})
        };
        vec![
            node("s1", "z1", "up", 10),
            node("s2", "z1", "up", 30),
            node("s3", "z2", "up", 20),
            node("s4", "z2", "down", 90),
        ]
    }

    fn segment(pairs: &[(&str, &str)]) -> Topology {
        Topology {
            segments: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn a_segment_names_its_storage_node_or_else_its_zone() {
        let nodes = nodes();
        let names = |pairs: &[(&str, &str)]| -> Vec<String> {
            named(&nodes, &segment(pairs).segments)
                .iter()
                .map(|n| n["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(&[(NODE_KEY, "s3"), (ZONE_KEY, "z1")]), ["s3"]);
        assert_eq!(
            names(&[(NODE_KEY, "worker-7"), (ZONE_KEY, "z1")]),
            ["s1", "s2"]
        );
        assert_eq!(names(&[(NODE_KEY, "worker-7")]), Vec::<String>::new());
        assert_eq!(names(&[(ZONE_KEY, "z2")]), ["s3"], "s4 is down");
        assert_eq!(names(&[("other.io/rack", "r1")]), Vec::<String>::new());
    }

    #[test]
    fn the_first_segment_that_names_nodes_places_the_volume_on_the_roomiest() {
        let nodes = nodes();
        let requirement = TopologyRequirement {
            requisite: vec![segment(&[(ZONE_KEY, "z2")])],
            preferred: vec![
                segment(&[(NODE_KEY, "worker-7")]),
                segment(&[(NODE_KEY, "worker-8"), (ZONE_KEY, "z1")]),
            ],
        };
        assert_eq!(choose(&nodes, &requirement, false).as_deref(), Some("s2"));
        // s2 holds no keys: an encrypted volume goes to s1, the next in z1.
        assert_eq!(choose(&nodes, &requirement, true).as_deref(), Some("s1"));
        let requirement = TopologyRequirement {
            requisite: vec![segment(&[(NODE_KEY, "worker-7")])],
            preferred: Vec::new(),
        };
        assert_eq!(choose(&nodes, &requirement, false), None, "anywhere");
        assert_eq!(
            free_bytes(&nodes[1], None),
            30,
            "the failed pool does not count"
        );
        assert_eq!(free_bytes(&nodes[1], Some("q")), 0);
    }

    #[test]
    fn a_node_reports_its_name_and_its_zone() {
        let topology = of_node("worker-7", Some("z1"));
        assert_eq!(topology.segments[NODE_KEY], "worker-7");
        assert_eq!(topology.segments[ZONE_KEY], "z1");
        assert_eq!(of_node("worker-7", None).segments.len(), 1);
    }
}
