//! One reactor: a thread with its own io_uring that owns a set of
//! connections. Everything a connection does is an op on that ring: receives
//! into the connection's receive buffer, sends gathered from header bytes and
//! slot buffers (reads go out as one C2HData straight from the buffer the
//! disk read filled), and block I/O on the namespace's device. The thread
//! sleeps in `io_uring_enter` when idle; a 250 ms tick drives keep-alive.
//!
//! The reactor serves one exports snapshot at a time, and its connections
//! serve the same one, so that a connection's subsystem index finds its
//! devices. An update arrives as a message; the reactor swaps the snapshot
//! and hands the new configuration to every connection.
//!
//! Every block I/O passes its namespace's meter (see `meter`): the QoS
//! limits say when it may start — an I/O held back waits in a heap ordered
//! by start time, released by a timer — and the reactor counts it in its
//! own statistics, which it adds to the shared totals every tick; so are the
//! times its commands spend per stage inside the target (see `stages`).
//!
//! Told to (`QueuePlacement::FollowReplicator`), an I/O queue of a
//! replicated volume moves, once, right after its Connect, to the reactor
//! that hosts the volume's replicator (or would: the volume's name picks
//! it, see `DataPlane::host`), so that its writes reach the replicator and
//! their answers come back on one thread, with no wake-up in between. The
//! cost: a replicated volume's queues share one reactor (volumes, not
//! queues, spread over the reactors), so not by default.

use crate::exports::{Backend, Exports, NamespaceDevice};
use crate::guest::Guest;
use crate::health::FailedOperation;
use crate::meter::{IoClass, LocalStats, Meter};
use crate::peers::PeerAdmission;
use crate::replicated::{Replicated, ReplicatedIo, ReplicatedWork};
use crate::spin::{RunDelay, SpinGovernor};
use crate::stages::{LocalStages, LoopCounter, Stage, StageTotals, Waiting};
use crate::tls::{PeerTls, TlsStream};
use crate::volume::{
    Piece, SnapshotName, VolumeBackend, VolumeOutcome, VolumeReply, VolumeRequest, VolumeWork,
};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};
use weft_proto::types::{Nsid, SlotId, Timestamp};
use weft_proto::{
    Connection, IoError, IoKind, IoRequest, RefusedHost, SlotBuffers, Target, Termination,
    TxSegment,
};
use weft_uring::{Completion, IoBuf, Op, Returned, Ring, SendBatch};

/// What other threads tell a reactor.
pub(crate) enum Message {
    /// Serve this accepted connection (its place under the peer limits goes with it).
    Connection(TcpStream, SocketAddr, PeerAdmission),
    /// Serve these exports from now on: update number so-and-so (see
    /// `DataPlane::update_exports`), skipped if this reactor serves a newer one.
    Exports(Arc<Exports>, u64),
    /// The volume manager's answer to a slow-path request.
    VolumeDone {
        /// Connection index.
        connection: usize,
        /// The I/O asked about.
        request: IoRequest,
        /// Retry it, or its result.
        outcome: VolumeOutcome,
    },
    /// A read a path took (an erasure-coded volume's) is done: its bytes.
    VolumeRead {
        /// Connection index.
        connection: usize,
        /// The read.
        request: IoRequest,
        /// What it read.
        data: Vec<u8>,
    },
    /// A block I/O op completed with an injected failure instead of running.
    #[cfg(feature = "fault-injection")]
    Injected(Completion),
    /// Host this guest (see `crate::guest`): its ring signals `doorbell`.
    Guest(Box<dyn Guest>, File),
    /// Serve this connection, an I/O queue just connected on another
    /// reactor (see [`Reactor::send_home`]), which served these exports,
    /// update number so-and-so.
    Adopt(Box<Peer>, Arc<Exports>, u64),
    /// Where I/O queues of replicated volumes are served from now on.
    Placement(QueuePlacement),
}

/// Where a reactor serves an I/O queue of a replicated volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueuePlacement {
    /// On the reactor that hosts the volume's replicator: a write and its
    /// answer stay on one thread (less CPU and latency per small write),
    /// and the volume's queues share that reactor's core.
    FollowReplicator,
    /// Where the listener dealt it (the default): a volume's queues spread
    /// over the reactors (more cores to receive large writes and to serve
    /// reads), and a write crosses to its replicator's reactor and back.
    Spread,
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Message::Connection(_, address, _) => write!(f, "Connection({address})"),
            Message::Exports(_, number) => write!(f, "Exports({number})"),
            Message::VolumeDone { connection, .. } => write!(f, "VolumeDone({connection})"),
            Message::VolumeRead { connection, .. } => write!(f, "VolumeRead({connection})"),
            #[cfg(feature = "fault-injection")]
            Message::Injected(completion) => write!(f, "Injected({completion:?})"),
            Message::Guest(..) => write!(f, "Guest"),
            Message::Adopt(peer, ..) => write!(f, "Adopt({})", peer.address),
            Message::Placement(placement) => write!(f, "Placement({placement:?})"),
        }
    }
}

/// A reactor's inbox: a channel plus an eventfd that wakes the reactor.
/// The eventfd is written only when no wake-up is pending (written, not yet
/// read by the reactor): a burst of messages (a guest's answers to a
/// batch of writes) costs one write(2) and one wake-up, not one each.
#[derive(Debug)]
pub(crate) struct Mailbox {
    sender: Sender<Message>,
    wake: File,
    /// Set by the sender that writes the eventfd; cleared by the reactor
    /// when it reads the eventfd, before it reads the channel.
    wake_pending: AtomicBool,
    /// The reactor's thread, which reads its mailbox after every turn of
    /// its guests (their answers need no wake-up).
    owner: OnceLock<ThreadId>,
}

impl Mailbox {
    /// A mailbox whose messages `receiver` reads, with a wake-up nobody waits for.
    #[cfg(test)]
    pub(crate) fn detached() -> io::Result<(Mailbox, Receiver<Message>)> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let mailbox = Mailbox {
            sender,
            wake: weft_uring::eventfd()?,
            wake_pending: AtomicBool::new(false),
            owner: OnceLock::new(),
        };
        Ok((mailbox, receiver))
    }

    /// Delivers `message` and wakes the reactor (unless it is the sender,
    /// or a wake-up is pending already: the reactor reads the channel after it).
    pub(crate) fn send(&self, message: Message) {
        if self.sender.send(message).is_ok()
            && self.owner.get() != Some(&thread::current().id())
            // After the send: a reactor that cleared the flag before this
            // swap is rung again; one that clears it after reads the message.
            && !self.wake_pending.swap(true, Ordering::AcqRel)
        {
            // The eventfd counter only saturates after 2^64 wakes; a failed write means the reactor is gone.
            let _ = (&self.wake).write_all(&1u64.to_ne_bytes());
        }
    }

    /// The reactor read the eventfd: the next message rings it again.
    /// Called before the channel is read.
    fn heard(&self) {
        self.wake_pending.swap(false, Ordering::AcqRel);
    }
}

/// A running reactor.
#[derive(Debug)]
pub(crate) struct ReactorHandle {
    mailbox: Arc<Mailbox>,
    _thread: JoinHandle<()>,
}

/// Where a reactor sits among its siblings.
pub(crate) struct Seat {
    /// Its place.
    pub index: usize,
    /// The CPU it is pinned to when possible.
    pub cpu: Option<usize>,
    /// Every reactor's mailbox, in order, once all started.
    pub siblings: Arc<OnceLock<Vec<Arc<Mailbox>>>>,
}

impl ReactorHandle {
    /// Starts the reactor at `seat`.
    pub(crate) fn spawn(
        seat: Seat,
        target: Arc<Target>,
        exports: Arc<Exports>,
        epoch: Instant,
        poll_window: Duration,
        stage_totals: Arc<StageTotals>,
    ) -> io::Result<ReactorHandle> {
        let Seat {
            index,
            cpu,
            siblings,
        } = seat;
        let (sender, inbox) = std::sync::mpsc::channel();
        let wake = weft_uring::eventfd()?;
        let reactor_wake = wake.try_clone()?;
        let mailbox = Arc::new(Mailbox {
            sender,
            wake,
            wake_pending: AtomicBool::new(false),
            owner: OnceLock::new(),
        });
        let own_mailbox = Arc::clone(&mailbox);
        let ring = Ring::new(RING_ENTRIES)?;
        let thread = std::thread::Builder::new()
            .name(format!("weft-reactor-{index}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    if let Err(error) = weft_uring::pin_current_thread_to_cpu(cpu) {
                        log::debug!("reactor {index}: not pinned to CPU {cpu}: {error}");
                    }
                }
                Reactor {
                    index,
                    siblings,
                    ring,
                    target,
                    exports,
                    exports_number: 0,
                    placement: QueuePlacement::Spread,
                    retired: Vec::new(),
                    ticks: 0,
                    inbox,
                    mailbox: own_mailbox,
                    wake: reactor_wake,
                    connections: Vec::new(),
                    free: Vec::new(),
                    epoch,
                    poll_window,
                    spin: SpinGovernor::new(),
                    // Read only to govern a spin: no descriptor without one.
                    run_delay: if poll_window.is_zero() {
                        RunDelay::unknown()
                    } else {
                        RunDelay::of_current_thread()
                    },
                    counts: Counts::default(),
                    stage_totals,
                    throttled: BinaryHeap::new(),
                    throttle_sequence: 0,
                    throttle_timer: None,
                    guests: Vec::new(),
                    guests_due: false,
                    guests_to_ask: false,
                }
                .run();
            })?;
        Ok(ReactorHandle {
            mailbox,
            _thread: thread,
        })
    }

    /// Delivers `message` and wakes the reactor.
    pub(crate) fn send(&self, message: Message) {
        self.mailbox.send(message);
    }

    /// Its mailbox, for its siblings.
    pub(crate) fn mailbox(&self) -> Arc<Mailbox> {
        Arc::clone(&self.mailbox)
    }
}

