//! The primary of a replicated volume, as a state machine.
//!
//! The driver feeds it host commands (`host_*`), completions of the local
//! I/O it asked for (`local_done`), replicas' answers (`replica_reply`), the
//! store's answers to its record changes (`committed`, `commit_failed`,
//! `record_changed`), its lease (`set_lease`) and the time (`tick`), and
//! carries out the [`Action`]s it takes from `poll_action`, in order. The
//! driver holds the data: a host write's buffer and a copy's region live
//! under the op's [`OpId`] until the op completes. The `now` it passes never
//! decreases from one call to the next (a monotonic clock): the deadlines
//! and the cleaning of the write intent are looked at only once due.
//!
//! Its life: **Fencing** every replica the record calls in sync with a new
//! token, collecting their write intents; **Resyncing** the regions any of
//! them (or this node) may hold unconfirmed writes in, from this node's copy,
//! while serving the host already (as md and DRBD do: a read or write of a
//! region not yet copied to every replica waits for that copy, which goes
//! first, so that no read returns data the next primary could undo);
//! **Active**, serving the host; **Deposed** as soon as it learns of a newer
//! epoch, after which it completes nothing but with a path error.
//!
//! A change of the record's members deposes the primary too: its driver
//! serves again under the next epoch with a new `Primary`.
//!
//! A planned move (the record's `move_to`): the primary stops taking host
//! commands (ANA Transition), lets those in flight finish, and commits the
//! next epoch with the target as primary itself; it stays an in-sync
//! replica. No lease has to run out, so the host pauses only for the drain
//! and the new primary's fencing.
//!
//! Reads rest on grants as well as the lease: a read is served from this
//! node's copy only while every replica the store may call in sync granted
//! it reads (`weft_proto::fence`'s read grants: a replica answering a
//! command sent at `t` lets this primary serve reads until `t` plus
//! [`PrimaryConfig::read_grant`]; a replica promoted, or fenced by one
//! promoted, waits longer than that after this primary's last command). A
//! link with nothing else to say renews its grant with a [`ToReplica::Grant`]
//! once a third of it is spent; a read that finds a grant run out (a replica
//! late, or gone and not yet faulted) waits for its renewal, or for the
//! replica to leave the in-sync set. So a promotion need not wait for this
//! node's lease to end to be safe for reads.
//!
//! A primary whose own copy fails (a local write, read or flush fails:
//! a disk error, a failed pool) hands over the same way to an in-sync
//! replica it reaches, marking itself faulted under its epoch (rebuilt in
//! full once its copy works again); the host commands that failed here
//! complete with ANA Transition, so that the host retries them on the new
//! primary rather than seeing an I/O error. With no replica to hand over
//! to, it carries on, and the driver gives the host the error.
//!
//! What it does not do: pick replicas, talk to the store, or decide to
//! become primary (the controller promotes; the driver then builds a
//! `Primary` after fencing its own node's replica with session 0 of the new
//! epoch, so that the old primary's writes stop there too).

use crate::record::{MemberState, ReplicaSet};
use crate::regions::RegionSet;
use crate::replica::FromReplica;
use crate::types::{Epoch, Extent, Geometry, NodeId, OpId, Token};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound;
use std::time::Duration;

/// What a primary needs to know about its volume and its patience.
#[derive(Debug, Clone, Copy)]
pub struct PrimaryConfig {
    /// This node.
    pub me: NodeId,
    /// The volume's size and region size.
    pub geometry: Geometry,
    /// A replica that has not answered within this long is faulted.
    pub replica_timeout: Duration,
    /// How often a faulted replica is asked to come back.
    pub reattach_interval: Duration,
    /// Rebuild copies in flight at once.
    pub copies_in_flight_max: usize,
    /// How long a region stays in the write intents after its last write
    /// completed (md's bitmap delay): a region written again meanwhile
    /// costs no intent update, at the price of a larger resync at promotion.
    pub clean_delay: Duration,
    /// How long after sending a command a replica answered this primary
    /// may serve reads on that answer: the replicas' grant
    /// (`weft_proto::fence::READ_GRANT`) less a margin for the clocks' rates,
    /// the driver's ticks and a read already on its way to the disk.
    pub read_grant: Duration,
}

/// The primary's stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrimaryPhase {
    /// Fencing the in-sync replicas.
    Fencing,
    /// Copying the regions that may differ to the in-sync replicas, and
    /// serving (what touches a region not yet copied waits for it).
    Resyncing,
    /// Serving.
    Active,
    /// A newer epoch exists: serves nothing.
    Deposed,
}

/// How a host command ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostResult {
    /// Done (for a read: the data is what the op's local read returned).
    Ok,
    /// Not served on this path, for now: the primary is being set up or
    /// handed over, or its lease ran out (ANA Transition). Retry, on any path.
    Transition,
    /// Not served on this path: this node is no longer primary (ANA Inaccessible).
    Inaccessible,
}

/// A message from the primary to a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToReplica {
    /// Take `token` as the fence: only it may write from now on.
    Fence {
        /// The new fence.
        token: Token,
    },
    /// A host write (data: the op's host buffer).
    Write {
        /// The session.
        token: Token,
        /// The op.
        op: OpId,
        /// Where.
        extent: Extent,
        /// Force unit access: durable before it is done.
        fua: bool,
    },
    /// A rebuild or resync copy (data: what the op's local read returned).
    Copy {
        /// The session.
        token: Token,
        /// The op.
        op: OpId,
        /// Where (one region).
        extent: Extent,
    },
    /// Make every completed write durable.
    Flush {
        /// The session.
        token: Token,
        /// The op.
        op: OpId,
    },
    /// Nothing but a renewal of the read grant (see the module's docs).
    Grant {
        /// The session.
        token: Token,
        /// The op.
        op: OpId,
    },
    /// Every in-sync replica holds the writes of these regions: drop them from the write intent.
    Clean {
        /// The session.
        token: Token,
        /// The regions.
        regions: Vec<u32>,
    },
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Add `region` to this node's persistent write intent, durably,
    /// before carrying out the actions that follow.
    IntentSet(u32),
    /// Drop `region` from this node's write intent (need not be durable at once).
    IntentClear(u32),
    /// Add `region` to the run's kept regions ([`Run::kept`]), no later than
    /// the `IntentClear` of it that follows becomes durable.
    Keep(u32),
    /// Every member is in sync: the run's kept regions and members to
    /// rebuild in full are empty (need not be durable at once).
    AllInSync,
    /// Record durably that `node` is to be rebuilt in full ([`Run::full`]),
    /// before carrying out the actions that follow.
    Full(NodeId),
    /// Write the op's data locally.
    LocalWrite {
        /// The op.
        op: OpId,
        /// Where.
        extent: Extent,
        /// Force unit access.
        fua: bool,
    },
    /// Read into the op's buffer locally.
    LocalRead {
        /// The op.
        op: OpId,
        /// Where.
        extent: Extent,
    },
    /// Flush the local device.
    LocalFlush {
        /// The op.
        op: OpId,
    },
    /// Send to a replica.
    Send {
        /// The replica's node.
        to: NodeId,
        /// The message.
        msg: ToReplica,
    },
    /// Replace the record at `base_revision` by `record` (compare-and-swap);
    /// answer with `committed` or `commit_failed`.
    Commit {
        /// The revision the change is based on.
        base_revision: u64,
        /// The record wanted.
        record: ReplicaSet,
    },
    /// Complete the host command.
    Complete {
        /// The op.
        op: OpId,
        /// How.
        result: HostResult,
    },
}

/// What a node keeps, across restarts, of its unbroken run as primary of a
/// volume: the epochs since `first_epoch` were all its own (it started the
/// run when promoted, and took each later epoch from its own record). A
/// member faulted within the run missed only regions this node wrote since,
/// which its write intent or `kept` holds, unless it is in `full`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The epoch the run began in.
    pub first_epoch: Epoch,
    /// Regions cleaned from the write intent while some member was out of
    /// sync (so, with the intent: every region written since then).
    pub kept: RegionSet,
    /// Members whose dirty set was found unknown within the run.
    pub full: Vec<NodeId>,
}

