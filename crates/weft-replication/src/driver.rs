//! The rules every shell that runs a [`Primary`] keeps, sans-IO, so that the
//! node's replicator (weft-node) and the simulation (weft-sim) keep them by
//! running this same code rather than two copies of it:
//!
//! - **Starting** ([`plan_start`]): a node that served an epoch before (it
//!   restarted, or its lease lapsed) asks for the next one instead of
//!   serving it again, so that its fences are new; its own record's next
//!   epoch continues its run, any other epoch begins a new one.
//! - **Durable first**: a change to the write intent or to the run
//!   ([`Action::IntentSet`], [`Action::Keep`], [`Action::AllInSync`],
//!   [`Action::Full`]) is made durable before any action after it: the
//!   shell persists it and says so with [`Driver::files_done`]; meanwhile
//!   [`Driver::next_action`] gives nothing.
//! - **Replicas first**: the local I/O polled with a batch goes out after
//!   the messages polled with it, so that the replicas write while this
//!   node does (nothing is acknowledged before both are done).
//! - **Ending** ([`End`]): a primary ends when the core is deposed, when a
//!   durable change failed, when the record was deleted or reshaped (the
//!   shell starts the next primary), or when the shell stops it. From then
//!   on no action of the core is given out, and no local I/O starts: a
//!   deposed primary's write must not reach its copy after the next
//!   primary began copying from it.
//! - **Bounds**: a host write past the size this primary began with
//!   completes with ANA Transition (the volume grew: the primary of the
//!   new size serves it).
//!
//! What it does not do: hold the host's data or replies, or any I/O (the
//! shell's), or decide when the store is asked (the shell's poller, watch
//! and timeouts).

use crate::primary::{Action, HostResult, Primary, PrimaryPhase};
use crate::record::ReplicaSet;
use crate::replica::FromReplica;
use crate::types::{Epoch, Extent, NodeId, OpId};
use std::collections::VecDeque;
use std::time::Duration;

/// How a node named primary by `record` starts (see [`plan_start`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Serve the record's epoch; `continued` if it continues this node's
    /// own run (its write intent's kept regions and members to rebuild in
    /// full still hold), else a new run begins.
    Serve {
        /// The run goes on.
        continued: bool,
    },
    /// Commit this record first (the next epoch), then start again from it.
    NextEpoch(ReplicaSet),
}

/// How node `me`, which `record` names primary and which last served
/// epoch `served` (persisted before it served it), starts.
pub fn plan_start(record: &ReplicaSet, me: NodeId, served: Epoch) -> Start {
    debug_assert_eq!(record.primary, me, "only the named primary starts");
    if record.epoch <= served {
        let mut next = record.clone();
        next.epoch = record.epoch.next();
        next.previous = Some(me);
        return Start::NextEpoch(next);
    }
    Start::Serve {
        continued: record.previous == Some(me) && record.epoch == served.next(),
    }
}

/// Why a primary ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A newer epoch exists, or its lease lapsed.
    Deposed,
    /// A change to its files could not be made durable.
    NotDurable,
    /// Its record was deleted, or its members or size changed: the next
    /// primary (if the record still names this node) starts from it.
    Reshaped,
    /// The shell stopped it.
    Stopped,
}

/// What the host is told of this path (the ANA state).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// Optimized: it serves, under a valid lease.
    Yes,
    /// Optimized, but reads go through the primary too: a promotion's
    /// resync is under way, and a read of a region not yet copied to every
    /// replica waits for its copy ([`Primary::host_read`]); or a replica's
    /// read grant ran out, and reads wait for its renewal.
    Resyncing,
    /// Being set up or handed over: retry, on any path.
    Transition,
    /// Not the primary any more.
    Inaccessible,
}

/// A primary and the rules of its driving.
#[derive(Debug)]
pub struct Driver {
    primary: Primary,
    /// Blocks served (the volume's size when this primary began).
    blocks: u64,
    /// A change to the files is being made durable: nothing until it is.
    files_pending: bool,
    /// Local I/O polled, to go out after the messages polled with it.
    local: VecDeque<Action>,
    /// Actions the driver made (host writes out of bounds), first out.
    made: VecDeque<Action>,
    ended: Option<End>,
}

impl Driver {
    /// Drives `primary`, which serves `blocks` blocks.
    pub fn new(primary: Primary, blocks: u64) -> Driver {
        Driver {
            primary,
            blocks,
            files_pending: false,
            local: VecDeque::new(),
            made: VecDeque::new(),
            ended: None,
        }
    }

    /// The core, to look at.
    pub fn primary(&self) -> &Primary {
        &self.primary
    }

    /// Why it ended, if it did.
    pub fn ended(&self) -> Option<End> {
        match self.ended {
            Some(end) => Some(end),
            None if self.primary.phase() == PrimaryPhase::Deposed => Some(End::Deposed),
            None => None,
        }
    }

    /// Ends it (the first reason stays).
    pub fn end(&mut self, why: End) {
        self.ended.get_or_insert(why);
    }

