//! The control plane's desired state: what an operator asked the node to
//! hold (pools and their devices, hosts, which hosts may use which volume,
//! QoS limits), kept behind the [`Store`] trait so that a single node keeps
//! it in an embedded file and a cluster in etcd.
//!
//! This crate knows nothing of NVMe, HTTP or the data plane: the node's
//! manager turns records into exports and the API turns them into JSON.
//! Volumes themselves (sizes, snapshots, data) live on their pool's devices
//! (weft-volume); the store only keeps what the devices do not.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod durable;
pub mod records;
pub mod store;

pub use records::{check_nqn, DesiredState, HostRecord, PoolRecord, QosLimits, VolumeRecord};
pub use store::{Change, EmbeddedStore, MemoryStore, Store, StoreError};
