//! A seeded, deterministic simulation of weft's replicated volumes, in the
//! manner of TigerBeetle's VOPR.
//!
//! Three storage nodes run the replication core (`weft-replication`)
//! through its `Driver`, the same code the node's replicator runs around
//! its primary (how it starts an epoch, what waits for its files to be
//! durable, what ends it): a primary and its replicas over a simulated
//! network, a store with compare-and-swap records and leases (etcd's part)
//! running the controller's promotion (an in-sync replica that has not
//! heard its primary for a read grant takes over itself, before the
//! primary's lease ends, as the node does), simulated disks; the primary's
//! data plane reads its copy itself while it publishes that it may. A host with a
//! multipath model (it follows the nodes' ANA answers and retries a
//! command on another path after a path error or a timeout, as Linux's
//! nvme multipath does) issues random writes, reads and flushes, never two
//! at once on one block. Meanwhile nodes crash and restart, pause (a hung
//! process, SIGSTOP), are partitioned from each other, from the store or
//! from the host, and links turn slow or lose messages; a change to a
//! primary's files (write intent, run) takes a disk's time and now and then
//! fails (a full disk), which ends that primary; a local write may wait
//! seconds in the volume manager's queue, past a failover; a node's disk
//! may fail every I/O for a while (a failed pool, cleared by the operator):
//! its primary hands over to an in-sync replica. A node may also lose
//! power: each block written since its last flush (or FUA write) keeps its
//! new content or loses it; the host issues FUA writes and flushes. A power
//! loss is injected only while another replica is in sync and no other node
//! is still to be rebuilt from one: two copies lost at once may lose
//! unflushed acknowledged writes, as NVMe allows for one device.
//!
//! Checked all along: every read returns exactly what the last acknowledged
//! write of each block wrote (no acknowledged write lost, no stale read).
//! Checked at the end, after the faults heal: every command completes, the
//! whole volume reads back as acknowledged, every replica rejoins the
//! in-sync set and every in-sync replica holds the primary's data.
//!
//! What it does not model: the NVMe/TCP wire (that is `weft-proto`'s, with
//! its own tests), a failing disk that also loses or corrupts what it held
//! (its disk fails stop: the handover's full rebuild of such a copy is a
//! rule for real disks this model cannot tell from a partial one),
//! replacing a replica on another node, and more than one volume.
//!
//! A run is a function of its seed: `run(seed)` twice gives the same trace.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod ec;
mod host;
mod node;
mod rng;
pub mod seeds;
mod store;
mod world;

pub use world::{run, Failure, Report, SimConfig};
