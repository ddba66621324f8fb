//! A simulated storage node of the erasure-coded simulation: a member (a
//! fenced disk holding its shard volume) and, while the record names it
//! primary, the volume's primary (`weft_ec::EcPrimary`, started by
//! `weft_replication::plan_start`'s rules as the node's replicator starts
//! a replicated volume's).
//!
//! The member side keeps what the node's target keeps: a fence (lost with
//! the process: a restarted member refuses everything until fenced anew),
//! commands admitted under the fence of their arrival, and a fence answered
//! once the commands ahead of it are done (one disk queue, in order). A
//! write lands in the disk's volatile cache unless FUA; a Flush makes what
//! is cached durable. A crash is a power loss: each cached block keeps its
//! new bytes or loses them, and the write the disk was doing is torn (each
//! of its blocks lands or not).
//!
//! Persistent across a crash: the disk's durable bytes and the last epoch
//! this node served as primary.

use super::world::{Cmd, EcSimConfig, Endpoint, Event, Msg, Outbox};
use crate::rng::Rng;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use weft_ec::{EcAction, EcPhase, EcPrimary, FromMember, MemberControl, ToMember};
use weft_replication::{plan_start, Epoch, HostResult, NodeId, OpId, ReplicaSet, Start, Token};

const RENEW_EVERY: u64 = 10;
const GET_EVERY: u64 = 5;
/// A node stops trusting its lease this long before the store's view of it ends.
const LEASE_MARGIN: Duration = Duration::from_millis(100);
/// After its primary ended, a node waits this long before it starts another.
const RESTART_AFTER: Duration = Duration::from_millis(200);
/// A compare-and-swap not answered within this long is taken as failed
/// (its answer was lost with a broken connection): the record is read again.
const STORE_TIMEOUT: Duration = Duration::from_millis(500);

enum Entry {
    Fence {
        to: NodeId,
        token: Token,
    },
    Read {
        to: NodeId,
        token: Token,
        op: weft_ec::MemberOp,
        offset: u64,
        len: u32,
    },
    Write {
        to: NodeId,
        token: Token,
        op: weft_ec::MemberOp,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
    },
    Flush {
        to: NodeId,
        token: Token,
        op: weft_ec::MemberOp,
    },
    Control {
        to: NodeId,
        token: Token,
        op: weft_ec::MemberOp,
        control: MemberControl,
    },
}

pub(crate) struct Node {
    id: NodeId,
    config: EcSimConfig,
    incarnation: u64,
    // Persistent.
    /// What reads see (the cache included).
    pub disk: Vec<u8>,
    /// What survives a power loss.
    durable: Vec<u8>,
    /// Blocks written since the last flush, not FUA.
    cached: BTreeSet<usize>,
    /// Its shard's snapshots, by name (durable: taken from flushed bytes).
    snapshots: BTreeMap<String, Vec<u8>>,
    served: Epoch,
    /// The disk fails every op (a failed pool), until the operator clears it.
    pub disk_failed: bool,
    // The member side.
    fence: Token,
    queue: VecDeque<Entry>,
    busy: bool,
    // The primary side.
    primary: Option<EcPrimary>,
    known: Option<(u64, ReplicaSet)>,
    starting: bool,
    start_after: Duration,
    /// A compare-and-swap is out, answered by then or given up.
    cas_deadline: Option<Duration>,
    lease_until: Duration,
    host_ops: BTreeMap<OpId, (u64, u32)>,
    next_op: u64,
    ticks: u64,
}

