//! The volume manager: one thread that owns every pool of the node and is
//! the only writer of their metadata. It serves two kinds of work in arrival
//! order — the data plane's slow path (first writes, copy-on-write, I/O
//! while a volume drains, deallocation, flush) and admin operations (pools,
//! volumes, snapshots) — and after each change to the set of volumes or
//! their sizes it hands the data plane new exports, in which every volume is
//! its own subsystem `nqn.2026-11.io.weft:vol:<name>` with one namespace.
//!
//! Allocations of many writes that arrive together are made durable by one
//! journal commit per pool (group commit). What the devices do not hold —
//! each pool's member devices, the hosts, which hosts may use a volume, QoS
//! limits — is desired state in the store (weft-control); every change is
//! committed there before it is acknowledged, and exports are rebuilt from
//! both after a restart.

use crate::identity::NodeId;
use crate::status::{Authentication, HostStatus, PoolStatus, VolumeStatus};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use weft_control::{DesiredState, HostRecord, PoolRecord, QosLimits, StoreError, VolumeRecord};
use weft_proto::auth::{DhchapSecret, HostKeys};
use weft_proto::target::{AllowedHost, HostAccess, NamespaceConfig, SubsystemConfig, TargetConfig};
use weft_proto::types::Nsid;
use weft_proto::IoError;
use weft_target::meter::Limits;
use weft_target::{
    Backend, DataPlane, Exports, FailedOperation, Health, LimitReached, Meter, NamespaceDevice,
    VolumeBackend, VolumeManager, VolumeOutcome, VolumeRequest, VolumeWork,
};
use weft_volume::{DevicePath, FileMedia, Pool, PoolOptions, VolumeError, VolumeInfo, VolumeSpec};

/// NQN prefix of volume subsystems.
pub const VOLUME_NQN_PREFIX: &str = "nqn.2026-11.io.weft:vol:";
/// Default allocation unit.
pub const DEFAULT_CHUNK_BYTES: u32 = 1 << 20;
/// Allocation units a flatten copies between two looks at waiting I/O.
const FLATTEN_STEP_CHUNKS: usize = 16;
/// Slow-path requests handled (and committed) together at most.
const BATCH_MAX: usize = 128;

/// The NQN a volume is served as.
pub fn volume_nqn(volume: &str) -> String {
    format!("{VOLUME_NQN_PREFIX}{volume}")
}

/// An admin operation.
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
    },
    /// Every pool.
    ListPools,
    /// One pool, with each of its devices.
    ShowPool(String),
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
    },
    /// Every volume.
    ListVolumes,
    /// One volume.
    ShowVolume(String),
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
    /// Every host.
    ListHosts,
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
    /// One host.
    ShowHost(String),
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
    /// Make everything durable (before exit).
    Flush,
}

/// A host's DH-HMAC-CHAP secrets in their `DHHC-1:..` text form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSecrets {
    /// The host's own: it proves it knows it.
    pub host: Option<String>,
    /// The controller's: asked for by hosts that authenticate the controller too.
    pub controller: Option<String>,
}

/// Changes to a host's secrets: each field `None` keeps the secret,
/// `Some(None)` removes it, `Some(Some(text))` replaces it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretChanges {
    /// The host's secret.
    pub host: Option<Option<String>>,
    /// The controller's secret.
    pub controller: Option<Option<String>>,
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

/// What an admin operation returns.
#[derive(Debug, Clone)]
pub enum AdminReply {
    /// Nothing to report.
    Done,
    /// Pools.
    Pools(Vec<PoolStatus>),
    /// One pool.
    Pool(Box<PoolStatus>),
    /// Volumes.
    Volumes(Vec<VolumeStatus>),
    /// One volume.
    Volume(Box<VolumeStatus>),
    /// Hosts.
    Hosts(Vec<HostStatus>),
    /// One host.
    Host(HostStatus),
}

