//! What the API shows: the JSON form of the node's pools, volumes and hosts
//! (documented in `openapi.json`), made from weft-node's domain structs.
//! The CLI reads them back from the API's answers.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use weft_control::QosLimits;
use weft_node::identity::hex;
use weft_node::{Authentication, HostStatus, PoolStatus, VolumeStatus};

/// A pool as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolView {
    /// Name.
    pub name: String,
    /// Member devices.
    pub devices: Vec<PathBuf>,
    /// Allocation unit in bytes.
    pub allocation_unit_bytes: u32,
    /// Bytes of data space.
    pub capacity_bytes: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Bytes free.
    pub free_bytes: u64,
    /// Sum of volume sizes.
    pub provisioned_bytes: u64,
    /// Provisioned / capacity.
    pub overcommit: f64,
    /// Volumes.
    pub volumes: usize,
    /// Snapshots.
    pub snapshots: usize,
    /// "online", or "failed": every I/O on its volumes fails until cleared.
    pub state: String,
    /// Why it failed.
    pub failure: Option<String>,
    /// In a cluster: the node it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Every volume created in it is encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// What its volumes of one copy are compressed with unless they ask
    /// otherwise ("lz4" or "zstd").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<String>,
    /// Its write tier, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_tier: Option<WriteTierView>,
    /// What its compressed volumes store, if it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<PoolCompressionView>,
}

/// What a pool's compressed volumes store.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolCompressionView {
    /// Bytes of their units written (what they would take uncompressed).
    pub logical_bytes: u64,
    /// Bytes their extents take.
    pub stored_bytes: u64,
    /// Bytes of the allocation units holding the extents (with what the
    /// cleaner has yet to reclaim).
    pub segment_bytes: u64,
    /// Logical / stored.
    pub ratio: f64,
}

/// A compressed volume's algorithm and what it saves.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompressionView {
    /// "lz4" or "zstd".
    pub algorithm: String,
    /// Bytes of its units written (what they would take uncompressed).
    pub logical_bytes: u64,
    /// Bytes their extents take.
    pub stored_bytes: u64,
    /// Logical / stored.
    pub ratio: f64,
}

/// Logical over stored, 1 when nothing is stored.
fn ratio(logical_bytes: u64, stored_bytes: u64) -> f64 {
    match stored_bytes {
        0 => 1.0,
        stored => logical_bytes as f64 / stored as f64,
    }
}

/// A pool's write tier.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WriteTierView {
    /// Its device.
    pub device: PathBuf,
    /// Bytes of its log.
    pub capacity_bytes: u64,
    /// Bytes of its log that hold writes not destaged yet.
    pub used_bytes: u64,
}

/// A pool with its devices, as `weft pool show` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolDetail {
    /// The pool.
    #[serde(flatten)]
    pub pool: PoolView,
    /// Its devices, in stripe order.
    pub members: Vec<PoolMemberView>,
}

/// One device of a pool.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PoolMemberView {
    /// Path.
    pub path: PathBuf,
    /// Device size in bytes.
    pub size_bytes: u64,
    /// Bytes of data space on it.
    pub capacity_bytes: u64,
    /// Bytes of it in use.
    pub allocated_bytes: u64,
    /// Holds a copy of the pool's metadata (checkpoints and journal).
    pub metadata_copy: bool,
    /// "online", or "failed" with its pool.
    pub state: String,
}

/// A volume as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct VolumeView {
    /// Name.
    pub name: String,
    /// Pool.
    pub pool: String,
    /// Subsystem NQN it is served as.
    pub nqn: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Logical block size.
    pub block_size: u32,
    /// Preallocated.
    pub thick: bool,
    /// Bytes of allocation units it maps.
    pub allocated_bytes: u64,
    /// "volume@snapshot" it was cloned from, until flattened.
    pub origin: Option<String>,
    /// Snapshot names.
    pub snapshots: Vec<String>,
    /// Hosts connected now.
    pub connected_hosts: Vec<String>,
    /// Namespace NGUID (hex).
    pub nguid: String,
    /// Namespace UUID (8-4-4-4-12 hex).
    #[serde(default)]
    pub uuid: String,
    /// Hosts allowed to connect (names).
    pub hosts: Vec<String>,
    /// I/O limits.
    pub qos: QosView,
    /// "online", or "failed" (its pool failed: every I/O fails until cleared).
    pub state: String,
    /// Why its pool failed.
    pub failure: Option<String>,
    /// In a cluster: the node that serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// A replicated volume's replicas, the primary first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Vec<ReplicaView>>,
    /// A replicated volume's snapshots: where each is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_copies: Option<Vec<SnapshotCopiesView>>,
    /// An erasure-coded volume's stripe and the raw capacity it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasure: Option<ErasureView>,
    /// Encryption at rest, if it is encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionView>,
    /// Compression, if it is compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionView>,
}

