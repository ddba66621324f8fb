//! A change every copy of a replicated volume makes at one point of its
//! write stream, as the primary's replicator carries it out: a snapshot, or
//! growing the volume.
//!
//! 1. A snapshot is announced in the record (`taking`), before anything is
//!    held: so that no node deletes the copies it is about to take, and no
//!    store write ever holds host I/O back.
//! 2. The host's writes and flushes that arrive are held back (reads go on).
//! 3. Once those in flight have completed everywhere, the primary's own copy
//!    (through the manager) and every replica in sync (a vendor command on
//!    its link, behind every write it completed) make the change. Answers
//!    carry the barrier's number: a late one from an earlier barrier never
//!    counts for this one.
//! 4. The held writes go on, and the record says what changed: the nodes
//!    whose copies hold the snapshot, or the volume's new size. A snapshot
//!    that failed after its announcement leaves the record again, so that
//!    every node deletes what it took of it.
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

use super::records::{announce, change_record, change_replication};
use super::NodeServices;
use crate::admin_error::AdminError;
use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_control::{DesiredState, ReplicaState, ReplicationRecord};
use weft_replication::NodeId;

/// How long the writes in flight may take to finish once new ones are held
/// back (then the barrier fails: nothing was asked of any copy).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the copies may take to answer: a replica's link gives up on a
/// command after 5 s. One that has not answered then does not count (a
/// snapshot it takes later is deleted by its node, as the record says).
/// The host's held writes wait at most both (Linux waits 30 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(6);

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
    /// Its number: the answers of its copies carry it.
    pub(crate) seq: u64,
    reply: Sender<Result<(), AdminError>>,
    stage: Stage,
}

enum Stage {
    /// A snapshot to announce in the record.
    ToAnnounce,
    /// Its announcement is being written.
    Announcing,
    /// New host writes are held back; those in flight finish.
    Draining { since: Instant },
    /// The copies were asked.
    Asked {
        since: Instant,
        /// Each replica asked, with its answer once known.
        replicas: BTreeMap<NodeId, Option<bool>>,
        /// The primary's own copy's answer.
        local: Option<Result<(), String>>,
    },
}

/// What the replicator does next for a barrier.
pub(crate) enum Step {
    /// Nothing now: wait for writes in flight to finish, or for answers.
    Waiting,
    /// Write the snapshot's announcement (on a helper thread), then say
    /// [`Barrier::announced`].
    Announce,
    /// No write in flight any more: ask the copies, then say [`Barrier::asked`].
    Ask,
    /// Done: the replicas that made the change (the primary's copy did),
    /// or why it failed.
    Done(Result<Vec<NodeId>, AdminError>),
}

impl Barrier {
    pub(crate) fn new(op: BarrierOp, seq: u64, reply: Sender<Result<(), AdminError>>) -> Barrier {
        let stage = match op {
            BarrierOp::Snapshot(_) => Stage::ToAnnounce,
            BarrierOp::Grow(_) => Stage::Draining {
                since: Instant::now(),
            },
        };
        Barrier {
            op,
            seq,
            reply,
            stage,
        }
    }

    /// Whether host writes are held back now.
    pub(crate) fn holds_writes(&self) -> bool {
        matches!(self.stage, Stage::Draining { .. } | Stage::Asked { .. })
    }

    /// What to do next, given whether host writes are still in flight.
    pub(crate) fn step(&mut self, writes_in_flight: bool, volume: &str) -> Step {
        match &self.stage {
            Stage::ToAnnounce => {
                self.stage = Stage::Announcing;
                Step::Announce
            }
            Stage::Announcing => Step::Waiting,
            Stage::Draining { .. } if !writes_in_flight => Step::Ask,
            Stage::Draining { since } if since.elapsed() > DRAIN_TIMEOUT => {
                Step::Done(Err(AdminError::Unavailable(format!(
                    "volume {volume}: its writes in flight did not finish within {} s, so its {} was not made; try again",
                    DRAIN_TIMEOUT.as_secs(),
                    self.op
                ))))
            }
            Stage::Draining { .. } => Step::Waiting,
            Stage::Asked {
                since,
                replicas,
                local,
            } => {
                let late = since.elapsed() > ANSWER_TIMEOUT;
                let answered = replicas.values().all(Option::is_some);
                match local {
                    Some(Err(error)) => Step::Done(Err(AdminError::Node(format!(
                        "volume {volume}: the primary's copy failed its {}: {error}",
                        self.op
                    )))),
                    Some(Ok(())) if answered || late => Step::Done(Ok(replicas
                        .iter()
                        .filter(|(_, answer)| **answer == Some(true))
                        .map(|(&node, _)| node)
                        .collect())),
                    None if late => Step::Done(Err(AdminError::Unavailable(format!(
                        "volume {volume}: the primary's copy did not finish its {} within {} s; try again",
                        self.op,
                        ANSWER_TIMEOUT.as_secs()
                    )))),
                    _ => Step::Waiting,
                }
            }
        }
    }

