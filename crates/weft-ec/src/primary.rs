//! The primary of an erasure-coded volume, as a state machine.
//!
//! The driver feeds it host commands (`host_*`), the members' answers
//! (`member_reply`), the store's answers to its record changes
//! (`committed`, `commit_failed`, `record_changed`), its lease
//! (`set_lease`) and the time (`tick`), and carries out the [`EcAction`]s
//! it takes from `poll_action`, in order. The `now` it passes never
//! decreases.
//!
//! Its life: **Fencing** every in-sync member with its token; **Recovering**
//! the journals (module `journal`: per stripe the newest update is written
//! in place again if every in-sync member holds it, dropped if not, and
//! every journal slot found is cleared); **Active**, serving the host;
//! **Deposed** as soon as it learns of a newer epoch; **Stalled** when
//! fewer than `k` members are left in sync (it cannot serve, and keeps them
//! in sync in the record so that a later primary can use them again). A
//! primary that ended completes everything it holds with a path error and
//! does nothing more; its driver starts the next one.
//!
//! Serving: a read takes its stripes' locks shared and reads each piece
//! from its member, or rebuilds it from `k` others when that member is
//! not available. A write takes its stripes' locks, reads what it needs of
//! the old stripe (nothing for a whole stripe), computes the parity over
//! the columns it changes, journals each changed member's bytes (in the
//! stripe's own slot), and once all are durable, and no member's fault is
//! left to commit, acknowledges the host and writes the bytes in place
//! (not FUA); the lock is given back once those writes are done, the slot
//! once a flush made them durable (one flush of the members a batch of
//! updates went to, as soon as the one before ended). A host's Flush
//! completes at once: every acknowledged write is durable in the journals.
//!
//! A member that fails an op or does not answer within the member
//! timeout is faulted in the record (compare-and-swap under this epoch)
//! before any write it missed is acknowledged; the stripes written while
//! it is out are remembered, and when it answers a fence again it is
//! rebuilt (only those stripes if it was faulted under this epoch, else
//! all), its journal cleared first, stripe by stripe under the lock and the
//! rebuild bandwidth limit, then put back in sync.
//!
//! What it does not do: pick members or nodes, talk to the store or the
//! network, or decide to become primary (the controller promotes, as for
//! replicated volumes).

mod barrier;
mod jobs;
mod members;
mod rebuild;
mod record;
mod recovery;

pub use barrier::ControlRefused;

use crate::gather::{self, ReadPlan, Want};
use crate::journal::{self, JournalLayout, Record};
use crate::locks::{JobId, StripeLocks};
use crate::messages::{EcAction, FromMember, MemberOp, ToMember};
use crate::{encode, Geometry};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Range;
use std::time::Duration;
use weft_replication::{HostResult, MemberState, NodeId, OpId, RegionSet, ReplicaSet, Token};

/// What a primary needs to know about its volume and its patience.
#[derive(Debug, Clone, Copy)]
pub struct EcConfig {
    /// This node.
    pub me: NodeId,
    /// The layout and chunk size.
    pub geometry: Geometry,
    /// The members' journals.
    pub journal: JournalLayout,
    /// The volume's bytes.
    pub volume_bytes: u64,
    /// A member that has not answered within this long is faulted.
    pub member_timeout: Duration,
    /// How often a faulted member is asked to come back.
    pub reattach_interval: Duration,
    /// Rebuild bytes written per second at most (0: no limit).
    pub rebuild_bytes_per_sec: u64,
}

impl EcConfig {
    /// The volume's stripes.
    pub fn stripes(&self) -> u64 {
        self.volume_bytes.div_ceil(self.geometry.stripe_bytes())
    }

    /// Where column `column` of stripe `stripe` lies in a member's shard volume.
    fn in_place(&self, stripe: u64, column: u32) -> u64 {
        self.journal.data_base()
            + stripe * u64::from(self.geometry.chunk_bytes())
            + u64::from(column)
    }

    /// The shard member `member` holds in stripe `stripe`.
    fn shard_of(&self, member: usize, stripe: u64) -> usize {
        let n = self.geometry.layout().shards() as u64;
        ((member as u64 + n - stripe % n) % n) as usize
    }
}

