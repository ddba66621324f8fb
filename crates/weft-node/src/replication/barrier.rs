//! A change every copy of a replicated volume makes at one point of its
//! write stream, as the primary's replicator carries it out: a snapshot, or
//! growing the volume.
//!
//! 1. The host's writes and flushes that arrive are held back (reads go on).
//! 2. Once those in flight have completed everywhere, the primary's own copy
//!    (through the manager) and every replica in sync (a vendor command on
//!    its link, behind every write it completed) make the change.
//! 3. The held writes go on, and the record says what changed: the nodes
//!    whose copies hold the snapshot, or the volume's new size.
//!
//! Every copy's snapshot therefore holds the same writes: each acknowledged
//! before it was asked for, none acknowledged after. A replica that does not
//! answer (or fails) simply does not hold it; the primary's own copy must.
//! A replica in sync that did not grow fails the first write past its old
//! end and is faulted like any replica that fails a write.
//!
//! What this does not do: check the request, write the record's entry that
//! announces a snapshot (the manager does both before it asks), delete
//! snapshots (each node does, after the record), or grow copies out of sync
//! (their nodes do, after the record).

use crate::manager::snapshots::{change_record, change_replication};
use crate::manager::AdminError;
use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};
use weft_control::DesiredState;
use weft_replication::NodeId;

/// How long a barrier may take, from the request to every answer: the
/// writes in flight finishing, then each copy's change. The host's held
/// writes wait at most this long (Linux waits 30 s for a command).
pub(crate) const BARRIER_TIMEOUT: Duration = Duration::from_secs(10);

/// What every copy does at the barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BarrierOp {
    /// Take the snapshot of this name.
    Snapshot(String),
    /// Grow to this many bytes.
    Grow(u64),
}

impl std::fmt::Display for BarrierOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BarrierOp::Snapshot(name) => write!(f, "snapshot {name}"),
            BarrierOp::Grow(size_bytes) => write!(f, "growth to {size_bytes} bytes"),
        }
    }
}

/// A barrier under way.
pub(crate) struct Barrier {
    pub(crate) op: BarrierOp,
    reply: Sender<Result<(), AdminError>>,
    started: Instant,
    /// The replicas asked (none yet while writes in flight finish), each
    /// with its answer once known.
    asked: Option<BTreeMap<NodeId, Option<bool>>>,
    /// The primary's own copy's answer.
    local: Option<Result<(), String>>,
}

/// Where a barrier stands.
pub(crate) enum Step {
    /// Waiting for writes in flight to finish, or for answers.
    Waiting,
    /// No write in flight any more: ask these copies.
    Ask,
    /// Done: the replicas that made the change (the primary's copy did),
    /// or why it failed.
    Done(Result<Vec<NodeId>, AdminError>),
}

impl Barrier {
    pub(crate) fn new(op: BarrierOp, reply: Sender<Result<(), AdminError>>) -> Barrier {
        Barrier {
            op,
            reply,
            started: Instant::now(),
            asked: None,
            local: None,
        }
    }

    /// What to do next, given whether host writes are still in flight.
    pub(crate) fn step(&self, writes_in_flight: bool, volume: &str) -> Step {
        let late = self.started.elapsed() > BARRIER_TIMEOUT;
        let Some(asked) = &self.asked else {
            if !writes_in_flight {
                return Step::Ask;
            }
            if late {
                return Step::Done(Err(AdminError::Unavailable(format!(
                    "volume {volume}: its writes in flight did not finish within {} s, so its {} was not made; try again",
                    BARRIER_TIMEOUT.as_secs(),
                    self.op
                ))));
            }
            return Step::Waiting;
        };
        let answered = asked.values().all(Option::is_some);
        match &self.local {
            Some(Err(error)) => Step::Done(Err(AdminError::Node(format!(
                "volume {volume}: the primary's copy failed its {}: {error}",
                self.op
            )))),
            Some(Ok(())) if answered || late => Step::Done(Ok(asked
                .iter()
                .filter(|(_, answer)| **answer == Some(true))
                .map(|(&node, _)| node)
                .collect())),
            None if late => Step::Done(Err(AdminError::Unavailable(format!(
                "volume {volume}: the primary's copy did not finish its {} within {} s; try again",
                self.op,
                BARRIER_TIMEOUT.as_secs()
            )))),
            _ => Step::Waiting,
        }
    }