    /// The announcement was written (writes are held back from now on),
    /// or why not.
    pub(crate) fn announced(
        &mut self,
        seq: u64,
        result: Result<(), AdminError>,
    ) -> Option<AdminError> {
        if seq != self.seq || !matches!(self.stage, Stage::Announcing) {
            return None;
        }
        match result {
            Ok(()) => {
                self.stage = Stage::Draining {
                    since: Instant::now(),
                };
                None
            }
            Err(error) => Some(error),
        }
    }

    /// The copies were asked: the replicas listed, and the primary's own.
    pub(crate) fn asked(&mut self, replicas: impl IntoIterator<Item = NodeId>) {
        self.stage = Stage::Asked {
            since: Instant::now(),
            replicas: replicas.into_iter().map(|node| (node, None)).collect(),
            local: None,
        };
    }

    /// A replica answered barrier `seq` (or its session ended: `false`).
    pub(crate) fn answer(&mut self, node: NodeId, seq: u64, done: bool) {
        if seq != self.seq {
            return;
        }
        if let Stage::Asked { replicas, .. } = &mut self.stage {
            if let Some(answer) = replicas.get_mut(&node) {
                answer.get_or_insert(done);
            }
        }
    }

    /// A replica's session ended: it answers no barrier any more.
    pub(crate) fn session_ended(&mut self, node: NodeId) {
        self.answer(node, self.seq, false);
    }

    /// The primary's own copy answered barrier `seq`.
    pub(crate) fn local_answer(&mut self, seq: u64, result: Result<(), String>) {
        if let Stage::Asked { local, .. } = &mut self.stage {
            if seq == self.seq {
                *local = Some(result);
            }
        }
    }

    /// Gives up: the caller hears why. A snapshot announced leaves the
    /// record first (on a helper thread), so that every node deletes what
    /// it took of it.
    pub(crate) fn fail(self, error: AdminError, desired: DesiredState, volume: String) {
        let announced = !matches!(self.stage, Stage::ToAnnounce | Stage::Announcing);
        let Barrier { op, reply, .. } = self;
        let BarrierOp::Snapshot(name) = op.clone() else {
            let _ = reply.send(Err(error));
            return;
        };
        if !announced {
            let _ = reply.send(Err(error));
            return;
        }
        std::thread::spawn(move || {
            let key = format!("volumes/{volume}");
            let dropped = change_record(&desired, &key, |_, snapshots| {
                snapshots.retain(|s| !(s.name == name && s.taking));
                Ok(())
            });
            if let Err(cleanup) = dropped {
                log::warn!("volume {volume}: snapshot {name} failed, and stays listed as being taken: {cleanup}");
            }
            let _ = reply.send(Err(error));
        });
    }

    /// Records the change (on a helper thread: the store may wait): the
    /// snapshot held by `nodes`, or the new size; then answers the caller.
    /// `nodes` made it (this node first), under `epoch`. The thread ends
    /// once the record is written (or could not be).
    pub(crate) fn record(
        self,
        desired: DesiredState,
        manager: Arc<dyn NodeServices>,
        volume: String,
        epoch: u64,
        nodes: Vec<String>,
    ) -> std::thread::JoinHandle<()> {
        let Barrier { op, reply, .. } = self;
        std::thread::spawn(move || {
            let key = format!("volumes/{volume}");
            let result = match &op {
                BarrierOp::Snapshot(name) => mark_taken(&desired, &key, name, &nodes),
                BarrierOp::Grow(size_bytes) => change_replication(&desired, &key, |r| {
                    record_growth(r, *size_bytes, epoch, &nodes)
                }),
            };
            if result.is_ok() {
                log::info!("volume {volume}: {op} made on {}", nodes.join(", "));
            }
            match (&op, result) {
                // Hosts are served the recorded size: the caller hears back
                // once the exports show it.
                (BarrierOp::Grow(_), Ok(())) => manager.reconcile_then_answer(reply),
                (_, result) => {
                    let _ = reply.send(result);
                }
            }
        })
    }
}

/// The record of a volume grown to `size_bytes` by its primary of `epoch`
/// on the copies of `grown` (its own first): every other copy in sync is
/// faulted in the same change, since it no longer holds the whole volume
/// (it would be promoted, and serve the new size, without the space).
/// Refused if another primary took over meanwhile: its copies are its to grow.
fn record_growth(
    replication: &mut ReplicationRecord,
    size_bytes: u64,
    epoch: u64,
    grown: &[String],
) -> Result<(), AdminError> {
    if replication.epoch != epoch || grown.first() != Some(&replication.primary) {
        return Err(AdminError::Unavailable(
            "the volume's primary changed while it grew; grow it again".into(),
        ));
    }
    replication.size_bytes = replication.size_bytes.max(size_bytes);
    for member in &mut replication.members {
        if member.state == ReplicaState::InSync && !grown.contains(&member.node) {
            log::warn!(
                "replica on {} did not grow with the volume: out of sync",
                member.node
            );
            member.state = ReplicaState::Faulted { epoch };
        }
    }
    Ok(())
}

