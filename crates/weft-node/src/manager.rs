//! The volume manager: one thread that owns every pool of the node and is
//! the only writer of their metadata. It serves two kinds of work from two
//! queues: the data plane's slow path (first writes, copy-on-write, I/O
//! while a volume drains, deallocation, flush) and admin operations that
//! change something (pools, volumes, snapshots, hosts, attachments, QoS).
//! Every I/O request waiting is served before the next admin operation
//! starts, and between the steps of a long one (flatten), so that admin work
//! never holds up a host's Flush (see `queue`). After each change to the set
//! of volumes or their sizes it hands the data plane new exports, in which
//! every volume is its own subsystem `nqn.2026-11.io.weft:vol:<name>` with
//! one namespace.
//!
//! Nothing reads the node's state through the queues: after every admin
//! operation, and after every batch of I/O that changed allocation, the
//! manager publishes a snapshot of its pools, volumes and hosts, which a
//! [`StatusReader`] reads (see `status`).
//!
//! Allocations of many writes that arrive together are made durable by one
//! journal commit per pool (group commit). What the devices do not hold —
//! each pool's member devices, the hosts, which hosts may use a volume, QoS
//! limits — is desired state in the store (weft-control); every change is
//! committed there before it is acknowledged, and exports are rebuilt from
//! both after a restart.

mod claims;
mod compression;
mod encryption;
mod growth;
mod marking;
pub use crate::admin_error::AdminError;
use crate::intents;
pub use crate::intents::{replicas_after_power_loss, UncleanReplica};
pub use claims::ClusterRole;
mod primaries;
mod publish;
#[cfg(test)]
mod record_races;
pub(crate) mod replicas;
mod sealed;
mod shard_clones;
mod shutdown;
mod tier;
pub use tier::TierDevice;
pub(crate) mod snapshots;

pub use crate::replication::replica_nqn;
pub use replicas::{node_host_nqn, ReplicaPlacement};

use crate::identity::NodeId;
use crate::queue::{Inbox, Next, Refused};
use crate::reservations::{ReservationJob, Reservations};
use crate::status::{HostStatus, Published, StatusReader};
use publish::{MemberUsageCache, Touched};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use weft_control::{
    DesiredState, ErasureRecord, HostRecord, PoolRecord, QosLimits, ReplicationRecord, StoreError,
    VolumeRecord,
};
use weft_proto::auth::{DhGroup, DhchapSecret, HostKeys};
use weft_proto::target::{AllowedHost, HostAccess, NamespaceConfig, SubsystemConfig, TargetConfig};
use weft_proto::tls::psk::ConfiguredPsk;
use weft_proto::types::Nsid;
use weft_proto::IoError;
use weft_target::meter::Limits;
use weft_target::{
    Backend, DataPlane, Exports, FailedOperation, Health, LimitReached, Meter, NamespaceDevice,
    VolumeBackend, VolumeManager, VolumeOutcome, VolumeRequest, VolumeWork,
};
use weft_volume::compression::Compression;
use weft_volume::{DevicePath, FileMedia, Pool, PoolOptions, VolumeError, VolumeSpec};

/// NQN prefix of volume subsystems.
pub const VOLUME_NQN_PREFIX: &str = "nqn.2026-11.io.weft:vol:";
/// Default allocation unit.
pub const DEFAULT_CHUNK_BYTES: u32 = 1 << 20;
/// Allocation units a flatten copies between two looks at waiting I/O.
const FLATTEN_STEP_CHUNKS: usize = 16;
/// How often slow-path I/O is looked for while a store write is in flight.
const STORE_WAIT_POLL: std::time::Duration = std::time::Duration::from_micros(200);
/// Slow-path requests handled (and committed) together at most.
const BATCH_MAX: usize = 128;
/// Admin operations that may wait for the manager; more are refused as busy
/// at once. Each API connection waits for one, so this is about the API's
/// connection limit: a deeper queue would only make callers wait longer.
pub const ADMIN_QUEUE_MAX: u32 = 64;

/// The NQN a volume is served as.
pub fn volume_nqn(volume: &str) -> String {
    format!("{VOLUME_NQN_PREFIX}{volume}")
}

/// An admin operation: a change, made by the manager thread in its turn.
/// (What the node holds is read through a [`StatusReader`] instead.)
#[derive(Debug, Clone)]
pub enum AdminOp {
    /// Create a pool over `devices` (created sparse with `device_bytes` if missing).
    CreatePool {
        /// Pool name.
        name: String,
        /// Member devices, in stripe order.
        devices: Vec<PathBuf>,
        /// Allocation unit.
        chunk_bytes: u32,
        /// Size of missing files to create.
        device_bytes: Option<u64>,
        /// Overwrite devices that hold another pool.
        force: bool,
        /// Encrypt every volume created in it (needs the node's keys).
        encrypt: bool,
        /// Compress the volumes of one copy created in it by default.
        compression: Compression,
        /// A write tier in front of its devices.
        write_tier: Option<TierDevice>,
    },
    /// Give a pool a write tier, online.
    SetWriteTier {
        /// Pool name.
        pool: String,
        /// The tier's device.
        tier: TierDevice,
    },
    /// Take a pool's write tier away, online (destaged first).
    RemoveWriteTier(String),
    /// Delete a pool that holds no volume (its devices' superblocks are erased).
    DeletePool(String),
    /// Grow a pool online by `devices` (created sparse with `device_bytes` if missing).
    AddDevices {
        /// Pool name.
        pool: String,
        /// New devices, added as one stripe group.
        devices: Vec<PathBuf>,
        /// Size of missing files to create.
        device_bytes: Option<u64>,
    },
    /// Clear a pool's failure: reopen it at its last committed state and serve it again.
    ClearPoolFailure(String),
    /// Use the node's keys as its key source gives them now (unlocking
    /// what they open) and wrap every data key of the pool with the first.
    RewrapKeys {
        /// The pool.
        pool: String,
        /// The keys, read by [`ManagerHandle::call`] in the caller's thread
        /// (a key command may take seconds: never on the manager's).
        keyring: Option<Arc<weft_volume::crypt::Keyring>>,
    },
    /// Clear the failure of a configured (file or block device) namespace.
    ClearNamespaceFailure {
        /// Its subsystem.
        nqn: String,
        /// Its ID.
        nsid: u32,
    },
    /// Create a volume.
    CreateVolume {
        /// Pool.
        pool: String,
        /// What to create.
        spec: VolumeSpec,
        /// The identity hosts see, where chosen.
        identity: VolumeIdentity,
        /// Where its replicas go, the first this node's (none: one copy).
        replicas: Vec<ReplicaPlacement>,
        /// Erasure-coded: the replicas are the stripe's members, in order.
        erasure: Option<ErasureRecord>,
        /// The compression asked for (none asked: the pool's default, for
        /// a thin volume of one copy); the manager sets `spec.compression`
        /// from it (the API leaves that none).
        compression: Option<Compression>,
    },
    /// Delete a volume (`force`: even with hosts connected).
    DeleteVolume {
        /// Name.
        name: String,
        /// Disconnect connected hosts.
        force: bool,
    },
    /// Grow a volume.
    ResizeVolume {
        /// Name.
        name: String,
        /// New size in bytes.
        size_bytes: u64,
    },
    /// Clone `volume@snapshot` as `name`.
    CloneVolume {
        /// Source volume.
        volume: String,
        /// Source snapshot.
        snapshot: String,
        /// New volume.
        name: String,
    },
    /// Copy what a clone shares.
    FlattenVolume(String),
    /// Take a snapshot.
    CreateSnapshot {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// Delete a snapshot.
    DeleteSnapshot {
        /// Volume.
        volume: String,
        /// Snapshot name.
        name: String,
    },
    /// Register a host.
    CreateHost {
        /// Name.
        name: String,
        /// Its NQN.
        nqn: String,
        /// Its DH-HMAC-CHAP secrets (none: it connects without authenticating).
        secrets: HostSecrets,
    },
    /// Change a host's DH-HMAC-CHAP secrets (for its next connections).
    SetHostSecrets {
        /// Host.
        name: String,
        /// Each field `None` keeps the secret, `Some(None)` removes it.
        changes: SecretChanges,
    },
    /// Forget a host (refused while attached to volumes).
    DeleteHost(String),
    /// Let `host` use `volume`.
    Attach {
        /// Volume.
        volume: String,
        /// Host name.
        host: String,
    },
    /// Take `volume` away from `host` (its connections end).
    Detach {
        /// Volume.
        volume: String,
        /// Host name.
        host: String,
    },
    /// Change some of a volume's limits.
    SetQos {
        /// Volume.
        volume: String,
        /// The limits to change: `Some(None)` removes one.
        changes: QosChanges,
    },
    /// Make everything durable.
    Flush,
    /// Before exit: stop serving as a primary, stop every write to a
    /// replicated volume, make everything durable, and record that the
    /// replicas were shut down cleanly (see `manager/shutdown.rs`).
    Shutdown,
    /// Serve what the desired state says now (hosts, attachments, limits):
    /// after another node of the cluster changed records this node serves.
    Reconcile,
    /// The cluster's other nodes: their discovery controllers are listed
    /// as referrals in the discovery log (beside the configured ones), and
    /// they (all of them, up or down) may connect to this node's replica
    /// subsystems.
    SetPeers {
        /// Discovery controllers to refer hosts to.
        referrals: Vec<std::net::SocketAddr>,
        /// The cluster's other nodes (with the certificates their
        /// replication links' secrets derive from).
        nodes: Vec<crate::link_keys::Peer>,
        /// Their addresses, sorted: some controllers are kept for them.
        addresses: Vec<std::net::IpAddr>,
    },
}

/// What a host sees of a volume, when chosen at its creation (so that hosts
/// move from another target without changing their configuration); each
/// `None` is weft's choice: `nqn.2026-11.io.weft:vol:<name>`, and the
/// volume's id as UUID and NGUID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeIdentity {
    /// Subsystem NQN.
    pub nqn: Option<String>,
    /// Namespace UUID.
    pub uuid: Option<[u8; 16]>,
    /// Namespace NGUID.
    pub nguid: Option<[u8; 16]>,
}

/// The identity a volume is served with: from its record where chosen,
/// else derived from its name and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedIdentity {
    /// Subsystem NQN.
    pub nqn: String,
    /// Namespace UUID.
    pub uuid: [u8; 16],
    /// Namespace NGUID.
    pub nguid: [u8; 16],
}

impl ServedIdentity {
    /// Volume `name` with id `id` as `record` describes it.
    pub fn of(name: &str, id: &[u8; 16], record: &VolumeRecord) -> ServedIdentity {
        let bytes = |text: &Option<String>| {
            text.as_deref()
                .and_then(crate::identity::parse_hex16)
                .unwrap_or(*id)
        };
        ServedIdentity {
            nqn: record.nqn.clone().unwrap_or_else(|| volume_nqn(name)),
            uuid: bytes(&record.uuid),
            nguid: bytes(&record.nguid),
        }
    }
}

/// A host's DH-HMAC-CHAP secrets in their `DHHC-1:..` text form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSecrets {
    /// The host's own: it proves it knows it.
    pub host: Option<String>,
    /// The controller's: asked for by hosts that authenticate the controller too.
    pub controller: Option<String>,
    /// Its NVMe/TCP TLS PSK: it connects only over TLS with it.
    pub tls_psk: Option<String>,
    /// The DH group of its DH-HMAC-CHAP exchanges (`ffdhe2048`...; none: NULL).
    pub dh_group: Option<String>,
}