impl Run {
    /// A run beginning in `epoch` (promoted), over `regions` regions.
    pub fn new(epoch: Epoch, regions: u32) -> Run {
        Run {
            first_epoch: epoch,
            kept: RegionSet::new(regions),
            full: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    /// A fence is out. `rejoin`: a faulted replica coming back (else an
    /// in-sync one at promotion).
    Fencing { deadline: Duration, rejoin: bool },
    /// In sync: gets every write and its answer is required.
    Live,
    /// Fenced, being copied to; gets writes to regions it has, answers not required.
    Rebuilding,
    /// Rebuilt; the record is being changed to in-sync. Answers required.
    Joining,
    /// Gets nothing; asked back at `retry_at`.
    Down { retry_at: Duration },
}

#[derive(Debug)]
struct Link {
    token: Token,
    state: LinkState,
    /// Regions it lacks (or, while resyncing, regions still to copy to it).
    dirty: RegionSet,
    /// Whether it must be rebuilt in full (its dirty set is not known).
    full: bool,
    /// Rebuilt, and a Flush made everything it was sent durable: it may join.
    flushed: bool,
    /// It was sent a write since its join flush was sent.
    written_since_flush: bool,
    /// Until when its answers grant this primary reads.
    granted_until: Duration,
}

impl Link {
    /// Whether the record should call it in sync.
    fn wants_in_sync(&self) -> bool {
        matches!(
            self.state,
            LinkState::Live | LinkState::Joining | LinkState::Fencing { rejoin: false, .. }
        )
    }

    fn required(&self) -> bool {
        matches!(self.state, LinkState::Live | LinkState::Joining)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Write {
        extent: Extent,
        fua: bool,
    },
    Read {
        extent: Extent,
    },
    Flush,
    Copy {
        to: NodeId,
        region: u32,
    },
    /// Makes a rebuilt replica's writes durable before it joins.
    JoinFlush {
        to: NodeId,
    },
    /// Makes this node's copy durable before it is left the only one in sync.
    SoleFlush,
    /// Makes the replica a primary whose copy failed hands over to durable
    /// first: it is left the only copy in sync.
    HandoverFlush {
        to: NodeId,
    },
    /// Renews the read grant of `to`.
    Grant {
        to: NodeId,
    },
}

/// The local flush before this node is left the only copy in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SoleFlush {
    Running(OpId),
    Done,
}

#[derive(Debug)]
struct Op {
    kind: OpKind,
    /// Waiting for an overlapping write or copy to finish, or (while
    /// resyncing) for its regions to be copied.
    queued: bool,
    local_pending: bool,
    /// Replicas whose answer is required, not yet received.
    required: Vec<NodeId>,
    /// Rebuilding replicas sent to, answer not yet received.
    optional: Vec<NodeId>,
    deadline: Duration,
    /// The host has its completion.
    answered: bool,
    /// Its local part failed (this node's copy did).
    local_failed: bool,
}

impl Op {
    fn is_host(&self) -> bool {
        !matches!(
            self.kind,
            OpKind::Copy { .. }
                | OpKind::JoinFlush { .. }
                | OpKind::SoleFlush
                | OpKind::HandoverFlush { .. }
                | OpKind::Grant { .. }
        )
    }

    fn extent(&self, geometry: &Geometry) -> Option<Extent> {
        match self.kind {
            OpKind::Write { extent, .. } => Some(extent),
            OpKind::Copy { region, .. } => Some(geometry.extent_of(region)),
            OpKind::Read { .. }
            | OpKind::Flush
            | OpKind::JoinFlush { .. }
            | OpKind::SoleFlush
            | OpKind::HandoverFlush { .. }
            | OpKind::Grant { .. } => None,
        }
    }

    fn finished(&self) -> bool {
        !self.queued && !self.local_pending && self.required.is_empty() && self.optional.is_empty()
    }
}

/// The primary of one replicated volume.
#[derive(Debug)]
pub struct Primary {
    config: PrimaryConfig,
    phase: PrimaryPhase,
    record: ReplicaSet,
    revision: u64,
    commit_in_flight: bool,
    commit_retry_at: Option<Duration>,
    /// Records asked for whose outcome is not known (the answer was lost),
    /// with the revision they were based on. Until a later revision is seen,
    /// each may be the store's.
    uncertain: Vec<(u64, ReplicaSet)>,
    links: BTreeMap<NodeId, Link>,
    sessions: u32,
    ops: BTreeMap<OpId, Op>,
    /// The host writes waiting for an overlapping write or copy, and the
    /// host reads and writes waiting for a resync's copy (the ops whose
    /// `queued` is set), so that a completion looks at these only, not at
    /// every op in flight.
    queued: BTreeSet<OpId>,
    /// No op can be past its deadline before this time: the deadline scan
    /// of `tick` waits for it (every deadline is set `replica_timeout`
    /// after the moment its op is sent, and time does not go back).
    deadline_scan_at: Duration,
    next_internal_op: u64,
    /// This node's write intent, as persisted.
    intent: RegionSet,
    /// Writes in flight per region.
    writes_in_region: Vec<u32>,
    /// Regions whose writes all completed, to clean, with when the last did.
    to_clean: BTreeMap<u32, Duration>,
    /// No region of `to_clean` is due before this time (a lower bound:
    /// cleaning looks at them only from then on).
    clean_due_at: Duration,
    /// Regions to resync at promotion.
    resync: RegionSet,
    /// While resyncing, per region: the live replicas that have yet to be
    /// sent its copy, and its copies in flight. A host op waits while a
    /// region of its extent counts any (empty once active).
    lacking: Vec<u8>,
    /// While resyncing: a region's count reached zero since queued ops
    /// were last looked at.
    settled: bool,
    /// A host read waits for a read grant's renewal.
    reads_wait_for_grants: bool,
    /// The run's kept regions (see [`Run`]).
    kept: RegionSet,
    /// Whether the run's kept regions or members to rebuild in full may be
    /// persisted non-empty (an `AllInSync` is due once every member is).
    run_degraded: bool,
    /// The flush before being left the only copy in sync (reset when a
    /// replica joins again).
    sole_flush: Option<SoleFlush>,
    lease_until: Duration,
    /// This node's copy failed: it hands over (see the module's docs).
    own_copy_failed: bool,
    /// The replica it hands over to after its copy failed, once that one
    /// made every acknowledged write durable (reset by any new write).
    handover_flushed: Option<NodeId>,
    actions: VecDeque<Action>,
}

/// Internal op ids (copies) count down from the top, host op ids up from 0.
const INTERNAL_OP_BASE: u64 = 1 << 63;

impl Primary {
    /// The primary of `record` (at `revision`), which names this node primary,
    /// with this node's persisted write `intent` and `run` (a new run if
    /// this node was promoted into the record's epoch). Starts fencing.
    pub fn new(
        config: PrimaryConfig,
        record: ReplicaSet,
        revision: u64,
        intent: RegionSet,
        run: Run,
        now: Duration,
    ) -> Primary {
        assert_eq!(record.primary, config.me, "promoted in the record");
        let regions = config.geometry.regions();
        assert_eq!(intent.capacity(), regions);
        assert_eq!(run.kept.capacity(), regions);
        assert!(
            run.first_epoch <= record.epoch,
            "a run begins before it serves"
        );
        let run_degraded = !run.kept.is_empty() || !run.full.is_empty();
        let mut primary = Primary {
            config,
            phase: PrimaryPhase::Fencing,
            links: BTreeMap::new(),
            sessions: 0,
            ops: BTreeMap::new(),
            queued: BTreeSet::new(),
            deadline_scan_at: Duration::ZERO,
            next_internal_op: INTERNAL_OP_BASE,
            resync: intent.clone(),
            lacking: Vec::new(),
            settled: false,
            reads_wait_for_grants: false,
            kept: run.kept.clone(),
            run_degraded,
            sole_flush: None,
            intent,
            writes_in_region: vec![0; regions as usize],
            to_clean: BTreeMap::new(),
            clean_due_at: Duration::MAX,
            lease_until: Duration::ZERO,
            own_copy_failed: false,
            handover_flushed: None,
            actions: VecDeque::new(),
            commit_in_flight: false,
            commit_retry_at: None,
            uncertain: Vec::new(),
            revision,
            record,
        };
        let members: Vec<_> = primary.record.members.clone();
        for member in members.iter().filter(|m| m.node != config.me) {
            // Faulted within this node's run (the previous primary too,
            // faulted by the promotion that began it, which this node held
            // every acknowledged write for): it lacks what this node wrote
            // since (the intent and the kept regions; from now on its dirty
            // set), the regions where the copies in sync may differ (the
            // resync set, added when it is complete) and what it wrote
            // without an acknowledgement (its own intent, at its fence).
            // Faulted before the run, never in sync, or found unknown in
            // the run: rebuilt in full.
            let known = matches!(member.state, MemberState::Faulted { epoch } if epoch >= run.first_epoch)
                && !run.full.contains(&member.node);
            let mut dirty = RegionSet::new(regions);
            if known {
                dirty.union_with(&primary.intent);
                dirty.union_with(&run.kept);
            }
            let link = Link {
                token: Token::default(),
                state: LinkState::Down { retry_at: now },
                dirty,
                full: !known,
                flushed: false,
                written_since_flush: false,
                granted_until: Duration::ZERO,
            };
            primary.links.insert(member.node, link);
            if member.state == MemberState::InSync {
                primary.send_fence(member.node, false, now);
            }
        }
        primary.retire_links(now);
        primary.fencing_progress(now);
        primary
    }

    /// The stage.
    pub fn phase(&self) -> PrimaryPhase {
        self.phase
    }

    /// The epoch this primary serves.
    pub fn epoch(&self) -> Epoch {
        self.record.epoch
    }

    /// The record as last committed or seen.
    pub fn record(&self) -> &ReplicaSet {
        &self.record
    }

    /// Whether nothing waits on the time but the lease's end and
    /// housekeeping due seconds away (cleaning the write intent, asking a
    /// commit again): serving, no op in flight, every replica in sync.
    /// Its driver may look at the time less often meanwhile.
    pub fn quiet(&self) -> bool {
        self.phase == PrimaryPhase::Active
            && self.ops.is_empty()
            && self
                .links
                .values()
                .all(|link| link.state == LinkState::Live)
    }

    /// Whether this path serves (ANA Optimized) and every region is
    /// settled, so that a read may go to this node's copy directly: serving,
    /// the resync done.
    pub fn optimized(&self, now: Duration) -> bool {
        self.phase == PrimaryPhase::Active && self.serves(now) && self.granted(now)
    }

    /// Whether every replica the store may call in sync granted this
    /// primary reads at `now` (see the module's docs).
    fn granted(&self, now: Duration) -> bool {
        self.links
            .iter()
            .all(|(&node, link)| now < link.granted_until || !self.maybe_in_sync(node))
    }

    /// Until when a read served from this node's copy would be served
    /// under its lease and every grant it needs (as of now: a renewal moves
    /// it on). A driver that lets reads bypass [`Primary::host_read`] while
    /// [`Primary::optimized`] stops them at this time even if it could not
    /// look again (its process was frozen).
    pub fn reads_until(&self) -> Duration {
        self.links
            .iter()
            .filter(|(&node, _)| self.maybe_in_sync(node))
            .map(|(_, link)| link.granted_until)
            .fold(self.lease_until, Duration::min)
    }

    /// When a read grant is next due for renewal, or runs out (the driver
    /// looks at the time by then; `Duration::MAX` if no grant is needed).
    pub fn grants_due(&self) -> Duration {
        self.links
            .iter()
            .filter(|(&node, _)| self.maybe_in_sync(node))
            .map(|(_, link)| self.renewal_due(link))
            .min()
            .unwrap_or(Duration::MAX)
    }

    /// Once a third of its grant is spent.
    fn renewal_due(&self, link: &Link) -> Duration {
        link.granted_until
            .saturating_sub(self.config.read_grant * 2 / 3)
    }

    /// Whether this path serves (ANA Optimized): active or resyncing, with
    /// a valid lease, not handing over. While resyncing, or a read grant
    /// runs out, reads go through [`Primary::host_read`], which holds those
    /// of regions not yet copied, and all while a grant is renewed; and a
    /// primary whose copy failed serves nothing while resyncing (it hands
    /// over once active).
    pub fn serves(&self, now: Duration) -> bool {
        let phase_serves = match self.phase {
            PrimaryPhase::Active => true,
            PrimaryPhase::Resyncing => !self.own_copy_failed,
            PrimaryPhase::Fencing | PrimaryPhase::Deposed => false,
        };
        phase_serves && now < self.lease_until && !self.handing_over() && !self.handover_in_doubt()
    }

    /// A record naming another primary or epoch was asked for and its fate
    /// is not known (the store's answer was lost): it may be the store's,
    /// and the next primary may serve already (a handover's does not wait
    /// for this one's grants).
    fn handover_in_doubt(&self) -> bool {
        self.uncertain
            .iter()
            .any(|(_, r)| r.primary != self.config.me || r.epoch != self.record.epoch)
    }

    /// The lease of this node runs until `until` (as this node sees it,
    /// with margin for the store's view). A lease that lapsed is not taken
    /// back: meanwhile another primary may have been promoted, so this one
    /// steps down (and the driver, if the record still names this node,
    /// asks for a new epoch).
    pub fn set_lease(&mut self, until: Duration, now: Duration) {
        if self.lease_lapsed(now) {
            return self.depose();
        }
        self.lease_until = self.lease_until.max(until);
    }

    fn lease_lapsed(&self, now: Duration) -> bool {
        self.lease_until > Duration::ZERO && now >= self.lease_until
    }

    /// The next action, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Regions a replica still lacks, if it is being rebuilt or is faulted
    /// (progress): those left to copy and those being copied.
    pub fn dirty_regions(&self, node: NodeId) -> Option<u32> {
        let link = self.links.get(&node)?;
        let copying = self
            .ops
            .values()
            .filter(|op| matches!(op.kind, OpKind::Copy { to, .. } if to == node))
            .count() as u32;
        match link.state {
            LinkState::Live | LinkState::Joining => None,
            _ if link.full => Some(self.config.geometry.regions()),
            _ => Some(link.dirty.len() + copying),
        }
    }

    /// Each replica's link, as a word: `fencing`, `in-sync`, `rebuilding`,
    /// `joining` or `down`.
    pub fn links(&self) -> Vec<(NodeId, &'static str)> {
        self.links
            .iter()
            .map(|(&node, link)| {
                let word = match link.state {
                    LinkState::Fencing { .. } => "fencing",
                    LinkState::Live => "in-sync",
                    LinkState::Rebuilding => "rebuilding",
                    LinkState::Joining => "joining",
                    LinkState::Down { .. } => "down",
                };
                (node, word)
            })
            .collect()
    }

    // ---- host commands ----

    /// A host write of `extent` (its data is the driver's, under `op`, an id
    /// never given before).
    pub fn host_write(&mut self, op: OpId, extent: Extent, fua: bool, now: Duration) {
        self.check_op_id(op);
        if let Some(refusal) = self.refusal(now) {
            return self.complete(op, refusal);
        }
        self.handover_flushed = None;
        self.ops.insert(
            op,
            Op {
                kind: OpKind::Write { extent, fua },
                queued: true,
                local_pending: false,
                required: Vec::new(),
                optional: Vec::new(),
                deadline: now,
                answered: false,
                local_failed: false,
            },
        );
        self.queued.insert(op);
        self.start_queued(now);
    }

    /// A host read of `extent`, served from this node's copy (once the
    /// resync copied its regions, if one is under way).
    pub fn host_read(&mut self, op: OpId, extent: Extent, now: Duration) {
        self.check_op_id(op);
        if let Some(refusal) = self.refusal(now) {
            return self.complete(op, refusal);
        }
        let mut read = new_op(OpKind::Read { extent }, now);
        if !self.granted(now) {
            read.queued = true;
            self.queued.insert(op);
            self.ops.insert(op, read);
            self.reads_wait_for_grants = true;
            return self.renew_grants(now);
        }
        if self.unsettled(&extent) {
            read.queued = true;
            self.queued.insert(op);
            self.ops.insert(op, read);
            // Its regions' copies go first.
            return self.start_copies(now);
        }
        self.ops.insert(op, read);
        self.actions.push_back(Action::LocalRead { op, extent });
    }

    /// A host flush: every write completed before it becomes durable on
    /// every in-sync replica.
    pub fn host_flush(&mut self, op: OpId, now: Duration) {
        self.check_op_id(op);
        if let Some(refusal) = self.refusal(now) {
            return self.complete(op, refusal);
        }
        let mut flush = new_op(OpKind::Flush, now);
        flush.deadline = now + self.config.replica_timeout;
        for (&node, link) in &self.links {
            if link.required() {
                flush.required.push(node);
                self.actions.push_back(Action::Send {
                    to: node,
                    msg: ToReplica::Flush {
                        token: link.token,
                        op,
                    },
                });
            }
        }
        self.ops.insert(op, flush);
        self.actions.push_back(Action::LocalFlush { op });
    }

    /// Host op ids are unique for the primary's life (an answered op may
    /// stay tracked while a rebuilding replica's answer is due) and below 2^63.
    fn check_op_id(&self, op: OpId) {
        assert!(op.0 < INTERNAL_OP_BASE, "host op ids are below 2^63");
        debug_assert!(!self.ops.contains_key(&op), "op id {op:?} reused");
    }

    fn refusal(&self, now: Duration) -> Option<HostResult> {
        match self.phase {
            PrimaryPhase::Deposed => Some(HostResult::Inaccessible),
            _ if self.serves(now) => None,
            _ => Some(HostResult::Transition),
        }
    }

    fn complete(&mut self, op: OpId, result: HostResult) {
        self.actions.push_back(Action::Complete { op, result });
    }

    // ---- completions and replies ----

    /// The local read, write or flush of `op` is done.
    pub fn local_done(&mut self, op: OpId, now: Duration) {
        let Some(entry) = self.ops.get_mut(&op) else {
            return;
        };
        entry.local_pending = false;
        if let OpKind::Copy { to, region } = entry.kind {
            // The region is read: send it, unless the replica fell out meanwhile.
            let Some(link) = self.links.get(&to) else {
                return;
            };
            let sendable = matches!(
                link.state,
                LinkState::Live | LinkState::Rebuilding | LinkState::Joining
            );
            if sendable {
                entry.deadline = now + self.config.replica_timeout;
                if self.phase == PrimaryPhase::Resyncing {
                    entry.required.push(to);
                } else {
                    entry.optional.push(to);
                }
                let extent = self.config.geometry.extent_of(region);
                let msg = ToReplica::Copy {
                    token: link.token,
                    op,
                    extent,
                };
                self.actions.push_back(Action::Send { to, msg });
            }
        }
        self.progress(op, now);
        self.pump(now);
    }

    /// The local read, write or flush of `op` failed: this node's copy
    /// failed. It hands over to an in-sync replica (see the module's docs).
    pub fn local_failed(&mut self, op: OpId, now: Duration) {
        self.own_copy_failed = true;
        let Some(entry) = self.ops.get_mut(&op) else {
            return;
        };
        entry.local_pending = false;
        entry.local_failed = true;
        let kind = entry.kind;
        match kind {
            // Its region cannot be sent: the replica is rebuilt later, by
            // the next primary.
            OpKind::Copy { to, .. } => self.link_failed(to, now),
            // The replicas it was sent to may hold it, this copy does not.
            // An in-sync replica this primary hands over to (now, or once
            // its resync is done) is the reference next, and those in sync
            // got the same write; any other (joining, being rebuilt, or in
            // sync with none to hand over to) would be left, or made, in
            // sync with a write this copy lacks: faulted, rebuilt from the
            // reference once it works (the write was never acknowledged).
            OpKind::Write { .. } => {
                let stranded = self.phase == PrimaryPhase::Active && self.move_target().is_none();
                let faulted: Vec<NodeId> = self
                    .links
                    .iter()
                    .filter(|(_, link)| match link.state {
                        LinkState::Joining | LinkState::Rebuilding => true,
                        LinkState::Live => stranded,
                        LinkState::Fencing { .. } | LinkState::Down { .. } => false,
                    })
                    .map(|(&node, _)| node)
                    .collect();
                for node in faulted {
                    self.link_failed(node, now);
                }
            }
            _ => {}
        }
        self.progress(op, now);
        self.pump(now);
    }

    /// Whether this node's copy failed under this primary.
    pub fn own_copy_failed(&self) -> bool {
        self.own_copy_failed
    }

    /// A replica's answer.
    pub fn replica_reply(&mut self, from: NodeId, reply: FromReplica, now: Duration) {
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        let Some(link) = self.links.get(&from) else {
            return;
        };
        match reply {
            FromReplica::Fenced {
                token,
                intent,
                unclean,
            } if token == link.token => {
                if unclean {
                    self.unclean(from, now);
                } else {
                    self.fenced(from, intent, now);
                }
            }
            FromReplica::Done { token, op } if token == link.token => {
                if let Some(entry) = self.ops.get_mut(&op) {
                    // Sent `replica_timeout` before its deadline.
                    let sent = entry.deadline.saturating_sub(self.config.replica_timeout);
                    let link = self.links.get_mut(&from).expect("a link");
                    link.granted_until = link.granted_until.max(sent + self.config.read_grant);
                    entry.required.retain(|&n| n != from);
                    entry.optional.retain(|&n| n != from);
                    self.progress(op, now);
                }
            }
            FromReplica::Refused { token, .. } if token == link.token => {
                // It restarted, this session is stale, or a newer epoch
                // fenced it. Only the store tells a newer primary from
                // whoever else holds the cluster's keys (one that fenced
                // with epoch 2^64-1 made this primary depose and take a
                // new epoch 60 times a second): out it goes, and the
                // record change that takes it out fails against a newer
                // primary's record, which deposes this one. No write
                // completes without it before that change is committed.
                self.link_failed(from, now);
            }
            // An answer to an earlier session.
            _ => {}
        }
        self.pump(now);
    }

    /// A replica that lost power may lack writes it acknowledged: rebuilt
    /// in full, never relied on as it is (one fenced at promotion is faulted).
    fn unclean(&mut self, node: NodeId, now: Duration) {
        let regions = self.config.geometry.regions();
        let link = self.links.get_mut(&node).expect("a link");
        let LinkState::Fencing { rejoin, .. } = link.state else {
            return;
        };
        self.mark_full(node);
        if rejoin {
            self.fenced(node, RegionSet::new(regions), now);
        } else {
            self.link_failed(node, now);
        }
    }

    fn fenced(&mut self, node: NodeId, intent: RegionSet, now: Duration) {
        let geometry = self.config.geometry;
        let (timeout, read_grant) = (self.config.replica_timeout, self.config.read_grant);
        let link = self.links.get_mut(&node).expect("a link");
        let LinkState::Fencing { rejoin, deadline } = link.state else {
            return;
        };
        // The fence was sent `replica_timeout + read_grant` before its deadline.
        link.granted_until = link
            .granted_until
            .max(deadline.saturating_sub(timeout + read_grant) + read_grant);
        if rejoin {
            // It may hold writes others lack (its intent) and lacks what
            // it missed (dirty), or everything if that is not known here.
            if link.full {
                link.dirty = RegionSet::full(geometry.regions());
                link.full = false;
            } else {
                link.dirty.union_with(&intent);
            }
            link.state = LinkState::Rebuilding;
        } else {
            link.state = LinkState::Live;
            link.full = false;
            self.resync.union_with(&intent);
            self.fencing_progress(now);
        }
    }

    // ---- the store ----

    /// The record change asked for was committed at `revision`.
    pub fn committed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        self.commit_in_flight = false;
        self.uncertain.pop();
        self.adopt(revision, record, now);
    }

    /// The record change failed: the record changed meanwhile (`current`)
    /// or the store could not be reached (`None`, retried later).
    pub fn commit_failed(&mut self, current: Option<(u64, ReplicaSet)>, now: Duration) {
        self.commit_in_flight = false;
        match current {
            Some((revision, record)) => {
                self.uncertain.pop();
                self.adopt(revision, record, now)
            }
            None => self.commit_retry_at = Some(now + self.config.replica_timeout),
        }
    }

    /// The record changed in the store (seen by a watch or a read).
    pub fn record_changed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        if revision > self.revision {
            self.adopt(revision, record, now);
        }
    }

