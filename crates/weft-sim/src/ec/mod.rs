//! A seeded simulation of erasure-coded volumes (issue 36), in the manner
//! of the replication simulation beside it.
//!
//! `k + m` storage nodes each hold one member of a volume (its shard
//! volume: the stripe journal, then one chunk of every stripe). The node
//! the record names primary runs `weft-ec`'s [`EcPrimary`], the code the
//! node ships, over a simulated network to every member; each member is a
//! fenced disk that reads and writes what the session that fenced it last
//! asks, one op at a time, each write durable before it is answered (FUA),
//! as the node's target and volume do. A store holds the record under
//! compare-and-swap and the nodes' leases, and promotes another in-sync
//! member's node when the primary's lease has been gone for the promotion
//! delay (`weft_ec::controller::promote`).
//!
//! A host issues random reads and writes through a multipath model:
//! partial-stripe writes of one block up to whole stripes, never two
//! writes on one block at once, each retried on another path after a path
//! error or a lost connection until acknowledged, never two on one block
//! at once. Meanwhile nodes crash
//! (the write a member's disk was doing is torn: each of its blocks lands
//! or not), restart, pause, are cut off from the network, and their disks
//! fail every op for a while; the primary's node among them.
//!
//! The operator now and then asks the primary for a snapshot (taken on
//! every member in sync at one point of the write stream, by the code
//! that ships: `EcPrimary::control`); each member's snapshot is kept.
//!
//! Checked all along: every read returns, block by block, the value of
//! the last acknowledged write of that block.
//! Checked at the end, once the faults heal: every command completed, every
//! member is back in sync, every stripe's parity is its data's (no torn
//! stripe: with any `m` members lost, every block would be rebuilt right)
//! and every block holds its last acknowledged value; and every snapshot
//! that `k` members or more took decodes, stripe by stripe from those
//! members' snapshots, to what the host had acknowledged when it was
//! taken (each block its last acknowledged value, or that of a write under
//! way then), its parity agreeing where every member took it.
//!
//! [`EcPrimary`]: weft_ec::EcPrimary

mod host;
mod node;
mod snapshots;
mod world;

pub use world::{run_ec, EcReport, EcSimConfig};
