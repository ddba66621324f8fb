//! The records of the desired state and their keys. [`DesiredState`] reads
//! and writes them through a [`Store`]; each operator action is one commit.
//!
//! - `nodes/<node>/pools/<name>`: a pool's member devices (node-local).
//! - `hosts/<name>`: a host's NQN (and, later, its authentication secret).
//! - `volumes/<name>`: which hosts may use the volume and its QoS limits,
//!   tagged with the volume's id so that a record left by a deleted volume
//!   never applies to a new one of the same name; for a replicated volume,
//!   its replicas ([`ReplicationRecord`]).
//! - `reservations/<name>`: a volume's NVMe reservations
//!   ([`ReservationRecord`]), tagged with its id like its record.
//! - `identities/nqn/<nqn>` and `identities/id/<32 hex>`: the identities
//!   volumes chose at creation (an NQN; a UUID or NGUID), each holding the
//!   volume's name, created in the same transaction as the volume's record:
//!   of two volumes choosing one identity at once, one is created.

use crate::store::{Condition, Revision, Store, StoreError, Txn};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Longest NQN (NVMe Base 2.0, section 4.5: 223 bytes).
pub const NQN_BYTES_MAX: usize = 223;

/// A pool: its member devices, in stripe order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    /// Member devices.
    pub devices: Vec<PathBuf>,
    /// Devices being added (recorded before the pool's growth commits): at
    /// the next open they are members if the pool's superblocks say so.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding: Vec<PathBuf>,
    /// Every volume created in it is encrypted at rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypt: bool,
    /// Volumes of one copy created in it are compressed with this ("lz4"
    /// or "zstd") unless they ask otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<String>,
    /// The device of its write tier (recorded before the pool's
    /// superblocks name it: at the next open it is the tier if they do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_tier: Option<PathBuf>,
}

/// A host that may be given volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// Its NVMe Qualified Name (what `nvme connect --hostnqn` sends).
    pub nqn: String,
    /// Its DH-HMAC-CHAP secret (`DHHC-1:..`): when set, each of its queues
    /// must authenticate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_secret: Option<String>,
    /// The controller's secret, for a host that authenticates the controller too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret: Option<String>,
    /// Its NVMe/TCP TLS PSK (`NVMeTLSkey-1:..`): when set, it connects only
    /// over TLS with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_psk: Option<String>,
    /// The Diffie-Hellman group its DH-HMAC-CHAP exchanges use
    /// (`ffdhe2048`..`ffdhe8192`; none: the NULL group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_group: Option<String>,
}

/// Per-volume I/O limits; `None` is unlimited. Totals count reads and
/// writes together; the read and write limits count one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosLimits {
    /// I/O commands per second.
    pub iops_max: Option<u64>,
    /// Bytes per second.
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

impl QosLimits {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        *self != QosLimits::default()
    }
}

/// What the store keeps about one volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// The volume's id (hex), so that the record dies with its volume.
    pub id: String,
    /// Names of the hosts attached to it.
    pub hosts: BTreeSet<String>,
    /// Its limits.
    pub qos: QosLimits,
    /// In a cluster: the node that holds it (its name claimed for that node
    /// before the volume is created, so that two nodes cannot both create it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// In a cluster: its pool on that node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Its subsystem NQN when one was chosen at creation (else
    /// `nqn.2026-11.io.weft:vol:<name>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nqn: Option<String>,
    /// Its namespace UUID (32 hex digits) when one was chosen (else its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its namespace NGUID (32 hex digits) when one was chosen (else its id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    /// A replicated volume's replicas. Its `node` and `pool` are the
    /// primary's; its identity (`uuid`, `nguid`) is always recorded, since
    /// every replica serves the same one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationRecord>,
}

/// A volume's NVMe reservations (`reservations/<volume>`), written by the
/// node serving the volume before a reservation command completes, and read
/// by whichever node serves it next.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationRecord {
    /// The volume's id (hex): a record left by a deleted volume never
    /// applies to a new one of the same name.
    pub id: String,
    /// The reservation generation (PRGEN).
    pub generation: u32,
    /// Registered hosts in registration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub registrants: Vec<RegistrantRecord>,
    /// The reservation held, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<HeldReservation>,
}

/// A registered host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistrantRecord {
    /// Its Host Identifier (32 hex digits).
    pub host_id: String,
    /// Its reservation key.
    pub key: u64,
}

