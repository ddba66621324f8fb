//! Replicated volumes as one node holds them: the record a new replicated
//! volume is claimed with, the replicas this node must hold (created when
//! the record names this node and none of its pools has the volume yet),
//! and how each replica is served: every replica's node exports the
//! volume's subsystem with the same identity (from the record), in an ANA
//! group of its own (the node's ordinal + 1), Optimized on the primary and
//! Inaccessible elsewhere, so that a Linux host connected to every node
//! sees one multipath device and sends I/O to the primary only.
//!
//! What this does not do: copy writes to the replicas, fail over or
//! rebuild (the primary's replicator does, `crate::replication`).

use super::{AdminError, Manager};
use crate::identity;
use crate::link_keys::{LinkKeys, Peer};
use crate::replication::replica_nqn;
use std::sync::Arc;
use weft_control::{ErasureRecord, ReplicaRecord, ReplicaState, ReplicationRecord, VolumeRecord};
use weft_proto::ana::{AnaConfig, AnaGroupId, AnaState};
use weft_proto::fence::FenceAuthority;
use weft_proto::target::{AllowedHost, HostAccess, NamespaceConfig, SubsystemConfig};
use weft_volume::VolumeSpec;

/// Where one replica of a new volume goes (placement chose it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPlacement {
    /// Node.
    pub node: String,
    /// Pool on that node.
    pub pool: String,
}