    fn adopt(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        if record.epoch != self.record.epoch || record.primary != self.config.me {
            return self.depose();
        }
        // Replicas added or removed (by the operator or the controller):
        // this primary stops, and the driver starts a new one under the
        // next epoch, which fences the members it now has. Rather than
        // grow or shrink live links: a change is rare, a restart is the
        // path every failover takes already.
        if !record.same_members(&self.record) {
            return self.depose();
        }
        if revision >= self.revision {
            self.revision = revision;
            self.record = record;
        }
        // A later revision tells what became of every change based on an earlier one.
        self.uncertain.retain(|(base, _)| *base >= revision);
        for (&node, link) in self.links.iter_mut() {
            if link.state == LinkState::Joining && self.record.is_in_sync(node) {
                link.state = LinkState::Live;
            }
        }
        // A replica faulted by someone else (itself, after losing power):
        // never put back in sync without a rebuild, whether it was live or
        // still being fenced as an in-sync one at promotion.
        let dropped: Vec<NodeId> = self
            .links
            .iter()
            .filter(|(&node, link)| {
                matches!(
                    link.state,
                    LinkState::Live | LinkState::Fencing { rejoin: false, .. }
                ) && !self.maybe_in_sync(node)
            })
            .map(|(&node, _)| node)
            .collect();
        for node in dropped {
            self.mark_full(node);
            self.link_failed(node, now);
        }
        self.retire_links(now);
        self.maybe_commit();
        let ops: Vec<OpId> = self.ops.keys().copied().collect();
        for op in ops {
            self.progress(op, now);
        }
        self.pump(now);
    }

