//! The primary's part in a snapshot or a growth of an erasure-coded
//! volume: the record's side as for a replicated volume
//! (`crate::replication::barrier`: a snapshot announced first, its holders
//! or the new size recorded after), the members' side in the core
//! (`weft_ec::EcPrimary::control`: writes held back and settled, then
//! every member in sync asked).
//!
//! - A snapshot is kept only if at least `k` members took it: fewer
//!   cannot give its data back. Otherwise it leaves the record, and each
//!   node deletes what it took.
//! - A growth is recorded with the members that grew (every other member
//!   in sync is faulted in the same change); the record's new size ends
//!   this primary, and the next one (a new epoch) serves it.
//!
//! What this does not do: hold writes or ask members (the core does), or
//! grow shards out of sync (their nodes do, after the record).

use super::{not_serving, Event, Server};
use crate::admin_error::AdminError;
use crate::replication::barrier::{announce_snapshot, Barrier, BarrierOp, Step};
use std::sync::mpsc::Sender;
use weft_ec::MemberControl;

impl Server {
    /// A snapshot or growth asked for: begun unless one is under way or
    /// the primary does not serve now.
    pub(super) fn begin_barrier(&mut self, op: BarrierOp, reply: Sender<Result<(), AdminError>>) {
        let now = self.lease.now();
        if self.barrier.is_some() {
            let _ = reply.send(Err(AdminError::Unavailable(format!(
                "volume {}: a snapshot or growth is under way; try again when it is done",
                self.volume
            ))));
            return;
        }
        if !self.primary.optimized(now) {
            let _ = reply.send(Err(not_serving()));
            return;
        }
        self.barriers += 1;
        let mut barrier = Barrier::new(op.clone(), self.barriers, reply);
        match op {
            BarrierOp::Snapshot(name) => {
                // To the announcing stage (a snapshot starts there).
                let step = barrier.step(false, &self.volume);
                debug_assert!(matches!(step, Step::Announce));
                self.barrier = Some(barrier);
                let (events, seq) = (self.events.clone(), self.barriers);
                announce_snapshot(
                    self.desired.clone(),
                    self.volume.clone(),
                    name,
                    move |result| {
                        let _ = events.send(Event::Announced { seq, result });
                    },
                );
            }
            BarrierOp::Grow(size_bytes) => {
                self.barrier = Some(barrier);
                let mut grown = self.replication.clone();
                grown.size_bytes = size_bytes;
                let erasure = grown.erasure.expect("erasure-coded");
                match super::super::shard_bytes(&grown, &erasure) {
                    Some(shard_bytes) => self.control(MemberControl::Grow { shard_bytes }),
                    None => self.fail_barrier(AdminError::Invalid(format!(
                        "volume {}: its layout is not one this node makes",
                        self.volume
                    ))),
                }
            }
        }
    }

    /// The snapshot's announcement was written: the members are asked.
    pub(super) fn announced(&mut self, seq: u64, result: Result<(), AdminError>) {
        let Some(barrier) = &mut self.barrier else {
            return;
        };
        if let Some(error) = barrier.announced(seq, result) {
            return self.fail_barrier(error);
        }
        if let BarrierOp::Snapshot(name) = &barrier.op {
            let name = name.clone();
            self.control(MemberControl::Snapshot { name });
        }
    }

    fn control(&mut self, control: MemberControl) {
        let now = self.lease.now();
        if let Err(refused) = self.primary.control(control, now) {
            let error = format!("volume {}: {refused}", self.volume);
            self.fail_barrier(AdminError::Unavailable(error));
        }
    }

    /// The members in `members` made the control: recorded, then answered.
    pub(super) fn barrier_done(&mut self, members: &[usize]) {
        let Some(barrier) = self.barrier.take() else {
            return;
        };
        let erasure = self.replication.erasure.expect("erasure-coded");
        let mut nodes: Vec<String> = members
            .iter()
            .map(|&m| self.replication.members[m].node.clone())
            .collect();
        match &barrier.op {
            BarrierOp::Snapshot(name) if members.len() < erasure.data_shards as usize => {
                let error = AdminError::Unavailable(format!(
                    "snapshot {}@{name}: only {} of its members took it, and {} are needed to read it; take it again",
                    self.volume,
                    members.len(),
                    erasure.data_shards
                ));
                return barrier.fail(error, self.desired.clone(), self.volume.clone());
            }
            BarrierOp::Snapshot(_) => {}
            // Made by this primary: its node first, as the record asks.
            BarrierOp::Grow(_) => nodes.insert(0, self.replication.primary.clone()),
        }
        let (desired, manager) = (self.desired.clone(), std::sync::Arc::clone(&self.manager));
        let epoch = self.replication.epoch;
        drop(barrier.record(desired, manager, self.volume.clone(), epoch, nodes));
    }

    /// Ends the barrier under way, if any, with `error`.
    pub(super) fn fail_barrier(&mut self, error: AdminError) {
        if let Some(barrier) = self.barrier.take() {
            barrier.fail(error, self.desired.clone(), self.volume.clone());
        }
    }
}
