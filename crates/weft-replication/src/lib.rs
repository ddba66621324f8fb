//! The replication core of weft, sans-IO: how a replicated volume's primary
//! and its replicas keep every acknowledged write on every in-sync replica,
//! lose a replica without losing a write, bring it back with a partial
//! rebuild, and hand the primary role over without two primaries ever
//! acknowledging writes.
//!
//! Nothing here does I/O, reads a clock or starts a thread (as `weft-proto`
//! and quinn-proto): the primary is a state machine fed with host commands,
//! completions, replies and the time, and it answers with [`Action`]s that
//! its driver carries out in order, by the rules of [`driver`]. Two shells
//! run that driver: the seeded simulation in `weft-sim`, which crashes,
//! pauses and partitions nodes by the thousand, and the node's replicator
//! (weft-node).
//!
//! - [`types`]: node ids, epochs, fencing tokens, extents and regions.
//! - [`regions`]: sets of regions (dirty and write-intent bitmaps).
//! - [`record`]: the volume's replica set as the store holds it.
//! - [`replica`]: what a replica answers a primary (the replica side is the target's).
//! - [`primary`]: the primary's state machine.
//! - [`driver`]: the rules its drivers keep (the node's replicator and the simulation).
//! - [`controller`]: the cluster controller's promotion of a new primary.
//!
//! The rules every part keeps (docs/REPLICATION-DESIGN.md explains why):
//! - A write, Flush or FUA write is acknowledged only once the primary and
//!   every replica the store's record calls in-sync have completed it.
//! - A replica leaves the in-sync set by a compare-and-swap on the record,
//!   under the primary's epoch, before any write it missed is acknowledged.
//! - A replica applies only the writes of the primary session that fenced it
//!   last, and fencing tokens only grow: a deposed primary can never again
//!   get a write acknowledged by a replica the new primary fenced.
//! - A primary serves reads only while its lease is valid, and the
//!   controller promotes only after that lease has ended.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod controller;
pub mod driver;
pub mod primary;
pub mod record;
pub mod regions;
pub mod replica;
pub mod types;

pub use driver::{plan_start, Driver, End, Serving, Start};
pub use primary::{Action, HostResult, Primary, PrimaryConfig, PrimaryPhase, Run, ToReplica};
pub use record::{Member, MemberState, ReplicaSet};
pub use regions::RegionSet;
pub use replica::FromReplica;
pub use types::{Epoch, Extent, Geometry, NodeId, OpId, Token};