    /// Stops writing to the replicas the record retires: the record then
    /// takes them out of the in-sync set (after a local flush if this node
    /// is left the only copy in sync), and whoever writes the record next
    /// drops them.
    fn retire_links(&mut self, now: Duration) {
        let retired: Vec<NodeId> = self
            .record
            .retire
            .iter()
            .copied()
            .filter(|&node| node != self.config.me)
            .collect();
        for node in retired {
            self.link_failed(node, now);
        }
        // A link that was down already: its fault is committed here.
        self.maybe_commit();
    }

    /// The target of the move the record asks for, if this primary can
    /// hand over to it: an in-sync replica it reaches; after its own copy
    /// failed, any such replica (the record's choice first).
    fn move_target(&self) -> Option<NodeId> {
        let can_take = |target: NodeId| {
            let live = self
                .links
                .get(&target)
                .is_some_and(|l| l.state == LinkState::Live);
            self.phase == PrimaryPhase::Active && live && self.record.is_in_sync(target)
        };
        let asked = self.record.move_to.filter(|&t| can_take(t));
        if asked.is_some() || !self.own_copy_failed {
            return asked;
        }
        self.record
            .in_sync_secondaries()
            .find(|&node| can_take(node))
    }

    /// Whether a planned move is under way: no new host commands.
    fn handing_over(&self) -> bool {
        self.move_target().is_some()
    }

    /// Hands over once nothing is in flight and the record is settled.
    fn try_hand_over(&mut self, now: Duration) {
        if self.commit_in_flight
            || !self.uncertain.is_empty()
            || self.faults_pending()
            || self.ops.values().any(Op::is_host)
            || self.wanted_record() != self.record
        {
            return;
        }
        let Some(target) = self.move_target() else {
            return;
        };
        if self.own_copy_failed && self.handover_flushed != Some(target) {
            // Left the only copy in sync it may be: every acknowledged
            // write durable there first (a power loss there next must not
            // lose one), as a primary left alone flushes its own copy.
            return self.flush_for_handover(target, now);
        }
        let mut next = self.record.handed_over(target);
        if self.own_copy_failed {
            // Faulted before the new primary's run: rebuilt in full once
            // its copy works again (a failed disk may lack anything).
            let epoch = self.record.epoch;
            next.set_state(self.config.me, MemberState::Faulted { epoch });
        } else {
            // Every write is done everywhere: the intents can be emptied
            // now, so that the new primary has (almost) nothing to resync.
            self.clean_regions(None);
        }
        self.commit_in_flight = true;
        self.uncertain.push((self.revision, next.clone()));
        self.actions.push_back(Action::Commit {
            base_revision: self.revision,
            record: next,
        });
    }

    /// Asks `target` to make its writes durable (once: the answer, or its
    /// link's failure, ends the op).
    fn flush_for_handover(&mut self, target: NodeId, now: Duration) {
        let running = self
            .ops
            .values()
            .any(|op| matches!(op.kind, OpKind::HandoverFlush { to } if to == target));
        let Some(link) = self.links.get(&target).filter(|_| !running) else {
            return;
        };
        let token = link.token;
        let op = OpId(self.next_internal_op);
        self.next_internal_op += 1;
        let mut flush = new_op(OpKind::HandoverFlush { to: target }, now);
        flush.required.push(target);
        flush.deadline = now + self.config.replica_timeout;
        self.ops.insert(op, flush);
        let msg = ToReplica::Flush { token, op };
        self.actions.push_back(Action::Send { to: target, msg });
    }

    /// The record this primary wants: its links' standing over the last one
    /// seen, a move it cannot make dropped, and no previous primary.
    fn wanted_record(&self) -> ReplicaSet {
        let mut wanted = self.record.clone();
        // The previous primary matters only while this epoch's primary
        // never served (it lost power before): this one serves (its driver
        // recorded the epoch before building it). Cleared, a retired
        // previous primary may leave the record.
        wanted.previous = None;
        // (A move asked for while resyncing waits for the resync.)
        let can_tell = self.phase != PrimaryPhase::Resyncing;
        if self.record.move_to.is_some() && can_tell && self.move_target().is_none() {
            wanted.move_to = None;
        }
        for (&node, link) in &self.links {
            let state = if link.wants_in_sync() {
                MemberState::InSync
            } else if self.record.is_in_sync(node) {
                MemberState::Faulted {
                    epoch: self.record.epoch,
                }
            } else {
                continue;
            };
            if self.record.state_of(node).is_some() {
                wanted.set_state(node, state);
            }
        }
        wanted
    }

    fn maybe_commit(&mut self) {
        if self.commit_in_flight || self.phase == PrimaryPhase::Deposed {
            return;
        }
        let wanted = self.wanted_record();
        // Left the only copy in sync, this node must first hold durably what
        // the replicas it drops held for it (acknowledged, maybe unflushed here).
        let alone = wanted.in_sync_secondaries().next().is_none()
            && self.record.in_sync_secondaries().next().is_some();
        if alone && !self.sole_flushed() {
            return;
        }
        // With a change of unknown outcome, commit even an unchanged record:
        // once a later revision exists, the unknown change can no longer land.
        if wanted != self.record || !self.uncertain.is_empty() {
            self.commit_in_flight = true;
            self.commit_retry_at = None;
            self.uncertain.push((self.revision, wanted.clone()));
            self.actions.push_back(Action::Commit {
                base_revision: self.revision,
                record: wanted,
            });
        }
    }

    /// Whether a local flush started after the writes in flight completed
    /// is done; starts one if none is under way.
    fn sole_flushed(&mut self) -> bool {
        if self.sole_flush == Some(SoleFlush::Done) {
            return true;
        }
        if self.sole_flush.is_none() {
            let op = OpId(self.next_internal_op);
            self.next_internal_op += 1;
            self.sole_flush = Some(SoleFlush::Running(op));
            self.ops
                .insert(op, new_op(OpKind::SoleFlush, Duration::ZERO));
            self.actions.push_back(Action::LocalFlush { op });
        }
        false
    }

    /// Whether a replica this primary dropped is still in sync in the
    /// record: then no write may be acknowledged (it may have missed it).
    fn faults_pending(&self) -> bool {
        self.links
            .iter()
            .any(|(&node, link)| !link.wants_in_sync() && self.maybe_in_sync(node))
    }

    /// Whether the store may call `node` in sync: the record says so, or a
    /// change whose outcome is unknown does.
    fn maybe_in_sync(&self, node: NodeId) -> bool {
        self.record.is_in_sync(node) || self.uncertain.iter().any(|(_, r)| r.is_in_sync(node))
    }

    fn depose(&mut self) {
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        self.phase = PrimaryPhase::Deposed;
        let ops = std::mem::take(&mut self.ops);
        self.queued.clear();
        for (op, entry) in ops {
            if entry.is_host() && !entry.answered {
                self.complete(op, HostResult::Inaccessible);
            }
        }
    }

    // ---- time ----

    /// The time is `now`: timeouts, faulted replicas asked back, copies, cleaning.
    pub fn tick(&mut self, now: Duration) {
        if self.lease_lapsed(now) {
            self.depose();
        }
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        let mut late = Vec::new();
        if now >= self.deadline_scan_at {
            // Ops sent from now on are due `replica_timeout` later.
            let mut next = now + self.config.replica_timeout;
            for entry in self.ops.values() {
                if entry.required.is_empty() && entry.optional.is_empty() {
                    continue;
                }
                if now >= entry.deadline {
                    late.extend(entry.required.iter().chain(&entry.optional).copied());
                }
                next = next.min(entry.deadline);
            }
            // Late ones (if their replica was already down, they stay
            // late): looked at again at the next tick.
            self.deadline_scan_at = if late.is_empty() { next } else { now };
        } else {
            self.debug_check_deadlines();
        }
        for (&node, link) in &self.links {
            if matches!(link.state, LinkState::Fencing { deadline, .. } if now >= deadline) {
                late.push(node);
            }
            // Answering, but too late to grant reads (a deep queue on a
            // slow disk): reads would wait for ever; out it goes.
            let starving = self.reads_wait_for_grants
                && matches!(link.state, LinkState::Live | LinkState::Joining)
                && self.maybe_in_sync(node)
                && now >= link.granted_until + self.config.replica_timeout;
            if starving {
                late.push(node);
            }
        }
        late.sort();
        late.dedup();
        for node in late {
            self.link_failed(node, now);
        }
        if self.commit_retry_at.is_some_and(|at| now >= at) {
            self.maybe_commit();
        }
        self.renew_grants(now);
        if self.phase == PrimaryPhase::Active {
            let rejoining: Vec<NodeId> = self
                .links
                .iter()
                .filter(|(&node, link)| {
                    matches!(link.state, LinkState::Down { retry_at } if now >= retry_at)
                        && !self.maybe_in_sync(node)
                        && !self.record.retire.contains(&node)
                })
                .map(|(&node, _)| node)
                .collect();
            for node in rejoining {
                self.send_fence(node, true, now);
            }
        }
        self.pump(now);
    }

    /// Debug builds: no op waiting for a replica is due before the deadline
    /// scan's next time (what lets `tick` skip the scan until then).
    fn debug_check_deadlines(&self) {
        debug_assert!(
            self.ops.values().all(|op| {
                (op.required.is_empty() && op.optional.is_empty())
                    || op.deadline >= self.deadline_scan_at
            }),
            "an op is due before the deadline scan"
        );
    }

    /// Asks every replica whose read grant is due for renewal, and none
    /// is on its way, to renew it (see the module's docs).
    /// (While fencing too: a replica fenced early would otherwise hear
    /// nothing while another's fence is slow, and say this primary went
    /// silent.)
    fn renew_grants(&mut self, now: Duration) {
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        let renewing: Vec<NodeId> = self
            .ops
            .values()
            .filter_map(|op| match op.kind {
                OpKind::Grant { to } => Some(to),
                _ => None,
            })
            .collect();
        let due: Vec<(NodeId, Token)> = self
            .links
            .iter()
            .filter(|(&node, link)| {
                matches!(link.state, LinkState::Live | LinkState::Joining)
                    && now >= self.renewal_due(link)
                    && self.maybe_in_sync(node)
                    && !renewing.contains(&node)
            })
            .map(|(&node, link)| (node, link.token))
            .collect();
        for (to, token) in due {
            let op = OpId(self.next_internal_op);
            self.next_internal_op += 1;
            let mut grant = new_op(OpKind::Grant { to }, now);
            grant.required.push(to);
            grant.deadline = now + self.config.replica_timeout;
            self.ops.insert(op, grant);
            let msg = ToReplica::Grant { token, op };
            self.actions.push_back(Action::Send { to, msg });
        }
    }

    fn send_fence(&mut self, node: NodeId, rejoin: bool, now: Duration) {
        self.sessions += 1;
        let token = Token {
            epoch: self.record.epoch,
            session: self.sessions,
        };
        let link = self.links.get_mut(&node).expect("a link");
        link.token = token;
        // A fence may wait out an older primary's read grant first.
        link.state = LinkState::Fencing {
            deadline: now + self.config.replica_timeout + self.config.read_grant,
            rejoin,
        };
        self.actions.push_back(Action::Send {
            to: node,
            msg: ToReplica::Fence { token },
        });
    }

    /// What `node` lacks is not known here: it is rebuilt in full, and so
    /// after a restart of this primary within its run.
    fn mark_full(&mut self, node: NodeId) {
        let link = self.links.get_mut(&node).expect("a link");
        link.full = true;
        self.run_degraded = true;
        self.actions.push_back(Action::Full(node));
    }