/// Why an admin operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The volume layer refused or failed.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// Hosts are connected to a volume being deleted.
    #[error("volume {volume} has connected hosts ({hosts}); disconnect them first (nvme disconnect -n {nqn}) or delete with --force")]
    Busy {
        /// The volume.
        volume: String,
        /// Their NQNs.
        hosts: String,
        /// The volume's NQN.
        nqn: String,
    },
    /// A volume of that name exists (in any pool of the node).
    #[error("volume {volume} already exists in pool {pool}; volume names are unique on a node (they name the NQN), choose another")]
    NameTaken {
        /// The name.
        volume: String,
        /// The pool that has it.
        pool: String,
    },
    /// A host is still attached to volumes.
    #[error("host {host} is attached to volumes {volumes}; detach it first (weft volume detach VOLUME --host {host})")]
    HostAttached {
        /// The host.
        host: String,
        /// Its volumes.
        volumes: String,
    },
    /// A host NQN is registered under two names.
    #[error("NQN {nqn} is already registered as host {existing}")]
    NqnTaken {
        /// The NQN.
        nqn: String,
        /// The host that has it.
        existing: String,
    },
    /// The desired state could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The volume manager's queue is full.
    #[error("the node is busy: its volume manager has {queue} requests queued, its limit; retry in a moment")]
    ManagerBusy {
        /// The queue's limit.
        queue: u32,
    },
    /// The node's own files failed.
    #[error("{0}")]
    Node(String),
}

/// The manager's inbox.
#[derive(Debug)]
enum Work {
    Io(VolumeRequest),
    Admin(AdminOp, Sender<Result<AdminReply, AdminError>>),
}

/// A handle to the manager thread: the data plane's slow path and the API's
/// admin calls. Its queue is bounded (`limits.manager_queue`): a reactor never
/// waits for room (the I/O is answered "not ready", which a host retries),
/// nor does an admin call (it is refused as busy).
#[derive(Debug, Clone)]
pub struct ManagerHandle {
    sender: SyncSender<Work>,
    queue: u32,
    /// Refusals since the queue was last full (logged once per episode).
    full: Arc<LimitReached>,
}

impl VolumeManager for ManagerHandle {
    fn submit(&self, request: VolumeRequest) {
        let (work, error) = match self.try_send(Work::Io(request)).map_err(|e| *e) {
            Ok(()) => return,
            Err(mpsc::TrySendError::Full(work)) => (work, IoError::Busy),
            Err(mpsc::TrySendError::Disconnected(work)) => (work, IoError::Other),
        };
        if let Work::Io(request) = work {
            request.reply.send(VolumeOutcome::Done(Err(error)));
        }
    }
}

impl ManagerHandle {
    /// Runs an admin operation and waits for its result.
    pub fn call(&self, op: AdminOp) -> Result<AdminReply, AdminError> {
        let (reply, result) = mpsc::channel();
        match self.try_send(Work::Admin(op, reply)).map_err(|e| *e) {
            Ok(()) => {}
            Err(mpsc::TrySendError::Full(_)) => {
                return Err(AdminError::ManagerBusy { queue: self.queue })
            }
            Err(mpsc::TrySendError::Disconnected(_)) => {
                return Err(AdminError::Node("the volume manager has stopped".into()))
            }
        }
        result
            .recv()
            .map_err(|_| AdminError::Node("the volume manager has stopped".into()))?
    }

