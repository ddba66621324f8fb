//! One primary session with one replica: a thread connects to the
//! replica's node (its private replica subsystem, DH-HMAC-CHAP both ways),
//! takes the fence with the session's token and reads the replica's write
//! intent, then hands the connection to the replicator, whose ring carries
//! the primary's messages as NVMe commands on one I/O queue, in order
//! (`super::link_socket`), and turns every answer into the core's reply.
//!
//! A session ends for good when the connection fails or the replicator
//! replaces the link: the primary then reattaches with a new session (a new
//! link, a new connection, a larger token), so no command of an old session
//! can reach the replica after the new fence (see `weft_proto::fence`).
//!
//! Pipelined: every message waiting is submitted (up to the queue's
//! entries) at the replicator's next wait. Messages longer than the
//! target's transfer size (a 1 MiB rebuild copy) go as several commands;
//! the message is done when all are.
//!
//! What this does not do: drive the socket (`super::link_socket`), keep
//! the sessions of a volume (`super::links`), or decide when a session
//! starts, ends or has waited too long (the replication core does).

use super::barrier::BarrierOp;
use super::link_socket::{CommandData as Data, RingSocket};
use super::write_ring::WriteRing;
use super::{Event, Events};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weft_control::Store;
use weft_initiator::{read_write, set_cdw, sqe, ConnectOptions, Controller, Queue, TargetUrl};
use weft_proto::command::io_opcode;
use weft_proto::fence::FenceToken;
use weft_proto::host::DataTransfer;
use weft_proto::status::Status;
use weft_replication::{FromReplica, NodeId, OpId, RegionSet, ToReplica, Token};
use weft_uring::{Completion, SharedBuf};

/// The replica's namespace on its replica subsystem.
const NSID: u32 = 1;

/// How long an attach is tried again (less than the primary's replica timeout).
const ATTACH_PATIENCE: Duration = Duration::from_millis(1500);
const ATTACH_RETRY: Duration = Duration::from_millis(100);

/// What a write carries.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// Data (shared with the primary's own write and the other links).
    Data(SharedBuf),
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
    /// This node's name.
    pub(crate) me: String,
    /// How it connects; the DH-HMAC-CHAP secrets are `keys`'.
    pub(crate) options: ConnectOptions,
    pub(crate) keys: crate::link_keys::LinkKeys,
    pub(crate) block_size: u32,
    /// The volume's regions (the size of the intent).
    pub(crate) regions: u32,
    /// The last attach failed and was logged: the next failures are not
    /// (a node down for long would fill the log every few seconds).
    pub(crate) unreachable: Arc<AtomicBool>,
}

/// A replica's controller, held for a session (its keep-alive runs while
/// held); let go on a thread of its own: stopping the keep-alive waits for
/// a Keep Alive that a hung replica may not answer for seconds.
struct Held(Option<Controller>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(controller) = self.0.take() {
            let thread = std::thread::Builder::new().name("link-close".into());
            // Failing that, here.
            let _ = thread.spawn(move || drop(controller));
        }
    }
}

/// A session's connection, as its attach thread hands it to the replicator.
pub(crate) struct Attachment {
    controller: Held,
    queue: Queue,
    transfer_bytes_max: usize,
    /// The replica's answer to the fence, for the core.
    reply: FromReplica,
}

/// One primary session with one replica, as the replicator holds it.
pub(crate) struct Link {
    node: NodeId,
    token: Token,
    block_size: u32,
    state: State,
}

enum State {
    /// Its attach thread connects and fences; messages wait here.
    Attaching(Vec<Outgoing>),
    /// Connected: messages go out on the replicator's ring.
    Open(Box<Session>),
    /// The connection ended while nothing was in flight: the core hears
    /// at the next message (set: one came), as it did when a link thread
    /// only read its socket with commands out. So a replica whose node
    /// shut down cleanly between writes stays in sync until the primary
    /// next sends to it: a write, or the renewal of its read grant (three
    /// times a grant, idle or not). It then rejoins with the regions its
    /// intent holds, never a full rebuild after a clean shutdown.
    Broken(bool),
    /// Over (the core was told): messages are dropped.
    Ended,
}

