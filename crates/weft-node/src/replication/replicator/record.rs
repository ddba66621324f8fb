//! The replicator's reads and compare-and-swaps of the volume record's
//! replication part, off its turn (each answer comes back as an event).

use super::*;

/// Whether two records name the same replicas in the same order (node ids
/// are positions in the list) and the same size: the core's shape. A change
/// of either is served by a new primary (under the next epoch).
pub(super) fn same_members(a: &ReplicationRecord, b: &ReplicationRecord) -> bool {
    a.size_bytes == b.size_bytes
        && a.members.len() == b.members.len()
        && a.members
            .iter()
            .zip(&b.members)
            .all(|(x, y)| x.node == y.node)
}

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

/// Reads the record every [`RECORD_POLL`] and reports each new revision.
pub(super) fn poll_record(
    desired: DesiredState,
    volume: String,
    events: Events,
    stop: Arc<AtomicBool>,
) {
    let key = format!("volumes/{volume}");
    let spawned = std::thread::Builder::new()
        .name(format!("record-{volume}"))
        .spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Acquire) {
                match desired.read::<VolumeRecord>(&key) {
                    Ok(Some(found)) if found.revision.0 != seen => {
                        seen = found.revision.0;
                        let event = Event::Record {
                            revision: seen,
                            record: found.record.replication,
                        };
                        if events.send(event).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = events.send(Event::Record {
                            revision: u64::MAX,
                            record: None,
                        });
                        return;
                    }
                    _ => {}
                }
                std::thread::sleep(RECORD_POLL);
            }
        });
    if let Err(error) = spawned {
        log::error!("cannot start the record poller: {error}");
    }
}