    /// Queues `work` without waiting; a full queue is logged once until it
    /// has room again. The work comes back (boxed: only on refusal) with why.
    fn try_send(&self, work: Work) -> Result<(), Box<mpsc::TrySendError<Work>>> {
        match self.sender.try_send(work) {
            Ok(()) => {
                if let Some(refused) = self.full.admit() {
                    log::info!(
                        "the volume manager's queue has room again ({refused} requests refused)"
                    );
                }
                Ok(())
            }
            Err(error) => {
                let full = matches!(error, mpsc::TrySendError::Full(_));
                if full && self.full.refuse() {
                    log::warn!(
                        "the volume manager has {} requests queued, its limit (limits.manager_queue in weft.toml): I/O that needs it is answered Namespace Not Ready (hosts retry) and admin calls busy until it catches up",
                        self.queue
                    );
                }
                Err(Box::new(error))
            }
        }
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
    inbox: Receiver<Work>,
    generation: u64,
    deferred: VecDeque<Work>,
}

impl Manager {
    /// Opens every pool the desired state lists. `base` holds the configured
    /// (non-volume) subsystems; at most `queue` requests wait for the manager.
    pub fn open(
        desired: DesiredState,
        node: NodeId,
        base: Arc<Exports>,
        queue: u32,
    ) -> Result<Manager, String> {
        let mut pools = BTreeMap::new();
        let mut desired = desired;
        for (name, record) in desired.pools().map_err(|e| e.to_string())? {
            // Devices being added when weft stopped are offered after the
            // members; the pool's superblocks say whether they joined.
            let mut paths = record.devices.clone();
            paths.extend(record.adding.iter().filter(|p| p.exists()).cloned());
            let media = FileMedia::open(&paths, None).map_err(|e| format!("pool {name}: {e}"))?;
            let pool = Pool::open(media).map_err(|e| format!("pool {name}: {e}"))?;
            reconcile_members(&mut desired, &name, &pool).map_err(|e| e.to_string())?;
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
        let (sender, inbox) = mpsc::sync_channel(queue as usize);
        let generation = base.config.generation;
        Ok(Manager {
            node,
            base,
            pools,
            health,
            desired,
            meters: BTreeMap::new(),
            handle: ManagerHandle {
                sender,
                queue,
                full: Arc::default(),
            },
            inbox,
            generation,
            deferred: VecDeque::new(),
        })
    }

    /// The handle (clone it for the API).
    pub fn handle(&self) -> ManagerHandle {
        self.handle.clone()
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
        for (pool_name, pool) in &self.pools {
            let member_fds = pool.media().fds();
            let health = &self.health[pool_name];
            for volume in pool.volumes() {
                let nqn = volume_nqn(&volume.name);
                let record = self.volume_record(&volume.name, &volume.id);
                let meter = Arc::clone(self.meters.entry(volume.name.clone()).or_default());
                let limits = data_plane_limits(&record.qos);
                if meter.limits() != limits {
                    meter.set_limits(limits);
                }
                let allowed = record
                    .hosts
                    .iter()
                    .filter_map(|name| allowed_host(name, hosts.get(name)?))
                    .collect();
                config.subsystems.push(SubsystemConfig {
                    nqn: nqn.clone(),
                    serial: self.node.serial(&nqn),
                    model: "weft volume".into(),
                    firmware: env!("CARGO_PKG_VERSION").to_string(),
                    namespaces: vec![NamespaceConfig {
                        nsid: Nsid(1),
                        blocks: volume.size_bytes / u64::from(volume.block_size),
                        block_size: volume.block_size,
                        nguid: volume.id,
                        uuid: volume.id,
                        eui64: volume.id[8..].try_into().expect("8 bytes"),
                        thin: !volume.thick,
                        ready: true,
                    }],
                    access: HostAccess::Only(allowed),
                });
                let backend = VolumeBackend {
                    pool: pool_name.clone(),
                    volume: volume.name.clone(),
                    map: Arc::clone(&volume.map),
                    gate: Arc::clone(&volume.gate),
                    layout: *pool.layout(),
                    member_fds: member_fds.clone(),
                    manager: Arc::new(self.handle.clone()),
                    health: Arc::clone(health),
                };
                devices.push(vec![NamespaceDevice {
                    nsid: Nsid(1),
                    backend: Backend::Volume(Arc::new(backend)),
                    meter,
                    health: Arc::clone(health),
                }]);
            }
        }
        config.generation = self.generation;
        Arc::new(Exports::new(Arc::new(config), devices))
    }

    /// Starts the manager thread; it updates `plane`'s exports after changes.
    pub fn spawn(self, plane: Arc<DataPlane>) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("weft-volumes".into())
            .spawn(move || self.run(&plane))
            .map(|_| ())
    }

