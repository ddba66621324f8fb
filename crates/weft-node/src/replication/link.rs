//! One primary session with one replica: a thread that connects to the
//! replica's node (its private replica subsystem, DH-HMAC-CHAP both ways),
//! takes the fence with the session's token, reads the replica's write
//! intent, then carries the primary's messages as NVMe commands on one I/O
//! queue, in order, and reports every answer to the replicator.
//!
//! A session ends for good when the connection fails or the replicator drops
//! the link: the primary then reattaches with a new session (a new link,
//! a new connection, a larger token), so no command of an old session can
//! reach the replica after the new fence (see `weft_proto::fence`).
//!
//! Pipelined: every message waiting is submitted (up to the queue's
//! entries) before the thread blocks for the next completion, so a message
//! that arrives while others are in flight waits at most one completion.
//! Messages longer than the target's transfer size (a 1 MiB rebuild copy)
//! go as several commands; the message is done when all are.

use super::barrier::BarrierOp;
use super::{Event, Events};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Duration;
use weft_control::Store;
use weft_initiator::{read_write, set_cdw, sqe, ConnectOptions, Controller, Queue, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::fence::FenceToken;
use weft_proto::host::DataTransfer;
use weft_proto::status::Status;
use weft_replication::{FromReplica, NodeId, OpId, RegionSet, ToReplica, Token};

/// The replica's namespace on its replica subsystem.
const NSID: u32 = 1;
/// A replica that answers nothing for this long has failed (the primary
/// usually gives up earlier, at its replica timeout).
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an attach is tried again (less than the primary's replica timeout).
const ATTACH_PATIENCE: Duration = Duration::from_millis(1500);
const ATTACH_RETRY: Duration = Duration::from_millis(100);
/// How long a new primary tries to fence its own replica.
const OWN_FENCE_PATIENCE: Duration = Duration::from_secs(5);

/// What a write carries.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// Data.
    Data(Arc<Vec<u8>>),
    /// Zeroes over `blocks` blocks: Write Zeroes, deallocating if allowed.
    Zeroes { deallocate: bool, blocks: u64 },
}

/// A message for the replica.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// The replication core's, with the data of a write or copy.
    Core {
        msg: ToReplica,
        payload: Option<Payload>,
    },
    /// Take a snapshot of the replica's copy, or grow it (see
    /// `super::barrier`); the answer comes as [`Event::BarrierDone`], and a
    /// failure does not end the session.
    Barrier { seq: u64, op: BarrierOp },
}

/// Where a link connects and how.
#[derive(Clone)]
pub(crate) struct LinkTarget {
    /// The replica's node, as the replication core numbers it.
    pub(crate) node: NodeId,
    /// Its name (its address is looked up in the cluster's records at each attach).
    pub(crate) name: String,
    /// The cluster's records.
    pub(crate) store: Arc<dyn Store>,
    /// The replica subsystem's NQN.
    pub(crate) nqn: String,
    pub(crate) options: ConnectOptions,
    pub(crate) block_size: u32,
    /// The volume's regions (the size of the intent).
    pub(crate) regions: u32,
    /// The last attach failed and was logged: the next failures are not
    /// (a node down for long would fill the log every few seconds).
    pub(crate) unreachable: Arc<AtomicBool>,
}

/// A running session; dropping it ends the session once its thread
/// notices (the connection closes with it).
#[derive(Debug)]
pub(crate) struct Link {
    sender: Sender<Outgoing>,
}

impl Link {
    /// Starts a session that fences the replica with `token`.
    pub(crate) fn start(target: LinkTarget, token: Token, events: Events) -> Link {
        let (sender, messages) = mpsc::channel();
        let name = format!("link-{}", target.name);
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || Session::run(target, token, messages, events));
        if let Err(error) = spawned {
            log::error!("cannot start a replica link: {error}");
        }
        Link { sender }
    }

    /// Queues a message (lost if the session ended: the primary's timeout
    /// or the session's refusal tells).
    pub(crate) fn send(&self, outgoing: Outgoing) {
        let _ = self.sender.send(outgoing);
    }
}

/// What a command in flight belongs to.
#[derive(Debug, Clone, Copy)]
enum Part {
    /// A message of the core (a Clean has no op).
    Core(Option<OpId>),
    /// Barrier `seq`'s command (Snapshot or Grow).
    Barrier(u64),
}

/// A command built from a message, with its data.
struct Built {
    command: [u8; 64],
    transfer: DataTransfer,
    data: Option<Vec<u8>>,
    part: Part,
}

