//! One NVMe/TCP connection (= one NVMe queue) on the controller side, as a
//! deterministic state machine: bytes and time in, PDUs to send and block I/O
//! requests out. It owns PDU framing, digests, the per-command slots and the
//! queue's Fabrics state; it never touches a socket, a clock or a file.
//!
//! Driving it (the order matters):
//! 1. `handle_input(bytes, now, buffers)` with every byte received;
//! 2. `poll_io()` until `None`, executing each request and later reporting it
//!    with `handle_io_complete(slot, result, buffers)`;
//! 3. `poll_transmit()` to get what to send: inline header bytes and ranges of
//!    slot buffers, in order. When all of it has been sent, call
//!    `on_transmitted()`. Only one transmit is outstanding at a time;
//! 4. `poll_timeout()` for the next deadline and `handle_timeout(now)` at it
//!    (and periodically: I/O queues close when their controller goes away);
//! 5. once `is_closed()`, close the socket and call `on_closed()`.
//!
//! The connection serves its own snapshot of the target's configuration,
//! taken when it is created. When the configuration changes, the driver hands
//! the new snapshot to `update_config` and then drives the connection as
//! after any input (it may have a completion to send, or have ended).
//!
//! Every command slot has a data buffer that the driver owns (see
//! [`SlotBuffers`]), so data moves between the socket, the disk and the host
//! without passing through this crate's own memory.
//!
//! This file holds the state machine's interface, its command slots and
//! queue state; its jobs live beside it: `receive` (PDUs in), `commands`
//! (a command's transfer, execution and completion), `fabrics` (Connect
//! and authentication) and `fences` (the replica fence).

use crate::admin::{self, AdminQueue, Outcome};
use crate::auth::{ControllerExchange, CONNECT_AUTHREQ_ATR, SECP_DHCHAP, SPSP_DHCHAP};
use crate::command::{
    fctype, Command, ConnectCommand, ConnectData, DataDirection, SglKind, CONNECT_DATA_LEN,
};
use crate::digest::crc32c;
use crate::fence::{FenceToken, FENCE_ADMISSION_PATIENCE, FENCE_FEATURE};
use crate::framing::{DataLayout, DataTarget, Framer, Step};
use crate::identify::ControllerKind;
use crate::io::{self, IoError, IoKind, IoPlan, IoRequest};
use crate::pdu::{
    self, data_field_offset, digest_bits, field_offset, flags, CommonHeader, DataHeader,
    FatalErrorStatus, IcReq, IcResp, PduError, PduType, COMMON_HEADER_LEN, MAX_HEADER_LEN,
};
use crate::reservation::{
    CountedWrite, HostIdentifier, ReservationCell, ReservationCommand, ReservationView,
};
use crate::status::{Completion, Status};
use crate::target::{
    ControllerShared, Limits, NewController, RegistryError, SubsystemConfig, Target, TargetConfig,
    DISCOVERY_NQN,
};
use crate::transmit::Transmitter;
pub use crate::transmit::{Transmit, TxSegment};
use crate::types::{Cid, Nsid, SlotId, Timestamp};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The data buffers of a connection's command slots, owned by the driver.
pub trait SlotBuffers {
    /// The buffer of `slot`, at least [`Limits::slot_buffer_bytes`] long.
    fn buffer(&mut self, slot: SlotId) -> &mut [u8];

