//! The cluster's records and their keys in the store.
//!
//! - `cluster/id`: [`ClusterRecord`], written once by the first node; every
//!   data directory that joined remembers it, so that a node is never
//!   started against another cluster's store by mistake.
//! - `cluster/members/<node>`: [`MemberRecord`], a node's name, identity,
//!   addresses and the operator's flags; it stays while the node is down.
//! - `cluster/alive/<node>`: [`AliveRecord`] under the node's lease: it
//!   exists exactly while the node is up, and carries its heartbeat and
//!   capacity.
//! - `cluster/controller`: the elected controller, under its lease.
//! - `cluster/ordinals/<k>`: the node holding ordinal `k` (its name): a small
//!   number, unique in the cluster and kept for the node's life, from which
//!   the node draws its NVMe controller IDs and its ANA group (two nodes
//!   exporting one subsystem must never give a host the same controller ID).

use serde::{Deserialize, Serialize};

/// Key of the cluster's identity.
pub const CLUSTER_KEY: &str = "cluster/id";
/// Prefix of membership records.
pub const MEMBERS_PREFIX: &str = "cluster/members/";
/// Prefix of liveness records.
pub const ALIVE_PREFIX: &str = "cluster/alive/";
/// Key of the elected controller.
pub const CONTROLLER_KEY: &str = "cluster/controller";
/// Prefix of ordinal claims.
pub const ORDINALS_PREFIX: &str = "cluster/ordinals/";
/// Ordinals are `0..ORDINALS_MAX`: each takes a range of 1,023 controller
/// IDs (`weft_proto::target::cntlid_range_for_ordinal`), and the dynamic
/// controller IDs end at FFEFh.
pub const ORDINALS_MAX: u16 = 63;
/// Longest node name (a DNS label).
pub const NODE_NAME_BYTES_MAX: usize = 63;

/// Key of node `name`'s membership record.
pub fn member_key(name: &str) -> String {
    format!("{MEMBERS_PREFIX}{name}")
}

/// Key of the claim of ordinal `k`.
pub fn ordinal_key(k: u16) -> String {
    format!("{ORDINALS_PREFIX}{k}")
}

/// Key of node `name`'s liveness record.
pub fn alive_key(name: &str) -> String {
    format!("{ALIVE_PREFIX}{name}")
}

/// The cluster's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    /// 32 hex digits, random.
    pub id: String,
    /// When the first node created it (Unix milliseconds).
    pub created_unix_ms: u64,
}

/// A node of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    /// Its name (`--node`).
    pub name: String,
    /// The node id of its data directory (hex): the name belongs to it.
    pub node_id: String,
    /// Where hosts reach its NVMe/TCP listeners (`address:port`).
    pub nvme: Vec<String>,
    /// Where the other nodes reach them, for replication, when that is not
    /// where hosts do (none: the same).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_nvme: Vec<String>,
    /// Its API (`http[s]://address:port`).
    pub api: String,
    /// Its failure domain, if the operator gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// No new volumes are placed on it.
    #[serde(default)]
    pub cordoned: bool,
    /// When it last joined (Unix milliseconds).
    pub joined_unix_ms: u64,
    /// When the controller saw it go down (Unix milliseconds), if it is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_since_unix_ms: Option<u64>,
    /// Its ordinal (see `cluster/ordinals/`); records written before
    /// ordinals existed have none until the node joins again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordinal: Option<u16>,
    /// Its certificate from the cluster CA (hex DER), when it has one:
    /// the other nodes derive the secrets of their replication links with
    /// it from it (checked against the CA, so the store cannot forge one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
}

/// One pool of a node, as placement and `weft node list` see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSummary {
    /// Pool name.
    pub name: String,
    /// Usable bytes.
    pub capacity_bytes: u64,
    /// Bytes allocated to volumes and snapshots.
    pub allocated_bytes: u64,
    /// Sum of its volumes' sizes (thin volumes may promise more than the capacity).
    #[serde(default)]
    pub provisioned_bytes: u64,
    /// Whether the pool has failed (no volume goes there).
    #[serde(default)]
    pub failed: bool,
    /// Every volume created in it is encrypted (its other members then
    /// go only to nodes holding keys).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
}

impl PoolSummary {
    /// Bytes not yet allocated.
    pub fn free_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.allocated_bytes)
    }

    /// Bytes not yet promised to volumes.
    pub fn unpromised_bytes(&self) -> u64 {
        self.capacity_bytes.saturating_sub(self.provisioned_bytes)
    }
}

/// A node that is up: written under its lease, rewritten at a heartbeat
/// when its status changed (and at least every
/// [`crate::membership::STATUS_REFRESH_MS`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AliveRecord {
    /// The node id of the process holding the name.
    pub node_id: String,
    /// When it last wrote this record (Unix milliseconds).
    pub heartbeat_unix_ms: u64,
    /// Its pools.
    pub pools: Vec<PoolSummary>,
    /// Volumes it serves.
    pub volumes: u32,
    /// It holds key-encryption keys: encrypted volumes may be placed on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keys: bool,
    /// Its weft version.
    pub version: String,
}

/// The elected controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerRecord {
    /// The node.
    pub node: String,
    /// When it was elected (Unix milliseconds).
    pub since_unix_ms: u64,
}

/// Checks a node name: 1 to 63 lowercase letters, digits and `-`, starting
/// with a letter or digit (a DNS label, so it fits hostnames and topology keys).
pub fn check_node_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= NODE_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid node name: use 1 to {NODE_NAME_BYTES_MAX} lowercase letters, digits and '-', starting with a letter or digit (e.g. n1, rack2-node3)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_dns_labels() {
        for good in ["n1", "rack2-node3", "7"] {
            assert!(check_node_name(good).is_ok(), "{good}");
        }
        for bad in ["", "N1", "-a", "a_b", "a/b", &"x".repeat(64)] {
            let message = check_node_name(bad).unwrap_err();
            assert!(message.contains("lowercase"), "{message}");
        }
    }

    #[test]
    fn free_bytes_never_go_below_zero() {
        let pool = PoolSummary {
            name: "p".into(),
            capacity_bytes: 10,
            allocated_bytes: 12,
            provisioned_bytes: 20,
            failed: false,
            encrypt: false,
        };
        assert_eq!(pool.free_bytes(), 0);
        assert_eq!(pool.unpromised_bytes(), 0);
    }
}
