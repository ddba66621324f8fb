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
//! grant, loses its role: a needless failover, never a stale read.
//!
//! What this does not do: serve (the replicator does, once the node sees
//! the record), or speak for an erasure-coded volume (its primary asks no
//! grants).

use crate::replication::replica_volume;
use std::sync::Arc;
use std::time::Duration;
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
            loop {
                for (volume, epoch) in silent_primaries(&plane) {
                    let taken = take_over_volume(store.as_ref(), &volume, epoch, &node);
                    log_failure(taken, &mut failing);
                }
                std::thread::sleep(LOOK_EVERY);
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

/// Makes `node` primary of `volume` in place of its primary of `epoch`,
/// if the record still names that one and `node` may take over.
fn take_over_volume(
    store: &dyn Store,
    volume: &str,
    epoch: u64,
    node: &str,
) -> Result<(), StoreError> {
    let key = format!("{VOLUMES_PREFIX}{volume}");
    let Some(found) = read::<VolumeRecord>(store, &key)? else {
        return Ok(());
    };
    let Some(replication) = found.record.replication.as_ref() else {
        return Ok(());
    };
    if replication.epoch != epoch {
        return Ok(());
    }
    let Some(next) = take_over(replication, node) else {
        return Ok(());
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
            Ok(())
        }
        // Changed meanwhile (or this copy of the store lags): looked at again.
        Err(StoreError::Conflict { .. }) => Ok(()),
        Err(error) => Err(error),
    }
}

/// Logs a failure once until the store works again.
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
