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

use weft_control::{ErasureRecord, ReplicationRecord};
use weft_ec::{EcError, Geometry, JournalLayout, Layout};

/// An erasure-coded volume's geometry and journal, from its record.
pub(crate) fn shape(
    replication: &ReplicationRecord,
    erasure: &ErasureRecord,
) -> Result<(Geometry, JournalLayout), EcError> {
    let layout = Layout::new(erasure.data_shards as usize, erasure.parity_shards as usize)?;
    let geometry = Geometry::new(layout, erasure.chunk_bytes)?;
    let journal = JournalLayout {
        slots: erasure.journal_slots,
        block_bytes: replication.block_size,
        chunk_bytes: erasure.chunk_bytes,
    };
    Ok((geometry, journal))
}

/// The bytes of each member's shard volume: its journal, then a chunk of
/// every stripe.
pub(crate) fn shard_bytes(replication: &ReplicationRecord, erasure: &ErasureRecord) -> Option<u64> {
    let (geometry, journal) = shape(replication, erasure).ok()?;
    Some(journal.data_base() + geometry.shard_volume_bytes(replication.size_bytes))
}
