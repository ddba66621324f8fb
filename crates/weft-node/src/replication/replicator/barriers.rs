//! The replicator's part in a barrier (`crate::replication::barrier`): a
//! snapshot or a growth made at one point of the write stream on every copy
//! in sync, the host's writes held back meanwhile.

use super::*;

impl Replicator {
    /// A barrier asked for: made unless one is under way or this node
    /// does not serve now.
    pub(super) fn begin_barrier(&mut self, op: BarrierOp, reply: Sender<Result<(), AdminError>>) {
        let refusal = if self.barrier.is_some() {
            Some(format!(
                "volume {}: a snapshot or growth is under way; try again when it is done",
                self.volume
            ))
        } else if self.serving != Serving::Yes {
            Some(format!(
                "volume {}: its primary is being set up, resynced or handed over; try again in a moment",
                self.volume
            ))
        } else {
            None
        };
        match refusal {
            Some(refusal) => {
                let _ = reply.send(Err(AdminError::Unavailable(refusal)));
            }
            None => {
                self.barriers += 1;
                if let BarrierOp::Snapshot(name) = &op {
                    *self.taking.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(name.clone());
                }
                self.barrier = Some(Barrier::new(op, self.barriers, reply));
            }
        }
    }

    /// Ends the barrier under way with `error`; the held writes go on.
    pub(super) fn fail_barrier(&mut self, error: AdminError) {
        if let Some(barrier) = self.barrier.take() {
            barrier.fail(error, self.desired.clone(), self.volume.clone());
        }
        self.barrier_ended();
    }

    /// The barrier is over: nothing is taken now, and the held writes go on
    /// in the order they came.
    pub(super) fn barrier_ended(&mut self) {
        *self.taking.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let now = self.lease.now();
        for io in std::mem::take(&mut self.held) {
            self.host(io, now);
        }
    }

    /// Moves the barrier under way on (see `super::barrier`).
    pub(super) fn advance_barrier(&mut self) {
        let Some(barrier) = &mut self.barrier else {
            return;
        };
        let host_io_in_flight = self.ops.values().any(|op| op.reply.is_some());
        match barrier.step(host_io_in_flight, &self.volume) {
            Step::Waiting => {}
            Step::Announce => {
                let BarrierOp::Snapshot(name) = barrier.op.clone() else {
                    unreachable!("only snapshots are announced")
                };
                let (seq, events) = (barrier.seq, self.events.clone());
                let announced = move |result| {
                    let _ = events.send(Event::BarrierAnnounced { seq, result });
                };
                announce_snapshot(self.desired.clone(), self.volume.clone(), name, announced);
            }
            Step::Ask => {
                let in_sync: Vec<NodeId> = self
                    .driver
                    .primary()
                    .links()
                    .into_iter()
                    .filter(|&(node, state)| state == "in-sync" && self.links.contains(node))
                    .map(|(node, _)| node)
                    .collect();
                let (seq, op) = (barrier.seq, barrier.op.clone());
                for node in &in_sync {
                    let op = op.clone();
                    self.links.send(*node, Outgoing::Barrier { seq, op });
                }
                barrier.asked(in_sync);
                self.barrier_local(seq, &op);
            }
            Step::Done(Ok(_)) if !self.driver.primary().optimized(self.lease.now()) => {
                // The lease, or a replica's read grant, lapsed meanwhile:
                // another primary may write to this node's copy through its
                // replica subsystem already.
                let error = format!(
                    "volume {}: its primary's lease or a replica's read grant lapsed during its {}; try again",
                    self.volume, barrier.op
                );
                self.fail_barrier(AdminError::Unavailable(error));
            }
            Step::Done(Ok(replicas)) => {
                let barrier = self.barrier.take().expect("under way");
                let grown = matches!(barrier.op, BarrierOp::Grow(_));
                let mut nodes = vec![self.me.clone()];
                nodes.extend(replicas.into_iter().map(|node| {
                    weft_cluster::replicas::node_name(&self.replication, node).to_string()
                }));
                let epoch = self.replication.epoch;
                let (desired, manager) = (self.desired.clone(), self.manager.clone());
                let recording = barrier.record(desired, manager, self.volume.clone(), epoch, nodes);
                if grown {
                    // The core serves a fixed size, and this node's copy
                    // has a new chunk map: a primary of the new size takes
                    // over (the next epoch); the held writes retry there.
                    self.driver.end(End::Reshaped);
                    for io in std::mem::take(&mut self.held) {
                        io.reply
                            .send(VolumeOutcome::Done(Err(IoError::PathTransition)));
                    }
                    // The next primary starts once this one ends: after the
                    // size is recorded under this epoch, so that it serves it
                    // (its drain waits for the recording).
                    self.recording = Some(recording);
                }
                self.barrier_ended();
            }
            Step::Done(Err(error)) => self.fail_barrier(error),
        }
    }

    /// Asks the manager to make the barrier's change on this node's copy.
    pub(super) fn barrier_local(&self, seq: u64, op: &BarrierOp) {
        let work = match op {
            BarrierOp::Snapshot(name) => {
                SnapshotName::new(name.as_bytes()).map(VolumeWork::Snapshot)
            }
            BarrierOp::Grow(size_bytes) => Some(VolumeWork::Grow {
                size_bytes: *size_bytes,
            }),
        };
        let Some(work) = work else {
            let result = Err("not a snapshot name".to_string());
            let _ = self.events.send(Event::BarrierLocal { seq, result });
            return;
        };
        let (sender, answer) = mpsc::channel();
        self.manager.change_copy(VolumeRequest {
            pool: self.pool.clone(),
            volume: self.volume.clone(),
            work,
            reply: VolumeReply::channel(sender),
        });
        let events = self.events.clone();
        std::thread::spawn(move || {
            let result = match answer.recv() {
                Ok(VolumeOutcome::Done(Ok(()))) => Ok(()),
                Ok(VolumeOutcome::Done(Err(IoError::NoSpace))) => {
                    Err("its pool is full, or its metadata is".to_string())
                }
                Ok(VolumeOutcome::Done(Err(_))) | Ok(VolumeOutcome::Retry) | Err(_) => {
                    Err("the volume manager refused it (its log says why)".to_string())
                }
            };
            let _ = events.send(Event::BarrierLocal { seq, result });
        });
    }
}