/// A volume's encryption at rest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EncryptionView {
    /// The cipher: "aes-256-xts".
    pub cipher: String,
    /// The key-encryption key its data key is wrapped with (its id).
    pub kek_id: String,
    /// "unlocked", or "locked": the node lacks that key and serves nothing of it.
    pub state: String,
}

/// An erasure-coded volume's stripe (its `replicas` are the stripe's members).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErasureView {
    /// `K+M`: data and parity shards per stripe.
    pub layout: String,
    /// A chunk's bytes (one member's part of a stripe).
    pub chunk_bytes: u32,
    /// The bytes its members' shard volumes take together (provisioned:
    /// thin shards allocate as written): parity and journals included.
    pub raw_bytes: u64,
    /// Raw bytes per usable byte, `(K+M)/K` and the journals.
    pub raw_per_usable: f64,
}

/// The erasure view of a volume record's replication part, if erasure-coded.
pub(crate) fn erasure_view(replication: &weft_control::ReplicationRecord) -> Option<ErasureView> {
    let erasure = replication.erasure?;
    let layout =
        weft_ec::Layout::new(erasure.data_shards as usize, erasure.parity_shards as usize).ok()?;
    let geometry = weft_ec::Geometry::new(layout, erasure.chunk_bytes).ok()?;
    let journal = weft_ec::JournalLayout {
        slots: erasure.journal_slots,
        block_bytes: replication.block_size,
        chunk_bytes: erasure.chunk_bytes,
    };
    let shard = journal.data_base() + geometry.shard_volume_bytes(replication.size_bytes);
    let raw_bytes = shard * layout.shards() as u64;
    Some(ErasureView {
        layout: layout.to_string(),
        chunk_bytes: erasure.chunk_bytes,
        raw_bytes,
        raw_per_usable: raw_bytes as f64 / replication.size_bytes.max(1) as f64,
    })
}

/// A replicated volume's snapshot and the nodes whose copies hold it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotCopiesView {
    /// Its name.
    pub name: String,
    /// "taken", or "taking" (being taken, or left so by a failure: delete
    /// it or take it again).
    pub state: String,
    /// The nodes whose copies hold it (a clone is made on one of them).
    pub nodes: Vec<String>,
}

/// The snapshots of `replication`, as the record lists them.
pub(crate) fn snapshot_copies(
    replication: &weft_control::ReplicationRecord,
) -> Vec<SnapshotCopiesView> {
    replication
        .snapshots
        .iter()
        .map(|s| SnapshotCopiesView {
            name: s.name.clone(),
            state: if s.taking { "taking" } else { "taken" }.into(),
            nodes: replication.holders(s),
        })
        .collect()
}

/// The names of the snapshots of `replication`.
pub(crate) fn snapshot_names(replication: &weft_control::ReplicationRecord) -> Vec<String> {
    replication
        .snapshots
        .iter()
        .map(|s| s.name.clone())
        .collect()
}

/// One replica of a replicated volume.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReplicaView {
    /// The node that holds it.
    pub node: String,
    /// Its pool there.
    pub pool: String,
    /// "primary" (serves hosts) or "replica".
    pub role: String,
    /// "in-sync", "rebuilding" (being copied to), "faulted" (to be rebuilt)
    /// or "retiring" (being removed).
    pub state: String,
    /// While it is rebuilt: its progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebuild: Option<RebuildView>,
    /// Why it is not in sync, when it is faulted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A rebuild's progress.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RebuildView {
    /// Bytes copied.
    pub done_bytes: u64,
    /// Bytes to copy in all.
    pub total_bytes: u64,
    /// Bytes per second since it began.
    pub rate_bytes_per_s: u64,
    /// Seconds left at that rate (null before anything was copied).
    pub eta_s: Option<u64>,
}