/// Changes to a host's secrets: each field `None` keeps the secret,
/// `Some(None)` removes it, `Some(Some(text))` replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretChanges {
    /// The host's secret.
    pub host: Option<Option<String>>,
    /// The controller's secret.
    pub controller: Option<Option<String>>,
    /// Its TLS PSK.
    pub tls_psk: Option<Option<String>>,
    /// The DH group of its DH-HMAC-CHAP exchanges (not a secret, set with them).
    pub dh_group: Option<Option<String>>,
}

/// Changes to a volume's limits: each field `None` keeps the limit,
/// `Some(None)` removes it, `Some(Some(n))` sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QosChanges {
    /// I/O per second.
    pub iops_max: Option<Option<u64>>,
    /// Bytes per second.
    pub bw_max: Option<Option<u64>>,
    /// Reads per second.
    pub read_iops_max: Option<Option<u64>>,
    /// Bytes read per second.
    pub read_bw_max: Option<Option<u64>>,
    /// Writes per second.
    pub write_iops_max: Option<Option<u64>>,
    /// Bytes written per second.
    pub write_bw_max: Option<Option<u64>>,
}

impl QosChanges {
    fn apply(&self, limits: &mut QosLimits) {
        let pairs = [
            (self.iops_max, &mut limits.iops_max),
            (self.bw_max, &mut limits.bw_max),
            (self.read_iops_max, &mut limits.read_iops_max),
            (self.read_bw_max, &mut limits.read_bw_max),
            (self.write_iops_max, &mut limits.write_iops_max),
            (self.write_bw_max, &mut limits.write_bw_max),
        ];
        for (change, limit) in pairs {
            if let Some(value) = change {
                *limit = value;
            }
        }
    }
}

/// An admin operation waiting for the manager, and where its result goes.
#[derive(Debug)]
struct Admin {
    op: AdminOp,
    reply: Sender<Result<(), AdminError>>,
}

/// Data-plane work waiting for the manager.
#[derive(Debug)]
enum SlowIo {
    /// Slow-path work of a volume the reactors serve.
    Volume(VolumeRequest),
    /// An I/O of a volume in a pool with a write tier (all of them come here).
    Tiered(tier::TieredIo),
}

impl SlowIo {
    /// Answers it with `error`, undone.
    fn refuse(self, error: IoError) {
        let reply = match self {
            SlowIo::Volume(request) => request.reply,
            SlowIo::Tiered(tiered) => tiered.io.reply,
        };
        reply.send(VolumeOutcome::Done(Err(error)));
    }
}

/// A handle to the manager thread: the data plane's slow path and the API's
/// admin calls, each with a bounded queue of its own (`limits.manager_queue`
/// I/O requests, [`ADMIN_QUEUE_MAX`] admin operations). A reactor never
/// waits for room (the I/O is answered "not ready", which a host retries),
/// nor does an admin call (it is refused as busy).
#[derive(Debug, Clone)]
pub struct ManagerHandle {
    inbox: Arc<Inbox<SlowIo, Admin>>,
    io_queue: u32,
    /// I/O refused since its queue was last full (logged once per episode).
    io_full: Arc<LimitReached>,
    /// Admin calls refused since their queue was last full.
    admin_full: Arc<LimitReached>,
    /// Where the node's key-encryption keys come from.
    key_source: Option<crate::keys::KeySource>,
    /// Held by a rewrap from loading the keys until the manager answered:
    /// a slow key command's older keys never land after newer ones.
    rewraps: Arc<std::sync::Mutex<()>>,
    /// A reconcile asked for by [`NodeServices::reconcile`] is queued and
    /// not yet begun: another asked for meanwhile would find the same
    /// state, so it is not queued (a node with hundreds of replicated
    /// volumes whose paths change at once otherwise filled the manager's
    /// queue with reconciles, each a pass over every record, and its API
    /// answered "busy").
    reconcile_queued: Arc<AtomicBool>,
}

impl crate::replication::NodeServices for ManagerHandle {
    /// Queues a reconcile without waiting (nor learning) its result; dropped
    /// if the queue is full (a replicator asks this way: it must never wait
    /// on the manager).
    fn reconcile(&self) {
        if self.reconcile_queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let (reply, _) = mpsc::channel();
        let admin = Admin {
            op: AdminOp::Reconcile,
            reply,
        };
        if self.inbox.push_admin(admin).is_err() {
            // Not queued: the next one asked for is.
            self.reconcile_queued.store(false, Ordering::Release);
        }
    }

    fn reconcile_then_answer(&self, reply: Sender<Result<(), AdminError>>) {
        ManagerHandle::reconcile_then_answer(self, reply);
    }

    fn change_copy(&self, request: VolumeRequest) {
        self.submit(request);
    }
}

impl VolumeManager for ManagerHandle {
    fn submit(&self, request: VolumeRequest) {
        self.push_io(SlowIo::Volume(request));
    }
}

impl ManagerHandle {
    /// Queues data-plane work; answers it at once when the queue is full
    /// (Namespace Not Ready: hosts retry) or the manager stopped.
    fn push_io(&self, io: SlowIo) {
        let (io, error) = match self.inbox.push_io(io) {
            Ok(()) => {
                if let Some(refused) = self.io_full.admit() {
                    log::info!("the volume manager's I/O queue has room again ({refused} requests refused)");
                }
                return;
            }
            Err(Refused::Full(request)) => {
                if self.io_full.refuse() {
                    log::warn!(
                        "the volume manager has {} I/O requests queued, its limit (limits.manager_queue in weft.toml): I/O that needs it is answered Namespace Not Ready (hosts retry) until it catches up",
                        self.io_queue
                    );
                }
                (request, IoError::Busy)
            }
            Err(Refused::Stopped(request)) => (request, IoError::Other),
        };
        io.refuse(error);
    }
}

impl ManagerHandle {
    /// Reconciles without waiting, and answers `reply` once the exports
    /// show the outcome (a growth's new size, once recorded); at once if
    /// the manager cannot take it.
    pub(crate) fn reconcile_then_answer(&self, reply: Sender<Result<(), AdminError>>) {
        let admin = Admin {
            op: AdminOp::Reconcile,
            reply,
        };
        if let Err(Refused::Full(admin) | Refused::Stopped(admin)) = self.inbox.push_admin(admin) {
            let _ = admin.reply.send(Ok(()));
        }
    }

    /// Runs an admin operation and waits for its result.
    pub fn call(&self, op: AdminOp) -> Result<(), AdminError> {
        let mut _one_rewrap_at_a_time = None;
        let op = match op {
            AdminOp::RewrapKeys {
                pool,
                keyring: None,
            } => {
                let guard = self.rewraps.lock();
                _one_rewrap_at_a_time =
                    Some(guard.unwrap_or_else(std::sync::PoisonError::into_inner));
                AdminOp::RewrapKeys {
                    pool,
                    keyring: Some(self.load_keys()?),
                }
            }
            op => op,
        };
        let stopped = || AdminError::Node("the volume manager has stopped".into());
        let (reply, result) = mpsc::channel();
        match self.inbox.push_admin(Admin { op, reply }) {
            Ok(()) => {
                if let Some(refused) = self.admin_full.admit() {
                    log::info!(
                        "the volume manager's admin queue has room again ({refused} calls refused)"
                    );
                }
            }
            Err(Refused::Full(_)) => {
                if self.admin_full.refuse() {
                    log::warn!("the volume manager has {ADMIN_QUEUE_MAX} admin operations queued, its limit: admin calls are answered busy until it catches up");
                }
                return Err(AdminError::ManagerBusy {
                    queue: ADMIN_QUEUE_MAX,
                });
            }
            Err(Refused::Stopped(_)) => return Err(stopped()),
        }
        result.recv().map_err(|_| stopped())?
    }
}

/// The manager before its thread starts: pools are opened first so that the
/// data plane starts with every volume exported.
pub struct Manager {
    node: NodeId,
    base: Arc<Exports>,
    pools: BTreeMap<String, Pool<FileMedia>>,
    /// Each pool's failure flag, shared with the data plane.
    health: BTreeMap<String, Arc<Health>>,
    desired: DesiredState,
    /// Each volume's QoS limits and statistics, kept across exports updates.
    meters: BTreeMap<String, Arc<Meter>>,
    handle: ManagerHandle,
    generation: u64,
    /// Where the node's status is published for readers.
    published: Arc<Published>,
    /// Each pool's member usage, recomputed at most once a second while I/O allocates.
    member_usage: MemberUsageCache,
    /// The node's name when it is a member of a cluster: volume names are
    /// then claimed for it in the shared store before a volume is created.
    cluster_node: Option<String>,
    /// The node's ordinal in its cluster (ANA group ordinal + 1).
    cluster_ordinal: u16,
    /// The cluster's other nodes' discovery controllers, listed as referrals.
    cluster_referrals: Vec<std::net::SocketAddr>,
    /// The cluster's other nodes, by name: they may use its replica subsystems.
    cluster_peers: Vec<crate::link_keys::Peer>,
    /// The addresses of the cluster's other nodes, sorted: their Connects
    /// may use the controllers kept for nodes.
    cluster_addresses: Vec<std::net::IpAddr>,
    /// What a node proves to use a replica subsystem (from the cluster's token).
    link_keys: Option<crate::link_keys::LinkKeys>,
    /// What seals host secrets in the cluster's store (from the cluster's token).
    seal: Option<sealed::Seal>,
    /// The node's key-encryption keys, if it has any.
    keyring: Option<Arc<weft_volume::crypt::Keyring>>,
    /// The node's data directory in a cluster (its replicas' write intents live there).
    cluster_dir: Option<PathBuf>,
    /// The write intents of this node's replicas, by volume.
    intents: BTreeMap<String, Arc<intents::IntentFile>>,
    /// How long the node may trust its cluster lease (a primary serves within it).
    cluster_lease: Option<Arc<weft_cluster::LeaseClock>>,
    /// The replicators of the replicated volumes this node is primary of.
    replicators: BTreeMap<String, crate::replication::replicator::ReplicatorHandle>,
    /// The primaries of the erasure-coded volumes this node serves.
    erasures: BTreeMap<String, crate::erasure::server::ErasureHandle>,
    /// The data plane, whose reactors host the replicators (set when the manager starts).
    plane: Option<Arc<DataPlane>>,
    /// How fast a replicator copies to a replica it rebuilds.
    rebuild_bytes_per_s: u64,
    /// Shut down (before exit): no replicator starts, no replicated write runs.
    shut_down: bool,
    /// Slow-path requests served (the tests count a write's trips here).
    #[cfg(test)]
    io_served: Arc<std::sync::atomic::AtomicU64>,
    /// Where the admin operation being run answers; an operation that
    /// answers later (a replicated volume's snapshot) takes it.
    caller: Option<Sender<Result<(), AdminError>>>,
    /// Snapshots taken for a primary, by (volume, name), with when: kept
    /// while this node's copy of the store has not seen them announced.
    fresh_snapshots: BTreeMap<(String, String), std::time::Instant>,
    /// The data plane's paths to the volumes of pools with a write tier,
    /// by pool and volume.
    tier_paths: BTreeMap<(String, String, [u8; 16]), Arc<weft_target::replicated::Replicated>>,
    /// When a write of a tiered pool's volume was last written (None:
    /// none since the start, so what the tiers replayed is destaged at once).
    last_tier_write: Option<std::time::Instant>,
    /// The last destage released nothing: none is due before this, or the
    /// next write.
    tiers_stalled_until: Option<std::time::Instant>,
    /// Slow-path answers to send once the data plane has new exports (a
    /// replica's copy grown).
    after_exports: Vec<(weft_target::VolumeReply, Result<(), IoError>)>,
    /// The volumes' NVMe reservations and the thread that changes them.
    reservations: Reservations,
}