struct Session {
    node: NodeId,
    token: Token,
    events: Events,
    queue: Queue,
    block_size: u32,
    transfer_bytes_max: usize,
    /// Commands in flight, by CID.
    in_flight: BTreeMap<u16, Part>,
    /// Commands left to answer per message op.
    parts_left: BTreeMap<OpId, usize>,
    /// Commands built but not submitted yet (the queue was full).
    waiting: VecDeque<Built>,
}

impl Session {
    fn run(target: LinkTarget, token: Token, messages: Receiver<Outgoing>, events: Events) {
        let node = target.node;
        let report = |reply: FromReplica| {
            let _ = events.send(Event::Replica { node, reply });
        };
        // A session that cannot start is refused at once: the primary
        // marks the link down and tries again later.
        let refused = FromReplica::Refused {
            token,
            current: Token::default(),
        };
        let (controller, queue) = match attach_patiently(&target, token) {
            Ok(Attached::Fenced { connection, reply }) => {
                if target.unreachable.swap(false, Ordering::Relaxed) {
                    log::info!("replica on node {}: reached again", target.name);
                }
                report(reply);
                *connection
            }
            Ok(Attached::Refused(reply)) => return report(reply),
            Err(error) => {
                if target.unreachable.swap(true, Ordering::Relaxed) {
                    log::debug!("replica on node {}: {error}", target.name);
                } else {
                    log::info!("replica on node {}: {error} (tried again every second; logged again once reached)", target.name);
                }
                return report(refused);
            }
        };
        let mut session = Session {
            node,
            token,
            events: events.clone(),
            transfer_bytes_max: controller.info.transfer_bytes_max as usize,
            queue,
            block_size: target.block_size,
            in_flight: BTreeMap::new(),
            parts_left: BTreeMap::new(),
            waiting: VecDeque::new(),
        };
        if let Err(error) = session.serve(&messages) {
            log::info!("replica on node {}: session ended: {error}", target.name);
            report(refused);
        }
        drop(controller);
    }