const RING_ENTRIES: u32 = 1024;
const RECEIVE_BUFFER_BYTES: usize = 128 * 1024;
/// Inline bytes of one transmission: at most one R2T or C2HData header plus a
/// CapsuleResp per queue entry (a command counts against the host's entries
/// until its completion is handed out), or an ICResp or a TermReq: under 256
/// bytes per entry, so 64 KiB bounds 256 entries (128 by default).
const STAGING_BYTES: usize = 64 * 1024;
const TICK: Duration = Duration::from_millis(250);
const WAKE_TOKEN: u64 = u64::MAX;
const TICK_TOKEN: u64 = u64::MAX - 1;
const THROTTLE_TOKEN: u64 = u64::MAX - 2;
/// An I/O due to start within this much of now starts now: closer than a
/// timer can wake the reactor anyway.
const THROTTLE_SLACK_NS: u64 = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Receive = 1,
    Send = 2,
    BlockIo = 3,
    /// A guest's doorbell read (the index is the guest's).
    Doorbell = 4,
}

/// user_data of a connection's op: connection index, op kind, slot.
fn token(connection: usize, kind: OpKind, slot: u16) -> u64 {
    ((connection as u64) << 32) | ((kind as u64) << 16) | u64::from(slot)
}

fn untoken(token: u64) -> (usize, Option<OpKind>, SlotId) {
    let kind = match (token >> 16) & 0xFFFF {
        1 => Some(OpKind::Receive),
        2 => Some(OpKind::Send),
        3 => Some(OpKind::BlockIo),
        4 => Some(OpKind::Doorbell),
        _ => None,
    };
    ((token >> 32) as usize, kind, SlotId(token as u16))
}

/// A slot's data buffer: allocated on first use, lent to the ring while an op uses it.
#[derive(Debug)]
enum SlotBuffer {
    Unallocated,
    Here(IoBuf),
    Lent,
}

#[derive(Debug)]
struct SlotTable {
    buffers: Vec<SlotBuffer>,
    buffer_bytes: usize,
}

impl SlotTable {
    /// Slots are added as the queue's commands use them (a connection that
    /// never connects a queue holds one).
    fn new(buffer_bytes: usize) -> SlotTable {
        SlotTable {
            buffers: vec![SlotBuffer::Unallocated],
            buffer_bytes,
        }
    }

    /// The entry of `slot`, added (unallocated) if the queue had not used it yet.
    fn entry(&mut self, slot: SlotId) -> &mut SlotBuffer {
        let index = usize::from(slot.0);
        if index >= self.buffers.len() {
            self.buffers
                .resize_with(index + 1, || SlotBuffer::Unallocated);
        }
        &mut self.buffers[index]
    }

    fn take(&mut self, slot: SlotId) -> IoBuf {
        self.buffer(slot);
        match std::mem::replace(&mut self.buffers[usize::from(slot.0)], SlotBuffer::Lent) {
            SlotBuffer::Here(buffer) => buffer,
            _ => unreachable!("buffer() just made it present"),
        }
    }

    fn put(&mut self, slot: SlotId, buffer: IoBuf) {
        let entry = &mut self.buffers[usize::from(slot.0)];
        assert!(
            matches!(entry, SlotBuffer::Lent),
            "slot {} returned twice",
            slot.0
        );
        *entry = SlotBuffer::Here(buffer);
    }
}

impl SlotBuffers for SlotTable {
    fn buffer(&mut self, slot: SlotId) -> &mut [u8] {
        let buffer_bytes = self.buffer_bytes;
        let entry = self.entry(slot);
        if matches!(entry, SlotBuffer::Unallocated) {
            // mmap-backed: pages cost memory only once touched.
            let buffer = IoBuf::new(buffer_bytes).unwrap_or_else(|error| {
                panic!("cannot map a {buffer_bytes} byte slot buffer: {error}")
            });
            *entry = SlotBuffer::Here(buffer);
        }
        match entry {
            SlotBuffer::Here(buffer) => buffer.as_mut_slice(),
            _ => panic!("slot {} buffer used while the ring owns it", slot.0),
        }
    }

    fn zero(&mut self, slot: SlotId, range: std::ops::Range<usize>) {
        match self.entry(slot) {
            // Mapped when first used: zeroes then.
            SlotBuffer::Unallocated => {}
            SlotBuffer::Here(buffer) => buffer.zero(range),
            SlotBuffer::Lent => panic!("slot {} buffer zeroed while the ring owns it", slot.0),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Peer {
    stream: TcpStream,
    address: SocketAddr,
    protocol: Connection,
    slots: SlotTable,
    receive_buffer: Option<IoBuf>,
    staging: Option<IoBuf>,
    /// Present while no send is in flight.
    batch: Option<SendBatch>,
    lent_slots: Vec<SlotId>,
    /// Expected byte count of each slot's read or write, to catch short transfers.
    io_len: Vec<u32>,
    /// Each slot's volume I/O in progress (issued a chunk-sized piece at a time).
    volume_io: Vec<Option<VolumeIo>>,
    /// Each slot's Write Zeroes or Deallocate on a whole device, in steps.
    zeroing: Vec<Option<Zeroing>>,
    /// Each slot's block I/O, for its meter's statistics.
    marks: Vec<IoMark>,
    subsystem: Option<usize>,
    ops_in_flight: u32,
    closing: bool,
    /// When its last receive with bytes completed (ns since the epoch).
    received_ns: u64,
    /// Commands completed whose responses wait for a send.
    replies: Waiting,
    /// Commands whose responses ride the send in flight.
    sending: Waiting,
    /// Its place under the listener's connection limits, given back on release.
    _admission: PeerAdmission,
    /// Whether it was placed on its reactor for good (see [`Reactor::send_home`]).
    placed: bool,
    /// TLS on it, once its first byte told (see `crate::tls`).
    tls: PeerTls,
    /// What its send in flight carries.
    sent: Sent,
}

/// What a connection's send in flight carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// The protocol's transmit, in the clear.
    Protocol,
    /// A piece of the protocol's transmit sealed into TLS records (the last one or not).
    Sealed { last: bool },
    /// TLS handshake messages.
    Handshake,
}

impl Peer {
    /// Gives each of the queue's command slots its entries (once, when its
    /// Connect set their number: a stranger's unconnected connection holds
    /// none), before any of its I/O is taken.
    fn fit_slots(&mut self) {
        let slots = self.protocol.slot_count();
        if self.io_len.len() >= slots {
            return;
        }
        let unused = IoMark {
            meter: 0,
            class: IoClass::Other,
            bytes: 0,
            started_ns: 0,
            nsid: Nsid(0),
            sticky: None,
        };
        self.lent_slots.reserve(slots);
        self.io_len.resize(slots, 0);
        self.volume_io.resize_with(slots, || None);
        self.zeroing.resize(slots, None);
        self.marks.resize(slots, unused);
    }
}

/// A reactor's statistics of one meter, with the meter to publish them to.
type MeterSlot = Option<Box<(Arc<Meter>, LocalStats)>>;
/// Indexed by meter id.
type MeterTable = Vec<MeterSlot>;

/// What a reactor counts until it publishes at its next tick.
#[derive(Debug, Default)]
struct Counts {
    /// Per meter (indexed by meter id), with the meter to publish to.
    meters: MeterTable,
    stages: LocalStages,
}

/// What the statistics and the failure handling need of a slot's block I/O.
#[derive(Debug, Clone, Copy)]
struct IoMark {
    meter: u32,
    class: IoClass,
    bytes: u32,
    started_ns: u64,
    /// The namespace, to find its health again when the I/O fails.
    nsid: Nsid,
    /// Set when a failure of this op fails the whole store (see `health`).
    sticky: Option<FailedOperation>,
}

/// A Write Zeroes or Deallocate on a whole device, in steps: punch a hole;
/// where the backend refuses (EOPNOTSUPP: a block device without Write
/// Zeroes, a filesystem without hole punching) write zeroes from the slot's
/// buffer piece by piece instead; then, for FUA, fdatasync.
#[derive(Debug, Clone, Copy)]
struct Zeroing {
    fd: RawFd,
    offset: u64,
    len: u64,
    /// Bytes of zeroes written so far (in the `Write` step).
    written: u64,
    fua: bool,
    step: ZeroStep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ZeroStep {
    Punch,
    Write,
    Sync,
}

/// Whether a block I/O still has to pass its namespace's meter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// Just taken from the connection: count it, apply the QoS limits.
    New,
    /// Counted and admitted before (held back, or back from the volume manager).
    Admitted,
}

/// A block I/O a QoS limit holds back until `start_ns`.
#[derive(Debug)]
struct Throttled {
    start_ns: u64,
    /// Arrival order among equal start times.
    sequence: u64,
    connection: usize,
    request: IoRequest,
}

impl PartialEq for Throttled {
    fn eq(&self, other: &Self) -> bool {
        (self.start_ns, self.sequence) == (other.start_ns, other.sequence)
    }
}

impl Eq for Throttled {}

impl PartialOrd for Throttled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Throttled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.start_ns, self.sequence).cmp(&(other.start_ns, other.sequence))
    }
}

/// A volume read or write in progress on a slot, one chunk-sized piece at a time.
#[derive(Debug)]
struct VolumeIo {
    backend: Arc<VolumeBackend>,
    request: IoRequest,
    /// Bytes done so far.
    done: u32,
}

/// A guest the reactor hosts, and its doorbell (read on the ring all along).
struct Hosted {
    /// None once it finished: the slot waits for its doorbell's read.
    guest: Option<Box<dyn Guest>>,
    doorbell: File,
    /// Its doorbell rang (or a spin found its ring busy) since its last turn.
    due: bool,
}