/// The primary's stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EcPhase {
    /// Fencing the in-sync members.
    Fencing,
    /// Reading and settling the journals.
    Recovering,
    /// Serving.
    Active,
    /// A newer epoch exists: serves nothing.
    Deposed,
    /// Fewer than `k` members are in sync: serves nothing.
    Stalled,
}

/// A rebuild's progress, for the record's readers and /metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildProgress {
    /// The member being rebuilt.
    pub member: usize,
    /// Stripes rebuilt.
    pub done: u64,
    /// Stripes to rebuild in all.
    pub total: u64,
}

#[derive(Debug)]
enum Link {
    /// A fence is on its way (to come back into use if `rejoin`).
    Fencing { deadline: Duration, rejoin: bool },
    /// In sync and in use.
    Up,
    /// Failed; its fault is to be committed.
    Lost,
    /// Out of sync in the record; asked again at `retry_at`.
    Away { retry_at: Duration },
    /// Coming back: its journal is cleared, then its stripes rebuilt.
    Rebuilding(Rebuild),
}

#[derive(Debug)]
struct Rebuild {
    /// Journal slots still being cleared.
    clearing: u32,
    /// Stripes still to rebuild.
    pending: RegionSet,
    /// Where the next stripe is looked for.
    cursor: u32,
    /// The stripe job running, if one is.
    running: Option<JobId>,
    /// It may join once the flushes reach this generation (every update
    /// that skipped it then durable in place); none while stripes remain.
    join_after: Option<u64>,
    done: u64,
    total: u64,
    /// Its return to the in-sync set is being committed.
    joining: bool,
}

#[derive(Debug)]
enum JobKind {
    /// A host write's part in one stripe: (shard, column, bytes) pieces.
    Write {
        host: OpId,
        pieces: Vec<(usize, u32, Vec<u8>)>,
    },
    /// A host read's part: (shard, columns, where in the host's buffer).
    Read {
        host: OpId,
        pieces: Vec<(usize, Range<u32>, usize)>,
    },
    /// One stripe of a member's rebuild.
    Rebuild { member: usize },
}

#[derive(Debug)]
enum Step {
    /// For its lock.
    Locking,
    /// For its reads.
    Reading {
        plan: ReadPlan,
        wants: Vec<Want>,
        reads: Vec<Option<Vec<u8>>>,
    },
    /// For a journal slot: the members' new bytes are ready.
    Slot { changes: Changes },
    /// For the journal writes.
    Journaling { changes: Changes, slot: u32 },
    /// For the in-place writes (to the members in `written`; a write's
    /// journal slot is given back once a flush made them durable).
    Applying { slot: Option<u32>, written: u16 },
}

/// A write job's new bytes: per changed member, its bytes over `columns`.
#[derive(Debug)]
struct Changes {
    columns: Range<u32>,
    changed: u16,
    members: Vec<(usize, Vec<u8>)>,
}

#[derive(Debug)]
struct Job {
    stripe: u64,
    kind: JobKind,
    step: Step,
    /// Member ops outstanding.
    outstanding: usize,
}

impl Job {
    fn writes(&self) -> bool {
        !matches!(self.kind, JobKind::Read { .. })
    }
}

#[derive(Debug)]
enum Purpose {
    /// A job's op (for a read: the index of its read).
    Job { job: JobId, index: usize },
    /// A journal slot read by recovery.
    JournalRead { slot: u32 },
    /// Recovery's redo or clear.
    RecoveryWrite,
    /// A rejoining member's journal being cleared.
    Clear,
    /// A flush of the members applied writes went to.
    Flush,
    /// A control (`barrier`).
    Control,
}

/// An update written in place: its journal slot, its stripe, and the
/// members it was written to.
#[derive(Debug, Clone, Copy)]
struct Applied {
    slot: u32,
    stripe: u64,
    written: u16,
}

#[derive(Debug)]
struct Outstanding {
    member: usize,
    purpose: Purpose,
    deadline: Duration,
}