    fn run(mut self, plane: &DataPlane) {
        loop {
            let first = match self.deferred.pop_front() {
                Some(work) => work,
                None => match self.inbox.recv() {
                    Ok(work) => work,
                    Err(_) => return,
                },
            };
            let mut batch = vec![first];
            while batch.len() < BATCH_MAX {
                match self.inbox.try_recv() {
                    Ok(work) => batch.push(work),
                    Err(_) => break,
                }
            }
            self.handle_batch(batch, plane);
        }
    }

    fn handle_batch(&mut self, batch: Vec<Work>, plane: &DataPlane) {
        let mut prepared = Vec::new();
        for work in batch {
            match work {
                Work::Io(request) => {
                    if let Some(request) = self.handle_io(request) {
                        prepared.push(request);
                    }
                }
                Work::Admin(op, reply) => {
                    // Allocations staged so far are committed before an admin change.
                    self.finish_prepared(&mut prepared);
                    let result = self.admin(op, plane);
                    let _ = reply.send(result);
                }
            }
        }
        self.finish_prepared(&mut prepared);
    }

    /// Serves one slow-path request; a prepared write waits for the group
    /// commit and is returned.
    fn handle_io(&mut self, request: VolumeRequest) -> Option<VolumeRequest> {
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
        let result = match request.work {
            VolumeWork::Wait => Ok(()),
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
        };
        note_pool_failure(pool, health);
        let outcome = match (request.work, result) {
            (VolumeWork::Wait, _) => VolumeOutcome::Retry,
            (_, Ok(())) => VolumeOutcome::Done(Ok(())),
            (_, Err(error)) => {
                log::warn!("volume {}: {error}", request.volume);
                VolumeOutcome::Done(Err(io_error(&error)))
            }
        };
        request.reply.send(outcome);
        None
    }

    /// Commits every pool with staged allocations, then lets the writes retry.
    fn finish_prepared(&mut self, prepared: &mut Vec<VolumeRequest>) {
        if prepared.is_empty() {
            return;
        }
        let mut committed: BTreeMap<String, Result<(), IoError>> = BTreeMap::new();
        for request in prepared.iter() {
            if !committed.contains_key(&request.pool) {
                let pool = self.pools.get_mut(&request.pool).expect("checked");
                let result = pool.commit().map_err(|error| io_error(&error));
                note_pool_failure(pool, &self.health[&request.pool]);
                committed.insert(request.pool.clone(), result);
            }
        }
        for request in prepared.drain(..) {
            let outcome = match committed[&request.pool] {
                Ok(()) => VolumeOutcome::Retry,
                Err(error) => VolumeOutcome::Done(Err(error)),
            };
            request.reply.send(outcome);
        }
    }