    /// A replica did not answer in time, refused, or its answer was lost.
    fn link_failed(&mut self, node: NodeId, now: Duration) {
        let geometry = self.config.geometry;
        let promoting = self.phase != PrimaryPhase::Active;
        let Some(link) = self.links.get_mut(&node) else {
            return;
        };
        if matches!(link.state, LinkState::Down { .. }) {
            return;
        }
        if promoting && !matches!(link.state, LinkState::Fencing { rejoin: true, .. }) {
            // What it holds against the resync set is not known.
            self.mark_full(node);
        }
        let link = self.links.get_mut(&node).expect("a link");
        if self.phase == PrimaryPhase::Resyncing && link.state == LinkState::Live {
            // Hosts no longer wait for what it lacks (its copies in
            // flight count until they end).
            let lacked: Vec<u32> = link.dirty.iter().collect();
            for region in lacked {
                self.one_less_lacking(region);
            }
        }
        let link = self.links.get_mut(&node).expect("a link");
        link.state = LinkState::Down {
            retry_at: now + self.config.reattach_interval,
        };
        link.flushed = false;
        // Everything in flight to it, it may have missed.
        for entry in self.ops.values_mut() {
            let sent = entry.required.contains(&node) || entry.optional.contains(&node);
            entry.required.retain(|&n| n != node);
            entry.optional.retain(|&n| n != node);
            let missed = match entry.kind {
                OpKind::Write { .. } => !entry.queued,
                OpKind::Copy { to, .. } => to == node || sent,
                _ => false,
            };
            if missed {
                if let Some(extent) = entry.extent(&geometry) {
                    for region in geometry.regions_of(&extent) {
                        link.dirty.insert(region);
                    }
                }
            }
        }
        self.maybe_commit();
        let ops: Vec<OpId> = self.ops.keys().copied().collect();
        for op in ops {
            self.progress(op, now);
        }
        self.fencing_progress(now);
    }

    // ---- progress ----

    fn progress(&mut self, op: OpId, now: Duration) {
        let faults_pending = self.faults_pending();
        let granted = self.granted(now);
        // A write that failed here is retried on the primary this one hands
        // over to (while resyncing, once it is active).
        let retried_elsewhere = self.handing_over() || self.phase == PrimaryPhase::Resyncing;
        let Some(entry) = self.ops.get_mut(&op) else {
            return;
        };
        if entry.is_host()
            && !entry.answered
            && !entry.queued
            && !entry.local_pending
            && entry.required.is_empty()
            && !faults_pending
        {
            entry.answered = true;
            let result = match entry.kind {
                // A read is only as good as the lease it completes under.
                OpKind::Read { .. } if now >= self.lease_until || !granted => {
                    HostResult::Transition
                }
                // This copy failed: retried on the primary it hands over to.
                _ if entry.local_failed && retried_elsewhere => HostResult::Transition,
                _ => HostResult::Ok,
            };
            self.actions.push_back(Action::Complete { op, result });
        }
        let done = entry.finished() && (entry.answered || !entry.is_host());
        if done {
            let entry = self.ops.remove(&op).expect("present");
            self.retire(entry, now);
        }
    }

    fn retire(&mut self, entry: Op, now: Duration) {
        match entry.kind {
            OpKind::Write { extent, .. } => {
                for region in self.config.geometry.regions_of(&extent) {
                    let count = &mut self.writes_in_region[region as usize];
                    *count -= 1;
                    if *count == 0 {
                        self.to_clean.insert(region, now);
                        self.clean_due_at = self.clean_due_at.min(now + self.config.clean_delay);
                    }
                }
                self.start_queued(now);
            }
            // (While resyncing, the pump that follows starts what the
            // copy settled.)
            OpKind::Copy { region, .. } if self.phase == PrimaryPhase::Resyncing => {
                self.one_less_lacking(region);
            }
            OpKind::Copy { .. } => self.start_queued(now),
            OpKind::JoinFlush { to } => {
                if let Some(link) = self.links.get_mut(&to) {
                    let clean = link.state == LinkState::Rebuilding && !link.written_since_flush;
                    link.flushed = clean;
                }
            }
            OpKind::SoleFlush => {
                self.sole_flush = Some(SoleFlush::Done);
                self.maybe_commit();
            }
            OpKind::HandoverFlush { to } => self.handover_flushed = Some(to),
            OpKind::Read { .. } | OpKind::Flush | OpKind::Grant { .. } => {}
        }
    }

    /// Rebuilding replicas with nothing left to copy or in flight are
    /// flushed, then join (a replica that joins holds durably what it was sent).
    fn rebuilt(&mut self, now: Duration) {
        let mut joined = false;
        let mut to_flush = Vec::new();
        for (&node, link) in self.links.iter_mut() {
            if link.state != LinkState::Rebuilding || !link.dirty.is_empty() {
                continue;
            }
            let busy = self.ops.values().any(|op| {
                op.optional.contains(&node)
                    || matches!(op.kind, OpKind::Copy { to, .. } | OpKind::JoinFlush { to } if to == node)
            });
            if busy {
                continue;
            }
            if link.flushed {
                link.state = LinkState::Joining;
                joined = true;
                self.sole_flush = None;
            } else {
                link.written_since_flush = false;
                to_flush.push((node, link.token));
            }
        }
        for (to, token) in to_flush {
            let op = OpId(self.next_internal_op);
            self.next_internal_op += 1;
            let mut flush = new_op(OpKind::JoinFlush { to }, now);
            flush.optional.push(to);
            flush.deadline = now + self.config.replica_timeout;
            self.ops.insert(op, flush);
            let msg = ToReplica::Flush { token, op };
            self.actions.push_back(Action::Send { to, msg });
        }
        if joined {
            self.maybe_commit();
        }
    }

    /// Starts queued writes that no longer overlap a write or copy in
    /// flight, and queued reads and writes whose regions the resync copied.
    fn start_queued(&mut self, now: Duration) {
        if !matches!(self.phase, PrimaryPhase::Active | PrimaryPhase::Resyncing) {
            return;
        }
        debug_assert!(
            self.ops
                .iter()
                .all(|(id, op)| op.queued == self.queued.contains(id)),
            "queued lists the queued ops"
        );
        let geometry = self.config.geometry;
        let mut next = self.queued.first().copied();
        while let Some(id) = next {
            next = self
                .queued
                .range((Bound::Excluded(id), Bound::Unbounded))
                .next()
                .copied();
            let (extent, fua) = match self.ops[&id].kind {
                OpKind::Write { extent, fua } => (extent, fua),
                OpKind::Read { extent } => {
                    if self.unsettled(&extent) {
                        continue;
                    }
                    if self.granted(now) {
                        self.start_read(id, extent);
                    } else {
                        self.reads_wait_for_grants = true;
                    }
                    continue;
                }
                _ => continue,
            };
            if self.unsettled(&extent) {
                continue;
            }
            let blocked = self.ops.iter().any(|(&other, op)| {
                other != id
                    && !op.queued
                    && op.extent(&geometry).is_some_and(|e| e.overlaps(&extent))
            });
            // Queued writes keep their order: an earlier queued write that
            // overlaps goes first.
            let behind = self.queued.range(..id).any(|earlier| {
                matches!(self.ops[earlier].kind, OpKind::Write { extent: e, .. } if e.overlaps(&extent))
            });
            if !blocked && !behind {
                self.start_write(id, extent, fua, now);
            }
        }
    }

    fn start_read(&mut self, op: OpId, extent: Extent) {
        let entry = self.ops.get_mut(&op).expect("queued");
        entry.queued = false;
        self.queued.remove(&op);
        self.actions.push_back(Action::LocalRead { op, extent });
    }

    /// Whether a region of `extent` may still differ among the copies in
    /// sync: the resync has yet to copy it to some in-sync replica (or its
    /// copy is in flight). Never while active.
    fn unsettled(&self, extent: &Extent) -> bool {
        self.phase == PrimaryPhase::Resyncing
            && self
                .config
                .geometry
                .regions_of(extent)
                .any(|region| self.lacking[region as usize] > 0)
    }

    /// A resync copy of `region` is done, or will not be made: one fewer
    /// for it to wait on.
    fn one_less_lacking(&mut self, region: u32) {
        let count = &mut self.lacking[region as usize];
        debug_assert!(*count > 0, "region {region} counted");
        *count -= 1;
        if *count == 0 {
            self.settled = true;
        }
    }

    /// A region some queued host op waits for that a live replica still
    /// lacks, and that replica, unless `busy`.
    fn waited_region(&self, busy: impl Fn(u32) -> bool) -> Option<(NodeId, u32)> {
        let geometry = self.config.geometry;
        self.queued.iter().find_map(|id| {
            let extent = match self.ops[id].kind {
                OpKind::Write { extent, .. } | OpKind::Read { extent } => extent,
                _ => return None,
            };
            geometry.regions_of(&extent).find_map(|region| {
                if self.lacking[region as usize] == 0 {
                    return None;
                }
                self.links
                    .iter()
                    .find(|(_, l)| {
                        l.state == LinkState::Live && l.dirty.contains(region) && !busy(region)
                    })
                    .map(|(&node, _)| (node, region))
            })
        })
    }

    fn start_write(&mut self, op: OpId, extent: Extent, fua: bool, now: Duration) {
        let geometry = self.config.geometry;
        for region in geometry.regions_of(&extent) {
            self.writes_in_region[region as usize] += 1;
            if self.intent.insert(region) {
                self.actions.push_back(Action::IntentSet(region));
            }
        }
        let mut required = Vec::new();
        let mut optional = Vec::new();
        for (&node, link) in self.links.iter_mut() {
            let has_all = geometry
                .regions_of(&extent)
                .all(|r| !link.dirty.contains(r));
            let send = match link.state {
                LinkState::Live | LinkState::Joining => {
                    required.push(node);
                    true
                }
                LinkState::Rebuilding if has_all => {
                    optional.push(node);
                    link.written_since_flush = true;
                    link.flushed = false;
                    true
                }
                _ => {
                    for region in geometry.regions_of(&extent) {
                        link.dirty.insert(region);
                    }
                    false
                }
            };
            if send {
                let msg = ToReplica::Write {
                    token: link.token,
                    op,
                    extent,
                    fua,
                };
                self.actions.push_back(Action::Send { to: node, msg });
            }
        }
        let entry = self.ops.get_mut(&op).expect("queued");
        entry.queued = false;
        self.queued.remove(&op);
        entry.local_pending = true;
        entry.required = required;
        entry.optional = optional;
        entry.deadline = now + self.config.replica_timeout;
        self.actions
            .push_back(Action::LocalWrite { op, extent, fua });
    }

    /// Moves promotion and rebuilds along: copies, stage changes, cleaning.
    fn pump(&mut self, now: Duration) {
        if self.phase == PrimaryPhase::Deposed {
            return;
        }
        self.start_copies(now);
        if self.phase == PrimaryPhase::Active {
            self.rebuilt(now);
        }
        let resyncing = self.phase == PrimaryPhase::Resyncing;
        if resyncing && self.resync_done() {
            debug_assert!(self.lacking.iter().all(|&n| n == 0), "every copy counted");
            self.lacking = Vec::new();
            self.settled = true;
            self.phase = PrimaryPhase::Active;
            let resynced: Vec<u32> = self.resync.iter().collect();
            self.to_clean
                .extend(resynced.into_iter().map(|region| (region, now)));
            self.clean_due_at = self.clean_due_at.min(now + self.config.clean_delay);
            self.resync = RegionSet::new(self.config.geometry.regions());
        }
        if resyncing && std::mem::take(&mut self.settled) {
            // A copy done or a replica dropped may have settled what a
            // queued op waits for (and, the resync done, everything is).
            self.start_queued(now);
        }
        if self.reads_wait_for_grants && self.granted(now) {
            // Renewed, or the replica that had not left the in-sync set.
            self.reads_wait_for_grants = false;
            self.start_queued(now);
        }
        self.clean(now);
        self.try_hand_over(now);
    }