    /// Zeroes `range` of `slot`'s buffer. A driver whose buffers can give
    /// pages back (mmap) does, so that a reply of zeroes (a log page read
    /// past its end, up to the transfer limit) holds no memory.
    fn zero(&mut self, slot: SlotId, range: std::ops::Range<usize>) {
        self.buffer(slot)[range].fill(0);
    }
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Termination {
    /// The host broke the protocol; a C2HTermReq with this error was sent.
    Protocol(PduError),
    /// The host sent an H2CTermReq.
    HostTerminated,
    /// No Keep Alive within KATO: the controller was torn down.
    KeepAliveExpired,
    /// The queue's controller was torn down or reset.
    ControllerGone,
    /// The host sent a Fabrics Disconnect.
    Disconnected,
    /// The queue's subsystem left the target's configuration.
    SubsystemRemoved,
    /// The queue's host is no longer allowed to use its subsystem.
    AccessRevoked,
    /// No ICReq, or no completed Connect (and authentication, where the
    /// host must authenticate), within the setup deadline
    /// (`Limits::icreq_timeout_ms`, `Limits::connect_timeout_ms`).
    SetupTimeout,
}

/// Per-command state of a slot (cf. SPDK's `spdk_nvmf_tcp_req_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// Unused.
    Free,
    /// The capsule arrived; the command is being checked or executed synchronously.
    Received,
    /// The capsule's in-capsule data is arriving.
    ReceivingCapsuleData,
    /// An R2T was sent; H2CData is arriving.
    AwaitingH2cData,
    /// Block I/O is in flight.
    Executing,
    /// An Asynchronous Event Request waiting for an event.
    Parked,
    /// Data from the slot buffer is being sent.
    Transmitting,
}

#[derive(Debug)]
struct Slot {
    state: SlotState,
    command: Command,
    in_capsule_len: u32,
    h2c_received: u32,
    io_plan: Option<IoPlan>,
    /// Block I/O requests still in flight: one per namespace for a broadcast
    /// Flush, one per range for a Dataset Management.
    io_pending: usize,
    status: Status,
    /// Counted in its controller's fenced I/O on its way to the media.
    fenced: bool,
    /// A write counted in its namespace's reservation cell (see
    /// [`ReservationCell::enter_write`]).
    reserved: Option<(Arc<ReservationCell>, CountedWrite)>,
}

impl Slot {
    fn empty() -> Slot {
        Slot {
            state: SlotState::Free,
            command: Command::decode(&[0u8; 64]).expect("64 zero bytes are an SQE"),
            in_capsule_len: 0,
            h2c_received: 0,
            io_plan: None,
            io_pending: 0,
            status: Status::SUCCESS,
            fenced: false,
            reserved: None,
        }
    }
}

/// A fence Set Features waiting for the node to admit it (a record it has
/// not read yet) or for the other controllers' I/O to drain.
#[derive(Debug)]
struct FenceWait {
    slot: SlotId,
    check_at: Timestamp,
    /// Not admitted yet: its token, and when it is refused.
    unadmitted: Option<(FenceToken, Timestamp)>,
}

/// How often a waiting fence looks at the other controllers' I/O.
const FENCE_DRAIN_CHECK: Duration = Duration::from_millis(1);

/// How often a fence not admitted yet looks at the configuration again.
const FENCE_ADMISSION_CHECK: Duration = Duration::from_millis(10);

/// Per-queue state that exists once Connect succeeded.
#[derive(Debug)]
struct QueueInfo {
    qid: u16,
    entries: u16,
    sqhd: u16,
    sq_flow_disabled: bool,
    controller: Arc<ControllerShared>,
    /// DH-HMAC-CHAP state when the host must authenticate this queue.
    authentication: Option<Box<ControllerExchange>>,
}

