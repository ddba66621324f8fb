//! An erasure-coded volume's shape, from its record: the stripe geometry,
//! the members' journals, and the bytes of each member's shard volume
//! (what placement asks a pool for, and what a member's node creates).
//!
//! What this does not do: place members or touch data.

use weft_control::{ErasureRecord, ReplicationRecord};
use weft_ec::{EcError, Geometry, JournalLayout, Layout};

/// The volume's geometry and its members' journal layout.
pub fn shape(
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
/// every stripe (`None` for a layout this code does not make).
pub fn shard_bytes(replication: &ReplicationRecord, erasure: &ErasureRecord) -> Option<u64> {
    let (geometry, journal) = shape(replication, erasure).ok()?;
    Some(journal.data_base() + geometry.shard_volume_bytes(replication.size_bytes))
}
