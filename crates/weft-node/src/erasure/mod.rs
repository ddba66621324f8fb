//! Erasure-coded volumes' data path on their primary: a thread per volume
//! that runs the erasure-coded primary (`weft_ec::EcPrimary`) and a thread
//! per member that carries its reads, writes and fences to that member's
//! shard volume over NVMe/TCP (its node's private, fenced subsystem, as a
//! replicated volume's replica; the primary's own member too, through its
//! own node's subsystem, so that every member is fenced the same way).
//!
//! - [`server`]: the primary's thread: its start (the epoch, as a
//!   replicated volume's replicator takes it), its events, its actions.
//! - [`link`]: one member's connection, fence and queue.
//!
//! What this does not do: decide who is primary (the cluster controller
//! promotes, `weft_cluster::replicas`), create the members' shard volumes
//! or export them (the manager does, as for replicas), or run in the
//! reactors: the reactors hand every read and write of the volume to the
//! primary's thread (`weft_target::replicated`), a thread hop a replicated
//! volume's primary no longer pays (moving it onto a reactor's ring, as the
//! replicator is, is later work).

mod link;
pub(crate) mod server;

pub(crate) use weft_cluster::erasure::{shape, shard_bytes};