/// A reservation held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldReservation {
    /// The Host Identifier (32 hex digits) of the host that acquired it.
    pub holder: String,
    /// Its type (1 to 6, as NVMe numbers them).
    pub kind: u8,
}

/// Where a replicated volume lives and which replica serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationRecord {
    /// The primary's term: every promotion bumps it (compare-and-swap).
    pub epoch: u64,
    /// The node whose replica serves hosts.
    pub primary: String,
    /// Every replica, the primary's included.
    pub members: Vec<ReplicaRecord>,
    /// Size of every replica, bytes.
    pub size_bytes: u64,
    /// Logical block size of every replica.
    pub block_size: u32,
    /// Whether every replica is thick (its space allocated at creation).
    #[serde(default)]
    pub thick: bool,
    /// Whether every replica (or member's shard) is encrypted at rest,
    /// each with a data key of its own node's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// A planned move: the primary hands its role to this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_to: Option<String>,
    /// The primary of the epoch before (it holds every write acknowledged
    /// until then; a node promoted while it was down may give the role back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Replicas being removed: the primary takes each out of the in-sync
    /// set (flushing first if it is left the only copy in sync), then it
    /// leaves the record (`weft_replication::ReplicaSet::retire`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retire: Vec<String>,
    /// Its snapshots, each taken by the primary on its own copy and every
    /// in-sync replica at one point of the write stream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<ReplicatedSnapshot>,
    /// An erasure-coded volume's stripe: its members hold one shard each of
    /// every stripe, in the order of `members`, instead of a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasure: Option<ErasureRecord>,
    /// An erasure-coded clone's source: each member in sync at its
    /// creation makes its shard from its own shard of this snapshot (the
    /// others start empty, faulted, and are rebuilt from them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloned_from: Option<SnapshotSource>,
}

/// A volume's snapshot, named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSource {
    /// The volume.
    pub volume: String,
    /// Its snapshot.
    pub snapshot: String,
}

/// How an erasure-coded volume is cut into its members' shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErasureRecord {
    /// Data shards per stripe (`k`).
    pub data_shards: u32,
    /// Parity shards per stripe (`m`).
    pub parity_shards: u32,
    /// A chunk's bytes (one member's part of a stripe).
    pub chunk_bytes: u32,
    /// Journal slots at the start of each member's shard volume.
    pub journal_slots: u32,
}

/// A snapshot of a replicated volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicatedSnapshot {
    /// Its name.
    pub name: String,
    /// The nodes whose copies hold it (empty while it is being taken). A
    /// node's copy made again later (a replica added back) holds none, and
    /// the node leaves every list when it is added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Being taken: the primary quiesces the volume's writes and asks every
    /// copy in sync. One left so by a failure can be deleted, or taken again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub taking: bool,
}

impl VolumeRecord {
    /// The keys claiming the identity this record chose (none for what
    /// derives from its id).
    pub fn identity_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .nqn
            .iter()
            .map(|nqn| format!("{IDENTITIES_PREFIX}nqn/{nqn}"))
            .collect();
        for id in [&self.uuid, &self.nguid].into_iter().flatten() {
            let key = format!("{IDENTITIES_PREFIX}id/{}", id.to_ascii_lowercase());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }
}

impl ReplicationRecord {
    /// The replica on `node`, if it holds one.
    pub fn member(&self, node: &str) -> Option<&ReplicaRecord> {
        self.members.iter().find(|m| m.node == node)
    }

    /// The snapshot called `name`, if any.
    pub fn snapshot(&self, name: &str) -> Option<&ReplicatedSnapshot> {
        self.snapshots.iter().find(|s| s.name == name)
    }

    /// The nodes whose copies hold `snapshot`: those it names that are
    /// members still (a member that left took its copy with it).
    pub fn holders(&self, snapshot: &ReplicatedSnapshot) -> Vec<String> {
        snapshot
            .nodes
            .iter()
            .filter(|node| self.member(node).is_some())
            .cloned()
            .collect()
    }

    /// Whether `node` holds a replica another node serves.
    pub fn is_secondary(&self, node: &str) -> bool {
        self.primary != node && self.member(node).is_some()
    }
}

/// One replica of a replicated volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// The node that holds it.
    pub node: String,
    /// Its pool there.
    pub pool: String,
    /// Its standing.
    pub state: ReplicaState,
}