struct Reactor {
    /// Its place among its siblings.
    index: usize,
    /// Every reactor's mailbox, in order (set once all started).
    siblings: Arc<OnceLock<Vec<Arc<Mailbox>>>>,
    ring: Ring,
    target: Arc<Target>,
    exports: Arc<Exports>,
    /// The number of `exports` in the sequence of updates (see
    /// `DataPlane::update_exports`): a connection moved here from a
    /// reactor ahead brings a newer one.
    exports_number: u64,
    /// Where it serves I/O queues of replicated volumes.
    placement: QueuePlacement,
    /// Exports an update replaced, with the tick count at the time. Block I/O
    /// queued on the ring before the update names their devices' file
    /// descriptors, which must stay open until the kernel has taken the op
    /// (and with it the file): the reactor submits many times a tick, so
    /// they are dropped once a whole tick has passed.
    retired: Vec<(u64, Arc<Exports>)>,
    ticks: u64,
    inbox: Receiver<Message>,
    /// This reactor's own inbox, for return addresses.
    mailbox: Arc<Mailbox>,
    wake: File,
    connections: Vec<Option<Peer>>,
    free: Vec<usize>,
    epoch: Instant,
    poll_window: Duration,
    /// Whether the poll window applies now (not while the CPU is contended).
    spin: SpinGovernor,
    /// This reactor thread's run delay, which tells contention.
    run_delay: RunDelay,
    /// This reactor's statistics: per meter and per stage.
    counts: Counts,
    /// Where the stage counts are published.
    stage_totals: Arc<StageTotals>,
    /// I/O held back by QoS limits, earliest start first.
    throttled: BinaryHeap<Reverse<Throttled>>,
    throttle_sequence: u64,
    /// Earliest deadline of a throttle timer on the ring.
    throttle_timer: Option<u64>,
    /// Its guests, by index (see `crate::guest`).
    guests: Vec<Option<Hosted>>,
    /// A guest may have work: give those due a turn.
    guests_due: bool,
    /// Work went to a guest this reactor cannot tell (a replicated
    /// volume's I/O): ask every guest whether it has work.
    guests_to_ask: bool,
}

impl Reactor {
    fn run(mut self) {
        let _ = self.mailbox.owner.set(thread::current().id());
        self.push(
            Op::ReadEventfd {
                fd: self.wake.as_raw_fd(),
            },
            WAKE_TOKEN,
        );
        self.push(Op::Timeout { after: TICK }, TICK_TOKEN);
        let mut last_activity = Instant::now();
        loop {
            // Right after activity, spin a little before sleeping: the next
            // request usually follows at once, and waking a sleeping thread on
            // another CPU costs more than the spin (tens of microseconds in VMs).
            // Not while other threads wait for this CPU (see `spin`).
            let window = if self.spin.may_spin() {
                self.poll_window
            } else {
                Duration::ZERO
            };
            let wait_for = if self.spin_until_work(last_activity, window) {
                0
            } else {
                self.counts.stages.count(LoopCounter::Sleeps);
                1
            };
            self.counts.stages.count(LoopCounter::Wakeups);
            if let Err(error) = self.ring.submit_and_wait(wait_for) {
                log::error!("io_uring_enter failed: {error}");
                std::thread::sleep(Duration::from_millis(10));
            }
            let mut active = false;
            while let Some(completion) = self.ring.pop() {
                active |= !matches!(
                    completion.user_data,
                    WAKE_TOKEN | TICK_TOKEN | THROTTLE_TOKEN
                );
                self.complete(completion);
            }
            if active {
                last_activity = Instant::now();
            }
            self.turn_guests();
            // What this thread sent itself (its guests' answers, injected faults).
            self.accept_messages();
        }
    }

    /// Gives the guests that may have work a turn (only those: each
    /// guest's timer rings its own doorbell, so turning every guest at
    /// any doorbell cost a reactor of G guests G^2 turns per tick, which
    /// starved nodes of a hundred replicated volumes at rest); drops those
    /// that finished.
    fn turn_guests(&mut self) {
        if !std::mem::take(&mut self.guests_due) {
            return;
        }
        let ask = std::mem::take(&mut self.guests_to_ask);
        for hosted in self.guests.iter_mut().flatten() {
            let Some(guest) = hosted.guest.as_mut() else {
                continue;
            };
            // (Asking is cheap, a turn is not: its ring's submission, its
            // inbox, its state machine.)
            let due = std::mem::take(&mut hosted.due) || (ask && guest.has_work());
            if !due {
                continue;
            }
            if !guest.turn() {
                hosted.guest = None;
                // Its doorbell's read completes now: then the slot is free.
                let _ = (&hosted.doorbell).write_all(&1u64.to_ne_bytes());
            }
        }
    }

    /// Hosts `guest`, whose ring signals `doorbell`.
    fn adopt_guest(&mut self, guest: Box<dyn Guest>, doorbell: File) {
        let index = match self.guests.iter().position(Option::is_none) {
            Some(index) => index,
            None => {
                self.guests.push(None);
                self.guests.len() - 1
            }
        };
        let fd = doorbell.as_raw_fd();
        self.push(Op::ReadEventfd { fd }, token(index, OpKind::Doorbell, 0));
        self.guests[index] = Some(Hosted {
            guest: Some(guest),
            doorbell,
            due: true,
        });
        self.guests_due = true;
    }

    /// Guest `index`'s doorbell rang: its turn comes, and the doorbell is
    /// read again (or, once it finished, its slot is free).
    fn on_doorbell(&mut self, index: usize) {
        let hosted = self.guests[index]
            .as_mut()
            .expect("a doorbell has its guest");
        if hosted.guest.is_none() {
            self.guests[index] = None;
            return;
        }
        hosted.due = true;
        let fd = hosted.doorbell.as_raw_fd();
        self.push(Op::ReadEventfd { fd }, token(index, OpKind::Doorbell, 0));
        self.guests_due = true;
    }