impl From<&weft_node::status::RebuildStatus> for RebuildView {
    fn from(rebuild: &weft_node::status::RebuildStatus) -> Self {
        RebuildView {
            done_bytes: rebuild.done_bytes,
            total_bytes: rebuild.total_bytes,
            rate_bytes_per_s: rebuild.rate_bytes_per_s,
            eta_s: rebuild.eta_s,
        }
    }
}

/// The replicas of `replication`, primary first, with the progress of
/// those being rebuilt (`rebuilds`, known on the primary's node).
pub(crate) fn replica_views(
    replication: &weft_control::ReplicationRecord,
    rebuilds: &[ReplicaRebuild],
) -> Vec<ReplicaView> {
    let mut views: Vec<ReplicaView> = replication
        .members
        .iter()
        .map(|member| {
            let rebuild = rebuilds
                .iter()
                .find(|(node, _)| *node == member.node)
                .map(|(_, view)| view.clone());
            let retiring = replication.retire.contains(&member.node);
            let state = match member.state {
                _ if retiring => "retiring",
                weft_control::ReplicaState::InSync => "in-sync",
                weft_control::ReplicaState::Faulted { .. } if rebuild.is_some() => "rebuilding",
                weft_control::ReplicaState::Faulted { .. } => "faulted",
            };
            let reason = match member.state {
                weft_control::ReplicaState::Faulted { .. } if retiring => None,
                weft_control::ReplicaState::Faulted { epoch: 0 } => {
                    Some("new: built in full once its node answers".to_string())
                }
                weft_control::ReplicaState::Faulted { epoch } if epoch < replication.epoch => Some(format!(
                    "out of sync since epoch {epoch} (node down, I/O error or too slow): built in full once its node answers"
                )),
                weft_control::ReplicaState::Faulted { .. } => Some(
                    "missed writes (node down, I/O error, too slow, or a power loss): rebuilt once its node answers".to_string(),
                ),
                weft_control::ReplicaState::InSync => None,
            };
            ReplicaView {
                reason,
                node: member.node.clone(),
                pool: member.pool.clone(),
                role: match (member.node == replication.primary, replication.erasure) {
                    (true, _) => "primary",
                    (false, Some(_)) => "member",
                    (false, None) => "replica",
                }
                .into(),
                state: state.into(),
                rebuild,
            }
        })
        .collect();
    views.sort_by_key(|view| view.role != "primary");
    views
}

/// A replica's node and its rebuild's progress.
pub(crate) type ReplicaRebuild = (String, RebuildView);

/// A volume's I/O limits; `null` is unlimited.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct QosView {
    /// I/O commands per second, reads and writes together.
    pub iops_max: Option<u64>,
    /// Bytes per second, reads and writes together.
    pub bw_max: Option<u64>,
    /// Read commands per second.
    pub read_iops_max: Option<u64>,
    /// Bytes read per second.
    pub read_bw_max: Option<u64>,
    /// Write commands per second.
    pub write_iops_max: Option<u64>,
    /// Bytes written per second.
    pub write_bw_max: Option<u64>,
}

/// A host as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostView {
    /// Name.
    pub name: String,
    /// NQN.
    pub nqn: String,
    /// DH-HMAC-CHAP: "none", "host" (the host proves its secret) or
    /// "bidirectional" (the controller proves its own too). Secrets are never shown.
    pub dhchap: String,
    /// The Diffie-Hellman group of its DH-HMAC-CHAP exchanges
    /// (`ffdhe2048`..`ffdhe8192`); absent: the NULL group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_group: Option<String>,
    /// Whether it connects only over TLS (NVMe/TCP TLS 1.3 with its PSK,
    /// never shown).
    #[serde(default)]
    pub tls: bool,
    /// Volumes attached to it.
    pub volumes: Vec<String>,
}