    fn fencing_progress(&mut self, now: Duration) {
        if self.phase != PrimaryPhase::Fencing {
            return;
        }
        let fencing = self
            .links
            .values()
            .any(|l| matches!(l.state, LinkState::Fencing { rejoin: false, .. }));
        if fencing {
            return;
        }
        // Every in-sync replica is fenced or dropped: copy what may differ,
        // to them and to any replica whose dirty set is known (the previous
        // primary's: it may lack those regions too).
        self.phase = PrimaryPhase::Resyncing;
        self.lacking = vec![0; self.config.geometry.regions() as usize];
        for link in self.links.values_mut() {
            if link.state == LinkState::Live {
                link.dirty = self.resync.clone();
                for region in self.resync.iter() {
                    self.lacking[region as usize] += 1;
                }
            } else if !link.full {
                link.dirty.union_with(&self.resync);
            }
        }
        self.pump(now);
    }

    fn resync_done(&self) -> bool {
        !self.faults_pending()
            && self
                .links
                .values()
                .all(|l| l.state != LinkState::Live || l.dirty.is_empty())
            && !self
                .ops
                .values()
                .any(|op| matches!(op.kind, OpKind::Copy { .. }))
    }

    fn start_copies(&mut self, now: Duration) {
        let geometry = self.config.geometry;
        let copying_state = match self.phase {
            PrimaryPhase::Resyncing => LinkState::Live,
            PrimaryPhase::Active => LinkState::Rebuilding,
            _ => return,
        };
        let wanted = self
            .links
            .values()
            .any(|l| l.state == copying_state && !l.dirty.is_empty());
        if !wanted {
            return;
        }
        loop {
            let in_flight = self
                .ops
                .values()
                .filter(|op| matches!(op.kind, OpKind::Copy { .. }))
                .count();
            if in_flight >= self.config.copies_in_flight_max {
                return;
            }
            let busy = |region: u32, ops: &BTreeMap<OpId, Op>| {
                let extent = geometry.extent_of(region);
                ops.values().any(|op| {
                    op.extent(&geometry).is_some_and(|e| e.overlaps(&extent))
                        && !matches!(op.kind, OpKind::Write { .. } if op.queued)
                })
            };
            // While resyncing, the regions hosts wait for go first.
            let waited = (self.phase == PrimaryPhase::Resyncing)
                .then(|| self.waited_region(|r| busy(r, &self.ops)))
                .flatten();
            let next = waited.or_else(|| {
                self.links.iter().find_map(|(&node, link)| {
                    (link.state == copying_state)
                        .then(|| link.dirty.iter().find(|&r| !busy(r, &self.ops)))
                        .flatten()
                        .map(|region| (node, region))
                })
            });
            let Some((to, region)) = next else {
                return;
            };
            self.links
                .get_mut(&to)
                .expect("a link")
                .dirty
                .remove(region);
            let op = OpId(self.next_internal_op);
            self.next_internal_op += 1;
            let mut copy = new_op(OpKind::Copy { to, region }, now);
            copy.local_pending = true;
            self.ops.insert(op, copy);
            let extent = geometry.extent_of(region);
            self.actions.push_back(Action::LocalRead { op, extent });
        }
    }

    /// Regions whose writes every in-sync replica completed leave the write
    /// intents (this node's, and the replicas' by a Clean message).
    fn clean(&mut self, now: Duration) {
        if self.own_copy_failed {
            // This copy may lack any write since: every intent keeps its
            // regions, whoever rebuilds it next and however it was promoted.
            return;
        }
        self.clean_regions(Some(now));
        if self.run_degraded && self.phase == PrimaryPhase::Active && !self.degraded() {
            // Every member holds every acknowledged write again.
            self.run_degraded = false;
            self.kept = RegionSet::new(self.config.geometry.regions());
            self.actions.push_back(Action::AllInSync);
        }
    }

    /// Whether some member is, or may be, out of sync.
    fn degraded(&self) -> bool {
        self.links.values().any(|l| l.state != LinkState::Live)
            || self
                .record
                .members
                .iter()
                .any(|m| m.state != MemberState::InSync)
            || !self.uncertain.is_empty()
            || self.commit_in_flight
    }

    /// Cleans the regions idle for the clean delay at `now` (all idle ones
    /// if none).
    fn clean_regions(&mut self, now: Option<Duration>) {
        if self.to_clean.is_empty()
            || now.is_some_and(|now| now < self.clean_due_at)
            || self.faults_pending()
        {
            return;
        }
        let delay = self.config.clean_delay;
        let due: Vec<u32> = self
            .to_clean
            .iter()
            .filter(|&(_, &idle_since)| now.is_none_or(|now| now >= idle_since + delay))
            .map(|(&region, _)| region)
            .collect();
        for region in &due {
            self.to_clean.remove(region);
        }
        self.clean_due_at = self
            .to_clean
            .values()
            .map(|&idle_since| idle_since + delay)
            .min()
            .unwrap_or(Duration::MAX);
        let regions: Vec<u32> = due
            .into_iter()
            .filter(|&r| self.writes_in_region[r as usize] == 0 && !self.resync.contains(r))
            .collect();
        if regions.is_empty() {
            return;
        }
        // While a member is out, what was written stays known (kept) for
        // its rebuild after a restart of this primary.
        let keep = self.degraded();
        for &region in &regions {
            if keep && self.kept.insert(region) {
                self.run_degraded = true;
                self.actions.push_back(Action::Keep(region));
            }
            if self.intent.remove(region) {
                self.actions.push_back(Action::IntentClear(region));
            }
        }
        for (&node, link) in &self.links {
            if matches!(
                link.state,
                LinkState::Live | LinkState::Joining | LinkState::Rebuilding
            ) {
                self.actions.push_back(Action::Send {
                    to: node,
                    msg: ToReplica::Clean {
                        token: link.token,
                        regions: regions.clone(),
                    },
                });
            }
        }
    }
}