#[derive(Debug)]
struct HostOp {
    parts_left: usize,
    /// A read's bytes.
    data: Vec<u8>,
    write: bool,
}

#[derive(Debug, Default)]
struct RecoveryState {
    reads_left: usize,
    writes_left: usize,
    found: Vec<(usize, u32, Record)>,
    clear: Vec<(usize, u32)>,
    /// Reading the journals (else redoing, then clearing).
    reading: bool,
    redoing: bool,
    /// A member was lost meanwhile: start again once its fault is committed.
    again: bool,
}

/// The primary of one erasure-coded volume.
#[derive(Debug)]
pub struct EcPrimary {
    config: EcConfig,
    /// The primary's epoch and first session: a member's token is this
    /// with its own session ([`EcPrimary::token_of`]).
    token: Token,
    /// Each member's fence session, counted up each time it is fenced
    /// again: a member keeps the token of the last fence it took (its
    /// answer may have come too late, or its connection failed since), and
    /// refuses a fence with a token no larger.
    sessions: Vec<u32>,
    record: ReplicaSet,
    revision: u64,
    phase: EcPhase,
    lease_until: Duration,
    links: Vec<Link>,
    /// Stripes changed while each member was out (None: unknown, all).
    dirty: Vec<Option<RegionSet>>,
    actions: VecDeque<EcAction>,
    next_op: u64,
    ops: BTreeMap<MemberOp, Outstanding>,
    next_job: JobId,
    jobs: BTreeMap<JobId, Job>,
    locks: StripeLocks,
    host: BTreeMap<OpId, HostOp>,
    /// Journal slots in use (a stripe's records always go to its own
    /// slot, `stripe mod slots`: see `journal`).
    slot_busy: Vec<bool>,
    slot_waiters: VecDeque<JobId>,
    next_seq: u64,
    /// Writes journaled on every member they reached, held until no fault
    /// is left to commit: only then is each record on every member in
    /// sync, so that it may be acknowledged and applied.
    journaled: Vec<JobId>,
    /// Updates written in place, not yet flushed.
    unflushed: Vec<Applied>,
    /// The flush under way: the updates it makes durable, and its members
    /// left to answer.
    flushing: Option<(Vec<Applied>, usize)>,
    /// Flushes done.
    flush_generation: u64,
    /// A record change is being committed.
    committing: bool,
    recovery: RecoveryState,
    rebuild_budget: u64,
    budget_at: Duration,
    /// A control under way, and the writes it holds back.
    barrier: Option<barrier::Barrier>,
}

impl EcPrimary {
    /// The primary of `record` (which names this node, at `revision`),
    /// fencing as `token` (its epoch the record's).
    pub fn new(
        config: EcConfig,
        record: ReplicaSet,
        revision: u64,
        token: Token,
        now: Duration,
    ) -> EcPrimary {
        let n = config.geometry.layout().shards();
        assert_eq!(record.members.len(), n, "a member per shard");
        assert_eq!(record.epoch, token.epoch);
        assert!(n <= 16, "members fit a record's mask");
        let mut primary = EcPrimary {
            token,
            sessions: vec![token.session; n],
            revision,
            phase: EcPhase::Fencing,
            lease_until: Duration::ZERO,
            links: Vec::with_capacity(n),
            dirty: vec![None; n],
            actions: VecDeque::new(),
            next_op: 0,
            ops: BTreeMap::new(),
            next_job: 0,
            jobs: BTreeMap::new(),
            locks: StripeLocks::default(),
            host: BTreeMap::new(),
            slot_busy: vec![false; config.journal.slots as usize],
            slot_waiters: VecDeque::new(),
            next_seq: 1,
            journaled: Vec::new(),
            unflushed: Vec::new(),
            flushing: None,
            flush_generation: 0,
            committing: false,
            recovery: RecoveryState::default(),
            rebuild_budget: 0,
            budget_at: now,
            barrier: None,
            record,
            config,
        };
        for member in 0..n {
            let link = if primary.in_sync(member) {
                let token = primary.token_of(member);
                primary.send(member, ToMember::Fence { token });
                Link::Fencing {
                    deadline: now + config.member_timeout,
                    rejoin: false,
                }
            } else {
                Link::Away { retry_at: now }
            };
            primary.links.push(link);
        }
        primary
    }