impl Manager {
    /// The replication record of a new volume `spec` with `replicas`
    /// (the first is this node's, in `pool`), or none for one copy.
    pub(super) fn new_replication(
        &self,
        spec: &VolumeSpec,
        pool: &str,
        replicas: &[ReplicaPlacement],
        erasure: Option<ErasureRecord>,
    ) -> Result<Option<ReplicationRecord>, AdminError> {
        if replicas.len() <= 1 && erasure.is_none() {
            return Ok(None);
        }
        let invalid = |message: String| AdminError::Invalid(message);
        let Some(node) = self.cluster_node.as_deref() else {
            return Err(invalid(
                "replicas need a cluster: start weft serve with --cluster".into(),
            ));
        };
        if replicas[0].node != node || replicas[0].pool != pool {
            return Err(invalid(format!(
                "the first replica must be this node's ({node}, pool {pool}), not {} pool {}",
                replicas[0].node, replicas[0].pool
            )));
        }
        if let Some(erasure) = &erasure {
            check_erasure(spec, erasure, replicas.len())?;
        } else {
            super::intents::check_replicated_size(&spec.name, spec.size_bytes)?;
        }
        let mut nodes: Vec<&str> = replicas.iter().map(|r| r.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        if nodes.len() != replicas.len() {
            return Err(invalid("every replica must be on a node of its own".into()));
        }
        Ok(Some(ReplicationRecord {
            epoch: 1,
            primary: node.to_string(),
            members: replicas
                .iter()
                .map(|r| ReplicaRecord {
                    node: r.node.clone(),
                    pool: r.pool.clone(),
                    state: ReplicaState::InSync,
                })
                .collect(),
            size_bytes: spec.size_bytes,
            block_size: spec.block_size,
            thick: spec.thick,
            encrypted: spec.encrypted,
            move_to: None,
            previous: None,
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure,
            cloned_from: None,
        }))
    }

    /// Creates the replicas the records give this node that none of its
    /// pools holds yet. Each failure is logged and tried again at the next
    /// reconcile: one replica's trouble never stops the others.
    pub(super) fn create_missing_replicas(&mut self) {
        let Some(node) = self.cluster_node.clone() else {
            return;
        };
        let records = match self.desired.volumes() {
            Ok(records) => records,
            Err(error) => {
                log::warn!("replicas: cannot read the volume records: {error}");
                return;
            }
        };
        for (name, record) in records {
            let Some(replication) = &record.replication else {
                continue;
            };
            let Some(member) = replication.member(&node) else {
                continue;
            };
            if replication.primary == node || self.pool_of(&name).is_ok() {
                continue;
            }
            let shard = replication
                .erasure
                .as_ref()
                .and_then(|e| crate::erasure::shard_bytes(replication, e));
            // A pool that encrypts its volumes encrypts this copy too (with
            // this node's key, as every copy has its own).
            let pool_encrypts = match self.pool_encrypts(&member.pool) {
                Ok(encrypts) => encrypts,
                Err(error) => {
                    log::warn!(
                        "volume {name}: its copy waits: pool {}: {error}",
                        member.pool
                    );
                    continue;
                }
            };
            let spec = VolumeSpec {
                name: name.clone(),
                size_bytes: shard.unwrap_or(replication.size_bytes),
                block_size: replication.block_size,
                thick: replication.thick,
                encrypted: replication.encrypted || pool_encrypts,
                compression: weft_volume::compression::Compression::None,
            };
            // A copy made for a new volume (epoch 1, every replica in sync)
            // is as empty as the others; any other may lack writes. (An
            // erasure-coded member has no intent: its primary rebuilds
            // a member that was not in sync.)
            if let Err(error) = self.refuse_copy_in_tiered(&member.pool, &name) {
                log::warn!("volume {name}: cannot create its copy here: {error}");
                continue;
            }
            let fresh = replication.epoch == 1 && member.state == ReplicaState::InSync;
            // The intent first: a copy never exists without it.
            let intent = match (&self.cluster_dir, fresh || shard.is_some()) {
                (Some(dir), false) => super::intents::create_unclean(dir, &name)
                    .map_err(|error| format!("its write intent file: {error}")),
                _ => Ok(()),
            };
            let cloned = replication
                .cloned_from
                .as_ref()
                .filter(|_| member.state == ReplicaState::InSync);
            let created = intent.and_then(|()| {
                self.pool_mut(&member.pool)
                    .and_then(|pool| match cloned {
                        // An erasure-coded clone's member in sync: its
                        // shard of the source's snapshot.
                        Some(source) => {
                            Ok(pool.clone_volume(&source.volume, &source.snapshot, &name)?)
                        }
                        None => Ok(pool.create_volume(&spec)?),
                    })
                    .map_err(|error| error.to_string())
            });
            match created {
                Ok(()) => log::info!(
                    "volume {name}: replica created in pool {} (primary {})",
                    member.pool,
                    replication.primary
                ),
                Err(error) => log::warn!(
                    "volume {name}: cannot create its replica in pool {}: {error}",
                    member.pool
                ),
            }
        }
    }

    /// Deletes the replicas this node holds that their records no longer
    /// name (removed by `volume set --replicas`, or replaced while this
    /// node was down): the primary no longer counts on them. Each failure
    /// is logged and tried again at the next reconcile.
    pub(super) fn drop_removed_replicas(&mut self, plane: &weft_target::DataPlane) {
        let Some(node) = self.cluster_node.clone() else {
            return;
        };
        let local: Vec<(String, String)> = self
            .pools
            .iter()
            .flat_map(|(pool, p)| p.volumes().map(move |v| (pool.clone(), v.name.clone())))
            .collect();
        for (pool, name) in local {
            let Ok(Some(found)) = self
                .desired
                .read::<VolumeRecord>(&format!("volumes/{name}"))
            else {
                continue;
            };
            let Some(replication) = &found.record.replication else {
                continue;
            };
            if replication.member(&node).is_some() || replication.primary == node {
                continue;
            }
            let dropped = self
                .drop_copy_snapshots(&pool, &name)
                .and_then(|()| Ok(self.pool_mut(&pool)?.check_deletable(&name)?))
                .and_then(|()| self.discard_volume(&name, &pool, plane));
            match dropped {
                Ok(()) => log::info!(
                    "volume {name}: this node's replica left the volume (primary {}); its copy in pool {pool} is deleted",
                    replication.primary
                ),
                Err(error) => log::warn!(
                    "volume {name}: this node's replica left the volume, but its copy in pool {pool} cannot be deleted: {error}"
                ),
            }
        }
    }

    /// How this node serves a volume with `record`: its own group, with
    /// the state the record gives this node's replica.
    pub(super) fn ana_of(&self, record: &VolumeRecord) -> AnaConfig {
        let Some(replication) = &record.replication else {
            return AnaConfig::DEFAULT;
        };
        let group =
            AnaGroupId::new(u32::from(self.cluster_ordinal) + 1).expect("ordinals count from 0");
        let primary = self.cluster_node.as_deref() == Some(replication.primary.as_str());
        AnaConfig {
            group,
            state: if primary {
                AnaState::Optimized
            } else {
                AnaState::Inaccessible
            },
        }
    }

    /// Whether volume `name`'s local copy is a replica another node serves
    /// (its record names another primary).
    pub(super) fn is_secondary(&self, name: &str) -> bool {
        let Some(node) = self.cluster_node.as_deref() else {
            return false;
        };
        let Ok(Some(found)) = self
            .desired
            .read::<VolumeRecord>(&format!("volumes/{name}"))
        else {
            return false;
        };
        found
            .record
            .replication
            .is_some_and(|r| r.is_secondary(node))
    }
}

/// Checks a new erasure-coded volume: its layout, its members (one per
/// shard) and its size (whole blocks, and whole chunks' worth of them).
fn check_erasure(
    spec: &VolumeSpec,
    erasure: &ErasureRecord,
    members: usize,
) -> Result<(), AdminError> {
    let layout = weft_ec::Layout::new(erasure.data_shards as usize, erasure.parity_shards as usize)
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
    if members != layout.shards() {
        return Err(AdminError::Invalid(format!(
            "an erasure-coded {layout} volume has {} members, one per node: {members} were placed",
            layout.shards()
        )));
    }
    weft_ec::Geometry::new(layout, erasure.chunk_bytes)
        .map_err(|e| AdminError::Invalid(e.to_string()))?;
    if erasure.chunk_bytes < spec.block_size || erasure.journal_slots == 0 {
        return Err(AdminError::Invalid(format!(
            "a chunk of {} bytes and {} journal slots for {}-byte blocks: give a chunk of whole blocks and a slot at least",
            erasure.chunk_bytes, erasure.journal_slots, spec.block_size
        )));
    }
    Ok(())
}

/// The host NQN a node connects to other nodes' replica subsystems with.
pub fn node_host_nqn(node: &str) -> String {
    format!("nqn.2026-11.io.weft:node:{node}")
}

impl Manager {
    /// The replica subsystem of `volume`, whose host-facing subsystem is
    /// `served`: the same namespace, for the cluster's nodes only, fenced
    /// only by the primary `replication` names at its epoch.
    pub(super) fn replica_subsystem(
        &self,
        volume: &str,
        served: &SubsystemConfig,
        replication: &ReplicationRecord,
    ) -> SubsystemConfig {
        // This node too: a new primary fences its own replica through it.
        let me = self.cluster_node.as_deref().unwrap_or_default();
        let own = Peer {
            name: me.to_string(),
            certificate: self.link_keys.as_ref().and_then(LinkKeys::own_certificate),
        };
        let peers = self
            .cluster_peers
            .iter()
            .chain([&own])
            .filter_map(|peer| {
                // (Without a link secret no node is let in.)
                let credentials = self
                    .link_keys
                    .as_ref()?
                    .between(&peer.name, me, peer)
                    .ok()?;
                Some(AllowedHost {
                    nqn: node_host_nqn(&peer.name),
                    keys: Some(Arc::new(credentials.dhchap)),
                    tls_psk: credentials.tls_psk.map(Arc::new),
                })
            })
            .collect();
        // The primary's writes reach the copy here: hosts' reservations
        // are the primary's to check.
        let namespaces = served
            .namespaces
            .iter()
            .map(|ns| NamespaceConfig {
                reservations: None,
                ..ns.clone()
            })
            .collect();
        SubsystemConfig {
            nqn: replica_nqn(volume),
            namespaces,
            access: HostAccess::Only(peers),
            ana: AnaConfig {
                group: served.ana.group,
                state: AnaState::Optimized,
            },
            fenced: true,
            fence_authority: Some(FenceAuthority {
                host_nqn: node_host_nqn(&replication.primary),
                epoch: replication.epoch,
                waits_for_grants: !weft_cluster::replicas::replica_set(replication)
                    .handed_over_by_previous(),
            }),
            ..served.clone()
        }
    }
}

/// The serial number every replica of a volume reports: from its UUID, so
/// that the host sees one subsystem whichever node it asks.
pub(super) fn replicated_serial(uuid: &[u8; 16]) -> String {
    identity::hex(uuid)[..20].to_string()
}

#[cfg(test)]
mod tests {
    use super::super::claims::tests::{create, member, scratch};
    use super::*;
    use std::sync::Arc;
    use weft_control::{MemoryStore, Store};