impl QueueInfo {
    /// Whether the queue may carry commands other than Fabrics ones.
    fn authenticated(&self) -> bool {
        self.authentication
            .as_ref()
            .is_none_or(|exchange| exchange.is_authenticated())
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for ICReq.
    AwaitIcReq,
    /// Initialized; the first command must be a Fabrics Connect.
    AwaitConnect,
    /// An admin queue.
    Admin(QueueInfo, Box<AdminQueue>),
    /// An I/O queue.
    Io(QueueInfo, IoQueue),
    /// Ending: nothing more is received; pending transmissions drain.
    Closing,
}

#[derive(Debug)]
struct IoQueue {
    epoch: u32,
    /// Index of the queue's subsystem in the connection's configuration snapshot.
    subsystem: usize,
}

/// A controller-side NVMe/TCP connection.
#[derive(Debug)]
pub struct Connection {
    target: Arc<Target>,
    /// The configuration this connection serves (see [`Connection::update_config`]).
    config: Arc<TargetConfig>,
    limits: Limits,
    state: State,
    c2h_pdo_alignment: usize,
    rx: Framer,
    slots: Vec<Slot>,
    free_slots: Vec<u16>,
    /// The host's commands received whose completion has not been handed
    /// to the driver to send (so a host that stops reading its socket cannot
    /// pile up completions: it runs into its queue's entries).
    outstanding: u16,
    /// Of those, the completions queued in the batch not yet handed out.
    completions_queued: u16,
    io_requests: VecDeque<IoRequest>,
    tx: Transmitter,
    termination: Option<Termination>,
    dsm_ranges: Vec<(u64, u64)>,
    /// This queue's copy of the reservation state of its namespace (see
    /// [`ReservationCell`]), and the cell it is of.
    reservation_view: Option<(Arc<ReservationCell>, Option<ReservationView>)>,
    /// A Connect refused because the subsystem does not allow the host,
    /// until the driver takes it (to log how to allow the host).
    refused_host: Option<RefusedHost>,
    /// Until the queue is connected: when ICReq (then Connect) must have come.
    /// The clock starts at the first time the driver passes (ICReq) and at
    /// ICResp (Connect).
    setup_deadline: Option<Timestamp>,
    /// The controller whose fenced I/O this connection counts (an I/O queue
    /// of a fenced subsystem), kept after the queue closes: commands still
    /// executing count until the media answers.
    fence_controller: Option<Arc<ControllerShared>>,
    /// An admin queue's fence waiting for the previous holder to drain.
    fence_wait: Option<FenceWait>,
    /// The peer's address, when the driver gave it (see [`Connection::set_peer`]).
    peer: Option<std::net::IpAddr>,
    /// The PSK identity of the TLS stream the connection runs in, if any
    /// (see [`Connection::set_tls_identity`]).
    tls_identity: Option<crate::tls::psk::Identity>,
}

/// A host a subsystem refused at Connect (Connect Invalid Host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedHost {
    /// The subsystem asked for.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
}

impl Connection {
    /// A new connection to `target`, before ICReq, serving the target's
    /// current configuration. Until its Fabrics Connect it holds one command
    /// slot (a stranger's connection costs little); Connect allocates the
    /// queue's slots, sized by its entries, so that steady-state operation
    /// allocates nothing.
    pub fn new(target: Arc<Target>) -> Connection {
        let config = target.config();
        let limits = config.limits;
        Connection {
            target,
            config,
            limits,
            state: State::AwaitIcReq,
            c2h_pdo_alignment: 4,
            rx: Framer::new(),
            slots: vec![Slot::empty()],
            // Until Connect sets the queue size only slot 0 exists.
            free_slots: vec![0],
            outstanding: 0,
            completions_queued: 0,
            io_requests: VecDeque::new(),
            tx: Transmitter::with_capacity(1024, 16),
            termination: None,
            dsm_ranges: Vec::with_capacity(256),
            reservation_view: None,
            refused_host: None,
            tls_identity: None,
            setup_deadline: None,
            fence_controller: None,
            fence_wait: None,
            peer: None,
        }
    }

    /// The peer's address: a controller whose host must still authenticate
    /// counts against its address's limit
    /// ([`Limits::pending_authentications_per_address`]).
    pub fn set_peer(&mut self, address: std::net::IpAddr) {
        self.peer = Some(address);
    }

    /// The connection runs in a TLS stream established with `identity`'s
    /// PSK (before its ICReq): its Connects must name that identity's host
    /// and subsystem, and a host given a TLS PSK connects only so.
    pub fn set_tls_identity(&mut self, identity: crate::tls::psk::Identity) {
        self.tls_identity = Some(identity);
    }