    /// Spins until the ring has work or `window` after `last_activity`
    /// closes; true if there is work.
    fn spin_until_work(&mut self, last_activity: Instant, window: Duration) -> bool {
        loop {
            if self.ring.has_work() || self.guests_due {
                return true;
            }
            if self.guests_have_work() {
                // Their turn comes in the loop, which reads what they answer.
                return true;
            }
            if last_activity.elapsed() >= window {
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Marks due the guests whose rings have work; whether any has.
    fn guests_have_work(&mut self) -> bool {
        for hosted in self.guests.iter_mut().flatten() {
            if let Some(guest) = hosted.guest.as_mut() {
                hosted.due |= guest.has_work();
                self.guests_due |= hosted.due;
            }
        }
        self.guests_due
    }

    fn now(&self) -> Timestamp {
        Timestamp(self.epoch.elapsed())
    }

    /// Nanoseconds since the data plane's epoch (the meters' clock, common to all reactors).
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn push(&mut self, op: Op, token: u64) {
        if let Err(error) = self.ring.push(op, token) {
            // Only a full submission queue the kernel refuses to drain gets here.
            panic!("cannot queue an io_uring op: {error}");
        }
    }

    /// Queues a slot's block I/O op (its connection counted it in flight).
    fn push_block_io(&mut self, index: usize, slot: SlotId, op: Op) {
        let token = token(index, OpKind::BlockIo, slot.0);
        #[cfg(feature = "fault-injection")]
        if let Some(error) = self.injected_fault(index, slot, &op) {
            let returned = match op {
                Op::Read { buf, .. } | Op::Write { buf, .. } => Returned::Buf(buf),
                _ => Returned::Nothing,
            };
            self.mailbox.send(Message::Injected(Completion {
                user_data: token,
                result: Err(error),
                returned,
            }));
            return;
        }
        self.push(op, token);
    }

    /// The failure the slot's namespace device injects for `op` (tests only;
    /// volume pieces go to pool members, which inject nothing).
    #[cfg(feature = "fault-injection")]
    fn injected_fault(&self, index: usize, slot: SlotId, op: &Op) -> Option<io::Error> {
        use weft_storage::faults::DeviceOp;
        let peer = self.connections[index].as_ref()?;
        if peer.volume_io[usize::from(slot.0)].is_some() {
            return None;
        }
        let nsid = peer.marks[usize::from(slot.0)].nsid;
        let namespace = self.exports.namespace(peer.subsystem?, nsid)?;
        let Backend::Device(device) = &namespace.backend else {
            return None;
        };
        let op = match op {
            Op::Read { .. } => DeviceOp::Read,
            Op::Write { dsync, .. } => DeviceOp::Write { fua: *dsync },
            Op::Fsync { .. } => DeviceOp::Sync,
            Op::Fallocate { .. } => DeviceOp::PunchHole,
            _ => return None,
        };
        device.injected_fault(op)
    }

    fn complete(&mut self, completion: Completion) {
        match completion.user_data {
            WAKE_TOKEN => {
                self.mailbox.heard();
                self.accept_messages();
                self.push(
                    Op::ReadEventfd {
                        fd: self.wake.as_raw_fd(),
                    },
                    WAKE_TOKEN,
                );
            }
            TICK_TOKEN => {
                self.tick();
                self.push(Op::Timeout { after: TICK }, TICK_TOKEN);
            }
            THROTTLE_TOKEN => self.release_throttled(),
            token if untoken(token).1 == Some(OpKind::Doorbell) => {
                self.on_doorbell(untoken(token).0)
            }
            token => {
                let (index, kind, slot) = untoken(token);
                let peer = self.connections[index]
                    .as_mut()
                    .expect("ops complete before their connection is dropped");
                peer.ops_in_flight -= 1;
                match kind {
                    Some(OpKind::Receive) => self.on_receive(index, completion),
                    Some(OpKind::Send) => self.on_send(index, completion),
                    Some(OpKind::BlockIo) => self.on_block_io(index, slot, completion),
                    Some(OpKind::Doorbell) | None => unreachable!("unknown op token {token:#x}"),
                }
                self.drive(index);
            }
        }
    }

    fn accept_messages(&mut self) {
        while let Ok(message) = self.inbox.try_recv() {
            match message {
                Message::Connection(stream, address, admission) => {
                    self.add_connection(stream, address, admission)
                }
                Message::Exports(exports, number) => self.swap_exports(exports, number),
                Message::VolumeDone {
                    connection,
                    request,
                    outcome,
                } => self.on_volume_done(connection, request, outcome),
                Message::VolumeRead {
                    connection,
                    request,
                    data,
                } => self.on_volume_read(connection, request, &data),
                #[cfg(feature = "fault-injection")]
                Message::Injected(completion) => self.complete(completion),
                Message::Guest(guest, doorbell) => self.adopt_guest(guest, doorbell),
                Message::Adopt(peer, exports, number) => self.adopt(peer, exports, number),
                Message::Placement(placement) => self.placement = placement,
            }
        }
    }

    fn add_connection(&mut self, stream: TcpStream, address: SocketAddr, admission: PeerAdmission) {
        let limits = self.exports.config.limits;
        let buffers = IoBuf::new(RECEIVE_BUFFER_BYTES)
            .and_then(|receive| Ok((receive, IoBuf::new(STAGING_BYTES)?)));
        let (receive_buffer, staging) = match buffers {
            Ok(buffers) => buffers,
            Err(error) => {
                log::error!("{address}: refusing connection: no memory for its buffers: {error}");
                return;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            log::debug!("{address}: TCP_NODELAY: {error}");
        }
        let mut protocol = Connection::new(Arc::clone(&self.target));
        protocol.set_peer(address.ip());
        // Starts the setup deadline (ICReq, then Connect) at accept.
        protocol.handle_timeout(self.now());
        // The target may already hold a newer configuration whose exports are
        // still on their way here: serve this reactor's, like every other
        // connection here, until they arrive.
        protocol.update_config(Arc::clone(&self.exports.config));
        let peer = Peer {
            stream,
            address,
            protocol,
            slots: SlotTable::new(limits.slot_buffer_bytes()),
            receive_buffer: Some(receive_buffer),
            staging: Some(staging),
            batch: Some(SendBatch::new()),
            // Sized for the queue's slots once it is connected (see `fit_slots`).
            lent_slots: Vec::new(),
            io_len: Vec::new(),
            volume_io: Vec::new(),
            zeroing: Vec::new(),
            marks: Vec::new(),
            subsystem: None,
            ops_in_flight: 0,
            closing: false,
            received_ns: 0,
            replies: Waiting::default(),
            sending: Waiting::default(),
            _admission: admission,
            placed: false,
            tls: PeerTls::Undecided,
            sent: Sent::Protocol,
        };
        log::debug!("{address}: connected");
        let index = self.insert(peer);
        self.drive(index);
    }

    /// Serves `peer` from a free index.
    fn insert(&mut self, peer: Peer) -> usize {
        match self.free.pop() {
            Some(index) => {
                self.connections[index] = Some(peer);
                index
            }
            None => {
                self.connections.push(Some(peer));
                self.connections.len() - 1
            }
        }
    }

    /// Takes over an I/O queue another reactor connected (see
    /// [`Reactor::send_home`]) with `exports`, update `number`: a reactor
    /// behind serves them from now on (their update, still on its way
    /// here, is skipped then); one ahead hands its newer ones to the
    /// connection, as it did to every connection here.
    fn adopt(&mut self, mut peer: Box<Peer>, exports: Arc<Exports>, number: u64) {
        if number > self.exports_number {
            self.swap_exports(exports, number);
        } else if number < self.exports_number {
            peer.protocol
                .update_config(Arc::clone(&self.exports.config));
            peer.subsystem = peer.protocol.subsystem_index();
        }
        log::debug!(
            "{}: served by reactor {} from now on",
            peer.address,
            self.index
        );
        let index = self.insert(*peer);
        self.drive(index);
    }

    /// Hands connection `index` to the reactor that hosts (or would host)
    /// its volume's replicator, if it is an I/O queue of a replicated
    /// volume that has just answered its Connect and another reactor is
    /// that home (see `crate::listener::home_reactor`): its writes then
    /// reach the replicator, and their answers come back, within one
    /// thread. Decided once, while nothing of it is on this ring or with
    /// the manager (a host sends nothing on a queue before the Connect's
    /// answer); the answer goes out from its new reactor. True if it went.
    fn send_home(&mut self, index: usize) -> bool {
        let Some(home) = self.home_of(index) else {
            return false;
        };
        let Some(siblings) = self.siblings.get() else {
            return false;
        };
        let peer = self.connections[index].take().expect("live connection");
        self.free.push(index);
        let exports = Arc::clone(&self.exports);
        siblings[home].send(Message::Adopt(Box::new(peer), exports, self.exports_number));
        true
    }

    /// The reactor connection `index` belongs on, if it should move now.
    fn home_of(&mut self, index: usize) -> Option<usize> {
        let peer = self.connections[index].as_mut()?;
        if peer.placed {
            return None;
        }
        // Not an I/O queue yet: decided once its Connect is taken.
        let subsystem = peer.protocol.subsystem_index()?;
        peer.placed = true;
        if self.placement == QueuePlacement::Spread || peer.closing || peer.ops_in_flight > 0 {
            return None;
        }
        let reactors = self.siblings.get()?.len();
        let volume = self
            .exports
            .devices
            .get(subsystem)?
            .iter()
            .find_map(|namespace| match &namespace.backend {
                Backend::Volume(volume) if volume.replicated.is_some() => Some(volume),
                _ => None,
            })?;
        let home = crate::listener::home_reactor(&volume.volume, reactors);
        (home != self.index).then_some(home)
    }

    /// Serves `exports`, update `number`, in place of the current snapshot
    /// unless that is as new: every connection gets the new configuration
    /// (its subsystem may have moved or gone, its host may have an event to
    /// hear) and moves on.
    fn swap_exports(&mut self, exports: Arc<Exports>, number: u64) {
        if number <= self.exports_number {
            return;
        }
        self.exports_number = number;
        let replaced = std::mem::replace(&mut self.exports, exports);
        self.retired.push((self.ticks, replaced));
        for index in 0..self.connections.len() {
            let Some(peer) = self.connections[index].as_mut() else {
                continue;
            };
            peer.protocol
                .update_config(Arc::clone(&self.exports.config));
            peer.subsystem = peer.protocol.subsystem_index();
            self.drive(index);
        }
    }

    fn tick(&mut self) {
        if !self.poll_window.is_zero() {
            self.spin.on_tick(self.now().0, self.run_delay.read());
            if !self.spin.may_spin() {
                self.counts.stages.count(LoopCounter::SpinRests);
            }
        }
        self.publish_stats();
        self.ticks += 1;
        let ticks = self.ticks;
        self.retired
            .retain(|&(retired_at, _)| ticks - retired_at < 2);
        let now = self.now();
        for index in 0..self.connections.len() {
            if let Some(peer) = self.connections[index].as_mut() {
                peer.protocol.handle_timeout(now);
                self.drive(index);
            }
        }
    }

    fn on_receive(&mut self, index: usize, completion: Completion) {
        let now = self.now();
        let peer = self.connections[index].as_mut().expect("live connection");
        let Returned::Buf(mut buffer) = completion.returned else {
            unreachable!("a receive returns its buffer")
        };
        match completion.result {
            Ok(0) => begin_close(peer, "closed by the host"),
            Ok(received) => {
                self.counts.stages.count(LoopCounter::Receives);
                peer.received_ns = now.0.as_nanos() as u64;
                let random = self.target.random.as_ref();
                if let Err((reason, alert)) = take_received(
                    peer,
                    &mut buffer,
                    received,
                    now,
                    &self.exports.config,
                    random,
                ) {
                    send_alert(peer, &alert);
                    begin_close(peer, &reason);
                }
            }
            Err(error) => begin_close(peer, &format!("receive failed: {error}")),
        }
        peer.receive_buffer = Some(buffer);
    }

    fn on_send(&mut self, index: usize, completion: Completion) {
        let fd = {
            let peer = self.connections[index].as_ref().expect("live connection");
            peer.stream.as_raw_fd()
        };
        self.counts.stages.count(LoopCounter::Sends);
        let epoch = self.epoch;
        let peer = self.connections[index].as_mut().expect("live connection");
        let Returned::Batch(mut batch) = completion.returned else {
            unreachable!("a send returns its batch")
        };
        match completion.result {
            Ok(sent) => {
                batch.consume(sent);
                if !batch.is_empty() {
                    peer.ops_in_flight += 1;
                    self.push(Op::Send { fd, batch }, token(index, OpKind::Send, 0));
                    return;
                }
            }
            Err(error) => begin_close(peer, &format!("send failed: {error}")),
        }
        if !peer.sending.is_empty() {
            let now_ns = epoch.elapsed().as_nanos() as u64;
            let (commands, total_ns) = peer.sending.leave(now_ns);
            self.counts.stages.add(Stage::Send, commands, total_ns);
        }
        let mut buffers = batch.take_bufs();
        match peer.sent {
            Sent::Protocol => {
                peer.staging = buffers.next();
                for (slot, buffer) in peer.lent_slots.drain(..).zip(&mut buffers) {
                    peer.slots.put(slot, buffer);
                }
                peer.protocol.on_transmitted();
            }
            Sent::Sealed { last } => {
                if let PeerTls::Stream(stream) = &mut peer.tls {
                    stream.out = buffers.next();
                }
                if last {
                    peer.protocol.on_transmitted();
                }
            }
            Sent::Handshake => peer.staging = buffers.next(),
        }
        drop(buffers);
        peer.batch = Some(batch);
    }

    fn on_block_io(&mut self, index: usize, slot: SlotId, completion: Completion) {
        let now_ns = self.now_ns();
        let peer = self.connections[index].as_mut().expect("live connection");
        let volume_piece = peer.volume_io[usize::from(slot.0)].is_some();
        let expected = peer.io_len[usize::from(slot.0)];
        if let Returned::Buf(buffer) = completion.returned {
            peer.slots.put(slot, buffer);
        }
        if peer.zeroing[usize::from(slot.0)].is_some() {
            return self.continue_zeroing(index, slot, completion.result);
        }
        let result = match completion.result {
            Ok(done) if expected > 0 && done != expected as usize => {
                log::warn!(
                    "{}: short transfer on a namespace: {done} of {expected} bytes",
                    peer.address
                );
                Err(IoError::Other)
            }
            Ok(_) => Ok(()),
            Err(error) => {
                // A failure that fails its store is logged once, as that.
                let failed_store = if volume_piece {
                    note_volume_failure(peer, slot, &error)
                } else {
                    self.note_device_failure(index, slot, &error)
                };
                if !failed_store {
                    let peer = self.connections[index].as_ref().expect("live connection");
                    log::warn!("{}: namespace I/O failed: {error}", peer.address);
                }
                Err(classify(&error))
            }
        };
        if volume_piece {
            return self.continue_volume_io(index, slot, result.map(|()| expected));
        }
        let peer = self.connections[index].as_mut().expect("live connection");
        finish_io(peer, &mut self.counts, now_ns, slot, result);
    }

    /// A device op of `slot` failed: if it was a sync or a FUA write, its
    /// namespace's device is failed from now on. True when this failure
    /// failed the device (and was logged).
    fn note_device_failure(&mut self, index: usize, slot: SlotId, error: &io::Error) -> bool {
        let peer = self.connections[index].as_ref().expect("live connection");
        let mark = peer.marks[usize::from(slot.0)];
        let Some(operation) = mark.sticky else {
            return false;
        };
        // The namespace may have left with an exports update meanwhile.
        let Some(namespace) = peer
            .subsystem
            .and_then(|subsystem| self.exports.namespace(subsystem, mark.nsid))
        else {
            return false;
        };
        let first = namespace.health.fail(operation, error);
        if first {
            let failure = namespace.health.failure().expect("just failed");
            log::error!(
                "namespace {} ({}) failed: {failure}; every I/O on it now fails until an operator checks the device and runs `weft namespace clear-failure`",
                mark.nsid,
                describe_backend(namespace)
            );
        }
        first
    }

    /// Starts a Write Zeroes or Deallocate on a whole device (see [`Zeroing`]).
    fn start_zeroing(&mut self, index: usize, slot: SlotId, zeroing: Zeroing) {
        let peer = self.connections[index].as_mut().expect("live connection");
        peer.zeroing[usize::from(slot.0)] = Some(zeroing);
        self.issue_zeroing_step(index, slot);
    }

    /// Issues the op of the slot's current zeroing step.
    fn issue_zeroing_step(&mut self, index: usize, slot: SlotId) {
        let peer = self.connections[index].as_mut().expect("live connection");
        let zeroing = peer.zeroing[usize::from(slot.0)].expect("zeroing in progress");
        let (op, expected) = match zeroing.step {
            ZeroStep::Punch => (
                Op::Fallocate {
                    fd: zeroing.fd,
                    mode: weft_storage::ZERO_RANGE_MODE,
                    offset: zeroing.offset,
                    len: zeroing.len,
                },
                0,
            ),
            ZeroStep::Write => {
                // The slot's buffer is the source of zeroes: cleared before
                // the first piece, written from unchanged after.
                if zeroing.written == 0 {
                    peer.slots.buffer(slot).fill(0);
                }
                let buf = peer.slots.take(slot);
                let piece =
                    (zeroing.len - zeroing.written).min(buf.as_slice().len() as u64) as usize;
                (
                    Op::Write {
                        fd: zeroing.fd,
                        buf,
                        buf_offset: 0,
                        len: piece,
                        file_offset: zeroing.offset + zeroing.written,
                        dsync: false,
                    },
                    piece as u32,
                )
            }
            ZeroStep::Sync => (
                Op::Fsync {
                    fd: zeroing.fd,
                    datasync: true,
                },
                0,
            ),
        };
        peer.io_len[usize::from(slot.0)] = expected;
        peer.ops_in_flight += 1;
        self.push_block_io(index, slot, op);
    }

    /// Moves the slot's zeroing on after its last op completed with `result`.
    fn continue_zeroing(&mut self, index: usize, slot: SlotId, result: io::Result<usize>) {
        enum Next {
            /// Issue the (new) current step.
            Issue,
            /// The device cannot punch holes: write zeroes instead.
            WriteInstead,
            Done,
            Failed(io::Error),
        }
        let now_ns = self.now_ns();
        let peer = self.connections[index].as_mut().expect("live connection");
        let entry = &mut peer.zeroing[usize::from(slot.0)];
        let zeroing = entry.as_mut().expect("zeroing in progress");
        let next = match (zeroing.step, result) {
            (ZeroStep::Punch, Err(error)) if error.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                zeroing.step = ZeroStep::Write;
                Next::WriteInstead
            }
            (ZeroStep::Write, Ok(0)) => Next::Failed(io::ErrorKind::WriteZero.into()),
            (ZeroStep::Write, Ok(written)) => {
                zeroing.written += written as u64;
                if zeroing.written < zeroing.len {
                    Next::Issue
                } else if zeroing.fua {
                    zeroing.step = ZeroStep::Sync;
                    Next::Issue
                } else {
                    Next::Done
                }
            }
            (ZeroStep::Punch, Ok(_)) if zeroing.fua => {
                zeroing.step = ZeroStep::Sync;
                Next::Issue
            }
            (ZeroStep::Punch | ZeroStep::Sync, Ok(_)) => Next::Done,
            (_, Err(error)) => Next::Failed(error),
        };
        match next {
            Next::Issue => self.issue_zeroing_step(index, slot),
            Next::WriteInstead => {
                self.refuse_punching(index, slot);
                self.issue_zeroing_step(index, slot);
            }
            Next::Done => {
                entry.take();
                finish_io(peer, &mut self.counts, now_ns, slot, Ok(()));
            }
            Next::Failed(error) => {
                let step = entry.take().expect("zeroing in progress").step;
                let sticky = step == ZeroStep::Sync;
                peer.marks[usize::from(slot.0)].sticky = sticky.then_some(FailedOperation::Sync);
                // A failed sync fails the device and is logged as that.
                if !self.note_device_failure(index, slot, &error) {
                    let peer = self.connections[index].as_ref().expect("live connection");
                    log::warn!(
                        "{}: zeroing a namespace range failed: {error}",
                        peer.address
                    );
                }
                let peer = self.connections[index].as_mut().expect("live connection");
                finish_io(peer, &mut self.counts, now_ns, slot, Err(classify(&error)));
            }
        }
    }

    /// The slot's device refused to punch holes: later zeroing there writes
    /// zeroes at once.
    fn refuse_punching(&mut self, index: usize, slot: SlotId) {
        let peer = self.connections[index].as_mut().expect("live connection");
        let nsid = peer.marks[usize::from(slot.0)].nsid;
        let namespace = peer
            .subsystem
            .and_then(|subsystem| self.exports.namespace(subsystem, nsid));
        if let Some(Backend::Device(device)) = namespace.map(|n| &n.backend) {
            if device.can_punch_holes() {
                device.cannot_punch_holes();
                log::info!(
                    "{} cannot punch holes; Write Zeroes and Deallocate write zeroes there",
                    device.describe()
                );
            }
        }
    }

    /// A read or write on a volume: direct when the gate admits it and the
    /// map allows it, else through the manager.
    fn submit_volume_io(&mut self, index: usize, request: IoRequest, volume: Arc<VolumeBackend>) {
        if let Some(replicated) = &volume.replicated {
            let read = match request.kind {
                IoKind::Read { offset, len, .. } => Some((offset, u64::from(len))),
                _ => None,
            };
            match replicated.route(read, self.now_ns()) {
                Err(error) => {
                    let now_ns = self.now_ns();
                    let peer = self.connections[index].as_mut().expect("live connection");
                    return finish_io(peer, &mut self.counts, now_ns, request.slot, Err(error));
                }
                Ok(true) => return self.replicate(index, request, replicated),
                Ok(false) => {}
            }
        }
        if let Some(intent) = &volume.intent {
            if let Some((offset, len)) = request.kind.written_range() {
                if !intent.covers(offset, len) {
                    let allocate = matches!(request.kind, IoKind::Write { .. });
                    let work = VolumeWork::MarkIntent {
                        offset,
                        len,
                        allocate,
                    };
                    return self.ask_manager(index, request, &volume, work);
                }
            }
        }
        let (offset, len, write) = match request.kind {
            IoKind::Read { offset, len, .. } => (offset, len, false),
            IoKind::Write { offset, len, .. } => (offset, len, true),
            IoKind::Flush => return self.ask_manager(index, request, &volume, VolumeWork::Flush),
            IoKind::WriteZeroes {
                offset, len, fua, ..
            } => {
                let work = VolumeWork::Deallocate { offset, len, fua };
                return self.ask_manager(index, request, &volume, work);
            }
            IoKind::Deallocate { offset, len } => {
                let work = VolumeWork::Deallocate {
                    offset,
                    len,
                    fua: false,
                };
                return self.ask_manager(index, request, &volume, work);
            }
            IoKind::Snapshot { .. } | IoKind::Grow { .. } | IoKind::Reserve { .. } => {
                unreachable!("volume control is routed before")
            }
        };
        if !volume.gate.enter() {
            return self.ask_manager(index, request, &volume, VolumeWork::Wait);
        }
        if volume.map.is_retired() || (write && !volume.writable(offset, len)) {
            volume.gate.leave();
            let work = if write {
                VolumeWork::PrepareWrite {
                    offset,
                    len: u64::from(len),
                }
            } else {
                VolumeWork::Wait
            };
            return self.ask_manager(index, request, &volume, work);
        }
        let peer = self.connections[index].as_mut().expect("live connection");
        if let (Some(cipher), IoKind::Write { buffer_offset, .. }) = (&volume.cipher, request.kind)
        {
            // In place, once: the host's data is not needed after this write.
            let at = buffer_offset as usize;
            cipher.encrypt(
                offset,
                &mut peer.slots.buffer(request.slot)[at..at + len as usize],
            );
        }
        peer.volume_io[usize::from(request.slot.0)] = Some(VolumeIo {
            backend: volume,
            request,
            done: 0,
        });
        self.continue_volume_io(index, request.slot, Ok(0));
    }

    /// Accounts `progress` (bytes of the last piece, or its failure) and
    /// issues the next piece of the slot's volume I/O, or completes it.
    fn continue_volume_io(
        &mut self,
        index: usize,
        slot: SlotId,
        mut progress: Result<u32, IoError>,
    ) {
        let now_ns = self.now_ns();
        let peer = self.connections[index].as_mut().expect("live connection");
        let entry = &mut peer.volume_io[usize::from(slot.0)];
        let io = entry.as_mut().expect("a volume I/O in progress");
        let (offset, len, buffer_offset, write) = match io.request.kind {
            IoKind::Read {
                offset,
                len,
                buffer_offset,
            } => (offset, len, buffer_offset, None),
            IoKind::Write {
                offset,
                len,
                buffer_offset,
                fua,
            } => (offset, len, buffer_offset, Some(fua)),
            _ => unreachable!("only reads and writes go piece by piece"),
        };
        let (fd, file_offset, at, piece_len) = loop {
            let finished = match progress {
                Ok(bytes) => {
                    io.done += bytes;
                    (io.done >= len).then_some(Ok(()))
                }
                Err(error) => Some(Err(error)),
            };
            if let Some(result) = finished {
                let io = entry.take().expect("checked");
                io.backend.gate.leave();
                if let (Some(cipher), None, Ok(())) = (&io.backend.cipher, write, &result) {
                    // Unwritten pieces were filled with zeroes, which stay.
                    let at = buffer_offset as usize;
                    cipher.decrypt(offset, &mut peer.slots.buffer(slot)[at..at + len as usize]);
                }
                finish_io(peer, &mut self.counts, now_ns, slot, result);
                return;
            }
            let at = buffer_offset + io.done;
            let (piece, piece_len) = io.backend.piece(offset + u64::from(io.done), len - io.done);
            match piece {
                Piece::Device { fd, offset } => break (fd, offset, at, piece_len),
                Piece::Zeroes => {
                    debug_assert!(write.is_none(), "writes are checked writable first");
                    peer.slots.buffer(slot)[at as usize..(at + piece_len) as usize].fill(0);
                    progress = Ok(piece_len);
                }
            }
        };
        let buf = peer.slots.take(slot);
        let op = match write {
            None => Op::Read {
                fd,
                buf,
                buf_offset: at as usize,
                len: piece_len as usize,
                file_offset,
            },
            Some(fua) => Op::Write {
                fd,
                buf,
                buf_offset: at as usize,
                len: piece_len as usize,
                file_offset,
                dsync: fua,
            },
        };
        peer.io_len[usize::from(slot.0)] = piece_len;
        peer.ops_in_flight += 1;
        self.push_block_io(index, slot, op);
    }

    /// Hands a replicated volume's write or flush to its replicator (the
    /// data copied once, see `crate::replicated`); the connection stays
    /// alive until it answers.
    fn replicate(&mut self, index: usize, request: IoRequest, replicated: &Replicated) {
        let peer = self.connections[index].as_mut().expect("live connection");
        let work = match request.kind {
            IoKind::Write {
                offset,
                len,
                buffer_offset,
                fua,
            } => {
                let at = buffer_offset as usize;
                let data = &peer.slots.buffer(request.slot)[at..at + len as usize];
                let data = weft_uring::SharedBuf::copy_from(data);
                ReplicatedWork::Write { offset, data, fua }
            }
            IoKind::WriteZeroes {
                offset,
                len,
                deallocate,
                fua,
            } => ReplicatedWork::Zeroes {
                offset,
                len,
                deallocate,
                fua,
            },
            IoKind::Deallocate { offset, len } => ReplicatedWork::Zeroes {
                offset,
                len,
                deallocate: true,
                fua: false,
            },
            IoKind::Flush => ReplicatedWork::Flush,
            IoKind::Read { offset, len, .. } => ReplicatedWork::Read { offset, len },
            IoKind::Snapshot { .. } | IoKind::Grow { .. } | IoKind::Reserve { .. } => {
                unreachable!("volume control is routed before")
            }
        };
        peer.ops_in_flight += 1;
        // Its replicator may be this reactor's guest (which one is not
        // known here).
        self.guests_due |= !self.guests.is_empty();
        self.guests_to_ask |= !self.guests.is_empty();
        replicated.submit(ReplicatedIo {
            work,
            reply: VolumeReply::reactor(Arc::clone(&self.mailbox), index, request),
        });
    }

    /// A replica's Snapshot or Grow command, or a reservation change: the
    /// manager carries it out (a device namespace has no snapshots, does
    /// not grow and has no reservations: refused).
    fn volume_control(
        &mut self,
        index: usize,
        request: IoRequest,
        volume: Option<Arc<VolumeBackend>>,
    ) {
        let peer = self.connections[index].as_mut().expect("live connection");
        let work = match request.kind {
            IoKind::Snapshot { name_len } => {
                SnapshotName::new(&peer.slots.buffer(request.slot)[..name_len as usize])
                    .map(VolumeWork::Snapshot)
            }
            IoKind::Grow { size_bytes } => Some(VolumeWork::Grow { size_bytes }),
            IoKind::Reserve { host, command } => Some(VolumeWork::Reserve { host, command }),
            _ => None,
        };
        match (volume, work) {
            (Some(volume), Some(work)) => self.ask_manager(index, request, &volume, work),
            _ => {
                let now_ns = self.now_ns();
                let peer = self.connections[index].as_mut().expect("live connection");
                finish_io(
                    peer,
                    &mut self.counts,
                    now_ns,
                    request.slot,
                    Err(IoError::Other),
                );
            }
        }
    }

    /// Hands an I/O to the volume manager; the connection stays alive until it answers.
    fn ask_manager(
        &mut self,
        index: usize,
        request: IoRequest,
        volume: &VolumeBackend,
        work: VolumeWork,
    ) {
        let peer = self.connections[index].as_mut().expect("live connection");
        peer.ops_in_flight += 1;
        volume.manager.submit(VolumeRequest {
            pool: volume.pool.clone(),
            volume: volume.volume.clone(),
            work,
            reply: VolumeReply::reactor(Arc::clone(&self.mailbox), index, request),
        });
    }

    fn on_volume_done(&mut self, index: usize, request: IoRequest, outcome: VolumeOutcome) {
        let now_ns = self.now_ns();
        let peer = self.connections[index]
            .as_mut()
            .expect("a connection waiting for the manager is kept");
        peer.ops_in_flight -= 1;
        match outcome {
            // Already through QoS: straight to the device.
            VolumeOutcome::Retry if !peer.closing => {
                self.start_block_io(index, request, Admission::Admitted)
            }
            VolumeOutcome::Retry => finish_io(
                peer,
                &mut self.counts,
                now_ns,
                request.slot,
                Err(IoError::Other),
            ),
            VolumeOutcome::Done(result) => {
                finish_io(peer, &mut self.counts, now_ns, request.slot, result)
            }
        }
        self.drive(index);
    }

    /// A read a path took is done: its bytes go to the command's buffer.
    fn on_volume_read(&mut self, index: usize, request: IoRequest, data: &[u8]) {
        let now_ns = self.now_ns();
        let peer = self.connections[index]
            .as_mut()
            .expect("a connection waiting for a path is kept");
        peer.ops_in_flight -= 1;
        let result = match request.kind {
            IoKind::Read {
                len, buffer_offset, ..
            } if data.len() == len as usize => {
                let at = buffer_offset as usize;
                peer.slots.buffer(request.slot)[at..at + data.len()].copy_from_slice(data);
                Ok(())
            }
            _ => Err(IoError::Other),
        };
        finish_io(peer, &mut self.counts, now_ns, request.slot, result);
        self.drive(index);
    }

    /// Holds `request` back until `start_ns`; the connection stays alive meanwhile.
    fn throttle(&mut self, start_ns: u64, index: usize, request: IoRequest) {
        let peer = self.connections[index].as_mut().expect("live connection");
        peer.ops_in_flight += 1;
        self.throttle_sequence += 1;
        self.throttled.push(Reverse(Throttled {
            start_ns,
            sequence: self.throttle_sequence,
            connection: index,
            request,
        }));
        self.arm_throttle_timer();
    }

    /// Puts a timer on the ring for the earliest held-back I/O, unless one
    /// that fires no later is there already.
    fn arm_throttle_timer(&mut self) {
        let Some(Reverse(first)) = self.throttled.peek() else {
            return;
        };
        let deadline = first.start_ns;
        if self.throttle_timer.is_some_and(|armed| armed <= deadline) {
            return;
        }
        let after = Duration::from_nanos(deadline.saturating_sub(self.now_ns()));
        self.push(Op::Timeout { after }, THROTTLE_TOKEN);
        self.throttle_timer = Some(deadline);
    }

    /// A throttle timer fired: starts every held-back I/O that is due.
    fn release_throttled(&mut self) {
        let now_ns = self.now_ns();
        if self
            .throttle_timer
            .is_some_and(|armed| armed <= now_ns + THROTTLE_SLACK_NS)
        {
            self.throttle_timer = None;
        }
        while let Some(Reverse(first)) = self.throttled.peek() {
            if first.start_ns > now_ns + THROTTLE_SLACK_NS {
                break;
            }
            let Reverse(due) = self.throttled.pop().expect("peeked");
            let index = due.connection;
            let peer = self.connections[index]
                .as_mut()
                .expect("a connection with held-back I/O is kept");
            peer.ops_in_flight -= 1;
            if peer.closing {
                finish_io(
                    peer,
                    &mut self.counts,
                    now_ns,
                    due.request.slot,
                    Err(IoError::Other),
                );
            } else {
                self.start_block_io(index, due.request, Admission::Admitted);
            }
            self.drive(index);
        }
        self.arm_throttle_timer();
    }

    /// Adds this reactor's statistics to the shared totals; forgets meters
    /// no namespace uses any more.
    fn publish_stats(&mut self) {
        self.counts.stages.publish(&self.stage_totals);
        for entry in &mut self.counts.meters {
            if let Some(counted) = entry {
                let (meter, local) = &mut **counted;
                local.publish(meter);
                if Arc::strong_count(meter) == 1 {
                    *entry = None;
                }
            }
        }
    }

    /// Moves a connection forward after anything happened to it.
    fn drive(&mut self, index: usize) {
        if let Some(peer) = self.connections[index].as_mut() {
            peer.fit_slots();
        }
        while let Some(request) = self.connections[index]
            .as_mut()
            .and_then(|peer| peer.protocol.poll_io())
        {
            self.submit_block_io(index, request);
        }
        if self.send_home(index) {
            return;
        }
        self.submit_send(index);
        let peer = self.connections[index].as_mut().expect("live connection");
        if let Some(refused) = peer.protocol.take_refused_host() {
            log_refused_host(peer.address, &refused, &self.exports);
        }
        if peer.protocol.is_closed() && !peer.closing {
            begin_close(peer, "");
        }
        if !peer.closing {
            if let Some(buffer) = peer.receive_buffer.take() {
                // After the front's incomplete TLS record, if any.
                let offset = match &peer.tls {
                    PeerTls::Stream(stream) => stream.partial,
                    _ => 0,
                };
                let op = Op::Recv {
                    fd: peer.stream.as_raw_fd(),
                    buf: buffer,
                    offset,
                    len: RECEIVE_BUFFER_BYTES - offset,
                };
                peer.ops_in_flight += 1;
                self.push(op, token(index, OpKind::Receive, 0));
            }
        } else if peer.ops_in_flight == 0 {
            log::debug!("{}: connection released", peer.address);
            self.connections[index] = None;
            self.free.push(index);
        }
    }

    fn submit_send(&mut self, index: usize) {
        let epoch = self.epoch;
        let peer = self.connections[index].as_mut().expect("live connection");
        if peer.batch.is_none() || peer.closing {
            return;
        }
        match &peer.tls {
            PeerTls::Handshake(..) => return self.send_handshake(index),
            PeerTls::Stream(_) => return self.send_sealed(index),
            PeerTls::Undecided | PeerTls::Plain => {}
        }
        let Some(transmit) = peer.protocol.poll_transmit() else {
            return;
        };
        if !peer.replies.is_empty() {
            let now_ns = epoch.elapsed().as_nanos() as u64;
            let (commands, total_ns) = peer.replies.leave(now_ns);
            self.counts.stages.add(Stage::ReplyWait, commands, total_ns);
            peer.sending = Waiting::all_since(commands, now_ns);
        }
        let mut staging = peer
            .staging
            .take()
            .expect("staging buffer is home while no send is in flight");
        assert!(
            transmit.bytes.len() <= STAGING_BYTES,
            "{} inline bytes exceed the staging buffer",
            transmit.bytes.len()
        );
        staging.as_mut_slice()[..transmit.bytes.len()].copy_from_slice(transmit.bytes);
        let mut batch = peer.batch.take().expect("checked above");
        let staging_index = batch.push_buf(staging);
        for segment in transmit.segments {
            match segment {
                TxSegment::Bytes(range) => batch.push_segment(staging_index, range.clone()),
                TxSegment::Slot(slot, range) => {
                    let buffer_index = batch.push_buf(peer.slots.take(*slot));
                    peer.lent_slots.push(*slot);
                    batch.push_segment(buffer_index, range.clone());
                }
            }
        }
        peer.ops_in_flight += 1;
        peer.sent = Sent::Protocol;
        let fd = peer.stream.as_raw_fd();
        self.push(Op::Send { fd, batch }, token(index, OpKind::Send, 0));
    }

    /// Sends what the TLS handshake has to send, from the staging buffer.
    fn send_handshake(&mut self, index: usize) {
        let peer = self.connections[index].as_mut().expect("live connection");
        let PeerTls::Handshake(_, output) = &mut peer.tls else {
            unreachable!("called during the handshake")
        };
        if output.is_empty() {
            return;
        }
        let mut staging = peer.staging.take().expect("staging is home between sends");
        // A server's flight is a few hundred bytes.
        let len = output.len().min(STAGING_BYTES);
        staging.as_mut_slice()[..len].copy_from_slice(&output[..len]);
        output.drain(..len);
        let mut batch = peer.batch.take().expect("checked by the caller");
        let staging_index = batch.push_buf(staging);
        batch.push_segment(staging_index, 0..len);
        peer.ops_in_flight += 1;
        peer.sent = Sent::Handshake;
        let fd = peer.stream.as_raw_fd();
        self.push(Op::Send { fd, batch }, token(index, OpKind::Send, 0));
    }

    /// Seals the protocol's transmit into TLS records, an out buffer at a
    /// time, and sends them.
    fn send_sealed(&mut self, index: usize) {
        let epoch = self.epoch;
        let peer = self.connections[index].as_mut().expect("live connection");
        let Peer {
            protocol,
            slots,
            tls: PeerTls::Stream(stream),
            ..
        } = peer
        else {
            unreachable!("called on a TLS stream")
        };
        let transmit = if stream.sealing() {
            protocol.transmitting()
        } else {
            protocol.poll_transmit()
        };
        let Some(transmit) = transmit else {
            return;
        };
        let sealed = stream.seal(&transmit, slots);
        let (len, last) = match sealed {
            Ok(sealed) => sealed,
            Err(alert) => return begin_close(peer, &format!("TLS: cannot seal: {alert}")),
        };
        if !peer.replies.is_empty() {
            let now_ns = epoch.elapsed().as_nanos() as u64;
            let (commands, total_ns) = peer.replies.leave(now_ns);
            self.counts.stages.add(Stage::ReplyWait, commands, total_ns);
            peer.sending = Waiting::all_since(commands, now_ns);
        }
        let PeerTls::Stream(stream) = &mut peer.tls else {
            unreachable!("matched above")
        };
        let out = stream
            .out
            .take()
            .expect("the out buffer is home between sends");
        let mut batch = peer.batch.take().expect("checked by the caller");
        let out_index = batch.push_buf(out);
        batch.push_segment(out_index, 0..len);
        peer.ops_in_flight += 1;
        peer.sent = Sent::Sealed { last };
        let fd = peer.stream.as_raw_fd();
        self.push(Op::Send { fd, batch }, token(index, OpKind::Send, 0));
    }

    /// Takes a new block I/O from a connection.
    fn submit_block_io(&mut self, index: usize, request: IoRequest) {
        self.start_block_io(index, request, Admission::New);
    }

    /// Starts a block I/O on its namespace's device or volume. A new one is
    /// first counted in its namespace's meter, and held back if its QoS
    /// limits say so.
    fn start_block_io(&mut self, index: usize, request: IoRequest, admission: Admission) {
        let now_ns = self.now_ns();
        // Disjoint field borrows: no reference count touched per I/O.
        let (exports, connections) = (&self.exports, &mut self.connections);
        let peer = connections[index].as_mut().expect("live connection");
        if peer.subsystem.is_none() {
            peer.subsystem = peer.protocol.subsystem_index();
        }
        let Some(namespace) = peer
            .subsystem
            .and_then(|subsystem| exports.namespace(subsystem, request.nsid))
        else {
            let result = Err(IoError::Other);
            match admission {
                Admission::New => {
                    // The core validated the NSID against the same configuration the exports were built from.
                    log::error!("{}: no device for namespace {}", peer.address, request.nsid);
                    peer.protocol
                        .handle_io_complete(request.slot, result, &mut peer.slots);
                }
                // The namespace left with an exports update while the I/O waited.
                Admission::Admitted => {
                    finish_io(peer, &mut self.counts, now_ns, request.slot, result)
                }
            }
            return;
        };
        if admission == Admission::New {
            let waited_ns = now_ns.saturating_sub(peer.received_ns);
            self.counts.stages.add(Stage::ReceiveToStart, 1, waited_ns);
            let (class, bytes) = io_class(&request.kind);
            peer.marks[usize::from(request.slot.0)] = IoMark {
                meter: namespace.meter.id,
                class,
                bytes,
                started_ns: now_ns,
                nsid: request.nsid,
                sticky: None,
            };
            local_stats(&mut self.counts.meters, &namespace.meter).start();
            if namespace.health.is_failed() {
                let result = Err(IoError::Failed);
                return finish_io(peer, &mut self.counts, now_ns, request.slot, result);
            }
            let start_ns = namespace.meter.reserve(now_ns, class, bytes);
            if start_ns > now_ns + THROTTLE_SLACK_NS {
                return self.throttle(start_ns, index, request);
            }
        }
        // Held back or sent to the manager before the store failed: refused now.
        if admission == Admission::Admitted && namespace.health.is_failed() {
            let result = Err(IoError::Failed);
            return finish_io(peer, &mut self.counts, now_ns, request.slot, result);
        }
        if matches!(
            request.kind,
            IoKind::Snapshot { .. } | IoKind::Grow { .. } | IoKind::Reserve { .. }
        ) {
            let volume = match &namespace.backend {
                Backend::Volume(volume) => Some(Arc::clone(volume)),
                Backend::Device(_) => None,
            };
            return self.volume_control(index, request, volume);
        }
        let device = match &namespace.backend {
            Backend::Device(device) => device.as_ref(),
            Backend::Volume(volume) => {
                let volume = Arc::clone(volume);
                return self.submit_volume_io(index, request, volume);
            }
        };
        if device.is_memory() {
            let result = memory_io(device, request.kind, peer.slots.buffer(request.slot));
            if let Err(error) = &result {
                log::warn!("{}: RAM namespace I/O failed: {error}", peer.address);
            }
            let result = result.map_err(|e| classify(&e));
            finish_io(peer, &mut self.counts, now_ns, request.slot, result);
            return;
        }
        let fd = device.fd();
        let slot = request.slot;
        peer.marks[usize::from(slot.0)].sticky = match request.kind {
            IoKind::Flush => Some(FailedOperation::Sync),
            IoKind::Write { fua: true, .. } => Some(FailedOperation::FuaWrite),
            _ => None,
        };
        let (op, expected) = match request.kind {
            IoKind::Read {
                offset,
                len,
                buffer_offset,
            } => {
                let buf = peer.slots.take(slot);
                (
                    Op::Read {
                        fd,
                        buf,
                        buf_offset: buffer_offset as usize,
                        len: len as usize,
                        file_offset: offset,
                    },
                    len,
                )
            }
            IoKind::Write {
                offset,
                len,
                buffer_offset,
                fua,
            } => {
                let buf = peer.slots.take(slot);
                (
                    Op::Write {
                        fd,
                        buf,
                        buf_offset: buffer_offset as usize,
                        len: len as usize,
                        file_offset: offset,
                        dsync: fua,
                    },
                    len,
                )
            }
            IoKind::Flush => (Op::Fsync { fd, datasync: true }, 0),
            IoKind::WriteZeroes {
                offset, len, fua, ..
            } => return self.start_zeroing(index, slot, zeroing(device, offset, len, fua)),
            IoKind::Deallocate { offset, len } => {
                return self.start_zeroing(index, slot, zeroing(device, offset, len, false))
            }
            IoKind::Snapshot { .. } | IoKind::Grow { .. } | IoKind::Reserve { .. } => {
                unreachable!("volume control never reaches a device")
            }
        };
        peer.io_len[usize::from(slot.0)] = expected;
        peer.ops_in_flight += 1;
        self.push_block_io(index, slot, op);
    }
}

/// Completes a slot's block I/O in the core and counts it in its meter's statistics.
/// Hands `received` bytes (after an incomplete TLS record kept at the
/// buffer's front) to the connection's TLS or its protocol; the error is
/// why the connection ends, and the alert record to send first (if any).
fn take_received(
    peer: &mut Peer,
    buffer: &mut IoBuf,
    received: usize,
    now: Timestamp,
    config: &weft_proto::TargetConfig,
    random: &dyn weft_proto::auth::SecureRandom,
) -> Result<(), (String, Vec<u8>)> {
    let Peer {
        protocol,
        slots,
        tls,
        ..
    } = peer;
    tls.decide(buffer.as_slice()[0], random);
    match tls {
        PeerTls::Undecided => unreachable!("decided above"),
        PeerTls::Plain => protocol.handle_input(&buffer.as_slice()[..received], now, slots),
        PeerTls::Handshake(handshake, output) => {
            let received = &buffer.as_slice()[..received];
            let Some(established) = crate::tls::handshake(handshake, output, received, config)?
            else {
                return Ok(());
            };
            let (mut stream, identity) =
                TlsStream::new(established, buffer).map_err(|reason| (reason, Vec::new()))?;
            protocol.set_tls_identity(identity);
            let leftover = stream.partial;
            stream
                .open_records(buffer.as_mut_slice(), leftover, |plaintext| {
                    protocol.handle_input(plaintext, now, slots)
                })
                .map_err(|alert| (alert.to_string(), Vec::new()))?;
            *tls = PeerTls::Stream(Box::new(stream));
        }
        PeerTls::Stream(stream) => {
            let end = stream.partial + received;
            stream
                .open_records(buffer.as_mut_slice(), end, |plaintext| {
                    protocol.handle_input(plaintext, now, slots)
                })
                .map_err(|alert| (alert.to_string(), Vec::new()))?;
        }
    }
    Ok(())
}

/// Sends a failed handshake's alert record straight away, without waiting
/// (a few bytes into a socket with no send of ours in flight, so it cannot
/// land inside another record), as the connection ends: the host's log
/// then says why.
fn send_alert(peer: &Peer, alert: &[u8]) {
    if !alert.is_empty() && peer.batch.is_some() && peer.stream.set_nonblocking(true).is_ok() {
        let _ = (&peer.stream).write(alert);
    }
}

fn finish_io(
    peer: &mut Peer,
    counts: &mut Counts,
    now_ns: u64,
    slot: SlotId,
    result: Result<(), IoError>,
) {
    let mark = peer.marks[usize::from(slot.0)];
    let latency_ns = now_ns.saturating_sub(mark.started_ns);
    if let Some(Some(counted)) = counts.meters.get_mut(mark.meter as usize) {
        counted
            .1
            .finish(mark.class, mark.bytes, latency_ns, result.is_ok());
    }
    counts.stages.add(Stage::Service, 1, latency_ns);
    peer.replies.push(now_ns);
    peer.protocol
        .handle_io_complete(slot, result, &mut peer.slots);
}

/// This reactor's statistics of `meter`, made on first use.
fn local_stats<'a>(meters: &'a mut MeterTable, meter: &Arc<Meter>) -> &'a mut LocalStats {
    let id = meter.id as usize;
    if meters.len() <= id {
        meters.resize_with(id + 1, || None);
    }
    let entry = &mut meters[id];
    &mut entry
        .get_or_insert_with(|| Box::new((Arc::clone(meter), LocalStats::default())))
        .1
}

/// A piece of the slot's volume I/O failed: if it was a FUA write, the
/// volume's pool is failed from now on. True when this failure failed the
/// pool (and was logged).
fn note_volume_failure(peer: &Peer, slot: SlotId, error: &io::Error) -> bool {
    let io = peer.volume_io[usize::from(slot.0)]
        .as_ref()
        .expect("a volume I/O in progress");
    if !matches!(io.request.kind, IoKind::Write { fua: true, .. }) {
        return false;
    }
    let volume = &io.backend;
    let first = volume.health.fail(FailedOperation::FuaWrite, error);
    if first {
        log::error!(
            "pool {} failed: a FUA write to volume {} failed: {error}; every I/O on its volumes now fails until an operator checks its devices and runs `weft pool clear-failure {}`",
            volume.pool,
            volume.volume,
            volume.pool
        );
    }
    first
}

/// The first step of zeroing `[offset, offset + len)` of `device`.
fn zeroing(device: &dyn weft_storage::BlockDevice, offset: u64, len: u64, fua: bool) -> Zeroing {
    Zeroing {
        fd: device.fd(),
        offset,
        len,
        written: 0,
        fua,
        step: if device.can_punch_holes() {
            ZeroStep::Punch
        } else {
            ZeroStep::Write
        },
    }
}

/// A namespace's backend, for logs.
fn describe_backend(namespace: &NamespaceDevice) -> String {
    match &namespace.backend {
        Backend::Device(device) => device.describe(),
        Backend::Volume(volume) => format!("{volume:?}"),
    }
}

/// The class and data bytes of an I/O, for limits and statistics.
fn io_class(kind: &IoKind) -> (IoClass, u32) {
    match *kind {
        IoKind::Read { len, .. } => (IoClass::Read, len),
        IoKind::Write { len, .. } => (IoClass::Write, len),
        IoKind::Flush
        | IoKind::WriteZeroes { .. }
        | IoKind::Deallocate { .. }
        | IoKind::Snapshot { .. }
        | IoKind::Grow { .. }
        | IoKind::Reserve { .. } => (IoClass::Other, 0),
    }
}

/// Starts closing: logs why once, shuts the socket down (which also ends a
/// pending receive) and releases the queue in the core.
fn begin_close(peer: &mut Peer, reason: &str) {
    // The receive or send that the shutdown ends comes back here: the close
    // was logged (and the queue released) already.
    if peer.closing {
        return;
    }
    peer.closing = true;
    match peer.protocol.termination() {
        Some(Termination::Protocol(error)) => log::warn!(
            "{}: protocol error, sent C2HTermReq {:?} (field offset {}); connection closed",
            peer.address,
            error.status,
            error.field_offset
        ),
        Some(Termination::KeepAliveExpired) => match peer.protocol.cntlid() {
            Some(cntlid) => log::warn!(
                "{}: keep-alive timeout expired; controller {cntlid} torn down",
                peer.address
            ),
            None => log::warn!(
                "{}: keep-alive timeout expired; its controller torn down",
                peer.address
            ),
        },
        Some(other) => log::info!("{}: connection ended: {other:?}", peer.address),
        None => log::debug!("{}: connection {reason}", peer.address),
    }
    let _ = peer.stream.shutdown(Shutdown::Both);
    peer.protocol.on_closed();
}

/// Says why a host was refused at Connect and what lets it in: for a volume,
/// the commands that register the host and attach it.
fn log_refused_host(address: SocketAddr, refused: &RefusedHost, exports: &Exports) {
    let volume = exports
        .config
        .subsystems
        .iter()
        .position(|s| s.nqn == refused.subnqn)
        .and_then(|index| exports.devices[index].first())
        .and_then(|device| match &device.backend {
            Backend::Volume(volume) => Some(volume.volume.as_str()),
            Backend::Device(_) => None,
        });
    match volume {
        Some(volume) => log::warn!(
            "{address}: host {} refused for volume {volume} (Connect Invalid Host): it is not attached; to allow it: weft host add NAME --nqn {} && weft volume attach {volume} --host NAME",
            refused.hostnqn,
            refused.hostnqn
        ),
        None => log::warn!(
            "{address}: host {} refused for {} (Connect Invalid Host): the subsystem does not allow it",
            refused.hostnqn,
            refused.subnqn
        ),
    }
}

/// A memory device's I/O, done inline: a copy costs less than a trip through io_uring.
fn memory_io(
    device: &dyn weft_storage::BlockDevice,
    kind: IoKind,
    buffer: &mut [u8],
) -> io::Result<()> {
    match kind {
        IoKind::Read {
            offset,
            len,
            buffer_offset,
        } => {
            let at = buffer_offset as usize;
            device.read_inline(&mut buffer[at..at + len as usize], offset)
        }
        IoKind::Write {
            offset,
            len,
            buffer_offset,
            ..
        } => {
            let at = buffer_offset as usize;
            device.write_inline(&buffer[at..at + len as usize], offset)
        }
        IoKind::Flush => Ok(()),
        IoKind::WriteZeroes { offset, len, .. } | IoKind::Deallocate { offset, len } => {
            device.zero_inline(offset, len)
        }
        IoKind::Snapshot { .. } | IoKind::Grow { .. } | IoKind::Reserve { .. } => {
            unreachable!("volume control never reaches a device")
        }
    }
}

fn classify(error: &io::Error) -> IoError {
    match error.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => IoError::NoSpace,
        Some(libc::EIO) => IoError::Media,
        _ => IoError::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// What the eventfd counts: the wake-ups since it was last read.
    fn wakes(mailbox: &Mailbox) -> u64 {
        let mut count = [0u8; 8];
        (&mailbox.wake).read_exact(&mut count).unwrap();
        u64::from_ne_bytes(count)
    }

    fn exports() -> Message {
        let config = weft_proto::testing::config_with(
            "nqn.2026-11.io.weft:t",
            &[],
            weft_proto::Limits::DEFAULT,
        );
        Message::Exports(
            Arc::new(Exports::new(Arc::new(config), vec![Vec::new()])),
            1,
        )
    }

    #[test]
    fn a_burst_of_messages_wakes_the_reactor_once_until_it_is_heard() {
        let (mailbox, inbox) = Mailbox::detached().unwrap();
        for _ in 0..3 {
            mailbox.send(exports());
        }
        assert_eq!(wakes(&mailbox), 1, "one wake-up for three messages");
        mailbox.heard();
        assert_eq!(inbox.try_iter().count(), 3);
        mailbox.send(exports());
        assert_eq!(wakes(&mailbox), 1);
        // Its own thread's messages wake nobody: it reads them after its turn.
        let _ = mailbox.owner.set(thread::current().id());
        mailbox.heard();
        mailbox.send(exports());
        assert!(!mailbox.wake_pending.load(Ordering::Acquire));
        assert_eq!(inbox.try_iter().count(), 2);
    }
}
