//! The primary of one erasure-coded volume on this node: a thread that
//! takes its epoch (a new one if this node served the last, as
//! `weft_replication::plan_start` rules for replicated volumes), builds the
//! erasure-coded primary (`weft_ec::EcPrimary`) and drives it: host reads,
//! writes and flushes from the reactors, its members' answers from the
//! links, its record changes committed off the thread, the record read
//! again every 100 ms (`replication::records::poll_record`), the node's lease and the time every 10 ms.
//!
//! Once the primary ends (deposed, stalled, or stopped by the manager) the
//! thread answers what it still holds with a path error, stops its links,
//! and asks the manager to reconcile: the next primary, if this node is
//! still the one, starts from there under a new epoch.
//!
//! What this does not do: any stripe arithmetic or journaling (the core's),
//! or block on the store in its loop.

mod barriers;

use super::link::{self, MemberTarget};
use crate::admin_error::AdminError;
use crate::link_keys::LinkKeys;
use crate::replication::barrier::{Barrier, BarrierOp};
use crate::replication::progress::Tracker;
use crate::replication::records::{poll_record, same_shape, swap_replication, Swapped};
use crate::replication::run::write_served_epoch;
use crate::replication::{replica_nqn, NodeServices};
use crate::status::{Published, RebuildStatus};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;
use weft_cluster::lease::LeaseClock;
use weft_cluster::replicas::{node_id, replica_set, with_replica_set};
use weft_control::{DesiredState, ReplicationRecord};
use weft_ec::{EcAction, EcConfig, EcPhase, EcPrimary, FromMember, ToMember};
use weft_initiator::ConnectOptions;
use weft_proto::IoError;
use weft_replication::{plan_start, Epoch, HostResult, OpId, Start, Token};
use weft_target::replicated::{Replicated, ReplicatedIo, ReplicatedSink, ReplicatedWork, Serving};
use weft_target::{VolumeOutcome, VolumeReply};

const TICK: Duration = Duration::from_millis(10);
const MEMBER_TIMEOUT: Duration = Duration::from_secs(2);
const REATTACH_INTERVAL: Duration = Duration::from_secs(1);
/// A Write Zeroes or Deallocate is written this much at a time.
const ZEROES_AT_ONCE: u64 = 1 << 20;

/// What the primary needs to start.
pub(crate) struct ErasureSetup {
    pub volume: String,
    pub me: String,
    pub replication: ReplicationRecord,
    pub revision: u64,
    pub desired: DesiredState,
    pub lease: Arc<LeaseClock>,
    pub connect: ConnectOptions,
    pub link_keys: LinkKeys,
    pub manager: Arc<dyn NodeServices>,
    pub dir: PathBuf,
    pub rebuild_bytes_per_s: u64,
    pub published: Arc<Published>,
}

/// A running primary, as the manager holds it.
pub(crate) struct ErasureHandle {
    /// The volume's path through this node (reads and writes go to it).
    pub path: Arc<Replicated>,
    events: Sender<Event>,
    finished: Arc<AtomicBool>,
}

impl ErasureHandle {
    /// Asks the primary to end.
    pub fn stop(&self) {
        let _ = self.events.send(Event::Stop);
    }

    /// Whether its thread still runs.
    pub fn is_running(&self) -> bool {
        !self.finished.load(Ordering::Acquire)
    }

    /// Makes `op` on every member in sync at one point of the write
    /// stream (`crate::replication::barrier`); `reply` hears back once
    /// the record says so.
    pub fn barrier(&self, op: BarrierOp, reply: Sender<Result<(), AdminError>>) {
        if let Err(mpsc::SendError(Event::Barrier { reply, .. })) =
            self.events.send(Event::Barrier { op, reply })
        {
            let _ = reply.send(Err(not_serving()));
        }
    }
}

fn not_serving() -> AdminError {
    AdminError::Unavailable(
        "this node's primary of the volume is starting, handing over or has ended; try again in a moment".into(),
    )
}