    /// Its stage.
    pub fn phase(&self) -> EcPhase {
        self.phase
    }

    /// The record as it knows it.
    pub fn record(&self) -> &ReplicaSet {
        &self.record
    }

    /// Whether it serves the host now (ANA Optimized).
    pub fn optimized(&self, now: Duration) -> bool {
        self.phase == EcPhase::Active && now < self.lease_until && self.moving_to().is_none()
    }

    /// The member's node a planned move hands the volume to (the
    /// record's `move_to`), if one is asked for.
    fn moving_to(&self) -> Option<NodeId> {
        self.record.move_to.filter(|&to| to != self.config.me)
    }

    /// A planned move: once nothing is in flight (new host commands are
    /// refused with ANA Transition meanwhile), commits the next epoch with
    /// the target primary, or drops the move if the target is not an
    /// in-sync member it reaches. It is deposed once that is committed.
    fn hand_over(&mut self) {
        let Some(to) = self.moving_to() else {
            return;
        };
        let busy = !self.jobs.is_empty()
            || !self.journaled.is_empty()
            || !self.host.is_empty()
            || !self.unflushed.is_empty()
            || self.flushing.is_some()
            || self.barrier.is_some();
        let lost = self.links.iter().any(|l| matches!(l, Link::Lost));
        if self.phase != EcPhase::Active || self.committing || busy || lost {
            return;
        }
        let member = usize::from(to.0);
        let reachable = self.in_sync(member) && matches!(self.links[member], Link::Up);
        let next = if reachable {
            self.record.handed_over(to)
        } else {
            ReplicaSet {
                move_to: None,
                ..self.record.clone()
            }
        };
        self.committing = true;
        self.actions.push_back(EcAction::Commit {
            base_revision: self.revision,
            record: next,
        });
    }

    /// The node's lease, as its last renewal has it: it serves until `until`.
    pub fn set_lease(&mut self, until: Duration, _now: Duration) {
        self.lease_until = self.lease_until.max(until);
    }

    /// The next action to carry out.
    pub fn poll_action(&mut self) -> Option<EcAction> {
        self.actions.pop_front()
    }

    /// Rebuilds under way.
    pub fn rebuilds(&self) -> Vec<RebuildProgress> {
        self.links
            .iter()
            .enumerate()
            .filter_map(|(member, link)| match link {
                Link::Rebuilding(r) => Some(RebuildProgress {
                    member,
                    done: r.done,
                    total: r.total,
                }),
                _ => None,
            })
            .collect()
    }

    /// Whether nothing is in flight: no host command, member op or record
    /// change, and every member in sync.
    pub fn is_idle(&self) -> bool {
        self.host.is_empty()
            && self.ops.is_empty()
            && self.unflushed.is_empty()
            && self.flushing.is_none()
            && !self.committing
            && self.barrier.is_none()
            && self.links.iter().all(|l| matches!(l, Link::Up))
    }

    // ---- The host.

    /// A host write of `data` at byte `offset`.
    pub fn host_write(&mut self, op: OpId, offset: u64, data: Vec<u8>, now: Duration) {
        if !self.admits(op, offset, data.len() as u64, now) {
            return;
        }
        let Some((op, offset, data)) = self.hold_write((op, offset, data)) else {
            return;
        };
        let mut parts: BTreeMap<u64, Vec<(usize, u32, Vec<u8>)>> = BTreeMap::new();
        let chunk = u64::from(self.config.geometry.chunk_bytes());
        for piece in self.config.geometry.pieces(offset, data.len() as u64) {
            let at = (piece.volume_offset - offset) as usize;
            let bytes = data[at..at + piece.len as usize].to_vec();
            let column = (piece.member_offset % chunk) as u32;
            parts
                .entry(piece.stripe)
                .or_default()
                .push((piece.shard, column, bytes));
        }
        if parts.is_empty() {
            return self.complete(op, HostResult::Ok, Vec::new());
        }
        self.host.insert(
            op,
            HostOp {
                parts_left: parts.len(),
                data: Vec::new(),
                write: true,
            },
        );
        for (stripe, pieces) in parts {
            self.start_job(stripe, JobKind::Write { host: op, pieces }, now);
        }
    }

