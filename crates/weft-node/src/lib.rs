//! The node agent of weft: what one storage node runs between its data
//! plane (weft-target's reactors) and its operators.
//!
//! - [`manager`]: the volume manager thread, the only owner of the node's
//!   pools. It serves the data plane's slow path (first writes,
//!   copy-on-write, deallocation, volume Flush) and admin operations
//!   (pools, volumes, snapshots, hosts, attachments, QoS) from two queues,
//!   every waiting I/O before the next admin operation; commits the desired
//!   state (weft-control) before it acknowledges a change; and hands the
//!   data plane new exports after every change. Its public surface: opening
//!   it ([`Manager::open`]), a [`ManagerHandle`] to submit admin operations
//!   (and, for the reactors, slow-path I/O), and a [`StatusReader`].
//! - [`status`]: what the node reports (pools, volumes, hosts) as domain
//!   structs, read from a snapshot the manager publishes after every change,
//!   never through its queues.
//! - [`cluster`]: following the cluster's shared desired state (a
//!   reconcile when records this node serves change, referrals when members
//!   change) and the status its heartbeats publish.
//! - [`exports`]: the configured subsystems (files, block devices, RAM) and
//!   the data plane's exports built from them.
//! - [`keys`]: where the node's key-encryption keys come from (a file or a
//!   command), for encrypted volumes.
//! - [`identity`]: the node's identity and the serial numbers and namespace
//!   IDs derived from it.
//! - [`metrics`]: per-namespace statistics read from the data plane's
//!   meters, and their Prometheus exposition.
//! - `replication`: a replicated volume's primary (its replicator thread,
//!   its links to the replicas, its local copy). The manager starts it; it
//!   reaches the manager only through a trait of its own.
//! - `intents`: the write intent and run files of the node's replicas,
//!   and `admin_error`: the admin path's error; both shared by the manager
//!   and the replicators.
//!
//! What it does not do: parse configuration files or command lines (the
//! `weft` binary), speak HTTP or define what the API shows (weft-api), touch
//! the I/O fast path (weft-target), or define the on-disk format of pools
//! (weft-volume).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod admin_error;
pub mod cluster;
mod erasure;
pub mod exports;
pub mod identity;
mod intents;
pub mod keys;
pub mod link_keys;
pub mod manager;
pub mod metrics;
mod queue;
mod replication;
mod reservations;
pub mod status;

pub use identity::NodeId;
pub use manager::{AdminError, AdminOp, Manager, ManagerHandle, TierDevice};
pub use status::{
    Authentication, HostStatus, PoolStatus, StatusReader, VolumeStatus, WriteTierStatus,
};