/// A pool's or volume's state as the API names it.
fn state_name(failure: &Option<String>) -> String {
    if failure.is_some() {
        "failed"
    } else {
        "online"
    }
    .to_string()
}

impl From<&PoolStatus> for PoolView {
    fn from(pool: &PoolStatus) -> PoolView {
        let info = &pool.info;
        PoolView {
            name: info.name.clone(),
            devices: pool.devices.clone(),
            allocation_unit_bytes: info.chunk_bytes,
            capacity_bytes: info.capacity_bytes,
            allocated_bytes: info.allocated_bytes,
            free_bytes: info.capacity_bytes - info.allocated_bytes,
            provisioned_bytes: info.provisioned_bytes,
            overcommit: info.provisioned_bytes as f64 / info.capacity_bytes as f64,
            volumes: info.volumes,
            snapshots: info.snapshots,
            state: state_name(&pool.failure),
            failure: pool.failure.clone(),
            node: None,
            encrypt: pool.encrypt,
            compress: pool.compression.clone(),
            write_tier: pool.write_tier.as_ref().map(|tier| WriteTierView {
                device: tier.device.clone(),
                capacity_bytes: tier.info.capacity_bytes,
                used_bytes: tier.info.used_bytes,
            }),
            compression: (info.segment_bytes > 0 || info.compressed_logical_bytes > 0).then(|| {
                PoolCompressionView {
                    logical_bytes: info.compressed_logical_bytes,
                    stored_bytes: info.compressed_stored_bytes,
                    segment_bytes: info.segment_bytes,
                    ratio: ratio(info.compressed_logical_bytes, info.compressed_stored_bytes),
                }
            }),
        }
    }
}

impl From<&PoolStatus> for PoolDetail {
    fn from(pool: &PoolStatus) -> PoolDetail {
        let view = PoolView::from(pool);
        let members = pool
            .devices
            .iter()
            .zip(pool.members.iter())
            .map(|(path, usage)| PoolMemberView {
                path: path.clone(),
                size_bytes: usage.size_bytes,
                capacity_bytes: usage.capacity_bytes,
                allocated_bytes: usage.allocated_bytes,
                metadata_copy: usage.metadata_copy,
                state: view.state.clone(),
            })
            .collect();
        PoolDetail {
            pool: view,
            members,
        }
    }
}

impl From<&VolumeStatus> for VolumeView {
    fn from(volume: &VolumeStatus) -> VolumeView {
        let info = &volume.info;
        VolumeView {
            name: info.name.clone(),
            pool: volume.pool.clone(),
            nqn: volume.nqn.clone(),
            // An erasure-coded volume's local volume is one member's shard.
            size_bytes: match &volume.replication {
                Some(r) if r.erasure.is_some() => r.size_bytes,
                _ => info.size_bytes,
            },
            block_size: info.block_size,
            thick: info.thick,
            allocated_bytes: info.allocated_bytes,
            origin: info
                .origin
                .as_ref()
                .map(|o| format!("{}@{}", o.volume, o.snapshot)),
            snapshots: match &volume.replication {
                Some(replication) => snapshot_names(replication),
                None => info.snapshots.iter().map(|(n, _, _)| n.clone()).collect(),
            },
            connected_hosts: volume.connected_hosts.clone(),
            nguid: hex(&volume.nguid),
            uuid: weft_proto::types::uuid_text(&volume.uuid),
            hosts: volume.hosts.clone(),
            qos: QosView::from(volume.qos),
            state: match info.encryption {
                Some(e) if !e.unlocked && volume.failure.is_none() => "locked".into(),
                _ => state_name(&volume.failure),
            },
            failure: volume.failure.clone(),
            node: None,
            replicas: volume.replication.as_ref().map(|replication| {
                let rebuilds: Vec<ReplicaRebuild> = volume
                    .rebuilds
                    .iter()
                    .map(|r| (r.replica.clone(), RebuildView::from(r)))
                    .collect();
                replica_views(replication, &rebuilds)
            }),
            snapshot_copies: volume.replication.as_ref().map(snapshot_copies),
            erasure: volume.replication.as_ref().and_then(erasure_view),
            encryption: info.encryption.map(|e| EncryptionView {
                cipher: "aes-256-xts".into(),
                kek_id: e.kek_id.to_string(),
                state: if e.unlocked { "unlocked" } else { "locked" }.into(),
            }),
            compression: info.compression.map(|c| CompressionView {
                algorithm: c.algorithm.name().into(),
                logical_bytes: c.logical_bytes,
                stored_bytes: c.stored_bytes,
                ratio: ratio(c.logical_bytes, c.stored_bytes),
            }),
        }
    }
}

