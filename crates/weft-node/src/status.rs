//! What the node reports about its pools, volumes and hosts: plain domain
//! structs built from the pools (weft-volume), the desired state
//! (weft-control) and the data plane. They carry no wire or API form: the
//! API turns them into its JSON views.
//!
//! Reading them never waits for the volume manager: after every admin
//! operation, and after every batch of slow-path I/O that changed a pool's
//! allocation, the manager publishes an immutable snapshot, which a
//! [`StatusReader`] reads (allocation figures may lag by one batch). What
//! changes without the manager is read live: a failure the data plane saw,
//! the hosts connected, the I/O statistics.
//!
//! Hosts are read from the desired state when asked: which volumes a host
//! is attached to is the cluster's, and a node reconciles only the volume
//! records that concern it (crate::cluster), so a snapshot of its own
//! would lag behind attachments made on other nodes.
//!
//! Each snapshot published bumps a generation that readers may wait on
//! ([`StatusReader::wait_for_change`]): the web dashboard asks for its next
//! view the moment something changed rather than at its next poll.

use crate::manager::{not_found, AdminError};
use crate::metrics::{self, Stats};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
use weft_control::{DesiredState, HostRecord, QosLimits, ReplicationRecord, VolumeRecord};
use weft_target::{DataPlane, Health};
use weft_volume::{MemberUsage, PoolInfo, VolumeInfo};

/// A pool: its capacity and usage, devices and state.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStatus {
    /// Member devices, in stripe order (as the desired state records them).
    pub devices: Vec<PathBuf>,
    /// Capacity and usage.
    pub info: PoolInfo,
    /// Each member's share, in stripe order. While writes allocate, these
    /// figures are refreshed at most once a second (computing them reads
    /// every allocation unit's count); the pool's own figures are not held back.
    pub members: Arc<[MemberUsage]>,
    /// Why it failed (every I/O on its volumes fails until cleared), if it did.
    pub failure: Option<String>,
    /// Every volume created in it is encrypted (its record says).
    pub encrypt: bool,
    /// What its volumes of one copy are compressed with by default (its
    /// record says).
    pub compression: Option<String>,
    /// Its write tier, if it has one.
    pub write_tier: Option<WriteTierStatus>,
}

/// A pool's write tier: its device and how full it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteTierStatus {
    /// Its device (as the pool's record names it).
    pub device: PathBuf,
    /// Its size and use.
    pub info: weft_volume::TierInfo,
}

/// A volume: its pool, shape and usage, who may use it and who does.
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeStatus {
    /// Its pool.
    pub pool: String,
    /// The subsystem NQN it is served as.
    pub nqn: String,
    /// Its namespace UUID.
    pub uuid: [u8; 16],
    /// Its namespace NGUID.
    pub nguid: [u8; 16],
    /// Size, block size, allocation, origin, snapshots.
    pub info: VolumeInfo,
    /// Names of the hosts attached to it.
    pub hosts: Vec<String>,
    /// Its I/O limits.
    pub qos: QosLimits,
    /// NQNs of the hosts connected to it now.
    pub connected_hosts: Vec<String>,
    /// Why its pool failed, if it did.
    pub failure: Option<String>,
    /// A replicated volume's replicas.
    pub replication: Option<ReplicationRecord>,
    /// Its replicas being rebuilt (on its primary's node).
    pub rebuilds: Vec<RebuildStatus>,
}

/// A replica being rebuilt by its primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildStatus {
    /// The replica's node.
    pub replica: String,
    /// Bytes copied.
    pub done_bytes: u64,
    /// Bytes to copy in all.
    pub total_bytes: u64,
    /// Bytes per second since the rebuild began.
    pub rate_bytes_per_s: u64,
    /// Seconds left at that rate (none before anything was copied).
    pub eta_s: Option<u64>,
}

/// A host that may be given volumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostStatus {
    /// Name.
    pub name: String,
    /// NQN.
    pub nqn: String,
    /// How it authenticates (its secrets are never reported).
    pub authentication: Authentication,
    /// The DH group of its DH-HMAC-CHAP exchanges, when not NULL.
    pub dh_group: Option<String>,
    /// Whether it connects only over TLS (its PSK is never reported).
    pub tls: bool,
    /// Names of the volumes attached to it.
    pub volumes: Vec<String>,
}

/// Which DH-HMAC-CHAP secrets a host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authentication {
    /// None: it connects without authenticating.
    None,
    /// Its own: it proves it knows it.
    Host,
    /// Its own and the controller's: each side proves its secret.
    Bidirectional,
}

