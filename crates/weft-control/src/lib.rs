//! The control plane's desired state: what an operator asked the node to
//! hold (pools and their devices, hosts, which hosts may use which volume,
//! QoS limits), kept behind the [`Store`] trait so that a single node keeps
//! it in an embedded file and a cluster in etcd. Records are versioned:
//! an update names the revision it was read at, so that of two racing
//! changes exactly one wins.
//!
//! This crate knows nothing of NVMe, HTTP or the data plane: the node's
//! manager turns records into exports and the API turns them into JSON.
//! Volumes themselves (sizes, snapshots, data) live on their pool's devices
//! (weft-volume); the store only keeps what the devices do not.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(any(test, feature = "testing"))]
pub mod conformance;
pub mod durable;
pub mod embedded;
#[cfg(any(test, feature = "testing"))]
pub mod intercept;
pub mod memory;
pub mod mirror;
pub mod records;
pub mod store;

pub use embedded::EmbeddedStore;
pub use memory::{Clock, ManualClock, MemoryStore, SystemClock};
pub use mirror::Mirror;
pub use records::{
    check_nqn, nqn_form_note, reservation_key, DesiredState, ErasureRecord, HeldReservation,
    HostRecord, PoolRecord, QosLimits, RegistrantRecord, ReplicaRecord, ReplicaState,
    ReplicatedSnapshot, ReplicationRecord, ReservationRecord, SnapshotSource, Versioned,
    VolumeRecord,
};
pub use store::{
    Change, Condition, Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent,
};