    fn spec() -> VolumeSpec {
        VolumeSpec {
            name: "db1".into(),
            size_bytes: 4 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: weft_volume::compression::Compression::None,
        }
    }

    fn placements(on: [(&str, &str); 2]) -> [ReplicaPlacement; 2] {
        on.map(|(node, pool)| ReplicaPlacement {
            node: node.into(),
            pool: pool.into(),
        })
    }

    /// Nodes n1 (ordinal 0) and n2 (ordinal 1) of one cluster; n1 creates
    /// volume "db1" with a replica on each; n2 has not seen it yet.
    fn replicated_volume(test: &str) -> (Manager, Manager) {
        let dir = scratch(test);
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        let mut n2 = member(&store, "n2", &dir);
        n2.cluster_ordinal = 1;
        let placements = placements([("n1", "p"), ("n2", "p")]);
        let chosen = VolumeRecord {
            replication: n1.new_replication(&spec(), "p", &placements, None).unwrap(),
            ..VolumeRecord::default()
        };
        n1.claimed("db1", "p", chosen, create("db1")).unwrap();
        (n1, n2)
    }

    #[test]
    fn every_replica_is_served_with_the_record_identity_in_a_group_of_its_node() {
        let (mut n1, mut n2) = replicated_volume("replicas");
        assert!(n2.pool_of("db1").is_err(), "not yet seen");
        n2.create_missing_replicas();
        assert!(n2.is_secondary("db1") && !n1.is_secondary("db1"));
        let nqn = "nqn.2026-11.io.weft:vol:db1";
        let (e1, e2) = (n1.exports(), n2.exports());
        let (s1, s2) = (
            e1.config.subsystem(nqn).unwrap(),
            e2.config.subsystem(nqn).unwrap(),
        );
        // Devices pair with subsystems by position: the host-facing one
        // carries the volume's meter (its limits and statistics).
        let at = e1.config.subsystem_index(nqn).unwrap();
        assert!(Arc::ptr_eq(&e1.devices[at][0].meter, &n1.meters["db1"]));
        let replica_at = e1.config.subsystem_index(&replica_nqn("db1")).unwrap();
        assert!(!Arc::ptr_eq(
            &e1.devices[replica_at][0].meter,
            &n1.meters["db1"]
        ));
        let (ns1, ns2) = (&s1.namespaces[0], &s2.namespaces[0]);
        assert_eq!(
            (ns1.nguid, ns1.uuid, ns1.eui64, &s1.serial),
            (ns2.nguid, ns2.uuid, ns2.eui64, &s2.serial),
            "one identity on every node"
        );
        // The primary's path is in Change until its replicator serves
        // (here never: the node has no lease).
        assert_eq!((s1.ana.group.get(), s1.ana.state), (1, AnaState::Change));
        assert_eq!(
            (s2.ana.group.get(), s2.ana.state),
            (2, AnaState::Inaccessible)
        );
        let on_one_node = placements([("n1", "p"), ("n1", "p")]);
        assert!(matches!(
            n1.new_replication(&spec(), "p", &on_one_node, None),
            Err(AdminError::Invalid(_))
        ));
        // Each node also exports its replica on a fenced, private subsystem.
        n2.cluster_peers = vec![Peer {
            name: "n1".into(),
            certificate: None,
        }];
        let replica = n2.exports();
        let private = replica.config.subsystem(&replica_nqn("db1")).unwrap();
        assert!(private.fenced && private.access.allows(&node_host_nqn("n1")));
        assert!(!private.access.allows(crate::manager::tests::HOST_NQN));
    }