/// Writes the announcement of snapshot `name` of `volume` (on a helper
/// thread); `done` gets the result.
pub(crate) fn announce_snapshot(
    desired: DesiredState,
    volume: String,
    name: String,
    done: impl FnOnce(Result<(), AdminError>) + Send + 'static,
) {
    std::thread::spawn(move || done(announce(&desired, &format!("volumes/{volume}"), &name)));
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
                AdminError::Unavailable(format!(
                    "snapshot {volume}@{name} was deleted while it was taken; take it again"
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

    fn snapshot() -> Barrier {
        let (reply, _) = mpsc::channel();
        Barrier::new(BarrierOp::Snapshot("s1".into()), 7, reply)
    }

    #[test]
    fn a_snapshot_is_announced_then_waits_for_writes_then_for_every_answer() {
        let mut barrier = snapshot();
        assert!(matches!(barrier.step(true, "v"), Step::Announce));
        assert!(matches!(barrier.step(false, "v"), Step::Waiting));
        assert!(
            !barrier.holds_writes(),
            "nothing held while the store writes"
        );
        assert!(barrier.announced(7, Ok(())).is_none());
        assert!(barrier.holds_writes());
        assert!(matches!(barrier.step(true, "v"), Step::Waiting));
        assert!(matches!(barrier.step(false, "v"), Step::Ask));
        barrier.asked([NodeId(1), NodeId(2)]);
        barrier.local_answer(7, Ok(()));
        barrier.answer(NodeId(2), 7, false);
        barrier.answer(NodeId(1), 6, true);
        assert!(
            matches!(barrier.step(false, "v"), Step::Waiting),
            "an earlier barrier's answer does not count"
        );
        barrier.answer(NodeId(1), 7, true);
        barrier.answer(NodeId(1), 7, false);
        match barrier.step(false, "v") {
            Step::Done(Ok(nodes)) => assert_eq!(nodes, vec![NodeId(1)], "first answer kept"),
            _ => panic!("done"),
        }
    }

    #[test]
    fn the_primarys_own_copy_must_make_the_change() {
        let mut barrier = snapshot();
        barrier.step(false, "v");
        barrier.announced(7, Ok(()));
        barrier.asked([]);
        barrier.local_answer(7, Err("the pool is full".into()));
        match barrier.step(false, "v") {
            Step::Done(Err(error)) => assert!(error.to_string().contains("pool is full")),
            _ => panic!("failed"),
        }
    }

    #[test]
    fn a_failed_announcement_fails_the_barrier_and_growth_needs_none() {
        let mut barrier = snapshot();
        barrier.step(false, "v");
        let refused = AdminError::Invalid("exists".into());
        assert!(barrier.announced(6, Ok(())).is_none(), "another barrier's");
        assert!(barrier.announced(7, Err(refused)).is_some());
        let (reply, _) = mpsc::channel();
        let mut grow = Barrier::new(BarrierOp::Grow(1 << 30), 8, reply);
        assert!(grow.holds_writes());
        assert!(matches!(grow.step(false, "v"), Step::Ask));
    }

    fn three_copies() -> ReplicationRecord {
        let member = |node: &str, state| weft_control::ReplicaRecord {
            node: node.into(),
            pool: "p".into(),
            state,
        };
        ReplicationRecord {
            epoch: 4,
            primary: "n1".into(),
            members: vec![
                member("n1", ReplicaState::InSync),
                member("n2", ReplicaState::InSync),
                member("n3", ReplicaState::Faulted { epoch: 2 }),
            ],
            size_bytes: 16 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            move_to: None,
            previous: None,
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure: None,
            cloned_from: None,
        }
    }

    #[test]
    fn a_growth_faults_the_copies_in_sync_that_did_not_grow() {
        let mut record = three_copies();
        record_growth(&mut record, 32 << 20, 4, &["n1".into()]).unwrap();
        assert_eq!(record.size_bytes, 32 << 20);
        assert_eq!(record.members[1].state, ReplicaState::Faulted { epoch: 4 });
        assert_eq!(
            record.members[2].state,
            ReplicaState::Faulted { epoch: 2 },
            "already out of sync: grows when its node reconciles"
        );
        let mut record = three_copies();
        record_growth(&mut record, 32 << 20, 4, &["n1".into(), "n2".into()]).unwrap();
        assert_eq!(record.members[1].state, ReplicaState::InSync);
    }

    #[test]
    fn a_growth_is_not_recorded_under_another_primary() {
        let mut record = three_copies();
        record.epoch = 5;
        assert!(record_growth(&mut record, 32 << 20, 4, &["n1".into()]).is_err());
        let mut record = three_copies();
        record.primary = "n2".into();
        assert!(record_growth(&mut record, 32 << 20, 4, &["n1".into()]).is_err());
        assert_eq!(record.size_bytes, 16 << 20);
    }
}
