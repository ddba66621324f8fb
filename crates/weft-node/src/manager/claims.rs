//! Volume names in a cluster. A volume's name is its NQN, so it must be
//! unique among all nodes: before a node creates a volume it claims the
//! name in the shared store (compare-and-swap on `volumes/<name>`, so of two
//! nodes creating `db1` at once exactly one wins), then creates it, then
//! records the new volume's id. An identity chosen for it (an NQN, UUID or
//! NGUID) is claimed in the same transaction (`identities/...`), so that of
//! two volumes choosing one at once, on any nodes, one is created. A claim
//! whose creation failed is given back with its identities; one left by a
//! crash in between is found at the next start.
//!
//! A single node (no cluster) claims nothing: its own pools are the only
//! place a name can be taken.

use super::{AdminError, Manager, ServedIdentity, VolumeIdentity};
use std::path::PathBuf;
use std::sync::Arc;

/// Who a node is in its cluster, as the manager needs it.
#[derive(Debug, Clone)]
pub struct ClusterRole {
    /// Its name.
    pub node: String,
    /// Its ordinal (ANA group and controller-ID range).
    pub ordinal: u16,
    /// The cluster's API token: the seal of secrets in the store derives
    /// from it, and so do the replication links' secrets when `pair` is none.
    pub token: String,
    /// The node's half of the secrets it shares with each other node
    /// (its certificate): the replication links' secrets derive from them.
    pub pair: Option<Arc<dyn crate::link_keys::PairSecrets>>,
    /// Its data directory (its replicas' write intents are kept there).
    pub data_dir: PathBuf,
    /// How long it may trust its cluster lease (the primaries of
    /// replicated volumes serve within it).
    pub lease: Arc<weft_cluster::LeaseClock>,
    /// How fast its primaries copy to a replica they rebuild (per volume).
    pub rebuild_bytes_per_s: u64,
}
use crate::identity;
use weft_control::records::IDENTITIES_PREFIX;
use weft_control::{Revision, StoreError, VolumeRecord};

fn volume_key(name: &str) -> String {
    format!("volumes/{name}")
}

impl Manager {
    /// Makes the manager a member of a cluster as `role.node`: from now on
    /// volume names are claimed in the shared store. The records of the
    /// volumes this node holds are checked first: each names this node and
    /// its pool, and claims left by a creation that never finished are given
    /// back. `role` says who the node is in the cluster.
    pub fn join_cluster(&mut self, role: ClusterRole) -> Result<(), StoreError> {
        let ClusterRole {
            node,
            ordinal,
            token,
            data_dir,
            lease,
            rebuild_bytes_per_s,
            pair,
        } = role;
        let node = node.as_str();
        self.cluster_node = Some(node.to_string());
        self.cluster_ordinal = ordinal;
        self.link_keys = Some(match pair {
            Some(pair) => crate::link_keys::LinkKeys::of_certificates(pair),
            None => crate::link_keys::LinkKeys::of_token(&token),
        });
        self.seal = Some(super::sealed::Seal::of_cluster_token(&token));
        self.seal_stored_secrets()?;
        self.cluster_dir = Some(data_dir);
        self.cluster_lease = Some(lease);
        self.rebuild_bytes_per_s = rebuild_bytes_per_s;
        let local: Vec<(String, String, String)> = self
            .pools
            .iter()
            .flat_map(|(pool_name, pool)| {
                pool.volumes()
                    .map(move |v| (pool_name.clone(), v.name.clone(), identity::hex(&v.id)))
            })
            .collect();
        for (pool, name, id) in &local {
            self.record_local_volume(node, pool, name, id)?;
        }
        for (name, record) in self.desired.volumes()? {
            let ours = record.node.as_deref() == Some(node);
            if !ours || local.iter().any(|(_, local, _)| *local == name) {
                continue;
            }
            let key = volume_key(&name);
            if record.id.is_empty() {
                if let Some(found) = self.desired.read::<VolumeRecord>(&key)? {
                    self.store_write(|d| d.unclaim_volume(&name, found.revision))?;
                    log::info!("volume {name}: its creation on this node never finished; the name is free again");
                }
            } else {
                log::warn!("volume {name} is recorded on this node (pool {}), but none of its pools holds it; `weft volume delete {name}` forgets it", record.pool.as_deref().unwrap_or("?"));
            }
        }
        self.create_missing_replicas();
        Ok(())
    }

