//! The cluster control plane of weft: what several storage nodes sharing
//! one store (etcd) agree on.
//!
//! - [`records`]: the cluster's own records and their keys (the cluster's
//!   identity, each node's membership, each node's liveness under a lease).
//! - [`lease`]: how long a node may trust its own lease.
//! - [`membership`]: a node joining the cluster as itself (never as a node
//!   name held by another node, never with a data directory of another
//!   cluster), keeping its liveness record alive, and leaving.
//! - [`election`]: one cluster controller at a time, chosen through a
//!   leased key; it makes the cluster-wide decisions.
//! - [`nodes`]: each node's state as an operator sees it (up, down,
//!   cordoned) and the operator's changes to it (cordon, remove).
//! - [`placement`]: which node and pool a new volume goes to.
//! - [`replicas`]: replicated volumes' records as the replication core
//!   sees them, and the controller's promotion of a new primary.
//! - [`replica_members`]: adding, removing and replacing a replicated
//!   volume's replicas.
//! - [`token`]: one API token for every node.
//! - [`join`]: one-time tokens with which a new node gets its certificate.
//! - [`pki`]: the cluster's certificate authority and the nodes'
//!   certificates it issues.
//! - [`agent`]: the thread that runs a node's heartbeats.
//!
//! Everything but [`agent`] is synchronous calls on a [`weft_control::Store`]
//! with time passed in as arguments: no threads, sockets or clocks, so that
//! the tests (and later the failover simulation) run on the in-memory store
//! with a manual clock; [`agent`] drives it from a thread on the real clock.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod agent;
pub mod election;
pub mod erasure;
pub mod join;
pub mod lease;
pub mod membership;
pub mod nodes;
pub mod pki;
pub mod placement;
pub mod records;
pub mod replica_members;
pub mod replicas;
pub mod token;

pub use agent::Agent;
pub use lease::LeaseClock;
pub use membership::{JoinError, Member, MemberConfig, NodeStatus};
pub use nodes::{NodeState, NodeView};
pub use placement::{place, place_replicas, PlacementError, PlacementRequest};
pub use records::{AliveRecord, ClusterRecord, MemberRecord, PoolSummary};