    /// Feeds received bytes.
    pub fn handle_input(
        &mut self,
        mut input: &[u8],
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) {
        while !input.is_empty() && !matches!(self.state, State::Closing) {
            let (consumed, step) = self.rx.advance(input, buffers);
            input = &input[consumed..];
            if let Err(error) = self.on_step(step, now, buffers) {
                self.fail(error);
            }
        }
    }

    /// The next block I/O request to execute.
    pub fn poll_io(&mut self) -> Option<IoRequest> {
        self.io_requests.pop_front()
    }

    /// Reports the result of a block I/O request from [`Connection::poll_io`].
    pub fn handle_io_complete(
        &mut self,
        slot: SlotId,
        result: Result<(), IoError>,
        buffers: &mut impl SlotBuffers,
    ) {
        if matches!(self.state, State::Closing) {
            // The media answered: a fenced command no longer counts.
            let entry = &mut self.slots[usize::from(slot.0)];
            entry.io_pending = entry.io_pending.saturating_sub(1);
            if entry.io_pending == 0 {
                self.fenced_done(slot);
            }
            return;
        }
        let entry = &mut self.slots[usize::from(slot.0)];
        assert_eq!(
            entry.state,
            SlotState::Executing,
            "I/O completion for a slot that is not executing"
        );
        assert!(entry.io_pending > 0);
        entry.io_pending -= 1;
        let plan = entry.io_plan.expect("executing slots have a plan");
        if let Err(error) = result {
            if entry.status.is_success() {
                entry.status = io::status_of(
                    error,
                    matches!(plan, IoPlan::Read { .. } | IoPlan::Compare { .. }),
                );
            }
        }
        if entry.io_pending > 0 {
            return;
        }
        let status = entry.status;
        self.fenced_done(slot);
        self.count_io(plan, status);
        match plan {
            IoPlan::Read { len, .. } if status.is_success() => {
                self.complete(slot, status, 0, len, buffers)
            }
            IoPlan::Compare { len, .. } if status.is_success() => {
                let len = len as usize;
                let buffer = buffers.buffer(slot);
                let same = buffer[..len] == buffer[len..2 * len];
                let status = if same {
                    Status::SUCCESS
                } else {
                    Status::COMPARE_FAILURE
                };
                self.complete(slot, status, 0, 0, buffers)
            }
            _ => self.complete(slot, status, 0, 0, buffers),
        }
    }