impl Link {
    /// Starts a session that fences the replica with `token`: a thread
    /// connects, fences and reads the intent, then hands the connection
    /// over as [`Event::Attached`] (or the refusal as [`Event::Replica`]).
    pub(crate) fn start(target: LinkTarget, token: Token, events: Events) -> Link {
        let (node, block_size) = (target.node, target.block_size);
        let name = format!("link-{}", target.name);
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || attach_thread(target, token, events));
        if let Err(error) = spawned {
            log::error!("cannot start a replica link: {error}");
        }
        Link {
            node,
            token,
            block_size,
            state: State::Attaching(Vec::new()),
        }
    }

    /// Queues a message (dropped if the session ended: the primary's
    /// timeout or the session's refusal tells).
    pub(crate) fn send(&mut self, outgoing: Outgoing) {
        match &mut self.state {
            State::Attaching(waiting) => waiting.push(outgoing),
            State::Open(session) => session.build(outgoing),
            State::Broken(message) => *message = true,
            State::Ended => {}
        }
    }

    /// The session's token.
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// Its attach thread has not handed the connection over yet.
    pub(crate) fn is_attaching(&self) -> bool {
        matches!(self.state, State::Attaching(_))
    }

    /// The id of its connection's socket, if open.
    pub(crate) fn socket_id(&self) -> Option<u32> {
        match &self.state {
            State::Open(session) => Some(session.socket.id()),
            _ => None,
        }
    }

    /// Its attach thread's connection: the session opens on the ring as
    /// socket `id`, with the messages that waited. The reply for the core
    /// (a refusal if the connection cannot be taken over).
    pub(crate) fn open(&mut self, attachment: Attachment, id: u32) -> FromReplica {
        let Attachment {
            controller,
            queue,
            transfer_bytes_max,
            reply,
        } = attachment;
        let State::Attaching(waiting) = std::mem::replace(&mut self.state, State::Ended) else {
            unreachable!("only an attaching link is opened");
        };
        let socket = match RingSocket::new(id, queue.into_parts()) {
            Ok(socket) => socket,
            Err(error) => {
                log::warn!("replica {:?}: no buffers for its link: {error}", self.node);
                return self.refusal();
            }
        };
        let mut session = Box::new(Session {
            node: self.node,
            token: self.token,
            socket,
            _controller: controller,
            block_size: self.block_size,
            transfer_bytes_max,
            in_flight: Vec::new(),
            parts_left: BTreeMap::new(),
            waiting: VecDeque::new(),
        });
        for outgoing in waiting {
            session.build(outgoing);
        }
        self.state = State::Open(session);
        reply
    }

    /// Submits the commands waiting and starts the socket's I/O. A
    /// failure ends the session, its refusal for the core in `replies`;
    /// the session then comes back for its socket's operations to finish.
    pub(crate) fn start_io(
        &mut self,
        ring: &mut WriteRing,
        replies: &mut Vec<Event>,
    ) -> Option<Box<Session>> {
        let error = match &mut self.state {
            State::Open(session) => session.start_io(ring).err()?,
            State::Broken(true) => "its connection had ended".to_string(),
            _ => return None,
        };
        self.end(&error, replies)
    }

    /// One of its socket's operations completed: the replies it brought go
    /// to `replies`. A failed command ends the session (see
    /// [`Link::start_io`]), so does a failed connection with commands in
    /// flight; with none, it breaks off until the next message (see
    /// [`State::Broken`]).
    pub(crate) fn completed(
        &mut self,
        completion: Completion,
        ring: &mut WriteRing,
        replies: &mut Vec<Event>,
    ) -> Option<Box<Session>> {
        let State::Open(session) = &mut self.state else {
            unreachable!("completions reach open links only");
        };
        if let Err(error) = session.socket.completed(completion, ring) {
            if session.in_flight.iter().all(Option::is_none) && session.waiting.is_empty() {
                log::info!("replica {:?}: connection ended: {error}", self.node);
                let session = self.close();
                self.state = State::Broken(false);
                return session;
            }
            return self.end(&error, replies);
        }
        while let Some(done) = session.socket.poll_completion() {
            if let Err(error) = session.completed(done.cid.0, done.status, replies) {
                return self.end(&error, replies);
            }
        }
        None
    }

    /// Ends the session after `error`: the core hears a refusal (through
    /// `replies`); the session comes back for its socket's operations to finish.
    fn end(&mut self, error: &str, replies: &mut Vec<Event>) -> Option<Box<Session>> {
        log::info!("replica {:?}: session ended: {error}", self.node);
        replies.push(Event::Replica {
            node: self.node,
            reply: self.refusal(),
        });
        self.close()
    }

    /// Closes the session without a word to the core (it replaced it):
    /// the session comes back for its socket's operations to finish.
    pub(crate) fn close(&mut self) -> Option<Box<Session>> {
        match std::mem::replace(&mut self.state, State::Ended) {
            State::Open(mut session) => {
                session.socket.close();
                Some(session)
            }
            _ => None,
        }
    }

    fn refusal(&self) -> FromReplica {
        FromReplica::Refused {
            token: self.token,
            current: Token::default(),
        }
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
    data: Data,
    part: Part,
}