    /// A host read of `len` bytes at byte `offset`.
    pub fn host_read(&mut self, op: OpId, offset: u64, len: u32, now: Duration) {
        if !self.admits(op, offset, u64::from(len), now) {
            return;
        }
        let mut parts: BTreeMap<u64, Vec<(usize, Range<u32>, usize)>> = BTreeMap::new();
        let chunk = u64::from(self.config.geometry.chunk_bytes());
        for piece in self.config.geometry.pieces(offset, u64::from(len)) {
            let column = (piece.member_offset % chunk) as u32;
            parts.entry(piece.stripe).or_default().push((
                piece.shard,
                column..column + piece.len,
                (piece.volume_offset - offset) as usize,
            ));
        }
        if parts.is_empty() {
            return self.complete(op, HostResult::Ok, Vec::new());
        }
        self.host.insert(
            op,
            HostOp {
                parts_left: parts.len(),
                data: vec![0; len as usize],
                write: false,
            },
        );
        for (stripe, pieces) in parts {
            self.start_job(stripe, JobKind::Read { host: op, pieces }, now);
        }
    }

    /// A host Flush: every acknowledged write is durable already.
    pub fn host_flush(&mut self, op: OpId, now: Duration) {
        if self.admits(op, 0, 0, now) {
            self.complete(op, HostResult::Ok, Vec::new());
        }
    }

    /// Whether a host command is served; if not, completes it.
    fn admits(&mut self, op: OpId, offset: u64, len: u64, now: Duration) -> bool {
        let result = match self.phase {
            EcPhase::Deposed => Some(HostResult::Inaccessible),
            EcPhase::Active if now < self.lease_until && self.moving_to().is_none() => None,
            _ => Some(HostResult::Transition),
        };
        // Past the size this primary began with: the next one serves it.
        let result =
            result.or((offset + len > self.config.volume_bytes).then_some(HostResult::Transition));
        match result {
            Some(result) => {
                self.complete(op, result, Vec::new());
                false
            }
            None => true,
        }
    }

    fn complete(&mut self, op: OpId, result: HostResult, data: Vec<u8>) {
        self.actions
            .push_back(EcAction::Complete { op, result, data });
    }

    // ---- Ending.

    fn depose(&mut self) {
        self.end(EcPhase::Deposed, HostResult::Inaccessible);
    }

    fn stall(&mut self) {
        self.end(EcPhase::Stalled, HostResult::Transition);
    }

    fn end(&mut self, phase: EcPhase, result: HostResult) {
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        self.phase = phase;
        self.actions
            .retain(|a| !matches!(a, EcAction::Send { .. } | EcAction::Commit { .. }));
        self.ops.clear();
        self.jobs.clear();
        self.locks = StripeLocks::default();
        self.journaled.clear();
        self.drop_barrier(result);
        for (op, _) in std::mem::take(&mut self.host) {
            self.complete(op, result, Vec::new());
        }
    }
}

/// The columns a write's pieces span in their stripe.
fn write_columns(pieces: &[(usize, u32, Vec<u8>)]) -> Range<u32> {
    let start = pieces.iter().map(|(_, c, _)| *c).min().expect("a piece");
    let end = pieces
        .iter()
        .map(|(_, c, b)| c + b.len() as u32)
        .max()
        .expect("a piece");
    start..end
}

#[cfg(test)]
mod tests_support {
    use super::*;
    use crate::messages::MemberControl;
    use crate::Layout;

    pub(super) const MS: Duration = Duration::from_millis(1);