/// A replica's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaState {
    /// Holds every acknowledged write.
    InSync,
    /// Out of the in-sync set since epoch `epoch`: to be rebuilt.
    Faulted {
        /// The epoch it was faulted under.
        epoch: u64,
    },
}

/// Checks that `nqn` is a name hosts can use as an NQN: what Linux's nvmet
/// accepts (1 to 223 bytes, printable ASCII without spaces or '/'), so that a
/// subsystem or host moved from nvmet keeps its name (blktests' are
/// `blktests-subsystem-1`). [`nqn_form_note`] says when it is not in the
/// specification's form.
pub fn check_nqn(nqn: &str) -> Result<(), String> {
    if nqn.is_empty() {
        return Err("the NQN is empty (a Linux host's is in /etc/nvme/hostnqn)".to_string());
    }
    if nqn.len() > NQN_BYTES_MAX {
        return Err(format!(
            "the NQN is {} bytes long; at most {NQN_BYTES_MAX} are allowed",
            nqn.len()
        ));
    }
    // Linux nvmet's subsystems are configfs directories: no '/' either.
    match nqn.chars().find(|&c| !c.is_ascii_graphic() || c == '/') {
        Some(c) => Err(format!("{c:?} is not allowed in an NQN")),
        None => Ok(()),
    }
}

/// A note for an NQN that [`check_nqn`] accepts but that is not in the form
/// NVMe Base 2.0 section 4.5 ("NVMe Qualified Names") gives
/// (`nqn.YYYY-MM.reverse.domain`, optionally `:name`); None when it is.
pub fn nqn_form_note(nqn: &str) -> Option<String> {
    let in_form = nqn.strip_prefix("nqn.").is_some_and(|rest| {
        let bytes = rest.as_bytes();
        let date = bytes.len() > 8
            && bytes[..4].iter().all(u8::is_ascii_digit)
            && bytes[4] == b'-'
            && bytes[5..7].iter().all(u8::is_ascii_digit)
            && bytes[7] == b'.';
        let domain = rest
            .get(8..)
            .map_or("", |r| r.split(':').next().unwrap_or(""));
        date && !domain.is_empty()
    });
    (!in_form).then(|| {
        format!(
            "note: {nqn:?} is not in the NVMe specification's NQN form (nqn.YYYY-MM.reverse.domain:name); accepted as Linux nvmet accepts it, and Linux hosts use it, but other hosts may refuse it"
        )
    })
}

/// A record with the revision that last wrote it: an update made from it
/// fails with [`StoreError::Conflict`] if the record changed since.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The record.
    pub record: T,
    /// The revision that last wrote it.
    pub revision: Revision,
}

/// Typed access to the records of one node (a clone shares the store).
#[derive(Clone)]
pub struct DesiredState {
    store: Arc<dyn Store>,
    node: String,
    /// Volume and host records as last decoded: a reconcile reads every
    /// one, and copying and decoding the unchanged ones again made its
    /// cost grow with the volumes.
    volumes_decoded: Arc<Decoded<VolumeRecord>>,
    hosts_decoded: Arc<Decoded<HostRecord>>,
}

/// Records of one prefix as last decoded, with the revision each was read at.
#[derive(Debug)]
struct Decoded<T>(Mutex<HashMap<String, (Revision, T)>>);

impl<T> Default for Decoded<T> {
    fn default() -> Decoded<T> {
        Decoded(Mutex::default())
    }
}

impl<T: DeserializeOwned + Clone> Decoded<T> {
    /// Every record under `prefix` in `store`, by the rest of its key;
    /// only those whose revision changed since the last call are decoded.
    fn list(&self, store: &dyn Store, prefix: &str) -> Result<BTreeMap<String, T>, StoreError> {
        let mut decoded = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut records = BTreeMap::new();
        let mut corrupt = None;
        store.visit(prefix, &mut |entry| {
            let name = &entry.key[prefix.len()..];
            let record = match decoded.get(name) {
                Some((revision, record)) if *revision == entry.revision => record.clone(),
                _ => match T::deserialize(&entry.value) {
                    Ok(record) => {
                        decoded.insert(name.to_string(), (entry.revision, record.clone()));
                        record
                    }
                    Err(error) => {
                        corrupt.get_or_insert(StoreError::Corrupt {
                            location: format!("key {}", entry.key),
                            message: error.to_string(),
                        });
                        return;
                    }
                },
            };
            records.insert(name.to_string(), record);
        })?;
        if let Some(error) = corrupt {
            return Err(error);
        }
        decoded.retain(|name, _| records.contains_key(name));
        Ok(records)
    }
}

