//! The cluster as this node sees it, for alerts: the members of its
//! replicated and erasure-coded volumes with their role and standing (from
//! the volumes' records), and the node's own name. Every node holding a
//! member exports the same members; alerts take the maximum over nodes.

use super::Exposition;
use crate::status::VolumeStatus;
use weft_control::ReplicaState;

/// Appends `weft_volume_member` for every member of `volumes` that are
/// replicated or erasure-coded.
pub fn volume_members(text: &mut String, volumes: &[VolumeStatus]) {
    let mut out = Exposition(std::mem::take(text));
    let name = "weft_volume_member";
    out.family(
        name,
        "gauge",
        "1 for each member of a replicated or erasure-coded volume, by node, role (primary or replica) and state (in_sync or faulted), as its record says.",
    );
    for volume in volumes {
        let Some(record) = &volume.replication else {
            continue;
        };
        for member in &record.members {
            let role = if member.node == record.primary {
                "primary"
            } else {
                "replica"
            };
            let state = match member.state {
                ReplicaState::InSync => "in_sync",
                ReplicaState::Faulted { .. } => "faulted",
            };
            let labels = format!(
                "volume=\"{}\",node=\"{}\",role=\"{role}\",state=\"{state}\"",
                volume.info.name, member.node
            );
            out.sample(name, &labels, 1);
        }
    }
    *text = out.0;
}

/// Appends `weft_node_info`: this node's name in its cluster (empty for a
/// single node), so that alerts can tell which nodes still report.
pub fn node_info(text: &mut String, node: &str) {
    let mut out = Exposition(std::mem::take(text));
    out.family(
        "weft_node_info",
        "gauge",
        "1, labelled with the node's name in its cluster (empty for a single node) and weft's version.",
    );
    let labels = format!("node=\"{node}\",version=\"{}\"", env!("CARGO_PKG_VERSION"));
    out.sample("weft_node_info", &labels, 1);
    *text = out.0;
}