/// An open session: its connection on the replicator's ring and the
/// commands it carries.
pub(crate) struct Session {
    node: NodeId,
    token: Token,
    socket: RingSocket,
    /// Held while the session lasts (its keep-alive).
    _controller: Held,
    block_size: u32,
    transfer_bytes_max: usize,
    /// Commands in flight, indexed by CID (below the queue's entries).
    in_flight: Vec<Option<Part>>,
    /// Commands left to answer per message op.
    parts_left: BTreeMap<OpId, usize>,
    /// Commands built but not submitted yet (the queue was full).
    waiting: VecDeque<Built>,
}

impl Session {
    /// Its socket.
    pub(crate) fn socket(&mut self) -> &mut RingSocket {
        &mut self.socket
    }

    /// Its socket's id.
    pub(crate) fn socket_id(&self) -> u32 {
        self.socket.id()
    }

    fn start_io(&mut self, ring: &mut WriteRing) -> Result<(), String> {
        while let Some(built) = self.waiting.pop_front() {
            match self
                .socket
                .submit(built.command, built.transfer, &built.data)
            {
                Ok(cid) => {
                    let at = usize::from(cid.0);
                    if at >= self.in_flight.len() {
                        self.in_flight.resize(at + 1, None);
                    }
                    self.in_flight[at] = Some(built.part);
                }
                Err(weft_proto::host::SubmitError::QueueFull) => {
                    self.waiting.push_front(built);
                    break;
                }
                Err(error) => return Err(error.to_string()),
            }
        }
        self.socket.start(ring)
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
            ToReplica::Grant { op, .. } => {
                let command = sqe(weft_proto::fence::GRANT_OPCODE, NSID);
                self.push(
                    command,
                    DataTransfer::None,
                    Data::None,
                    Part::Core(Some(op)),
                );
            }
            ToReplica::Flush { op, .. } => {
                let command = sqe(io_opcode::FLUSH, NSID);
                self.push(
                    command,
                    DataTransfer::None,
                    Data::None,
                    Part::Core(Some(op)),
                );
            }
            ToReplica::Clean { regions, .. } => {
                let most = weft_proto::intent::CLEAN_REGIONS_MAX as usize;
                for chunk in regions.chunks(most.min(self.transfer_bytes_max / 4)) {
                    let data: Vec<u8> = chunk.iter().flat_map(|r| r.to_le_bytes()).collect();
                    let mut command = sqe(weft_proto::intent::CLEAN_OPCODE, NSID);
                    set_cdw(&mut command, 10, chunk.len() as u32);
                    let transfer = DataTransfer::ToController(data.len() as u32);
                    self.push(command, transfer, Data::Owned(data), Part::Core(None));
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
                (command, transfer, Data::Owned(name.as_bytes().to_vec()))
            }
            BarrierOp::Grow(size_bytes) => {
                let mut command = sqe(weft_proto::intent::GROW_OPCODE, NSID);
                set_cdw(&mut command, 10, *size_bytes as u32);
                set_cdw(&mut command, 11, (*size_bytes >> 32) as u32);
                (command, DataTransfer::None, Data::None)
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
                    let range = index * piece_max..index * piece_max + piece.len();
                    let data = Data::Shared(data.clone(), range);
                    self.push(command, transfer, data, Part::Core(Some(op)));
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
                    self.push(
                        command,
                        DataTransfer::None,
                        Data::None,
                        Part::Core(Some(op)),
                    );
                    done += u64::from(count);
                }
            }
            None => {
                log::error!("a write to a replica without its data");
            }
        }
    }

    fn push(&mut self, command: [u8; 64], transfer: DataTransfer, data: Data, part: Part) {
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

    /// A command the replica finished: its message's reply goes to
    /// `replies` once all its commands are (a failure ends the session).
    fn completed(
        &mut self,
        cid: u16,
        status: Status,
        replies: &mut Vec<Event>,
    ) -> Result<(), String> {
        let part = self
            .in_flight
            .get_mut(usize::from(cid))
            .and_then(Option::take)
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
                replies.push(Event::BarrierDone { node, seq, done });
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
            replies.push(Event::Replica {
                node: self.node,
                reply,
            });
        }
        Ok(())
    }
}