impl std::fmt::Debug for DesiredState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DesiredState")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl DesiredState {
    /// Records of node `node` in `store`.
    pub fn new(store: Box<dyn Store>, node: &str) -> DesiredState {
        DesiredState::shared(Arc::from(store), node)
    }

    /// Records of node `node` in `store`, which other parts of the node use too.
    pub fn shared(store: Arc<dyn Store>, node: &str) -> DesiredState {
        DesiredState {
            store,
            node: node.to_string(),
            volumes_decoded: Arc::default(),
            hosts_decoded: Arc::default(),
        }
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The record at `key` with its revision.
    pub fn read<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Versioned<T>>, StoreError> {
        read(self.store.as_ref(), key)
    }

    /// Records `record` at `key` if no record is there; [`StoreError::Conflict`]
    /// if one is (someone created it first).
    pub fn create<T: Serialize>(&self, key: &str, record: &T) -> Result<Revision, StoreError> {
        self.store.commit(Txn::new().create(key, encode(record)))
    }

    /// Replaces the record at `key` if it is still at `revision`;
    /// [`StoreError::Conflict`] if it changed or went away since.
    pub fn update<T: Serialize>(
        &self,
        key: &str,
        record: &T,
        revision: Revision,
    ) -> Result<Revision, StoreError> {
        self.store
            .commit(Txn::new().update(key, encode(record), revision))
    }

    /// Removes the record at `key` if it is still at `revision`.
    pub fn remove(&self, key: &str, revision: Revision) -> Result<Revision, StoreError> {
        self.store.commit(Txn::new().remove(key, revision))
    }

    /// Makes the record at `key` what `change` makes of it as read (none:
    /// absent; returning none removes it), by compare-and-swap: when someone
    /// else wrote the record between the read and the commit, it is read
    /// again and `change` runs again on what they wrote, so that a change
    /// made from a stale copy never undoes theirs (a lost update). Nothing
    /// is written when `change` returns the record as read. The record as
    /// it now stands.
    pub fn change<T>(
        &self,
        key: &str,
        mut change: impl FnMut(Option<T>) -> Option<T>,
    ) -> Result<Option<T>, StoreError>
    where
        T: Serialize + DeserializeOwned + PartialEq + Clone,
    {
        let mut wanted = None;
        self.until_committed(key, || {
            let found = self.read::<T>(key)?;
            let current = found.as_ref().map(|found| found.record.clone());
            wanted = change(current.clone());
            Ok(match (found, &wanted) {
                _ if wanted == current => None,
                (None, Some(record)) => Some(Txn::new().create(key, encode(record))),
                (Some(found), Some(record)) => {
                    Some(Txn::new().update(key, encode(record), found.revision))
                }
                (Some(found), None) => Some(Txn::new().remove(key, found.revision)),
                (None, None) => unreachable!("equal, nothing to do"),
            })
        })?;
        Ok(wanted)
    }

    /// Commits what `attempt` makes from fresh reads (none: nothing to
    /// do), again from new reads after each conflict: another writer got
    /// there first. [`StoreError::Conflict`] on `key` after
    /// [`CHANGE_ATTEMPTS`] conflicts in a row.
    fn until_committed(
        &self,
        key: &str,
        mut attempt: impl FnMut() -> Result<Option<Txn>, StoreError>,
    ) -> Result<(), StoreError> {
        for _ in 0..CHANGE_ATTEMPTS {
            let Some(txn) = attempt()? else {
                return Ok(());
            };
            match self.store.commit(txn) {
                Ok(_) => return Ok(()),
                Err(StoreError::Conflict { .. }) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(StoreError::Conflict {
            key: key.to_string(),
        })
    }

    /// This node's pools, by name.
    pub fn pools(&self) -> Result<BTreeMap<String, PoolRecord>, StoreError> {
        self.list(&self.pool_prefix())
    }

    /// Changes the record of pool `name` (see [`DesiredState::change`]).
    pub fn change_pool(
        &self,
        name: &str,
        change: impl FnMut(Option<PoolRecord>) -> Option<PoolRecord>,
    ) -> Result<Option<PoolRecord>, StoreError> {
        self.change(&format!("{}{name}", self.pool_prefix()), change)
    }

    /// Every host, by name.
    pub fn hosts(&self) -> Result<BTreeMap<String, HostRecord>, StoreError> {
        self.hosts_decoded.list(self.store.as_ref(), HOSTS_PREFIX)
    }

    /// Changes the record of host `name` (see [`DesiredState::change`]).
    pub fn change_host(
        &self,
        name: &str,
        change: impl FnMut(Option<HostRecord>) -> Option<HostRecord>,
    ) -> Result<Option<HostRecord>, StoreError> {
        self.change(&host_key(name), change)
    }

    /// Every volume record, by volume name.
    pub fn volumes(&self) -> Result<BTreeMap<String, VolumeRecord>, StoreError> {
        self.volumes_decoded
            .list(self.store.as_ref(), VOLUMES_PREFIX)
    }

    /// The record of volume `name` whose id is `id`: a record of another
    /// (deleted) volume of that name does not count.
    pub fn volume(&self, name: &str, id: &str) -> Result<VolumeRecord, StoreError> {
        let record: Option<VolumeRecord> = self.get(&volume_key(name))?;
        Ok(self.own_record(record, id))
    }

    /// Changes the record of volume `name` whose id is `id` as `change`
    /// says, by compare-and-swap (see [`DesiredState::change`]): `change`
    /// sees the record as it is in the store, with what other writers
    /// (the replicator, the controller, another node's API) put there.
    /// The record as written.
    pub fn change_volume(
        &self,
        name: &str,
        id: &str,
        mut change: impl FnMut(&mut VolumeRecord),
    ) -> Result<VolumeRecord, StoreError> {
        let changed = self.change(&volume_key(name), |found| {
            let mut record = self.own_record(found, id);
            change(&mut record);
            Some(record)
        })?;
        Ok(changed.expect("a record is always written"))
    }

    /// Records `claim` at `volumes/<name>` (created, or replacing the
    /// record at `over`) with the claims of the identity it chose, in one
    /// transaction; [`StoreError::Conflict`] names the key that was taken
    /// (the volume's, or an identity's: [`DesiredState::identity_owner`]
    /// tells whose). A claim whose volume has no record any more (deleted
    /// by a node of an earlier version, which leaves claims behind) is
    /// taken over, on the condition that the record is still absent.
    pub fn claim_volume(
        &self,
        name: &str,
        claim: &VolumeRecord,
        over: Option<Revision>,
    ) -> Result<Revision, StoreError> {
        let (key, value) = (volume_key(name), encode(claim));
        let mut txn = match over {
            None => Txn::new().create(key, value),
            Some(revision) => Txn::new().update(key, value, revision),
        };
        for identity in claim.identity_keys() {
            txn = match self.store.get(&identity)? {
                None => txn.create(identity, name.into()),
                Some(entry) if entry.value == name => {
                    txn.require(Condition::At(identity, entry.revision))
                }
                Some(entry) => {
                    let owner = volume_key(entry.value.as_str().unwrap_or_default());
                    if self.store.get(&owner)?.is_some() {
                        return Err(StoreError::Conflict { key: identity });
                    }
                    txn.update(identity, name.into(), entry.revision)
                        .require(Condition::Absent(owner))
                }
            };
        }
        self.store.commit(txn)
    }

    /// The volume that claimed identity key `key`, if one did.
    pub fn identity_owner(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .store
            .get(key)?
            .and_then(|e| e.value.as_str().map(str::to_string)))
    }

    /// Forgets volume `name`'s record, if still at `revision`, with the
    /// identities it claimed.
    pub fn unclaim_volume(&self, name: &str, revision: Revision) -> Result<Revision, StoreError> {
        let mut txn = Txn::new().remove(volume_key(name), revision);
        for entry in self.claimed_identities(name)? {
            txn = txn.remove(entry.key, entry.revision);
        }
        self.store.commit(txn)
    }

    /// Forgets volume `name`, its reservations and the identities it
    /// claimed, as they stand.
    pub fn delete_volume(&self, name: &str) -> Result<(), StoreError> {
        let keys = [volume_key(name), reservation_key(name)];
        self.until_committed(&keys[0], || {
            let mut txn = Txn::new();
            for key in &keys {
                if let Some(entry) = self.store.get(key)? {
                    txn = txn.remove(key.as_str(), entry.revision);
                }
            }
            for entry in self.claimed_identities(name)? {
                txn = txn.remove(entry.key, entry.revision);
            }
            Ok((!txn.changes().is_empty()).then_some(txn))
        })
    }

    /// The identity claims of volume `name`.
    fn claimed_identities(&self, name: &str) -> Result<Vec<crate::Entry>, StoreError> {
        let listing = self.store.list(IDENTITIES_PREFIX)?;
        Ok(listing
            .entries
            .into_iter()
            .filter(|entry| entry.value == name)
            .collect())
    }

    /// `found` if it is the record of the volume whose id is `id`, else a
    /// new record of that volume. A replica's local id is not the record's
    /// (the primary's): the record applies to it while it names this node
    /// among the replicas.
    fn own_record(&self, found: Option<VolumeRecord>, id: &str) -> VolumeRecord {
        let holds_replica = |r: &VolumeRecord| {
            r.replication
                .as_ref()
                .is_some_and(|replication| replication.member(&self.node).is_some())
        };
        found
            .filter(|r| r.id == id || holds_replica(r))
            .unwrap_or_else(|| VolumeRecord {
                id: id.to_string(),
                ..VolumeRecord::default()
            })
    }

    fn pool_prefix(&self) -> String {
        format!("nodes/{}/pools/", self.node)
    }

    fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StoreError> {
        Ok(self.read(key)?.map(|versioned| versioned.record))
    }

    fn list<T: DeserializeOwned>(&self, prefix: &str) -> Result<BTreeMap<String, T>, StoreError> {
        self.store
            .list(prefix)?
            .entries
            .into_iter()
            .map(|entry| {
                let record = decode(&entry.key, entry.value)?;
                Ok((entry.key[prefix.len()..].to_string(), record))
            })
            .collect()
    }
}

/// How often a compare-and-swap change is tried before it gives up with
/// [`StoreError::Conflict`]: each failure means another writer's change
/// landed, so this many in a row means the record is fought over.
const CHANGE_ATTEMPTS: usize = 32;

/// Prefix of the host records.
pub const HOSTS_PREFIX: &str = "hosts/";

/// Prefix of the volume records.
pub const VOLUMES_PREFIX: &str = "volumes/";

/// Prefix of the claims of identities volumes chose.
pub const IDENTITIES_PREFIX: &str = "identities/";

/// Where host `name` is recorded.
pub fn host_key(name: &str) -> String {
    format!("{HOSTS_PREFIX}{name}")
}

/// Where volume `name` is recorded.
pub fn volume_key(name: &str) -> String {
    format!("{VOLUMES_PREFIX}{name}")
}

/// Where volume `name`'s reservations are recorded.
pub fn reservation_key(name: &str) -> String {
    format!("reservations/{name}")
}

/// The record at `key` in `store`, with its revision.
pub fn read<T: DeserializeOwned>(
    store: &dyn Store,
    key: &str,
) -> Result<Option<Versioned<T>>, StoreError> {
    store
        .get(key)?
        .map(|entry| {
            Ok(Versioned {
                record: decode(key, entry.value)?,
                revision: entry.revision,
            })
        })
        .transpose()
}

/// A record as the store keeps it.
pub fn encode<T: Serialize>(record: &T) -> serde_json::Value {
    serde_json::to_value(record).expect("records serialise")
}

/// The record `value` read at `key`.
pub fn decode<T: DeserializeOwned>(key: &str, value: serde_json::Value) -> Result<T, StoreError> {
    serde_json::from_value(value).map_err(|error| StoreError::Corrupt {
        location: format!("key {key}"),
        message: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::{Call, Hook, Intercepted};
    use crate::MemoryStore;

    /// Volume records are decoded once per revision, and a listing shows
    /// every change, a deletion and a record made anew with the same name.
    #[test]
    fn listed_records_are_decoded_again_only_when_they_changed() {
        let store = Arc::new(MemoryStore::default());
        let state = DesiredState::shared(store.clone(), "n1");
        let attach = |host: &'static str| {
            move |record: &mut VolumeRecord| {
                record.hosts.insert(host.to_string());
            }
        };
        state.change_volume("db1", "aa", attach("web1")).unwrap();
        state.change_volume("db2", "bb", attach("web2")).unwrap();
        assert_eq!(state.volumes().unwrap()["db1"].hosts.len(), 1);
        let clone = state.clone();
        clone.change_volume("db1", "aa", attach("web3")).unwrap();
        let listed = state.volumes().unwrap();
        assert_eq!(
            listed["db1"].hosts.len(),
            2,
            "a change through a clone is seen"
        );
        assert_eq!(listed["db2"].hosts.len(), 1);
        let db2 = store.get("volumes/db2").unwrap().unwrap();
        store
            .commit(Txn::new().remove("volumes/db2", db2.revision))
            .unwrap();
        assert!(!state.volumes().unwrap().contains_key("db2"), "deleted");
        state.change_volume("db2", "cc", |_| {}).unwrap();
        assert_eq!(state.volumes().unwrap()["db2"].id, "cc", "made anew");
        assert_eq!(state.volumes_decoded.0.lock().unwrap().len(), 2);
        store
            .commit(Txn::new().create("volumes/bad", serde_json::json!({"id": 7})))
            .unwrap();
        assert!(matches!(
            state.volumes(),
            Err(StoreError::Corrupt { location, .. }) if location == "key volumes/bad"
        ));
    }

    #[test]
    fn records_round_trip_by_name() {
        let state = DesiredState::new(Box::new(MemoryStore::default()), "n1");
        let pool = PoolRecord {
            devices: vec!["/dev/nvme0n1".into()],
            adding: Vec::new(),
            encrypt: false,
            compression: None,
            write_tier: None,
        };
        state.change_pool("fast", |_| Some(pool.clone())).unwrap();
        let host = HostRecord {
            nqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            dhchap_group: None,
            tls_psk: None,
        };
        state.change_host("web1", |_| Some(host.clone())).unwrap();
        assert_eq!(state.pools().unwrap()["fast"], pool);
        assert_eq!(state.hosts().unwrap().len(), 1);
        state.change_host("web1", |_| None).unwrap();
        assert!(state.hosts().unwrap().is_empty());
        assert!(state.volume("db1", "aa").unwrap().hosts.is_empty());
        let record = state
            .change_volume("db1", "aa", |record| {
                record.hosts.insert("web1".into());
                record.qos.iops_max = Some(20_000);
            })
            .unwrap();
        assert_eq!(state.volume("db1", "aa").unwrap(), record);
        assert_eq!(
            state.volume("db1", "bb").unwrap(),
            VolumeRecord {
                id: "bb".into(),
                ..VolumeRecord::default()
            },
            "a new volume of the same name starts clean"
        );
        state.delete_volume("db1").unwrap();
        assert!(state.volumes().unwrap().is_empty());
    }

    /// Just before the first commit it sees, another writer commits: the
    /// race of a read-modify-write against a concurrent change, made to
    /// happen every time.
    struct Meanwhile(std::sync::Mutex<Option<OtherWriter>>);

    /// What another writer does, given the store.
    type OtherWriter = Box<dyn FnOnce(Arc<dyn Store>) + Send>;

    impl Hook for Meanwhile {
        fn before(&self, call: Call, inner: &Arc<dyn Store>) -> Result<(), StoreError> {
            if call == Call::Commit {
                if let Some(other) = self.0.lock().unwrap().take() {
                    other(Arc::clone(inner));
                }
            }
            Ok(())
        }
    }

    /// An identity is claimed with the volume's record, refused to a second
    /// volume while the first has it, given back with it, and taken over
    /// from a volume whose record is gone without it.
    #[test]
    fn identities_are_claimed_with_the_record_and_given_back_with_it() {
        let state = DesiredState::new(Box::new(MemoryStore::default()), "n1");
        let chosen = VolumeRecord {
            nqn: Some("nqn.2014-08.com.example:a".into()),
            uuid: Some("AB".repeat(16)),
            nguid: Some("ab".repeat(16)),
            ..VolumeRecord::default()
        };
        assert_eq!(chosen.identity_keys().len(), 2, "one key per identity");
        let claimed = state.claim_volume("a", &chosen, None).unwrap();
        let key = chosen.identity_keys()[0].clone();
        assert_eq!(
            state.claim_volume("b", &chosen, None),
            Err(StoreError::Conflict { key: key.clone() })
        );
        assert_eq!(state.identity_owner(&key).unwrap().as_deref(), Some("a"));
        state.unclaim_volume("a", claimed).unwrap();
        assert!(state
            .store()
            .list(IDENTITIES_PREFIX)
            .unwrap()
            .entries
            .is_empty());
        // A volume deleted without its claims (by an older node).
        state.claim_volume("a", &chosen, None).unwrap();
        let record = state
            .read::<VolumeRecord>(&volume_key("a"))
            .unwrap()
            .unwrap();
        state.remove(&volume_key("a"), record.revision).unwrap();
        state.claim_volume("b", &chosen, None).unwrap();
        assert_eq!(state.identity_owner(&key).unwrap().as_deref(), Some("b"));
        state.delete_volume("b").unwrap();
        assert!(state.store().list("").unwrap().entries.is_empty());
    }

    /// A change made from a copy read before another writer's commit is
    /// made again on what that writer wrote: both changes stand.
    #[test]
    fn a_change_raced_by_another_writer_keeps_both() {
        let inner = Arc::new(MemoryStore::default());
        let first = DesiredState::shared(inner.clone(), "n1");
        first
            .change_volume("db1", "aa", |r| r.qos.iops_max = Some(1))
            .unwrap();
        let other: OtherWriter = Box::new(|store| {
            let other = DesiredState::shared(store, "n2");
            other
                .change_volume("db1", "aa", |r| {
                    r.hosts.insert("web1".into());
                })
                .unwrap();
        });
        let store = Intercepted::new(inner, Meanwhile(std::sync::Mutex::new(Some(other))));
        let state = DesiredState::new(Box::new(store), "n1");
        let mut runs = 0;
        state
            .change_volume("db1", "aa", |r| {
                runs += 1;
                r.qos.iops_max = Some(2);
            })
            .unwrap();
        assert_eq!(runs, 2, "the change ran again on the newer record");
        let record = state.volume("db1", "aa").unwrap();
        assert_eq!(record.qos.iops_max, Some(2));
        assert!(
            record.hosts.contains("web1"),
            "the other writer's change stands"
        );
    }

    #[test]
    fn versioned_records_refuse_a_second_create_and_a_stale_update() {
        let state = DesiredState::new(Box::new(MemoryStore::default()), "n1");
        let host = |nqn: &str| HostRecord {
            nqn: nqn.into(),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            dhchap_group: None,
            tls_psk: None,
        };
        let created = state.create("hosts/web1", &host("nqn.a")).unwrap();
        assert!(matches!(
            state.create("hosts/web1", &host("nqn.b")),
            Err(StoreError::Conflict { .. })
        ));
        let read: Versioned<HostRecord> = state.read("hosts/web1").unwrap().unwrap();
        assert_eq!(
            (read.record.nqn.as_str(), read.revision),
            ("nqn.a", created)
        );
        let updated = state.update("hosts/web1", &host("nqn.c"), created).unwrap();
        assert!(matches!(
            state.update("hosts/web1", &host("nqn.d"), created),
            Err(StoreError::Conflict { .. })
        ));
        assert!(state.remove("hosts/web1", created).is_err());
        state.remove("hosts/web1", updated).unwrap();
        assert!(state.hosts().unwrap().is_empty());
    }

    #[test]
    fn nqns_are_checked_with_a_reason() {
        assert!(
            check_nqn("nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e")
                .is_ok()
        );
        assert!(
            check_nqn("blktests-subsystem-1").is_ok(),
            "as nvmet accepts"
        );
        assert!(check_nqn("").unwrap_err().contains("empty"));
        assert!(check_nqn("nqn.a b").unwrap_err().contains("' '"));
        assert!(check_nqn("nqn.é").is_err());
        assert!(check_nqn("nqn.a/b").unwrap_err().contains("'/'"));
        assert!(check_nqn(&format!("nqn.{}", "x".repeat(220)))
            .unwrap_err()
            .contains("223"));
        assert!(check_nqn(&"x".repeat(223)).is_ok());
    }

    #[test]
    fn names_outside_the_specifications_form_get_a_note() {
        for in_form in [
            "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
            "nqn.2026-11.io.weft:vol:db1",
            "nqn.2014-08.org.nvmexpress.discovery",
        ] {
            assert_eq!(nqn_form_note(in_form), None, "{in_form}");
        }
        for outside in [
            "blktests-subsystem-1",
            "nqn.",
            "nqn.2026-11.",
            "nqn.26-11.io.x:y",
        ] {
            let note = nqn_form_note(outside).expect(outside);
            assert!(note.contains("nvmet accepts"), "{note}");
        }
    }
}
