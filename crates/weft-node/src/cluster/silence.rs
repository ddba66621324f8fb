//! A replica taking over from a silent primary.
//!
//! Every [`LOOK_EVERY`], each replica subsystem this node exports whose
//! fence the record's primary holds, or was the last to hold, at the
//! record's epoch (the subsystem's `FenceAuthority`), and which has not
//! heard that primary for `READ_GRANT` (`Fences::holder_silent`: a primary
//! renews its grant three times a grant, idle or not), makes this node the
//! volume's primary if it is an in-sync replica of a mirrored volume
//! (`weft_cluster::replicas::take_over`, a compare-and-swap on the volume
//! record as this node's copy of the store holds it: a copy that lags only
//! fails the swap, tried again at the next look). Neither the primary's
//! lease nor a controller is waited for (the primary's node may have been
//! the controller): the primary serves reads only while every in-sync
//! replica grants them, and the new primary's fences wait out any grant
//! left. A primary cut off from this replica alone, or slower than the
//! grant, loses its role: a needless failover, never a stale read. A look
//! that comes late (this thread, or the whole process, was held up: the
//! reactors may not have read what arrived meanwhile) decides nothing, and
//! a replica found unfit to take over is not looked at again while its
//! primary's silence and epoch last (an erasure-coded member, a faulted
//! copy: each would cost a read of the record every look).
//!
//! What this does not do: serve (the replicator does, once the node sees
//! the record), or speak for an erasure-coded volume (its primary asks no
//! grants).

use crate::replication::replica_volume;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_cluster::replicas::take_over;
use weft_control::records::{encode, read, VOLUMES_PREFIX};
use weft_control::{Store, StoreError, Txn, VolumeRecord};
use weft_target::DataPlane;

/// How often the replica subsystems are looked at: a tenth of the grant,
/// what the look adds to a failover at most.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Starts the thread by which node `node`'s replicas take over from silent
/// primaries, through `store` (the node's copy of the cluster's: reads
/// stay local, changes go to the cluster's).
pub fn watch(plane: Arc<DataPlane>, store: Arc<dyn Store>, node: String) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("silent-primaries".into())
        .spawn(move || {
            let mut failing = false;
            let mut unfit: BTreeSet<(String, u64)> = BTreeSet::new();
            let mut looked_at = Instant::now();
            loop {
                std::thread::sleep(LOOK_EVERY);
                let late = looked_at.elapsed() > 3 * LOOK_EVERY;
                looked_at = Instant::now();
                let silent = silent_primaries(&plane);
                unfit.retain(|volume| silent.contains(volume));
                if late {
                    continue;
                }
                let mut verdict = None;
                for (volume, epoch) in silent {
                    if unfit.contains(&(volume.clone(), epoch)) {
                        continue;
                    }
                    match take_over_volume(store.as_ref(), &volume, epoch, &node) {
                        Ok(Outcome::Unfit) => {
                            unfit.insert((volume, epoch));
                        }
                        Ok(Outcome::Lagging) => {}
                        Ok(Outcome::Tried) => verdict = verdict.or(Some(Ok(()))),
                        Err(error) => verdict = Some(Err(error)),
                    }
                }
                if let Some(verdict) = verdict {
                    log_failure(verdict, &mut failing);
                }
            }
        })
        .map(drop)
}

/// The volumes whose primary this node's replica has not heard for a
/// grant, with that primary's epoch.
fn silent_primaries(plane: &DataPlane) -> Vec<(String, u64)> {
    let now = plane.now();
    let fences = plane.fences();
    plane
        .exports()
        .config
        .subsystems
        .iter()
        .filter_map(|subsystem| {
            let authority = subsystem.fence_authority.as_ref()?;
            let volume = replica_volume(&subsystem.nqn)?;
            fences
                .holder_silent(&subsystem.nqn, authority, now)
                .then(|| (volume.to_string(), authority.epoch))
        })
        .collect()
}

/// What became of a look at a silent primary's volume.
enum Outcome {
    /// This replica may not take over at this epoch (not in sync, being
    /// retired, erasure-coded, gone).
    Unfit,
    /// This node's copy of the record is at another epoch (it lags, or
    /// the volume moved on): looked at again.
    Lagging,
    /// The swap was asked of the store (made, or lost to a change).
    Tried,
}

/// Makes `node` primary of `volume` in place of its primary of `epoch`,
/// if the record still names that one and `node` may take over.
fn take_over_volume(
    store: &dyn Store,
    volume: &str,
    epoch: u64,
    node: &str,
) -> Result<Outcome, StoreError> {
    let key = format!("{VOLUMES_PREFIX}{volume}");
    let Some(found) = read::<VolumeRecord>(store, &key)? else {
        return Ok(Outcome::Unfit);
    };
    let Some(replication) = found.record.replication.as_ref() else {
        return Ok(Outcome::Unfit);
    };
    if replication.epoch != epoch {
        return Ok(Outcome::Lagging);
    }
    let Some(next) = take_over(replication, node) else {
        return Ok(Outcome::Unfit);
    };
    let old = replication.primary.clone();
    let mut record = found.record.clone();
    record.replication = Some(next);
    match store.commit(Txn::new().update(key, encode(&record), found.revision)) {
        Ok(_) => {
            log::warn!(
                "volume {volume}: its primary {old} has not been heard here for a read grant; this replica takes over (epoch {})",
                epoch + 1
            );
            Ok(Outcome::Tried)
        }
        // Changed meanwhile (or this copy of the store lags): looked at again.
        Err(StoreError::Conflict { .. }) => Ok(Outcome::Tried),
        Err(error) => Err(error),
    }
}

/// Logs a failure once until the store works again (a pass's verdict:
/// only asks that reached the store, or failed to, count).
fn log_failure(result: Result<(), StoreError>, failing: &mut bool) {
    match result {
        Ok(()) if std::mem::take(failing) => {
            log::info!("replicas taking over from silent primaries reach the store again");
        }
        Ok(()) => {}
        Err(error) if !std::mem::replace(failing, true) => {
            log::warn!("a replica taking over from a silent primary: {error}; tried again");
        }
        Err(_) => {}
    }
}
