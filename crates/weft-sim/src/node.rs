//! A simulated storage node: what the node's data plane and control loop do
//! for one replicated volume, running `weft-replication`'s [`Driver`] (the
//! rules the node's replicator keeps, by the same code) around its primary.
//!
//! Its files (write intent and run) change as the replicator's do: each
//! change takes a disk's time, the driver gives nothing more until it is
//! durable, and one may fail (a full disk), which ends the primary. A
//! primary that ended drains (its local writes and file change in flight
//! finish) before the node may serve again, as the replicator does.
//!
//! Its replica side takes fences with the code the node's target runs
//! (`weft_proto::fence`): each primary's session is a controller of its
//! replica subsystem, and its own primary writes its local copy as that
//! fence's local writer (`LocalFence`), so that a newer primary's fence is
//! answered only once those writes landed; and only from the primary its
//! copy of the record names, at the record's epoch (`FenceAuthority`: a
//! fence its record does not admit yet waits for a newer record, as the
//! target's does, then is refused). Read grants are the target's as well:
//! each command of a session is heard on the process's own clock (which
//! starts with the process, as the target's does), a fence is answered
//! once the grant it ended ran out (after a promotion), a promoted
//! primary's own fence waits for it before it serves, and an in-sync
//! replica that has not heard its primary for a grant takes over (its own
//! compare-and-swap, as `weft_node::cluster::silence`). Its write intent is the
//! target's too (`weft_proto::intent::WriteIntent`): a replica's write to a
//! region it does not cover, or while the node is unclean, marks it (in the
//! file first) as the node's slow path does; a Clean clears it in memory,
//! written to the file lazily (once a second); a fence is answered with the
//! intent as its log page encodes it and a primary decodes it.
//!
//! Persistent across a crash: the disk's blocks, the write intent's file,
//! the last epoch this node served as primary and its run as primary.
//! Everything else is lost with the process, the replica's fence and the
//! live intent included (read again from the file): a restart kills every
//! connection, so no session older than the next fence can speak to it
//! again, and it admits nothing until fenced anew.

use crate::rng::Rng;
use crate::world::{Endpoint, Event, HostCmd, Msg, Outbox, SimConfig, StoreReq, StoreResp};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weft_proto::fence::{
    FenceAdmission, FenceAuthority, FenceToken, FencedIo, Fences, LocalFence,
    FENCE_ADMISSION_PATIENCE, READ_GRANT,
};
use weft_proto::intent::{clean_regions, IntentLogHeader, WriteIntent, INTENT_LOG_HEADER_LEN};
use weft_proto::target::{ControllerRegistry, ControllerShared};
use weft_proto::types::Timestamp;
use weft_replication::{
    plan_start, Action, Driver, Epoch, Extent, FromReplica, Geometry, HostResult, MemberState,
    NodeId, OpId, Primary, PrimaryConfig, PrimaryPhase, RegionSet, ReplicaSet, Run, Start,
    ToReplica, Token,
};

const RENEW_EVERY: Duration = Duration::from_millis(250);
const POLL_EVERY: Duration = Duration::from_millis(100);
const STORE_TIMEOUT: Duration = Duration::from_millis(500);
/// A node stops trusting its lease this long before the store's view of it ends.
const LEASE_MARGIN: Duration = Duration::from_millis(100);
/// One change to its files in this many cannot be made durable (a full disk).
const FILE_FAILURE_PPM: u64 = 2_000;
/// One local write in this many is held long (see `Node::local_io`).
const HELD_WRITE_PPM: u64 = 1_000;
/// A block's bytes, as the write intent counts them.
const BLOCK_SHIFT: u32 = 12;
/// Cleared regions are written to the intent's file this often at most
/// (as the node's manager does).
const PERSIST_CLEARED_EVERY: Duration = Duration::from_secs(1);