impl Node {
    pub fn new(id: NodeId, config: &EcSimConfig) -> Node {
        Node {
            id,
            incarnation: 0,
            disk: vec![0; config.shard_bytes() as usize],
            durable: vec![0; config.shard_bytes() as usize],
            cached: BTreeSet::new(),
            snapshots: BTreeMap::new(),
            served: Epoch(0),
            disk_failed: false,
            fence: Token::default(),
            queue: VecDeque::new(),
            busy: false,
            primary: None,
            known: None,
            starting: false,
            start_after: Duration::ZERO,
            cas_deadline: None,
            lease_until: Duration::ZERO,
            host_ops: BTreeMap::new(),
            next_op: 0,
            ticks: 0,
            config: config.clone(),
        }
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub fn primary_phase(&self) -> Option<EcPhase> {
        self.primary.as_ref().map(EcPrimary::phase)
    }

    pub fn primary_idle(&self) -> bool {
        self.primary.as_ref().is_some_and(EcPrimary::is_idle)
    }

    pub fn describe(&self) -> String {
        let role = match &self.primary {
            Some(p) => format!("primary {:?} {:?}", p.phase(), p.rebuilds()),
            None => "member".into(),
        };
        format!(
            "{}: {role}, fence e{}s{}, {} queued{}",
            self.id,
            self.fence.epoch.0,
            self.fence.session,
            self.queue.len(),
            if self.disk_failed {
                ", disk failed"
            } else {
                ""
            }
        )
    }

    /// The process dies; the write its disk was doing is torn (returns
    /// whether one was).
    pub fn crash(&mut self, rng: &mut Rng) -> bool {
        let mut torn = false;
        let block = self.config.block_bytes as usize;
        let front = (self.busy, self.queue.front());
        if let (
            true,
            Some(Entry::Write {
                offset,
                data,
                fua: true,
                ..
            }),
        ) = front
        {
            if !self.disk_failed {
                for (i, bytes) in data.chunks(block).enumerate() {
                    if rng.chance(500_000) {
                        let at = *offset as usize + i * block;
                        self.durable[at..at + bytes.len()].copy_from_slice(bytes);
                        torn = true;
                    }
                }
            }
        }
        // The cache: each block kept or lost.
        for b in std::mem::take(&mut self.cached) {
            let range = b * block..(b + 1) * block;
            if rng.chance(500_000) {
                let kept = self.disk[range.clone()].to_vec();
                self.durable[range].copy_from_slice(&kept);
            }
        }
        self.disk.clone_from(&self.durable);
        self.incarnation += 1;
        self.fence = Token::default();
        self.queue.clear();
        self.busy = false;
        self.primary = None;
        self.known = None;
        self.starting = false;
        self.cas_deadline = None;
        self.lease_until = Duration::ZERO;
        self.host_ops.clear();
        torn
    }

    pub fn restart(&mut self, now: Duration) {
        self.incarnation += 1;
        self.start_after = now;
    }

    pub fn tick(&mut self, now: Duration, out: &mut Outbox) {
        self.ticks += 1;
        if self.ticks.is_multiple_of(RENEW_EVERY) {
            out.send(Endpoint::Store, Msg::Renew { sent: now });
        }
        if self.ticks.is_multiple_of(GET_EVERY) {
            out.send(Endpoint::Store, Msg::Get);
        }
        if self.cas_deadline.is_some_and(|d| d <= now) {
            self.cas_deadline = None;
            if self.starting {
                self.starting = false;
            } else if let (Some(p), Some(known)) = (&mut self.primary, self.known.clone()) {
                p.commit_failed(Some(known), now);
            }
        }
        if let Some(primary) = &mut self.primary {
            primary.tick(now);
        }
        self.pump(now, out);
        self.maybe_start(now, out);
    }

    pub fn receive(
        &mut self,
        from: Endpoint,
        msg: Msg,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        match (from, msg) {
            (Endpoint::Node(primary), Msg::ToMember(msg)) => self.member(primary, msg, rng, out),
            (Endpoint::Node(member), Msg::FromMember(reply)) => {
                if let Some(p) = &mut self.primary {
                    p.member_reply(member.0 as usize, reply, now);
                }
            }
            (Endpoint::Host, Msg::Io { op, attempt, cmd }) => {
                self.host_io(op, attempt, cmd, now, out)
            }
            (Endpoint::Store, Msg::Renewed { sent }) => {
                self.lease_until = self
                    .lease_until
                    .max(sent + self.config.lease_ttl - LEASE_MARGIN);
                if let Some(p) = &mut self.primary {
                    p.set_lease(self.lease_until, now);
                }
            }
            (Endpoint::Store, Msg::Record { revision, record }) => {
                self.on_record(revision, record, now, out)
            }
            (
                Endpoint::Store,
                Msg::CasDone {
                    ok,
                    revision,
                    record,
                },
            ) => {
                self.cas_deadline = None;
                if self.starting {
                    self.starting = false;
                    self.on_record(revision, record, now, out);
                } else if let Some(p) = &mut self.primary {
                    if ok {
                        p.committed(revision, record, now);
                    } else {
                        p.commit_failed(Some((revision, record)), now);
                    }
                }
            }
            _ => {}
        }
        self.pump(now, out);
        self.maybe_start(now, out);
    }

    fn host_io(&mut self, op: u64, attempt: u32, cmd: Cmd, now: Duration, out: &mut Outbox) {
        let Some(primary) = &mut self.primary else {
            let named = self
                .known
                .as_ref()
                .is_some_and(|(_, r)| r.primary == self.id);
            let result = if named {
                HostResult::Transition
            } else {
                HostResult::Inaccessible
            };
            out.send(
                Endpoint::Host,
                Msg::IoDone {
                    op,
                    attempt,
                    result,
                    data: Vec::new(),
                },
            );
            return;
        };
        let id = OpId(self.next_op);
        self.next_op += 1;
        self.host_ops.insert(id, (op, attempt));
        match cmd {
            Cmd::Read { offset, len } => primary.host_read(id, offset, len, now),
            Cmd::Write { offset, data } => primary.host_write(id, offset, data, now),
        }
    }

    fn on_record(&mut self, revision: u64, record: ReplicaSet, now: Duration, out: &mut Outbox) {
        if self.known.as_ref().is_some_and(|(r, _)| *r >= revision) {
            return;
        }
        self.known = Some((revision, record.clone()));
        if let Some(p) = &mut self.primary {
            p.record_changed(revision, record, now);
        }
        self.pump(now, out);
    }

    /// Starts serving if the record names this node and nothing serves.
    fn maybe_start(&mut self, now: Duration, out: &mut Outbox) {
        if self.primary.is_some() || self.starting || now < self.start_after {
            return;
        }
        let Some((revision, record)) = self.known.clone() else {
            return;
        };
        if record.primary != self.id {
            return;
        }
        match plan_start(&record, self.id, self.served) {
            Start::Serve { .. } => {
                self.served = record.epoch;
                let token = Token {
                    epoch: record.epoch,
                    session: 1,
                };
                out.note(format!("{} serves epoch {}", self.id, record.epoch.0));
                let config = self.config.primary(self.id);
                let mut primary = EcPrimary::new(config, record, revision, token, now);
                primary.set_lease(self.lease_until, now);
                self.primary = Some(primary);
                self.pump(now, out);
            }
            Start::NextEpoch(next) => {
                self.starting = true;
                self.cas_deadline = Some(now + STORE_TIMEOUT);
                out.send(
                    Endpoint::Store,
                    Msg::Cas {
                        base: revision,
                        record: next,
                    },
                );
            }
        }
    }

    /// Carries out the primary's actions; drops it once it ended.
    fn pump(&mut self, now: Duration, out: &mut Outbox) {
        let Some(primary) = &mut self.primary else {
            return;
        };
        while let Some(action) = primary.poll_action() {
            out.note(format!("{}: {}", self.id, brief(&action)));
            match action {
                EcAction::Send { node, msg, .. } => {
                    out.send(Endpoint::Node(node), Msg::ToMember(msg))
                }
                EcAction::Commit {
                    base_revision,
                    record,
                } => {
                    self.cas_deadline = Some(now + STORE_TIMEOUT);
                    out.send(
                        Endpoint::Store,
                        Msg::Cas {
                            base: base_revision,
                            record,
                        },
                    )
                }
                EcAction::ControlDone { control, members } => {
                    if let MemberControl::Snapshot { name } = control {
                        out.taken.push((name, members));
                    }
                }
                EcAction::Complete { op, result, data } => {
                    if let Some((op, attempt)) = self.host_ops.remove(&op) {
                        out.send(
                            Endpoint::Host,
                            Msg::IoDone {
                                op,
                                attempt,
                                result,
                                data,
                            },
                        );
                    }
                }
            }
        }
        if matches!(primary.phase(), EcPhase::Deposed | EcPhase::Stalled) {
            out.note(format!("{}'s primary ends: {:?}", self.id, primary.phase()));
            self.primary = None;
            self.start_after = now + RESTART_AFTER;
        }
    }

    // ---- The member side.

    fn member(&mut self, from: NodeId, msg: ToMember, rng: &mut Rng, out: &mut Outbox) {
        let entry = match msg {
            ToMember::Fence { token } => {
                // As the member's target (`weft_proto::fence::Fences`): a
                // token no larger than the fence's is refused, even the
                // same primary's again; the refusal carries the epoch.
                if token <= self.fence {
                    let current = Token {
                        epoch: self.fence.epoch,
                        session: 0,
                    };
                    out.send(
                        Endpoint::Node(from),
                        Msg::FromMember(FromMember::Refused { token, current }),
                    );
                    return;
                }
                self.fence = token;
                Entry::Fence { to: from, token }
            }
            ToMember::Read {
                token,
                op,
                offset,
                len,
            } => Entry::Read {
                to: from,
                token,
                op,
                offset,
                len,
            },
            ToMember::Write {
                token,
                op,
                offset,
                data,
                fua,
            } => Entry::Write {
                to: from,
                token,
                op,
                offset,
                data,
                fua,
            },
            ToMember::Flush { token, op } => Entry::Flush {
                to: from,
                token,
                op,
            },
            ToMember::Control { token, op, control } => Entry::Control {
                to: from,
                token,
                op,
                control,
            },
        };
        if let Entry::Read { token, .. }
        | Entry::Write { token, .. }
        | Entry::Flush { token, .. }
        | Entry::Control { token, .. } = &entry
        {
            if *token != self.fence {
                // The target's Reservation Conflict, which the link
                // answers as a refusal naming no token.
                let (token, current) = (*token, Token::default());
                out.send(
                    Endpoint::Node(from),
                    Msg::FromMember(FromMember::Refused { token, current }),
                );
                return;
            }
        }
        self.queue.push_back(entry);
        self.kick(rng, out);
    }

    fn kick(&mut self, rng: &mut Rng, out: &mut Outbox) {
        if self.busy || self.queue.is_empty() {
            return;
        }
        self.busy = true;
        let delay = match self.queue.front() {
            Some(Entry::Fence { .. }) => Duration::ZERO,
            // Now and then a slow op (a busy device).
            _ if rng.chance(10_000) => Duration::from_millis(rng.range(20, 400)),
            _ => Duration::from_micros(rng.range(20, 300)),
        };
        out.after(
            delay,
            Event::DiskDone {
                node: self.id,
                incarnation: self.incarnation,
            },
        );
    }

    pub fn disk_done(&mut self, incarnation: u64, rng: &mut Rng, out: &mut Outbox) {
        if incarnation != self.incarnation || !self.busy {
            return;
        }
        self.busy = false;
        let entry = self.queue.pop_front().expect("the op being done");
        let (to, reply) = match entry {
            Entry::Fence { to, token } => (to, FromMember::Fenced { token }),
            Entry::Read { to, token, op, .. }
            | Entry::Write { to, token, op, .. }
            | Entry::Flush { to, token, op }
            | Entry::Control { to, token, op, .. }
                if self.disk_failed =>
            {
                (to, FromMember::Failed { token, op })
            }
            Entry::Read {
                to,
                token,
                op,
                offset,
                len,
            } => {
                let at = offset as usize;
                let data = self.disk[at..at + len as usize].to_vec();
                (to, FromMember::Read { token, op, data })
            }
            Entry::Write {
                to,
                token,
                op,
                offset,
                data,
                fua,
            } => {
                let at = offset as usize;
                self.disk[at..at + data.len()].copy_from_slice(&data);
                let block = self.config.block_bytes as usize;
                let blocks = at / block..(at + data.len()) / block;
                if fua {
                    self.durable[at..at + data.len()].copy_from_slice(&data);
                    for b in blocks {
                        self.cached.remove(&b);
                    }
                } else {
                    self.cached.extend(blocks);
                }
                (to, FromMember::Written { token, op })
            }
            Entry::Flush { to, token, op } => {
                self.flush_cache();
                (to, FromMember::Written { token, op })
            }
            // As the node does: the pool flushed, then the snapshot taken.
            Entry::Control {
                to,
                token,
                op,
                control,
            } => {
                if let MemberControl::Snapshot { name } = control {
                    self.flush_cache();
                    self.snapshots.insert(name, self.durable.clone());
                }
                (to, FromMember::Written { token, op })
            }
        };
        out.send(Endpoint::Node(to), Msg::FromMember(reply));
        self.kick(rng, out);
    }
}

impl Node {
    /// Makes every cached block durable.
    fn flush_cache(&mut self) {
        let block = self.config.block_bytes as usize;
        for b in std::mem::take(&mut self.cached) {
            let range = b * block..(b + 1) * block;
            let bytes = self.disk[range.clone()].to_vec();
            self.durable[range].copy_from_slice(&bytes);
        }
    }