impl Manager {
    /// Opens every pool the desired state lists. `base` holds the configured
    /// (non-volume) subsystems; at most `queue` slow-path I/O requests wait
    /// for the manager.
    pub fn open(
        desired: DesiredState,
        node: NodeId,
        base: Arc<Exports>,
        queue: u32,
    ) -> Result<Manager, String> {
        let mut pools = BTreeMap::new();
        for (name, record) in desired.pools().map_err(|e| e.to_string())? {
            // Devices being added when weft stopped are offered after the
            // members; the pool's superblocks say whether they joined.
            let mut paths = record.devices.clone();
            paths.extend(record.adding.iter().filter(|p| p.exists()).cloned());
            let media = FileMedia::open(&paths, None).map_err(|e| format!("pool {name}: {e}"))?;
            let pool = tier::open_pool(&name, media, record.write_tier.as_deref())?;
            reconcile_members(&desired, &name, &pool).map_err(|e| e.to_string())?;
            tier::reconcile_tier(&desired, &name, &pool).map_err(|e| e.to_string())?;
            log::info!(
                "pool {name}: {} volumes, {} of {} allocated",
                pool.info().volumes,
                weft_storage::human_bytes(pool.info().allocated_bytes),
                weft_storage::human_bytes(pool.info().capacity_bytes)
            );
            pools.insert(name, pool);
        }
        let health = pools
            .keys()
            .map(|name| (name.clone(), Arc::default()))
            .collect();
        let generation = base.config.generation;
        let reservations = Reservations::start(desired.clone())
            .map_err(|e| format!("cannot start the reservations thread: {e}"))?;
        let mut manager = Manager {
            reservations,
            node,
            base,
            pools,
            health,
            desired,
            meters: BTreeMap::new(),
            handle: ManagerHandle {
                inbox: Arc::new(Inbox::new(queue as usize, ADMIN_QUEUE_MAX as usize)),
                io_queue: queue,
                io_full: Arc::default(),
                admin_full: Arc::default(),
                key_source: None,
                rewraps: Arc::default(),
                reconcile_queued: Arc::default(),
            },
            generation,
            published: Arc::default(),
            member_usage: MemberUsageCache::default(),
            cluster_node: None,
            cluster_ordinal: 0,
            cluster_referrals: Vec::new(),
            cluster_peers: Vec::new(),
            cluster_addresses: Vec::new(),
            link_keys: None,
            seal: None,
            keyring: None,
            cluster_dir: None,
            intents: BTreeMap::new(),
            cluster_lease: None,
            replicators: BTreeMap::new(),
            erasures: BTreeMap::new(),
            plane: None,
            caller: None,
            after_exports: Vec::new(),
            fresh_snapshots: BTreeMap::new(),
            rebuild_bytes_per_s: u64::MAX,
            tier_paths: BTreeMap::new(),
            last_tier_write: None,
            tiers_stalled_until: None,
            shut_down: false,
            #[cfg(test)]
            io_served: Arc::default(),
        };
        manager.publish();
        Ok(manager)
    }

    /// The handle (clone it for the API).
    pub fn handle(&self) -> ManagerHandle {
        self.handle.clone()
    }

    /// What the node reports, read without entering the manager's queues;
    /// `plane` tells who is connected and what I/O it served.
    pub fn status(&self, plane: Arc<DataPlane>) -> StatusReader {
        StatusReader::new(Arc::clone(&self.published), plane, self.desired.clone())
    }

    /// The exports: configured subsystems plus one per volume.
    pub fn exports(&mut self) -> Arc<Exports> {
        self.generation += 1;
        let mut config = TargetConfig::clone(&self.base.config);
        let mut devices = self.base.devices.clone();
        let hosts = self.desired.hosts().unwrap_or_else(|error| {
            log::error!("{error}; volumes are exported to no host");
            BTreeMap::new()
        });
        // Out of `self` while volumes are exported: starting a replicator
        // needs the rest of the manager (put back below; nothing returns early).
        let pools = std::mem::take(&mut self.pools);
        let mut volume_names = std::collections::BTreeSet::new();
        for (pool_name, pool) in &pools {
            let member_fds = pool.media().fds();
            let member_paths = pool.media().paths().to_vec();
            // One copy per pool and rebuild: each volume's backend shares it.
            let layout = Arc::new(*pool.layout());
            let health = &Arc::clone(&self.health[pool_name]);
            for volume in pool.volumes() {
                volume_names.insert(volume.name.clone());
                let cipher = match pool.cipher(&volume.name) {
                    Ok(cipher) => cipher,
                    Err(error) => {
                        log::error!("{error}; it is not exported until then");
                        continue;
                    }
                };
                let record = self.volume_record(&volume.name, &volume.id);
                let served = ServedIdentity::of(&volume.name, &volume.id, &record);
                let nqn = served.nqn;
                let meter = Arc::clone(self.meters.entry(volume.name.clone()).or_default());
                let limits = data_plane_limits(&record.qos);
                if meter.limits() != limits {
                    meter.set_limits(limits);
                }
                let allowed = record
                    .hosts
                    .iter()
                    .filter_map(|name| allowed_host(name, hosts.get(name)?, self.seal.as_ref()))
                    .collect();
                // Every replica serves the record's identity; a volume of
                // one copy keeps the ids it always had.
                let (serial, eui64) = match record.replication {
                    Some(_) => (
                        replicas::replicated_serial(&served.uuid),
                        &served.nguid[8..],
                    ),
                    None => (self.node.serial(&nqn), &volume.id[8..]),
                };
                config.subsystems.push(SubsystemConfig {
                    nqn: nqn.clone(),
                    serial,
                    model: "weft volume".into(),
                    firmware: env!("CARGO_PKG_VERSION").to_string(),
                    namespaces: vec![NamespaceConfig {
                        nsid: Nsid(1),
                        blocks: served_size_bytes(volume.size_bytes, &record)
                            / u64::from(volume.block_size),
                        block_size: volume.block_size,
                        nguid: served.nguid,
                        uuid: served.uuid,
                        eui64: eui64.try_into().expect("8 bytes"),
                        thin: !volume.thick,
                        ready: true,
                        reservations: Some(self.reservations.cell(&volume.name, &record.id)),
                    }],
                    access: HostAccess::Only(allowed),
                    ana: self.ana_of(&record),
                    fenced: false,
                    fence_authority: None,
                    intent: None,
                });
                let mut backend = Arc::new(VolumeBackend {
                    pool: pool_name.clone(),
                    volume: volume.name.clone(),
                    map: Arc::clone(&volume.map),
                    gate: Arc::clone(&volume.gate),
                    layout: Arc::clone(&layout),
                    member_fds: member_fds.clone(),
                    manager: Arc::new(self.handle.clone()),
                    health: Arc::clone(health),
                    intent: None,
                    replicated: None,
                    cipher,
                });
                let replicated = self.replicated_path(
                    &volume.name,
                    &record,
                    &backend,
                    &member_paths,
                    volume.size_bytes,
                );
                // A compressed volume's reads all go to the manager too:
                // the reactors cannot read extents.
                let compressed = volume.compression != Compression::None;
                let replicated = match (&record.replication, pool.tier_presence()) {
                    (None, presence) if compressed || presence.is_some() => {
                        let presence = presence.filter(|_| !compressed);
                        Some(self.tier_path(pool_name, &volume.name, volume.id, presence))
                    }
                    _ => replicated,
                };
                if let Some(path) = &replicated {
                    let subsystem = config.subsystems.last_mut().expect("pushed");
                    if record.replication.as_ref().map(|r| &r.primary) == self.cluster_node.as_ref()
                    {
                        subsystem.ana.state = Self::replicated_ana_state(path);
                    }
                    backend = Arc::new(VolumeBackend {
                        replicated: Some(Arc::clone(path)),
                        ..VolumeBackend::clone(&backend)
                    });
                }
                // Devices pair with subsystems by position.
                devices.push(vec![NamespaceDevice {
                    nsid: Nsid(1),
                    backend: Backend::Volume(Arc::clone(&backend)),
                    meter,
                    health: Arc::clone(health),
                }]);
                if let Some(replication) = &record.replication {
                    // The primary writes to this replica through its
                    // private, fenced subsystem: the same volume, with a
                    // meter of its own (hosts' limits do not apply), and
                    // the replica's write intent checked before each write
                    // (an erasure-coded member has none: its primary
                    // journals every stripe update on the members).
                    let intent = match replication.erasure {
                        Some(_) => None,
                        None => intents::intent_of(
                            &mut self.intents,
                            self.cluster_dir.as_deref(),
                            &volume.name,
                            volume.size_bytes,
                        ),
                    };
                    let volume_subsystem = config.subsystems.last().expect("pushed");
                    let mut replica =
                        self.replica_subsystem(&volume.name, volume_subsystem, replication);
                    // The primary sees the whole copy (it grows it through here).
                    replica.namespaces[0].blocks = volume.size_bytes / u64::from(volume.block_size);
                    replica.intent.clone_from(&intent);
                    let meter = self.meters.entry(replica.nqn.clone()).or_default();
                    let backend = VolumeBackend {
                        intent,
                        replicated: None,
                        ..VolumeBackend::clone(&backend)
                    };
                    devices.push(vec![NamespaceDevice {
                        nsid: Nsid(1),
                        backend: Backend::Volume(Arc::new(backend)),
                        meter: Arc::clone(meter),
                        health: Arc::clone(health),
                    }]);
                    config.subsystems.push(replica);
                }
            }
        }
        self.pools = pools;
        self.reservations.retain(&volume_names);
        self.forget_tier_paths();
        for referral in crate::exports::ports(&self.cluster_referrals) {
            if !config
                .referrals
                .iter()
                .any(|r| r.address == referral.address && r.service == referral.service)
            {
                config.referrals.push(referral);
            }
        }
        config.node_addresses.clone_from(&self.cluster_addresses);
        config.generation = self.generation;
        Arc::new(Exports::new(Arc::new(config), devices))
    }

    /// Starts the manager thread; it updates `plane`'s exports after changes.
    pub fn spawn(mut self, plane: Arc<DataPlane>) -> std::io::Result<()> {
        self.plane = Some(Arc::clone(&plane));
        std::thread::Builder::new()
            .name("weft-volumes".into())
            .spawn(move || self.run(&plane))
            .map(|_| ())
    }