    /// The replicas were asked.
    pub(crate) fn asked(&mut self, replicas: impl IntoIterator<Item = NodeId>) {
        self.asked = Some(replicas.into_iter().map(|node| (node, None)).collect());
    }

    /// A replica answered (or its session ended: `false`).
    pub(crate) fn answer(&mut self, node: NodeId, taken: bool) {
        if let Some(answer) = self.asked.as_mut().and_then(|a| a.get_mut(&node)) {
            answer.get_or_insert(taken);
        }
    }

    /// The primary's own copy answered.
    pub(crate) fn local_answer(&mut self, result: Result<(), String>) {
        self.local = Some(result);
    }

    /// Gives up: the caller hears why.
    pub(crate) fn fail(self, error: AdminError) {
        let _ = self.reply.send(Err(error));
    }

    /// Records the change (on a helper thread: the store may wait): the
    /// snapshot held by `nodes`, or the new size; then answers the caller.
    pub(crate) fn record(self, desired: DesiredState, volume: String, nodes: Vec<String>) {
        let Barrier { op, reply, .. } = self;
        std::thread::spawn(move || {
            let key = format!("volumes/{volume}");
            let result = match &op {
                BarrierOp::Snapshot(name) => mark_taken(&desired, &key, name, &nodes),
                BarrierOp::Grow(size_bytes) => change_replication(&desired, &key, |r| {
                    r.size_bytes = r.size_bytes.max(*size_bytes);
                    Ok(())
                }),
            };
            if result.is_ok() {
                log::info!("volume {volume}: {op} made on {}", nodes.join(", "));
            }
            let _ = reply.send(result);
        });
    }
}

/// Sets the record's entry of snapshot `name`: held by `nodes`, taken.
fn mark_taken(
    desired: &DesiredState,
    key: &str,
    name: &str,
    nodes: &[String],
) -> Result<(), AdminError> {
    change_record(desired, key, |volume, snapshots| {
        let entry = snapshots
            .iter_mut()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                AdminError::Invalid(format!(
                    "snapshot {volume}@{name} was deleted while it was taken"
                ))
            })?;
        entry.nodes = nodes.to_vec();
        entry.taking = false;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn a_snapshot_waits_for_writes_then_for_every_answer() {
        let (reply, _) = mpsc::channel();
        let mut taking = Barrier::new(BarrierOp::Snapshot("s1".into()), reply);
        assert!(matches!(taking.step(true, "v"), Step::Waiting));
        assert!(matches!(taking.step(false, "v"), Step::Ask));
        taking.asked([NodeId(1), NodeId(2)]);
        taking.local_answer(Ok(()));
        taking.answer(NodeId(2), false);
        assert!(
            matches!(taking.step(false, "v"), Step::Waiting),
            "1 unanswered"
        );
        taking.answer(NodeId(1), true);
        taking.answer(NodeId(1), false);
        match taking.step(false, "v") {
            Step::Done(Ok(nodes)) => assert_eq!(nodes, vec![NodeId(1)], "first answer kept"),
            _ => panic!("done"),
        }
    }

    #[test]
    fn the_primarys_own_copy_must_take_it() {
        let (reply, _) = mpsc::channel();
        let mut taking = Barrier::new(BarrierOp::Snapshot("s1".into()), reply);
        taking.asked([]);
        taking.local_answer(Err("pool full".into()));
        match taking.step(false, "v") {
            Step::Done(Err(error)) => assert!(error.to_string().contains("pool full")),
            _ => panic!("failed"),
        }
    }
}