    /// What the host is told of this path now.
    pub fn serving(&self, now: Duration) -> Serving {
        if self.ended.is_none() && self.primary.optimized(now) {
            Serving::Yes
        } else if self.ended.is_none() && self.primary.serves(now) {
            Serving::Resyncing
        } else if self.ended().is_some() {
            Serving::Inaccessible
        } else {
            Serving::Transition
        }
    }

    /// The next action to carry out, in order, if any now.
    pub fn next_action(&mut self) -> Option<Action> {
        if let Some(action) = self.made.pop_front() {
            return Some(action);
        }
        if self.ended.is_some() {
            self.local.clear();
            return None;
        }
        while !self.files_pending {
            let Some(action) = self.primary.poll_action() else {
                break;
            };
            match action {
                Action::LocalWrite { .. }
                | Action::LocalRead { .. }
                | Action::LocalFlush { .. } => self.local.push_back(action),
                Action::IntentSet(_) | Action::Keep(_) | Action::AllInSync | Action::Full(_) => {
                    self.files_pending = true;
                    return Some(action);
                }
                action => return Some(action),
            }
        }
        self.local.pop_front()
    }

    /// The last change to the files asked for is durable (`true`), or
    /// could not be made so: then this primary ends there.
    pub fn files_done(&mut self, durable: bool) {
        debug_assert!(self.files_pending, "a change was asked for");
        self.files_pending = false;
        if !durable {
            self.end(End::NotDurable);
        }
    }

    /// The time is `now`, and this node's lease runs until `lease_until`.
    pub fn tick(&mut self, lease_until: Duration, now: Duration) {
        self.primary.set_lease(lease_until, now);
        self.primary.tick(now);
    }

    /// A host write of `extent` (its data is the shell's, under `op`, an id
    /// never given before).
    pub fn host_write(&mut self, op: OpId, extent: Extent, fua: bool, now: Duration) {
        if extent.end() > self.blocks {
            let result = HostResult::Transition;
            return self.made.push_back(Action::Complete { op, result });
        }
        self.primary.host_write(op, extent, fua, now);
    }

    /// A host read of `extent`.
    pub fn host_read(&mut self, op: OpId, extent: Extent, now: Duration) {
        if extent.end() > self.blocks {
            let result = HostResult::Transition;
            return self.made.push_back(Action::Complete { op, result });
        }
        self.primary.host_read(op, extent, now);
    }

    /// A host flush.
    pub fn host_flush(&mut self, op: OpId, now: Duration) {
        self.primary.host_flush(op, now);
    }

    /// The local I/O of `op` completed.
    pub fn local_done(&mut self, op: OpId, now: Duration) {
        self.primary.local_done(op, now);
    }

    /// The local I/O of `op` failed: this node's copy did (a disk error,
    /// a failed pool), and the primary hands over if it can.
    pub fn local_failed(&mut self, op: OpId, now: Duration) {
        self.primary.local_failed(op, now);
    }

    /// A replica answered.
    pub fn replica_reply(&mut self, from: NodeId, reply: FromReplica, now: Duration) {
        self.primary.replica_reply(from, reply, now);
    }

