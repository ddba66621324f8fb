//! Controls made on every in-sync member at one point of the write stream
//! ([`EcPrimary::control`]): growing their shard volumes before the
//! volume grows, or taking a snapshot of each.
//!
//! 1. From the call on, host writes are held back (reads go on).
//! 2. Once no write is in flight, every update is written in place and
//!    flushed, and no fault is left to commit, each member in sync and in
//!    use is sent the control (behind everything sent before it).
//! 3. A member that fails it, or does not answer within the member
//!    timeout, is lost and faulted as for any op.
//! 4. Once every member answered and no fault is left to commit, the
//!    driver hears [`EcAction::ControlDone`] with the members that made it,
//!    and the held writes go on in the order they came.
//!
//! So every member's snapshot holds the same updates, each wholly: those
//! acknowledged before the call, and none held back (a stripe whose
//! update reached one member's snapshot and not another's would decode to
//! neither its old nor its new self).
//!
//! What this does not do: record the outcome (the driver records a
//! snapshot's holders, or the new size, which the next primary serves).

use super::{EcAction, EcPhase, EcPrimary, JobKind, Link, Purpose};
use crate::messages::{MemberControl, ToMember};
use std::collections::VecDeque;
use std::time::Duration;
use weft_replication::OpId;

/// Why a control was not begun.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ControlRefused {
    /// The primary does not serve now (starting, handing over, ended).
    #[error("the primary is being set up, handed over or has ended; try again in a moment")]
    NotServing,
    /// Another control is under way.
    #[error("a snapshot or growth is under way; try again when it is done")]
    Busy,
}

/// A control under way.
#[derive(Debug)]
pub(super) struct Barrier {
    control: MemberControl,
    stage: Stage,
    /// Host writes held back meanwhile, in the order they came.
    held: VecDeque<(OpId, u64, Vec<u8>)>,
}

#[derive(Debug)]
enum Stage {
    /// Waiting for the writes in flight to settle.
    Draining,
    /// The members were asked: answers still to come, and who made it.
    Asked { left: usize, made: Vec<usize> },
}

impl EcPrimary {
    /// Makes `control` on every member in sync at one point of the write
    /// stream; the driver hears [`EcAction::ControlDone`].
    pub fn control(&mut self, control: MemberControl, now: Duration) -> Result<(), ControlRefused> {
        if !self.optimized(now) {
            return Err(ControlRefused::NotServing);
        }
        if self.barrier.is_some() {
            return Err(ControlRefused::Busy);
        }
        self.barrier = Some(Barrier {
            control,
            stage: Stage::Draining,
            held: VecDeque::new(),
        });
        self.barrier_progress(now);
        Ok(())
    }

    /// Holds a host write back while a control is under way: it is given
    /// back if none is.
    pub(super) fn hold_write(
        &mut self,
        write: (OpId, u64, Vec<u8>),
    ) -> Option<(OpId, u64, Vec<u8>)> {
        match &mut self.barrier {
            Some(barrier) => {
                barrier.held.push_back(write);
                None
            }
            None => Some(write),
        }
    }

    /// Moves the control under way on, if it can.
    pub(super) fn barrier_progress(&mut self, now: Duration) {
        if self.phase != EcPhase::Active {
            return;
        }
        let settled = self.faults_settled();
        match self.barrier.as_ref().map(|b| &b.stage) {
            Some(Stage::Draining) if settled && self.writes_settled() => self.ask_members(now),
            Some(Stage::Asked { left: 0, .. }) if settled => self.end_barrier(now),
            _ => {}
        }
    }

    /// A member answered the control (`made`), or was lost before it did.
    pub(super) fn control_answered(&mut self, member: usize, made: bool) {
        if let Some(Barrier {
            stage: Stage::Asked { left, made: list },
            ..
        }) = &mut self.barrier
        {
            *left -= 1;
            if made {
                list.push(member);
            }
        }
    }

    /// Completes every held write with `result` (the primary ended).
    pub(super) fn drop_barrier(&mut self, result: weft_replication::HostResult) {
        if let Some(barrier) = self.barrier.take() {
            for (op, ..) in barrier.held {
                self.complete(op, result, Vec::new());
            }
        }
    }

    /// No fault is being committed or left to commit.
    fn faults_settled(&self) -> bool {
        !self.committing && !self.links.iter().any(|l| matches!(l, Link::Lost))
    }

    /// No host write in flight, and every update durable in place.
    fn writes_settled(&self) -> bool {
        let writing = self
            .jobs
            .values()
            .any(|j| matches!(j.kind, JobKind::Write { .. }));
        !writing
            && self.journaled.is_empty()
            && self.unflushed.is_empty()
            && self.flushing.is_none()
    }