    /// What to send next, if nothing is being sent.
    pub fn poll_transmit(&mut self) -> Option<Transmit<'_>> {
        if self.tx.ready() {
            // The completions in this batch are the host's from now on.
            self.outstanding -= self.completions_queued;
            self.completions_queued = 0;
        }
        self.tx.poll()
    }

    /// What the last [`Connection::poll_transmit`] handed out, until
    /// [`Connection::on_transmitted`] (for a driver that sends it in pieces).
    pub fn transmitting(&self) -> Option<Transmit<'_>> {
        self.tx.sending()
    }

    /// Everything from the last [`Connection::poll_transmit`] has been sent:
    /// the slots whose data it carried are free again.
    pub fn on_transmitted(&mut self) {
        let (slots, free_slots) = (&mut self.slots, &mut self.free_slots);
        self.tx.finish(|slot| release(slots, free_slots, slot));
    }

    /// The next time [`Connection::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        match &self.state {
            State::AwaitIcReq | State::AwaitConnect => self.setup_deadline,
            State::Admin(queue, admin) => [
                admin.keep_alive_deadline(),
                self.authentication_deadline(queue),
                self.fence_wait.as_ref().map(|wait| wait.check_at),
            ]
            .into_iter()
            .flatten()
            .min(),
            State::Io(queue, _) => self.authentication_deadline(queue),
            State::Closing => None,
        }
    }

    /// When a connected queue whose host must authenticate is closed unless
    /// it has by then: the Connect deadline covers DH-HMAC-CHAP too, or a
    /// peer that knows an allowed host NQN but not its secret could hold
    /// the subsystem's controllers.
    fn authentication_deadline(&self, queue: &QueueInfo) -> Option<Timestamp> {
        self.setup_deadline.filter(|_| !queue.authenticated())
    }

    /// Ends a queue that missed its ICReq, Connect or authentication
    /// deadline, expires the keep-alive timer, or notices that the
    /// controller went away.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        self.check_fence(now);
        let icreq_timeout = Duration::from_millis(u64::from(self.limits.icreq_timeout_ms));
        let ended = match &self.state {
            State::AwaitIcReq | State::AwaitConnect => {
                let deadline = *self.setup_deadline.get_or_insert(now.after(icreq_timeout));
                (now >= deadline).then_some(Termination::SetupTimeout)
            }
            State::Admin(queue, _) | State::Io(queue, _)
                if self
                    .authentication_deadline(queue)
                    .is_some_and(|deadline| now >= deadline) =>
            {
                Some(Termination::SetupTimeout)
            }
            State::Admin(_, admin) => admin
                .keep_alive_deadline()
                .is_some_and(|deadline| now >= deadline)
                .then_some(Termination::KeepAliveExpired),
            State::Io(queue, io) => {
                let gone = !queue.controller.is_alive() || queue.controller.epoch() != io.epoch;
                gone.then_some(Termination::ControllerGone)
            }
            _ => None,
        };
        if let Some(reason) = ended {
            self.end(reason);
        }
    }

    /// Whether the connection is finished: close the socket, then call [`Connection::on_closed`].
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closing) && self.tx.is_idle()
    }

    /// Why the connection ended, once it has.
    pub fn termination(&self) -> Option<&Termination> {
        self.termination.as_ref()
    }

    /// The socket is gone (closed by us or by the host): release the queue
    /// and, for an admin queue, tear the controller down.
    pub fn on_closed(&mut self) {
        let state = std::mem::replace(&mut self.state, State::Closing);
        self.release_queue(state);
    }

    /// The host a Connect on this connection was refused for (Connect Invalid
    /// Host), once; the driver logs how an operator would allow it.
    pub fn take_refused_host(&mut self) -> Option<RefusedHost> {
        self.refused_host.take()
    }

    /// Command slots the queue has (one until its Connect, then twice its
    /// entries): the slot IDs of its I/O requests are below it.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The controller ID, once connected.
    pub fn cntlid(&self) -> Option<u16> {
        match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => Some(queue.controller.cntlid.0),
            _ => None,
        }
    }

    /// For an I/O queue, the index of its subsystem in the configuration
    /// snapshot the connection serves (the latest given to
    /// [`Connection::update_config`]).
    pub fn subsystem_index(&self) -> Option<usize> {
        match &self.state {
            State::Io(_, io) => Some(io.subsystem),
            _ => None,
        }
    }

    /// Serves `config` from now on, in place of the previous snapshot. An I/O
    /// queue follows its subsystem to its new position in the list (and
    /// serves or fails I/O by the subsystem's new ANA state); the admin
    /// queue of an I/O controller records the namespaces that changed and,
    /// if the host enabled Namespace Attribute Notices, reports them through
    /// an Asynchronous Event Request, and likewise a change of the
    /// subsystem's ANA state if the host enabled ANA Change Notices. Both
    /// end when their subsystem is gone.
    /// The limits must not change (see [`Target::replace_config`]).
    pub fn update_config(&mut self, config: Arc<TargetConfig>) {
        debug_assert_eq!(config.limits, self.limits);
        let old = std::mem::replace(&mut self.config, config);
        if !self.follow_subsystem(&old) {
            self.end(Termination::SubsystemRemoved);
            return;
        }
        if !self.host_still_allowed() {
            self.end(Termination::AccessRevoked);
            return;
        }
        self.replan_awaiting_data();
        self.report_async_event();
    }

    /// Finds the queue's subsystem in the new snapshot; false if it is gone.
    fn follow_subsystem(&mut self, old: &TargetConfig) -> bool {
        match &mut self.state {
            State::Io(queue, io) => match self.config.subsystem_index(&queue.controller.subnqn) {
                Some(index) => {
                    io.subsystem = index;
                    true
                }
                None => false,
            },
            State::Admin(queue, admin) if admin.kind == ControllerKind::Io => {
                let nqn = &queue.controller.subnqn;
                let Some(new) = self.config.subsystem(nqn) else {
                    return false;
                };
                if let Some(old) = old.subsystem(nqn) {
                    admin.namespaces_changed(old, new);
                    admin.ana_changed(old, new);
                }
                true
            }
            State::Admin(_, admin) => {
                admin.discovery_changed(old, &self.config);
                true
            }
            _ => true,
        }
    }

    /// Whether the host of an I/O controller's queue may still use its subsystem.
    fn host_still_allowed(&self) -> bool {
        let queue = match &self.state {
            State::Io(queue, _) => queue,
            State::Admin(queue, admin) if admin.kind == ControllerKind::Io => queue,
            _ => return true,
        };
        self.config
            .subsystem(&queue.controller.subnqn)
            .is_some_and(|s| s.access.allows(&queue.controller.hostnqn))
    }

    /// Commands waiting for their data by R2T were checked against the old
    /// snapshot: checks them again, so that none reaches a namespace that is
    /// gone or blocks past the end of one that shrank. A command that fails
    /// completes with the error once its data has arrived.
    fn replan_awaiting_data(&mut self) {
        let State::Io(_, io) = &self.state else {
            return;
        };
        let subsystem = &self.config.subsystems[io.subsystem];
        let waiting = self
            .slots
            .iter_mut()
            .filter(|entry| entry.state == SlotState::AwaitingH2cData && entry.io_plan.is_some());
        for entry in waiting {
            match IoPlan::from_command(&entry.command, subsystem, self.limits.transfer_bytes_max) {
                Ok(plan) => entry.io_plan = Some(plan),
                Err(status) if entry.status.is_success() => entry.status = status,
                Err(_) => {}
            }
        }
    }

    /// Completes the oldest parked Asynchronous Event Requests with the
    /// events waiting to be reported, one each, while both exist (one update
    /// may raise a Namespace Attribute Changed and an ANA Change event).
    fn report_async_event(&mut self) {
        loop {
            let State::Admin(_, admin) = &mut self.state else {
                return;
            };
            if admin.parked_events.is_empty() {
                return;
            }
            let Some(event) = admin.take_async_event() else {
                return;
            };
            let slot = admin.parked_events.remove(0);
            self.respond(slot, Status::SUCCESS, u64::from(event));
        }
    }

    fn release_queue(&mut self, state: State) {
        self.fence_wait = None;
        match state {
            State::Admin(queue, _) => {
                self.target.fences.forget(&queue.controller);
                self.target.registry.remove(queue.controller.cntlid)
            }
            State::Io(queue, io) => queue.controller.release_io_queue(queue.qid, io.epoch),
            _ => {}
        }
    }

    /// Ends the connection without a TermReq.
    fn end(&mut self, reason: Termination) {
        if self.termination.is_none() {
            self.termination = Some(reason);
        }
        let state = std::mem::replace(&mut self.state, State::Closing);
        self.release_queue(state);
    }

    /// A fatal protocol error: send a C2HTermReq carrying the offending header, then close.
    fn fail(&mut self, error: PduError) {
        let mut out = [0u8; 24 + pdu::TERM_REQ_MAX_DATA];
        let len = pdu::encode_c2h_term_req(error, self.rx.header(), &mut out);
        self.tx.push_bytes(&out[..len]);
        self.end(Termination::Protocol(error));
    }
}

mod commands;
mod fabrics;
mod fences;
mod receive;
#[cfg(test)]
mod tests;

use commands::release;
use fences::is_fence_command;