enum Role {
    Replica,
    Primary(Box<Driver>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StoreAsk {
    Renew { sent: Duration },
    Get,
    Commit,
    Bump,
}

/// The replica subsystem's NQN (one volume).
const REPLICA_NQN: &str = "nqn.2024-01.io.weft:replica:sim";

enum Local {
    Write {
        extent: Extent,
        data: Vec<u64>,
        fua: bool,
        /// Counted against this node's replica fence until it landed.
        _fenced: FencedIo,
    },
    Read {
        extent: Extent,
    },
    Flush,
    /// A host read the data plane serves from this copy itself (the
    /// reactor's direct path: checked when it is submitted, read when it
    /// completes), answered straight to the host.
    Direct {
        extent: Extent,
        host_op: u64,
        attempt: u32,
    },
}

/// Faults a node injected into itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeFaults {
    /// Changes to its files that could not be made durable.
    pub files_failed: u64,
    /// Local writes held long in the manager's queue.
    pub writes_held: u64,
}

pub struct Node {
    id: NodeId,
    /// What it injected into itself (kept across crashes).
    pub faults: NodeFaults,
    geometry: Geometry,
    lease_ttl: Duration,
    replica_timeout: Duration,
    clean_delay: Duration,
    incarnation: u64,
    // Persistent.
    pub disk: Vec<u64>,
    /// What the disk holds durably: what survives a power loss (`disk` is
    /// what reads see, the volatile cache included).
    durable: Vec<u64>,
    /// The write intent's file: the regions marked when it was last written.
    intent_file: RegionSet,
    served_epoch: Epoch,
    /// Its run as primary (kept regions and members to rebuild in full
    /// persisted as the primary asks: at once, which the driver's lazy
    /// writes only ever over-state).
    run: Run,
    /// The change to its files on its way to the disk (the driver's
    /// `IntentSet`, `Keep`, `AllInSync` or `Full`), and the primary that asked.
    files: Option<(Action, u64)>,
    /// Primaries this process began (which one a file change answers).
    primaries: u64,
    /// Its disk fails every I/O (a failed pool) until cleared or the
    /// process restarts (the pool is opened again).
    disk_failed: bool,
    /// Its data directory is full: no change to its files can be made
    /// (kept across restarts, until the operator makes room).
    files_full: bool,
    /// Its primary's ops whose local part failed: never acknowledged.
    failed_ops: std::collections::BTreeSet<OpId>,
    /// Fences taken while its own local writes were on their way, to be
    /// answered once the fence is drained.
    fence_answers: Vec<(NodeId, Token, Arc<ControllerShared>)>,
    /// Fences its record does not admit yet, and when each is refused.
    unadmitted: Vec<(NodeId, Token, Duration)>,
    /// Power was lost since a primary last wrote here (the boot id changed).
    unclean: bool,
    /// An unclean node takes itself out of the in-sync set before it joins
    /// the cluster again (so that nobody promotes it or counts on it).
    may_register: bool,
    // Lost in a crash.
    /// The write intent the data plane checks (read from the file at start).
    intent: WriteIntent,
    /// When cleared regions were last written to the file.
    cleared_persisted_at: Duration,
    /// The replica subsystem's fence and controllers (the target's).
    fences: Arc<Fences>,
    controllers: ControllerRegistry,
    /// Each primary's session: its token and controller.
    sessions: BTreeMap<NodeId, (Token, Arc<ControllerShared>)>,
    /// Its primary's hold on the fence, for its local writes.
    own_fence: Option<LocalFence>,
    /// A promotion it serves once the read grant its own fence ended ran
    /// out: its fence, and the record (and revision) it serves.
    promoted: Option<(LocalFence, u64, ReplicaSet, bool)>,
    /// When its process started: its target's clock counts from here.
    started_at: Duration,
    /// Until when its data plane reads this copy itself, as its replicator
    /// last published (none: every read goes through the primary).
    direct_reads_until: Option<Duration>,
    role: Role,
    record: Option<(u64, ReplicaSet)>,
    lease_until: Duration,
    may_register_at: Duration,
    last_renew: Option<Duration>,
    last_poll: Option<Duration>,
    asks: BTreeMap<u64, (StoreAsk, Duration)>,
    next_tag: u64,
    /// Host commands by primary op: (host op, attempt).
    host_ops: BTreeMap<OpId, (u64, u32)>,
    next_op: u64,
    buffers: BTreeMap<OpId, Vec<u64>>,
    local: BTreeMap<u64, (OpId, Local)>,
    next_local: u64,
    optimized: bool,
    /// `WEFT_SIM_DEBUG_BLOCK`: trace every write to this block, and the
    /// primary's view at every completion.
    debug_block: Option<u64>,
}

impl Node {
    pub fn new(id: NodeId, geometry: Geometry, config: &SimConfig) -> Node {
        let regions = geometry.regions();
        Node {
            id,
            faults: NodeFaults::default(),
            geometry,
            lease_ttl: config.lease_ttl,
            replica_timeout: config.replica_timeout,
            clean_delay: config.clean_delay,
            incarnation: 0,
            disk: vec![0; geometry.blocks as usize],
            durable: vec![0; geometry.blocks as usize],
            files: None,
            primaries: 0,
            disk_failed: false,
            files_full: false,
            failed_ops: std::collections::BTreeSet::new(),
            fence_answers: Vec::new(),
            unadmitted: Vec::new(),
            unclean: false,
            may_register: true,
            intent: live_intent(geometry, &RegionSet::new(regions), false),
            cleared_persisted_at: Duration::ZERO,
            fences: Arc::default(),
            controllers: ControllerRegistry::default(),
            sessions: BTreeMap::new(),
            own_fence: None,
            promoted: None,
            started_at: Duration::ZERO,
            direct_reads_until: None,
            intent_file: RegionSet::new(regions),
            served_epoch: Epoch(0),
            run: Run::new(Epoch(0), regions),
            role: Role::Replica,
            record: None,
            lease_until: Duration::ZERO,
            may_register_at: Duration::ZERO,
            last_renew: None,
            last_poll: None,
            asks: BTreeMap::new(),
            next_tag: 0,
            host_ops: BTreeMap::new(),
            next_op: 0,
            buffers: BTreeMap::new(),
            local: BTreeMap::new(),
            next_local: 0,
            optimized: false,
            debug_block: std::env::var("WEFT_SIM_DEBUG_BLOCK")
                .ok()
                .and_then(|b| b.parse().ok()),
        }
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    pub fn is_active_primary(&self) -> bool {
        matches!(&self.role, Role::Primary(d) if d.primary().phase() == PrimaryPhase::Active)
    }

    /// No host command is in flight here, nor local I/O (a write the host
    /// gave up on may still be on its way to the copies).
    pub fn is_settled(&self) -> bool {
        self.host_ops.is_empty() && self.local.is_empty()
    }

    pub fn describe(&self) -> String {
        let role = match &self.role {
            Role::Replica => format!("replica fenced {:?}", self.fences.token(REPLICA_NQN)),
            Role::Primary(d) => format!(
                "primary {:?} epoch {}",
                d.primary().phase(),
                d.primary().epoch().0
            ),
        };
        format!(
            "{} {role}, lease until {:?}, host ops {}",
            self.id,
            self.lease_until,
            self.host_ops.len()
        )
    }

    /// The process dies: local writes and the file change in flight reach
    /// the disk or not.
    pub fn crash(&mut self, _now: Duration, rng: &mut Rng) {
        for (_, (_, local)) in std::mem::take(&mut self.local) {
            if let Local::Write {
                extent, data, fua, ..
            } = local
            {
                if rng.chance(500_000) {
                    self.apply(extent, &data, fua);
                }
            }
        }
        if let Some((change, _)) = self.files.take() {
            if rng.chance(500_000) {
                self.change_files(change);
            }
        }
        self.incarnation += 1;
        self.fence_answers.clear();
        self.unadmitted.clear();
        self.disk_failed = false;
        self.failed_ops.clear();
        self.intent = live_intent(self.geometry, &self.intent_file, self.unclean);
        // The target's fences and controllers die with the process.
        self.fences = Arc::default();
        self.controllers = ControllerRegistry::default();
        self.sessions.clear();
        self.become_replica();
        self.record = None;
        self.lease_until = Duration::ZERO;
        self.last_renew = None;
        self.last_poll = None;
        self.asks.clear();
        self.optimized = false;
        self.direct_reads_until = None;
    }

    /// Serves as a replica from now on (after a restart or a deposition):
    /// fenced as before, admitting nothing until fenced anew.
    fn become_replica(&mut self) {
        self.role = Role::Replica;
        self.own_fence = None;
        self.promoted = None;
        self.host_ops.clear();
        self.buffers.clear();
    }

    /// The machine loses power: the process dies and each block written
    /// since its last flush keeps its new content or loses it.
    pub fn power_loss(&mut self, now: Duration, rng: &mut Rng) {
        self.crash(now, rng);
        for block in 0..self.disk.len() {
            if self.disk[block] != self.durable[block] && rng.chance(500_000) {
                self.disk[block] = self.durable[block];
            }
        }
        self.durable.clone_from(&self.disk);
        self.unclean = true;
        self.intent = live_intent(self.geometry, &self.intent_file, true);
        self.may_register = false;
        self.become_replica();
    }

    /// Its disk starts failing every I/O (a failed pool).
    pub fn fail_disk(&mut self) {
        self.disk_failed = true;
    }

    /// The operator cleared the disk's failure.
    pub fn clear_disk(&mut self) {
        self.disk_failed = false;
    }

    /// Its data directory fills up, or has room again.
    pub fn set_files_full(&mut self, full: bool) {
        self.files_full = full;
    }

    /// Whether its disk fails I/O now.
    pub fn is_disk_failed(&self) -> bool {
        self.disk_failed
    }

    /// Whether the node lost power and is not rebuilt yet.
    pub fn is_unclean(&self) -> bool {
        self.unclean
    }

    /// The process starts again; it joins once its old lease has surely
    /// ended, as `weft serve` does.
    pub fn restart(&mut self, now: Duration) {
        self.may_register_at = now + self.lease_ttl;
        self.started_at = now;
    }

    /// `now` on its target's clock.
    fn target_time(&self, now: Duration) -> Timestamp {
        Timestamp(now.saturating_sub(self.started_at))
    }

    /// Whether a fence of its replica subsystem may be answered: no other
    /// writer's I/O on its way and, unless its record says the previous
    /// primary handed over, the read grant it ended ran out.
    fn fence_settled(&self, controller: &ControllerShared, now: Duration) -> bool {
        let waits = self
            .record
            .as_ref()
            .is_none_or(|(_, record)| !record.handed_over_by_previous());
        self.fences.drained(controller)
            && !(waits
                && self
                    .fences
                    .grant_ends(controller)
                    .is_some_and(|ends| self.target_time(now) < ends))
    }

    fn apply(&mut self, extent: Extent, data: &[u64], durable: bool) {
        let start = extent.block as usize;
        self.disk[start..start + data.len()].copy_from_slice(data);
        if durable {
            self.durable[start..start + data.len()].copy_from_slice(data);
        }
    }

    fn flush(&mut self) {
        self.durable.clone_from(&self.disk);
    }

    fn read(&self, extent: Extent) -> Vec<u64> {
        let start = extent.block as usize;
        self.disk[start..start + extent.blocks as usize].to_vec()
    }

    fn ask(&mut self, ask: StoreAsk, req: StoreReq, now: Duration, out: &mut Outbox) {
        self.next_tag += 1;
        self.asks.insert(self.next_tag, (ask, now));
        out.send(
            Endpoint::Store,
            Msg::StoreReq {
                tag: self.next_tag,
                req,
            },
        );
    }

    pub fn tick(&mut self, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        self.admit_fences(now, out);
        self.answer_fences(now, out);
        self.serve_when_granted(now, out);
        self.take_over_if_silent(now, out);
        let may_renew = self.may_register && now >= self.may_register_at;
        if may_renew && self.last_renew.is_none_or(|t| now >= t + RENEW_EVERY) {
            self.last_renew = Some(now);
            self.ask(StoreAsk::Renew { sent: now }, StoreReq::Renew, now, out);
        }
        if self.last_poll.is_none_or(|t| now >= t + POLL_EVERY) {
            self.last_poll = Some(now);
            // Before it joins after a power loss, it reads the store itself
            // (`weft serve` does so through etcd, not its mirror): a lagging
            // revision that shows it out of sync must not let it join.
            let req = if self.may_register {
                StoreReq::Get
            } else {
                StoreReq::GetLatest
            };
            self.ask(StoreAsk::Get, req, now, out);
        }
        let expired: Vec<(u64, StoreAsk)> = self
            .asks
            .iter()
            .filter(|(_, (_, sent))| now >= *sent + STORE_TIMEOUT)
            .map(|(&tag, &(ask, _))| (tag, ask))
            .collect();
        for (tag, ask) in expired {
            self.asks.remove(&tag);
            if ask == StoreAsk::Commit {
                if let Role::Primary(driver) = &mut self.role {
                    driver.commit_failed(None, now);
                }
            }
        }
        if now >= self.cleared_persisted_at + PERSIST_CLEARED_EVERY {
            self.cleared_persisted_at = now;
            self.persist_cleared();
        }
        let lease_until = self.lease_until;
        if let Role::Primary(driver) = &mut self.role {
            driver.tick(lease_until, now);
        }
        self.drive(now, rng, out);
    }

    /// Takes over from the record's primary if its replica has not heard
    /// it for a read grant and it is in sync (`weft_node::cluster::silence`:
    /// a compare-and-swap on the record as this node last saw it, which
    /// fails if that lags), one at a time.
    fn take_over_if_silent(&mut self, now: Duration, out: &mut Outbox) {
        let Some((revision, record)) = &self.record else {
            return;
        };
        let authority = FenceAuthority {
            host_nqn: node_host(record.primary),
            epoch: record.epoch.0,
            waits_for_grants: true,
        };
        let silent = self
            .fences
            .holder_silent(REPLICA_NQN, &authority, self.target_time(now));
        let asking = self.asks.values().any(|(a, _)| *a == StoreAsk::Bump);
        if !silent || asking || !self.may_register {
            return;
        }
        let me = self.id;
        let Some(next) = weft_replication::controller::promote(record, |n| n == me) else {
            return;
        };
        out.note(format!(
            "has not heard the primary of epoch {} for a read grant: takes over",
            record.epoch.0
        ));
        let revision = *revision;
        self.ask_record(revision, next, now, out);
    }

    /// Marks `regions` in the intent's file, then in the live intent, and
    /// the node clean (the file is written under this boot), as the node's
    /// `IntentFile::mark` does.
    fn mark_intent(&mut self, regions: std::ops::Range<u32>) {
        let on_file = regions.clone().all(|r| self.intent_file.contains(r));
        if !on_file || self.intent.unclean() {
            self.intent_file = RegionSet::new(self.geometry.regions());
            for region in self.intent.marked().into_iter().chain(regions.clone()) {
                self.intent_file.insert(region);
            }
        }
        self.intent.mark(regions);
        self.intent.set_clean();
        self.unclean = false;
    }

    /// Writes the intent's file again if regions were cleared since (never
    /// while unclean: the file keeps its old boot until a write), as the
    /// node's manager does once a second.
    fn persist_cleared(&mut self) {
        if !self.intent.take_cleared() || self.intent.unclean() {
            return;
        }
        self.intent_file = RegionSet::new(self.geometry.regions());
        for region in self.intent.marked() {
            self.intent_file.insert(region);
        }
    }

    /// The marked regions of the live intent.
    fn intent_marked(&self) -> RegionSet {
        let mut marked = RegionSet::new(self.geometry.regions());
        for region in self.intent.marked() {
            marked.insert(region);
        }
        marked
    }

    /// A fence's answer: the intent as the target's log page encodes it and
    /// a primary's link decodes it.
    fn fenced(&self, token: Token) -> FromReplica {
        let mut page = vec![0; INTENT_LOG_HEADER_LEN + 4 * self.intent.marked().len()];
        self.intent.log_page(0, &mut page);
        let (header, list) = page.split_at(INTENT_LOG_HEADER_LEN);
        let header = IntentLogHeader::decode(header.try_into().expect("the header's length"));
        assert_eq!(header.region_bytes, self.intent.region_bytes());
        let mut intent = RegionSet::new(self.geometry.regions());
        for region in clean_regions(list, header.marked) {
            intent.insert(region);
        }
        FromReplica::Fenced {
            token,
            intent,
            unclean: header.unclean,
        }
    }

    pub fn receive(
        &mut self,
        from: Endpoint,
        msg: Msg,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        match msg {
            Msg::StoreResp { tag, resp } => self.store_answer(tag, resp, now, out),
            Msg::Io { op, attempt, cmd } => self.host_command(op, attempt, cmd, now, rng, out),
            Msg::AnaQuery => out.send(
                Endpoint::Host,
                Msg::AnaState {
                    optimized: self.is_optimized(now),
                },
            ),
            Msg::ToReplica { msg, data } => {
                let Endpoint::Node(primary) = from else {
                    return;
                };
                self.replica_message(primary, msg, data, now, rng, out);
            }
            Msg::FromReplica(reply) => {
                let Endpoint::Node(replica) = from else {
                    return;
                };
                if let Role::Primary(driver) = &mut self.role {
                    driver.replica_reply(replica, reply, now);
                }
            }
            Msg::IoDone { .. } | Msg::AnaState { .. } | Msg::StoreReq { .. } => {}
        }
        self.drive(now, rng, out);
    }

    /// What its replicator publishes to the data plane: until when reads
    /// may bypass the primary (`Replicated::reads_until`), while it serves
    /// with every region settled and every grant held.
    fn publish(&mut self, now: Duration) {
        self.direct_reads_until = match &self.role {
            Role::Primary(driver) if driver.serving(now) == weft_replication::Serving::Yes => {
                Some(driver.primary().reads_until())
            }
            _ => None,
        };
    }

    fn is_optimized(&self, now: Duration) -> bool {
        matches!(&self.role, Role::Primary(d) if matches!(d.serving(now), weft_replication::Serving::Yes | weft_replication::Serving::Resyncing))
    }

    fn store_answer(&mut self, tag: u64, resp: StoreResp, now: Duration, out: &mut Outbox) {
        let Some((ask, _)) = self.asks.remove(&tag) else {
            return;
        };
        match (ask, resp) {
            (StoreAsk::Renew { sent }, StoreResp::Renewed) => {
                self.lease_until = self.lease_until.max(sent + self.lease_ttl - LEASE_MARGIN);
                if let Role::Primary(driver) = &mut self.role {
                    driver.tick(self.lease_until, now);
                }
            }
            (StoreAsk::Commit, StoreResp::CasOk { revision, record }) => {
                if let Role::Primary(driver) = &mut self.role {
                    driver.committed(revision, record.clone(), now);
                }
                self.record_seen(revision, record, now, out);
            }
            (StoreAsk::Commit, StoreResp::CasFailed { revision, record }) => {
                if let Role::Primary(driver) = &mut self.role {
                    driver.commit_failed(Some((revision, record.clone())), now);
                }
                self.record_seen(revision, record, now, out);
            }
            (
                StoreAsk::Get | StoreAsk::Bump,
                StoreResp::Record { revision, record }
                | StoreResp::CasOk { revision, record }
                | StoreResp::CasFailed { revision, record },
            ) => self.record_seen(revision, record, now, out),
            _ => {}
        }
    }

    /// The record at `revision`: follow it (become primary, or stop being one).
    fn record_seen(&mut self, revision: u64, record: ReplicaSet, now: Duration, out: &mut Outbox) {
        if self
            .record
            .as_ref()
            .is_some_and(|(known, _)| *known > revision)
        {
            return;
        }
        self.record = Some((revision, record.clone()));
        self.admit_fences(now, out);
        if !self.may_register {
            if self.unclean {
                return self.leave_in_sync_set(revision, &record, now, out);
            }
            // A primary is rebuilding it in full: it may join again.
            self.may_register = true;
        }
        if let Role::Primary(driver) = &mut self.role {
            driver.record_changed(revision, record.clone(), now);
            if driver.ended().is_none() {
                return;
            }
        }
        if let Some((_, pending_revision, pending, _)) = &mut self.promoted {
            if record.epoch == pending.epoch && record.primary == self.id {
                // Its promotion, changed meanwhile: served as it is now.
                (*pending_revision, *pending) = (revision, record);
                return;
            }
            out.note(format!(
                "epoch {} superseded before it served",
                pending.epoch.0
            ));
            self.promoted = None;
        }
        if record.primary != self.id {
            return;
        }
        let lease_valid = now < self.lease_until;
        // A primary that ended drains before the next one begins here.
        let drained = self.local.is_empty() && self.files.is_none();
        if !lease_valid || !drained || matches!(&self.role, Role::Primary(d) if d.ended().is_none())
        {
            return;
        }
        match plan_start(&record, self.id, self.served_epoch) {
            Start::Serve { continued } => {
                self.become_primary(revision, record, continued, now, out)
            }
            Start::NextEpoch(next) => {
                if !self.asks.values().any(|(a, _)| *a == StoreAsk::Bump) {
                    // This node served this epoch before (it restarted, or
                    // it ended): it takes a new one, so that its fences are new.
                    out.note(format!("asks to serve again under epoch {}", next.epoch.0));
                    self.ask_record(revision, next, now, out);
                }
            }
        }
    }

    /// After a power loss: out of the in-sync set before joining again (the
    /// primary role to another in-sync replica if there is one; the sole
    /// copy carries on with what it has).
    fn leave_in_sync_set(
        &mut self,
        revision: u64,
        record: &ReplicaSet,
        now: Duration,
        out: &mut Outbox,
    ) {
        if !record.is_in_sync(self.id) {
            self.may_register = true;
            return;
        }
        if self.asks.values().any(|(a, _)| *a == StoreAsk::Bump) {
            return;
        }
        let mut next = record.clone();
        if record.primary == self.id {
            // Promoted while it was down, never served: the previous primary
            // holds every acknowledged write. Else another in-sync replica
            // does. Else this copy is all there is.
            let never_served = self.served_epoch < record.epoch;
            // The previous primary holds every acknowledged write if it was
            // in sync until this epoch (faulted only by the promotion).
            let complete = |p: NodeId| {
                record.is_in_sync(p)
                    || record.state_of(p)
                        == Some(MemberState::Faulted {
                            epoch: record.epoch,
                        })
            };
            let previous = record
                .previous
                .filter(|&p| never_served && p != self.id && complete(p));
            let Some(other) = previous.or_else(|| record.in_sync_secondaries().next()) else {
                self.may_register = true;
                return;
            };
            next.epoch = record.epoch.next();
            next.primary = other;
            next.previous = Some(self.id);
            next.move_to = None;
            next.retire.retain(|&n| n != other);
            next.set_state(other, MemberState::InSync);
        }
        next.set_state(self.id, MemberState::Faulted { epoch: next.epoch });
        out.note(format!("lost power: leaves the in-sync set ({next:?})"));
        self.ask_record(revision, next, now, out);
    }

    /// Hands the volume to an in-sync replica under the next epoch, its own
    /// copy faulted under this one (the replicator's `hand_over_unwritable`).
    fn hand_over_unwritable(
        &mut self,
        revision: u64,
        record: &ReplicaSet,
        now: Duration,
        out: &mut Outbox,
    ) {
        let Some(target) = record.in_sync_secondaries().next() else {
            return;
        };
        if self.asks.values().any(|(a, _)| *a == StoreAsk::Bump) {
            return;
        }
        let mut next = record.handed_over(target);
        // Faulted into the next epoch: its copy holds every acknowledged
        // write (only its files failed), so that the new primary rebuilds
        // it partially, and gives the role back to it if it turns out to
        // have lost power meanwhile (as after a promotion).
        next.set_state(self.id, MemberState::Faulted { epoch: next.epoch });
        out.note(format!("cannot persist its files: hands over ({next:?})"));
        self.ask_record(revision, next, now, out);
    }

    /// Asks the store to replace the record at `revision` by `next`: a change
    /// of this node's own standing, one at a time.
    fn ask_record(&mut self, revision: u64, next: ReplicaSet, now: Duration, out: &mut Outbox) {
        let cas = StoreReq::Cas {
            base: revision,
            record: next,
        };
        self.ask(StoreAsk::Bump, cas, now, out);
    }

    fn become_primary(
        &mut self,
        revision: u64,
        record: ReplicaSet,
        continued: bool,
        now: Duration,
        out: &mut Outbox,
    ) {
        if self.files_full {
            // It cannot persist its served epoch and run: as the
            // replicator does, it hands the volume to a replica in sync.
            return self.hand_over_unwritable(revision, &record, now, out);
        }
        // Fence this node's own replica first: the old primary's writes stop here too.
        let own = Token {
            epoch: record.epoch,
            session: 0,
        };
        let own_fence = match self.fences.fence_local(REPLICA_NQN, fence_token(own)) {
            Ok(fence) => fence,
            Err(current) => {
                out.note(format!(
                    "cannot serve epoch {}: fenced by {current:?}",
                    record.epoch.0
                ));
                return;
            }
        };
        // (Its own writes drained before it began, and replicas' writes
        // land at once here: nobody's are on their way.)
        assert!(own_fence.drained(), "no write on its way to its copy");
        self.promoted = Some((own_fence, revision, record, continued));
        self.serve_when_granted(now, out);
    }

    /// Serves the promotion it fenced its copy for once the read grant its
    /// fence ended ran out (unless the previous primary handed over), as
    /// the replicator's `fence_own` waits; dropped if a newer fence took
    /// its copy meanwhile.
    fn serve_when_granted(&mut self, now: Duration, out: &mut Outbox) {
        let Some((own_fence, revision, record, continued)) = self.promoted.take() else {
            return;
        };
        if !own_fence.holds() {
            out.note(format!("epoch {} fenced before it served", record.epoch.0));
            return;
        }
        let granted = own_fence
            .grant_ends()
            .filter(|_| !record.handed_over_by_previous())
            .filter(|&ends| self.target_time(now) < ends);
        if let Some(ends) = granted {
            out.note(format!(
                "serves epoch {} once its copy's grant ends at {ends:?}",
                record.epoch.0
            ));
            self.promoted = Some((own_fence, revision, record, continued));
            return;
        }
        if !continued {
            self.run = Run::new(record.epoch, self.geometry.regions());
        }
        self.served_epoch = record.epoch;
        // Its copy is the reference now: others are resynced from it.
        self.unclean = false;
        self.intent.set_clean();
        out.note(format!(
            "primary of epoch {} at r{revision}",
            record.epoch.0
        ));
        let config = PrimaryConfig {
            me: self.id,
            geometry: self.geometry,
            replica_timeout: self.replica_timeout,
            reattach_interval: Duration::from_millis(300),
            copies_in_flight_max: 4,
            clean_delay: self.clean_delay,
            read_grant: READ_GRANT - LEASE_MARGIN,
        };
        let intent = self.intent_marked();
        let primary = Primary::new(config, record, revision, intent, self.run.clone(), now);
        let mut driver = Driver::new(primary, self.geometry.blocks);
        driver.tick(self.lease_until, now);
        self.primaries += 1;
        self.role = Role::Primary(Box::new(driver));
        self.own_fence = Some(own_fence);
        self.host_ops.clear();
        self.buffers.clear();
    }

    fn host_command(
        &mut self,
        host_op: u64,
        attempt: u32,
        cmd: HostCmd,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        if let HostCmd::Read(extent) = cmd {
            if self.direct_reads_until.is_some_and(|until| now < until) {
                let direct = Local::Direct {
                    extent,
                    host_op,
                    attempt,
                };
                return self.local_io(OpId(0), direct, rng, out);
            }
        }
        let Role::Primary(driver) = &mut self.role else {
            out.send(
                Endpoint::Host,
                Msg::IoDone {
                    op: host_op,
                    attempt,
                    result: HostResult::Inaccessible,
                    data: Vec::new(),
                },
            );
            return;
        };
        self.next_op += 1;
        let op = OpId(self.next_op);
        self.host_ops.insert(op, (host_op, attempt));
        match cmd {
            HostCmd::Read(extent) => driver.host_read(op, extent, now),
            HostCmd::Write(extent, data, fua) => {
                self.buffers.insert(op, data);
                driver.host_write(op, extent, fua, now);
            }
            HostCmd::Flush => driver.host_flush(op, now),
        }
    }

    fn replica_message(
        &mut self,
        primary: NodeId,
        msg: ToReplica,
        data: Vec<u64>,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        let token = token_of(&msg);
        if let ToReplica::Fence { token } = msg {
            self.unadmitted
                .push((primary, token, now + FENCE_ADMISSION_PATIENCE));
            return self.admit_fences(now, out);
        }
        let disk_time = Duration::from_micros(rng.range(20, 400));
        let (node, incarnation) = (self.id, self.incarnation);
        let answer = |reply: FromReplica, out: &mut Outbox| {
            let answer = Event::ReplicaAnswer {
                node,
                incarnation,
                to: primary,
                reply,
            };
            out.after(disk_time, answer);
        };
        // Its session's controller must hold the fence, counted while it
        // writes; heard first, as the target hears a command.
        let heard = self.target_time(now);
        let session = self
            .sessions
            .get(&primary)
            .filter(|(session, controller)| {
                *session == token && {
                    controller.heard(heard);
                    controller.fenced_io_enter()
                }
            })
            .map(|(_, controller)| Arc::clone(controller));
        let (Some(controller), Role::Replica) = (session, &self.role) else {
            if !matches!(msg, ToReplica::Clean { .. }) {
                let current = token_of_fence(self.fences.token(REPLICA_NQN));
                answer(FromReplica::Refused { token, current }, out);
            }
            return;
        };
        if self.disk_failed && !matches!(msg, ToReplica::Clean { .. }) {
            // Its pool fails the write: the primary hears no success, and
            // faults it when its replica timeout passes.
            controller.fenced_io_done();
            return;
        }
        match msg {
            ToReplica::Fence { .. } => unreachable!("taken above"),
            msg @ (ToReplica::Write { .. } | ToReplica::Copy { .. }) => {
                let (op, extent, fua) = match msg {
                    ToReplica::Write {
                        op, extent, fua, ..
                    } => (op, extent, fua),
                    ToReplica::Copy { op, extent, .. } => (op, extent, false),
                    _ => unreachable!("matched above"),
                };
                let (offset, len) = bytes_of(extent);
                if !self.intent.covers(offset, len) {
                    // The node's slow path: the regions marked in the file
                    // first (and the node clean: written under this boot).
                    self.mark_intent(self.intent.regions_of(offset, len));
                }
                assert_eq!(data.len(), extent.blocks as usize, "data for the extent");
                if self
                    .debug_block
                    .is_some_and(|b| extent.block <= b && b < extent.end())
                {
                    out.note(format!(
                        "applies from {primary} {token:?} op {op:?} {extent:?} {data:?}"
                    ));
                }
                self.apply(extent, &data, fua);
                answer(FromReplica::Done { token, op }, out);
            }
            ToReplica::Flush { op, .. } => {
                self.flush();
                answer(FromReplica::Done { token, op }, out);
            }
            // The fence let it in: that is all a grant asks.
            ToReplica::Grant { op, .. } => answer(FromReplica::Done { token, op }, out),
            ToReplica::Clean { regions, .. } => self.intent.clean(regions),
        }
        controller.fenced_io_done();
    }

    /// Takes, or refuses, the fences waiting for the record to admit them
    /// (see `weft_proto::fence::FenceAuthority`): each as the record this
    /// node has seen says, or refused once its patience ran out.
    fn admit_fences(&mut self, now: Duration, out: &mut Outbox) {
        let authority = self.record.as_ref().map(|(_, record)| FenceAuthority {
            host_nqn: node_host(record.primary),
            epoch: record.epoch.0,
            waits_for_grants: !record.handed_over_by_previous(),
        });
        let (node, incarnation) = (self.id, self.incarnation);
        for (primary, token, refused_at) in std::mem::take(&mut self.unadmitted) {
            let answer = move |reply: FromReplica, out: &mut Outbox| {
                let to = primary;
                out.after(
                    Duration::ZERO,
                    Event::ReplicaAnswer {
                        node,
                        incarnation,
                        to,
                        reply,
                    },
                );
            };
            let admission = authority.as_ref().map_or(FenceAdmission::Unknown, |a| {
                a.admits(&node_host(primary), fence_token(token))
            });
            let refusal = match admission {
                FenceAdmission::Admitted => {
                    self.fence_admitted(primary, token, now, out, answer);
                    continue;
                }
                FenceAdmission::Stale(epoch) => epoch,
                FenceAdmission::Unknown if now < refused_at => {
                    self.unadmitted.push((primary, token, refused_at));
                    continue;
                }
                FenceAdmission::Unknown => authority.as_ref().map_or(0, |a| a.epoch),
            };
            out.note(format!("fence {token:?} from {primary}: not the record's"));
            let current = Token {
                epoch: Epoch(refusal),
                session: 0,
            };
            answer(FromReplica::Refused { token, current }, out);
        }
    }

    /// A fence the record admits: a primary this node still runs is
    /// deposed by it (its epoch is older), then the fence is taken.
    fn fence_admitted(
        &mut self,
        primary: NodeId,
        token: Token,
        now: Duration,
        out: &mut Outbox,
        answer: impl Fn(FromReplica, &mut Outbox),
    ) {
        if let Role::Primary(own) = &self.role {
            if token.epoch > own.primary().epoch() {
                // A newer primary: this one was deposed without knowing it.
                out.note(format!("deposed by a fence of epoch {}", token.epoch.0));
                self.become_replica();
            }
        }
        self.take_fence(primary, token, now, out, answer);
    }

    /// A primary's new session fences the replica subsystem (its previous
    /// connection ends): answered once no other writer's I/O is on its way
    /// to the copy, as the target answers a fence Set Features.
    fn take_fence(
        &mut self,
        primary: NodeId,
        token: Token,
        now: Duration,
        out: &mut Outbox,
        answer: impl Fn(FromReplica, &mut Outbox),
    ) {
        if let Some((_, old)) = self.sessions.remove(&primary) {
            self.fences.forget(&old);
            self.controllers.remove(old.cntlid);
        }
        let host = node_host(primary);
        let controller = self
            .controllers
            .create(REPLICA_NQN, &host, [primary.0 as u8; 16], 16)
            .expect("one controller per primary");
        // The fence is a command of the new holder: its grant runs from here.
        controller.heard(self.target_time(now));
        if let Err(current) = self.fences.fence(fence_token(token), &controller) {
            self.controllers.remove(controller.cntlid);
            let current = token_of_fence(current);
            out.note(format!(
                "fence {token:?} from {primary}: refused, {current:?}"
            ));
            return answer(FromReplica::Refused { token, current }, out);
        }
        self.fences.join(&controller);
        self.sessions
            .insert(primary, (token, Arc::clone(&controller)));
        assert!(
            matches!(self.role, Role::Replica),
            "a newer fence deposed its primary: it is a replica"
        );
        out.note(format!("fence {token:?} from {primary}: taken"));
        if !self.fence_settled(&controller, now) {
            // This node's own writes (an ended primary's) are on their way
            // (none may land after the new primary copied their region), or
            // the read grant the fence ended has not run out.
            out.note(format!(
                "fence answer waits for {} local I/O or a read grant",
                self.local.len()
            ));
            self.fence_answers.push((primary, token, controller));
            return;
        }
        self.fences.answered(&controller, self.target_time(now));
        answer(self.fenced(token), out);
    }

    pub fn local_done(
        &mut self,
        incarnation: u64,
        id: u64,
        now: Duration,
        rng: &mut Rng,
        out: &mut Outbox,
    ) {
        if incarnation != self.incarnation {
            return;
        }
        let Some((op, local)) = self.local.remove(&id) else {
            return;
        };
        let failed = self.disk_failed;
        if let Local::Direct {
            extent,
            host_op,
            attempt,
        } = local
        {
            // (A failed disk's read: the host retries, on any path.)
            let (result, data) = match failed {
                true => (HostResult::Transition, Vec::new()),
                false => (HostResult::Ok, self.read(extent)),
            };
            let done = Msg::IoDone {
                op: host_op,
                attempt,
                result,
                data,
            };
            return out.send(Endpoint::Host, done);
        }
        match local {
            _ if failed => {}
            Local::Direct { .. } => unreachable!("answered above"),
            Local::Write {
                extent, data, fua, ..
            } => self.apply(extent, &data, fua),
            Local::Read { extent } => {
                let data = self.read(extent);
                self.buffers.insert(op, data);
            }
            Local::Flush => self.flush(),
        }
        self.answer_fences(now, out);
        if let Role::Primary(driver) = &mut self.role {
            if failed {
                out.note(format!("local I/O of {op:?} failed: its disk failed"));
                self.failed_ops.insert(op);
                driver.local_failed(op, now);
            } else {
                driver.local_done(op, now);
            }
        }
        self.drive(now, rng, out);
    }

    /// Answers the fences taken that have settled (see `fence_settled`).
    fn answer_fences(&mut self, now: Duration, out: &mut Outbox) {
        let answers = std::mem::take(&mut self.fence_answers);
        for (to, token, controller) in answers {
            if !self.fence_settled(&controller, now) {
                self.fence_answers.push((to, token, controller));
                continue;
            }
            self.fences.answered(&controller, self.target_time(now));
            let reply = self.fenced(token);
            let (node, incarnation) = (self.id, self.incarnation);
            let answer = Event::ReplicaAnswer {
                node,
                incarnation,
                to,
                reply,
            };
            out.after(Duration::ZERO, answer);
        }
    }

    /// The change to its files reached the disk, or could not (`rng`
    /// decides: a full disk).
    pub fn files_done(&mut self, incarnation: u64, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        if incarnation != self.incarnation {
            return;
        }
        let Some((change, primary)) = self.files.take() else {
            return;
        };
        let durable = !self.files_full && !rng.chance(FILE_FAILURE_PPM);
        if durable {
            self.change_files(change);
        } else {
            out.note(format!("cannot persist {change:?} (a full disk)"));
            self.faults.files_failed += 1;
        }
        if let Role::Primary(driver) = &mut self.role {
            if primary == self.primaries {
                driver.files_done(durable);
            }
        }
        self.drive(now, rng, out);
    }

    fn change_files(&mut self, change: Action) {
        match change {
            Action::IntentSet(region) => self.mark_intent(region..region + 1),
            Action::Keep(region) => {
                self.run.kept.insert(region);
            }
            Action::AllInSync => self.run = Run::new(self.run.first_epoch, self.geometry.regions()),
            Action::Full(node) => {
                if !self.run.full.contains(&node) {
                    self.run.full.push(node);
                }
            }
            other => unreachable!("not a change to the files: {other:?}"),
        }
    }

    /// Carries out what the driver gives, in order.
    fn drive(&mut self, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        while let Role::Primary(driver) = &mut self.role {
            let Some(action) = driver.next_action() else {
                break;
            };
            self.act(action, now, rng, out);
        }
        if let Role::Primary(driver) = &self.role {
            if let Some(why) = driver.ended() {
                out.note(format!("ended: {why:?}"));
                // What it held is answered at once (ANA Inaccessible), as
                // the replicator does: the host retries on another path.
                for (_, (op, attempt)) in std::mem::take(&mut self.host_ops) {
                    let done = Msg::IoDone {
                        op,
                        attempt,
                        result: HostResult::Inaccessible,
                        data: Vec::new(),
                    };
                    out.send(Endpoint::Host, done);
                }
                self.become_replica();
            }
        }
        self.publish(now);
        let optimized = self.is_optimized(now);
        if optimized != self.optimized {
            // An ANA change notice to the host.
            self.optimized = optimized;
            out.send(Endpoint::Host, Msg::AnaState { optimized });
        }
    }

    fn act(&mut self, action: Action, now: Duration, rng: &mut Rng, out: &mut Outbox) {
        if matches!(
            action,
            Action::Commit { .. }
                | Action::Send {
                    msg: ToReplica::Fence { .. },
                    ..
                }
        ) {
            out.note(format!("{action:?}"));
        }
        match action {
            change @ (Action::IntentSet(_)
            | Action::Keep(_)
            | Action::AllInSync
            | Action::Full(_)) => {
                assert!(self.files.is_none(), "one change to the files at a time");
                self.files = Some((change, self.primaries));
                out.after(
                    Duration::from_micros(rng.range(50, 2_000)),
                    Event::FilesDone {
                        node: self.id,
                        incarnation: self.incarnation,
                    },
                );
            }
            // Cleared in memory; the file follows lazily (see `tick`).
            Action::IntentClear(region) => self.intent.clean([region]),
            Action::LocalWrite { op, extent, fua } => {
                let data = self.buffers.get(&op).expect("the host's data").clone();
                let fenced = self.own_fence.as_ref().and_then(LocalFence::enter);
                // A newer fence deposes this primary at once (above): it holds its own.
                let _fenced = fenced.expect("a primary holds its node's replica fence");
                let write = Local::Write {
                    extent,
                    data,
                    fua,
                    _fenced,
                };
                self.local_io(op, write, rng, out);
            }
            Action::LocalRead { op, extent } => self.local_io(op, Local::Read { extent }, rng, out),
            Action::LocalFlush { op } => self.local_io(op, Local::Flush, rng, out),
            Action::Send { to, msg } => {
                let data = match &msg {
                    ToReplica::Write { op, .. } | ToReplica::Copy { op, .. } => {
                        self.buffers.get(op).expect("data to send").clone()
                    }
                    _ => Vec::new(),
                };
                out.send(Endpoint::Node(to), Msg::ToReplica { msg, data });
            }
            Action::Commit {
                base_revision,
                record,
            } => {
                // As the replicator: the data plane stops reading this copy
                // before a handover's record can reach the store.
                self.publish(now);
                self.ask(
                    StoreAsk::Commit,
                    StoreReq::Cas {
                        base: base_revision,
                        record,
                    },
                    now,
                    out,
                )
            }
            Action::Complete { op, result } => {
                if self.debug_block.is_some() {
                    if let Role::Primary(d) = &self.role {
                        out.note(format!(
                            "complete {op:?} {result:?} links {:?} record {:?}",
                            d.primary().links(),
                            d.primary().record().members
                        ));
                    }
                }
                let data = self.buffers.remove(&op).unwrap_or_default();
                // Its local part failed and it could not hand over: the
                // replicator gives the host the error; the simulated host
                // knows no such status, and retries as on a path error.
                let result = match (self.failed_ops.remove(&op), result) {
                    (true, HostResult::Ok) => HostResult::Transition,
                    (_, result) => result,
                };
                if let Some((host_op, attempt)) = self.host_ops.remove(&op) {
                    let data = if result == HostResult::Ok {
                        data
                    } else {
                        Vec::new()
                    };
                    out.send(
                        Endpoint::Host,
                        Msg::IoDone {
                            op: host_op,
                            attempt,
                            result,
                            data,
                        },
                    );
                }
            }
        }
    }

    fn local_io(&mut self, op: OpId, local: Local, rng: &mut Rng, out: &mut Outbox) {
        self.next_local += 1;
        // Now and then a local write waits long in the volume manager's
        // queue (longer than a failover): a deposed primary's write is
        // still on its way when the next primary fences this node's copy
        // (that fence is answered once it landed).
        let held = matches!(local, Local::Write { .. }) && rng.chance(HELD_WRITE_PPM);
        self.faults.writes_held += u64::from(held);
        let latency = if held {
            Duration::from_millis(rng.range(500, 4_000))
        } else {
            Duration::from_micros(rng.range(20, 400))
        };
        self.local.insert(self.next_local, (op, local));
        out.after(
            latency,
            Event::LocalDone {
                node: self.id,
                incarnation: self.incarnation,
                op: self.next_local,
            },
        );
    }
}

/// The live intent of a replica of `geometry` whose file holds `file`.
fn live_intent(geometry: Geometry, file: &RegionSet, unclean: bool) -> WriteIntent {
    assert!(geometry.region_blocks.is_power_of_two());
    let shift = BLOCK_SHIFT + geometry.region_blocks.trailing_zeros();
    WriteIntent::new(geometry.blocks << BLOCK_SHIFT, shift, file.iter(), unclean)
}

/// `extent`'s byte offset and length.
fn bytes_of(extent: Extent) -> (u64, u64) {
    (
        extent.block << BLOCK_SHIFT,
        u64::from(extent.blocks) << BLOCK_SHIFT,
    )
}

fn token_of(msg: &ToReplica) -> Token {
    match msg {
        ToReplica::Fence { token }
        | ToReplica::Write { token, .. }
        | ToReplica::Copy { token, .. }
        | ToReplica::Flush { token, .. }
        | ToReplica::Grant { token, .. }
        | ToReplica::Clean { token, .. } => *token,
    }
}

/// The host NQN node `node` connects to replica subsystems with.
fn node_host(node: NodeId) -> String {
    format!("nqn.2024-01.io.weft:node:{}", node.0)
}

fn fence_token(token: Token) -> FenceToken {
    FenceToken {
        epoch: token.epoch.0,
        session: token.session,
    }
}

fn token_of_fence(token: FenceToken) -> Token {
    Token {
        epoch: Epoch(token.epoch),
        session: token.session,
    }
}