    fn admin(&mut self, op: AdminOp, plane: &DataPlane) -> Result<AdminReply, AdminError> {
        let exports_change = matches!(
            op,
            AdminOp::CreateVolume { .. }
                | AdminOp::ResizeVolume { .. }
                | AdminOp::CloneVolume { .. }
                | AdminOp::Attach { .. }
                | AdminOp::Detach { .. }
                | AdminOp::SetHostSecrets { .. }
        );
        let reply = match op {
            AdminOp::CreatePool {
                name,
                devices,
                chunk_bytes,
                device_bytes,
                force,
            } => self.create_pool(name, devices, chunk_bytes, device_bytes, force)?,
            AdminOp::ListPools => AdminReply::Pools(self.pool_statuses()?),
            AdminOp::ShowPool(name) => AdminReply::Pool(Box::new(self.pool_status(&name)?)),
            AdminOp::AddDevices {
                pool,
                devices,
                device_bytes,
            } => {
                self.add_devices(&pool, devices, device_bytes, plane)?;
                AdminReply::Done
            }
            AdminOp::DeletePool(name) => {
                self.delete_pool(&name)?;
                AdminReply::Done
            }
            AdminOp::ClearPoolFailure(name) => {
                self.clear_pool_failure(&name, plane)?;
                AdminReply::Done
            }
            AdminOp::ClearNamespaceFailure { nqn, nsid } => {
                self.clear_namespace_failure(&nqn, nsid)?;
                AdminReply::Done
            }
            AdminOp::CreateVolume { pool, spec } => {
                self.check_volume_name_free(&spec.name)?;
                self.pool_mut(&pool)?.create_volume(&spec)?;
                log::info!(
                    "volume {} created in pool {pool}: {} bytes{}",
                    spec.name,
                    spec.size_bytes,
                    if spec.thick { ", thick" } else { "" }
                );
                AdminReply::Done
            }
            AdminOp::ListVolumes => AdminReply::Volumes(self.volume_statuses(plane)),
            AdminOp::ShowVolume(name) => {
                let pool = self.pool_of(&name)?;
                AdminReply::Volume(Box::new(self.volume_status(&pool, &name, plane)?))
            }
            AdminOp::DeleteVolume { name, force } => {
                self.delete_volume(&name, force, plane)?;
                AdminReply::Done
            }
            AdminOp::ResizeVolume { name, size_bytes } => {
                let pool = self.pool_of(&name)?;
                self.pool_mut(&pool)?.resize_volume(&name, size_bytes)?;
                log::info!("volume {name} resized to {size_bytes} bytes");
                AdminReply::Done
            }
            AdminOp::CloneVolume {
                volume,
                snapshot,
                name,
            } => {
                self.check_volume_name_free(&name)?;
                let pool = self.pool_of(&volume)?;
                self.pool_mut(&pool)?
                    .clone_volume(&volume, &snapshot, &name)?;
                log::info!("volume {name} cloned from {volume}@{snapshot}");
                AdminReply::Done
            }
            AdminOp::FlattenVolume(name) => {
                self.flatten(&name)?;
                AdminReply::Done
            }
            AdminOp::CreateSnapshot { volume, name } => {
                let pool = self.pool_of(&volume)?;
                self.pool_mut(&pool)?.create_snapshot(&volume, &name)?;
                log::info!("snapshot {volume}@{name} created");
                AdminReply::Done
            }
            AdminOp::DeleteSnapshot { volume, name } => {
                let pool = self.pool_of(&volume)?;
                self.pool_mut(&pool)?.delete_snapshot(&volume, &name)?;
                AdminReply::Done
            }
            AdminOp::ListHosts => AdminReply::Hosts(self.host_statuses()?),
            AdminOp::CreateHost { name, nqn, secrets } => {
                self.create_host(&name, nqn, secrets)?;
                AdminReply::Done
            }
            AdminOp::SetHostSecrets { name, changes } => {
                self.set_host_secrets(&name, changes)?;
                AdminReply::Done
            }
            AdminOp::ShowHost(name) => AdminReply::Host(
                self.host_statuses()?
                    .into_iter()
                    .find(|h| h.name == name)
                    .ok_or_else(|| not_found("host", &name))?,
            ),
            AdminOp::DeleteHost(name) => {
                self.delete_host(&name)?;
                AdminReply::Done
            }
            AdminOp::Attach { volume, host } => {
                self.change_attachment(&volume, &host, true)?;
                AdminReply::Done
            }
            AdminOp::Detach { volume, host } => {
                self.change_attachment(&volume, &host, false)?;
                AdminReply::Done
            }
            AdminOp::SetQos { volume, changes } => {
                let mut record = self.volume_record_checked(&volume)?;
                changes.apply(&mut record.qos);
                self.desired.put_volume(&volume, &record)?;
                if let Some(meter) = self.meters.get(&volume) {
                    meter.set_limits(data_plane_limits(&record.qos));
                }
                log::info!("volume {volume}: limits {:?}", record.qos);
                AdminReply::Done
            }
            AdminOp::Flush => {
                for (name, pool) in &mut self.pools {
                    let result = pool.flush();
                    note_pool_failure(pool, &self.health[name]);
                    result?;
                }
                AdminReply::Done
            }
        };
        if exports_change {
            plane.update_exports(self.exports());
        }
        Ok(reply)
    }

