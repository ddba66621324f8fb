//! A node's membership: joining the cluster as itself, its heartbeat, and
//! leaving.
//!
//! Joining checks, in order, that the data directory does not belong to
//! another cluster (the first node creates the cluster's identity), that the
//! node name is not held by another node's data directory (restore that
//! node, or remove it first), and that no live process holds the name.
//! Then the node's membership record is written and its liveness record
//! put under a new lease. Each [`Member::heartbeat`] keeps the lease alive
//! and refreshes the liveness record; a lease that ended while the store
//! was unreachable is replaced by a new one, unless another process took
//! the name meanwhile.

use crate::election;
use crate::records::{
    alive_key, check_node_name, member_key, ordinal_key, AliveRecord, ClusterRecord, MemberRecord,
    PoolSummary, CLUSTER_KEY, ORDINALS_MAX, ORDINALS_PREFIX,
};
use std::sync::Arc;
use std::time::Duration;
use weft_control::records::{encode, read};
use weft_control::{LeaseId, Revision, Store, StoreError, Txn};

/// Default time to live of a node's lease: a node that stops is shown down
/// this long after its last heartbeat at most. Failover takes about this
/// plus 1.5 s (the promotion delay, the new primary's fencing): 3 s keeps
/// it under the 5 s goal (docs/PERFORMANCE.md), and a node tolerates
/// heartbeats (every second) that take up to 1.7 s before it steps down.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(3);

/// What a node says about itself when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberConfig {
    /// Its name (`--node`).
    pub name: String,
    /// Its data directory's node id (hex).
    pub node_id: String,
    /// Where hosts reach its NVMe/TCP listeners (`address:port`).
    pub nvme: Vec<String>,
    /// Where the other nodes reach them (replication), if not there.
    pub peer_nvme: Vec<String>,
    /// Its API URL.
    pub api: String,
    /// Its failure domain.
    pub zone: Option<String>,
    /// Its lease's time to live.
    pub lease_ttl: Duration,
    /// Its certificate from the cluster CA (hex DER), if it has one.
    pub certificate: Option<String>,
}

/// The longest a node's liveness record keeps a status unchanged before
/// it is written again (its time tells `weft node show` the node reports).
pub const STATUS_REFRESH_MS: u64 = 60_000;

/// What a node reports at each heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeStatus {
    /// Its pools.
    pub pools: Vec<PoolSummary>,
    /// Volumes it serves.
    pub volumes: u32,
    /// It holds key-encryption keys: encrypted volumes may be placed on it.
    pub keys: bool,
}

/// Why a node may not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The node name is malformed.
    #[error("{0}")]
    Name(String),
    /// The data directory joined another cluster before.
    #[error("this data directory belongs to cluster {data_dir}, but the cluster store {store} holds cluster {cluster}: give the right --cluster endpoints, or a fresh --data-dir to join this cluster as a new node")]
    OtherCluster {
        /// Cluster id in the data directory.
        data_dir: String,
        /// Store location.
        store: String,
        /// Cluster id in the store.
        cluster: String,
    },
    /// The name belongs to another node's data directory.
    #[error("node name {name} belongs to another node (node id {holder}, {state}); this data directory's node id is {node_id}. Start that node's own data directory, choose another --node, or if that node is gone for good, `weft node remove {name}` first")]
    NameTaken {
        /// The name.
        name: String,
        /// Node id holding it.
        holder: String,
        /// This node's id.
        node_id: String,
        /// `up` or `down`.
        state: &'static str,
    },
    /// A live process holds the name already (the same node started twice).
    #[error("node {name} is already up (another weft process with this data directory holds its lease, heartbeat within the last {ttl_s} s): stop it first")]
    AlreadyUp {
        /// The name.
        name: String,
        /// Lease time to live, seconds.
        ttl_s: u64,
    },
    /// Every ordinal is taken.
    #[error("the cluster has {ORDINALS_MAX} nodes, as many as it can hold: `weft node remove` a node that is gone for good first")]
    Full,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A node that joined.