/// What reaches the primary's thread.
pub(crate) enum Event {
    Host(ReplicatedIo),
    Member {
        member: usize,
        reply: FromMember,
    },
    Committed {
        revision: u64,
        record: ReplicationRecord,
    },
    CommitFailed(Option<(u64, ReplicationRecord)>),
    Record {
        revision: u64,
        record: Option<ReplicationRecord>,
    },
    /// A snapshot or a growth asked for.
    Barrier {
        op: BarrierOp,
        reply: Sender<Result<(), AdminError>>,
    },
    /// The snapshot's announcement was written (barrier `seq`), or not.
    Announced {
        seq: u64,
        result: Result<(), AdminError>,
    },
    Stop,
}

struct Sink(Sender<Event>);

impl ReplicatedSink for Sink {
    fn submit(&self, io: ReplicatedIo) {
        // A primary gone drops the I/O: its reply answers ANA Inaccessible.
        let _ = self.0.send(Event::Host(io));
    }
}

/// Starts the primary of `setup.volume` on a thread of its own.
pub(crate) fn start(setup: ErasureSetup) -> Result<ErasureHandle, String> {
    let (events, inbox) = mpsc::channel();
    let path = Arc::new(Replicated::with_reads(Box::new(Sink(events.clone()))));
    let finished = Arc::new(AtomicBool::new(false));
    let handle = ErasureHandle {
        path: Arc::clone(&path),
        events: events.clone(),
        finished: Arc::clone(&finished),
    };
    let name = format!("erasure-{}", setup.volume);
    std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            let manager = Arc::clone(&setup.manager);
            let volume = setup.volume.clone();
            match Server::begin(setup, events, Arc::clone(&path)) {
                Ok(Some(server)) => {
                    if server.serve(&inbox) == EcPhase::Stalled {
                        // Fewer than k members answer: the next primary
                        // (a new epoch) waits a moment before it tries.
                        hold_off(&inbox);
                    }
                }
                Ok(None) => {}
                Err(error) => log::error!("volume {volume}: cannot serve: {error}"),
            }
            path.set_serving(Serving::Inaccessible);
            // What it still held answers ANA Inaccessible as it drops; a
            // snapshot or growth asked meanwhile, to try again.
            while let Ok(event) = inbox.try_recv() {
                if let Event::Barrier { reply, .. } = event {
                    let _ = reply.send(Err(not_serving()));
                }
            }
            finished.store(true, Ordering::Release);
            manager.reconcile();
        })
        .map_err(|e| format!("cannot start its thread: {e}"))?;
    Ok(handle)
}

/// How long a stalled primary's node waits before the next one starts.
const STALL_BACKOFF: Duration = Duration::from_secs(1);