    fn ask_members(&mut self, now: Duration) {
        let control = self.barrier.as_ref().expect("a barrier").control.clone();
        let members: Vec<usize> = (0..self.links.len())
            .filter(|&m| matches!(self.links[m], Link::Up))
            .collect();
        for &member in &members {
            let op = self.member_op(member, Purpose::Control, now);
            let msg = ToMember::Control {
                token: self.token_of(member),
                op,
                control: control.clone(),
            };
            self.send(member, msg);
        }
        let barrier = self.barrier.as_mut().expect("a barrier");
        barrier.stage = Stage::Asked {
            left: members.len(),
            made: Vec::new(),
        };
        self.barrier_progress(now);
    }

    fn end_barrier(&mut self, now: Duration) {
        let barrier = self.barrier.take().expect("a barrier");
        let Stage::Asked { made, .. } = barrier.stage else {
            unreachable!("ended once asked");
        };
        self.actions.push_back(EcAction::ControlDone {
            control: barrier.control,
            members: made,
        });
        for (op, offset, data) in barrier.held {
            self.host_write(op, offset, data, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::*;
    use super::*;
    use weft_replication::{Epoch, HostResult, MemberState};

    #[test]
    fn a_control_waits_for_the_writes_in_flight_and_holds_back_the_next() {
        let mut bench = Bench::new(None, record());
        let stripe = 4 * 4096u64;
        // Write 1 in flight (its reads not yet carried), then the control,
        // then write 2, to the next stripe.
        bench
            .primary
            .host_write(OpId(1), 0, pattern(512, 1), bench.now);
        let snapshot = MemberControl::Snapshot { name: "s1".into() };
        bench.primary.control(snapshot.clone(), bench.now).unwrap();
        assert_eq!(
            bench.primary.control(snapshot.clone(), bench.now),
            Err(ControlRefused::Busy)
        );
        bench
            .primary
            .host_write(OpId(2), stripe, pattern(512, 2), bench.now);
        bench.run();
        // Write 1 wholly in place and flushed, then every member's
        // control, then write 2.
        let order = bench.order.join(" ");
        assert!(
            order.starts_with("j j j w0 w0 w0 f f f c c c c c c done j j j w1 w1 w1 f f f"),
            "{order}"
        );
        assert_eq!(bench.controls_done, vec![(snapshot, (0..6).collect())]);
        assert_eq!(bench.done.remove(&OpId(1)).unwrap().0, HostResult::Ok);
        assert_eq!(bench.done.remove(&OpId(2)).unwrap().0, HostResult::Ok);
        assert_eq!(bench.read(3, stripe, 512), pattern(512, 2));
        assert!(bench.primary.is_idle());
    }

    #[test]
    fn a_member_that_fails_a_control_is_faulted_before_the_control_ends() {
        let mut bench = Bench::new(None, record());
        bench.failing_control = Some(2);
        let grow = MemberControl::Grow {
            shard_bytes: 1 << 20,
        };
        bench.primary.control(grow.clone(), bench.now).unwrap();
        bench.run();
        assert_eq!(bench.order.join(" "), "c c c c c c commit done");
        assert_eq!(bench.controls_done, vec![(grow, vec![0, 1, 3, 4, 5])]);
        assert_eq!(
            bench.record.members[2].state,
            MemberState::Faulted { epoch: Epoch(1) }
        );
    }

    #[test]
    fn held_writes_are_answered_when_the_primary_ends_and_no_control_ends() {
        let mut bench = Bench::new(None, record());
        bench
            .primary
            .host_write(OpId(1), 0, pattern(512, 1), bench.now);
        let grow = MemberControl::Grow {
            shard_bytes: 1 << 20,
        };
        bench.primary.control(grow, bench.now).unwrap();
        bench
            .primary
            .host_write(OpId(2), 0, pattern(512, 2), bench.now);
        // A newer epoch deposes it before anything is carried.
        let mut newer = bench.record.clone();
        newer.epoch = Epoch(2);
        bench.primary.record_changed(5, newer, bench.now);
        bench.run();
        assert_eq!(bench.primary.phase(), EcPhase::Deposed);
        assert_eq!(bench.done[&OpId(2)].0, HostResult::Inaccessible);
        assert!(bench.controls_done.is_empty());
        // Not serving: refused.
        let grow = MemberControl::Grow {
            shard_bytes: 1 << 20,
        };
        assert_eq!(
            bench.primary.control(grow, bench.now),
            Err(ControlRefused::NotServing)
        );
    }
}