    fn run(mut self, plane: &DataPlane) {
        let inbox = Arc::clone(&self.handle.inbox);
        let _stop = StopOnExit(&inbox);
        loop {
            let intents_due = (!self.intents.is_empty())
                .then(|| std::time::Instant::now() + intents::PERSIST_INTERVAL);
            let due = match (self.member_usage.refresh_due(), intents_due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Writes waiting in a tier: destaged when nothing else is, once
            // due (see `next_destage`).
            let due = match (due, self.next_destage()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match inbox.next(BATCH_MAX, due) {
                Next::Io(batch) => {
                    self.serve_io(batch);
                    self.answer_after_exports(plane);
                    self.persist_cleared_intents();
                }
                Next::Admin(Admin { op, reply }) => {
                    if matches!(op, AdminOp::Reconcile) {
                        // Changes from now on need a reconcile of their own.
                        // A read-modify-write: it reads what a notifier that
                        // found the mark set released (its change), so this
                        // reconcile sees that change.
                        self.handle.reconcile_queued.swap(false, Ordering::AcqRel);
                    }
                    self.caller = Some(reply);
                    let result = self.admin(op, plane);
                    // Published before the caller hears back, so that what
                    // it reads next shows its change.
                    self.publish();
                    if let Some(reply) = self.caller.take() {
                        let _ = reply.send(result);
                    }
                    self.answer_after_exports(plane);
                }
                Next::Idle => {
                    self.publish_member_usage();
                    self.persist_cleared_intents();
                    self.clean_segments();
                    if self
                        .next_destage()
                        .is_some_and(|due| due <= std::time::Instant::now())
                    {
                        self.destage_tiers();
                    }
                }
            }
        }
    }

    /// Serves a batch of slow-path requests: one commit per pool for the
    /// writes among them, then the new figures are published, then the
    /// writes are let retry.
    fn serve_io(&mut self, batch: Vec<SlowIo>) {
        let mut prepared = Vec::new();
        let mut touched = Touched::default();
        let mut tier_writes = tier::TierWrites::default();
        for io in batch {
            match io {
                SlowIo::Volume(request) => {
                    touched.note(&request);
                    prepared.extend(self.handle_io(request));
                }
                SlowIo::Tiered(tiered) => {
                    touched.note_tiered(&tiered);
                    self.serve_tiered(tiered, &mut tier_writes);
                }
            }
        }
        self.write_tiered(tier_writes);
        let committed = self.commit_prepared(&prepared);
        self.publish_touched(&touched);
        for request in prepared {
            let outcome = match committed[&request.pool] {
                Ok(()) => VolumeOutcome::Retry,
                Err(error) => VolumeOutcome::Done(Err(error)),
            };
            request.reply.send(outcome);
        }
    }

    /// Sends the answers that wait for new exports, after updating them.
    fn answer_after_exports(&mut self, plane: &DataPlane) {
        if self.after_exports.is_empty() {
            return;
        }
        plane.update_exports(self.exports());
        for (reply, result) in std::mem::take(&mut self.after_exports) {
            reply.send(VolumeOutcome::Done(result));
        }
    }

    /// Serves every slow-path request waiting now (between the steps of a
    /// long admin operation).
    /// Runs `write`, a change to the desired state (a commit to the store,
    /// which may wait on the network or a disk's fsync), on a helper thread
    /// while this thread keeps serving the data plane's slow path: a host's
    /// first writes and Flush never wait on the cluster store.
    fn store_write<T: Send>(&mut self, write: impl FnOnce(&mut DesiredState) -> T + Send) -> T {
        let mut desired = self.desired.clone();
        std::thread::scope(|scope| {
            let writer = scope.spawn(move || write(&mut desired));
            while !writer.is_finished() {
                self.serve_waiting_io();
                std::thread::sleep(STORE_WAIT_POLL);
            }
            match writer.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    fn serve_waiting_io(&mut self) {
        loop {
            let batch = self.handle.inbox.take_io(BATCH_MAX);
            if batch.is_empty() {
                return;
            }
            self.serve_io(batch);
        }
    }

    /// Serves one slow-path request; a prepared write waits for the group
    /// commit and is returned.
    fn handle_io(&mut self, request: VolumeRequest) -> Option<VolumeRequest> {
        #[cfg(test)]
        self.io_served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let VolumeWork::Snapshot(name) = &request.work {
            if self.needed_by_a_clone(&request.volume, name.as_str()) {
                // Its copy of an earlier snapshot of that name is still to
                // make a clone's member from: this copy does not take the
                // new one (and does not hold it).
                log::warn!(
                    "volume {}: snapshot {} not taken again here: a clone's member is still to be made from this copy's earlier one",
                    request.volume,
                    name.as_str()
                );
                request.reply.send(VolumeOutcome::Done(Err(IoError::Other)));
                return None;
            }
        }
        let (Some(pool), Some(health)) = (
            self.pools.get_mut(&request.pool),
            self.health.get(&request.pool),
        ) else {
            request.reply.send(VolumeOutcome::Done(Err(IoError::Other)));
            return None;
        };
        if health.is_failed() {
            request
                .reply
                .send(VolumeOutcome::Done(Err(IoError::Failed)));
            return None;
        }
        if self.shut_down && self.intents.contains_key(&request.volume) {
            // A replicated volume after a clean shutdown: nothing more lands.
            request
                .reply
                .send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
            return None;
        }
        if let VolumeWork::MarkIntent {
            offset,
            len,
            allocate,
        } = request.work
        {
            let outcome = self.mark_intent(&request.volume, offset, len);
            if allocate && matches!(outcome, VolumeOutcome::Retry) {
                // A data write: its chunks in the same trip (a replica's
                // first write to a thin region made two in a row).
                let pool = self.pools.get_mut(&request.pool).expect("checked above");
                match pool.prepare_write(&request.volume, offset, len) {
                    Ok(()) => return Some(request),
                    Err(error) => {
                        note_pool_failure(pool, &self.health[&request.pool]);
                        log::warn!("volume {}: {error}", request.volume);
                        let outcome = VolumeOutcome::Done(Err(io_error(&error)));
                        request.reply.send(outcome);
                        return None;
                    }
                }
            }
            request.reply.send(outcome);
            return None;
        }
        if let VolumeWork::Reserve { host, command } = request.work {
            let id = pool
                .volume_info(&request.volume)
                .map(|info| self.volume_record(&request.volume, &info.id).id);
            match id {
                Ok(id) => self.reservations.submit(ReservationJob {
                    volume: request.volume,
                    id,
                    node: self.cluster_node.clone(),
                    host,
                    command,
                    reply: request.reply,
                }),
                Err(_) => request.reply.send(VolumeOutcome::Done(Err(IoError::Other))),
            }
            return None;
        }
        if let VolumeWork::Grow { size_bytes } = request.work {
            // Answered once the data plane serves the new size: the
            // primary writes past the old end right after.
            let result = self.grow_copy(&request.pool, &request.volume, size_bytes);
            self.after_exports.push((request.reply, result));
            return None;
        }
        let result = match request.work {
            VolumeWork::Wait
            | VolumeWork::MarkIntent { .. }
            | VolumeWork::Grow { .. }
            | VolumeWork::Reserve { .. } => Ok(()),
            VolumeWork::PrepareWrite { offset, len } => {
                match pool.prepare_write(&request.volume, offset, len) {
                    Ok(()) => return Some(request),
                    Err(error) => Err(error),
                }
            }
            VolumeWork::Deallocate { offset, len, fua } => pool
                .deallocate(&request.volume, offset, len)
                .and_then(|()| if fua { pool.flush() } else { Ok(()) }),
            VolumeWork::Flush => pool.flush(),
            VolumeWork::Snapshot(name) => {
                let taken = snapshots::replica_snapshot(pool, &request.volume, name.as_str());
                if taken.is_ok() {
                    let key = (request.volume.clone(), name.as_str().to_string());
                    self.fresh_snapshots.insert(key, std::time::Instant::now());
                }
                taken
            }
        };
        note_pool_failure(pool, health);
        let outcome = match request.work {
            VolumeWork::Wait => VolumeOutcome::Retry,
            _ => outcome(&request.volume, result),
        };
        request.reply.send(outcome);
        None
    }

    /// Commits every pool with staged allocations: the result per pool.
    fn commit_prepared(
        &mut self,
        prepared: &[VolumeRequest],
    ) -> BTreeMap<String, Result<(), IoError>> {
        let mut committed = BTreeMap::new();
        for request in prepared {
            if !committed.contains_key(&request.pool) {
                let pool = self.pools.get_mut(&request.pool).expect("checked");
                let result = pool.commit().map_err(|error| io_error(&error));
                note_pool_failure(pool, &self.health[&request.pool]);
                committed.insert(request.pool.clone(), result);
            }
        }
        committed
    }

    fn admin(&mut self, op: AdminOp, plane: &DataPlane) -> Result<(), AdminError> {
        let exports_change = matches!(
            op,
            AdminOp::CreateVolume { .. }
                | AdminOp::ResizeVolume { .. }
                | AdminOp::CloneVolume { .. }
                | AdminOp::Attach { .. }
                | AdminOp::Detach { .. }
                | AdminOp::SetHostSecrets { .. }
                | AdminOp::Reconcile
                | AdminOp::SetPeers { .. }
                | AdminOp::RewrapKeys { .. }
        );
        match op {
            AdminOp::CreatePool {
                name,
                devices,
                chunk_bytes,
                device_bytes,
                force,
                encrypt,
                compression,
                write_tier,
            } => self.create_pool(
                name,
                devices,
                chunk_bytes,
                device_bytes,
                (force, encrypt, compression, write_tier),
            )?,
            AdminOp::SetWriteTier { pool, tier } => self.set_write_tier(&pool, tier, plane)?,
            AdminOp::RemoveWriteTier(pool) => self.remove_write_tier(&pool, plane)?,
            AdminOp::AddDevices {
                pool,
                devices,
                device_bytes,
            } => self.add_devices(&pool, devices, device_bytes, plane)?,
            AdminOp::DeletePool(name) => self.delete_pool(&name)?,
            AdminOp::ClearPoolFailure(name) => self.clear_pool_failure(&name, plane)?,
            AdminOp::RewrapKeys { pool, keyring } => self.rewrap_pool(&pool, keyring)?,
            AdminOp::ClearNamespaceFailure { nqn, nsid } => {
                self.clear_namespace_failure(&nqn, nsid)?
            }
            AdminOp::CreateVolume {
                pool,
                spec,
                identity,
                replicas,
                erasure,
                compression,
            } => {
                self.check_volume_name_free(&spec.name)?;
                self.pool_mut(&pool)?;
                // A pool's default: for thin volumes of one copy.
                let one_copy = replicas.is_empty() && erasure.is_none() && !spec.thick;
                let spec = VolumeSpec {
                    encrypted: spec.encrypted || self.pool_encrypts(&pool)?,
                    compression: match compression {
                        Some(asked) => asked,
                        None if one_copy => self.pool_compression(&pool)?,
                        None => Compression::None,
                    },
                    ..spec
                };
                let mut chosen = self.check_identity_free(&spec.name, &identity)?;
                chosen.replication = self.new_replication(&spec, &pool, &replicas, erasure)?;
                if chosen.replication.is_some() {
                    self.refuse_copy_in_tiered(&pool, &spec.name)?;
                }
                // An erasure-coded volume's copy here is this node's shard.
                let local = local_spec(&spec, chosen.replication.as_ref());
                self.claimed(&spec.name, &pool, chosen, |manager| {
                    Ok(manager.pool_mut(&pool)?.create_volume(&local)?)
                })?;
                log::info!(
                    "volume {} created in pool {pool}: {} bytes{}",
                    spec.name,
                    spec.size_bytes,
                    if spec.thick { ", thick" } else { "" }
                );
            }
            AdminOp::DeleteVolume { name, force } => self.delete_volume(&name, force, plane)?,
            AdminOp::ResizeVolume { name, size_bytes }
                if self.replicated_record(&name)?.is_some() =>
            {
                // Answered by the volume's replicator once grown (or at
                // once if refused here).
                let Some(reply) = self.caller.take() else {
                    return Err(AdminError::Node(
                        "a resize asked for with nobody to answer".into(),
                    ));
                };
                if let Err(error) = self.grow_replicated(&name, size_bytes, reply.clone()) {
                    let _ = reply.send(Err(error));
                }
            }
            AdminOp::ResizeVolume { name, size_bytes } => {
                let pool = self.pool_of(&name)?;
                self.pool_mut(&pool)?.resize_volume(&name, size_bytes)?;
                log::info!("volume {name} resized to {size_bytes} bytes");
            }
            AdminOp::CloneVolume {
                volume,
                snapshot,
                name,
            } => {
                self.check_volume_name_free(&name)?;
                let source = self.replicated_record(&volume)?;
                if let Some(source) = source.filter(|r| r.erasure.is_some()) {
                    self.clone_erasure_coded(&volume, &snapshot, &name, &source)?;
                } else {
                    self.check_replicated_clone(&volume, &snapshot)?;
                    let pool = self.pool_of(&volume)?;
                    self.claimed(&name, &pool, VolumeRecord::default(), |manager| {
                        Ok(manager
                            .pool_mut(&pool)?
                            .clone_volume(&volume, &snapshot, &name)?)
                    })?;
                }
                log::info!("volume {name} cloned from {volume}@{snapshot}");
            }
            AdminOp::FlattenVolume(name) => self.flatten(&name)?,
            AdminOp::CreateSnapshot { volume, name }
                if self.replicated_record(&volume)?.is_some() =>
            {
                // Answered by the volume's replicator once taken (or at once
                // if refused here).
                let Some(reply) = self.caller.take() else {
                    return Err(AdminError::Node(
                        "a snapshot asked for with nobody to answer".into(),
                    ));
                };
                if let Err(error) = self.create_replicated_snapshot(&volume, &name, reply.clone()) {
                    let _ = reply.send(Err(error));
                }
            }
            AdminOp::CreateSnapshot { volume, name } => {
                let pool = self.pool_of(&volume)?;
                self.pool_mut(&pool)?.create_snapshot(&volume, &name)?;
                log::info!("snapshot {volume}@{name} created");
            }
            AdminOp::DeleteSnapshot { volume, name }
                if self.replicated_record(&volume)?.is_some() =>
            {
                self.delete_replicated_snapshot(&volume, &name)?
            }
            AdminOp::DeleteSnapshot { volume, name } => {
                let pool = self.pool_of(&volume)?;
                self.pool_mut(&pool)?.delete_snapshot(&volume, &name)?;
            }
            AdminOp::CreateHost { name, nqn, secrets } => self.create_host(&name, nqn, secrets)?,
            AdminOp::SetHostSecrets { name, changes } => self.set_host_secrets(&name, changes)?,
            AdminOp::DeleteHost(name) => self.delete_host(&name)?,
            AdminOp::Attach { volume, host } => self.change_attachment(&volume, &host, true)?,
            AdminOp::Detach { volume, host } => self.change_attachment(&volume, &host, false)?,
            AdminOp::SetQos { volume, changes } => {
                let id = self.volume_id_checked(&volume)?;
                let record = self.store_write(|d| {
                    d.change_volume(&volume, &id, |record| changes.apply(&mut record.qos))
                })?;
                if let Some(meter) = self.meters.get(&volume) {
                    meter.set_limits(data_plane_limits(&record.qos));
                }
                log::info!("volume {volume}: limits {:?}", record.qos);
            }
            AdminOp::SetPeers {
                referrals,
                nodes,
                addresses,
            } => {
                let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
                log::info!(
                    "discovery referrals: {referrals:?}; peer nodes: {names:?} at {addresses:?}"
                );
                self.cluster_referrals = referrals;
                self.cluster_peers = nodes;
                self.cluster_addresses = addresses;
            }
            // Rebuilding the exports (below) applies hosts, attachments,
            // identities and every volume's limits from the records.
            AdminOp::Reconcile => {
                self.grow_copies_to_records();
                self.drop_removed_replicas(plane);
                // Before stale snapshots go: a clone's member is made from one.
                self.create_missing_replicas();
                self.drop_stale_snapshots();
            }
            AdminOp::Flush => self.flush_pools()?,
            AdminOp::Shutdown => self.shut_down()?,
        }
        if exports_change {
            plane.update_exports(self.exports());
        }
        Ok(())
    }

    fn create_pool(
        &mut self,
        name: String,
        devices: Vec<PathBuf>,
        chunk_bytes: u32,
        device_bytes: Option<u64>,
        (force, encrypt, compression, write_tier): (bool, bool, Compression, Option<TierDevice>),
    ) -> Result<(), AdminError> {
        weft_volume::check_name("pool", &name)?;
        if self.pools.contains_key(&name) {
            return Err(VolumeError::Exists { kind: "pool", name }.into());
        }
        if encrypt && self.keyring.is_none() {
            return Err(AdminError::Invalid(format!(
                "pool {name} is to encrypt its volumes, but this node has no key-encryption key: start weft serve with --kek-file PATH or --kek-command CMD"
            )));
        }
        check_devices_free(&devices, &self.desired.pools()?)?;
        if let Some(tier) = &write_tier {
            tier::check_tier_free(tier, &devices, &self.desired.pools()?)?;
        }
        let mut media = FileMedia::open(&devices, device_bytes).map_err(|e| {
            VolumeError::invalid(
                "devices",
                format!("{e} (a missing file is created when --device-size is given)"),
            )
        })?;
        if !force {
            let found = Pool::probe(&mut media);
            if let Some((index, Some(superblock))) =
                found.iter().enumerate().find(|(_, s)| s.is_some())
            {
                return Err(VolumeError::invalid(
                    format!("device {}", devices[index].display()),
                    format!(
                        "it holds weft pool {}; use --force to overwrite it (its data is lost)",
                        superblock.pool_name
                    ),
                )
                .into());
            }
        }
        let uuid = self.node.derive(&[b"pool", name.as_bytes(), &nonce()]);
        let options = PoolOptions {
            name: name.clone(),
            chunk_bytes,
            uuid,
        };
        let mut pool = Pool::create(media, options)?;
        if let Some(tier) = &write_tier {
            // Before the record: a crash between leaves devices that hold
            // a pool with no record, as a creation cut short always did.
            self.attach_tier(&mut pool, tier)?;
        }
        self.hand_keys(&mut pool);
        let record = PoolRecord {
            devices,
            adding: Vec::new(),
            encrypt,
            compression: (compression != Compression::None).then(|| compression.name().into()),
            write_tier: write_tier.map(|tier| tier.path),
        };
        self.store_write(|d| d.change_pool(&name, |_| Some(record.clone())))?;
        self.health.insert(name.clone(), Arc::default());
        log::info!(
            "pool {name} created: {} in allocation units of {}",
            weft_storage::human_bytes(pool.info().capacity_bytes),
            weft_storage::human_bytes(u64::from(chunk_bytes))
        );
        self.pools.insert(name, pool);
        Ok(())
    }

    fn delete_volume(
        &mut self,
        name: &str,
        force: bool,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        let pool = match self.pool_of(name) {
            Ok(pool) => pool,
            Err(_) if self.forget_missing(name)? => {
                log::info!(
                    "volume {name}: its record is forgotten (none of this node's pools held it)"
                );
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let nqn = self.served_nqn(name)?;
        let hosts = plane.connected_hosts(&nqn);
        if !hosts.is_empty() && !force {
            return Err(AdminError::Busy {
                volume: name.to_string(),
                hosts: hosts.join(", "),
                nqn,
            });
        }
        self.check_no_replicated_snapshots(name)?;
        self.drop_stale_copy_snapshots(name, &pool)?;
        self.pool_mut(&pool)?.check_deletable(name)?;
        // Forget who may use it, stop serving it (hosts are disconnected),
        // then release its space. A crash in between leaves a volume that no
        // host may use, never a new volume that inherits old permissions.
        // A replica another node serves leaves the record to that node.
        let secondary = self.is_secondary(name);
        if !secondary {
            self.store_write(|d| d.delete_volume(name))?;
        }
        self.discard_volume(name, &pool, plane)?;
        log::info!("volume {name} deleted");
        if !secondary {
            // Room freed: a copy this node could not make or grow for want
            // of it is tried again now (the store's deletion may reach this
            // node's follower after the volume is gone here, when it no
            // longer concerns the node, and the next resync is a minute
            // away). Not for a replica whose primary deleted the record:
            // this node's copy of the store may not show that yet, and a
            // reconcile now would make the replica again.
            crate::replication::NodeServices::reconcile(&self.handle());
        }
        Ok(())
    }

    /// Stops serving volume `name` of `pool` (hosts are disconnected), then
    /// releases its space and what the node kept beside it.
    pub(super) fn discard_volume(
        &mut self,
        name: &str,
        pool: &str,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        plane.update_exports(self.exports_without(name));
        if let Err(error) = self.pool_mut(pool)?.delete_volume(name) {
            plane.update_exports(self.exports());
            return Err(error.into());
        }
        self.meters.remove(name);
        self.meters.remove(&replica_nqn(name));
        if let Some(intent) = self.intents.remove(name) {
            intent.remove();
        }
        self.stop_replicator(name);
        if let Some(dir) = &self.cluster_dir {
            crate::replication::run::remove_files(dir, name);
        }
        Ok(())
    }

    /// Grows pool `name` by `devices`, online. The devices are recorded as
    /// being added first, so that a crash at any point opens the pool with or
    /// without them, whichever its superblocks committed; the new capacity is
    /// allocatable when this returns, and the new exports (layout, member
    /// descriptors, maps) are published before it does.
    fn add_devices(
        &mut self,
        name: &str,
        devices: Vec<PathBuf>,
        device_bytes: Option<u64>,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        let pools = self.desired.pools()?;
        if !pools.contains_key(name) {
            return Err(not_found("pool", name));
        }
        check_devices_free(&devices, &pools)?;
        let adding = |record: Option<PoolRecord>| {
            record.map(|record| PoolRecord {
                adding: devices.clone(),
                ..record
            })
        };
        self.store_write(|d| d.change_pool(name, adding))?
            .ok_or_else(|| not_found("pool", name))?;
        let new = devices
            .iter()
            .map(|path| DevicePath {
                path: path.clone(),
                create_bytes: device_bytes,
            })
            .collect();
        let pool = self.pool_mut(name)?;
        let result = pool.add_members(new);
        let pool = &self.pools[name];
        note_pool_failure(pool, &self.health[name]);
        // In doubt (the pool failed mid-growth): the record keeps the devices
        // as being added until clear-failure or a restart reads the pool again.
        if pool.failure().is_none() {
            reconcile_members(&self.desired, name, pool)?;
        }
        plane.update_exports(self.exports());
        result?;
        log::info!(
            "pool {name}: {} added; {} of data space",
            devices
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            weft_storage::human_bytes(self.pools[name].info().capacity_bytes)
        );
        Ok(())
    }

    /// Deletes a pool that holds no volume: forgets it, then erases its
    /// superblocks so that its devices can make a new pool without --force.
    /// No exports refer to it (it has no volumes), so its devices close now.
    fn delete_pool(&mut self, name: &str) -> Result<(), AdminError> {
        let pool = self
            .pools
            .get(name)
            .ok_or_else(|| not_found("pool", name))?;
        let volumes: Vec<&str> = pool.volumes().map(|v| v.name.as_str()).collect();
        if !volumes.is_empty() {
            return Err(VolumeError::invalid(
                format!("deleting pool {name}"),
                format!(
                    "it holds volumes {}; delete them first (weft volume delete NAME)",
                    volumes.join(", ")
                ),
            )
            .into());
        }
        self.store_write(|d| d.change_pool(name, |_| None))?;
        let pool = self.pools.remove(name).expect("checked");
        self.health.remove(name);
        pool.erase()?;
        log::info!("pool {name} deleted");
        Ok(())
    }

    /// Reopens a failed pool at its last committed state and serves it again.
    /// Its volumes' I/O in flight drains and their old maps are retired first,
    /// so that no reactor writes through a map the reload replaced.
    fn clear_pool_failure(&mut self, name: &str, plane: &DataPlane) -> Result<(), AdminError> {
        let health = Arc::clone(
            self.health
                .get(name)
                .ok_or_else(|| not_found("pool", name))?,
        );
        let pool = self.pool_mut(name)?;
        let Some(failure) = health
            .failure()
            .map(|f| f.to_string())
            .or_else(|| pool.failure().map(str::to_string))
        else {
            return Err(VolumeError::invalid(
                format!("pool {name}"),
                "it has not failed; nothing to clear",
            )
            .into());
        };
        let volumes: Vec<_> = pool
            .volumes()
            .map(|v| (Arc::clone(&v.map), Arc::clone(&v.gate)))
            .collect();
        for (map, gate) in &volumes {
            let _drained = gate.quiesce();
            map.retire();
        }
        pool.reload()?;
        health.clear();
        let pool = &self.pools[name];
        reconcile_members(&self.desired, name, pool)?;
        tier::reconcile_tier(&self.desired, name, pool)?;
        plane.update_exports(self.exports());
        log::warn!("pool {name}: failure cleared by an operator ({failure}); serving it again from its last committed state");
        Ok(())
    }

    /// Clears the failure of a configured namespace (a file or block device).
    fn clear_namespace_failure(&mut self, nqn: &str, nsid: u32) -> Result<(), AdminError> {
        let index = self
            .base
            .config
            .subsystems
            .iter()
            .position(|s| s.nqn == nqn)
            .ok_or_else(|| not_found("configured subsystem", nqn))?;
        let device = self
            .base
            .namespace(index, Nsid(nsid))
            .ok_or_else(|| not_found("namespace", &format!("{nqn} {nsid}")))?;
        let Some(failure) = device.health.clear() else {
            return Err(VolumeError::invalid(
                format!("namespace {nsid} of {nqn}"),
                "it has not failed; nothing to clear",
            )
            .into());
        };
        log::warn!("namespace {nsid} of {nqn}: failure cleared by an operator ({failure})");
        Ok(())
    }

    /// The exports without volume `volume`'s subsystem.
    fn exports_without(&mut self, volume: &str) -> Arc<Exports> {
        let exports = self.exports();
        let mut config = TargetConfig::clone(&exports.config);
        let mut devices = exports.devices.clone();
        let serves = |namespaces: &Vec<NamespaceDevice>| {
            namespaces
                .iter()
                .any(|device| matches!(&device.backend, Backend::Volume(v) if v.volume == volume))
        };
        // A replicated volume is served twice: to hosts, and to its primary
        // (the replica subsystem).
        while let Some(index) = devices.iter().position(serves) {
            config.subsystems.remove(index);
            devices.remove(index);
        }
        Arc::new(Exports::new(Arc::new(config), devices))
    }

    /// Flattens in steps, serving waiting slow-path I/O between steps (admin
    /// operations wait in their queue for the flatten to finish).
    fn flatten(&mut self, name: &str) -> Result<(), AdminError> {
        let pool = self.pool_of(name)?;
        let mut from = 0;
        loop {
            let next = self
                .pool_mut(&pool)?
                .flatten_step(name, from, FLATTEN_STEP_CHUNKS)?;
            let Some(next) = next else {
                log::info!("volume {name} flattened");
                return Ok(());
            };
            from = next;
            self.serve_waiting_io();
        }
    }

    fn create_host(
        &mut self,
        name: &str,
        nqn: String,
        secrets: HostSecrets,
    ) -> Result<(), AdminError> {
        weft_volume::check_name("host", name)?;
        check_secrets(name, &secrets)?;
        weft_control::check_nqn(&nqn)
            .map_err(|hint| VolumeError::invalid(format!("host {name}'s NQN"), hint))?;
        let hosts = self.desired.hosts()?;
        if hosts.contains_key(name) {
            return Err(VolumeError::Exists {
                kind: "host",
                name: name.to_string(),
            }
            .into());
        }
        if let Some((existing, _)) = hosts.iter().find(|(_, h)| h.nqn == nqn) {
            return Err(AdminError::NqnTaken {
                nqn,
                existing: existing.clone(),
            });
        }
        let record = HostRecord {
            nqn,
            dhchap_secret: secrets.host,
            dhchap_ctrl_secret: secrets.controller,
            tls_psk: secrets.tls_psk,
            dhchap_group: secrets.dh_group,
        };
        let record = self.sealed(name, record);
        // Created only if absent: of two nodes adding one host name at once, one wins.
        match self.store_write(|d| d.create(&format!("hosts/{name}"), &record)) {
            Err(StoreError::Conflict { .. }) => {
                return Err(VolumeError::Exists {
                    kind: "host",
                    name: name.to_string(),
                }
                .into())
            }
            result => result?,
        };
        log::info!("host {name} added");
        Ok(())
    }

    fn set_host_secrets(&mut self, name: &str, changes: SecretChanges) -> Result<(), AdminError> {
        // Checked in the clear, stored sealed (a secret left as it was stays as stored).
        let sealed_changes = SecretChanges {
            host: changes
                .host
                .clone()
                .map(|secret| secret.map(|s| self.seal_secret(name, &s))),
            controller: changes
                .controller
                .clone()
                .map(|secret| secret.map(|s| self.seal_secret(name, &s))),
            tls_psk: changes
                .tls_psk
                .clone()
                .map(|psk| psk.map(|s| self.seal_secret(name, &s))),
            dh_group: changes.dh_group.clone(),
        };
        let change = |changes: &SecretChanges, mut record: HostRecord| {
            if let Some(host) = &changes.host {
                record.dhchap_secret = host.clone();
            }
            if let Some(controller) = &changes.controller {
                record.dhchap_ctrl_secret = controller.clone();
            }
            if let Some(psk) = &changes.tls_psk {
                record.tls_psk = psk.clone();
            }
            if let Some(group) = &changes.dh_group {
                record.dhchap_group = group.clone();
            }
            record
        };
        let stored = self
            .desired
            .hosts()?
            .remove(name)
            .ok_or_else(|| not_found("host", name))?;
        let record = change(&changes, self.opened(name, stored));
        let secrets = HostSecrets {
            host: record.dhchap_secret.clone(),
            controller: record.dhchap_ctrl_secret.clone(),
            tls_psk: record.tls_psk.clone(),
            dh_group: record.dhchap_group.clone(),
        };
        check_secrets(name, &secrets)?;
        self.store_write(|d| {
            d.change_host(name, |found| found.map(|r| change(&sealed_changes, r)))
        })?
        .ok_or_else(|| not_found("host", name))?;
        log::info!("host {name}: secrets changed (used from its next connection)");
        Ok(())
    }

    fn delete_host(&mut self, name: &str) -> Result<(), AdminError> {
        let host = self
            .host_statuses()?
            .into_iter()
            .find(|h| h.name == name)
            .ok_or_else(|| not_found("host", name))?;
        if !host.volumes.is_empty() {
            return Err(AdminError::HostAttached {
                host: name.to_string(),
                volumes: host.volumes.join(", "),
            });
        }
        self.store_write(|d| d.change_host(name, |_| None))?;
        log::info!("host {name} removed");
        Ok(())
    }

    fn change_attachment(
        &mut self,
        volume: &str,
        host: &str,
        attach: bool,
    ) -> Result<(), AdminError> {
        let id = self.volume_id_checked(volume)?;
        if !self.desired.hosts()?.contains_key(host) {
            return Err(not_found("host", host));
        }
        let mut changed = false;
        self.store_write(|d| {
            d.change_volume(volume, &id, |record| {
                changed = if attach {
                    record.hosts.insert(host.to_string())
                } else {
                    record.hosts.remove(host)
                };
            })
        })?;
        if changed {
            let verb = if attach {
                "attached to"
            } else {
                "detached from"
            };
            log::info!("volume {volume} {verb} host {host}");
        }
        Ok(())
    }

    /// The id (hex) of an existing volume, which its record carries.
    fn volume_id_checked(&self, volume: &str) -> Result<String, AdminError> {
        let pool = self.pool_of(volume)?;
        let id = self.pools[&pool].volume_info(volume)?.id;
        Ok(crate::identity::hex(&id))
    }

    /// The record of volume `name` with id `id` (empty if the store fails: no host may use it).
    fn volume_record(&self, name: &str, id: &[u8; 16]) -> VolumeRecord {
        self.desired
            .volume(name, &crate::identity::hex(id))
            .unwrap_or_else(|error| {
                log::error!("volume {name}: {error}");
                VolumeRecord::default()
            })
    }

    /// The desired-state record of every volume on the node's pools, by name.
    fn volume_records(&self) -> BTreeMap<String, VolumeRecord> {
        self.pools
            .values()
            .flat_map(|pool| pool.volumes())
            .map(|volume| {
                let record = self.volume_record(&volume.name, &volume.id);
                (volume.name.clone(), record)
            })
            .collect()
    }

    fn host_statuses(&self) -> Result<Vec<HostStatus>, AdminError> {
        crate::status::hosts_of(&self.desired)
    }

    fn check_volume_name_free(&self, name: &str) -> Result<(), AdminError> {
        match self.pool_of(name) {
            Ok(pool) => Err(AdminError::NameTaken {
                volume: name.to_string(),
                pool,
            }),
            Err(_) => Ok(()),
        }
    }

    fn pool_of(&self, volume: &str) -> Result<String, AdminError> {
        self.pools
            .iter()
            .find(|(_, pool)| pool.volume(volume).is_some())
            .map(|(name, _)| name.clone())
            .ok_or_else(|| not_found("volume", volume))
    }

    fn pool_mut(&mut self, name: &str) -> Result<&mut Pool<FileMedia>, AdminError> {
        self.pools
            .get_mut(name)
            .ok_or_else(|| not_found("pool", name))
    }
}

/// Stops the inbox when the manager thread ends (it only ends by a panic):
/// the I/O waiting is answered with an error and the admin callers hear that
/// the manager stopped, instead of waiting forever; later calls are refused.
struct StopOnExit<'a>(&'a Inbox<SlowIo, Admin>);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        let (io, _admin) = self.0.stop();
        for waiting in io {
            waiting.refuse(IoError::Other);
        }
    }
}

/// Every host, with the volumes attached to it (`records`: those of the
/// live volumes, whose records alone count; see `DesiredState::volume`).
/// The size hosts are served of a local volume of `local_size_bytes`: for
/// a replicated one, the record's, which a copy exceeds only while a growth
/// is being recorded (a primary of the old size must not be asked past its end).
fn served_size_bytes(local_size_bytes: u64, record: &VolumeRecord) -> u64 {
    match &record.replication {
        // The local volume is one member's shard; hosts see the whole.
        Some(replication) if replication.erasure.is_some() => replication.size_bytes,
        Some(replication) => local_size_bytes.min(replication.size_bytes),
        None => local_size_bytes,
    }
}

/// The volume this node makes for a new volume `spec`: the volume itself,
/// or for an erasure-coded one its shard (journal and a chunk per stripe).
fn local_spec(spec: &VolumeSpec, replication: Option<&ReplicationRecord>) -> VolumeSpec {
    let shard = replication.and_then(|r| crate::erasure::shard_bytes(r, r.erasure.as_ref()?));
    VolumeSpec {
        size_bytes: shard.unwrap_or(spec.size_bytes),
        ..spec.clone()
    }
}

/// Refuses an empty device list, or a device that is (or is being added as)
/// a member of one of `pools`.
fn check_devices_free(
    devices: &[PathBuf],
    pools: &BTreeMap<String, PoolRecord>,
) -> Result<(), AdminError> {
    if devices.is_empty() {
        return Err(VolumeError::invalid("device list", "give at least one --device").into());
    }
    let devices: Vec<PathBuf> = devices.iter().map(|d| tier::canonical(d)).collect();
    for (pool, record) in pools {
        let members = record.devices.iter().chain(&record.adding);
        let taken = members.map(|path| (path, "a member")).chain(
            record
                .write_tier
                .iter()
                .map(|path| (path, "the write tier")),
        );
        if let Some((path, role)) = taken
            .into_iter()
            .find(|(path, _)| devices.contains(&tier::canonical(path)))
        {
            return Err(VolumeError::invalid(
                format!("device {}", path.display()),
                format!("it is already {role} of pool {pool}"),
            )
            .into());
        }
    }
    Ok(())
}

/// Makes pool `name`'s record say which devices are members, as the pool
/// read them from its superblocks (a growth cut short by a crash or failure
/// committed or not), with nothing left "being added".
fn reconcile_members(
    desired: &DesiredState,
    name: &str,
    pool: &Pool<FileMedia>,
) -> Result<(), StoreError> {
    let members = usize::from(pool.layout().members);
    let devices = pool.media().paths()[..members].to_vec();
    let mut left_out = Vec::new();
    desired.change_pool(name, |found| {
        let record = found?;
        left_out = record
            .adding
            .iter()
            .filter(|p| !devices.contains(p))
            .cloned()
            .collect();
        Some(PoolRecord {
            devices: devices.clone(),
            adding: Vec::new(),
            ..record
        })
    })?;
    for path in left_out {
        log::warn!(
            "pool {name}: device {} was being added but did not join; add it again (weft pool add-device {name} --device {})",
            path.display(),
            path.display()
        );
    }
    Ok(())
}

/// Shares a failure the pool itself noticed (a metadata write or a sync)
/// with the data plane, which then refuses every I/O on the pool's volumes.
fn note_pool_failure(pool: &Pool<FileMedia>, health: &Health) {
    if let Some(reason) = pool.failure() {
        if health.fail(
            FailedOperation::Metadata,
            &std::io::Error::other(reason.to_string()),
        ) {
            log::error!(
                "pool {}: every I/O on its volumes fails until an operator checks its devices and runs `weft pool clear-failure {}`",
                pool.name(),
                pool.name()
            );
        }
    }
}

/// The data plane's form of a volume's limits (0: none).
fn data_plane_limits(qos: &QosLimits) -> Limits {
    Limits {
        iops: qos.iops_max.unwrap_or(0),
        bytes: qos.bw_max.unwrap_or(0),
        read_iops: qos.read_iops_max.unwrap_or(0),
        read_bytes: qos.read_bw_max.unwrap_or(0),
        write_iops: qos.write_iops_max.unwrap_or(0),
        write_bytes: qos.write_bw_max.unwrap_or(0),
    }
}

/// Checks a host's secrets: each a valid `DHHC-1` secret, the controller's
/// only with the host's, and the two different.
fn check_secrets(name: &str, secrets: &HostSecrets) -> Result<(), AdminError> {
    let what = |which: &str| format!("host {name}'s {which}");
    for (which, text) in [
        ("DH-HMAC-CHAP secret", &secrets.host),
        ("DH-HMAC-CHAP controller secret", &secrets.controller),
    ] {
        if let Some(text) = text {
            DhchapSecret::parse(text).map_err(|error| {
                VolumeError::invalid(
                    what(which),
                    format!("{error}; create one with: nvme gen-dhchap-key --nqn NQN"),
                )
            })?;
        }
    }
    if let Some(text) = &secrets.tls_psk {
        weft_proto::tls::psk::ConfiguredPsk::parse(text).map_err(|error| {
            VolumeError::invalid(
                what("TLS PSK"),
                format!("{error}; create one with: nvme gen-tls-key (or weft host add --tls)"),
            )
        })?;
    }
    // (Kept while the host has no secret: it applies once it has one.)
    if let Some(group) = secrets.dh_group.as_deref() {
        if DhGroup::from_name(group).is_none() {
            return Err(VolumeError::invalid(
                what("DH group"),
                "give null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192",
            )
            .into());
        }
    }
    match (&secrets.host, &secrets.controller) {
        (None, Some(_)) => Err(VolumeError::invalid(
            what("DH-HMAC-CHAP controller secret"),
            "the controller authenticates to a host that authenticates itself: give the host's secret too",
        )
        .into()),
        (Some(host), Some(controller)) if host == controller => Err(VolumeError::invalid(
            what("DH-HMAC-CHAP controller secret"),
            "use a secret different from the host's (the same one both ways lets a man in the middle reflect challenges)",
        )
        .into()),
        _ => Ok(()),
    }
}

/// The export entry of host `name`, with its parsed secrets (opened with
/// `seal` in a cluster). A stored secret that no longer opens or parses
/// keeps the host out rather than letting it in unauthenticated.
fn allowed_host(name: &str, host: &HostRecord, seal: Option<&sealed::Seal>) -> Option<AllowedHost> {
    let open = |stored: &str| match seal {
        Some(seal) => seal.open(name, stored).map_err(|e| e.to_string()),
        None => Ok(stored.to_string()),
    };
    let parse = |text: &Option<String>| {
        text.as_deref()
            .map(|stored| DhchapSecret::parse(&open(stored)?).map_err(|e| e.to_string()))
            .transpose()
    };
    let tls_psk = host
        .tls_psk
        .as_deref()
        .map(|stored| ConfiguredPsk::parse(&open(stored)?).map_err(|e| e.to_string()))
        .transpose();
    let tls_psk = match tls_psk {
        Ok(psk) => psk.map(Arc::new),
        Err(error) => {
            log::error!("host {name}: stored TLS PSK refused ({error}); the host may not connect");
            return None;
        }
    };
    let dh_group = match host.dhchap_group.as_deref().map(DhGroup::from_name) {
        None => DhGroup::Null,
        Some(Some(group)) => group,
        Some(None) => {
            log::error!(
                "host {name}: stored DH group {:?} unknown; the host may not connect",
                host.dhchap_group
            );
            return None;
        }
    };
    let keys = match (parse(&host.dhchap_secret), parse(&host.dhchap_ctrl_secret)) {
        (Ok(None), _) => None,
        (Ok(Some(secret)), Ok(controller)) => Some(Arc::new(HostKeys {
            host: secret,
            controller,
            dh_group,
        })),
        (Err(error), _) | (_, Err(error)) => {
            log::error!("host {name}: stored DH-HMAC-CHAP secret refused ({error}); the host may not connect");
            return None;
        }
    };
    Some(AllowedHost {
        nqn: host.nqn.clone(),
        keys,
        tls_psk,
    })
}

pub(crate) fn not_found(kind: &'static str, name: &str) -> AdminError {
    VolumeError::NotFound {
        kind,
        name: name.to_string(),
    }
    .into()
}

/// The answer to a slow-path I/O of `volume` whose result is `result`
/// (a failure logged).
fn outcome(volume: &str, result: Result<(), VolumeError>) -> VolumeOutcome {
    match result {
        Ok(()) => VolumeOutcome::Done(Ok(())),
        Err(error) => {
            log::warn!("volume {volume}: {error}");
            VolumeOutcome::Done(Err(io_error(&error)))
        }
    }
}

/// The NVMe status class of a volume failure.
fn io_error(error: &VolumeError) -> IoError {
    match error {
        VolumeError::PoolFull { .. } | VolumeError::MetadataFull { .. } => IoError::NoSpace,
        VolumeError::Io { .. } | VolumeError::Failed { .. } => IoError::Media,
        _ => IoError::Other,
    }
}

/// Bytes that differ between two pool creations with the same name.
fn nonce() -> [u8; 16] {
    let mut bytes = [0u8; 16];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    bytes.copy_from_slice(&now.to_le_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::NodeSnapshot;
    use weft_proto::target::{AddressFamily, ListenerConfig};

    /// A manager of the pools `desired` lists whose thread is not running.
    pub(super) fn idle_manager(desired: DesiredState) -> Manager {
        let config = TargetConfig {
            subsystems: Vec::new(),
            listeners: vec![ListenerConfig {
                port_id: 1,
                family: AddressFamily::Ipv4,
                address: "127.0.0.1".into(),
                service: "4420".into(),
            }],
            limits: weft_proto::Limits::DEFAULT,
            referrals: Vec::new(),
            node_addresses: Vec::new(),
            discovery_serial: "d".into(),
            generation: 1,
        };
        let base = Arc::new(Exports::new(Arc::new(config), Vec::new()));
        Manager::open(desired, NodeId([7; 16]), base, 16).unwrap()
    }

    fn empty_desired_state() -> DesiredState {
        DesiredState::new(Box::new(weft_control::MemoryStore::default()), "n1")
    }

    /// The NQN of host "h" of [`pool_with_volume`].
    pub(super) const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:h";

    /// Desired state with pool "p" (one 64 MiB file in a directory named
    /// after `test`, 1 MiB allocation units) holding thin volume "v" of
    /// 8 MiB, attached to host "h"; the pool is made before a manager opens
    /// it. The directory comes back too (for the test to remove).
    pub(super) fn pool_with_volume(test: &str) -> (DesiredState, PathBuf) {
        let dir = std::env::temp_dir().join(format!("weft-node-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let devices = vec![dir.join("d0.img")];
        let media = FileMedia::open(&devices, Some(64 << 20)).unwrap();
        let options = PoolOptions {
            name: "p".into(),
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            uuid: [1; 16],
        };
        let mut pool = Pool::create(media, options).unwrap();
        let spec = VolumeSpec {
            name: "v".into(),
            size_bytes: 8 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            compression: weft_volume::compression::Compression::None,
        };
        pool.create_volume(&spec).unwrap();
        let id = crate::identity::hex(&pool.volume_info("v").unwrap().id);
        drop(pool);
        let desired = empty_desired_state();
        let record = PoolRecord {
            devices,
            adding: Vec::new(),
            encrypt: false,
            compression: None,
            write_tier: None,
        };
        desired.change_pool("p", |_| Some(record.clone())).unwrap();
        let host = HostRecord {
            nqn: HOST_NQN.into(),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls_psk: None,
            dhchap_group: None,
        };
        desired.change_host("h", |_| Some(host.clone())).unwrap();
        desired
            .change_volume("v", &id, |volume| {
                volume.hosts = ["h".to_string()].into();
                volume.qos.iops_max = Some(1000);
            })
            .unwrap();
        (desired, dir)
    }

    /// The admin queue is bounded: when it is full, an admin call is refused
    /// as busy at once instead of waiting (or growing the queue without limit).
    #[test]
    fn a_full_admin_queue_refuses_instead_of_growing() {
        let manager = idle_manager(empty_desired_state());
        let handle = manager.handle();
        let (reply, _answers) = mpsc::channel();
        for _ in 0..ADMIN_QUEUE_MAX {
            let admin = Admin {
                op: AdminOp::Flush,
                reply: reply.clone(),
            };
            handle.inbox.push_admin(admin).unwrap();
        }
        let error = handle.call(AdminOp::Flush).unwrap_err();
        assert!(
            matches!(
                error,
                AdminError::ManagerBusy {
                    queue: ADMIN_QUEUE_MAX
                }
            ),
            "{error}"
        );
        assert!(error.to_string().contains("retry in a moment"), "{error}");
    }

    /// Reads never enter the manager's queues: with its thread not running
    /// and its admin queue full, what it published answers every read.
    #[test]
    fn reads_are_answered_from_the_published_snapshot_without_the_manager() {
        let (desired, dir) = pool_with_volume("snapshot");
        let manager = idle_manager(desired);
        let (reply, _answers) = mpsc::channel();
        for _ in 0..ADMIN_QUEUE_MAX {
            let admin = Admin {
                op: AdminOp::Flush,
                reply: reply.clone(),
            };
            manager.handle.inbox.push_admin(admin).unwrap();
        }
        let snapshot = manager.published.load();
        let pools = snapshot.pools();
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].info.name, "p");
        assert_eq!(pools[0].devices, manager.pools["p"].media().paths());
        assert_eq!(pools[0].members.len(), 1);
        assert_eq!(pools[0].failure, None);
        let connected = |nqn: &str| vec![format!("host of {nqn}")];
        let volume = snapshot.volume("v", &connected).unwrap();
        assert_eq!(volume.pool, "p");
        assert_eq!(volume.nqn, "nqn.2026-11.io.weft:vol:v");
        assert_eq!(volume.info.size_bytes, 8 << 20);
        assert_eq!(volume.hosts, ["h"]);
        assert_eq!(volume.qos.iops_max, Some(1000));
        assert_eq!(
            volume.connected_hosts,
            ["host of nqn.2026-11.io.weft:vol:v"]
        );
        assert_eq!(snapshot.volumes(&connected), [volume]);
        assert!(matches!(
            snapshot.volume("w", &connected),
            Err(AdminError::Volume(VolumeError::NotFound {
                kind: "volume",
                ..
            }))
        ));
        // Hosts are read from the desired state, not the snapshot.
        let hosts = manager.host_statuses().unwrap();
        assert_eq!(hosts.len(), 1);
        assert_eq!(hosts[0].volumes, ["v"]);
        assert_eq!(hosts[0].authentication, crate::Authentication::None);
        // A failure the data plane sees shows at once, without a new snapshot.
        manager.health["p"].fail(FailedOperation::Sync, &std::io::Error::from_raw_os_error(5));
        let failure = snapshot.pools()[0].failure.clone().unwrap();
        assert!(failure.starts_with("fdatasync failed"), "{failure}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Through the data plane: a host's first write that reaches the
    /// manager behind two admin operations is served (its allocation
    /// committed and published) before either of them.
    #[test]
    fn a_host_write_queued_behind_admin_operations_is_served_first() {
        let (desired, dir) = pool_with_volume("order");
        let mut manager = idle_manager(desired);
        let (plane, _controller, mut queue) = served_volume(&mut manager);
        // The manager's thread is not running yet: two admin operations
        // wait, then the host's first write joins them.
        let handle = manager.handle();
        let mut replies = Vec::new();
        for iops in [2000, 3000] {
            let (reply, result) = mpsc::channel();
            let changes = QosChanges {
                iops_max: Some(Some(iops)),
                ..QosChanges::default()
            };
            let volume = "v".to_string();
            let op = AdminOp::SetQos { volume, changes };
            handle.inbox.push_admin(Admin { op, reply }).unwrap();
            replies.push(result);
        }
        let writer = std::thread::spawn(move || queue.write(1, 0, 4096, &[0xab; 4096]));
        let waited = std::time::Instant::now();
        while handle.inbox.queued() != (1, 2) {
            assert!(waited.elapsed().as_secs() < 10, "{:?}", handle.inbox);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let published = Arc::clone(&manager.published);
        manager.spawn(Arc::clone(&plane)).unwrap();
        writer.join().unwrap().unwrap();
        for result in replies {
            result.recv().unwrap().unwrap();
        }
        // The order of the manager's work, read from what it published.
        let history = published.history.lock().unwrap();
        let volume = |snapshot: &NodeSnapshot| Arc::clone(&snapshot.pools["p"].volumes["v"]);
        let written = history
            .iter()
            .position(|s| volume(s).info.allocated_bytes > 0)
            .unwrap();
        let first_admin = history
            .iter()
            .position(|s| volume(s).qos.iops_max == Some(2000))
            .unwrap();
        assert!(written < first_admin, "{written} {first_admin}");
        assert_eq!(volume(&history[written]).qos.iops_max, Some(1000));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A data plane serving `manager`'s exports, and an I/O queue of host
    /// [`HOST_NQN`] on volume "v" (with its controller, which must live as
    /// long as the queue).
    pub(super) fn served_volume(
        manager: &mut Manager,
    ) -> (
        Arc<DataPlane>,
        weft_initiator::Controller,
        weft_initiator::Queue,
    ) {
        let plane = DataPlane::start(
            manager.exports(),
            &["127.0.0.1:0".parse().unwrap()],
            1,
            std::time::Duration::ZERO,
            weft_target::PeerLimits::DEFAULT,
            weft_proto::target::DYNAMIC_CNTLIDS,
        )
        .unwrap();
        let url = format!("nvme-tcp://{}/{}", plane.listening[0], volume_nqn("v"));
        let options = weft_initiator::ConnectOptions {
            host_nqn: HOST_NQN.into(),
            ..weft_initiator::ConnectOptions::default()
        };
        let url = weft_initiator::TargetUrl::parse(&url).unwrap();
        let controller = weft_initiator::Controller::connect(&url, options, 1).unwrap();
        let queue = controller.open_io_queue(1).unwrap();
        (Arc::new(plane), controller, queue)
    }

    /// A store whose commits wait until the test opens it (a cluster store
    /// that is slow or unreachable).
    pub(super) struct GatedStore {
        pub(super) inner: Arc<dyn weft_control::Store>,
        open: std::sync::Mutex<bool>,
        opened: std::sync::Condvar,
        /// Commits waiting at the gate.
        pub(super) waiting: std::sync::atomic::AtomicUsize,
    }

    impl GatedStore {
        /// A gate, closed, in front of `inner`.
        pub(super) fn closed(inner: Arc<dyn weft_control::Store>) -> GatedStore {
            GatedStore {
                inner,
                open: std::sync::Mutex::new(false),
                opened: std::sync::Condvar::new(),
                waiting: std::sync::atomic::AtomicUsize::new(0),
            }
        }

        /// Waits until a commit waits at the gate.
        pub(super) fn wait_for_a_commit(&self) {
            let waited = std::time::Instant::now();
            while self.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(waited.elapsed().as_secs() < 10, "nothing was committed");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }

        /// Lets every commit through, now and from now on.
        pub(super) fn open(&self) {
            *self.open.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    impl weft_control::Store for GatedStore {
        fn get(&self, key: &str) -> Result<Option<weft_control::Entry>, StoreError> {
            self.inner.get(key)
        }
        fn list(&self, prefix: &str) -> Result<weft_control::Listing, StoreError> {
            self.inner.list(prefix)
        }
        fn commit(&self, txn: weft_control::Txn) -> Result<weft_control::Revision, StoreError> {
            let open = self.open.lock().unwrap();
            self.waiting
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(self.opened.wait_while(open, |open| !*open).unwrap());
            self.inner.commit(txn)
        }
        fn grant_lease(
            &self,
            ttl: std::time::Duration,
        ) -> Result<weft_control::LeaseId, StoreError> {
            self.inner.grant_lease(ttl)
        }
        fn keep_alive(&self, lease: weft_control::LeaseId) -> Result<(), StoreError> {
            self.inner.keep_alive(lease)
        }
        fn revoke_lease(&self, lease: weft_control::LeaseId) -> Result<(), StoreError> {
            self.inner.revoke_lease(lease)
        }
        fn watch(
            &self,
            prefix: &str,
            after: weft_control::Revision,
        ) -> Result<mpsc::Receiver<weft_control::WatchEvent>, StoreError> {
            self.inner.watch(prefix, after)
        }
        fn location(&self) -> String {
            "gated".into()
        }
    }

    /// An admin operation whose commit to the store hangs (etcd slow or
    /// gone) does not hold up a host's first write: the manager serves
    /// slow-path I/O while the commit waits.
    #[test]
    fn a_host_write_is_served_while_a_store_commit_hangs() {
        let (desired, dir) = pool_with_volume("gated");
        let gate = Arc::new(GatedStore::closed(Arc::clone(desired.store())));
        let store: Arc<dyn weft_control::Store> = gate.clone();
        let mut manager = idle_manager(DesiredState::shared(store, "n1"));
        let (plane, _controller, mut queue) = served_volume(&mut manager);
        let handle = manager.handle();
        manager.spawn(Arc::clone(&plane)).unwrap();
        let admin = std::thread::spawn(move || {
            let changes = QosChanges {
                iops_max: Some(Some(2000)),
                ..QosChanges::default()
            };
            let volume = "v".to_string();
            handle.call(AdminOp::SetQos { volume, changes })
        });
        let waited = std::time::Instant::now();
        gate.wait_for_a_commit();
        // The first write of a thin volume needs the manager (allocation).
        queue.write(1, 0, 4096, &[0xcd; 4096]).unwrap();
        assert!(
            !admin.is_finished(),
            "the admin call waits for its commit ({:?})",
            waited.elapsed()
        );
        gate.open();
        admin.join().unwrap().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reconciles_asked_for_while_one_is_queued_are_not_queued_again() {
        use crate::replication::NodeServices;
        let manager = idle_manager(empty_desired_state());
        let handle = manager.handle();
        for _ in 0..5 {
            handle.reconcile();
        }
        let inbox = &manager.handle.inbox;
        let queued = |inbox: &Inbox<SlowIo, Admin>| {
            let mut ops = Vec::new();
            while let Next::Admin(Admin { op, .. }) = inbox.next(1, Some(std::time::Instant::now()))
            {
                ops.push(op);
            }
            ops
        };
        let ops = queued(inbox);
        assert!(matches!(ops[..], [AdminOp::Reconcile]), "{ops:?}");
        // Taken (the manager clears the mark as it begins one): the next is queued.
        manager
            .handle
            .reconcile_queued
            .swap(false, Ordering::AcqRel);
        handle.reconcile();
        assert_eq!(queued(inbox).len(), 1);
    }
}
