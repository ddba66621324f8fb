//! Changes a replicated volume's primary and its manager make to the
//! volume record's replication part (`ReplicationRecord`): its members'
//! standing and epoch (a primary's compare-and-swap at the revision it
//! read), its snapshots and its size (tried again while others change the
//! record).

use crate::admin_error::AdminError;
use weft_control::{DesiredState, ReplicatedSnapshot, ReplicationRecord, StoreError, VolumeRecord};
use weft_volume::{VolumeError, SNAPSHOTS_PER_VOLUME_MAX};

/// How many times a record change is tried against concurrent changes.
const CAS_ATTEMPTS: usize = 8;

/// Adds snapshot `name` to the record at `key` as being taken (kept if
/// an earlier attempt left it so; refused if it was taken, or if the
/// volume has as many snapshots as a volume may).
pub(crate) fn announce(desired: &DesiredState, key: &str, name: &str) -> Result<(), AdminError> {
    change_record(desired, key, |volume, snapshots| {
        match snapshots.iter().find(|s| s.name == name) {
            Some(s) if !s.taking => Err(VolumeError::Exists {
                kind: "snapshot",
                name: format!("{volume}@{name}"),
            }
            .into()),
            Some(_) => Ok(()),
            None if snapshots.len() >= SNAPSHOTS_PER_VOLUME_MAX => Err(VolumeError::Limit(format!(
                "volume {volume} has {SNAPSHOTS_PER_VOLUME_MAX} snapshots, the most a volume may have; delete one first"
            ))
            .into()),
            None => {
                snapshots.push(ReplicatedSnapshot {
                    name: name.to_string(),
                    nodes: Vec::new(),
                    taking: true,
                });
                Ok(())
            }
        }
    })
}

/// Changes the snapshot list of the replicated volume at `key`.
pub(crate) fn change_record(
    desired: &DesiredState,
    key: &str,
    change: impl Fn(&str, &mut Vec<ReplicatedSnapshot>) -> Result<(), AdminError>,
) -> Result<(), AdminError> {
    let volume = key.trim_start_matches("volumes/");
    change_replication(desired, key, |replication| {
        change(volume, &mut replication.snapshots)
    })
}

/// Changes the replication record of the volume at `key` (compare-and-swap,
/// tried again a few times while others change the record).
pub(crate) fn change_replication(
    desired: &DesiredState,
    key: &str,
    change: impl Fn(&mut ReplicationRecord) -> Result<(), AdminError>,
) -> Result<(), AdminError> {
    let volume = key.trim_start_matches("volumes/");
    for _ in 0..CAS_ATTEMPTS {
        let found = desired
            .read::<VolumeRecord>(key)?
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} was deleted")))?;
        let mut record = found.record;
        let replication = record
            .replication
            .as_mut()
            .ok_or_else(|| AdminError::Invalid(format!("volume {volume} is not replicated")))?;
        change(replication)?;
        match desired.update(key, &record, found.revision) {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(error) => return Err(error.into()),
        }
    }
    Err(AdminError::Unavailable(format!(
        "volume {volume}: its record changed {CAS_ATTEMPTS} times while this change was tried; try again"
    )))
}

/// What a compare-and-swap of a volume record's replication part did.
pub(crate) enum Swapped {
    /// Made: the new revision and part.
    Done(u64, ReplicationRecord),
    /// Not made: the part as it is now (none when the record is gone or unreadable).
    Failed(Option<(u64, ReplicationRecord)>),
}

/// Replaces the volume record's replication part at revision `base`
/// (compare-and-swap).
pub(crate) fn swap_replication(
    desired: &DesiredState,
    volume: &str,
    base: u64,
    replication: ReplicationRecord,
) -> Swapped {
    let key = format!("volumes/{volume}");
    let current = |desired: &DesiredState| match desired.read::<VolumeRecord>(&key) {
        Ok(Some(found)) if found.revision.0 > base => found
            .record
            .replication
            .map(|record| (found.revision.0, record)),
        _ => None,
    };
    let found = match desired.read::<VolumeRecord>(&key) {
        Ok(Some(found)) => found,
        Ok(None) | Err(_) => return Swapped::Failed(None),
    };
    if found.revision.0 > base {
        return Swapped::Failed(current(desired));
    }
    let mut record = found.record;
    record.replication = Some(replication.clone());
    match desired.update(&key, &record, weft_control::Revision(base)) {
        Ok(revision) => Swapped::Done(revision.0, replication),
        Err(StoreError::Conflict { .. }) => Swapped::Failed(current(desired)),
        Err(error) => {
            log::warn!("volume {volume}: record change not made: {error}");
            Swapped::Failed(None)
        }
    }
}

/// How often a primary reads its volume's record again.
const RECORD_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Reads `volume`'s record every [`RECORD_POLL`] on a thread of its own,
/// until `stop`, and hands `report` each new revision's replication part;
/// once the record is gone, `(u64::MAX, None)`, and ends. `report` answers
/// whether anybody still listens (the poller ends when not).
pub(crate) fn poll_record(
    desired: DesiredState,
    volume: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut report: impl FnMut(u64, Option<ReplicationRecord>) -> bool + Send + 'static,
) {
    use std::sync::atomic::Ordering;
    let key = format!("volumes/{volume}");
    let spawned = std::thread::Builder::new()
        .name(format!("record-{volume}"))
        .spawn(move || {
            let mut seen = 0;
            while !stop.load(Ordering::Acquire) {
                match desired.read::<VolumeRecord>(&key) {
                    Ok(Some(found)) if found.revision.0 != seen => {
                        seen = found.revision.0;
                        if !report(seen, found.record.replication) {
                            return;
                        }
                    }
                    Ok(None) => {
                        report(u64::MAX, None);
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

/// Whether two records give a primary the same shape: the same members in
/// the same order (node ids are positions in the list), the same size and
/// stripe. A change of it is served by a new primary (the next epoch).
pub(crate) fn same_shape(a: &ReplicationRecord, b: &ReplicationRecord) -> bool {
    a.size_bytes == b.size_bytes
        && a.erasure == b.erasure
        && a.members.len() == b.members.len()
        && a.members
            .iter()
            .zip(&b.members)
            .all(|(x, y)| x.node == y.node)
}