/// Answers host I/O with ANA Transition, and snapshots and growths with
/// "try again", for [`STALL_BACKOFF`].
fn hold_off(inbox: &Receiver<Event>) {
    let until = std::time::Instant::now() + STALL_BACKOFF;
    while let Some(left) = until.checked_duration_since(std::time::Instant::now()) {
        match inbox.recv_timeout(left) {
            Ok(Event::Host(io)) => io
                .reply
                .send(VolumeOutcome::Done(Err(IoError::PathTransition))),
            Ok(Event::Barrier { reply, .. }) => {
                let _ = reply.send(Err(not_serving()));
            }
            Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// A host command in the core, and where its answer goes.
struct HostOp {
    reply: VolumeReply,
    /// A Write Zeroes written piece by piece: where the next piece goes.
    zeroes: Option<(u64, u64)>,
}

struct Server {
    volume: String,
    primary: EcPrimary,
    replication: ReplicationRecord,
    desired: DesiredState,
    lease: Arc<LeaseClock>,
    events: Sender<Event>,
    links: Vec<Sender<ToMember>>,
    ops: BTreeMap<OpId, HostOp>,
    next_op: u64,
    path: Arc<Replicated>,
    manager: Arc<dyn NodeServices>,
    stop_polling: Arc<AtomicBool>,
    stopping: bool,
    published: Arc<Published>,
    /// The rebuilds under way, by member.
    trackers: BTreeMap<usize, Tracker>,
    shown: Vec<RebuildStatus>,
    chunk_bytes: u64,
    /// A snapshot or growth under way, and how many were asked for.
    barrier: Option<Barrier>,
    barriers: u64,
}

impl Server {
    /// Takes the epoch and builds the primary; none if another node serves.
    fn begin(
        setup: ErasureSetup,
        events: Sender<Event>,
        path: Arc<Replicated>,
    ) -> Result<Option<Server>, String> {
        let ErasureSetup {
            volume,
            me,
            mut replication,
            mut revision,
            desired,
            lease,
            connect,
            link_keys,
            manager,
            dir,
            rebuild_bytes_per_s,
            published,
        } = setup;
        let erasure = replication
            .erasure
            .ok_or("the volume is not erasure-coded")?;
        let (geometry, journal) =
            super::shape(&replication, &erasure).map_err(|e| e.to_string())?;
        let own = node_id(&replication, &me).ok_or("this node holds no member")?;
        let epoch_file = dir.join("replicas").join(format!("{volume}.epoch"));
        let served = Epoch(crate::intents::served_epoch(&epoch_file));
        if let Start::NextEpoch(next) = plan_start(&replica_set(&replication), own, served) {
            let next = with_replica_set(&replication, &next);
            match swap_replication(&desired, &volume, revision, next) {
                Swapped::Done(new, record) => (revision, replication) = (new, record),
                Swapped::Failed(_) => return Ok(None),
            }
        }
        write_served_epoch(&dir, &volume, replication.epoch)
            .map_err(|e| format!("{}: {e}", epoch_file.display()))?;
        log::info!(
            "volume {volume}: serves erasure-coded {}+{} under epoch {}",
            erasure.data_shards,
            erasure.parity_shards,
            replication.epoch
        );
        let links = replication
            .members
            .iter()
            .enumerate()
            .map(|(member, m)| {
                let (to, inbox) = mpsc::channel();
                let target = MemberTarget {
                    member,
                    node: m.node.clone(),
                    me: me.clone(),
                    store: Arc::clone(desired.store()),
                    nqn: replica_nqn(&volume),
                    options: connect.clone(),
                    keys: link_keys.clone(),
                    block_size: replication.block_size,
                };
                let events = events.clone();
                std::thread::Builder::new()
                    .name(format!("member-{member}-{volume}"))
                    .spawn(move || link::run(target, inbox, events))
                    .map(|_| to)
                    .map_err(|e| format!("cannot start a member's link: {e}"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        let config = EcConfig {
            me: own,
            geometry,
            journal,
            volume_bytes: replication.size_bytes,
            member_timeout: MEMBER_TIMEOUT,
            reattach_interval: REATTACH_INTERVAL,
            rebuild_bytes_per_sec: rebuild_bytes_per_s,
        };
        let token = Token {
            epoch: Epoch(replication.epoch),
            session: 1,
        };
        let now = lease.now();
        let set = replica_set(&replication);
        let mut primary = EcPrimary::new(config, set, revision, token, now);
        primary.set_lease(lease.until(), now);
        let stop_polling = Arc::new(AtomicBool::new(false));
        let records = events.clone();
        poll_record(
            desired.clone(),
            volume.clone(),
            Arc::clone(&stop_polling),
            move |revision, record| records.send(Event::Record { revision, record }).is_ok(),
        );
        Ok(Some(Server {
            volume,
            primary,
            replication,
            desired,
            lease,
            events,
            links,
            ops: BTreeMap::new(),
            next_op: 0,
            path,
            manager,
            stop_polling,
            stopping: false,
            published,
            trackers: BTreeMap::new(),
            shown: Vec::new(),
            chunk_bytes: u64::from(erasure.chunk_bytes),
            barrier: None,
            barriers: 0,
        }))
    }

    /// Serves until the primary ends; how it ended.
    fn serve(mut self, inbox: &Receiver<Event>) -> EcPhase {
        let mut serving = Serving::Transition;
        loop {
            let now = self.lease.now();
            self.primary.set_lease(self.lease.until(), now);
            self.primary.tick(now);
            self.pump();
            self.track_rebuilds();
            let now_serving = match self.primary.phase() {
                EcPhase::Deposed => Serving::Inaccessible,
                _ if self.primary.optimized(now) => Serving::Yes,
                _ => Serving::Transition,
            };
            if now_serving != serving {
                serving = now_serving;
                self.path.set_serving(serving);
                self.manager.reconcile();
            }
            if self.stopping || matches!(self.primary.phase(), EcPhase::Deposed | EcPhase::Stalled)
            {
                log::info!(
                    "volume {}: its primary here ends ({:?})",
                    self.volume,
                    self.primary.phase()
                );
                break;
            }
            match inbox.recv_timeout(TICK) {
                Ok(event) => {
                    self.handle(event);
                    // Everything waiting, before the next turn.
                    while let Ok(event) = inbox.try_recv() {
                        self.handle(event);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        self.stop_polling.store(true, Ordering::Release);
        self.fail_barrier(not_serving());
        self.published.rebuilds.set(&self.volume, Vec::new());
        for (_, op) in std::mem::take(&mut self.ops) {
            op.reply
                .send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
        }
        self.primary.phase()
    }

    /// Publishes the progress of every member being rebuilt (`volume show`,
    /// /metrics), and logs each rebuild that ended.
    fn track_rebuilds(&mut self) {
        let progress = self.primary.rebuilds();
        let ended: Vec<usize> = self
            .trackers
            .keys()
            .copied()
            .filter(|m| !progress.iter().any(|p| p.member == *m))
            .collect();
        for member in ended {
            let tracker = self.trackers.remove(&member).expect("tracked");
            if self.primary.phase() == EcPhase::Active {
                log::info!(
                    "volume {}: member on {} rebuilt: {} MiB written of its {} MiB shard in {:.1} s",
                    self.volume,
                    self.replication.members[member].node,
                    (u64::from(tracker.total()) * self.chunk_bytes) >> 20,
                    (self.chunk_bytes * self.replication.size_bytes.div_ceil(self.stripe_bytes())) >> 20,
                    tracker.elapsed().as_secs_f64()
                );
            }
        }
        let mut shown = Vec::new();
        for p in progress {
            let left = u32::try_from(p.total - p.done).unwrap_or(u32::MAX);
            let tracker = self
                .trackers
                .entry(p.member)
                .or_insert_with(|| Tracker::new(left));
            let node = &self.replication.members[p.member].node;
            shown.push(tracker.status(node, left, self.chunk_bytes));
        }
        if shown != self.shown {
            self.published.rebuilds.set(&self.volume, shown.clone());
            self.shown = shown;
        }
    }

    /// A stripe's data bytes.
    fn stripe_bytes(&self) -> u64 {
        let erasure = self.replication.erasure.expect("erasure-coded");
        self.chunk_bytes * u64::from(erasure.data_shards)
    }

    fn handle(&mut self, event: Event) {
        let now = self.lease.now();
        match event {
            Event::Host(io) => self.host(io),
            Event::Member { member, reply } => self.primary.member_reply(member, reply, now),
            Event::Committed { revision, record } => {
                let set = replica_set(&record);
                self.replication = record;
                self.primary.committed(revision, set, now);
            }
            Event::CommitFailed(Some((_, record))) if !same_shape(&record, &self.replication) => {
                // Reshaped meanwhile (grown, a member replaced): the next
                // primary serves it; this one commits nothing more.
                self.stopping = true;
            }
            Event::CommitFailed(current) => {
                let current = current.map(|(revision, record)| {
                    let set = replica_set(&record);
                    self.replication = record;
                    (revision, set)
                });
                self.primary.commit_failed(current, now);
            }
            Event::Record { revision, record } => match record {
                Some(record) if same_shape(&record, &self.replication) => {
                    self.primary
                        .record_changed(revision, replica_set(&record), now);
                }
                // Deleted, or reshaped: the next primary serves it.
                _ => self.stopping = true,
            },
            Event::Barrier { op, reply } => self.begin_barrier(op, reply),
            Event::Announced { seq, result } => self.announced(seq, result),
            Event::Stop => self.stopping = true,
        }
        self.pump();
    }

    fn host(&mut self, io: ReplicatedIo) {
        let now = self.lease.now();
        let op = OpId(self.next_op);
        self.next_op += 1;
        let ReplicatedIo { work, reply } = io;
        let mut zeroes = None;
        match work {
            ReplicatedWork::Write { offset, data, .. } => {
                self.primary.host_write(op, offset, data.to_vec(), now)
            }
            ReplicatedWork::Read { offset, len } => self.primary.host_read(op, offset, len, now),
            ReplicatedWork::Flush => self.primary.host_flush(op, now),
            ReplicatedWork::Zeroes { offset, len, .. } => {
                let piece = len.min(ZEROES_AT_ONCE);
                zeroes = Some((offset + piece, offset + len));
                self.primary
                    .host_write(op, offset, vec![0; piece as usize], now);
            }
        }
        self.ops.insert(op, HostOp { reply, zeroes });
    }

    /// Carries out the core's actions.
    fn pump(&mut self) {
        while let Some(action) = self.primary.poll_action() {
            match action {
                EcAction::Send { member, msg, .. } => {
                    // A link gone answers nothing: the member times out.
                    let _ = self.links[member].send(msg);
                }
                EcAction::Commit {
                    base_revision,
                    record,
                } => {
                    let next = with_replica_set(&self.replication, &record);
                    let (desired, volume, events) = (
                        self.desired.clone(),
                        self.volume.clone(),
                        self.events.clone(),
                    );
                    let spawned = std::thread::Builder::new()
                        .name(format!("commit-{volume}"))
                        .spawn(move || {
                            let event =
                                match swap_replication(&desired, &volume, base_revision, next) {
                                    Swapped::Done(revision, record) => {
                                        Event::Committed { revision, record }
                                    }
                                    Swapped::Failed(current) => Event::CommitFailed(current),
                                };
                            let _ = events.send(event);
                        });
                    if spawned.is_err() {
                        let _ = self.events.send(Event::CommitFailed(None));
                    }
                }
                EcAction::Complete { op, result, data } => self.complete(op, result, data),
                EcAction::ControlDone { members, .. } => self.barrier_done(&members),
            }
        }
    }

    fn complete(&mut self, op: OpId, result: HostResult, data: Vec<u8>) {
        let Some(mut host) = self.ops.remove(&op) else {
            return;
        };
        if let (HostResult::Ok, Some((at, end))) = (result, host.zeroes) {
            if at < end {
                // The next piece, under the same op.
                let piece = (end - at).min(ZEROES_AT_ONCE);
                host.zeroes = Some((at + piece, end));
                self.ops.insert(op, host);
                let now = self.lease.now();
                self.primary
                    .host_write(op, at, vec![0; piece as usize], now);
                return;
            }
        }
        let outcome = match result {
            HostResult::Ok if !data.is_empty() => return host.reply.send_read(data),
            HostResult::Ok => Ok(()),
            HostResult::Transition => Err(IoError::PathTransition),
            HostResult::Inaccessible => Err(IoError::PathInaccessible),
        };
        host.reply.send(VolumeOutcome::Done(outcome));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_polling.store(true, Ordering::Release);
    }
}