    /// A primary and its members' disks, every message carried at once
    /// (or held, for a member that fell silent).
    pub(super) struct Bench {
        pub(super) primary: EcPrimary,
        pub(super) disks: Vec<Vec<u8>>,
        pub(super) silent: Vec<bool>,
        /// Members that carry out what they are sent but whose answers are
        /// lost on the way back.
        pub(super) answers_lost: Vec<bool>,
        /// The fence token each member's fence holds (a fence with a token
        /// no larger is refused, as a member's target does).
        pub(super) fences: Vec<Token>,
        /// Writes to drop (a crash before they landed), by member.
        pub(super) dropping_in_place: bool,
        pub(super) record: ReplicaSet,
        pub(super) revision: u64,
        pub(super) done: BTreeMap<OpId, (HostResult, Vec<u8>)>,
        pub(super) reads: usize,
        pub(super) now: Duration,
        /// What reached the members and the driver, in order: `j` a
        /// journal write, `w{stripe}` an in-place write, `f` a flush, `c`
        /// a control, `commit` a record change, `done` a control's end.
        pub(super) order: Vec<String>,
        /// The member that fails the controls it is asked.
        pub(super) failing_control: Option<usize>,
        /// The controls done, with the members that made them.
        pub(super) controls_done: Vec<(MemberControl, Vec<usize>)>,
    }

    pub(super) fn config() -> EcConfig {
        let geometry = Geometry::new(Layout::new(4, 2).unwrap(), 4096).unwrap();
        EcConfig {
            me: NodeId(0),
            geometry,
            journal: JournalLayout {
                slots: 4,
                block_bytes: 512,
                chunk_bytes: 4096,
            },
            volume_bytes: 4 * geometry.stripe_bytes(),
            member_timeout: 100 * MS,
            reattach_interval: 50 * MS,
            rebuild_bytes_per_sec: 0,
        }
    }

    impl Bench {
        pub(super) fn new(disks: Option<Vec<Vec<u8>>>, record: ReplicaSet) -> Bench {
            let config = config();
            let bytes = config.journal.data_base() + config.stripes() * 4096;
            let token = Token {
                epoch: record.epoch,
                session: 1,
            };
            let mut bench = Bench {
                primary: EcPrimary::new(config, record.clone(), 1, token, Duration::ZERO),
                disks: disks.unwrap_or_else(|| vec![vec![0; bytes as usize]; 6]),
                silent: vec![false; 6],
                answers_lost: vec![false; 6],
                fences: vec![Token::default(); 6],
                dropping_in_place: false,
                record,
                revision: 1,
                done: BTreeMap::new(),
                reads: 0,
                now: Duration::ZERO,
                order: Vec::new(),
                failing_control: None,
                controls_done: Vec::new(),
            };
            bench
                .primary
                .set_lease(Duration::from_secs(3600), Duration::ZERO);
            bench.run();
            assert_eq!(bench.primary.phase(), EcPhase::Active);
            bench.reads = 0;
            bench
        }

        pub(super) fn run(&mut self) {
            let data_base = self.primary.config.journal.data_base();
            while let Some(action) = self.primary.poll_action() {
                match action {
                    EcAction::Send { member, msg, .. } if self.silent[member] => drop(msg),
                    EcAction::Send { member, msg, .. } => {
                        let disk = &mut self.disks[member];
                        let reply = match msg {
                            ToMember::Fence { token } if token <= self.fences[member] => {
                                let current = Token {
                                    epoch: self.fences[member].epoch,
                                    session: 0,
                                };
                                FromMember::Refused { token, current }
                            }
                            ToMember::Fence { token } => {
                                self.fences[member] = token;
                                FromMember::Fenced { token }
                            }
                            ToMember::Read {
                                token,
                                op,
                                offset,
                                len,
                            } => {
                                self.reads += 1;
                                let at = offset as usize;
                                let data = disk[at..at + len as usize].to_vec();
                                FromMember::Read { token, op, data }
                            }
                            ToMember::Flush { token, op } => {
                                self.order.push("f".into());
                                FromMember::Written { token, op }
                            }
                            ToMember::Control { token, op, .. } => {
                                self.order.push("c".into());
                                if self.failing_control == Some(member) {
                                    FromMember::Failed { token, op }
                                } else {
                                    FromMember::Written { token, op }
                                }
                            }
                            ToMember::Write {
                                token,
                                op,
                                offset,
                                data,
                                ..
                            } => {
                                self.order.push(match offset.checked_sub(data_base) {
                                    Some(at) => format!("w{}", at / 4096),
                                    None => "j".into(),
                                });
                                if !(self.dropping_in_place && offset >= data_base) {
                                    let at = offset as usize;
                                    disk[at..at + data.len()].copy_from_slice(&data);
                                }
                                FromMember::Written { token, op }
                            }
                        };
                        if !self.answers_lost[member] {
                            self.primary.member_reply(member, reply, self.now);
                        }
                    }
                    EcAction::Commit {
                        base_revision,
                        record,
                    } => {
                        assert_eq!(base_revision, self.revision);
                        self.order.push("commit".into());
                        self.revision += 1;
                        self.record = record.clone();
                        self.primary.committed(self.revision, record, self.now);
                    }
                    EcAction::Complete { op, result, data } => {
                        self.done.insert(op, (result, data));
                    }
                    EcAction::ControlDone { control, members } => {
                        self.order.push("done".into());
                        self.controls_done.push((control, members));
                    }
                }
            }
        }