    fn create_pool(
        &mut self,
        name: String,
        devices: Vec<PathBuf>,
        chunk_bytes: u32,
        device_bytes: Option<u64>,
        force: bool,
    ) -> Result<AdminReply, AdminError> {
        weft_volume::check_name("pool", &name)?;
        if self.pools.contains_key(&name) {
            return Err(VolumeError::Exists { kind: "pool", name }.into());
        }
        check_devices_free(&devices, &self.desired.pools()?)?;
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
        let pool = Pool::create(media, options)?;
        let record = PoolRecord {
            devices,
            adding: Vec::new(),
        };
        self.desired.put_pool(&name, &record)?;
        self.health.insert(name.clone(), Arc::default());
        log::info!(
            "pool {name} created: {} in allocation units of {}",
            weft_storage::human_bytes(pool.info().capacity_bytes),
            weft_storage::human_bytes(u64::from(chunk_bytes))
        );
        self.pools.insert(name, pool);
        Ok(AdminReply::Done)
    }

    fn delete_volume(
        &mut self,
        name: &str,
        force: bool,
        plane: &DataPlane,
    ) -> Result<(), AdminError> {
        let pool = self.pool_of(name)?;
        let nqn = volume_nqn(name);
        let hosts = plane.connected_hosts(&nqn);
        if !hosts.is_empty() && !force {
            return Err(AdminError::Busy {
                volume: name.to_string(),
                hosts: hosts.join(", "),
                nqn,
            });
        }
        self.pool_mut(&pool)?.check_deletable(name)?;
        // Forget who may use it, stop serving it (hosts are disconnected),
        // then release its space. A crash in between leaves a volume that no
        // host may use, never a new volume that inherits old permissions.
        self.desired.delete_volume(name)?;
        let mut exports = self.exports_without(name);
        plane.update_exports(exports.clone());
        if let Err(error) = self.pool_mut(&pool)?.delete_volume(name) {
            exports = self.exports();
            plane.update_exports(exports);
            return Err(error.into());
        }
        self.meters.remove(name);
        log::info!("volume {name} deleted");
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
        let mut record = pools
            .get(name)
            .cloned()
            .ok_or_else(|| not_found("pool", name))?;
        check_devices_free(&devices, &pools)?;
        record.adding = devices.clone();
        self.desired.put_pool(name, &record)?;
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
            reconcile_members(&mut self.desired, name, pool)?;
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
        self.desired.delete_pool(name)?;
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
        reconcile_members(&mut self.desired, name, pool)?;
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

    fn exports_without(&mut self, volume: &str) -> Arc<Exports> {
        let exports = self.exports();
        let nqn = volume_nqn(volume);
        let mut config = TargetConfig::clone(&exports.config);
        let mut devices = exports.devices.clone();
        if let Some(index) = config.subsystems.iter().position(|s| s.nqn == nqn) {
            config.subsystems.remove(index);
            devices.remove(index);
        }
        Arc::new(Exports::new(Arc::new(config), devices))
    }

    /// Flattens in steps, serving waiting slow-path I/O between steps (admin
    /// work waits for the flatten to finish).
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
            let mut prepared = Vec::new();
            while let Ok(work) = self.inbox.try_recv() {
                match work {
                    Work::Io(request) => prepared.extend(self.handle_io(request)),
                    admin => self.deferred.push_back(admin),
                }
            }
            self.finish_prepared(&mut prepared);
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
        };
        self.desired.put_host(name, &record)?;
        log::info!("host {name} added");
        Ok(())
    }

    fn set_host_secrets(&mut self, name: &str, changes: SecretChanges) -> Result<(), AdminError> {
        let mut record = self
            .desired
            .hosts()?
            .remove(name)
            .ok_or_else(|| not_found("host", name))?;
        if let Some(host) = changes.host {
            record.dhchap_secret = host;
        }
        if let Some(controller) = changes.controller {
            record.dhchap_ctrl_secret = controller;
        }
        let secrets = HostSecrets {
            host: record.dhchap_secret.clone(),
            controller: record.dhchap_ctrl_secret.clone(),
        };
        check_secrets(name, &secrets)?;
        self.desired.put_host(name, &record)?;
        log::info!("host {name}: DH-HMAC-CHAP secrets changed (used from its next connection)");
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
        self.desired.delete_host(name)?;
        log::info!("host {name} removed");
        Ok(())
    }