    /// Runs `create` (which creates volume `name` in `pool`) under a claim
    /// of the name when the node is in a cluster; `chosen` holds the
    /// identity chosen for it (recorded with it).
    pub(super) fn claimed(
        &mut self,
        name: &str,
        pool: &str,
        chosen: VolumeRecord,
        create: impl FnOnce(&mut Manager) -> Result<(), AdminError>,
    ) -> Result<(), AdminError> {
        let Some(node) = self.cluster_node.clone() else {
            create(self)?;
            if chosen != VolumeRecord::default() {
                let id = identity::hex(&self.pools[pool].volume_info(name)?.id);
                self.store_write(|d| {
                    d.change_volume(name, &id, |record| {
                        record.nqn = chosen.nqn.clone();
                        record.uuid = chosen.uuid.clone();
                        record.nguid = chosen.nguid.clone();
                    })
                })?;
            }
            return Ok(());
        };
        let key = volume_key(name);
        let claim = VolumeRecord {
            node: Some(node.clone()),
            pool: Some(pool.to_string()),
            ..chosen
        };
        let revision = self.claim(name, &node, &claim)?;
        if let Err(error) = create(self) {
            if let Err(store) = self.store_write(|d| d.unclaim_volume(name, revision)) {
                log::warn!("volume {name}: giving back its name after a failed creation: {store} (the next start does)");
            }
            return Err(error);
        }
        let id = identity::hex(&self.pools[pool].volume_info(name)?.id);
        let mut record = VolumeRecord {
            id: id.clone(),
            ..claim
        };
        if record.replication.is_some() {
            // Every replica serves one identity: the record's, never a local id.
            record.uuid.get_or_insert_with(|| id.clone());
            record.nguid.get_or_insert(id);
        }
        self.store_write(|d| d.update(&key, &record, revision))?;
        Ok(())
    }