    /// The record change asked for was committed at `revision`.
    pub fn committed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        self.primary.committed(revision, record, now);
    }

    /// The record change failed: the record changed meanwhile (`current`),
    /// or its answer never came (`None`: it may have been made or not).
    pub fn commit_failed(&mut self, current: Option<(u64, ReplicaSet)>, now: Duration) {
        self.primary.commit_failed(current, now);
    }

    /// The record as the store holds it at `revision`.
    pub fn record_changed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        self.primary.record_changed(revision, record, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primary::{PrimaryConfig, Run, ToReplica};
    use crate::record::{Member, MemberState};
    use crate::regions::RegionSet;
    use crate::types::{Geometry, Token};

    const ME: NodeId = NodeId(0);
    const OTHER: NodeId = NodeId(1);

    fn record(epoch: u64, previous: Option<NodeId>) -> ReplicaSet {
        ReplicaSet {
            epoch: Epoch(epoch),
            primary: ME,
            members: [ME, OTHER]
                .into_iter()
                .map(|node| Member {
                    node,
                    state: MemberState::InSync,
                })
                .collect(),
            move_to: None,
            previous,
            retire: Vec::new(),
        }
    }

    /// An active primary with its replica in sync (fenced and answered).
    fn active() -> Driver {
        let driver = fenced(&[]);
        assert_eq!(driver.serving(ZERO), Serving::Yes);
        driver
    }

    /// A primary whose replica answered its fence with `intent` (regions).
    fn fenced(intent: &[u32]) -> Driver {
        let geometry = Geometry {
            blocks: 16,
            region_blocks: 4,
        };
        let config = PrimaryConfig {
            me: ME,
            geometry,
            replica_timeout: Duration::from_secs(2),
            reattach_interval: Duration::from_secs(1),
            copies_in_flight_max: 4,
            clean_delay: Duration::from_secs(2),
            read_grant: Duration::from_millis(800),
        };
        let regions = geometry.regions();
        let run = Run::new(Epoch(1), regions);
        let primary = Primary::new(
            config,
            record(1, None),
            1,
            RegionSet::new(regions),
            run,
            ZERO,
        );
        let mut driver = Driver::new(primary, geometry.blocks);
        driver.tick(Duration::from_secs(10), ZERO);
        while let Some(action) = driver.next_action() {
            if let Action::Send {
                to,
                msg: ToReplica::Fence { token },
            } = action
            {
                let mut regions = RegionSet::new(regions);
                for &region in intent {
                    regions.insert(region);
                }
                let fenced = FromReplica::Fenced {
                    token,
                    intent: regions,
                    unclean: false,
                };
                driver.replica_reply(to, fenced, ZERO);
            }
        }
        driver
    }

    #[test]
    fn a_resyncing_primary_serves_with_reads_through_it() {
        let driver = fenced(&[2]);
        assert_eq!(driver.serving(ZERO), Serving::Resyncing);
        assert_eq!(
            driver.serving(Duration::from_secs(10)),
            Serving::Transition,
            "the lease ended"
        );
    }

    const ZERO: Duration = Duration::ZERO;

    fn token_of(action: &Action) -> Option<Token> {
        match action {
            Action::Send {
                msg: ToReplica::Write { token, .. },
                ..
            } => Some(*token),
            _ => None,
        }
    }

    #[test]
    fn a_served_epoch_is_never_served_again_and_only_its_own_next_continues_the_run() {
        let next = match plan_start(&record(3, None), ME, Epoch(3)) {
            Start::NextEpoch(next) => next,
            other => panic!("served already: {other:?}"),
        };
        assert_eq!((next.epoch, next.previous), (Epoch(4), Some(ME)));
        assert_eq!(
            plan_start(&next, ME, Epoch(3)),
            Start::Serve { continued: true }
        );
        let promoted = record(4, Some(OTHER));
        assert_eq!(
            plan_start(&promoted, ME, Epoch(3)),
            Start::Serve { continued: false },
            "promoted by the controller: a run of its own"
        );
        assert_eq!(
            plan_start(&record(6, Some(ME)), ME, Epoch(3)),
            Start::Serve { continued: false },
            "epochs between were someone else's"
        );
    }

    #[test]
    fn nothing_goes_out_after_a_change_to_the_files_until_it_is_durable() {
        let mut driver = active();
        driver.host_write(
            OpId(1),
            Extent {
                block: 0,
                blocks: 1,
            },
            false,
            ZERO,
        );
        assert_eq!(driver.next_action(), Some(Action::IntentSet(0)));
        assert_eq!(driver.next_action(), None, "the intent is not durable yet");
        driver.files_done(true);
        let rest: Vec<Action> = std::iter::from_fn(|| driver.next_action()).collect();
        let local = rest
            .iter()
            .position(|a| matches!(a, Action::LocalWrite { .. }))
            .expect("the local write");
        let sent = rest
            .iter()
            .position(|a| token_of(a).is_some())
            .expect("sent");
        assert!(sent < local, "the replica's write goes out first: {rest:?}");
    }

    #[test]
    fn a_change_that_cannot_be_made_durable_ends_the_primary_and_nothing_follows() {
        let mut driver = active();
        driver.host_write(
            OpId(1),
            Extent {
                block: 0,
                blocks: 1,
            },
            false,
            ZERO,
        );
        assert_eq!(driver.next_action(), Some(Action::IntentSet(0)));
        driver.files_done(false);
        assert_eq!(driver.ended(), Some(End::NotDurable));
        assert_eq!(driver.next_action(), None, "neither sent nor written");
        assert_eq!(driver.serving(ZERO), Serving::Inaccessible);
    }

    #[test]
    fn no_local_io_starts_once_it_ended() {
        let mut driver = active();
        driver.host_write(
            OpId(1),
            Extent {
                block: 4,
                blocks: 1,
            },
            false,
            ZERO,
        );
        assert_eq!(driver.next_action(), Some(Action::IntentSet(1)));
        driver.files_done(true);
        let sent = driver.next_action().expect("the replica's write");
        assert!(token_of(&sent).is_some(), "{sent:?}");
        driver.end(End::Stopped);
        assert_eq!(driver.next_action(), None, "the local write is dropped");
    }

    #[test]
    fn a_write_past_the_size_it_began_with_is_for_the_next_primary() {
        let mut driver = active();
        driver.host_write(
            OpId(7),
            Extent {
                block: 15,
                blocks: 2,
            },
            false,
            ZERO,
        );
        let result = HostResult::Transition;
        assert_eq!(
            driver.next_action(),
            Some(Action::Complete {
                op: OpId(7),
                result
            })
        );
    }

    #[test]
    fn a_newer_epoch_in_the_record_deposes_it() {
        let mut driver = active();
        let mut newer = record(2, None);
        newer.primary = OTHER;
        driver.record_changed(5, newer, ZERO);
        assert_eq!(driver.ended(), Some(End::Deposed));
        assert_eq!(driver.serving(ZERO), Serving::Inaccessible);
    }
}