        pub(super) fn write(&mut self, op: u64, offset: u64, data: Vec<u8>) {
            self.primary.host_write(OpId(op), offset, data, self.now);
            self.run();
        }

        pub(super) fn read(&mut self, op: u64, offset: u64, len: u32) -> Vec<u8> {
            self.primary.host_read(OpId(op), offset, len, self.now);
            self.run();
            let (result, data) = self
                .done
                .remove(&OpId(op))
                .unwrap_or_else(|| panic!("the read completed: {:?}", self.primary));
            assert_eq!(result, HostResult::Ok);
            data
        }

        pub(super) fn tick(&mut self, by: Duration) {
            self.now += by;
            self.primary.tick(self.now);
            self.run();
        }
    }

    pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    pub(super) fn record() -> ReplicaSet {
        ReplicaSet::new(&(0..6).map(NodeId).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;
    use weft_replication::Epoch;

    #[test]
    fn writes_read_back_and_a_whole_stripe_is_written_without_reading() {
        let mut bench = Bench::new(None, record());
        let stripe = 4 * 4096;
        bench.write(1, 0, pattern(stripe, 1));
        assert_eq!(bench.reads, 0, "a whole stripe reads nothing");
        assert_eq!(bench.done.remove(&OpId(1)).unwrap().0, HostResult::Ok);
        bench.write(2, 1536, pattern(1536, 2));
        assert_eq!(bench.read(3, 1536, 1536), pattern(1536, 2));
        assert_eq!(bench.read(4, 0, 1536), pattern(stripe, 1)[..1536]);
        // Across two stripes.
        bench.write(5, stripe as u64 - 512, pattern(1024, 5));
        assert_eq!(bench.read(6, stripe as u64 - 512, 1024), pattern(1024, 5));
        assert!(bench.primary.is_idle());
        // A Flush completes at once.
        bench.primary.host_flush(OpId(7), bench.now);
        bench.run();
        assert_eq!(bench.done.remove(&OpId(7)).unwrap().0, HostResult::Ok);
    }

    #[test]
    fn a_silent_member_is_faulted_before_the_write_is_acknowledged_and_read_around() {
        let mut bench = Bench::new(None, record());
        bench.write(1, 0, pattern(16384, 1));
        // Member 1 keeps stripe 0's data shard 1 (bytes 4096..8192).
        bench.silent[1] = true;
        bench.write(2, 4096, pattern(512, 2));
        assert!(!bench.done.contains_key(&OpId(2)), "held for member 1");
        bench.tick(150 * MS);
        assert_eq!(bench.done.remove(&OpId(2)).unwrap().0, HostResult::Ok);
        assert_eq!(
            bench.record.members[1].state,
            MemberState::Faulted { epoch: Epoch(1) }
        );
        // Read around it: rebuilt from the others.
        let mut expected = pattern(16384, 1)[4096..8192].to_vec();
        expected[..512].copy_from_slice(&pattern(512, 2));
        assert_eq!(bench.read(3, 4096, 4096), expected);
        // It answers again: only the stripe it missed is rebuilt.
        bench.silent[1] = false;
        bench.tick(60 * MS);
        assert!(bench.primary.rebuilds().is_empty());
        assert_eq!(bench.record.members[1].state, MemberState::InSync);
        let chunk = bench.primary.config.in_place(0, 0) as usize;
        assert_eq!(&bench.disks[1][chunk..chunk + 4096], expected.as_slice());
    }

    #[test]
    fn a_member_whose_fence_was_taken_but_answered_too_late_is_fenced_again_and_rebuilt() {
        let mut bench = Bench::new(None, record());
        bench.write(1, 0, pattern(16384, 1));
        bench.silent[1] = true;
        bench.write(2, 4096, pattern(512, 2));
        bench.tick(150 * MS);
        assert_eq!(bench.done.remove(&OpId(2)).unwrap().0, HostResult::Ok);
        // It comes back and takes the primary's fence, but its answer is
        // lost (as one that came after the fence's deadline): it is asked
        // again, and a fence no larger than the one it holds is refused.
        bench.silent[1] = false;
        bench.answers_lost[1] = true;
        bench.tick(60 * MS);
        bench.tick(150 * MS);
        bench.answers_lost[1] = false;
        bench.tick(60 * MS);
        bench.tick(60 * MS);
        assert!(bench.primary.rebuilds().is_empty());
        assert_eq!(bench.record.members[1].state, MemberState::InSync);
        let mut expected = pattern(16384, 1)[4096..8192].to_vec();
        expected[..512].copy_from_slice(&pattern(512, 2));
        let chunk = bench.primary.config.in_place(0, 0) as usize;
        assert_eq!(&bench.disks[1][chunk..chunk + 4096], expected.as_slice());
    }

    #[test]
    fn a_write_journaled_but_not_applied_is_applied_by_the_next_primary() {
        let mut bench = Bench::new(None, record());
        bench.write(1, 0, pattern(16384, 1));
        // The primary dies after journaling: no in-place write lands.
        bench.dropping_in_place = true;
        bench.write(2, 512, pattern(1024, 2));
        assert_eq!(bench.done.remove(&OpId(2)).unwrap().0, HostResult::Ok);
        let mut next = bench.record.clone();
        next.epoch = Epoch(2);
        let mut after = Bench::new(Some(bench.disks), next);
        let mut expected = pattern(16384, 1);
        expected[512..1536].copy_from_slice(&pattern(1024, 2));
        assert_eq!(after.read(3, 0, 16384), expected);
        // And the stripe's parity agrees: read around two members.
        after.silent[0] = true;
        after.silent[4] = true;
        after.primary.config.reattach_interval = Duration::from_secs(60);
        after.primary.host_read(OpId(4), 0, 16384, after.now);
        after.run();
        // Member 0 times out, then member 4 the read went to instead.
        after.tick(150 * MS);
        after.tick(150 * MS);
        let (result, data) = after
            .done
            .remove(&OpId(4))
            .unwrap_or_else(|| panic!("read around: {:?}", after.primary));
        assert_eq!((result, data), (HostResult::Ok, expected));
    }
}

#[cfg(test)]
mod move_tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn a_planned_move_drains_then_hands_the_next_epoch_to_the_target() {
        let mut bench = Bench::new(None, record());
        bench.write(1, 0, pattern(4096, 1));
        let mut moving = bench.record.clone();
        moving.move_to = Some(NodeId(3));
        bench.revision += 1;
        bench.record = moving.clone();
        bench
            .primary
            .record_changed(bench.revision, moving, bench.now);
        // New commands wait for the next primary (ANA Transition).
        bench.write(2, 0, pattern(4096, 2));
        assert_eq!(
            bench.done.remove(&OpId(2)).unwrap().0,
            HostResult::Transition
        );
        assert!(!bench.primary.optimized(bench.now));
        bench.tick(MS);
        assert_eq!(bench.record.primary, NodeId(3));
        assert_eq!(bench.record.epoch.0, 2);
        assert_eq!(bench.record.move_to, None);
        assert!(
            bench.record.is_in_sync(NodeId(0)),
            "the old primary's shard stays in sync"
        );
        assert_eq!(bench.primary.phase(), EcPhase::Deposed);
    }
}
