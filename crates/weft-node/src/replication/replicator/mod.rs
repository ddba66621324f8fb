//! The replicator: one per replicated volume this node is the primary of,
//! a guest of one of the node's reactors (`weft_target::guest`) once a
//! thread of its own has taken its epoch and fenced. It drives the
//! replication core's `Primary` as `weft-sim`'s node does: host writes and
//! flushes (and reads, during a promotion's resync) come from the
//! reactors, replicas' answers from its links'
//! sockets, the record's changes from a poller and the store's answers
//! from commit threads, as [`Event`]s on one channel or completions on its
//! ring; the actions go out in order (mapped local writes and the links'
//! commands on its own io_uring ring, whose completions ring its reactor,
//! the rest of its local I/O on `LocalPool`'s workers, its write intent
//! and run file on `Durable`'s thread, commits to helper threads). Nothing
//! in a turn blocks: its reactor serves every other connection meanwhile.
//! (Its host writes took two thread hand-overs each way when it had a
//! thread of its own: on two replicas, QD32 4 KiB writes went from 72K to
//! 95K IOPS and CPU per write from 16.6 to 14.4 us with the pools on tmpfs,
//! docs/PERFORMANCE.md section 8.)
//!
//! Before it serves an epoch it persists that it did (`replicas/<volume>.epoch`):
//! a primary that restarts, or comes back after losing its lease, under an
//! epoch it already served asks for the next one instead, so that its
//! fences are new. It fences its own node's replica subsystem with session
//! 0 of the epoch first (`weft_proto::fence::LocalFence`), so that the old
//! primary's writes stop there too, and counts each of its local writes
//! against that fence: a newer primary's fence refuses its later ones and
//! is answered only once those on their way reached its copy, so that none
//! lands on a region the newer primary copied after.
//!
//! It tells the data plane whether the node serves (`Replicated`'s flag)
//! and the manager when that changes (the ANA state follows).
//!
//! - [`begin`]: how it begins an epoch, or hands the volume over when it
//!   cannot persist its files.
//! - [`barriers`]: its part in a snapshot or growth on every copy.
//! - [`record`]: its reads and compare-and-swaps of the volume record.
//! - [`copies`]: the rebuild bandwidth limit.

mod barriers;
mod begin;
mod copies;
mod record;

use super::barrier::{announce_snapshot, Barrier, BarrierOp, Step};
use super::durable::{Durable, FileChange};
use super::link::{LinkTarget, Outgoing, Payload};
use super::links::Links;
use super::local::{LocalPool, LocalResult, LocalWork};
use super::progress::Tracker;
use super::run::{write_served_epoch, RunFile};
use super::write_ring::{RingWrite, Woken, WriteRing};
use super::{replica_nqn, NodeServices};
use super::{Doorbell, Event, Events, Inbox};
use crate::admin_error::AdminError;
use crate::intents::IntentFile;
use crate::replication::records::{poll_record, same_shape};
use crate::status::RebuildStatus;
use copies::CopyLimiter;
use record::commit;
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;
use std::time::{Duration, Instant};
use weft_cluster::replicas::{node_id, replica_set, with_replica_set};
use weft_cluster::LeaseClock;
use weft_control::{DesiredState, ReplicaState, ReplicationRecord};
use weft_initiator::ConnectOptions;
use weft_proto::fence::{FenceToken, LocalFence, READ_GRANT};
use weft_proto::IoError;
use weft_replication::{
    plan_start, Action, Driver, End, Epoch, Extent, FromReplica, Geometry, HostResult, MemberState,
    NodeId, OpId, Primary, PrimaryConfig, PrimaryPhase, RegionSet, Run, Start, ToReplica,
};
use weft_target::guest::Guest;
use weft_target::replicated::{Replicated, ReplicatedIo, ReplicatedSink, ReplicatedWork, Serving};
use weft_target::{
    DataPlane, SnapshotName, VolumeBackend, VolumeOutcome, VolumeReply, VolumeRequest, VolumeWork,
};

