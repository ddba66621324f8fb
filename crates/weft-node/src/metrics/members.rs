//! The cluster as this node sees it, for alerts: the members of its
//! replicated and erasure-coded volumes with their role and standing, and
//! the epoch of the record that says so, and the node's own name. Every
//! node holding a member exports them from its copy of the record; alerts
//! keep what the nodes with the newest epoch say (a node cut off from the
//! store may hold an old record). Node names are in `weft_node` labels (a
//! `node` label is often a target label of Kubernetes service discovery).

use super::{escape, Exposition};
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
        "1 for each member of a replicated or erasure-coded volume, by node (weft_node), role (primary or replica) and state (in_sync or faulted), as its record says.",
    );
    let replicated: Vec<_> = volumes
        .iter()
        .filter_map(|v| Some((escape(&v.info.name), v.replication.as_ref()?)))
        .collect();
    for (volume, record) in &replicated {
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
                "volume=\"{volume}\",weft_node=\"{}\",role=\"{role}\",state=\"{state}\"",
                escape(&member.node)
            );
            out.sample(name, &labels, 1);
        }
    }
    let epoch = "weft_volume_epoch";
    out.family(
        epoch,
        "gauge",
        "The epoch of the record weft_volume_member comes from (each promotion raises it): the highest is the newest.",
    );
    for (volume, record) in &replicated {
        out.sample(epoch, &format!("volume=\"{volume}\""), record.epoch);
    }
    *text = out.0;
}

/// Appends `weft_node_info`: this node's name in its cluster (`weft_node`,
/// empty for a single node), so that alerts can tell which nodes report.
pub fn node_info(text: &mut String, node: &str) {
    let mut out = Exposition(std::mem::take(text));
    out.family(
        "weft_node_info",
        "gauge",
        "1, labelled with the node's name in its cluster (empty for a single node) and weft's version.",
    );
    let labels = format!(
        "weft_node=\"{}\",version=\"{}\"",
        escape(node),
        env!("CARGO_PKG_VERSION")
    );
    out.sample("weft_node_info", &labels, 1);
    *text = out.0;
}
