//! Changing a replicated volume's replicas through the API:
//! `PATCH volumes/{volume}/replicas` (`{"count": N}`) adds replicas on
//! other nodes (built in full in the background: `volume show` tells their
//! progress) or removes the least useful ones (the call waits until the
//! primary has taken them out of its in-sync set and they left the record).
//! Any node serves it: it is a change of the volume record
//! (`weft_cluster::replica_members`), which the primary and the replicas'
//! nodes carry out.

use crate::cluster::{placement_failure, store_failure, Cluster};
use crate::{failure, Response};
use serde::Deserialize;
use serde_json::json;
use std::time::{Duration, Instant};
use weft_cluster::replica_members::{
    finish_retirements, set_replica_count, ReplicaChangeError, REPLICAS_MAX,
};
use weft_control::records::read;
use weft_control::VolumeRecord;

/// The body of `PATCH volumes/{volume}/replicas`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Count {
    count: usize,
}

impl Cluster {
    /// Gives `volume` the number of replicas `body` asks for.
    pub(crate) fn set_replicas(&self, volume: &str, body: &[u8]) -> Response {
        let Count { count } = match crate::parse(body) {
            Ok(count) => count,
            Err(response) => return response,
        };
        let store = self.store().as_ref();
        let change = match set_replica_count(store, volume, count) {
            Ok(change) => change,
            Err(error) => return replica_change_failure(&error),
        };
        if !change.removed.is_empty() {
            if let Err(response) = self.await_retired(volume) {
                return response;
            }
        }
        let replicas = match read::<VolumeRecord>(store, &format!("volumes/{volume}")) {
            Ok(found) => found
                .and_then(|f| f.record.replication)
                .map(|r| r.members)
                .unwrap_or_default(),
            Err(error) => return store_failure(&error),
        };
        // Removed: what left the record (a retirement may have been undone
        // by a promotion of that very replica meanwhile).
        let removed: Vec<&String> = change
            .removed
            .iter()
            .filter(|node| !replicas.iter().any(|m| &m.node == *node))
            .collect();
        let replicas: Vec<_> = replicas
            .iter()
            .map(|m| json!({"node": m.node, "pool": m.pool}))
            .collect();
        let added: Vec<_> = change
            .added
            .iter()
            .map(|p| json!({"node": p.node, "pool": p.pool}))
            .collect();
        (
            200,
            json!({"replicas": replicas, "added": added, "removed": removed}),
        )
    }
}

impl Cluster {
    /// Waits until the replicas `volume` retires have left its record (the
    /// primary takes them out of the in-sync set first).
    pub(crate) fn await_retired(&self, volume: &str) -> Result<(), Response> {
        let start = Instant::now();
        loop {
            match finish_retirements(self.store().as_ref(), volume) {
                Ok(true) => return Ok(()),
                Ok(false) if start.elapsed() < RETIRE_WAIT => std::thread::sleep(POLL),
                Ok(false) => {
                    return Err(failure(
                        504,
                        "retire_pending",
                        &format!("the primary of {volume} has not taken the retired replicas out of its in-sync set within {RETIRE_WAIT:?}"),
                        "they leave once it has (the cluster controller finishes it): `weft volume show` tells; is the primary's node up?",
                    ))
                }
                Err(error) => return Err(store_failure(&error)),
            }
        }
    }
}

/// How long a call waits for retired replicas to leave.
const RETIRE_WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);

/// The HTTP answer to a refused change of replicas.
pub(crate) fn replica_change_failure(error: &ReplicaChangeError) -> Response {
    let message = error.to_string();
    match error {
        ReplicaChangeError::NotFound(_) => failure(
            404,
            "not_found",
            &message,
            "`weft volume list` shows the volumes",
        ),
        ReplicaChangeError::NotReplicated(_) => failure(
            400,
            "not_replicated",
            &message,
            "create a new volume with --replicas and copy the data over",
        ),
        ReplicaChangeError::Count(_) => failure(
            400,
            "invalid",
            &message,
            &format!("give --replicas 1 to {REPLICAS_MAX}"),
        ),
        ReplicaChangeError::ErasureCoded { .. } => failure(
            400,
            "erasure_coded",
            &message,
            "create a volume with another --ec layout (or --replicas) and copy the data over",
        ),
        ReplicaChangeError::TooFewInSync { .. } => failure(
            409,
            "too_few_in_sync",
            &message,
            "`weft volume show` tells which members are in sync; the lost ones can be replaced once k others are",
        ),
        ReplicaChangeError::PrimaryDown { .. } => failure(
            409,
            "primary_down",
            &message,
            "wait until `weft volume show` names a primary on an up node, then try again",
        ),
        ReplicaChangeError::HoldsPrimary { .. } => failure(
            409,
            "holds_primary",
            &message,
            "`weft volume show` tells which replicas are in sync and where",
        ),
        ReplicaChangeError::Placement(error) => placement_failure(error),
        ReplicaChangeError::Store(error) => store_failure(error),
    }
}