/// How often the primary looks at the time (timeouts, lease, rejoins).
const TICK: Duration = Duration::from_millis(20);
/// How often a quiet primary does ([`weft_replication::Primary::quiet`]):
/// a tick is a turn and a system call, and a node of a hundred idle
/// replicated volumes spent a fifth of a core on them. Its lease's end
/// still gets [`TICK`] as it nears.
const QUIET_TICK: Duration = Duration::from_millis(250);
/// Events handled between two submissions of the ring's local writes.
const EVENTS_PER_WAIT: usize = 32;
/// How often the record is read again (the mirror is local: cheap).
/// A replica that has not answered within this long is faulted.
const REPLICA_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a region stays in the write intents after its last write (a
/// region written again meanwhile costs no intent update: md's default is 5 s).
const CLEAN_DELAY: Duration = Duration::from_secs(2);
/// How often a faulted replica is asked back.
const REATTACH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a new primary waits for an older one's writes to its node's copy.
const OWN_FENCE_PATIENCE: Duration = Duration::from_secs(10);
/// What a primary takes off its replicas' read grant: the clocks' rates
/// (a replica counts from when a command arrived, the primary from when it
/// sent it), a tick of its own before it closes the direct read path, and
/// a read already on its way to the disk then.
const READ_GRANT_MARGIN: Duration = Duration::from_millis(200);

/// What a replicator needs.
pub(crate) struct ReplicatorSetup {
    pub(crate) volume: String,
    /// The volume's id (its record's).
    pub(crate) volume_id: String,
    pub(crate) me: String,
    pub(crate) replication: ReplicationRecord,
    pub(crate) revision: u64,
    pub(crate) backend: Arc<VolumeBackend>,
    pub(crate) members: Vec<PathBuf>,
    pub(crate) intent: Arc<IntentFile>,
    pub(crate) desired: DesiredState,
    pub(crate) lease: Arc<LeaseClock>,
    /// How links connect (their DH-HMAC-CHAP secrets are `link_keys`').
    pub(crate) connect: ConnectOptions,
    pub(crate) link_keys: crate::link_keys::LinkKeys,
    pub(crate) manager: Arc<dyn NodeServices>,
    pub(crate) dir: PathBuf,
    /// Where the rebuilds' progress is published.
    pub(crate) published: Arc<crate::status::Published>,
    /// How fast copies to rebuilt replicas go, at most.
    pub(crate) rebuild_bytes_per_s: u64,
    /// The data plane whose reactor hosts the replicator (none: a thread of its own).
    pub(crate) plane: Option<Arc<DataPlane>>,
}

/// A running replicator, as the manager holds it.
#[derive(Debug)]
pub(crate) struct ReplicatorHandle {
    /// The volume's path through the data plane (its backend carries it).
    pub(crate) path: Arc<Replicated>,
    events: Events,
    finished: Arc<AtomicBool>,
    /// The snapshot being taken now, if any.
    taking: Arc<Mutex<Option<String>>>,
}

impl ReplicatorHandle {
    /// Whether its thread still runs.
    pub(crate) fn is_running(&self) -> bool {
        !self.finished.load(Ordering::Acquire)
    }

    /// Asks it to stop (it completes what it holds as Inaccessible); does not wait.
    pub(crate) fn stop(&self) {
        let _ = self.events.send(Event::Stop);
    }

    /// The snapshot it is taking now, if any.
    pub(crate) fn snapshot_taken(&self) -> Option<String> {
        self.taking
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Asks it to take a snapshot, or grow, on every copy in sync; `reply`
    /// hears the result (see `super::barrier`).
    pub(crate) fn barrier(&self, op: BarrierOp, reply: Sender<Result<(), AdminError>>) {
        let event = Event::Barrier {
            op,
            reply: reply.clone(),
        };
        if self.events.send(event).is_err() {
            let _ = reply.send(Err(AdminError::Unavailable(
                "this node stopped being the volume's primary; try again".into(),
            )));
        }
    }
}

/// Where the reactors hand the replicator its host I/O.
struct Sink {
    events: Events,
    /// The thread of the reactor whose guest the replicator is, once it is one.
    host: Arc<OnceLock<ThreadId>>,
}

impl ReplicatedSink for Sink {
    fn submit(&self, io: ReplicatedIo) {
        let event = Event::Host(io);
        // From its own reactor, which gives it a turn after the batch that
        // handed this over: no need to ring it.
        let sent = if self.host.get() == Some(&std::thread::current().id()) {
            self.events.post(event)
        } else {
            self.events.send(event)
        };
        if let Err(mpsc::SendError(Event::Host(io))) = sent {
            io.reply
                .send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
        }
    }
}

/// Starts the replicator of `setup.volume`: a thread takes the epoch and
/// fences (blocking work, over the network), then hands it to a reactor
/// of `setup.plane`, whose guest it is from then on (see
/// `weft_target::guest`); without a plane, or if no reactor can host it,
/// it goes on in that thread.
pub(crate) fn start(setup: ReplicatorSetup) -> std::io::Result<ReplicatorHandle> {
    let (
        events,
        Inbox {
            receiver: inbox,
            doorbell,
        },
    ) = Events::channel()?;
    let host = Arc::new(OnceLock::new());
    let sink = Sink {
        events: events.clone(),
        host: Arc::clone(&host),
    };
    let path = Arc::new(Replicated::new(Box::new(sink)));
    let finished = Arc::new(AtomicBool::new(false));
    let taking = Arc::new(Mutex::new(None));
    let handle = ReplicatorHandle {
        path: Arc::clone(&path),
        events: events.clone(),
        finished: Arc::clone(&finished),
        taking: Arc::clone(&taking),
    };
    std::thread::Builder::new()
        .name(format!("replicator-{}", setup.volume))
        .spawn(move || {
            let volume = setup.volume.clone();
            let manager = setup.manager.clone();
            let plane = setup.plane.clone();
            let mut inbox = Some(inbox);
            let shared = Shared {
                path: Arc::clone(&path),
                taking,
                finished: Arc::clone(&finished),
                host,
            };
            let mut replicator =
                match Replicator::begin(setup, events, &mut inbox, doorbell, shared) {
                    Ok(Some(replicator)) => replicator,
                    not => {
                        if let Err(error) = not {
                            log::warn!("volume {volume}: cannot serve as primary yet: {error}");
                        }
                        // Not now (a newer primary, or this node's copy of the
                        // store is behind, or an error): tried again at a
                        // reconcile after this one shows finished.
                        std::thread::sleep(Duration::from_secs(1));
                        let inbox = inbox.expect("kept unless it began");
                        return wind_up(&volume, &path, &inbox, &manager, &finished);
                    }
                };
            if let Some(plane) = plane {
                match replicator.doorbell() {
                    Ok(doorbell) => return plane.host(&volume, Box::new(replicator), doorbell),
                    Err(error) => log::warn!(
                        "volume {volume}: its replicator runs on a thread of its own: {error}"
                    ),
                }
            }
            while replicator.step(true) {}
        })?;
    Ok(handle)
}

/// A replicator that has finished (or never began) answers what reached it
/// meanwhile, shows finished and tells the manager.
fn wind_up(
    volume: &str,
    path: &Replicated,
    inbox: &Receiver<Event>,
    manager: &Arc<dyn NodeServices>,
    finished: &AtomicBool,
) {
    path.set_serving(Serving::Inaccessible);
    // Whatever the reactors and the manager handed over meanwhile.
    while let Ok(event) = inbox.try_recv() {
        match event {
            Event::Host(io) => io
                .reply
                .send(VolumeOutcome::Done(Err(IoError::PathInaccessible))),
            Event::Barrier { op, reply } => {
                let _ = reply.send(Err(AdminError::Unavailable(format!(
                    "volume {volume}: its primary stopped serving here (it fails over, or its replicas changed) before its {op}; try again"
                ))));
            }
            _ => {}
        }
    }
    finished.store(true, Ordering::Release);
    // Once it shows finished: the reconcile starts another replicator
    // if the record still names this node primary (its members changed).
    manager.reconcile();
}

impl Guest for Replicator {
    fn has_work(&mut self) -> bool {
        // Posted events wait, once draining, for its end to answer them.
        self.ring.has_work() || (self.draining.is_none() && self.events.posted())
    }

    fn turn(&mut self) -> bool {
        self.host.get_or_init(|| std::thread::current().id());
        self.step(false)
    }
}

/// A host command or copy in flight, with its data.
struct OpData {
    reply: Option<VolumeReply>,
    payload: Option<Payload>,
    /// A host read's data, once its local read is done.
    read: Option<Vec<u8>>,
    /// The local part failed (the host gets this error).
    error: Option<IoError>,
}

impl OpData {
    /// A host's I/O, answered through `reply`.
    fn host(reply: VolumeReply, payload: Option<Payload>) -> OpData {
        OpData {
            reply: Some(reply),
            payload,
            read: None,
            error: None,
        }
    }

    /// A copy's.
    fn internal() -> OpData {
        OpData {
            reply: None,
            payload: None,
            read: None,
            error: None,
        }
    }
}

struct Replicator {
    volume: String,
    /// The core, and the rules of its driving (`weft_replication::driver`).
    driver: Driver,
    replication: ReplicationRecord,
    revision: u64,
    block_size: u64,
    local: LocalPool,
    /// Its mapped local writes, and where it waits.
    ring: WriteRing,
    intent: Arc<IntentFile>,
    /// This node's replica subsystem's fence, held for its local writes.
    own_fence: LocalFence,
    targets: BTreeMap<NodeId, LinkTarget>,
    links: Links,
    /// Replies the links brought at the last wait (kept: no allocation per wake-up).
    replies: Vec<Event>,
    ops: BTreeMap<OpId, OpData>,
    next_op: u64,
    events: Events,
    path: Arc<Replicated>,
    /// The data plane: its clock is the one the reactors check reads against.
    plane: Arc<DataPlane>,
    desired: DesiredState,
    lease: Arc<LeaseClock>,
    manager: Arc<dyn NodeServices>,
    serving: Serving,
    stop_poller: Arc<AtomicBool>,
    published: Arc<crate::status::Published>,
    /// Rebuilds in progress, by replica.
    trackers: BTreeMap<NodeId, Tracker>,
    /// The rebuilds' progress as last published.
    shown: Vec<RebuildStatus>,
    limiter: CopyLimiter,
    /// Copies' local reads held back by the rebuild bandwidth limit.
    deferred: std::collections::VecDeque<(OpId, Extent)>,
    /// This node's name and the volume's pool here.
    me: String,
    pool: String,
    /// A barrier under way, and the host writes held back meanwhile.
    barrier: Option<Barrier>,
    /// Barriers begun (each one's number).
    barriers: u64,
    /// The snapshot being taken, as the manager may ask.
    taking: Arc<Mutex<Option<String>>>,
    /// The chunk map of this node's copy when this primary began: retired
    /// once the copy changes under it (grown), and then this primary ends
    /// (its local I/O fails with ANA Transition, the host retries on the next).
    map: Arc<weft_volume::ChunkMap>,
    /// An encrypted volume's cipher: its local writes are encrypted (a
    /// copy: the links send the host's data, each replica encrypting with
    /// its own key), its local reads decrypted.
    cipher: Option<Arc<weft_volume::crypt::VolumeCipher>>,
    held: std::collections::VecDeque<ReplicatedIo>,
    /// Changes its files (write intent, run file) off its turn.
    files: Durable,
    inbox: Receiver<Event>,
    /// What its last wait brought (kept: no allocation per wake-up).
    woken: Woken,
    /// It stopped serving and drains its local I/O until then.
    draining: Option<Instant>,
    /// Set once it has finished.
    finished: Arc<AtomicBool>,
    /// The thread of the reactor whose guest it is, once it is one.
    host: Arc<OnceLock<ThreadId>>,
    /// A growth's size being recorded in the store (the next primary
    /// begins after it).
    recording: Option<std::thread::JoinHandle<()>>,
    /// Its drain passed its deadline (logged once).
    overdue: bool,
}

/// What a replicator shares with its handle and its sink.
struct Shared {
    path: Arc<Replicated>,
    /// The snapshot being taken now, if any.
    taking: Arc<Mutex<Option<String>>>,
    /// Set once it has finished.
    finished: Arc<AtomicBool>,
    /// The thread of the reactor whose guest it is, once it is one.
    host: Arc<OnceLock<ThreadId>>,
}

impl Replicator {
    /// An eventfd its ring signals whenever completions arrive, to be a
    /// reactor's guest.
    fn doorbell(&mut self) -> std::io::Result<std::fs::File> {
        let doorbell = weft_uring::eventfd()?;
        self.ring.signal(doorbell.as_raw_fd())?;
        Ok(doorbell)
    }

    /// One turn: what the primary has to do now, then what its ring and
    /// its inbox brought; sleeps on the ring first if `sleep` and nothing
    /// waits (a thread of its own; never as a reactor's guest). False once
    /// it has finished: it stopped serving and its local I/O drained.
    fn step(&mut self, sleep: bool) -> bool {
        if self.draining.is_none() && !self.serve(sleep) {
            self.finish();
        }
        let draining = self.draining;
        match draining {
            Some(deadline) if self.drain(sleep, deadline) => {
                self.ended();
                false
            }
            _ => true,
        }
    }

    /// A turn while it serves; false when it stops serving.
    fn serve(&mut self, sleep: bool) -> bool {
        let now = self.lease.now();
        self.driver.tick(self.lease.until(), now);
        self.release_copies();
        self.drive();
        // Not once it ended (a change to its files failed): it stops, and fails the barrier.
        if self.driver.ended().is_none() {
            self.advance_barrier();
        }
        self.publish(now);
        self.track_rebuilds();
        let growing = matches!(&self.barrier, Some(b) if matches!(b.op, BarrierOp::Grow(_)));
        if self.map.is_retired() && self.driver.ended().is_none() && !growing {
            log::info!(
                "volume {}: its copy here changed (grown); serves again with it",
                self.volume
            );
            self.driver.end(End::Reshaped);
        }
        if let Some(why) = self.driver.ended() {
            log::info!("volume {}: no longer primary ({why:?})", self.volume);
            return false;
        }
        // A bounded batch of the inbox's events first: what they start
        // goes out with this turn's submission.
        let mut handled = 0;
        self.events.reading();
        while handled < EVENTS_PER_WAIT {
            match self.inbox.try_recv() {
                Ok(Event::Stop) | Err(TryRecvError::Disconnected) => {
                    self.driver.end(End::Stopped);
                    return false;
                }
                Ok(event) => self.handle(event),
                Err(TryRecvError::Empty) => break,
            }
            handled += 1;
        }
        // Sleeps (until an event, a local write, a socket or the tick)
        // only if nothing came; submits the local writes and the links'
        // commands either way.
        let mut replies = std::mem::take(&mut self.replies);
        self.links.start_io(&mut self.ring, &mut replies);
        let sleep = sleep && handled == 0 && replies.is_empty();
        let mut woken = std::mem::take(&mut self.woken);
        let tick = self.tick(now);
        let waited = self.ring.wait(sleep, tick, &mut woken);
        if handled == EVENTS_PER_WAIT {
            // The rest at the next turn, which the inbox's ring brings at
            // once. After the wait: the wait hears the wake-up that brought
            // these events, and a wake-up before it would be taken for
            // that one and lost (a reactor's guest then waited for its tick).
            self.events.wake();
        }
        for completion in woken.sockets.drain(..) {
            self.links
                .completed(completion, &mut self.ring, &mut replies);
        }
        for (op, result) in woken.written.drain(..) {
            self.local_finished(op, result);
        }
        self.woken = woken;
        // What those let the core do goes out now too: a guest of a reactor
        // is given no turn for work that is only queued.
        loop {
            for reply in replies.drain(..) {
                self.handle(reply);
            }
            self.drive();
            self.links.start_io(&mut self.ring, &mut replies);
            if replies.is_empty() {
                break;
            }
        }
        self.replies = replies;
        if let Err(error) = waited.and_then(|()| self.ring.submit(tick)) {
            log::error!("volume {}: its I/O ring failed: {error}", self.volume);
            return false;
        }
        true
    }

    /// How long until it looks at the time again: [`TICK`] unless the
    /// primary is quiet; then up to [`QUIET_TICK`], but a tick before its
    /// lease ends (a renewal seen before it, a lapse seen within a tick),
    /// and once a read grant is due for renewal.
    fn tick(&self, now: Duration) -> Duration {
        let primary = self.driver.primary();
        if !primary.quiet() {
            return TICK;
        }
        let lease_left = self.lease.until().saturating_sub(now).saturating_sub(TICK);
        let renewal_left = primary.grants_due().saturating_sub(now);
        lease_left.min(renewal_left).clamp(TICK, QUIET_TICK)
    }

    /// A turn while it drains its local I/O: a deposed primary's writes
    /// must be on its copy, or never, before it serves as a replica again
    /// (and its files and a growth's record written before the next primary
    /// begins). Whether it is done; it waits as long as that takes, past
    /// `deadline` with an error logged once.
    fn drain(&mut self, sleep: bool, deadline: Instant) -> bool {
        // What finishes here is on the copy, or a closed link's; nobody
        // waits for its answer.
        let busy = self.ring.writes_in_flight() > 0 || !self.links.is_idle();
        let mut woken = std::mem::take(&mut self.woken);
        let mut replies = Vec::new();
        let waited = self.ring.wait(sleep && busy, TICK, &mut woken);
        for completion in woken.sockets.drain(..) {
            self.links
                .completed(completion, &mut self.ring, &mut replies);
        }
        woken.written.clear();
        self.woken = woken;
        if let Err(error) = waited.and_then(|()| self.ring.submit(TICK)) {
            // Nothing wakes it through the ring any more, and the next
            // primary here must not begin while its writes may still land:
            // it waits for them now, blocking (the disk ends them), then for
            // its workers, its files and a growth's record, up to `deadline`.
            log::error!(
                "volume {}: its I/O ring failed: {error}; it waits here for its local I/O",
                self.volume
            );
            self.ring.reap();
            while !self.local.is_idle()
                || !self.files.is_idle()
                || self.recording.as_ref().is_some_and(|r| !r.is_finished())
            {
                if Instant::now() >= deadline {
                    log::error!(
                        "volume {}: its ring failed and its local I/O is still under way 10 s after it stopped serving; it ends anyway",
                        self.volume
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            return true;
        }
        let recorded = self.recording.as_ref().is_none_or(|r| r.is_finished());
        let ring_idle = self.ring.writes_in_flight() == 0 && self.links.is_idle();
        if ring_idle && self.local.is_idle() && self.files.is_idle() && recorded {
            return true;
        }
        if Instant::now() >= deadline && !self.overdue {
            self.overdue = true;
            log::error!(
                "volume {}: local I/O or a record still under way 10 s after this node stopped being primary; it waits for them",
                self.volume
            );
        }
        if sleep && ring_idle {
            // Only the workers are left: they ring the inbox, which this does not read.
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Stops serving: answers what it holds (ANA Inaccessible), ends its
    /// links, and drains its local I/O from the next turn on.
    fn finish(&mut self) {
        self.stop_poller.store(true, Ordering::Release);
        if self.barrier.is_some() {
            let error = format!(
                "volume {}: its primary stopped serving here (it fails over, or its replicas changed); try again",
                self.volume
            );
            self.fail_barrier(AdminError::Unavailable(error));
        }
        for io in std::mem::take(&mut self.held) {
            io.reply
                .send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
        }
        self.published.rebuilds.set(&self.volume, Vec::new());
        self.path.set_serving(Serving::Inaccessible);
        for (_, op) in std::mem::take(&mut self.ops) {
            if let Some(reply) = op.reply {
                reply.send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
            }
        }
        self.links.close_all();
        self.draining = Some(Instant::now() + Duration::from_secs(10));
    }

    /// It has finished: answers what reached it meanwhile and tells the manager.
    fn ended(&mut self) {
        wind_up(
            &self.volume,
            &self.path,
            &self.inbox,
            &self.manager,
            &self.finished,
        );
    }

    /// Tells the data plane (and the manager, for ANA) whether it serves,
    /// and until when reactors may read this copy themselves.
    fn publish(&mut self, now: Duration) {
        // The data plane's clock first: a pause between the two readings
        // only shortens the time given.
        let plane_now = self.plane.now().0;
        let left = self
            .driver
            .primary()
            .reads_until()
            .saturating_sub(self.lease.now());
        self.path.reads_until((plane_now + left).as_nanos() as u64);
        let serving = match self.driver.serving(now) {
            weft_replication::Serving::Yes => Serving::Yes,
            weft_replication::Serving::Resyncing => Serving::Resyncing,
            weft_replication::Serving::Transition => Serving::Transition,
            weft_replication::Serving::Inaccessible => Serving::Inaccessible,
        };
        if serving != self.serving {
            let optimized = |s| matches!(s, Serving::Yes | Serving::Resyncing);
            let same_ana = optimized(serving) && optimized(self.serving);
            self.serving = serving;
            self.path.set_serving(serving);
            if same_ana && !self.resyncing() {
                // A read grant ran out, or was renewed: ANA is the same.
                return;
            }
            let what = match serving {
                Serving::Yes => "its primary here serves hosts (ANA optimized)",
                Serving::Resyncing => {
                    "its primary here serves hosts while it resyncs the replicas (ANA optimized; reads of regions not yet copied wait for them)"
                }
                Serving::Transition => {
                    "its primary here is being set up or handed over (ANA change: hosts retry)"
                }
                Serving::Inaccessible => {
                    "no longer served here (ANA inaccessible: hosts use another path)"
                }
            };
            log::info!("volume {}: {what}", self.volume);
            self.manager.reconcile();
        }
    }

    fn handle(&mut self, event: Event) {
        let now = self.lease.now();
        match event {
            Event::Host(io) => self.host(io, now),
            Event::Replica { node, reply } => {
                if let (Some(barrier), FromReplica::Refused { .. }) = (&mut self.barrier, &reply) {
                    barrier.session_ended(node);
                }
                self.driver.replica_reply(node, reply, now)
            }
            Event::Attached {
                node,
                token,
                attachment,
            } => {
                if let Some(reply) = self.links.attached(node, token, attachment) {
                    self.driver.replica_reply(node, reply, now)
                }
            }
            Event::Barrier { op, reply } => self.begin_barrier(op, reply),
            Event::BarrierAnnounced { seq, result } => {
                let failed = self.barrier.as_mut().and_then(|b| b.announced(seq, result));
                if let Some(error) = failed {
                    self.fail_barrier(error);
                }
            }
            Event::BarrierDone { node, seq, done } => {
                if let Some(barrier) = &mut self.barrier {
                    barrier.answer(node, seq, done);
                }
            }
            Event::BarrierLocal { seq, result } => {
                if let Some(barrier) = &mut self.barrier {
                    barrier.local_answer(seq, result);
                }
            }
            Event::LocalDone { op, result } => self.local_finished(op, result),
            Event::Durable(result) => self.files_changed(result),
            Event::Committed { revision, record } => {
                self.driver.committed(revision, replica_set(&record), now);
                self.adopt(revision, record);
            }
            // Its members changed (the core numbers them by their place):
            // another replicator's job, as for a record seen changed.
            Event::CommitFailed(Some((_, record))) if !same_shape(&record, &self.replication) => {
                self.driver.end(End::Reshaped)
            }
            Event::CommitFailed(current) => {
                let current = current.map(|(revision, record)| {
                    let set = replica_set(&record);
                    self.adopt(revision, record);
                    (revision, set)
                });
                self.driver.commit_failed(current, now);
            }
            Event::Record { revision, record } => match record {
                Some(record) if same_shape(&record, &self.replication) => {
                    self.driver
                        .record_changed(revision, replica_set(&record), now);
                    self.adopt(revision, record);
                }
                // Deleted, or its replicas changed: another replicator's job.
                _ => self.driver.end(End::Reshaped),
            },
            Event::Stop => {}
        }
        self.drive();
    }

    fn adopt(&mut self, revision: u64, record: ReplicationRecord) {
        if revision >= self.revision {
            self.revision = revision;
            self.replication = record;
        }
    }

    fn host(&mut self, io: ReplicatedIo, now: Duration) {
        if self.barrier.as_ref().is_some_and(Barrier::holds_writes) {
            // After the barrier, in the order they came.
            return self.held.push_back(io);
        }
        self.next_op += 1;
        let op = OpId(self.next_op);
        let ReplicatedIo { work, reply } = io;
        let (extent, fua, payload) = match work {
            ReplicatedWork::Write { offset, data, fua } => {
                let extent = self.extent(offset, data.len() as u64);
                (Some(extent), fua, Some(Payload::Data(data)))
            }
            ReplicatedWork::Zeroes {
                offset,
                len,
                deallocate,
                fua,
            } => {
                let extent = self.extent(offset, len);
                let blocks = extent.blocks;
                let payload = Payload::Zeroes {
                    deallocate,
                    blocks: u64::from(blocks),
                };
                (Some(extent), fua, Some(payload))
            }
            ReplicatedWork::Flush => (None, false, None),
            ReplicatedWork::Read { offset, len } => {
                // While resyncing (the reactors serve reads from the local
                // copy otherwise): held by the core until its regions are copied.
                let extent = self.extent(offset, u64::from(len));
                self.ops.insert(op, OpData::host(reply, None));
                return self.driver.host_read(op, extent, now);
            }
        };
        // (Past the end this primary began with, it completes with ANA
        // Transition: the volume grew, and the primary of the new size
        // takes it in a moment.)
        self.ops.insert(op, OpData::host(reply, payload));
        match extent {
            Some(extent) => self.driver.host_write(op, extent, fua, now),
            None => self.driver.host_flush(op, now),
        }
    }

    fn extent(&self, offset: u64, len: u64) -> Extent {
        Extent {
            block: offset / self.block_size,
            blocks: (len / self.block_size) as u32,
        }
    }

    /// Carries out the core's actions in the order the driver gives them
    /// (its rules: a change to the files durable before what follows it,
    /// local I/O after the messages queued with it, nothing once it ended).
    fn drive(&mut self) {
        while let Some(action) = self.driver.next_action() {
            self.act(action);
        }
    }

    /// Carries out `action` (a change to its files: queued; the driver
    /// gives nothing more until `Event::Durable` says it was made).
    fn act(&mut self, action: Action) {
        let now = self.lease.now();
        match action {
            Action::IntentSet(region) => self.change_files(FileChange::Mark(region)),
            Action::IntentClear(region) => self.intent.intent().clean([region]),
            Action::Keep(region) => self.change_files(FileChange::Keep(region)),
            Action::AllInSync => self.change_files(FileChange::AllInSync),
            Action::Full(node) => {
                let name = weft_cluster::replicas::node_name(&self.replication, node).to_string();
                self.change_files(FileChange::Full(name));
            }
            Action::LocalWrite { op, extent, fua } => {
                let Some(fenced) = self.own_fence.enter() else {
                    // A newer primary fenced this node's copy: not written
                    // (the record tells this one it is deposed in a moment).
                    self.local_done(op, Err(IoError::PathInaccessible), now);
                    return;
                };
                let offset = extent.block * self.block_size;
                let work = match self.ops.get(&op).and_then(|o| o.payload.clone()) {
                    Some(Payload::Data(data)) => {
                        let data = super::local::stored_form(self.cipher.as_deref(), offset, data);
                        let write = RingWrite {
                            op,
                            offset,
                            data,
                            fua,
                            fenced,
                        };
                        match self.ring.write(write) {
                            Ok(()) => return,
                            Err(write) => LocalWork::Write {
                                offset,
                                data: write.data,
                                fua,
                                fenced: write.fenced,
                            },
                        }
                    }
                    Some(Payload::Zeroes { .. }) => {
                        let len = u64::from(extent.blocks) * self.block_size;
                        LocalWork::Zeroes {
                            offset,
                            len,
                            fua,
                            fenced,
                        }
                    }
                    None => {
                        self.local_done(op, Err(IoError::Other), now);
                        return;
                    }
                };
                self.local.submit(op, work);
            }
            Action::LocalRead { op, extent } if self.is_host_op(op) => self.read_local(op, extent),
            Action::LocalRead { op, extent } => {
                // A copy's: under the rebuild bandwidth limit, except a
                // promotion's resync, which hosts' reads may wait for.
                let bytes = u64::from(extent.blocks) * self.block_size;
                if !self.resyncing() && (!self.deferred.is_empty() || !self.limiter.take(bytes)) {
                    self.deferred.push_back((op, extent));
                    return;
                }
                self.read_local(op, extent);
            }
            Action::LocalFlush { op } => self.local.submit(op, LocalWork::Flush),
            Action::Send { to, msg } => self.send(to, msg),
            Action::Commit {
                base_revision,
                record,
            } => {
                // A handover's record: the reactors stop reading this copy
                // before the next primary can serve (it does not wait for
                // this one's grants).
                self.publish(self.lease.now());
                self.commit(base_revision, &record)
            }
            Action::Complete { op, result } => self.complete(op, result),
        }
    }

    /// Queues a change to its files; the actions after it wait for it.
    fn change_files(&mut self, change: FileChange) {
        self.files.change(change);
    }

    /// Its files were changed as asked, or could not be (`error`): then
    /// this primary ends (the next one, on this node or another, starts
    /// from what is).
    fn files_changed(&mut self, result: Result<(), String>) {
        if let Err(what) = &result {
            log::error!(
                "volume {}: cannot persist {what}; this node stops serving it as primary",
                self.volume
            );
        }
        self.driver.files_done(result.is_ok());
    }

    /// Whether this primary is copying what may differ among the replicas
    /// it fenced at its promotion: a host's I/O on a region not yet copied
    /// waits for it, so the rebuild bandwidth limit, which is there to
    /// leave the devices and links to hosts' I/O, would only make hosts
    /// wait longer (the whole resync of a 1 GiB volume written at random,
    /// whose every region is in the intents, took 4 s more at 256 MiB/s).
    fn resyncing(&self) -> bool {
        self.driver.primary().phase() == PrimaryPhase::Resyncing
    }

    /// Copies' reads the bandwidth limit lets through now.
    fn release_copies(&mut self) {
        while let Some(&(op, extent)) = self.deferred.front() {
            let bytes = u64::from(extent.blocks) * self.block_size;
            if !self.resyncing() && !self.limiter.take(bytes) {
                return;
            }
            self.deferred.pop_front();
            self.read_local(op, extent);
        }
    }

    /// Publishes the progress of every replica being rebuilt.
    fn track_rebuilds(&mut self) {
        let region_bytes = self.intent.intent().region_bytes();
        let mut shown = Vec::new();
        for (node, state) in self.driver.primary().links() {
            // From its fence on (its whole dirty set is known then), if the
            // record calls it faulted (an in-sync replica is fenced at promotion).
            let faulted = !self.replication.members[usize::from(node.0)]
                .state
                .eq(&weft_control::ReplicaState::InSync);
            let rebuilding = state == "rebuilding" || (state == "fencing" && faulted);
            let left = self.driver.primary().dirty_regions(node);
            let Some(left) = left.filter(|_| rebuilding) else {
                let ended = self.trackers.remove(&node);
                if let Some(tracker) = ended.filter(|_| matches!(state, "joining" | "in-sync")) {
                    let name = weft_cluster::replicas::node_name(&self.replication, node);
                    log::info!(
                        "volume {}: replica on {name} rebuilt: {} MiB copied of {} MiB in {:.1} s",
                        self.volume,
                        (u64::from(tracker.total()) * region_bytes) >> 20,
                        self.replication.size_bytes >> 20,
                        tracker.elapsed().as_secs_f64()
                    );
                }
                continue;
            };
            let tracker = self
                .trackers
                .entry(node)
                .or_insert_with(|| Tracker::new(left));
            let name = weft_cluster::replicas::node_name(&self.replication, node);
            shown.push(tracker.status(name, left, region_bytes));
        }
        if shown != self.shown {
            self.published.rebuilds.set(&self.volume, shown.clone());
            self.shown = shown;
        }
    }

    /// Whether `op` is a host's (not a copy's).
    fn is_host_op(&self, op: OpId) -> bool {
        self.ops.get(&op).is_some_and(|o| o.reply.is_some())
    }

    /// Reads a region to copy, or for a host.
    fn read_local(&mut self, op: OpId, extent: Extent) {
        let offset = extent.block * self.block_size;
        let len = (u64::from(extent.blocks) * self.block_size) as usize;
        self.local.submit(op, LocalWork::Read { offset, len });
    }

    /// A local I/O finished (a copy's read carries its data: a region of
    /// zeroes, unwritten mostly, is deallocated on the replica, not
    /// written, so that a thin replica stays thin).
    fn local_finished(&mut self, op: OpId, result: LocalResult) {
        let now = self.lease.now();
        let result = result.map(|read| {
            let Some(data) = read else {
                return;
            };
            if let Some(host) = self.ops.get_mut(&op).filter(|o| o.reply.is_some()) {
                host.read = Some(data);
                return;
            }
            let blocks = data.len() as u64 / self.block_size;
            let payload = if data.iter().all(|&b| b == 0) {
                Payload::Zeroes {
                    deallocate: true,
                    blocks,
                }
            } else {
                // (Read into a buffer of the worker's; copied once here,
                // and sent from this copy to every replica rebuilt.)
                Payload::Data(weft_uring::SharedBuf::copy_from(&data))
            };
            let entry = self.ops.entry(op).or_insert_with(OpData::internal);
            entry.payload = Some(payload);
        });
        self.local_done(op, result, now);
    }

    fn commit(&mut self, base_revision: u64, record: &weft_replication::ReplicaSet) {
        let next = with_replica_set(&self.replication, record);
        let states: Vec<String> = next
            .members
            .iter()
            .map(|m| format!("{} {:?}", m.node, m.state))
            .collect();
        log::info!(
            "volume {}: record change: epoch {}, primary {}, {}",
            self.volume,
            next.epoch,
            next.primary,
            states.join(", ")
        );
        let (desired, volume) = (self.desired.clone(), self.volume.clone());
        let events = self.events.clone();
        std::thread::spawn(move || {
            let _ = events.send(commit(&desired, &volume, base_revision, next));
        });
    }

    fn complete(&mut self, op: OpId, result: HostResult) {
        let Some(entry) = self.ops.remove(&op) else {
            return;
        };
        if let Some(reply) = entry.reply {
            if let (HostResult::Ok, None, Some(data)) = (result, entry.error, entry.read) {
                return reply.send_read(data);
            }
            let outcome = match (result, entry.error) {
                (HostResult::Ok, None) => Ok(()),
                (HostResult::Ok, Some(error)) => Err(error),
                (HostResult::Transition, _) => Err(IoError::PathTransition),
                (HostResult::Inaccessible, _) => Err(IoError::PathInaccessible),
            };
            reply.send(VolumeOutcome::Done(outcome));
        }
    }

    fn local_done(&mut self, op: OpId, result: Result<(), IoError>, now: Duration) {
        let Err(error) = result else {
            return self.driver.local_done(op, now);
        };
        if let Some(entry) = self.ops.get_mut(&op) {
            // The host's error if the primary cannot hand over.
            entry.error = Some(error);
        }
        if !matches!(error, IoError::Media | IoError::Failed) {
            log::warn!("volume {}: local I/O failed: {error:?}", self.volume);
            return self.driver.local_done(op, now);
        }
        if !self.driver.primary().own_copy_failed() {
            log::error!(
                "volume {}: its copy on this node failed ({error:?}); it hands the volume to an in-sync replica if one is reachable (the failed writes are retried there)",
                self.volume
            );
        }
        self.driver.local_failed(op, now);
    }

    fn send(&mut self, to: NodeId, msg: ToReplica) {
        if let ToReplica::Fence { token } = msg {
            // A new session: a new connection (the old one ends with its link).
            let Some(target) = self.targets.get(&to) else {
                return;
            };
            self.links.start(target, token);
            return;
        }
        let payload = match &msg {
            ToReplica::Write { op, .. } | ToReplica::Copy { op, .. } => {
                self.ops.get(op).and_then(|o| o.payload.clone())
            }
            ToReplica::Flush { .. }
            | ToReplica::Grant { .. }
            | ToReplica::Clean { .. }
            | ToReplica::Fence { .. } => None,
        };
        self.links.send(to, Outgoing::Core { msg, payload });
    }
}