impl From<QosLimits> for QosView {
    fn from(qos: QosLimits) -> QosView {
        QosView {
            iops_max: qos.iops_max,
            bw_max: qos.bw_max,
            read_iops_max: qos.read_iops_max,
            read_bw_max: qos.read_bw_max,
            write_iops_max: qos.write_iops_max,
            write_bw_max: qos.write_bw_max,
        }
    }
}

impl From<&HostStatus> for HostView {
    fn from(host: &HostStatus) -> HostView {
        HostView {
            name: host.name.clone(),
            nqn: host.nqn.clone(),
            dhchap: match host.authentication {
                Authentication::None => "none",
                Authentication::Host => "host",
                Authentication::Bidirectional => "bidirectional",
            }
            .to_string(),
            dhchap_group: host.dh_group.clone(),
            tls: host.tls,
            volumes: host.volumes.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use weft_volume::{MemberUsage, PoolInfo};

    /// The JSON shape the CLI and the OpenAPI document expect, field for field.
    #[test]
    fn a_pool_shows_its_figures_state_and_members() {
        let status = PoolStatus {
            devices: vec!["/d0".into(), "/d1".into()],
            info: PoolInfo {
                name: "fast".into(),
                uuid: [0; 16],
                chunk_bytes: 1 << 20,
                members: 2,
                capacity_bytes: 4 << 20,
                allocated_bytes: 1 << 20,
                provisioned_bytes: 8 << 20,
                volumes: 1,
                snapshots: 0,
                compressed_logical_bytes: 0,
                compressed_stored_bytes: 0,
                segment_bytes: 0,
            },
            members: Arc::from([true, false].map(|metadata_copy| MemberUsage {
                size_bytes: 3 << 20,
                capacity_bytes: 2 << 20,
                allocated_bytes: 1 << 19,
                metadata_copy,
            })),
            failure: Some("fdatasync failed".into()),
            encrypt: false,
            compression: None,
            write_tier: Some(weft_node::WriteTierStatus {
                device: "/t".into(),
                info: weft_volume::TierInfo {
                    capacity_bytes: 1 << 20,
                    used_bytes: 8192,
                    blocks: 1,
                },
            }),
        };
        let json = serde_json::to_value(PoolDetail::from(&status)).unwrap();
        assert_eq!(json["name"], "fast");
        assert_eq!(json["write_tier"]["device"], "/t");
        assert_eq!(json["write_tier"]["used_bytes"], 8192);
        assert_eq!(json["free_bytes"], 3 << 20);
        assert_eq!(json["overcommit"], 2.0);
        assert_eq!(json["state"], "failed");
        assert_eq!(json["members"][1]["path"], "/d1");
        assert_eq!(json["members"][1]["metadata_copy"], false);
        assert_eq!(json["members"][0]["state"], "failed");
        let back: PoolDetail = serde_json::from_value(json).unwrap();
        assert_eq!(back.pool, PoolView::from(&status));
    }

    #[test]
    fn replicas_show_primary_first_and_why_one_is_not_in_sync() {
        use weft_control::{ReplicaRecord, ReplicaState, ReplicationRecord};
        let member = |node: &str, state| ReplicaRecord {
            node: node.into(),
            pool: "p".into(),
            state,
        };
        let replication = ReplicationRecord {
            epoch: 4,
            primary: "n2".into(),
            members: vec![
                member("n1", ReplicaState::Faulted { epoch: 3 }),
                member("n2", ReplicaState::InSync),
                member("n3", ReplicaState::Faulted { epoch: 0 }),
                member("n4", ReplicaState::InSync),
            ],
            size_bytes: 1 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            move_to: None,
            previous: None,
            retire: vec!["n4".into()],
            snapshots: Vec::new(),
            erasure: None,
            cloned_from: None,
        };
        let views = replica_views(&replication, &[]);
        let shown: Vec<(&str, &str, &str)> = views
            .iter()
            .map(|v| (v.node.as_str(), v.role.as_str(), v.state.as_str()))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("n2", "primary", "in-sync"),
                ("n1", "replica", "faulted"),
                ("n3", "replica", "faulted"),
                ("n4", "replica", "retiring"),
            ]
        );
        let reason = |i: usize| views[i].reason.clone().unwrap_or_default();
        assert!(reason(1).contains("since epoch 3") && reason(1).contains("in full"));
        assert!(reason(2).starts_with("new"), "{}", reason(2));
        assert!(views[0].reason.is_none() && views[3].reason.is_none());
    }
}