/// The node's pools, volumes and hosts as the manager last published them.
#[derive(Debug, Default)]
pub(crate) struct NodeSnapshot {
    /// Every open pool, by name.
    pub(crate) pools: BTreeMap<String, Arc<PoolSnapshot>>,
}

/// One pool in a [`NodeSnapshot`].
#[derive(Debug, Clone)]
pub(crate) struct PoolSnapshot {
    /// Its devices as the desired state records them (`None`: it records
    /// no such pool, which is then not listed).
    pub(crate) devices: Option<Vec<PathBuf>>,
    /// Its record says every volume created in it is encrypted.
    pub(crate) encrypt: bool,
    /// Its record's default compression.
    pub(crate) compression: Option<String>,
    pub(crate) info: PoolInfo,
    pub(crate) members: Arc<[MemberUsage]>,
    /// The failure the pool itself noticed (a metadata write or sync).
    pub(crate) failure: Option<String>,
    /// Its write tier, if it has one.
    pub(crate) write_tier: Option<WriteTierStatus>,
    /// Its failure flag, shared with the data plane (read live).
    pub(crate) health: Arc<Health>,
    /// Its volumes, by name.
    pub(crate) volumes: BTreeMap<String, Arc<VolumeSnapshot>>,
}

/// One volume in a [`NodeSnapshot`].
#[derive(Debug)]
pub(crate) struct VolumeSnapshot {
    pub(crate) info: VolumeInfo,
    /// What hosts see it as.
    pub(crate) identity: crate::manager::ServedIdentity,
    /// Names of the hosts attached to it.
    pub(crate) hosts: Vec<String>,
    pub(crate) qos: QosLimits,
    pub(crate) replication: Option<ReplicationRecord>,
}

impl PoolSnapshot {
    /// Why the pool failed, as the pool itself or the data plane saw it.
    fn failure(&self) -> Option<String> {
        self.failure
            .clone()
            .or_else(|| self.health.failure().map(|failure| failure.to_string()))
    }

    fn status(&self, devices: &[PathBuf]) -> PoolStatus {
        PoolStatus {
            devices: devices.to_vec(),
            info: self.info.clone(),
            members: Arc::clone(&self.members),
            failure: self.failure(),
            encrypt: self.encrypt,
            compression: self.compression.clone(),
            write_tier: self.write_tier.clone(),
        }
    }
}

impl NodeSnapshot {
    /// Every pool the desired state records, by name.
    pub(crate) fn pools(&self) -> Vec<PoolStatus> {
        self.pools
            .values()
            .filter_map(|pool| Some(pool.status(pool.devices.as_deref()?)))
            .collect()
    }

    /// Every volume, by pool then name; `connected` names the hosts
    /// connected to a subsystem.
    pub(crate) fn volumes(&self, connected: &dyn Fn(&str) -> Vec<String>) -> Vec<VolumeStatus> {
        self.pools
            .iter()
            .flat_map(|(name, pool)| {
                let failure = pool.failure();
                pool.volumes
                    .values()
                    .map(move |volume| volume_status(name, volume, failure.clone(), connected))
            })
            .collect()
    }

    /// Volume `name`.
    pub(crate) fn volume(
        &self,
        name: &str,
        connected: &dyn Fn(&str) -> Vec<String>,
    ) -> Result<VolumeStatus, AdminError> {
        self.pools
            .iter()
            .find_map(|(pool_name, pool)| {
                let volume = pool.volumes.get(name)?;
                Some(volume_status(pool_name, volume, pool.failure(), connected))
            })
            .ok_or_else(|| not_found("volume", name))
    }
}

fn volume_status(
    pool: &str,
    volume: &VolumeSnapshot,
    failure: Option<String>,
    connected: &dyn Fn(&str) -> Vec<String>,
) -> VolumeStatus {
    let nqn = volume.identity.nqn.clone();
    VolumeStatus {
        uuid: volume.identity.uuid,
        nguid: volume.identity.nguid,
        pool: pool.to_string(),
        connected_hosts: connected(&nqn),
        nqn,
        info: volume.info.clone(),
        hosts: volume.hosts.clone(),
        qos: volume.qos,
        failure,
        replication: volume.replication.clone(),
        rebuilds: Vec::new(),
    }
}

/// Where the manager publishes its snapshots: a reader holds the lock only
/// to clone the current one, so neither side ever waits for the other's work.
#[derive(Debug, Default)]
pub(crate) struct Published {
    current: Mutex<Arc<NodeSnapshot>>,
    /// How many snapshots were published, and a wake-up for those waiting.
    generation: Mutex<u64>,
    changed: Condvar,
    /// Rebuilds in progress, as the replicators publish them.
    pub(crate) rebuilds: crate::replication::progress::Rebuilds,
    /// The node holds key-encryption keys (can hold encrypted volumes).
    pub(crate) keys: std::sync::atomic::AtomicBool,
    /// Every snapshot published, in order: the tests read the order in
    /// which the manager did its work from it.
    #[cfg(test)]
    pub(crate) history: Mutex<Vec<Arc<NodeSnapshot>>>,
}