fn new_op(kind: OpKind, now: Duration) -> Op {
    Op {
        kind,
        queued: false,
        local_pending: matches!(
            kind,
            OpKind::Read { .. } | OpKind::Flush | OpKind::SoleFlush
        ),
        required: Vec::new(),
        optional: Vec::new(),
        deadline: now,
        answered: false,
        local_failed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const BLOCK_0: Extent = Extent {
        block: 0,
        blocks: 1,
    };
    /// In region 1 (of 4 blocks each).
    const BLOCK_4: Extent = Extent {
        block: 4,
        blocks: 1,
    };

    fn config() -> PrimaryConfig {
        PrimaryConfig {
            me: NodeId(0),
            geometry: Geometry {
                blocks: 16,
                region_blocks: 4,
            },
            replica_timeout: 200 * MS,
            reattach_interval: 300 * MS,
            copies_in_flight_max: 2,
            clean_delay: Duration::ZERO,
            // Never spent in these tests but those of grants (`granting`).
            read_grant: Duration::from_secs(3600),
        }
    }

    fn drain(primary: &mut Primary) -> Vec<Action> {
        std::iter::from_fn(|| primary.poll_action()).collect()
    }

    /// A new primary of n0 over `record` (epoch 1, at revision 1, nothing
    /// in its intent or run), its lease valid for a second.
    fn leased(record: ReplicaSet) -> Primary {
        leased_with(config(), record)
    }

    fn leased_with(config: PrimaryConfig, record: ReplicaSet) -> Primary {
        let regions = config.geometry.regions();
        let run = Run::new(Epoch(1), regions);
        let intent = RegionSet::new(regions);
        let mut primary = Primary::new(config, record, 1, intent, run, Duration::ZERO);
        primary.set_lease(1000 * MS, Duration::ZERO);
        primary
    }

    /// A primary of n0 with n1 in sync, fenced and serving.
    fn active() -> (Primary, Token) {
        let regions = config().geometry.regions();
        let mut primary = leased(ReplicaSet::new(&[NodeId(0), NodeId(1)]));
        let token = Token {
            epoch: Epoch(1),
            session: 1,
        };
        assert_eq!(
            drain(&mut primary),
            [Action::Send {
                to: NodeId(1),
                msg: ToReplica::Fence { token }
            }]
        );
        let intent = RegionSet::new(regions);
        let fenced = FromReplica::Fenced {
            token,
            intent,
            unclean: false,
        };
        primary.replica_reply(NodeId(1), fenced, MS);
        assert_eq!(primary.phase(), PrimaryPhase::Active);
        (primary, token)
    }

    fn completions(actions: &[Action]) -> Vec<(OpId, HostResult)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Complete { op, result } => Some((*op, *result)),
                _ => None,
            })
            .collect()
    }

    /// n1 does not answer a write to block 0; n0, left the only copy in
    /// sync, first makes its copy durable: the actions after that flush.
    fn n1_silent_during_a_write(primary: &mut Primary) -> Vec<Action> {
        primary.host_write(OpId(1), BLOCK_0, false, 2 * MS);
        primary.local_done(OpId(1), 3 * MS);
        drain(primary);
        primary.tick(300 * MS);
        let flush = drain(primary)
            .into_iter()
            .find_map(|a| match a {
                Action::LocalFlush { op } => Some(op),
                _ => None,
            })
            .expect("a local flush first");
        primary.local_done(flush, 301 * MS);
        drain(primary)
    }

    /// The grant renewal sent to n1, if exactly that was sent.
    fn renewal(actions: &[Action], token: Token) -> OpId {
        match actions {
            [Action::Send {
                to: NodeId(1),
                msg: ToReplica::Grant { token: sent, op },
            }] if *sent == token => *op,
            _ => panic!("not one renewal: {actions:?}"),
        }
    }

    /// Read grants (see the module's docs): reads are served only while
    /// the in-sync replica's grant runs, from when the command it answered
    /// was sent; an idle link renews it once a third is spent; a read that
    /// finds it run out waits for the renewal, or for the replica to leave
    /// the in-sync set, and the direct path (`optimized`) is closed meanwhile.
    #[test]
    fn reads_rest_on_the_in_sync_replicas_grant_and_wait_for_its_renewal() {
        let granting = PrimaryConfig {
            read_grant: 150 * MS,
            ..config()
        };
        let mut primary = leased_with(granting, ReplicaSet::new(&[NodeId(0), NodeId(1)]));
        let token = Token {
            epoch: Epoch(1),
            session: 1,
        };
        drain(&mut primary);
        let fenced = FromReplica::Fenced {
            token,
            intent: RegionSet::new(config().geometry.regions()),
            unclean: false,
        };
        primary.replica_reply(NodeId(1), fenced, 10 * MS);
        assert!(
            primary.optimized(149 * MS),
            "granted from the fence's sending"
        );
        assert!(!primary.optimized(150 * MS));
        assert_eq!(primary.grants_due(), 50 * MS);
        primary.tick(49 * MS);
        assert!(drain(&mut primary).is_empty(), "not due yet");
        primary.tick(50 * MS);
        let first = renewal(&drain(&mut primary), token);
        primary.tick(60 * MS);
        assert!(
            drain(&mut primary).is_empty(),
            "one renewal on its way at a time"
        );
        primary.replica_reply(NodeId(1), FromReplica::Done { token, op: first }, 61 * MS);
        assert!(primary.optimized(199 * MS) && !primary.optimized(200 * MS));
        // n1 turns slow: the next renewal's answer comes after the grant ran out.
        primary.tick(100 * MS);
        let second = renewal(&drain(&mut primary), token);
        primary.host_read(OpId(1), BLOCK_0, 210 * MS);
        assert!(!primary.optimized(210 * MS));
        assert!(drain(&mut primary).is_empty(), "the read waits");
        primary.replica_reply(NodeId(1), FromReplica::Done { token, op: second }, 215 * MS);
        assert_eq!(
            drain(&mut primary),
            [Action::LocalRead {
                op: OpId(1),
                extent: BLOCK_0
            }],
            "renewed until 250 ms"
        );
        primary.local_done(OpId(1), 216 * MS);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Ok)]
        );
        // n1 is gone: a read waits until the store takes it out of the in-sync set.
        primary.tick(220 * MS);
        renewal(&drain(&mut primary), token);
        primary.host_read(OpId(2), BLOCK_0, 260 * MS);
        assert!(drain(&mut primary).is_empty(), "the read waits");
        primary.tick(420 * MS);
        let flush = drain(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::LocalFlush { op } => Some(op),
                _ => None,
            })
            .expect("left the only copy in sync, it flushes first");
        primary.local_done(flush, 421 * MS);
        let record = drain(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::Commit { record, .. } => Some(record),
                _ => None,
            })
            .expect("n1 faulted");
        primary.committed(2, record, 422 * MS);
        assert!(drain(&mut primary).contains(&Action::LocalRead {
            op: OpId(2),
            extent: BLOCK_0
        }));
        assert!(
            primary.optimized(423 * MS),
            "no grant needed from a faulted copy"
        );
        assert_eq!(primary.grants_due(), Duration::MAX);
    }

    #[test]
    fn a_write_completes_once_local_and_every_in_sync_replica_are_done() {
        let (mut primary, token) = active();
        let extent = Extent {
            block: 5,
            blocks: 2,
        };
        primary.host_write(OpId(1), extent, false, 2 * MS);
        let actions = drain(&mut primary);
        assert_eq!(actions[0], Action::IntentSet(1), "intent before the write");
        assert!(actions.contains(&Action::LocalWrite {
            op: OpId(1),
            extent,
            fua: false
        }));
        primary.local_done(OpId(1), 3 * MS);
        assert!(
            completions(&drain(&mut primary)).is_empty(),
            "n1 has not answered"
        );
        let done = FromReplica::Done { token, op: OpId(1) };
        primary.replica_reply(NodeId(1), done, 4 * MS);
        let actions = drain(&mut primary);
        assert_eq!(completions(&actions), [(OpId(1), HostResult::Ok)]);
        assert!(
            actions.contains(&Action::IntentClear(1)),
            "then the intent is cleaned"
        );
    }

    #[test]
    fn a_primary_is_quiet_only_while_nothing_is_in_flight_and_every_replica_in_sync() {
        let (mut primary, token) = active();
        assert!(primary.quiet(), "serving, nothing in flight");
        primary.host_write(OpId(1), BLOCK_0, false, 2 * MS);
        drain(&mut primary);
        assert!(!primary.quiet(), "a write waits on a replica's timeout");
        primary.local_done(OpId(1), 3 * MS);
        let done = FromReplica::Done { token, op: OpId(1) };
        primary.replica_reply(NodeId(1), done, 4 * MS);
        drain(&mut primary);
        assert!(primary.quiet(), "answered");
        primary.host_write(OpId(2), BLOCK_0, false, 5 * MS);
        drain(&mut primary);
        primary.tick(5 * MS + config().replica_timeout);
        drain(&mut primary);
        assert!(
            !primary.quiet(),
            "a replica faulted: it is asked back in time"
        );
    }

    /// The internal op of the `nth` copy started (0: the first).
    fn copy_op(nth: u64) -> OpId {
        OpId(INTERNAL_OP_BASE + nth)
    }

    fn region_extent(region: u64) -> Extent {
        Extent {
            block: region * 4,
            blocks: 4,
        }
    }

    /// Copies `copy` to `to` (its session `token`) and it answers: the actions after.
    fn copy_to(
        primary: &mut Primary,
        to: NodeId,
        token: Token,
        copy: OpId,
        now: Duration,
    ) -> Vec<Action> {
        primary.local_done(copy, now);
        let sent = drain(primary);
        assert!(
            matches!(sent[..], [Action::Send { to: sent_to, msg: ToReplica::Copy { op, .. } }] if op == copy && sent_to == to),
            "{sent:?}"
        );
        primary.replica_reply(to, FromReplica::Done { token, op: copy }, now);
        drain(primary)
    }

    #[test]
    fn a_resyncing_primary_serves_at_once_and_holds_what_touches_a_region_not_yet_copied() {
        let regions = config().geometry.regions();
        let mut primary = leased(ReplicaSet::new(&[NodeId(0), NodeId(1)]));
        primary.config.copies_in_flight_max = 1;
        let token = Token {
            epoch: Epoch(1),
            session: 1,
        };
        drain(&mut primary);
        // n1 may hold unconfirmed writes in regions 1, 2 and 3.
        let mut intent = RegionSet::new(regions);
        for region in [1, 2, 3] {
            intent.insert(region);
        }
        let fenced = FromReplica::Fenced {
            token,
            intent,
            unclean: false,
        };
        primary.replica_reply(NodeId(1), fenced, MS);
        assert_eq!(primary.phase(), PrimaryPhase::Resyncing);
        let first = [Action::LocalRead {
            op: copy_op(0),
            extent: region_extent(1),
        }];
        assert_eq!(drain(&mut primary), first, "the resync's first copy");
        assert!(primary.serves(MS) && !primary.optimized(MS));

        // Region 0 is settled: served at once.
        primary.host_read(OpId(1), BLOCK_0, 2 * MS);
        primary.host_write(OpId(2), BLOCK_0, false, 2 * MS);
        let actions = drain(&mut primary);
        assert!(actions.contains(&Action::LocalRead {
            op: OpId(1),
            extent: BLOCK_0
        }));
        assert!(actions.contains(&Action::LocalWrite {
            op: OpId(2),
            extent: BLOCK_0,
            fua: false
        }));

        // Region 3 is not copied yet: its read and write wait, and its
        // copy goes before region 2's.
        let block_12 = Extent {
            block: 12,
            blocks: 1,
        };
        primary.host_read(OpId(3), block_12, 3 * MS);
        primary.host_write(OpId(4), block_12, false, 3 * MS);
        assert_eq!(drain(&mut primary), [], "held");
        let next = copy_to(&mut primary, NodeId(1), token, copy_op(0), 4 * MS);
        assert_eq!(
            next,
            [Action::LocalRead {
                op: copy_op(1),
                extent: region_extent(3)
            }],
            "the region hosts wait for is copied next"
        );
        let released = copy_to(&mut primary, NodeId(1), token, copy_op(1), 5 * MS);
        assert!(released.contains(&Action::LocalRead {
            op: OpId(3),
            extent: block_12
        }));
        assert!(released.contains(&Action::LocalWrite {
            op: OpId(4),
            extent: block_12,
            fua: false
        }));
        assert!(released.contains(&Action::LocalRead {
            op: copy_op(2),
            extent: region_extent(2)
        }));
        assert_eq!(primary.phase(), PrimaryPhase::Resyncing);
        copy_to(&mut primary, NodeId(1), token, copy_op(2), 6 * MS);
        assert_eq!(primary.phase(), PrimaryPhase::Active);
        assert!(primary.optimized(6 * MS));
    }

    /// A new primary of n0 with n1 and n2 in sync, each fenced with region
    /// 1 in its intent, one copy in flight at a time: resyncing, the copy
    /// of region 1 to n1 started (`copy_op(0)`). Tokens of n1 and n2.
    fn resyncing_region_1_to_two() -> (Primary, Token, Token) {
        let regions = config().geometry.regions();
        let mut primary = leased(ReplicaSet::new(&[NodeId(0), NodeId(1), NodeId(2)]));
        primary.config.copies_in_flight_max = 1;
        drain(&mut primary);
        let mut intent = RegionSet::new(regions);
        intent.insert(1);
        let token = |session| Token {
            epoch: Epoch(1),
            session,
        };
        for (node, session) in [(NodeId(1), 1), (NodeId(2), 2)] {
            let fenced = FromReplica::Fenced {
                token: token(session),
                intent: intent.clone(),
                unclean: false,
            };
            primary.replica_reply(node, fenced, MS);
        }
        assert_eq!(primary.phase(), PrimaryPhase::Resyncing);
        drain(&mut primary);
        (primary, token(1), token(2))
    }

    fn sent_writes(actions: &[Action]) -> Vec<NodeId> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send {
                    to,
                    msg: ToReplica::Write { .. },
                } => Some(*to),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_write_to_a_region_being_resynced_waits_until_every_replica_has_its_copy() {
        let (mut primary, n1, n2) = resyncing_region_1_to_two();
        primary.host_write(OpId(1), BLOCK_4, false, 2 * MS);
        assert_eq!(drain(&mut primary), [], "region 1 is being copied");
        let actions = copy_to(&mut primary, NodeId(1), n1, copy_op(0), 4 * MS);
        assert_eq!(
            actions,
            [Action::LocalRead {
                op: copy_op(1),
                extent: region_extent(1)
            }],
            "n2 lacks it still: the write waits"
        );
        let actions = copy_to(&mut primary, NodeId(2), n2, copy_op(1), 6 * MS);
        assert_eq!(sent_writes(&actions), [NodeId(1), NodeId(2)]);
        assert_eq!(primary.phase(), PrimaryPhase::Active);
    }

    #[test]
    fn a_replica_dropped_during_the_resync_releases_what_waited_for_it_after_the_store_agrees() {
        let (mut primary, n1, _) = resyncing_region_1_to_two();
        primary.host_write(OpId(1), BLOCK_4, false, 2 * MS);
        copy_to(&mut primary, NodeId(1), n1, copy_op(0), 4 * MS);
        // n2 never answers its copy: dropped, the write goes to n1 alone...
        primary.local_done(copy_op(1), 5 * MS);
        drain(&mut primary);
        primary.tick(5 * MS + config().replica_timeout);
        let actions = drain(&mut primary);
        assert_eq!(sent_writes(&actions), [NodeId(1)]);
        assert!(actions.contains(&Action::Full(NodeId(2))), "{actions:?}");
        let Some(Action::Commit { record, .. }) = actions
            .iter()
            .find(|a| matches!(a, Action::Commit { .. }))
            .cloned()
        else {
            panic!("no commit in {actions:?}")
        };
        // ...and completes once the store no longer calls n2 in sync.
        let now = 300 * MS;
        primary.local_done(OpId(1), now);
        let done = FromReplica::Done {
            token: n1,
            op: OpId(1),
        };
        primary.replica_reply(NodeId(1), done, now);
        assert!(completions(&drain(&mut primary)).is_empty(), "{record:?}");
        primary.committed(2, record, now);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Ok)]
        );
    }

    #[test]
    fn a_primary_whose_copy_fails_while_resyncing_sends_hosts_elsewhere() {
        let (mut primary, _, _) = resyncing_region_1_to_two();
        primary.host_write(OpId(1), BLOCK_0, false, 2 * MS);
        drain(&mut primary);
        primary.local_failed(OpId(1), 3 * MS);
        for n in [1, 2] {
            let token = Token {
                epoch: Epoch(1),
                session: n,
            };
            let done = FromReplica::Done { token, op: OpId(1) };
            primary.replica_reply(NodeId(n.try_into().unwrap()), done, 3 * MS);
        }
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Transition)],
            "retried on another path, not an error"
        );
        assert!(!primary.serves(3 * MS));
    }

    #[test]
    fn a_primary_whose_copy_fails_hands_over_and_its_failed_write_is_retried_there() {
        let (mut primary, token) = active();
        let extent = Extent {
            block: 5,
            blocks: 2,
        };
        primary.host_write(OpId(1), extent, false, 2 * MS);
        drain(&mut primary);
        primary.local_failed(OpId(1), 3 * MS);
        assert!(primary.own_copy_failed());
        assert!(!primary.optimized(3 * MS), "no new host command here");
        let done = FromReplica::Done { token, op: OpId(1) };
        primary.replica_reply(NodeId(1), done, 4 * MS);
        let actions = drain(&mut primary);
        assert_eq!(
            completions(&actions),
            [(OpId(1), HostResult::Transition)],
            "not an I/O error: the host retries it on the next primary"
        );
        assert!(
            !actions.iter().any(|a| matches!(
                a,
                Action::Send {
                    msg: ToReplica::Clean { .. },
                    ..
                }
            )),
            "nothing is cleaned: this copy lacks the write"
        );
        // n1 will be the only copy in sync: every write durable there first.
        let flush = actions
            .iter()
            .find_map(|a| match a {
                Action::Send {
                    to: NodeId(1),
                    msg: ToReplica::Flush { op, .. },
                } => Some(*op),
                _ => None,
            })
            .expect("a flush of n1 first");
        assert!(!actions.iter().any(|a| matches!(a, Action::Commit { .. })));
        let flushed = FromReplica::Done { token, op: flush };
        primary.replica_reply(NodeId(1), flushed, 5 * MS);
        let actions = drain(&mut primary);
        let mut next = ReplicaSet::new(&[NodeId(0), NodeId(1)]);
        next.epoch = Epoch(2);
        next.primary = NodeId(1);
        next.previous = Some(NodeId(0));
        next.set_state(NodeId(0), MemberState::Faulted { epoch: Epoch(1) });
        assert!(
            actions.contains(&Action::Commit {
                base_revision: 1,
                record: next
            }),
            "n1 takes over; n0 is rebuilt in full: {actions:?}"
        );
    }

    #[test]
    fn a_sole_copy_that_fails_carries_on_and_the_driver_reports_the_error() {
        let mut primary = leased(ReplicaSet::new(&[NodeId(0)]));
        drain(&mut primary);
        primary.host_write(OpId(1), BLOCK_0, false, 2 * MS);
        drain(&mut primary);
        primary.local_failed(OpId(1), 3 * MS);
        let actions = drain(&mut primary);
        assert_eq!(completions(&actions), [(OpId(1), HostResult::Ok)]);
        assert!(!actions.iter().any(|a| matches!(a, Action::Commit { .. })));
    }

    #[test]
    fn a_silent_replica_leaves_the_record_before_the_write_completes() {
        let (mut primary, _) = active();
        let actions = n1_silent_during_a_write(&mut primary);
        assert!(
            completions(&actions).is_empty(),
            "held until the store agrees"
        );
        let Some(Action::Commit {
            base_revision,
            record,
        }) = actions
            .iter()
            .find(|a| matches!(a, Action::Commit { .. }))
            .cloned()
        else {
            panic!("no commit in {actions:?}")
        };
        assert_eq!(base_revision, 1);
        assert_eq!(
            record.state_of(NodeId(1)),
            Some(MemberState::Faulted { epoch: Epoch(1) })
        );
        primary.committed(2, record, 302 * MS);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Ok)]
        );
        assert_eq!(primary.dirty_regions(NodeId(1)), Some(1), "what it missed");
    }

    /// A replica fenced by a newer epoch is out (no write completes
    /// without it until the record says so); whether a newer primary did
    /// it, only the store says: its record deposes this primary, and
    /// nothing else does (a fence with the largest epoch, by whoever holds
    /// the cluster's keys, made it depose and take a new epoch over and over).
    #[test]
    fn a_fence_by_a_newer_epoch_fails_the_link_and_the_store_decides() {
        let (mut primary, token) = active();
        primary.host_write(OpId(1), BLOCK_0, false, 2 * MS);
        drain(&mut primary);
        let current = Token {
            epoch: Epoch(u64::MAX),
            session: 1,
        };
        primary.local_done(OpId(1), 3 * MS);
        primary.replica_reply(NodeId(1), FromReplica::Refused { token, current }, 3 * MS);
        assert_eq!(
            primary.phase(),
            PrimaryPhase::Active,
            "not on the replica's word"
        );
        // What it holds is made durable here before the record says it is out.
        let flush = drain(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::LocalFlush { op } => Some(op),
                _ => None,
            })
            .expect("a local flush first");
        primary.local_done(flush, 4 * MS);
        let actions = drain(&mut primary);
        assert!(
            completions(&actions).is_empty(),
            "held until the store agrees"
        );
        let Some(Action::Commit { record, .. }) = actions
            .iter()
            .find(|a| matches!(a, Action::Commit { .. }))
            .cloned()
        else {
            panic!("no commit in {actions:?}")
        };
        assert_eq!(
            record.state_of(NodeId(1)),
            Some(MemberState::Faulted { epoch: Epoch(1) })
        );
        // A newer primary's record: the commit fails against it, and it deposes this one.
        let mut newer = record.clone();
        newer.epoch = Epoch(2);
        newer.primary = NodeId(1);
        primary.commit_failed(Some((5, newer)), 5 * MS);
        assert_eq!(primary.phase(), PrimaryPhase::Deposed);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Inaccessible)]
        );
    }

    #[test]
    fn reads_need_a_valid_lease_and_a_lapsed_lease_is_not_taken_back() {
        let (mut primary, _) = active();
        let extent = Extent {
            block: 0,
            blocks: 1,
        };
        primary.host_read(OpId(1), extent, 2 * MS);
        primary.local_done(OpId(1), 3 * MS);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(1), HostResult::Ok)]
        );
        primary.host_read(OpId(2), extent, 1000 * MS);
        assert_eq!(
            completions(&drain(&mut primary)),
            [(OpId(2), HostResult::Transition)]
        );
        primary.set_lease(2000 * MS, 1001 * MS);
        assert_eq!(primary.phase(), PrimaryPhase::Deposed);
    }

    /// n0 promoted into epoch 2: n1, the previous primary, lacks only what
    /// n0 writes, the regions the copies may differ in (n0's intent) and
    /// what n1 wrote unacknowledged (its intent); n2, faulted earlier, lacks
    /// what is not known here: everything.
    #[test]
    fn the_previous_primary_is_rebuilt_partially_and_an_older_fault_in_full() {
        let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1), NodeId(2)]);
        record.epoch = Epoch(2);
        record.previous = Some(NodeId(1));
        record.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(2) });
        record.set_state(NodeId(2), MemberState::Faulted { epoch: Epoch(1) });
        let regions = config().geometry.regions();
        let mut own_intent = RegionSet::new(regions);
        own_intent.insert(3);
        let run = Run::new(Epoch(2), regions);
        let mut primary = Primary::new(config(), record, 5, own_intent, run, Duration::ZERO);
        primary.set_lease(1000 * MS, Duration::ZERO);
        primary.tick(MS);
        assert_eq!(primary.phase(), PrimaryPhase::Active, "nothing to fence");
        let fence = drain(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::Send {
                    to: NodeId(1),
                    msg: ToReplica::Fence { token },
                } => Some(token),
                _ => None,
            })
            .expect("n1 asked back");
        primary.host_write(
            OpId(1),
            Extent {
                block: 5,
                blocks: 1,
            },
            false,
            2 * MS,
        );
        primary.local_done(OpId(1), 3 * MS);
        drain(&mut primary);
        assert_eq!(primary.dirty_regions(NodeId(1)), Some(2), "regions 1 and 3");
        assert_eq!(primary.dirty_regions(NodeId(2)), Some(regions));

        let mut its_intent = RegionSet::new(regions);
        its_intent.insert(2);
        let fenced = FromReplica::Fenced {
            token: fence,
            intent: its_intent,
            unclean: false,
        };
        primary.replica_reply(NodeId(1), fenced, 4 * MS);
        assert_eq!(primary.dirty_regions(NodeId(1)), Some(3), "and region 2");
    }

    /// n0 serves again under epoch 3 in its run since epoch 2 (after a
    /// restart): n1, faulted in the run, lacks what the intent and the
    /// kept regions hold, unless the run found what it lacks unknown.
    #[test]
    fn a_member_faulted_within_the_run_is_rebuilt_from_the_kept_regions() {
        let regions = config().geometry.regions();
        let primary_with = |full: Vec<NodeId>| {
            let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1)]);
            record.epoch = Epoch(3);
            record.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(2) });
            let mut run = Run::new(Epoch(2), regions);
            run.kept.insert(1);
            run.full = full;
            let mut intent = RegionSet::new(regions);
            intent.insert(2);
            Primary::new(config(), record, 7, intent, run, Duration::ZERO)
        };
        let primary = primary_with(Vec::new());
        assert_eq!(primary.dirty_regions(NodeId(1)), Some(2), "regions 1 and 2");
        let primary = primary_with(vec![NodeId(1)]);
        assert_eq!(primary.dirty_regions(NodeId(1)), Some(regions));
        let mut record = ReplicaSet::new(&[NodeId(0), NodeId(1)]);
        record.epoch = Epoch(3);
        record.set_state(NodeId(1), MemberState::Faulted { epoch: Epoch(1) });
        let run = Run::new(Epoch(2), regions);
        let intent = RegionSet::new(regions);
        let primary = Primary::new(config(), record, 7, intent, run, Duration::ZERO);
        assert_eq!(
            primary.dirty_regions(NodeId(1)),
            Some(regions),
            "faulted before the run"
        );
    }

    /// While n1 is out, cleaned regions are kept for the run; a replica
    /// found unclean is recorded to rebuild in full before anything is
    /// sent to it; once every member is in sync again, the run forgets both.
    #[test]
    fn the_run_keeps_what_was_written_while_a_member_was_out() {
        let (mut primary, _) = active();
        let record = n1_silent_during_a_write(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::Commit { record, .. } => Some(record),
                _ => None,
            })
            .expect("n1 faulted");
        primary.committed(2, record, 302 * MS);
        let actions = drain(&mut primary);
        let keep = actions.iter().position(|a| *a == Action::Keep(0));
        let clear = actions.iter().position(|a| *a == Action::IntentClear(0));
        assert!(keep.is_some() && keep < clear, "{actions:?}");

        primary.tick(700 * MS);
        let token = drain(&mut primary)
            .into_iter()
            .find_map(|a| match a {
                Action::Send {
                    to: NodeId(1),
                    msg: ToReplica::Fence { token },
                } => Some(token),
                _ => None,
            })
            .expect("n1 asked back");
        let unclean = FromReplica::Fenced {
            token,
            intent: RegionSet::new(config().geometry.regions()),
            unclean: true,
        };
        primary.replica_reply(NodeId(1), unclean, 701 * MS);
        let actions = drain(&mut primary);
        assert_eq!(
            actions.first(),
            Some(&Action::Full(NodeId(1))),
            "{actions:?}"
        );
        assert!(!actions.contains(&Action::AllInSync));
    }
}