    /// Carries messages until the replicator drops the link or the
    /// connection fails.
    fn serve(&mut self, messages: &Receiver<Outgoing>) -> Result<(), String> {
        loop {
            if self.in_flight.is_empty() && self.waiting.is_empty() {
                match messages.recv() {
                    Ok(outgoing) => self.build(outgoing),
                    Err(mpsc::RecvError) => return Ok(()),
                }
            }
            loop {
                match messages.try_recv() {
                    Ok(outgoing) => self.build(outgoing),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) if self.in_flight.is_empty() => return Ok(()),
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.submit_waiting()?;
            if !self.in_flight.is_empty() {
                let done = self.queue.wait().map_err(|e| e.to_string())?;
                // With every other completion that receive brought, and one
                // wake-up of the replicator for all of them.
                let mut posted = false;
                let mut result = self.completed(done.cid.0, done.status, &mut posted);
                while result.is_ok() {
                    let Some(more) = self.queue.poll_completion() else {
                        break;
                    };
                    result = self.completed(more.cid.0, more.status, &mut posted);
                }
                if posted {
                    self.events.ring();
                }
                result?;
            }
        }
    }

    /// Turns a message into commands, queued for submission.
    fn build(&mut self, outgoing: Outgoing) {
        let (msg, payload) = match outgoing {
            Outgoing::Core { msg, payload } => (msg, payload),
            Outgoing::Barrier { seq, op } => return self.build_barrier(seq, &op),
        };
        match msg {
            ToReplica::Fence { .. } => {
                debug_assert!(false, "a fence starts a new session");
            }
            ToReplica::Write {
                op, extent, fua, ..
            } => self.build_write(op, extent.block, payload, fua),
            ToReplica::Copy { op, extent, .. } => {
                self.build_write(op, extent.block, payload, false)
            }
            ToReplica::Flush { op, .. } => {
                let command = sqe(io_opcode::FLUSH, NSID);
                self.push(command, DataTransfer::None, None, Part::Core(Some(op)));
            }
            ToReplica::Clean { regions, .. } => {
                let most = weft_proto::intent::CLEAN_REGIONS_MAX as usize;
                for chunk in regions.chunks(most.min(self.transfer_bytes_max / 4)) {
                    let data: Vec<u8> = chunk.iter().flat_map(|r| r.to_le_bytes()).collect();
                    let mut command = sqe(weft_proto::intent::CLEAN_OPCODE, NSID);
                    set_cdw(&mut command, 10, chunk.len() as u32);
                    let transfer = DataTransfer::ToController(data.len() as u32);
                    self.push(command, transfer, Some(data), Part::Core(None));
                }
            }
        }
    }

    fn build_barrier(&mut self, seq: u64, op: &BarrierOp) {
        let (command, transfer, data) = match op {
            BarrierOp::Snapshot(name) => {
                let mut command = sqe(weft_proto::intent::SNAPSHOT_OPCODE, NSID);
                set_cdw(&mut command, 10, name.len() as u32);
                let transfer = DataTransfer::ToController(name.len() as u32);
                (command, transfer, Some(name.as_bytes().to_vec()))
            }
            BarrierOp::Grow(size_bytes) => {
                let mut command = sqe(weft_proto::intent::GROW_OPCODE, NSID);
                set_cdw(&mut command, 10, *size_bytes as u32);
                set_cdw(&mut command, 11, (*size_bytes >> 32) as u32);
                (command, DataTransfer::None, None)
            }
        };
        self.push(command, transfer, data, Part::Barrier(seq));
    }

    fn build_write(&mut self, op: OpId, block: u64, payload: Option<Payload>, fua: bool) {
        let block_bytes = self.block_size as usize;
        let fua_bit = if fua { 1 << 30 } else { 0 };
        match payload {
            Some(Payload::Data(data)) => {
                let piece_max = self.transfer_bytes_max - self.transfer_bytes_max % block_bytes;
                for (index, piece) in data.chunks(piece_max).enumerate() {
                    let slba = block + (index * piece_max / block_bytes) as u64;
                    let blocks = (piece.len() / block_bytes) as u32;
                    let mut command = read_write(io_opcode::WRITE, NSID, slba, blocks);
                    set_cdw(&mut command, 12, (blocks - 1) | fua_bit);
                    let transfer = DataTransfer::ToController(piece.len() as u32);
                    self.push(
                        command,
                        transfer,
                        Some(piece.to_vec()),
                        Part::Core(Some(op)),
                    );
                }
            }
            Some(Payload::Zeroes { deallocate, blocks }) => {
                // NLB is 16 bits: at most 65536 blocks per command.
                let deac = if deallocate { 1 << 25 } else { 0 };
                let mut done = 0u64;
                while done < blocks {
                    let count = (blocks - done).min(65536) as u32;
                    let mut command =
                        read_write(io_opcode::WRITE_ZEROES, NSID, block + done, count);
                    set_cdw(&mut command, 12, (count - 1) | deac | fua_bit);
                    self.push(command, DataTransfer::None, None, Part::Core(Some(op)));
                    done += u64::from(count);
                }
            }
            None => {
                log::error!("a write to a replica without its data");
            }
        }
    }

    fn push(
        &mut self,
        command: [u8; 64],
        transfer: DataTransfer,
        data: Option<Vec<u8>>,
        part: Part,
    ) {
        if let Part::Core(Some(op)) = part {
            *self.parts_left.entry(op).or_default() += 1;
        }
        self.waiting.push_back(Built {
            command,
            transfer,
            data,
            part,
        });
    }

    fn submit_waiting(&mut self) -> Result<(), String> {
        while let Some(built) = self.waiting.pop_front() {
            let cid = self.queue.next_cid();
            if let Some(data) = &built.data {
                self.queue.buffer(cid)[..data.len()].copy_from_slice(data);
            }
            match self.queue.submit(built.command, built.transfer) {
                Ok(cid) => {
                    self.in_flight.insert(cid.0, built.part);
                }
                Err(weft_proto::host::SubmitError::QueueFull) => {
                    self.waiting.push_front(built);
                    break;
                }
                Err(error) => return Err(error.to_string()),
            }
        }
        self.queue.transmit().map_err(|e| e.to_string())
    }

    /// Reports a completion to the replicator: posted (setting `posted`)
    /// when it finishes a message, for the caller to ring once.
    fn completed(&mut self, cid: u16, status: Status, posted: &mut bool) -> Result<(), String> {
        let part = self
            .in_flight
            .remove(&cid)
            .ok_or_else(|| format!("a completion for CID {cid}, which is not in flight"))?;
        if status == Status::RESERVATION_CONFLICT {
            // Fenced by someone else: this session is over.
            return Err("fenced by a newer session".into());
        }
        let op = match part {
            Part::Barrier(seq) => {
                if !status.is_success() {
                    log::warn!(
                        "replica {:?}: a snapshot or growth failed: {status}",
                        self.node
                    );
                }
                let done = status.is_success();
                let node = self.node;
                let _ = self.events.post(Event::BarrierDone { node, seq, done });
                *posted = true;
                return Ok(());
            }
            _ if !status.is_success() => return Err(format!("command failed: {status}")),
            Part::Core(None) => return Ok(()),
            Part::Core(Some(op)) => op,
        };
        let left = self.parts_left.get_mut(&op).expect("counted at push");
        *left -= 1;
        if *left == 0 {
            self.parts_left.remove(&op);
            let reply = FromReplica::Done {
                token: self.token,
                op,
            };
            let _ = self.events.post(Event::Replica {
                node: self.node,
                reply,
            });
            *posted = true;
        }
        Ok(())
    }
}

enum Attached {
    Fenced {
        connection: Box<(Controller, Queue)>,
        reply: FromReplica,
    },
    Refused(FromReplica),
}

/// The NVMe/TCP address of the replica subsystem on `target`'s node.
pub(crate) fn replica_url(target: &LinkTarget) -> Result<TargetUrl, String> {
    let view =
        weft_cluster::nodes::get(target.store.as_ref(), &target.name).map_err(|e| e.to_string())?;
    let member = &view.member;
    let address = member
        .peer_nvme
        .first()
        .or(member.nvme.first())
        .ok_or_else(|| format!("node {} advertises no NVMe/TCP address", target.name))?;
    TargetUrl::parse(&format!("nvme-tcp://{address}/{}", target.nqn)).map_err(|e| e.to_string())
}

/// Fences this node's own replica of the volume with session 0 of `epoch`
/// (through its replica subsystem, as any primary would): false if a newer
/// epoch holds it.
///
/// Tried again for a while: at start the node's own listener may not be up
/// yet, and its replica subsystem is exported a moment after the record
/// names it.
pub(crate) fn fence_own(target: &LinkTarget, epoch: u64) -> Result<bool, String> {
    let start = std::time::Instant::now();
    let token = FenceToken { epoch, session: 0 };
    loop {
        let fenced = replica_url(target).and_then(|url| {
            let controller =
                Controller::connect(&url, target.options.clone(), 1).map_err(|e| e.to_string())?;
            controller.fence(token).map_err(|e| e.to_string())
        });
        match fenced {
            Ok(fenced) => return Ok(fenced.is_ok()),
            Err(_) if start.elapsed() < OWN_FENCE_PATIENCE => std::thread::sleep(ATTACH_RETRY),
            Err(error) => return Err(error),
        }
    }
}

/// [`attach`], tried again for a while when the replica's node cannot be
/// reached or does not export the replica yet (a new volume's replicas are
/// created as their nodes see its record): within the primary's replica
/// timeout, so that a replica that is merely late is not faulted.
fn attach_patiently(target: &LinkTarget, token: Token) -> Result<Attached, String> {
    let start = std::time::Instant::now();
    loop {
        match attach(target, token) {
            Err(error) if start.elapsed() + ATTACH_RETRY < ATTACH_PATIENCE => {
                log::debug!("replica on node {}: {error}; trying again", target.name);
                std::thread::sleep(ATTACH_RETRY);
            }
            other => return other,
        }
    }
}

/// Connects, takes the fence and reads the intent.
fn attach(target: &LinkTarget, token: Token) -> Result<Attached, String> {
    let url = replica_url(target)?;
    let controller =
        Controller::connect(&url, target.options.clone(), 1).map_err(|e| e.to_string())?;
    let fence = FenceToken {
        epoch: token.epoch.0,
        session: token.session,
    };
    if let Err(epoch) = controller.fence(fence).map_err(|e| e.to_string())? {
        let current = Token {
            epoch: weft_replication::Epoch(epoch),
            session: 0,
        };
        return Ok(Attached::Refused(FromReplica::Refused { token, current }));
    }
    let written = controller.write_intent().map_err(|e| e.to_string())?;
    let queue = controller.open_io_queue(1).map_err(|e| e.to_string())?;
    queue
        .set_io_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut intent = RegionSet::new(target.regions);
    for &region in written.regions.iter().filter(|&&r| r < target.regions) {
        intent.insert(region);
    }
    let reply = FromReplica::Fenced {
        token,
        intent,
        unclean: written.unclean,
    };
    Ok(Attached::Fenced {
        connection: Box::new((controller, queue)),
        reply,
    })
}