    /// Forgets the record of volume `name` if it says this node holds it
    /// (it does not: called when no pool has it); whether there was one.
    pub(super) fn forget_missing(&mut self, name: &str) -> Result<bool, AdminError> {
        let Some(node) = &self.cluster_node else {
            return Ok(false);
        };
        let key = volume_key(name);
        match self.desired.read::<VolumeRecord>(&key)? {
            Some(found) if found.record.node.as_deref() == Some(node) => {
                self.store_write(|d| d.unclaim_volume(name, found.revision))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The NQN volume `name` (of this node) is served as.
    pub(super) fn served_nqn(&self, name: &str) -> Result<String, AdminError> {
        let pool = self.pool_of(name)?;
        let id = self.pools[&pool].volume_info(name)?.id;
        let record = self.volume_record(name, &id);
        Ok(ServedIdentity::of(name, &id, &record).nqn)
    }

    /// Checks that no other volume (of the cluster, or of this node) is
    /// served with what `identity` chooses for volume `name`; the record
    /// fields that keep the choice.
    pub(super) fn check_identity_free(
        &self,
        name: &str,
        identity: &VolumeIdentity,
    ) -> Result<VolumeRecord, AdminError> {
        let chosen = VolumeRecord {
            nqn: identity.nqn.clone(),
            uuid: identity.uuid.map(|b| identity::hex(&b)),
            nguid: identity.nguid.map(|b| identity::hex(&b)),
            ..VolumeRecord::default()
        };
        if chosen == VolumeRecord::default() {
            return Ok(chosen);
        }
        let mut served: Vec<(String, ServedIdentity)> = Vec::new();
        for (other, record) in self.desired.volumes()? {
            let id = identity::parse_hex16(&record.id).unwrap_or_default();
            served.push((other.clone(), ServedIdentity::of(&other, &id, &record)));
        }
        for pool in self.pools.values() {
            for volume in pool.volumes() {
                let record = self.volume_record(&volume.name, &volume.id);
                served.push((
                    volume.name.clone(),
                    ServedIdentity::of(&volume.name, &volume.id, &record),
                ));
            }
        }
        let taken = |what, value: String, volume: &str| AdminError::IdentityTaken {
            what,
            value,
            volume: volume.to_string(),
        };
        for (other, them) in served.iter().filter(|(other, _)| other != name) {
            if identity.nqn.as_ref() == Some(&them.nqn) {
                return Err(taken("NQN", them.nqn.clone(), other));
            }
            for (what, mine) in [("UUID", identity.uuid), ("NGUID", identity.nguid)] {
                if mine.is_some_and(|bytes| bytes == them.uuid || bytes == them.nguid) {
                    return Err(taken(what, identity::hex(&mine.unwrap_or_default()), other));
                }
            }
        }
        if let Some(nqn) = &identity.nqn {
            if self.base.config.subsystems.iter().any(|s| &s.nqn == nqn) {
                return Err(taken("NQN", nqn.clone(), "(a configured subsystem)"));
            }
        }
        Ok(chosen)
    }

    /// Claims `name` for `node`: a new record, or ours left by a creation
    /// that never finished (the volume is not in our pools, checked before).
    fn claim(
        &mut self,
        name: &str,
        node: &str,
        claim: &VolumeRecord,
    ) -> Result<Revision, AdminError> {
        let key = volume_key(name);
        let taken = |record: VolumeRecord| AdminError::NameTakenOnNode {
            volume: name.to_string(),
            node: record.node.unwrap_or_else(|| "unknown".into()),
        };
        let result = match self.desired.read::<VolumeRecord>(&key)? {
            None => self.store_write(|d| d.claim_volume(name, claim, None)),
            Some(found) if found.record.node.as_deref() == Some(node) => {
                self.store_write(|d| d.claim_volume(name, claim, Some(found.revision)))
            }
            Some(found) => return Err(taken(found.record)),
        };
        match result {
            Ok(revision) => Ok(revision),
            Err(StoreError::Conflict { key }) if key.starts_with(IDENTITIES_PREFIX) => {
                Err(self.identity_taken(&key, claim))
            }
            Err(StoreError::Conflict { .. }) => {
                let winner = self.desired.read::<VolumeRecord>(&key)?;
                Err(taken(winner.map(|found| found.record).unwrap_or_default()))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The refusal of `claim`, whose identity claim `key` another volume holds.
    fn identity_taken(&self, key: &str, claim: &VolumeRecord) -> AdminError {
        let volume = match self.desired.identity_owner(key) {
            Ok(Some(owner)) => owner,
            _ => "another volume (created at the same moment)".into(),
        };
        let value = key.rsplit_once('/').map_or(key, |(_, value)| value);
        let what = match key.strip_prefix(IDENTITIES_PREFIX) {
            Some(rest) if rest.starts_with("nqn/") => "NQN",
            _ if claim
                .uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(value)) =>
            {
                "UUID"
            }
            _ => "NGUID",
        };
        let value = match what {
            "NQN" => claim.nqn.clone().unwrap_or_default(),
            _ => value.to_string(),
        };
        AdminError::IdentityTaken {
            what,
            value,
            volume,
        }
    }

    /// Makes the record of local volume `name` say it is here.
    fn record_local_volume(
        &mut self,
        node: &str,
        pool: &str,
        name: &str,
        id: &str,
    ) -> Result<(), StoreError> {
        let key = volume_key(name);
        let found = self.desired.read::<VolumeRecord>(&key)?;
        let record = match &found {
            // A copy of a replicated volume: its record is its primary's
            // (this node's too, if promoted: the record names the node that
            // created the volume, which is no error).
            Some(found)
                if found
                    .record
                    .replication
                    .as_ref()
                    .is_some_and(|r| r.member(node).is_some()) =>
            {
                return Ok(());
            }
            // A replica that left the volume: the reconcile deletes it.
            Some(found)
                if found
                    .record
                    .replication
                    .as_ref()
                    .is_some_and(|r| r.member(node).is_none()) =>
            {
                return Ok(());
            }
            Some(found) if found.record.node.as_deref().is_some_and(|n| n != node) => {
                log::error!(
                    "volume {name} of pool {pool} is also recorded on node {}: hosts see only one of them; rename or delete one",
                    found.record.node.as_deref().unwrap_or_default()
                );
                return Ok(());
            }
            // Attachments, limits and identity of this very volume are kept.
            Some(found) if found.record.id == id => found.record.clone(),
            _ => VolumeRecord::default(),
        };
        let wanted = VolumeRecord {
            id: id.to_string(),
            node: Some(node.to_string()),
            pool: Some(pool.to_string()),
            ..record
        };
        match found {
            Some(found) if found.record == wanted => {}
            Some(found) => {
                self.store_write(|d| d.update(&key, &wanted, found.revision))?;
            }
            None => {
                self.store_write(|d| d.create(&key, &wanted))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::tests::idle_manager;
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;
    use weft_control::{DesiredState, MemoryStore, PoolRecord, Store};
    use weft_volume::{FileMedia, Pool, PoolOptions, VolumeSpec};

    /// A manager of node `node` in the cluster whose store is `store`, with
    /// an empty pool "p" (a 64 MiB file under `dir`).
    pub(in crate::manager) fn member(
        store: &Arc<dyn Store>,
        node: &str,
        dir: &std::path::Path,
    ) -> Manager {
        let devices = vec![dir.join(format!("{node}.img"))];
        let options = PoolOptions {
            name: "p".into(),
            chunk_bytes: crate::manager::DEFAULT_CHUNK_BYTES,
            uuid: [2; 16],
        };
        drop(Pool::create(FileMedia::open(&devices, Some(64 << 20)).unwrap(), options).unwrap());
        let desired = DesiredState::shared(Arc::clone(store), node);
        let record = PoolRecord {
            devices,
            adding: Vec::new(),
            encrypt: false,
            compression: None,
            write_tier: None,
        };
        desired.change_pool("p", |_| Some(record.clone())).unwrap();
        let mut manager = idle_manager(desired);
        manager.join_cluster(role(node, dir)).unwrap();
        manager
    }

    /// Node `node` (ordinal 0) of a cluster with token "token", its data under `dir/node`.
    pub(in crate::manager) fn role(node: &str, dir: &std::path::Path) -> ClusterRole {
        ClusterRole {
            node: node.into(),
            ordinal: 0,
            token: "token".into(),
            data_dir: dir.join(node),
            lease: Arc::default(),
            rebuild_bytes_per_s: 256 << 20,
            pair: None,
        }
    }

    pub(in crate::manager) fn create(
        name: &str,
    ) -> impl FnOnce(&mut Manager) -> Result<(), AdminError> + '_ {
        move |manager| {
            let spec = VolumeSpec {
                name: name.into(),
                size_bytes: 4 << 20,
                block_size: 4096,
                thick: false,
                encrypted: false,
                compression: weft_volume::compression::Compression::None,
            };
            Ok(manager.pool_mut("p")?.create_volume(&spec)?)
        }
    }

    pub(in crate::manager) fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-claims-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn record(store: &Arc<dyn Store>, name: &str) -> Option<VolumeRecord> {
        weft_control::records::read::<VolumeRecord>(store.as_ref(), &volume_key(name))
            .unwrap()
            .map(|found| found.record)
    }

    #[test]
    fn a_volume_name_is_won_by_one_node_of_the_cluster() {
        let dir = scratch("won");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        let mut n2 = member(&store, "n2", &dir);
        n1.claimed("db1", "p", VolumeRecord::default(), create("db1"))
            .unwrap();
        let mut ran = false;
        let refused = n2.claimed("db1", "p", VolumeRecord::default(), |_| {
            ran = true;
            Ok(())
        });
        assert!(
            matches!(refused, Err(AdminError::NameTakenOnNode { ref node, .. }) if node == "n1"),
            "{refused:?}"
        );
        assert!(!ran, "the loser creates nothing");
        let won = record(&store, "db1").unwrap();
        assert_eq!(won.node.as_deref(), Some("n1"));
        assert_eq!(won.pool.as_deref(), Some("p"));
        assert_eq!(
            won.id,
            identity::hex(&n1.pools["p"].volume_info("db1").unwrap().id)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Two volumes choosing one NQN (or UUID) at once on two nodes: each
    /// node's check by reading passed (neither saw the other), and the
    /// claim in the creation's transaction lets exactly one be created.
    #[test]
    fn a_chosen_identity_is_won_by_one_volume_of_the_cluster() {
        let dir = scratch("identity");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        let mut n2 = member(&store, "n2", &dir);
        let chosen = |uuid: &str| VolumeRecord {
            nqn: Some("nqn.2014-08.com.example:db".into()),
            uuid: Some(uuid.into()),
            ..VolumeRecord::default()
        };
        let (mine, theirs) = ("11".repeat(16), "22".repeat(16));
        n1.claimed("a", "p", chosen(&mine), create("a")).unwrap();
        let refused = n2.claimed("b", "p", chosen(&theirs), create("b"));
        assert!(
            matches!(refused, Err(AdminError::IdentityTaken { what: "NQN", ref volume, .. }) if volume == "a"),
            "{refused:?}"
        );
        let nqn = |uuid: &str| VolumeRecord {
            nqn: Some("nqn.2014-08.com.example:other".into()),
            ..chosen(uuid)
        };
        let refused = n2.claimed("b", "p", nqn(&mine.to_uppercase()), create("b"));
        assert!(
            matches!(refused, Err(AdminError::IdentityTaken { what: "UUID", ref volume, .. }) if volume == "a"),
            "{refused:?}"
        );
        assert_eq!(record(&store, "b"), None, "the loser left nothing");
        assert!(
            n2.pools["p"].volume_info("b").is_err(),
            "nor created anything"
        );
        // Deleting the winner gives its identity back.
        let desired = DesiredState::shared(Arc::clone(&store), "n1");
        desired.delete_volume("a").unwrap();
        n2.claimed("b", "p", chosen(&theirs), create("b")).unwrap();
        assert!(store
            .list(IDENTITIES_PREFIX)
            .unwrap()
            .entries
            .iter()
            .all(|e| e.value == "b"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_failed_creation_gives_its_name_back() {
        let dir = scratch("failed");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        let failed = n1.claimed("db1", "p", VolumeRecord::default(), |_| {
            Err(AdminError::Node("disk on fire".into()))
        });
        assert!(failed.is_err());
        assert_eq!(record(&store, "db1"), None);
        let mut n2 = member(&store, "n2", &dir);
        n2.claimed("db1", "p", VolumeRecord::default(), create("db1"))
            .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_restart_gives_back_unfinished_claims_and_records_its_volumes() {
        let dir = scratch("restart");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        n1.claimed("db1", "p", VolumeRecord::default(), create("db1"))
            .unwrap();
        // A crash between the claim and the creation leaves a claim without id.
        let unfinished = VolumeRecord {
            node: Some("n1".into()),
            pool: Some("p".into()),
            ..VolumeRecord::default()
        };
        let desired = DesiredState::shared(Arc::clone(&store), "n1");
        desired.create(&volume_key("db2"), &unfinished).unwrap();
        // A record lost (or written before the node joined a cluster) is made again.
        let db1 = weft_control::records::read::<VolumeRecord>(store.as_ref(), &volume_key("db1"))
            .unwrap()
            .unwrap();
        desired.remove(&volume_key("db1"), db1.revision).unwrap();
        drop(n1);
        let mut again = idle_manager(DesiredState::shared(Arc::clone(&store), "n1"));
        again.join_cluster(role("n1", &dir)).unwrap();
        assert_eq!(
            record(&store, "db2"),
            None,
            "the unfinished claim is given back"
        );
        assert_eq!(record(&store, "db1"), Some(db1.record));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