    /// The primary's node writes to a replica through the replica
    /// subsystem, over NVMe/TCP, once it holds the fence; a newer fence
    /// shuts it out.
    #[test]
    fn a_replica_takes_writes_from_the_fence_holder_only() {
        let (_n1, mut n2) = replicated_volume("replica-fence");
        let intent_path = n2.cluster_dir.clone().unwrap();
        n2.create_missing_replicas();
        n2.cluster_peers = vec![Peer {
            name: "n1".into(),
            certificate: None,
        }];
        let plane = weft_target::DataPlane::start(
            n2.exports(),
            &["127.0.0.1:0".parse().unwrap()],
            1,
            std::time::Duration::ZERO,
            weft_target::PeerLimits::DEFAULT,
            weft_proto::target::DYNAMIC_CNTLIDS,
        )
        .unwrap();
        let handle = n2.handle();
        let trips = Arc::clone(&n2.io_served);
        let plane = Arc::new(plane);
        n2.spawn(Arc::clone(&plane)).unwrap();
        let url = format!("nvme-tcp://{}/{}", plane.listening[0], replica_nqn("db1"));
        let url = weft_initiator::TargetUrl::parse(&url).unwrap();
        let as_node = |node: &str| weft_initiator::ConnectOptions {
            host_nqn: node_host_nqn(node),
            dhchap: Some(crate::link_keys::token_keys("token")),
            ..weft_initiator::ConnectOptions::default()
        };
        let without_secret = weft_initiator::ConnectOptions {
            host_nqn: node_host_nqn("n1"),
            ..weft_initiator::ConnectOptions::default()
        };
        let unproven = weft_initiator::Controller::connect(&url, without_secret, 1)
            .and_then(|c| c.open_io_queue(1).map(drop));
        assert!(
            unproven.is_err(),
            "a node proves it is one of the cluster's"
        );
        let host = weft_initiator::ConnectOptions {
            host_nqn: crate::manager::tests::HOST_NQN.into(),
            ..weft_initiator::ConnectOptions::default()
        };
        assert!(
            weft_initiator::Controller::connect(&url, host, 1).is_err(),
            "hosts may not connect to a replica subsystem"
        );
        let old = weft_initiator::Controller::connect(&url, as_node("n1"), 1).unwrap();
        let mut old_queue = old.open_io_queue(1).unwrap();
        let refused = old_queue.write(1, 0, 4096, &[1; 4096]).unwrap_err();
        assert!(
            matches!(refused, weft_initiator::InitiatorError::Command { status, .. }
                if status == weft_proto::status::Status::RESERVATION_CONFLICT),
            "{refused}"
        );
        let token = |epoch, session| weft_proto::fence::FenceToken { epoch, session };
        assert_eq!(old.fence(token(1, 1)).unwrap(), Ok(()));
        old_queue.write(1, 0, 4096, &[1; 4096]).unwrap();
        // A newer session takes the fence: the old one is out.
        let new = weft_initiator::Controller::connect(&url, as_node("n1"), 1).unwrap();
        let mut new_queue = new.open_io_queue(1).unwrap();
        assert_eq!(new.fence(token(1, 1)).unwrap(), Err(1), "tokens only grow");
        assert_eq!(new.fence(token(1, 2)).unwrap(), Ok(()));
        assert!(old_queue.write(1, 0, 4096, &[9; 4096]).is_err());
        assert_eq!(old.fence(token(1, 1)).unwrap(), Err(1), "out for good");
        // Only the record's primary, at the record's epoch, may fence.
        assert_eq!(old.fence(token(0, 9)).unwrap(), Err(1), "learns epoch 1");
        new_queue.write(1, 1, 4096, &[2; 4096]).unwrap();
        assert_eq!(new_queue.read(1, 0, 4096, 4096).unwrap(), &[1; 4096][..]);
        assert_eq!(new_queue.read(1, 1, 4096, 4096).unwrap(), &[2; 4096][..]);
        // Each write marked its region in the write intent, durably, first.
        let intent = |c: &weft_initiator::Controller| c.write_intent().unwrap().regions;
        let before = trips.load(std::sync::atomic::Ordering::Relaxed);
        new_queue.write(1, 3 << 8, 4096, &[3; 4096]).unwrap();
        assert_eq!(
            trips.load(std::sync::atomic::Ordering::Relaxed) - before,
            1,
            "the first write to a thin region marks its intent and allocates in one trip"
        );
        assert_eq!(intent(&new), vec![0, 3]);
        let file = std::fs::read_to_string(intent_path.join("replicas/db1.intent")).unwrap();
        assert!(file.ends_with("marked 0,3\n"), "{file}");
        new_queue.clean(1, &[0]).unwrap();
        assert_eq!(intent(&new), vec![3]);
        assert!(
            old_queue.clean(1, &[3]).is_err(),
            "only from the fence holder"
        );
        drop((old_queue, new_queue, old, new));
        handle.call(crate::manager::AdminOp::Flush).unwrap();
    }
}