    fn change_attachment(
        &mut self,
        volume: &str,
        host: &str,
        attach: bool,
    ) -> Result<(), AdminError> {
        let mut record = self.volume_record_checked(volume)?;
        if !self.desired.hosts()?.contains_key(host) {
            return Err(not_found("host", host));
        }
        let changed = if attach {
            record.hosts.insert(host.to_string())
        } else {
            record.hosts.remove(host)
        };
        if changed {
            self.desired.put_volume(volume, &record)?;
            let verb = if attach {
                "attached to"
            } else {
                "detached from"
            };
            log::info!("volume {volume} {verb} host {host}");
        }
        Ok(())
    }

    /// The record of an existing volume.
    fn volume_record_checked(&self, volume: &str) -> Result<VolumeRecord, AdminError> {
        let pool = self.pool_of(volume)?;
        let id = self.pools[&pool].volume_info(volume)?.id;
        Ok(self.desired.volume(volume, &crate::identity::hex(&id))?)
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

    fn host_statuses(&self) -> Result<Vec<HostStatus>, AdminError> {
        // Only records of live volumes count (see `DesiredState::volume`).
        let records: Vec<(String, VolumeRecord)> = self
            .desired
            .volumes()?
            .into_keys()
            .filter_map(|volume| {
                let record = self.volume_record_checked(&volume).ok()?;
                Some((volume, record))
            })
            .collect();
        let hosts = self.desired.hosts()?;
        Ok(hosts
            .into_iter()
            .map(|(name, host)| HostStatus {
                volumes: records
                    .iter()
                    .filter(|(_, record)| record.hosts.contains(&name))
                    .map(|(volume, _)| volume.clone())
                    .collect(),
                name,
                authentication: match (&host.dhchap_secret, &host.dhchap_ctrl_secret) {
                    (None, _) => Authentication::None,
                    (Some(_), None) => Authentication::Host,
                    (Some(_), Some(_)) => Authentication::Bidirectional,
                },
                nqn: host.nqn,
            })
            .collect())
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

    fn pool_statuses(&self) -> Result<Vec<PoolStatus>, AdminError> {
        Ok(self
            .desired
            .pools()?
            .into_iter()
            .filter_map(|(name, record)| {
                let pool = self.pools.get(&name)?;
                Some(PoolStatus {
                    devices: record.devices,
                    info: pool.info(),
                    members: pool.member_usage().into(),
                    failure: self.pool_failure(&name, pool),
                })
            })
            .collect())
    }

    fn pool_status(&self, name: &str) -> Result<PoolStatus, AdminError> {
        self.pool_statuses()?
            .into_iter()
            .find(|p| p.info.name == name)
            .ok_or_else(|| not_found("pool", name))
    }

    /// Why a pool failed, as the data plane or the pool itself saw it.
    fn pool_failure(&self, name: &str, pool: &Pool<FileMedia>) -> Option<String> {
        let data_plane = self.health.get(name).and_then(|h| h.failure());
        pool.failure()
            .map(str::to_string)
            .or_else(|| data_plane.map(|failure| failure.to_string()))
    }

    fn volume_statuses(&self, plane: &DataPlane) -> Vec<VolumeStatus> {
        self.pools
            .iter()
            .flat_map(|(pool_name, pool)| {
                pool.volumes()
                    .filter_map(|v| self.volume_status(pool_name, &v.name, plane).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn volume_status(
        &self,
        pool: &str,
        name: &str,
        plane: &DataPlane,
    ) -> Result<VolumeStatus, AdminError> {
        let info: VolumeInfo = self
            .pools
            .get(pool)
            .ok_or_else(|| AdminError::Node(format!("pool {pool} vanished")))?
            .volume_info(name)?;
        let nqn = volume_nqn(name);
        let record = self.volume_record(name, &info.id);
        Ok(VolumeStatus {
            failure: self.pool_failure(pool, &self.pools[pool]),
            hosts: record.hosts.into_iter().collect(),
            qos: record.qos,
            pool: pool.to_string(),
            connected_hosts: plane.connected_hosts(&nqn),
            nqn,
            info,
        })
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
    for (pool, record) in pools {
        let taken = record.devices.iter().chain(&record.adding);
        if let Some(path) = taken.into_iter().find(|d| devices.contains(d)) {
            return Err(VolumeError::invalid(
                format!("device {}", path.display()),
                format!("it is already a member of pool {pool}"),
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
    desired: &mut DesiredState,
    name: &str,
    pool: &Pool<FileMedia>,
) -> Result<(), StoreError> {
    let members = usize::from(pool.layout().members);
    let Some(mut record) = desired.pools()?.remove(name) else {
        return Ok(());
    };
    let devices = pool.media().paths()[..members].to_vec();
    if record.devices == devices && record.adding.is_empty() {
        return Ok(());
    }
    for path in record.adding.iter().filter(|p| !devices.contains(p)) {
        log::warn!(
            "pool {name}: device {} was being added but did not join; add it again (weft pool add-device {name} --device {})",
            path.display(),
            path.display()
        );
    }
    record.devices = devices;
    record.adding.clear();
    desired.put_pool(name, &record)
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

/// The export entry of host `name`, with its parsed secrets. A stored secret
/// that no longer parses keeps the host out rather than letting it in unauthenticated.
fn allowed_host(name: &str, host: &HostRecord) -> Option<AllowedHost> {
    let parse = |text: &Option<String>| text.as_deref().map(DhchapSecret::parse).transpose();
    let keys = match (parse(&host.dhchap_secret), parse(&host.dhchap_ctrl_secret)) {
        (Ok(None), _) => None,
        (Ok(Some(secret)), Ok(controller)) => Some(Arc::new(HostKeys {
            host: secret,
            controller,
        })),
        (Err(error), _) | (_, Err(error)) => {
            log::error!("host {name}: stored DH-HMAC-CHAP secret refused ({error}); the host may not connect");
            return None;
        }
    };
    Some(AllowedHost {
        nqn: host.nqn.clone(),
        keys,
    })
}

fn not_found(kind: &'static str, name: &str) -> AdminError {
    VolumeError::NotFound {
        kind,
        name: name.to_string(),
    }
    .into()
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
    use weft_proto::target::{AddressFamily, ListenerConfig};

    /// A manager with no pools whose thread is not running, queue of `queue`.
    fn idle_manager(queue: u32) -> Manager {
        let desired = DesiredState::new(Box::new(weft_control::MemoryStore::default()), "n1");
        let config = TargetConfig {
            subsystems: Vec::new(),
            listeners: vec![ListenerConfig {
                port_id: 1,
                family: AddressFamily::Ipv4,
                address: "127.0.0.1".into(),
                service: "4420".into(),
            }],
            limits: weft_proto::Limits::DEFAULT,
            discovery_serial: "d".into(),
            generation: 1,
        };
        let base = Arc::new(Exports::new(Arc::new(config), Vec::new()));
        Manager::open(desired, NodeId([7; 16]), base, queue).unwrap()
    }

    /// The queue is bounded: when it is full, an admin call is refused as
    /// busy at once instead of waiting (or growing the queue without limit).
    #[test]
    fn a_full_manager_queue_refuses_instead_of_growing() {
        let manager = idle_manager(2);
        let handle = manager.handle();
        let (reply, _answers) = mpsc::channel();
        for _ in 0..2 {
            handle
                .try_send(Work::Admin(AdminOp::ListPools, reply.clone()))
                .unwrap();
        }
        let error = handle.call(AdminOp::ListPools).unwrap_err();
        assert!(
            matches!(error, AdminError::ManagerBusy { queue: 2 }),
            "{error}"
        );
        assert!(error.to_string().contains("retry in a moment"), "{error}");
    }
}