impl Published {
    /// The latest snapshot.
    pub(crate) fn load(&self) -> Arc<NodeSnapshot> {
        Arc::clone(&self.current.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the snapshot with one that differs in what readers wait
    /// for (volumes, hosts, a pool's state): the generation moves.
    pub(crate) fn store(&self, snapshot: NodeSnapshot) {
        self.replace(snapshot);
        self.note_change();
    }

    /// Moves the generation and wakes those waiting for it.
    fn note_change(&self) {
        *self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        self.changed.notify_all();
    }

    /// Replaces the snapshot with one whose figures only moved (allocation
    /// as writes go on): the generation stays, so that a dashboard waiting
    /// for a change is not woken by every write.
    pub(crate) fn refresh_figures(&self, snapshot: NodeSnapshot) {
        self.replace(snapshot);
    }

    fn replace(&self, snapshot: NodeSnapshot) {
        let snapshot = Arc::new(snapshot);
        #[cfg(test)]
        self.history.lock().unwrap().push(Arc::clone(&snapshot));
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
    }

    /// The generation once it passes `seen`, or as it is after `timeout`.
    fn wait_for_change(&self, seen: u64, timeout: Duration) -> u64 {
        let generation = self
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (generation, _) = self
            .changed
            .wait_timeout_while(generation, timeout, |now| *now == seen)
            .unwrap_or_else(PoisonError::into_inner);
        *generation
    }
}

/// Read-only access to what the node reports: its pools, volumes and hosts
/// (as the manager last published them), its I/O statistics and metrics.
/// Nothing here enters the manager's queues.
#[derive(Debug, Clone)]
pub struct StatusReader {
    published: Arc<Published>,
    plane: Arc<DataPlane>,
    desired: DesiredState,
    /// The clock of the statistics' timestamps.
    started: Instant,
}

impl StatusReader {
    pub(crate) fn new(
        published: Arc<Published>,
        plane: Arc<DataPlane>,
        desired: DesiredState,
    ) -> StatusReader {
        StatusReader {
            published,
            plane,
            desired,
            started: Instant::now(),
        }
    }

    /// Whether the node holds key-encryption keys (encrypted volumes can
    /// be placed on it).
    pub fn holds_keys(&self) -> bool {
        self.published
            .keys
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many snapshots the manager published so far (it moves with every
    /// change of what [`StatusReader::pools`], `volumes` and `hosts` answer).
    pub fn generation(&self) -> u64 {
        *self
            .published
            .generation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits up to `timeout` for the generation to differ from `seen`;
    /// answers the generation then. Holds no lock the manager needs meanwhile.
    pub fn wait_for_change(&self, seen: u64, timeout: Duration) -> u64 {
        self.published.wait_for_change(seen, timeout)
    }

    /// Every pool, by name.
    pub fn pools(&self) -> Vec<PoolStatus> {
        self.published.load().pools()
    }

    /// Pool `name`.
    pub fn pool(&self, name: &str) -> Result<PoolStatus, AdminError> {
        let snapshot = self.published.load();
        snapshot
            .pools
            .get(name)
            .and_then(|pool| Some(pool.status(pool.devices.as_deref()?)))
            .ok_or_else(|| not_found("pool", name))
    }

    /// Every volume, by pool then name.
    pub fn volumes(&self) -> Vec<VolumeStatus> {
        let mut volumes = self
            .published
            .load()
            .volumes(&|nqn| self.plane.connected_hosts(nqn));
        for volume in &mut volumes {
            volume.rebuilds = self.published.rebuilds.of(&volume.info.name);
        }
        volumes
    }

    /// Volume `name`.
    pub fn volume(&self, name: &str) -> Result<VolumeStatus, AdminError> {
        let mut volume = self
            .published
            .load()
            .volume(name, &|nqn| self.plane.connected_hosts(nqn))?;
        volume.rebuilds = self.published.rebuilds.of(name);
        Ok(volume)
    }

    /// Every host, by name, from the desired state.
    pub fn hosts(&self) -> Result<Vec<HostStatus>, AdminError> {
        hosts_of(&self.desired)
    }

    /// Host `name`.
    pub fn host(&self, name: &str) -> Result<HostStatus, AdminError> {
        self.hosts()?
            .into_iter()
            .find(|host| host.name == name)
            .ok_or_else(|| not_found("host", name))
    }

    /// Whether one of the node's pools holds a copy of volume `name`.
    pub(crate) fn holds(&self, name: &str) -> bool {
        let snapshot = self.published.load();
        snapshot
            .pools
            .values()
            .any(|pool| pool.volumes.contains_key(name))
    }

    /// Moves the generation without a new snapshot: what
    /// [`StatusReader::hosts`] answers changed in the desired state.
    pub(crate) fn note_desired_change(&self) {
        self.published.note_change();
    }

    /// Every namespace's I/O statistics now.
    pub fn stats(&self) -> Stats {
        metrics::collect(&self.plane, &self.started)
    }

    /// The Prometheus exposition of the statistics, the pools, the rebuilds
    /// and the members of replicated volumes.
    pub fn prometheus(&self) -> String {
        let mut text = metrics::prometheus(&self.stats(), &self.pools());
        metrics::rebuilds(&mut text, &self.published.rebuilds.all());
        metrics::volume_members(&mut text, &self.volumes());
        text
    }
}

/// Every host's status in `desired`, by name.
pub(crate) fn hosts_of(desired: &DesiredState) -> Result<Vec<HostStatus>, AdminError> {
    Ok(host_statuses(desired.hosts()?, &desired.volumes()?))
}

/// Each host's status, with the volumes it is attached to: one pass over the
/// volume records (a pass per host made a status of 1,000 hosts and 10,000
/// volumes ten million comparisons, at every change, on every node).
fn host_statuses(
    hosts: BTreeMap<String, HostRecord>,
    records: &BTreeMap<String, VolumeRecord>,
) -> Vec<HostStatus> {
    let mut attached: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (volume, record) in records {
        for host in &record.hosts {
            attached.entry(host).or_default().push(volume.clone());
        }
    }
    hosts
        .into_iter()
        .map(|(name, host)| HostStatus {
            volumes: attached.remove(name.as_str()).unwrap_or_default(),
            name,
            authentication: match (&host.dhchap_secret, &host.dhchap_ctrl_secret) {
                (None, _) => Authentication::None,
                (Some(_), None) => Authentication::Host,
                (Some(_), Some(_)) => Authentication::Bidirectional,
            },
            tls: host.tls_psk.is_some(),
            dh_group: host.dhchap_group.filter(|_| host.dhchap_secret.is_some()),
            nqn: host.nqn,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_lists_the_volumes_it_is_attached_to_in_name_order() {
        let host = |nqn: &str| HostRecord {
            nqn: nqn.into(),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls_psk: None,
            dhchap_group: None,
        };
        let hosts: BTreeMap<String, HostRecord> = ["a", "b", "c"]
            .into_iter()
            .map(|name| {
                (
                    name.to_string(),
                    host(&format!("nqn.2014-08.org.example:{name}")),
                )
            })
            .collect();
        let volume = |hosts: &[&str]| VolumeRecord {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..VolumeRecord::default()
        };
        let records: BTreeMap<String, VolumeRecord> = [
            ("v2", volume(&["b"])),
            ("v1", volume(&["a", "b"])),
            ("v3", volume(&[])),
            ("v4", volume(&["gone"])),
        ]
        .into_iter()
        .map(|(name, record)| (name.to_string(), record))
        .collect();
        let statuses = host_statuses(hosts, &records);
        let listed: Vec<(&str, Vec<&str>)> = statuses
            .iter()
            .map(|s| {
                (
                    s.name.as_str(),
                    s.volumes.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            [("a", vec!["v1"]), ("b", vec!["v1", "v2"]), ("c", vec![])]
        );
    }

    #[test]
    fn a_reader_waiting_for_a_change_wakes_when_a_snapshot_is_published() {
        let published = Arc::new(Published::default());
        assert_eq!(published.wait_for_change(0, Duration::from_millis(10)), 0);
        let publisher = Arc::clone(&published);
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            let seen = published.wait_for_change(0, Duration::from_secs(30));
            (seen, started.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        publisher.store(NodeSnapshot::default());
        let (seen, waited) = waiter.join().unwrap();
        assert_eq!(seen, 1);
        assert!(
            waited < Duration::from_secs(10),
            "woken by the change, not the timeout"
        );
        // A generation already past the one seen answers at once.
        assert_eq!(publisher.wait_for_change(0, Duration::from_secs(30)), 1);
        // Figures that only moved wake nobody.
        publisher.refresh_figures(NodeSnapshot::default());
        assert_eq!(publisher.wait_for_change(1, Duration::from_millis(10)), 1);
    }
}