/// A node of the cluster as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodeView {
    /// Name.
    pub name: String,
    /// Its identity (hex; from its data directory).
    pub node_id: String,
    /// NVMe/TCP addresses (discovery and I/O).
    pub nvme: Vec<String>,
    /// API address.
    pub api: String,
    /// Failure domain.
    pub zone: Option<String>,
    /// Its ordinal in the cluster: it hands out NVMe controller IDs
    /// `ordinal * 0x400 + 1 ..= ordinal * 0x400 + 0x3ff`.
    pub ordinal: Option<u16>,
    /// "up", "cordoned" (up, takes no new volumes) or "down".
    pub state: String,
    /// Whether it is the cluster's controller now.
    pub controller: bool,
    /// When it last reported its status (Unix milliseconds), while up: at
    /// each change, and at least every minute.
    pub heartbeat_unix_ms: Option<u64>,
    /// When it was seen going down (Unix milliseconds).
    pub down_since_unix_ms: Option<u64>,
    /// Its pools as its last heartbeat reported them.
    pub pools: Vec<NodePoolView>,
    /// Bytes of its pools' data space.
    pub capacity_bytes: u64,
    /// Bytes allocated in them.
    pub allocated_bytes: u64,
    /// Volumes it serves.
    pub volumes: u32,
    /// Its weft version.
    pub version: Option<String>,
    /// It holds key-encryption keys (encrypted volumes may go there).
    #[serde(default)]
    pub keys: bool,
}

/// One pool of a node, from its heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NodePoolView {
    /// Name.
    pub name: String,
    /// Bytes of data space.
    pub capacity_bytes: u64,
    /// Bytes allocated.
    pub allocated_bytes: u64,
    /// Whether it failed.
    pub failed: bool,
    /// Every volume created in it is encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
}

impl From<&weft_cluster::NodeView> for NodeView {
    fn from(node: &weft_cluster::NodeView) -> NodeView {
        let alive = node.alive.as_ref();
        let pools: Vec<NodePoolView> = alive
            .map(|a| a.pools.as_slice())
            .unwrap_or_default()
            .iter()
            .map(|pool| NodePoolView {
                name: pool.name.clone(),
                capacity_bytes: pool.capacity_bytes,
                allocated_bytes: pool.allocated_bytes,
                failed: pool.failed,
                encrypt: pool.encrypt,
            })
            .collect();
        NodeView {
            name: node.member.name.clone(),
            node_id: node.member.node_id.clone(),
            nvme: node.member.nvme.clone(),
            api: node.member.api.clone(),
            zone: node.member.zone.clone(),
            ordinal: node.member.ordinal,
            state: node.state().to_string(),
            controller: node.controller,
            heartbeat_unix_ms: alive.map(|a| a.heartbeat_unix_ms),
            down_since_unix_ms: node.member.down_since_unix_ms,
            capacity_bytes: pools.iter().map(|p| p.capacity_bytes).sum(),
            allocated_bytes: pools.iter().map(|p| p.allocated_bytes).sum(),
            pools,
            volumes: alive.map_or(0, |a| a.volumes),
            version: alive.map(|a| a.version.clone()),
            keys: alive.is_some_and(|a| a.keys),
        }
    }
}
