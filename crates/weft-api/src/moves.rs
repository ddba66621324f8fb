//! Planned moves of replicated volumes' primaries through the API:
//! `POST volumes/{volume}/move-primary` (`{"to": NODE}`, optional) and
//! `POST nodes/{node}/drain` (cordon the node, then move every primary off
//! it). Any node serves them: the move is a change of the volume record
//! (`weft_cluster::replicas::request_move`), which the primary carries out
//! itself; the call waits until it has (or the primary dropped it).

use crate::cluster::{store_failure, Cluster};
use crate::{failure, Response};
use serde_json::json;
use std::time::{Duration, Instant};
use weft_cluster::nodes;
use weft_cluster::replicas::{move_outcome, primaries_on, request_move, MoveError, MoveOutcome};

/// How long a move may take before the call gives up waiting (the move
/// itself may still finish).
const MOVE_WAIT: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);

impl Cluster {
    /// Moves `volume`'s primary to `to` (or the best in-sync replica).
    pub(crate) fn move_primary(&self, volume: &str, to: Option<&str>) -> Response {
        let started = Instant::now();
        let (target, already) = match request_move(self.store().as_ref(), volume, to) {
            Ok(asked) => asked,
            Err(error) => return move_failure(&error),
        };
        if already {
            return (200, json!({"primary": target, "moved": false}));
        }
        match self.await_move(volume, &target) {
            Ok(()) => {
                let took_ms = started.elapsed().as_millis() as u64;
                log::info!("volume {volume}: primary moved to {target} in {took_ms} ms");
                (
                    200,
                    json!({"primary": target, "moved": true, "took_ms": took_ms}),
                )
            }
            Err(response) => response,
        }
    }

    /// Cordons `node`, then moves every primary on it elsewhere.
    pub(crate) fn drain(&self, node: &str) -> Response {
        let store = self.store().as_ref();
        if let Err(error) = nodes::set_cordoned(store, node, true) {
            return crate::cluster::node_failure(&error);
        }
        let volumes = match primaries_on(store, node) {
            Ok(volumes) => volumes,
            Err(error) => return store_failure(&error),
        };
        let mut moved = Vec::new();
        for volume in volumes {
            let (status, answer) = self.move_primary(&volume, None);
            if status != 200 {
                return (
                    status,
                    json!({
                        "code": answer["code"],
                        "message": format!("volume {volume}: {}", answer["message"].as_str().unwrap_or("")),
                        "hint": answer["hint"],
                        "moved": moved,
                    }),
                );
            }
            moved.push(json!({"volume": volume, "primary": answer["primary"]}));
        }
        (200, json!({"cordoned": true, "moved": moved}))
    }

    fn await_move(&self, volume: &str, target: &str) -> Result<(), Response> {
        let start = Instant::now();
        loop {
            match move_outcome(self.store().as_ref(), volume, target) {
                Ok(MoveOutcome::Done) => return Ok(()),
                Ok(MoveOutcome::Pending) if start.elapsed() < MOVE_WAIT => std::thread::sleep(POLL),
                Ok(MoveOutcome::Pending) => {
                    return Err(failure(
                        504,
                        "move_pending",
                        &format!("the primary of {volume} has not handed over to {target} within {MOVE_WAIT:?}"),
                        "the move may still finish: `weft volume show` tells; is the primary's node up and reaching the store?",
                    ))
                }
                Ok(MoveOutcome::Dropped(primary)) => {
                    return Err(failure(
                        409,
                        "move_dropped",
                        &format!("the primary of {volume} did not hand over to {target}; {primary} is primary"),
                        &format!("{target} did not answer in time or fell out of sync (its node's log tells); try again, or another node"),
                    ))
                }
                Err(error) => return Err(move_failure(&error)),
            }
        }
    }
}

fn move_failure(error: &MoveError) -> Response {
    let message = error.to_string();
    match error {
        MoveError::NotFound(_) => failure(
            404,
            "not_found",
            &message,
            "`weft volume list` shows the volumes",
        ),
        MoveError::NotReplicated(_) => failure(
            400,
            "not_replicated",
            &message,
            "only volumes created with --replicas 2 or 3 have a primary to move",
        ),
        MoveError::NotAMember { .. } => failure(
            400,
            "invalid",
            &message,
            "give --to one of the nodes `weft volume show` lists as replicas",
        ),
        MoveError::NotInSync { .. } | MoveError::TargetDown(_) | MoveError::NoTarget(_) => failure(
            409,
            "no_target",
            &message,
            "wait until `weft volume show` lists the replica in-sync on an up node, then move",
        ),
        MoveError::Store(error) => store_failure(error),
    }
}