pub struct Member {
    store: Arc<dyn Store>,
    config: MemberConfig,
    cluster_id: String,
    lease: LeaseId,
    ordinal: u16,
    /// Revision of our liveness record (a change by anyone else is a takeover).
    alive_revision: Revision,
    /// The status our liveness record holds and when it was written (none:
    /// unknown, after a failed write).
    written: Option<(NodeStatus, u64)>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("name", &self.config.name)
            .field("cluster_id", &self.cluster_id)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Member {
    /// Joins the cluster in `store`. `known_cluster` is the cluster id the
    /// data directory remembers (none on first start); `new_cluster` is a
    /// random id, used if the store holds no cluster yet.
    pub fn join(
        store: Arc<dyn Store>,
        config: MemberConfig,
        known_cluster: Option<&str>,
        new_cluster: &str,
        now_unix_ms: u64,
    ) -> Result<Member, JoinError> {
        check_node_name(&config.name).map_err(JoinError::Name)?;
        let cluster_id = cluster_identity(store.as_ref(), known_cluster, new_cluster, now_unix_ms)?;
        let ordinal = claim_name(store.as_ref(), &config, now_unix_ms)?;
        let lease = store.grant_lease(config.lease_ttl)?;
        let mut joined = Member {
            store,
            config,
            cluster_id,
            lease,
            ordinal,
            alive_revision: Revision(0),
            written: None,
        };
        let status = NodeStatus::default();
        let txn = joined.alive_created(&status, now_unix_ms);
        joined.alive_revision = joined.commit_alive(txn)?;
        joined.written = Some((status, now_unix_ms));
        Ok(joined)
    }

    /// The cluster's id (for the data directory to remember).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Its ordinal: unique in the cluster, kept for the node's life.
    pub fn ordinal(&self) -> u16 {
        self.ordinal
    }

    /// Its lease's time to live.
    pub fn lease_ttl(&self) -> Duration {
        self.config.lease_ttl
    }

    /// The lease its liveness (and its controllership) lives under.
    pub fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Keeps the lease alive and publishes `status`; then campaigns to be
    /// the controller. Whether this node is the controller afterwards.
    /// Called every third of the lease's time to live.
    pub fn heartbeat(&mut self, status: &NodeStatus, now_unix_ms: u64) -> Result<bool, JoinError> {
        self.heartbeat_renewing(status, now_unix_ms, &|| {})
    }

    /// [`Member::heartbeat`], calling `kept_alive` as soon as the lease was
    /// kept alive: the lease lives from then on, whatever becomes of the
    /// liveness record's update after it (a store that answers the
    /// keep-alive but not the update must not stop the node's primaries
    /// while the cluster still sees the node up).
    pub fn heartbeat_renewing(
        &mut self,
        status: &NodeStatus,
        now_unix_ms: u64,
        kept_alive: &dyn Fn(),
    ) -> Result<bool, JoinError> {
        match self.store.keep_alive(self.lease) {
            Ok(()) => {
                kept_alive();
                self.publish(status, now_unix_ms)?
            }
            Err(StoreError::LeaseExpired { .. }) => self.rejoin(status, now_unix_ms)?,
            Err(error) => return Err(error.into()),
        }
        Ok(election::campaign(
            self.store.as_ref(),
            &self.config.name,
            self.lease,
            now_unix_ms,
        )?)
    }

    /// Updates our liveness record when `status` differs from what it holds,
    /// or it is [`STATUS_REFRESH_MS`] old: every node watches these records,
    /// so a write at every heartbeat made watch events grow with the square
    /// of the nodes (the lease, kept alive apart, says the node is up).
    /// A commit whose answer was lost (the
    /// store's connection broke after it applied it) leaves us holding a
    /// stale revision of our own record: the update's condition then fails
    /// though nobody else wrote it. The record under our lease is ours (no
    /// other process holds the lease), so its revision is adopted and the
    /// update made again; one under another lease means another process
    /// took the name.
    fn publish(&mut self, status: &NodeStatus, now_unix_ms: u64) -> Result<(), JoinError> {
        if let Some((written, at)) = &self.written {
            if written == status && now_unix_ms.saturating_sub(*at) < STATUS_REFRESH_MS {
                return Ok(());
            }
        }
        self.written = None;
        let key = alive_key(&self.config.name);
        let update = |revision| {
            Txn::new().update_leased(
                key.clone(),
                self.alive_record(status, now_unix_ms),
                revision,
                Some(self.lease),
            )
        };
        match self.store.commit(update(self.alive_revision)) {
            Ok(revision) => self.alive_revision = revision,
            Err(StoreError::Conflict { .. }) => match self.store.get(&key)? {
                Some(entry) if entry.lease == Some(self.lease) => {
                    log::info!(
                        "node {}: its liveness record was written by an earlier heartbeat whose answer was lost",
                        self.config.name
                    );
                    self.alive_revision = self.commit_alive(update(entry.revision))?;
                }
                _ => return Err(self.already_up()),
            },
            Err(error) => return Err(error.into()),
        }
        self.written = Some((status.clone(), now_unix_ms));
        Ok(())
    }

    /// Ends the lease: the node is shown down at once.
    pub fn leave(self) -> Result<(), StoreError> {
        self.store.revoke_lease(self.lease)
    }

    /// After the lease ended (the store was unreachable longer than its
    /// time to live): a new lease, if nobody took the name meanwhile.
    fn rejoin(&mut self, status: &NodeStatus, now_unix_ms: u64) -> Result<(), JoinError> {
        log::warn!(
            "node {}: its lease ended (the cluster store was unreachable for more than {} s); joining again",
            self.config.name,
            self.config.lease_ttl.as_secs()
        );
        claim_name(self.store.as_ref(), &self.config, now_unix_ms)?;
        self.lease = self.store.grant_lease(self.config.lease_ttl)?;
        self.written = None;
        let txn = self.alive_created(status, now_unix_ms);
        self.alive_revision = self.commit_alive(txn)?;
        self.written = Some((status.clone(), now_unix_ms));
        Ok(())
    }

    /// Creates our liveness record under our lease.
    fn alive_created(&self, status: &NodeStatus, now_unix_ms: u64) -> Txn {
        Txn::new().create_leased(
            alive_key(&self.config.name),
            self.alive_record(status, now_unix_ms),
            Some(self.lease),
        )
    }

    fn alive_record(&self, status: &NodeStatus, now_unix_ms: u64) -> serde_json::Value {
        let record = AliveRecord {
            node_id: self.config.node_id.clone(),
            heartbeat_unix_ms: now_unix_ms,
            pools: status.pools.clone(),
            volumes: status.volumes,
            keys: status.keys,
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        encode(&record)
    }

    /// Commits a change of our liveness record; a failed condition means
    /// another process holds the name.
    fn commit_alive(&self, txn: Txn) -> Result<Revision, JoinError> {
        self.store.commit(txn).map_err(|error| match error {
            StoreError::Conflict { .. } => self.already_up(),
            other => other.into(),
        })
    }

    fn already_up(&self) -> JoinError {
        JoinError::AlreadyUp {
            name: self.config.name.clone(),
            ttl_s: self.config.lease_ttl.as_secs(),
        }
    }
}

/// The smallest ordinal nobody claimed.
fn free_ordinal(store: &dyn Store) -> Result<u16, JoinError> {
    let taken: Vec<String> = store
        .list(ORDINALS_PREFIX)?
        .entries
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    (0..ORDINALS_MAX)
        .find(|&k| !taken.contains(&ordinal_key(k)))
        .ok_or(JoinError::Full)
}

/// The store's cluster id, created if there is none; refused if the data
/// directory remembers another.
fn cluster_identity(
    store: &dyn Store,
    known: Option<&str>,
    new_cluster: &str,
    now_unix_ms: u64,
) -> Result<String, JoinError> {
    let existing = read::<ClusterRecord>(store, CLUSTER_KEY)?;
    let cluster = match existing {
        Some(found) => found.record.id,
        None => {
            let id = known.unwrap_or(new_cluster).to_string();
            let record = ClusterRecord {
                id: id.clone(),
                created_unix_ms: now_unix_ms,
            };
            let txn = Txn::new().create(CLUSTER_KEY, encode(&record));
            match store.commit(txn) {
                Ok(_) => id,
                // Another node created it at the same moment: theirs counts.
                Err(StoreError::Conflict { .. }) => {
                    return cluster_identity(store, known, new_cluster, now_unix_ms)
                }
                Err(error) => return Err(error.into()),
            }
        }
    };
    match known {
        Some(known) if known != cluster => Err(JoinError::OtherCluster {
            data_dir: known.to_string(),
            store: store.location(),
            cluster,
        }),
        _ => Ok(cluster),
    }
}

/// Writes the node's membership record unless the name belongs to another
/// node id, with an ordinal: the one it had, else the smallest free one.
/// Returns the ordinal.
fn claim_name(
    store: &dyn Store,
    config: &MemberConfig,
    now_unix_ms: u64,
) -> Result<u16, JoinError> {
    let key = member_key(&config.name);
    let existing = read::<MemberRecord>(store, &key)?;
    let cordoned = match &existing {
        Some(found) if found.record.node_id != config.node_id => {
            let up = store.get(&alive_key(&config.name))?.is_some();
            return Err(JoinError::NameTaken {
                name: config.name.clone(),
                holder: found.record.node_id.clone(),
                node_id: config.node_id.clone(),
                state: if up { "up" } else { "down" },
            });
        }
        Some(found) => found.record.cordoned,
        None => false,
    };
    let kept = existing.as_ref().and_then(|found| found.record.ordinal);
    let ordinal = match kept {
        Some(ordinal) => ordinal,
        None => free_ordinal(store)?,
    };
    let record = MemberRecord {
        name: config.name.clone(),
        node_id: config.node_id.clone(),
        nvme: config.nvme.clone(),
        peer_nvme: config.peer_nvme.clone(),
        api: config.api.clone(),
        zone: config.zone.clone(),
        cordoned,
        joined_unix_ms: now_unix_ms,
        down_since_unix_ms: None,
        ordinal: Some(ordinal),
        certificate: config.certificate.clone(),
    };
    let mut txn = match &existing {
        Some(found) => Txn::new().update(key, encode(&record), found.revision),
        None => Txn::new().create(key, encode(&record)),
    };
    if kept.is_none() {
        txn = txn.create(ordinal_key(ordinal), config.name.clone().into());
    }
    match store.commit(txn) {
        Ok(_) => Ok(ordinal),
        // Changed meanwhile (cordoned, marked down, or claimed): look again.
        Err(StoreError::Conflict { .. }) => claim_name(store, config, now_unix_ms),
        Err(error) => Err(error.into()),
    }
}