enum Attached {
    Fenced(Box<Attachment>),
    Refused(FromReplica),
}

/// A session's start: attaches, then hands the connection to the
/// replicator. A session that cannot start is refused at once: the
/// primary marks the link down and tries again later.
fn attach_thread(target: LinkTarget, token: Token, events: Events) {
    let node = target.node;
    let event = match attach_patiently(&target, token) {
        Ok(Attached::Fenced(attachment)) => {
            if target.unreachable.swap(false, Ordering::Relaxed) {
                log::info!("replica on node {}: reached again", target.name);
            }
            Event::Attached {
                node,
                token,
                attachment,
            }
        }
        Ok(Attached::Refused(reply)) => Event::Replica { node, reply },
        Err(error) => {
            if target.unreachable.swap(true, Ordering::Relaxed) {
                log::debug!("replica on node {}: {error}", target.name);
            } else {
                log::info!("replica on node {}: {error} (tried again every second; logged again once reached)", target.name);
            }
            let current = Token::default();
            let reply = FromReplica::Refused { token, current };
            Event::Replica { node, reply }
        }
    };
    // The replicator may be gone: the connection then closes here.
    let _ = events.send(event);
}

/// The NVMe/TCP address of the replica subsystem on `target`'s node, and
/// how to connect to it (with the secrets of the link to that node).
fn replica_url(target: &LinkTarget) -> Result<(TargetUrl, ConnectOptions), String> {
    let view =
        weft_cluster::nodes::get(target.store.as_ref(), &target.name).map_err(|e| e.to_string())?;
    let member = &view.member;
    let other = crate::link_keys::Peer {
        name: member.name.clone(),
        certificate: member.certificate.clone(),
    };
    let credentials = target.keys.between(&target.me, &target.name, &other)?;
    let options = ConnectOptions {
        dhchap: Some(credentials.dhchap),
        // A link lives as long as its primary's session and may carry more
        // than one key should: it asks for key updates (both ends are weft).
        tls_key_update_after_records: credentials
            .tls_psk
            .is_some()
            .then_some(weft_proto::tls::ASK_AFTER_RECORDS),
        tls_psk: credentials.tls_psk,
        ..target.options.clone()
    };
    let address = member
        .peer_nvme
        .first()
        .or(member.nvme.first())
        .ok_or_else(|| format!("node {} advertises no NVMe/TCP address", target.name))?;
    let url = TargetUrl::parse(&format!("nvme-tcp://{address}/{}", target.nqn))
        .map_err(|e| e.to_string())?;
    Ok((url, options))
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
    let (url, options) = replica_url(target)?;
    let over = if options.tls_psk.is_some() {
        "over TLS"
    } else {
        "in the clear"
    };
    let controller = Controller::connect(&url, options, 1).map_err(|e| e.to_string())?;
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
    log::info!(
        "replica on node {}: linked {over} at epoch {} ({})",
        target.name,
        token.epoch.0,
        target.nqn
    );
    let mut intent = RegionSet::new(target.regions);
    for &region in written.regions.iter().filter(|&&r| r < target.regions) {
        intent.insert(region);
    }
    let reply = FromReplica::Fenced {
        token,
        intent,
        unclean: written.unclean,
    };
    Ok(Attached::Fenced(Box::new(Attachment {
        transfer_bytes_max: controller.info.transfer_bytes_max as usize,
        controller: Held(Some(controller)),
        queue,
        reply,
    })))
}
