//! The replicator's reads and compare-and-swaps of the volume record's
//! replication part, off its turn (each answer comes back as an event).

use super::*;

/// Replaces the volume record's replication part at `base` (compare-and-swap).
pub(super) fn commit(
    desired: &DesiredState,
    volume: &str,
    base: u64,
    replication: ReplicationRecord,
) -> Event {
    use crate::replication::records::{swap_replication, Swapped};
    match swap_replication(desired, volume, base, replication) {
        Swapped::Done(revision, record) => Event::Committed { revision, record },
        Swapped::Failed(current) => Event::CommitFailed(current),
    }
}
