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
    token: Token,
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

    // ---- Jobs.

    fn start_job(&mut self, stripe: u64, kind: JobKind, now: Duration) -> JobId {
        let id = self.next_job;
        self.next_job += 1;
        let job = Job {
            stripe,
            kind,
            step: Step::Locking,
            outstanding: 0,
        };
        let granted = self.locks.acquire(stripe, id, job.writes());
        self.jobs.insert(id, job);
        if granted {
            self.begin_reads(id, now);
        }
        id
    }

    /// The job has its lock: plans and sends its reads.
    fn begin_reads(&mut self, id: JobId, now: Duration) {
        let job = &self.jobs[&id];
        let stripe = job.stripe;
        let wants = match &job.kind {
            JobKind::Read { pieces, .. } => pieces
                .iter()
                .map(|(shard, columns, _)| Want {
                    shard: *shard,
                    columns: columns.clone(),
                })
                .collect(),
            JobKind::Write { pieces, .. } => {
                let columns = write_columns(pieces);
                (0..self.config.geometry.layout().data())
                    .filter(|&shard| {
                        !pieces.iter().any(|(s, column, bytes)| {
                            *s == shard
                                && *column == columns.start
                                && bytes.len() == (columns.end - columns.start) as usize
                        })
                    })
                    .map(|shard| Want {
                        shard,
                        columns: columns.clone(),
                    })
                    .collect()
            }
            JobKind::Rebuild { member } => vec![Want {
                shard: self.config.shard_of(*member, stripe),
                columns: 0..self.config.geometry.chunk_bytes(),
            }],
        };
        let layout = self.config.geometry.layout();
        let readable = |shard: usize| {
            matches!(
                self.links[self.config.geometry.member_of(stripe, shard)],
                Link::Up
            )
        };
        let Some(plan) = gather::plan(layout, &wants, readable) else {
            // Fewer than k members: faulting them would have stalled.
            return self.stall();
        };
        let reads = plan.reads();
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = reads.len();
        job.step = Step::Reading {
            plan,
            wants,
            reads: vec![None; reads.len()],
        };
        if reads.is_empty() {
            return self.reads_done(id, now);
        }
        for (index, want) in reads.into_iter().enumerate() {
            let member = self.config.geometry.member_of(stripe, want.shard);
            let offset = self.config.in_place(stripe, want.columns.start);
            let len = want.columns.end - want.columns.start;
            let op = self.member_op(member, Purpose::Job { job: id, index }, now);
            self.send(
                member,
                ToMember::Read {
                    token: self.token,
                    op,
                    offset,
                    len,
                },
            );
        }
    }

    fn reads_done(&mut self, id: JobId, now: Duration) {
        let layout = self.config.geometry.layout();
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Reading { plan, wants, reads } = std::mem::replace(&mut job.step, Step::Locking)
        else {
            unreachable!("a job done reading was reading")
        };
        let reads: Vec<Vec<u8>> = reads.into_iter().map(|r| r.expect("every read")).collect();
        let got = gather::solve(layout, &plan, &wants, reads).expect("k shards rebuild the rest");
        let stripe = job.stripe;
        match &job.kind {
            JobKind::Read { host, pieces } => {
                let host = *host;
                let op = self.host.get_mut(&host).expect("the host read");
                for ((_, _, at), bytes) in pieces.iter().zip(got) {
                    op.data[*at..*at + bytes.len()].copy_from_slice(&bytes);
                }
                self.finish_job(id, now);
                self.part_done(host, now);
            }
            JobKind::Write { .. } => {
                let JobKind::Write { pieces, .. } = &self.jobs[&id].kind else {
                    unreachable!("a write")
                };
                let changes = self.changes(stripe, pieces, &wants, got);
                let job = self.jobs.get_mut(&id).expect("the job");
                job.step = Step::Slot { changes };
                self.slot_waiters.push_back(id);
                self.give_slots(now);
            }
            JobKind::Rebuild { member } => {
                let member = *member;
                let current =
                    matches!(&self.links[member], Link::Rebuilding(r) if r.running == Some(id));
                if !current {
                    // Its member was lost meanwhile: the stripe stays to rebuild.
                    self.mark_dirty(member, stripe);
                    return self.finish_job(id, now);
                }
                let job = self.jobs.get_mut(&id).expect("the job");
                let data = got.into_iter().next().expect("one want");
                job.step = Step::Applying {
                    slot: None,
                    written: 1 << member,
                };
                job.outstanding = 1;
                let offset = self.config.in_place(stripe, 0);
                let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token,
                        op,
                        offset,
                        data,
                        fua: true,
                    },
                );
            }
        }
    }

    /// A write's new bytes, per member it changes.
    fn changes(
        &self,
        stripe: u64,
        pieces: &[(usize, u32, Vec<u8>)],
        wants: &[Want],
        old: Vec<Vec<u8>>,
    ) -> Changes {
        let layout = self.config.geometry.layout();
        let columns = write_columns(pieces);
        let width = (columns.end - columns.start) as usize;
        let mut data = vec![vec![0u8; width]; layout.data()];
        for (want, bytes) in wants.iter().zip(old) {
            data[want.shard] = bytes;
        }
        for (shard, column, bytes) in pieces {
            let at = (column - columns.start) as usize;
            data[*shard][at..at + bytes.len()].copy_from_slice(bytes);
        }
        let mut parity = vec![vec![0u8; width]; layout.parity()];
        {
            let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            encode(layout, &d, &mut p).expect("a stripe's shape");
        }
        let written: BTreeSet<usize> = pieces.iter().map(|(shard, _, _)| *shard).collect();
        let mut members = Vec::new();
        let mut changed = 0u16;
        for (shard, bytes) in data.into_iter().enumerate().chain(
            parity
                .into_iter()
                .enumerate()
                .map(|(j, p)| (layout.data() + j, p)),
        ) {
            if shard < layout.data() && !written.contains(&shard) {
                continue;
            }
            let member = self.config.geometry.member_of(stripe, shard);
            changed |= 1 << member;
            members.push((member, bytes));
        }
        Changes {
            columns,
            changed,
            members,
        }
    }

    /// The journal slot of `stripe`'s records. Always the same one, so that
    /// a member holds at most one record of a stripe: a record found is the
    /// stripe's last on that member, and writing it in place again changes
    /// nothing another update wrote later (module `journal`).
    fn slot_of(&self, stripe: u64) -> u32 {
        (stripe % u64::from(self.config.journal.slots)) as u32
    }

    /// Hands free journal slots to the writes waiting for them, in order.
    fn give_slots(&mut self, now: Duration) {
        let mut waiting = std::mem::take(&mut self.slot_waiters);
        while let Some(id) = waiting.pop_front() {
            let slot = self.slot_of(self.jobs[&id].stripe);
            if self.slot_busy[slot as usize] {
                self.slot_waiters.push_back(id);
                continue;
            }
            self.slot_busy[slot as usize] = true;
            self.journal(id, slot, now);
            if self.is_ended() {
                return;
            }
        }
    }

    fn is_ended(&self) -> bool {
        matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled)
    }

    fn journal(&mut self, id: JobId, slot: u32, now: Duration) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Slot { changes } = std::mem::replace(&mut job.step, Step::Locking) else {
            unreachable!("a job given a slot waited for one")
        };
        let stripe = job.stripe;
        let mut sends = Vec::new();
        for (member, bytes) in &changes.members {
            if !self.writable(*member, stripe) {
                self.mark_dirty(*member, stripe);
                continue;
            }
            let record = Record {
                epoch: self.token.epoch,
                seq,
                stripe,
                member: *member as u16,
                changed: changes.changed,
                column: changes.columns.start,
                data: bytes.clone(),
            };
            sends.push((*member, record.encode(&self.config.journal)));
        }
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = sends.len();
        job.step = Step::Journaling { changes, slot };
        if sends.is_empty() {
            return self.journaled(id, now);
        }
        let offset = self.config.journal.slot_offset(slot);
        for (member, data) in sends {
            let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
            self.send(
                member,
                ToMember::Write {
                    token: self.token,
                    op,
                    offset,
                    data,
                    fua: true,
                },
            );
        }
    }

    /// Every member a write reached holds its record: once no fault is left
    /// to commit, the host may have it and the bytes go in place.
    fn journaled(&mut self, id: JobId, now: Duration) {
        self.journaled.push(id);
        self.release_journaled(now);
    }

    /// Acknowledges and applies the journaled writes, unless a member's
    /// fault is still to be committed: until then the member is in sync in
    /// the store's record, the records it lacks are incomplete there, and
    /// a recovery would drop them (so none may be applied anywhere yet).
    fn release_journaled(&mut self, now: Duration) {
        if self.links.iter().any(|l| matches!(l, Link::Lost)) {
            return;
        }
        for id in std::mem::take(&mut self.journaled) {
            if self.jobs.contains_key(&id) {
                self.apply(id, now);
            }
            if self.is_ended() {
                return;
            }
        }
    }

    fn apply(&mut self, id: JobId, now: Duration) {
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Journaling { changes, slot } = std::mem::replace(&mut job.step, Step::Locking)
        else {
            unreachable!("a job journaled was journaling")
        };
        let stripe = job.stripe;
        let JobKind::Write { host, .. } = job.kind else {
            unreachable!("only writes journal")
        };
        let mut sends = Vec::new();
        for (member, bytes) in changes.members {
            if self.writable(member, stripe) {
                sends.push((member, bytes));
            } else {
                self.mark_dirty(member, stripe);
            }
        }
        let written = sends
            .iter()
            .fold(0u16, |mask, (member, _)| mask | 1 << member);
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = sends.len();
        job.step = Step::Applying {
            slot: Some(slot),
            written,
        };
        self.part_done(host, now);
        if sends.is_empty() {
            return self.applied(id, now);
        }
        let offset = self.config.in_place(stripe, changes.columns.start);
        for (member, data) in sends {
            let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
            self.send(
                member,
                ToMember::Write {
                    token: self.token,
                    op,
                    offset,
                    data,
                    fua: false,
                },
            );
        }
    }

    /// The job's in-place writes are done (a rebuild's durable): the
    /// stripe is free again; a write's slot waits for the next flush.
    fn applied(&mut self, id: JobId, now: Duration) {
        let job = &self.jobs[&id];
        let Step::Applying { slot, written } = job.step else {
            unreachable!("a job applied was applying")
        };
        if let JobKind::Rebuild { member } = job.kind {
            if let Link::Rebuilding(r) = &mut self.links[member] {
                if r.running == Some(id) {
                    r.done += 1;
                    r.running = None;
                }
            }
        }
        if let Some(slot) = slot {
            let stripe = job.stripe;
            self.unflushed.push(Applied {
                slot,
                stripe,
                written,
            });
        }
        self.finish_job(id, now);
        self.flush_applied(now);
        self.advance_rebuilds(now);
    }

    /// Flushes the members the applied writes went to, unless a flush is
    /// under way; once it is done their slots are free: the next update of
    /// those stripes may overwrite their records, the in-place bytes being
    /// durable. Under load, one flush covers the writes of many updates.
    fn flush_applied(&mut self, now: Duration) {
        if self.flushing.is_some() || self.unflushed.is_empty() || self.is_ended() {
            return;
        }
        let batch = std::mem::take(&mut self.unflushed);
        let members = batch.iter().fold(0u16, |mask, a| mask | a.written);
        let mut outstanding = 0;
        for member in (0..self.links.len()).filter(|&m| members & (1 << m) != 0) {
            // A member lost since is faulted: what it lacks is rebuilt.
            if matches!(self.links[member], Link::Up | Link::Rebuilding(_)) {
                let op = self.member_op(member, Purpose::Flush, now);
                self.send(
                    member,
                    ToMember::Flush {
                        token: self.token,
                        op,
                    },
                );
                outstanding += 1;
            }
        }
        self.flushing = Some((batch, outstanding));
        if outstanding == 0 {
            self.flushed(now);
        }
    }

    /// A flush's member answered (or was lost).
    fn flush_done(&mut self, now: Duration) {
        if let Some((_, outstanding)) = &mut self.flushing {
            *outstanding -= 1;
            if *outstanding == 0 {
                self.flushed(now);
            }
        }
    }

    /// Every member flushed, or was lost: the slots are free, once no
    /// lost member's fault is left to commit (until then it is in sync in
    /// the store's record, and its journal's records are what a recovery
    /// would write again over what its lost cache held).
    fn flushed(&mut self, now: Duration) {
        if self.links.iter().any(|l| matches!(l, Link::Lost)) {
            return;
        }
        let (batch, _) = self.flushing.take().expect("a flush");
        for applied in batch {
            self.slot_busy[applied.slot as usize] = false;
        }
        self.flush_generation += 1;
        self.give_slots(now);
        self.flush_applied(now);
        self.advance_rebuilds(now);
    }

    /// A flush that waited for a fault's commit ends now.
    fn flushed_after_commit(&mut self, now: Duration) {
        if matches!(self.flushing, Some((_, 0))) {
            self.flushed(now);
        }
    }

    /// Gives back the job's lock and starts the jobs waiting for it.
    fn finish_job(&mut self, id: JobId, now: Duration) {
        let job = self.jobs.remove(&id).expect("the job");
        for next in self.locks.release(job.stripe, job.writes()) {
            if self.jobs.contains_key(&next) {
                self.begin_reads(next, now);
            }
        }
    }

    /// One stripe's part of a host command is done.
    fn part_done(&mut self, host: OpId, now: Duration) {
        let op = self.host.get_mut(&host).expect("the host op");
        op.parts_left -= 1;
        if op.parts_left > 0 {
            return;
        }
        if op.write {
            self.host.remove(&host);
            self.complete(host, HostResult::Ok, Vec::new());
        } else {
            let op = self.host.remove(&host).expect("the host op");
            // Read from members a newer primary may have fenced since,
            // once this node's lease is gone (module docs).
            if now < self.lease_until {
                self.complete(host, HostResult::Ok, op.data);
            } else {
                self.complete(host, HostResult::Transition, Vec::new());
            }
        }
    }

    // ---- Members.

    fn in_sync(&self, member: usize) -> bool {
        self.record.members[member].state == MemberState::InSync
    }

    /// Whether a write of `stripe` goes to `member`.
    fn writable(&self, member: usize, stripe: u64) -> bool {
        match &self.links[member] {
            Link::Up => true,
            Link::Rebuilding(r) => r.clearing == 0 && !r.pending.contains(stripe as u32),
            _ => false,
        }
    }

    fn mark_dirty(&mut self, member: usize, stripe: u64) {
        if let Some(dirty) = &mut self.dirty[member] {
            dirty.insert(stripe as u32);
        }
        if let Link::Rebuilding(r) = &mut self.links[member] {
            if r.pending.insert(stripe as u32) {
                r.total += 1;
                r.cursor = r.cursor.min(stripe as u32);
            }
        }
    }

    fn member_op(&mut self, member: usize, purpose: Purpose, now: Duration) -> MemberOp {
        let op = MemberOp(self.next_op);
        self.next_op += 1;
        self.ops.insert(
            op,
            Outstanding {
                member,
                purpose,
                deadline: now + self.config.member_timeout,
            },
        );
        op
    }

    fn send(&mut self, member: usize, msg: ToMember) {
        let node = self.record.members[member].node;
        self.actions.push_back(EcAction::Send { member, node, msg });
    }

    /// A member's answer.
    pub fn member_reply(&mut self, member: usize, reply: FromMember, now: Duration) {
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        match reply {
            FromMember::Fenced { token } if token == self.token => self.fenced(member, now),
            FromMember::Read { token, op, data } if token == self.token => {
                self.op_done(member, op, Some(data), now)
            }
            FromMember::Written { token, op } if token == self.token => {
                self.op_done(member, op, None, now)
            }
            FromMember::Failed { token, op }
                if token == self.token && self.ops.get(&op).is_some_and(|o| o.member == member) =>
            {
                self.lose(member, now)
            }
            FromMember::Refused { token, current } if token == self.token => {
                if current > self.token {
                    self.depose();
                } else {
                    // It restarted and lost our fence.
                    self.lose(member, now);
                }
            }
            _ => {}
        }
        self.barrier_progress(now);
    }

    fn fenced(&mut self, member: usize, now: Duration) {
        let Link::Fencing { rejoin, .. } = self.links[member] else {
            return;
        };
        if !rejoin {
            self.links[member] = Link::Up;
            return self.fencing_progress(now);
        }
        // Coming back: clear its journal, then rebuild what it missed.
        let stripes = self.config.stripes() as u32;
        let pending = self.dirty[member]
            .take()
            .unwrap_or_else(|| RegionSet::full(stripes));
        let total = u64::from(pending.len());
        let slots = self.config.journal.slots;
        self.links[member] = Link::Rebuilding(Rebuild {
            clearing: slots,
            pending,
            cursor: 0,
            running: None,
            join_after: None,
            done: 0,
            total,
            joining: false,
        });
        let zeros = vec![0; self.config.journal.block_bytes as usize];
        for slot in 0..slots {
            let op = self.member_op(member, Purpose::Clear, now);
            let offset = self.config.journal.slot_offset(slot);
            self.send(
                member,
                ToMember::Write {
                    token: self.token,
                    op,
                    offset,
                    data: zeros.clone(),
                    fua: true,
                },
            );
        }
    }

    fn op_done(&mut self, member: usize, op: MemberOp, data: Option<Vec<u8>>, now: Duration) {
        let Some(out) = self.ops.get(&op) else {
            return; // Given up on (its member was lost, or its job read again).
        };
        if out.member != member || !self.whole_read(&out.purpose, data.as_deref()) {
            // A member that answers another's op, or reads short, is not
            // trusted with the stripe: out, and rebuilt.
            return self.lose(out.member, now);
        }
        let out = self.ops.remove(&op).expect("the op");
        match out.purpose {
            Purpose::Job { job, index } => {
                let Some(j) = self.jobs.get_mut(&job) else {
                    return;
                };
                if let (Step::Reading { reads, .. }, Some(data)) = (&mut j.step, data) {
                    reads[index] = Some(data);
                }
                j.outstanding -= 1;
                if j.outstanding == 0 {
                    self.job_step_done(job, now);
                }
            }
            Purpose::JournalRead { slot } => {
                if let Some(record) = data.and_then(|d| Record::decode(&d, &self.config.journal)) {
                    self.recovery.found.push((member, slot, record));
                }
                self.recovery.reads_left -= 1;
                self.recovery_progress(now);
            }
            Purpose::RecoveryWrite => {
                self.recovery.writes_left -= 1;
                self.recovery_progress(now);
            }
            Purpose::Clear => {
                if let Link::Rebuilding(r) = &mut self.links[member] {
                    r.clearing -= 1;
                }
                self.advance_rebuilds(now);
            }
            Purpose::Flush => self.flush_done(now),
            Purpose::Control => self.control_answered(member, true),
        }
    }

    /// Whether a job's read gave the bytes it asked for (other ops pass).
    fn whole_read(&self, purpose: &Purpose, data: Option<&[u8]>) -> bool {
        let (Purpose::Job { job, index }, Some(data)) = (purpose, data) else {
            return true;
        };
        match self.jobs.get(job).map(|j| &j.step) {
            Some(Step::Reading { plan, .. }) => plan
                .reads()
                .get(*index)
                .is_some_and(|w| data.len() == (w.columns.end - w.columns.start) as usize),
            _ => true,
        }
    }

    fn job_step_done(&mut self, id: JobId, now: Duration) {
        match self.jobs[&id].step {
            Step::Reading { .. } => self.reads_done(id, now),
            Step::Journaling { .. } => self.journaled(id, now),
            Step::Applying { .. } => self.applied(id, now),
            Step::Locking | Step::Slot { .. } => unreachable!("no ops outstanding"),
        }
    }

    /// `member` failed or fell silent: out of use at once, faulted in the
    /// record before any write it missed is acknowledged.
    fn lose(&mut self, member: usize, now: Duration) {
        // In sync, or its return being committed: the record says so then.
        let joining = matches!(&self.links[member], Link::Rebuilding(r) if r.joining);
        let was_in_sync = self.in_sync(member) || joining;
        let mut dirty = match &self.links[member] {
            Link::Lost | Link::Away { .. } => {
                // Out already: only its ops are given up on.
                return self.give_up_ops(member, now);
            }
            // Its stripes to rebuild are what it missed before.
            Link::Fencing { rejoin: true, .. } => None,
            // What it still lacks stays to be rebuilt.
            Link::Rebuilding(r) => Some(r.pending.clone()),
            // Lost before serving: what the journals' recovery wrote
            // without it is not known here, so all of it is rebuilt.
            Link::Fencing { .. } | Link::Up if self.phase != EcPhase::Active => None,
            Link::Fencing { .. } | Link::Up => Some(RegionSet::new(self.config.stripes() as u32)),
        };
        if let Some(dirty) = &mut dirty {
            // And the stripes being changed now: their writes to it may
            // not have landed; and those written but not flushed: its
            // cache may have lost them.
            for job in self.jobs.values() {
                let rebuilding_it =
                    matches!(job.kind, JobKind::Rebuild { member: m } if m == member);
                if rebuilding_it || (job.writes() && !matches!(job.step, Step::Locking)) {
                    dirty.insert(job.stripe as u32);
                }
            }
            let flushing = self.flushing.iter().flat_map(|(batch, _)| batch.iter());
            for applied in self.unflushed.iter().chain(flushing) {
                if applied.written & (1 << member) != 0 {
                    dirty.insert(applied.stripe as u32);
                }
            }
            self.dirty[member] = Some(dirty.clone());
        }
        self.links[member] = if was_in_sync {
            Link::Lost
        } else {
            Link::Away {
                retry_at: now + self.config.reattach_interval,
            }
        };
        self.give_up_ops(member, now);
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        if was_in_sync {
            let left = (0..self.links.len())
                .filter(|&m| self.in_sync(m) && !matches!(self.links[m], Link::Lost))
                .count();
            if left < self.config.geometry.layout().data() {
                return self.stall();
            }
            if self.phase == EcPhase::Recovering {
                self.recovery.again = true;
            }
            self.commit_changes();
        }
        if self.phase == EcPhase::Fencing {
            self.fencing_progress(now);
        } else if self.phase == EcPhase::Recovering {
            self.recovery_progress(now);
        }
    }

    /// Gives up on `member`'s ops: reads are made again from others,
    /// writes count as done without it.
    fn give_up_ops(&mut self, member: usize, now: Duration) {
        let gone: Vec<MemberOp> = self
            .ops
            .iter()
            .filter(|(_, o)| o.member == member)
            .map(|(&op, _)| op)
            .collect();
        let mut reread = BTreeSet::new();
        for op in gone {
            // A job that went on may have ended the primary meanwhile.
            let Some(out) = self.ops.remove(&op) else {
                continue;
            };
            match out.purpose {
                Purpose::Job { job, .. } => {
                    let Some(j) = self.jobs.get_mut(&job) else {
                        continue;
                    };
                    if matches!(j.step, Step::Reading { .. }) {
                        reread.insert(job);
                    } else {
                        j.outstanding -= 1;
                        if j.outstanding == 0 {
                            self.job_step_done(job, now);
                        }
                    }
                }
                Purpose::JournalRead { .. } => self.recovery.reads_left -= 1,
                Purpose::RecoveryWrite => self.recovery.writes_left -= 1,
                Purpose::Clear => {}
                Purpose::Flush => self.flush_done(now),
                Purpose::Control => self.control_answered(member, false),
            }
        }
        if self.is_ended() {
            return;
        }
        for job in reread {
            self.reread(job, now);
        }
    }

    /// A job whose read lost its member reads again from those left.
    fn reread(&mut self, id: JobId, now: Duration) {
        if self.phase != EcPhase::Active && self.phase != EcPhase::Recovering {
            return;
        }
        let stale: Vec<MemberOp> = self
            .ops
            .iter()
            .filter(|(_, o)| matches!(o.purpose, Purpose::Job { job, .. } if job == id))
            .map(|(&op, _)| op)
            .collect();
        for op in stale {
            self.ops.remove(&op);
        }
        self.begin_reads(id, now);
    }

    // ---- The record.

    /// Commits the members' changes (faults, returns) if none is in flight.
    fn commit_changes(&mut self) {
        if self.committing || self.is_ended() {
            return;
        }
        let mut next = self.record.clone();
        let mut changed = false;
        for (member, link) in self.links.iter().enumerate() {
            let state = &mut next.members[member].state;
            match link {
                Link::Lost => {
                    *state = MemberState::Faulted {
                        epoch: self.token.epoch,
                    };
                    changed = true;
                }
                Link::Rebuilding(r) if r.joining => {
                    *state = MemberState::InSync;
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            self.committing = true;
            self.actions.push_back(EcAction::Commit {
                base_revision: self.revision,
                record: next,
            });
        }
    }

    /// The record change asked for is in the store at `revision`.
    pub fn committed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        if !self.committing || matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        self.committing = false;
        self.revision = revision;
        for member in 0..self.links.len() {
            let now_in_sync = record.members[member].state == MemberState::InSync;
            match &self.links[member] {
                Link::Lost if !now_in_sync => {
                    self.links[member] = Link::Away {
                        retry_at: now + self.config.reattach_interval,
                    };
                }
                Link::Rebuilding(r) if r.joining && now_in_sync => {
                    self.links[member] = Link::Up;
                }
                _ => {}
            }
        }
        self.record = record;
        if self.record.primary != self.config.me {
            // Handed over (a planned move).
            return self.depose();
        }
        self.commit_changes();
        self.release_journaled(now);
        self.flushed_after_commit(now);
        match self.phase {
            EcPhase::Fencing => self.fencing_progress(now),
            EcPhase::Recovering => self.recovery_progress(now),
            _ => self.barrier_progress(now),
        }
    }

    /// The compare-and-swap failed; `current` is the record now (None: deleted).
    pub fn commit_failed(&mut self, current: Option<(u64, ReplicaSet)>, now: Duration) {
        if self.is_ended() {
            return;
        }
        self.committing = false;
        match current {
            Some((revision, record)) => {
                self.record_changed(revision, record, now);
                self.commit_changes();
            }
            None => self.stall(),
        }
        self.barrier_progress(now);
    }

    /// The store's record changed (a watch).
    pub fn record_changed(&mut self, revision: u64, record: ReplicaSet, _now: Duration) {
        if record.epoch > self.token.epoch || record.primary != self.config.me {
            return self.depose();
        }
        if record.epoch < self.token.epoch || revision <= self.revision {
            return;
        }
        let same_nodes = record
            .members
            .iter()
            .zip(&self.record.members)
            .all(|(a, b)| a.node == b.node);
        if !same_nodes || record.members.len() != self.record.members.len() {
            return self.stall();
        }
        // Ours to change: the members' states. Anything else is taken.
        let mut record = record;
        for (mine, theirs) in self.record.members.iter().zip(record.members.iter_mut()) {
            theirs.state = mine.state;
        }
        self.revision = revision;
        self.record = record;
    }

    // ---- Starting: fencing and recovery.

    fn fencing_progress(&mut self, now: Duration) {
        if self.phase != EcPhase::Fencing || self.committing {
            return;
        }
        let waiting = self
            .links
            .iter()
            .any(|l| matches!(l, Link::Fencing { rejoin: false, .. } | Link::Lost));
        if !waiting {
            self.phase = EcPhase::Recovering;
            self.start_recovery(now);
        }
    }

    fn start_recovery(&mut self, now: Duration) {
        self.recovery = RecoveryState {
            reading: true,
            ..RecoveryState::default()
        };
        let slots = self.config.journal.slots;
        let len = self.config.journal.slot_bytes() as u32;
        for member in 0..self.links.len() {
            if !matches!(self.links[member], Link::Up) {
                continue;
            }
            for slot in 0..slots {
                let op = self.member_op(member, Purpose::JournalRead { slot }, now);
                let offset = self.config.journal.slot_offset(slot);
                self.recovery.reads_left += 1;
                self.send(
                    member,
                    ToMember::Read {
                        token: self.token,
                        op,
                        offset,
                        len,
                    },
                );
            }
        }
        self.recovery_progress(now);
    }

    fn recovery_progress(&mut self, now: Duration) {
        if self.phase != EcPhase::Recovering {
            return;
        }
        let r = &mut self.recovery;
        if r.reads_left > 0 || r.writes_left > 0 || self.committing {
            return;
        }
        if r.again {
            return self.start_recovery(now);
        }
        if r.reading {
            r.reading = false;
            r.redoing = true;
            let found = std::mem::take(&mut r.found);
            let record = &self.record;
            let links = &self.links;
            let plan = journal::recovery(found, |m| {
                record.members[m].state == MemberState::InSync && matches!(links[m], Link::Up)
            });
            self.recovery.clear = plan.clear;
            for record in plan.redo {
                let member = usize::from(record.member);
                let offset = self.config.in_place(record.stripe, record.column);
                let op = self.member_op(member, Purpose::RecoveryWrite, now);
                self.recovery.writes_left += 1;
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token,
                        op,
                        offset,
                        data: record.data,
                        fua: true,
                    },
                );
            }
            return self.recovery_progress(now);
        }
        if r.redoing {
            r.redoing = false;
            let zeros = vec![0; self.config.journal.block_bytes as usize];
            for (member, slot) in std::mem::take(&mut self.recovery.clear) {
                if !matches!(self.links[member], Link::Up) {
                    continue;
                }
                let op = self.member_op(member, Purpose::RecoveryWrite, now);
                self.recovery.writes_left += 1;
                let offset = self.config.journal.slot_offset(slot);
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token,
                        op,
                        offset,
                        data: zeros.clone(),
                        fua: true,
                    },
                );
            }
            return self.recovery_progress(now);
        }
        self.phase = EcPhase::Active;
    }

    // ---- Time: timeouts, returns, rebuilds.

    /// The time passes.
    pub fn tick(&mut self, now: Duration) {
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        let late: BTreeSet<usize> = self
            .ops
            .values()
            .filter(|o| o.deadline <= now)
            .map(|o| o.member)
            .chain(self.links.iter().enumerate().filter_map(|(m, l)| match l {
                Link::Fencing { deadline, .. } if *deadline <= now => Some(m),
                _ => None,
            }))
            .collect();
        for member in late {
            if let Link::Fencing { rejoin: true, .. } = self.links[member] {
                self.links[member] = Link::Away {
                    retry_at: now + self.config.reattach_interval,
                };
                continue;
            }
            self.lose(member, now);
            if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
                return;
            }
        }
        if self.phase != EcPhase::Active {
            return;
        }
        for member in 0..self.links.len() {
            if let Link::Away { retry_at } = self.links[member] {
                if retry_at <= now {
                    self.links[member] = Link::Fencing {
                        deadline: now + self.config.member_timeout,
                        rejoin: true,
                    };
                    self.send(member, ToMember::Fence { token: self.token });
                }
            }
        }
        self.advance_rebuilds(now);
        self.barrier_progress(now);
        self.hand_over();
    }

    /// Starts the next stripe of each rebuild the bandwidth allows, and
    /// puts a rebuilt member back in sync.
    fn advance_rebuilds(&mut self, now: Duration) {
        if self.phase != EcPhase::Active || self.moving_to().is_some() {
            return;
        }
        self.refill_budget(now);
        let chunk = u64::from(self.config.geometry.chunk_bytes());
        let stripes = self.config.stripes() as u32;
        for member in 0..self.links.len() {
            let Link::Rebuilding(r) = &mut self.links[member] else {
                continue;
            };
            if r.clearing > 0 || r.running.is_some() || r.joining {
                continue;
            }
            while r.cursor < stripes && !r.pending.contains(r.cursor) {
                r.cursor += 1;
            }
            if r.cursor >= stripes {
                // Every update that skipped it is applied (its stripe's
                // rebuild waited for the lock); it joins once they are
                // flushed too: a recovery would drop their records, which
                // it lacks, once it is in sync.
                let quiet = self.unflushed.is_empty() && self.flushing.is_none();
                let gate = *r.join_after.get_or_insert(self.flush_generation + 2);
                if quiet || self.flush_generation >= gate {
                    r.joining = true;
                    self.commit_changes();
                }
                continue;
            }
            let limited = self.config.rebuild_bytes_per_sec > 0;
            if limited && self.rebuild_budget < chunk {
                continue;
            }
            if limited {
                self.rebuild_budget -= chunk;
            }
            let stripe = r.cursor;
            r.pending.remove(stripe);
            let id = self.next_job;
            r.running = Some(id);
            let started = self.start_job(u64::from(stripe), JobKind::Rebuild { member }, now);
            debug_assert_eq!(started, id);
        }
    }

    fn refill_budget(&mut self, now: Duration) {
        let rate = self.config.rebuild_bytes_per_sec;
        let elapsed = now.saturating_sub(self.budget_at);
        let earned = (elapsed.as_nanos() * u128::from(rate) / 1_000_000_000) as u64;
        if earned > 0 {
            // At most a tenth of a second's worth saved up.
            let cap = (rate / 10).max(u64::from(self.config.geometry.chunk_bytes()));
            self.rebuild_budget = (self.rebuild_budget + earned).min(cap);
            self.budget_at = now;
        }
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
                            ToMember::Fence { token } => FromMember::Fenced { token },
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
                        self.primary.member_reply(member, reply, self.now);
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
