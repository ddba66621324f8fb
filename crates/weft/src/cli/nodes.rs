//! `weft node list|show|cordon|uncordon|remove`: the cluster's nodes.

use super::Show;
use serde_json::Value;
use weft_api::views::NodeView;
use weft_storage::human_bytes;

/// Method, API path, body and how to print the answer of `weft node VERB`.
pub(super) fn command(
    verb: &str,
    name: Result<String, String>,
) -> Result<(&'static str, String, Option<Value>, Show), String> {
    Ok(match verb {
        "list" => ("GET", "nodes".to_string(), None, Show::Nodes),
        "show" => ("GET", format!("nodes/{}", name?), None, Show::Node),
        "cordon" => (
            "POST",
            format!("nodes/{}/cordon", name?),
            None,
            Show::Done("cordoned: no new volume is placed on it"),
        ),
        "uncordon" => (
            "POST",
            format!("nodes/{}/uncordon", name?),
            None,
            Show::Done("uncordoned"),
        ),
        "remove" => (
            "DELETE",
            format!("nodes/{}", name?),
            None,
            Show::Done("removed"),
        ),
        "drain" => (
            "POST",
            format!("nodes/{}/drain", name?),
            None,
            Show::Done("drained: cordoned, and no replicated volume's primary is on it"),
        ),
        _ => {
            return Err(format!(
                "unknown command `weft node {verb}`; the node commands are list, show, cordon, uncordon, drain and remove"
            ))
        }
    })
}

/// Time since `unix_ms`, e.g. "2s ago".
fn ago(unix_ms: Option<u64>) -> String {
    let Some(then) = unix_ms else {
        return "-".into();
    };
    let now = weft_cluster::agent::unix_ms();
    let seconds = now.saturating_sub(then) / 1000;
    match seconds {
        0..=119 => format!("{seconds}s ago"),
        120..=7199 => format!("{}m ago", seconds / 60),
        _ => format!("{}h ago", seconds / 3600),
    }
}

pub(super) fn print_list(nodes: &[NodeView]) {
    outln!(
        "{:<10} {:<9} {:<22} {:<28} {:>10} {:>10} {:>7}  POOLS",
        "NAME",
        "STATE",
        "NVME/TCP",
        "API",
        "REPORTED",
        "CAPACITY",
        "VOLUMES"
    );
    for node in nodes {
        let state = if node.controller {
            format!("{}*", node.state)
        } else {
            node.state.clone()
        };
        let pools: Vec<&str> = node.pools.iter().map(|p| p.name.as_str()).collect();
        outln!(
            "{:<10} {:<9} {:<22} {:<28} {:>10} {:>10} {:>7}  {}",
            node.name,
            state,
            node.nvme.join(","),
            node.api,
            ago(node.heartbeat_unix_ms),
            human_bytes(node.capacity_bytes),
            node.volumes,
            if pools.is_empty() {
                "-".into()
            } else {
                pools.join(", ")
            }
        );
    }
    if nodes.iter().any(|n| n.controller) {
        outln!("(* the cluster's controller)");
    }
}

pub(super) fn print_one(node: &NodeView) {
    outln!("name        {}", node.name);
    outln!(
        "state       {}{}",
        node.state,
        if node.controller { " (controller)" } else { "" }
    );
    if let Some(since) = node.down_since_unix_ms {
        outln!("down since  {}", ago(Some(since)));
    }
    outln!("node id     {}", node.node_id);
    outln!("nvme/tcp    {}", node.nvme.join(", "));
    outln!("api         {}", node.api);
    outln!("zone        {}", node.zone.as_deref().unwrap_or("-"));
    if let Some(ordinal) = node.ordinal {
        let first = u32::from(ordinal) * 0x400 + 1;
        outln!(
            "ordinal     {ordinal} (controller IDs {first:#06x}..={:#06x})",
            first + 0x3fe
        );
    }
    outln!("reported    {}", ago(node.heartbeat_unix_ms));
    outln!("version     {}", node.version.as_deref().unwrap_or("-"));
    outln!("volumes     {}", node.volumes);
    outln!(
        "capacity    {} ({} allocated)",
        human_bytes(node.capacity_bytes),
        human_bytes(node.allocated_bytes)
    );
    for pool in &node.pools {
        outln!(
            "  pool {:<16} {:>10} {:>10} allocated{}",
            pool.name,
            human_bytes(pool.capacity_bytes),
            human_bytes(pool.allocated_bytes),
            if pool.failed { "  FAILED" } else { "" }
        );
    }
}