    /// The operator asks this node's primary for snapshot `name`.
    pub fn ask_snapshot(&mut self, name: String, now: Duration, out: &mut Outbox) {
        let Some(primary) = &mut self.primary else {
            return;
        };
        let control = MemberControl::Snapshot { name: name.clone() };
        match primary.control(control, now) {
            Ok(()) => out.note(format!("{}: snapshot {name} asked", self.id)),
            Err(refused) => out.note(format!("{}: snapshot {name} refused: {refused}", self.id)),
        }
        self.pump(now, out);
    }

    /// Its shard's snapshot `name`, if it took it.
    pub fn snapshot(&self, name: &str) -> Option<&[u8]> {
        self.snapshots.get(name).map(Vec::as_slice)
    }
}

/// An action in a trace line, without its bytes.
fn brief(action: &EcAction) -> String {
    match action {
        EcAction::Send { member, msg, .. } => match msg {
            ToMember::Fence { token } => format!("fence m{member} e{}", token.epoch.0),
            ToMember::Read {
                op, offset, len, ..
            } => {
                format!("read m{member} op{} @{offset}+{len}", op.0)
            }
            ToMember::Flush { op, .. } => format!("flush m{member} op{}", op.0),
            ToMember::Control { op, control, .. } => {
                format!("control m{member} op{} {control:?}", op.0)
            }
            ToMember::Write {
                op, offset, data, ..
            } => {
                let first = data
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8")));
                format!(
                    "write m{member} op{} @{offset}+{} first {:?}",
                    op.0,
                    data.len(),
                    first
                )
            }
        },
        EcAction::Commit { record, .. } => format!("commit {:?}", record.members),
        EcAction::ControlDone { control, members } => {
            format!("{control:?} done by members {members:?}")
        }
        EcAction::Complete { op, result, data } => {
            format!("complete op{} {result:?} {} bytes", op.0, data.len())
        }
    }
}
