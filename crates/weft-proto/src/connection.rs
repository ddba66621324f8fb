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

use crate::admin::{self, AdminQueue, Outcome};
use crate::auth::{ControllerExchange, CONNECT_AUTHREQ_ATR, SECP_DHCHAP, SPSP_DHCHAP};
use crate::command::{
    fctype, Command, ConnectCommand, ConnectData, DataDirection, SglKind, CONNECT_DATA_LEN,
};
use crate::digest::crc32c;
use crate::fence::{FenceToken, FENCE_FEATURE};
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
    ControllerShared, Limits, RegistryError, SubsystemConfig, Target, TargetConfig, DISCOVERY_NQN,
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

/// A fence Set Features waiting for the other controllers' I/O to drain.
#[derive(Debug)]
struct FenceWait {
    slot: SlotId,
    check_at: Timestamp,
}

/// How often a waiting fence looks at the other controllers' I/O.
const FENCE_DRAIN_CHECK: Duration = Duration::from_millis(1);

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
    /// current configuration. Slots and queues are allocated here, sized by
    /// the target's limits, so that steady-state operation allocates nothing.
    pub fn new(target: Arc<Target>) -> Connection {
        let config = target.config();
        let limits = config.limits;
        let depth = limits.slots_per_queue();
        let empty_command = Command::decode(&[0u8; 64]).expect("64 zero bytes are an SQE");
        let slot = || Slot {
            state: SlotState::Free,
            command: empty_command,
            in_capsule_len: 0,
            h2c_received: 0,
            io_plan: None,
            io_pending: 0,
            status: Status::SUCCESS,
            fenced: false,
            reserved: None,
        };
        Connection {
            target,
            config,
            limits,
            state: State::AwaitIcReq,
            c2h_pdo_alignment: 4,
            rx: Framer::new(),
            slots: (0..depth).map(|_| slot()).collect(),
            // Until Connect sets the queue size only slot 0 exists.
            free_slots: vec![0],
            outstanding: 0,
            completions_queued: 0,
            io_requests: VecDeque::with_capacity(depth * 2),
            tx: Transmitter::with_capacity(16 * 1024, depth * 4),
            termination: None,
            dsm_ranges: Vec::with_capacity(256),
            reservation_view: None,
            refused_host: None,
            setup_deadline: None,
            fence_controller: None,
            fence_wait: None,
        }
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
        self.check_fence_drain(now);
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

    // ----- receiving -----

    fn on_step(
        &mut self,
        step: Step,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        match step {
            Step::NeedMore => Ok(()),
            Step::CommonHeader(common) => {
                let kind = self.check_common(&common)?;
                self.rx.expect_header(kind);
                Ok(())
            }
            Step::Header => {
                let (kind, _, data) = self.rx.parse_header(|kind| match kind {
                    PduType::CapsuleCmd => self.in_capsule_limit(),
                    _ => self.limits.h2c_data_bytes_max as usize,
                })?;
                self.dispatch(kind, data, now, buffers)?;
                let expects_data =
                    data.len > 0 && matches!(kind, PduType::CapsuleCmd | PduType::H2cData);
                if !expects_data && !matches!(self.state, State::Closing) {
                    self.rx.reset();
                }
                Ok(())
            }
            Step::Data { target, intact } => self.data_received(target, intact, now, buffers),
        }
    }

    /// Checks of the common header that do not need the rest of the header.
    fn check_common(&self, common: &CommonHeader) -> Result<PduType, PduError> {
        let kind =
            PduType::from_u8(common.pdu_type).ok_or(PduError::field(field_offset::PDU_TYPE))?;
        match (&self.state, kind) {
            (State::AwaitIcReq, PduType::IcReq) => {}
            (State::AwaitIcReq, _) | (_, PduType::IcReq) => {
                return Err(PduError::status(FatalErrorStatus::PduSequenceError))
            }
            (_, PduType::CapsuleCmd | PduType::H2cData | PduType::H2cTermReq) => {}
            // Controller-to-host PDU types are invalid from a host.
            _ => return Err(PduError::field(field_offset::PDU_TYPE)),
        }
        self.rx.check_common(common, kind)?;
        let header_total = kind.header_len() + self.rx.header_digest_len(kind);
        let plen = common.plen as usize;
        let plen_ok = match kind {
            PduType::IcReq => plen == 128,
            PduType::H2cTermReq => {
                (header_total..=24 + pdu::TERM_REQ_MAX_DATA + 24).contains(&plen)
            }
            _ => true,
        };
        if !plen_ok {
            return Err(PduError::field(field_offset::PLEN));
        }
        Ok(kind)
    }

    fn in_capsule_limit(&self) -> usize {
        let limit = match self.state {
            State::Admin(..) => self.limits.admin_in_capsule_bytes_max,
            State::Io(..) => self.limits.io_in_capsule_bytes_max,
            // Before Connect the queue type is unknown: Connect data is all that may come.
            _ => self
                .limits
                .admin_in_capsule_bytes_max
                .max(self.limits.io_in_capsule_bytes_max),
        };
        limit as usize
    }

    fn dispatch(
        &mut self,
        kind: PduType,
        data: DataLayout,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        match kind {
            PduType::IcReq => {
                let connect_timeout =
                    Duration::from_millis(u64::from(self.limits.connect_timeout_ms));
                self.setup_deadline = Some(now.after(connect_timeout));
                self.handle_icreq()
            }
            PduType::H2cTermReq => {
                self.end(Termination::HostTerminated);
                Ok(())
            }
            PduType::CapsuleCmd => self.handle_capsule(data, now, buffers),
            PduType::H2cData => self.handle_h2c_data(data),
            _ => unreachable!("rejected by check_common"),
        }
    }

    fn handle_icreq(&mut self) -> Result<(), PduError> {
        let request = IcReq::decode(self.rx.header())?;
        if request.pfv != 0 {
            return Err(PduError {
                status: FatalErrorStatus::UnsupportedParameter,
                field_offset: 8,
            });
        }
        // HPDA is 0's based in dwords, at most 31 (NVMe/TCP 1.0, Figure 20).
        if request.hpda > 31 {
            return Err(PduError::field(10));
        }
        self.c2h_pdo_alignment = (usize::from(request.hpda) + 1) * 4;
        let digest = request.digest & (digest_bits::HEADER | digest_bits::DATA);
        self.rx.header_digest = digest & digest_bits::HEADER != 0;
        self.rx.data_digest = digest & digest_bits::DATA != 0;
        let mut out = [0u8; 128];
        IcResp {
            pfv: 0,
            cpda: 0,
            digest,
            maxh2cdata: self.limits.h2c_data_bytes_max,
        }
        .encode(&mut out);
        self.tx.push_bytes(&out);
        self.state = State::AwaitConnect;
        Ok(())
    }

    fn handle_capsule(
        &mut self,
        data: DataLayout,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        let command = Command::decode(&self.rx.header()[COMMON_HEADER_LEN..])?;
        // A host may not have more commands outstanding than the queue has
        // entries (one, the Connect, before it connects); a command counts
        // until its completion is on its way to the host.
        let entries = match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => queue.entries,
            _ => 1,
        };
        if self.outstanding >= entries {
            return Err(PduError::status(FatalErrorStatus::PduSequenceError));
        }
        // Twice the entries: a completed read's slot stays taken until its
        // data is sent (see `Limits::slots_per_queue`); none is free only
        // for a host that does not read what it is sent.
        let slot = self
            .free_slots
            .pop()
            .ok_or(PduError::status(FatalErrorStatus::PduSequenceError))?;
        self.outstanding += 1;
        let slot = SlotId(slot);
        let entry = &mut self.slots[usize::from(slot.0)];
        debug_assert_eq!(entry.state, SlotState::Free);
        entry.command = command;
        entry.in_capsule_len = data.len as u32;
        entry.h2c_received = 0;
        entry.io_plan = None;
        entry.io_pending = 0;
        entry.status = Status::SUCCESS;
        entry.state = SlotState::Received;
        if data.len == 0 {
            return self.command_received(slot, now, buffers);
        }
        entry.state = SlotState::ReceivingCapsuleData;
        let target = DataTarget {
            slot,
            buffer_offset: 0,
            len: data.len,
            digest: data.digest,
            tag: true,
        };
        self.rx.expect_data(data.padding, target);
        Ok(())
    }

    fn handle_h2c_data(&mut self, data: DataLayout) -> Result<(), PduError> {
        let header = DataHeader::decode(self.rx.header())?;
        let entry = self
            .slots
            .get(usize::from(header.ttag))
            .filter(|entry| entry.state == SlotState::AwaitingH2cData)
            .ok_or(PduError::field(data_field_offset::TTAG))?;
        if entry.command.cid.0 != header.cccid {
            return Err(PduError::field(data_field_offset::CCCID));
        }
        if header.length as usize != data.len || data.len == 0 {
            return Err(PduError::field(data_field_offset::DATAL));
        }
        let end = u64::from(header.offset) + u64::from(header.length);
        if header.offset != entry.h2c_received || end > u64::from(entry.command.sgl.length) {
            return Err(PduError::status(FatalErrorStatus::DataTransferOutOfRange));
        }
        let target = DataTarget {
            slot: SlotId(header.ttag),
            buffer_offset: header.offset as usize,
            len: data.len,
            digest: data.digest,
            tag: false,
        };
        self.rx.expect_data(data.padding, target);
        Ok(())
    }

    /// All data of a capsule or H2CData PDU is in the slot buffer.
    fn data_received(
        &mut self,
        target: DataTarget,
        intact: bool,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        // The header stays in `rx` until the PDU is handled, so a fatal error can quote it.
        self.handle_data(target, intact, now, buffers)?;
        self.rx.reset();
        Ok(())
    }

    fn handle_data(
        &mut self,
        target: DataTarget,
        intact: bool,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        let slot = target.slot;
        let entry = &mut self.slots[usize::from(slot.0)];
        // A data digest error is not fatal: the command completes with Transient
        // Transport Error (NVMe/TCP 1.0, section 3.6.2.3) and the host may retry it.
        if !intact {
            entry.status = Status::TRANSIENT_TRANSPORT_ERROR;
        }
        // The tag marks in-capsule data.
        if target.tag {
            entry.state = SlotState::Received;
            if !intact {
                self.advance_sqhd();
                self.complete(slot, Status::TRANSIENT_TRANSPORT_ERROR, 0, 0, buffers);
                return Ok(());
            }
            return self.command_received(slot, now, buffers);
        }
        // Cannot overflow: handle_h2c_data let only data that ends within the
        // SGL length (a u32) through.
        entry.h2c_received += target.len as u32;
        if entry.h2c_received < entry.command.sgl.length {
            return Ok(());
        }
        let status = entry.status;
        if status.is_success() {
            self.execute(slot, now, buffers);
        } else {
            self.complete(slot, status, 0, 0, buffers);
        }
        Ok(())
    }

    // ----- commands -----

    fn advance_sqhd(&mut self) {
        if let State::Admin(queue, _) | State::Io(queue, _) = &mut self.state {
            // SQHD is below the queue's entries, a u16: the increment fits.
            queue.sqhd = (queue.sqhd + 1) % queue.entries;
        }
    }

    /// A command capsule is complete (with its in-capsule data, if any).
    fn command_received(
        &mut self,
        slot: SlotId,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        let command = self.slots[usize::from(slot.0)].command;
        if matches!(self.state, State::AwaitConnect)
            && !(command.is_fabrics() && command.fctype() == fctype::CONNECT)
        {
            return Err(PduError::status(FatalErrorStatus::PduSequenceError));
        }
        self.advance_sqhd();
        match self.prepare(slot) {
            Err(status) => self.complete(slot, status, 0, 0, buffers),
            Ok(Transfer::Ready) => self.execute(slot, now, buffers),
            Ok(Transfer::NeedData(len)) => self.request_data(slot, len),
        }
        Ok(())
    }

    /// Checks a command's data transfer and, on I/O queues, the command itself,
    /// before any data moves.
    fn prepare(&mut self, slot: SlotId) -> Result<Transfer, Status> {
        let entry = &self.slots[usize::from(slot.0)];
        let command = entry.command;
        if command.psdt() == 0 || command.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        if command.sgl.length as usize > self.limits.slot_buffer_bytes() {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        if let State::Admin(queue, _) | State::Io(queue, _) = &self.state {
            // Only Fabrics commands until the queue authenticated (NVMe Base
            // 2.0, section 8.13.1; nvmet answers the same).
            if !command.is_fabrics() && !queue.authenticated() {
                return Err(Status::AUTH_REQUIRED);
            }
        }
        let transfer = transfer_of(&command, entry.in_capsule_len)?;
        if let State::Io(queue, io) = &self.state {
            if !command.is_fabrics() {
                let subsystem = &self.config.subsystems[io.subsystem];
                let plan =
                    IoPlan::from_command(&command, subsystem, self.limits.transfer_bytes_max)?;
                // Only the fence holder's I/O runs (see crate::fence): refused
                // here at once, and checked again when it reaches the media.
                if subsystem.fenced && !queue.controller.holds_fence() {
                    return Err(Status::RESERVATION_CONFLICT);
                }
                self.slots[usize::from(slot.0)].io_plan = Some(plan);
            }
        }
        Ok(transfer)
    }

    /// Sends an R2T for the whole transfer: one outstanding R2T per command, within any MAXR2T.
    fn request_data(&mut self, slot: SlotId, len: u32) {
        let entry = &mut self.slots[usize::from(slot.0)];
        entry.state = SlotState::AwaitingH2cData;
        let r2t = DataHeader {
            cccid: entry.command.cid.0,
            ttag: slot.0,
            offset: 0,
            length: len,
        };
        let mut out = [0u8; 28];
        let header_len = pdu::encode_r2t(self.rx.header_digest, r2t, &mut out);
        self.tx.push_bytes(&out[..header_len]);
    }

    fn execute(&mut self, slot: SlotId, now: Timestamp, buffers: &mut impl SlotBuffers) {
        let command = self.slots[usize::from(slot.0)].command;
        let connected = matches!(self.state, State::Admin(..) | State::Io(..));
        if connected
            && command.is_fabrics()
            && matches!(command.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECEIVE)
        {
            let outcome = self.authentication_command(&command, buffers.buffer(slot));
            self.finish(slot, outcome, buffers);
            return;
        }
        match &mut self.state {
            State::AwaitConnect => {
                let outcome = self.connect(&command, buffers.buffer(slot), now);
                self.finish(slot, outcome, buffers);
            }
            State::Admin(..) if is_fence_command(&command) => self.fence(slot, &command, now),
            State::Admin(_, admin) => {
                let outcome =
                    admin::execute(admin, &self.config, &command, buffers.buffer(slot), now);
                self.finish(slot, outcome, buffers);
            }
            State::Io(..) if command.is_fabrics() => {
                let outcome = match command.fctype() {
                    fctype::DISCONNECT => {
                        self.complete(slot, Status::SUCCESS, 0, 0, buffers);
                        self.end(Termination::Disconnected);
                        return;
                    }
                    fctype::CONNECT => Outcome::Complete {
                        status: Status::COMMAND_SEQUENCE_ERROR,
                        result: 0,
                        reply_len: 0,
                    },
                    _ => Outcome::Complete {
                        status: Status::INVALID_OPCODE,
                        result: 0,
                        reply_len: 0,
                    },
                };
                self.finish(slot, outcome, buffers);
            }
            State::Io(..) => self.start_io(slot, buffers),
            State::AwaitIcReq | State::Closing => {
                unreachable!("commands are only received on initialized queues")
            }
        }
    }

    fn finish(&mut self, slot: SlotId, outcome: Outcome, buffers: &mut impl SlotBuffers) {
        match outcome {
            Outcome::Complete {
                status,
                result,
                reply_len,
            } => self.complete(slot, status, result, reply_len, buffers),
            Outcome::Parked => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                if let State::Admin(_, admin) = &mut self.state {
                    admin.parked_events.push(slot);
                }
            }
        }
    }

    fn start_io(&mut self, slot: SlotId, buffers: &mut impl SlotBuffers) {
        if !self.enter_fence(slot) {
            return self.complete(slot, Status::RESERVATION_CONFLICT, 0, 0, buffers);
        }
        let plan = self.slots[usize::from(slot.0)]
            .io_plan
            .expect("I/O commands are planned in prepare");
        match self.reservation_check(plan) {
            Ok(reserved) => self.slots[usize::from(slot.0)].reserved = reserved,
            Err(status) => return self.complete(slot, status, 0, 0, buffers),
        }
        let State::Io(queue, io_queue) = &self.state else {
            unreachable!("start_io on an I/O queue")
        };
        let host = HostIdentifier(queue.controller.host_id);
        let write_cache = queue.controller.write_cache_enabled.load(Ordering::Relaxed);
        let mut push =
            |nsid: Nsid, kind: IoKind| self.io_requests.push_back(IoRequest { slot, nsid, kind });
        let pending = match plan {
            IoPlan::Read { nsid, offset, len } => {
                push(
                    nsid,
                    IoKind::Read {
                        offset,
                        len,
                        buffer_offset: 0,
                    },
                );
                1
            }
            IoPlan::Write {
                nsid,
                offset,
                len,
                fua,
            } => {
                push(
                    nsid,
                    IoKind::Write {
                        offset,
                        len,
                        buffer_offset: 0,
                        fua: fua || !write_cache,
                    },
                );
                1
            }
            IoPlan::Compare { nsid, offset, len } => {
                push(
                    nsid,
                    IoKind::Read {
                        offset,
                        len,
                        buffer_offset: len,
                    },
                );
                1
            }
            IoPlan::Flush { nsid } if nsid == Nsid::BROADCAST => {
                let subsystem = &self.config.subsystems[io_queue.subsystem];
                for ns in &subsystem.namespaces {
                    push(ns.nsid, IoKind::Flush);
                }
                subsystem.namespaces.len()
            }
            IoPlan::Flush { nsid } => {
                push(nsid, IoKind::Flush);
                1
            }
            IoPlan::WriteZeroes {
                nsid,
                offset,
                len,
                deallocate,
                fua,
            } => {
                push(
                    nsid,
                    IoKind::WriteZeroes {
                        offset,
                        len,
                        deallocate,
                        fua,
                    },
                );
                1
            }
            IoPlan::DatasetManagement {
                nsid,
                ranges,
                deallocate,
            } => {
                if !deallocate {
                    // Only attribute hints: nothing to do.
                    0
                } else {
                    let subsystem = &self.config.subsystems[io_queue.subsystem];
                    let ns = subsystem
                        .namespace(nsid)
                        .expect("planned against this subsystem");
                    let data = &buffers.buffer(slot)[..usize::from(ranges) * io::DSM_RANGE_LEN];
                    if let Err(status) = io::dsm_ranges(data, ns, &mut self.dsm_ranges) {
                        self.complete(slot, status, 0, 0, buffers);
                        return;
                    }
                    for &(offset, len) in &self.dsm_ranges {
                        self.io_requests.push_back(IoRequest {
                            slot,
                            nsid,
                            kind: IoKind::Deallocate { offset, len },
                        });
                    }
                    self.dsm_ranges.len()
                }
            }
            IoPlan::Clean { regions } => {
                let subsystem = &self.config.subsystems[io_queue.subsystem];
                let intent = subsystem
                    .intent
                    .as_ref()
                    .expect("planned: it has an intent");
                let data = &buffers.buffer(slot)[..regions as usize * 4];
                intent.clean(crate::intent::clean_regions(data, regions));
                0
            }
            IoPlan::Snapshot { nsid, name_len } => {
                push(nsid, IoKind::Snapshot { name_len });
                1
            }
            IoPlan::Grow { nsid, size_bytes } => {
                push(nsid, IoKind::Grow { size_bytes });
                1
            }
            IoPlan::Reserve {
                nsid,
                opcode,
                cdw10,
            } => match ReservationCommand::decode(opcode, cdw10, buffers.buffer(slot)) {
                Ok(command) => {
                    push(nsid, IoKind::Reserve { host, command });
                    1
                }
                Err(status) => return self.complete(slot, status, 0, 0, buffers),
            },
            IoPlan::ReservationReport {
                nsid,
                len,
                extended,
            } => {
                let cell = self.config.subsystems[io_queue.subsystem]
                    .namespace(nsid)
                    .and_then(|ns| ns.reservations.as_ref())
                    .expect("planned: the namespace has reservations");
                // All NUMD dwords go to the host, zeroes past the structure.
                let out = &mut buffers.buffer(slot)[..len as usize];
                out.fill(0);
                return match cell.state().1.report(extended, out) {
                    Ok(_) => self.complete(slot, Status::SUCCESS, 0, len, buffers),
                    Err(status) => self.complete(slot, status, 0, 0, buffers),
                };
            }
        };
        if pending == 0 {
            self.complete(slot, Status::SUCCESS, 0, 0, buffers);
            return;
        }
        let entry = &mut self.slots[usize::from(slot.0)];
        entry.state = SlotState::Executing;
        entry.io_pending = pending;
    }

    /// Reservation Conflict if a reservation on the command's namespace
    /// (every namespace, for a Flush of all) keeps this host from it; the
    /// cell that counts it if it is a write counted there.
    fn reservation_check(
        &mut self,
        plan: IoPlan,
    ) -> Result<Option<(Arc<ReservationCell>, CountedWrite)>, Status> {
        let Some((nsid, access)) = plan.access() else {
            return Ok(None);
        };
        let State::Io(queue, io_queue) = &self.state else {
            return Ok(None);
        };
        let host = HostIdentifier(queue.controller.host_id);
        let cells = self.config.subsystems[io_queue.subsystem]
            .namespaces
            .iter()
            .filter(|ns| nsid == Nsid::BROADCAST || ns.nsid == nsid)
            .filter_map(|ns| ns.reservations.as_ref());
        let changes_data = matches!(
            plan,
            IoPlan::Write { .. }
                | IoPlan::WriteZeroes { .. }
                | IoPlan::DatasetManagement {
                    deallocate: true,
                    ..
                }
        );
        for cell in cells {
            // The queue's view of the cell (a queue serves one namespace
            // with reservations: a volume's).
            let view = match &mut self.reservation_view {
                Some((viewed, view)) if Arc::ptr_eq(viewed, cell) => view,
                other => &mut other.insert((Arc::clone(cell), None)).1,
            };
            if changes_data {
                // A data command has one namespace.
                return Ok(Some((Arc::clone(cell), cell.enter_write(view, host)?)));
            }
            cell.check(view, host, access)?;
        }
        Ok(None)
    }

    fn count_io(&self, plan: IoPlan, status: Status) {
        let State::Io(queue, _) = &self.state else {
            return;
        };
        if !status.is_success() {
            return;
        }
        let counters = &queue.controller.counters;
        match plan {
            IoPlan::Read { len, .. } => {
                counters.read_commands.fetch_add(1, Ordering::Relaxed);
                counters
                    .read_bytes
                    .fetch_add(u64::from(len), Ordering::Relaxed);
            }
            IoPlan::Write { len, .. } => {
                counters.write_commands.fetch_add(1, Ordering::Relaxed);
                counters
                    .written_bytes
                    .fetch_add(u64::from(len), Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Queues the completion (with C2HData first when there is data for the host).
    fn complete(
        &mut self,
        slot: SlotId,
        status: Status,
        result: u64,
        reply_len: u32,
        buffers: &mut impl SlotBuffers,
    ) {
        self.fenced_done(slot);
        let sq_flow_disabled = match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => queue.sq_flow_disabled,
            _ => false,
        };
        let entry = &self.slots[usize::from(slot.0)];
        let cid = entry.command.cid;
        let reply_len = reply_len.min(entry.command.sgl.length);
        if !status.is_success() || reply_len == 0 {
            self.respond(slot, status, result);
            return;
        }
        // With SQ flow control disabled the C2HData SUCCESS flag replaces the
        // CapsuleResp (NVMe/TCP 1.0, section 3.6.2.8).
        let last_flags = flags::LAST_PDU | if sq_flow_disabled { flags::SUCCESS } else { 0 };
        self.queue_c2h_data(slot, cid, reply_len, last_flags, buffers);
        // The slot is free again once its data has been sent; the command is
        // complete now (the host may send another once it has the data).
        self.slots[usize::from(slot.0)].state = SlotState::Transmitting;
        self.command_done();
        if !sq_flow_disabled {
            self.push_response(slot, status, result);
        }
    }

    /// Completes a command that sends no data: its CapsuleResp, and the slot is free.
    fn respond(&mut self, slot: SlotId, status: Status, result: u64) {
        self.fenced_done(slot);
        self.push_response(slot, status, result);
        self.release(slot);
        self.command_done();
    }

    /// One command of the host's is complete: its completion is queued,
    /// and stops counting against the host once handed out to be sent.
    fn command_done(&mut self) {
        debug_assert!(
            self.completions_queued < self.outstanding,
            "a command completed twice"
        );
        self.completions_queued += 1;
    }

    /// Queues the CapsuleResp of the command in `slot`.
    fn push_response(&mut self, slot: SlotId, status: Status, result: u64) {
        let (qid, sqhd) = match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => (queue.qid, queue.sqhd),
            _ => (0, 0),
        };
        let cid = self.slots[usize::from(slot.0)].command.cid;
        let cqe = Completion {
            result,
            sqhd,
            sqid: qid,
            cid,
            status,
        }
        .encode();
        let mut out = [0u8; 28];
        let len = pdu::encode_capsule_resp(self.rx.header_digest, &cqe, &mut out);
        self.tx.push_bytes(&out[..len]);
    }

    fn queue_c2h_data(
        &mut self,
        slot: SlotId,
        cid: Cid,
        len: u32,
        pdu_flags: u8,
        buffers: &mut impl SlotBuffers,
    ) {
        let header = DataHeader {
            cccid: cid.0,
            ttag: 0,
            offset: 0,
            length: len,
        };
        let mut out = [0u8; MAX_HEADER_LEN];
        let pdo = pdu::encode_data_pdu(
            PduType::C2hData,
            pdu_flags,
            self.rx.header_digest,
            self.rx.data_digest,
            self.c2h_pdo_alignment,
            header,
            &mut out,
        );
        self.tx.push_bytes(&out[..pdo]);
        self.tx.push_slot(slot, 0..len as usize);
        if self.rx.data_digest {
            let digest = crc32c(&buffers.buffer(slot)[..len as usize]);
            self.tx.push_bytes(&digest.to_le_bytes());
        }
    }

    fn release(&mut self, slot: SlotId) {
        release(&mut self.slots, &mut self.free_slots, slot);
    }

    // ----- Replica fence (see crate::fence) -----

    /// A fence Set Features: take the fence of this controller's subsystem,
    /// answering once no other controller's I/O is on its way to the media.
    fn fence(&mut self, slot: SlotId, command: &Command, now: Timestamp) {
        let State::Admin(queue, _) = &self.state else {
            unreachable!("fences are taken on admin queues")
        };
        let fenced = self
            .config
            .subsystem(&queue.controller.subnqn)
            .is_some_and(|s| s.fenced);
        if !fenced || !queue.controller.is_ready() {
            return self.respond(slot, Status::INVALID_FIELD, 0);
        }
        if self.fence_wait.is_some() {
            // One fence at a time per controller.
            return self.respond(slot, Status::COMMAND_SEQUENCE_ERROR, 0);
        }
        let token = FenceToken::from_cdws(command.cdw(11), command.cdw(12), command.cdw(13));
        let fences = &self.target.fences;
        match fences.fence(token, &queue.controller) {
            // The result carries the current epoch: the asker learns of a newer primary.
            Err(current) => self.respond(slot, Status::RESERVATION_CONFLICT, current.epoch),
            Ok(()) if fences.drained(&queue.controller) => self.respond(slot, Status::SUCCESS, 0),
            Ok(()) => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                self.fence_wait = Some(FenceWait {
                    slot,
                    check_at: now.after(FENCE_DRAIN_CHECK),
                });
            }
        }
    }

    /// Answers a waiting fence once the other controllers drained.
    fn check_fence_drain(&mut self, now: Timestamp) {
        let (Some(wait), State::Admin(queue, _)) = (&mut self.fence_wait, &self.state) else {
            return;
        };
        if !self.target.fences.drained(&queue.controller) {
            wait.check_at = now.after(FENCE_DRAIN_CHECK);
            return;
        }
        let slot = wait.slot;
        self.fence_wait = None;
        self.respond(slot, Status::SUCCESS, 0);
    }

    /// Counts slot `slot`'s command against its subsystem's fence as it
    /// goes to the media; false if the controller no longer holds the fence
    /// (the command must not run).
    fn enter_fence(&mut self, slot: SlotId) -> bool {
        let State::Io(queue, io) = &self.state else {
            return true;
        };
        if !self.config.subsystems[io.subsystem].fenced {
            return true;
        }
        let controller = &queue.controller;
        if self.fence_controller.is_none() {
            self.target.fences.join(controller);
            self.fence_controller = Some(Arc::clone(controller));
        }
        if !controller.fenced_io_enter() {
            return false;
        }
        self.slots[usize::from(slot.0)].fenced = true;
        true
    }

    /// Slot `slot`'s command no longer counts against a fence or a
    /// reservation (done, or never to run).
    fn fenced_done(&mut self, slot: SlotId) {
        let entry = &mut self.slots[usize::from(slot.0)];
        if let Some((cell, counted)) = entry.reserved.take() {
            cell.written(counted);
        }
        if std::mem::take(&mut entry.fenced) {
            if let Some(controller) = &self.fence_controller {
                controller.fenced_io_done();
            }
        }
    }

    // ----- Authentication -----

    /// Authentication Send/Receive (NVMe-oF 1.1, sections 3.5/3.6) on a
    /// queue whose host must authenticate.
    fn authentication_command(&mut self, command: &Command, buffer: &mut [u8]) -> Outcome {
        let (State::Admin(queue, _) | State::Io(queue, _)) = &mut self.state else {
            unreachable!("authentication commands are executed on connected queues")
        };
        let Some(exchange) = queue.authentication.as_mut() else {
            // This host has no secret here: there is nothing to authenticate.
            return Outcome::status(Status::COMMAND_SEQUENCE_ERROR);
        };
        // CDW10: SPSP0 (byte 41), SPSP1 (byte 42), SECP (byte 43); CDW11: TL or AL.
        let [_, spsp0, spsp1, secp] = command.cdw[0].to_le_bytes();
        let length = command.cdw[1];
        if secp != SECP_DHCHAP || spsp0 != SPSP_DHCHAP || spsp1 != SPSP_DHCHAP || length == 0 {
            return Outcome::status(Status::INVALID_FIELD);
        }
        if length != command.sgl.length {
            return Outcome::status(Status::SGL_LENGTH_INVALID);
        }
        // TL/AL equals the SGL length, which prepare bounded by the slot buffer.
        let buffer = &mut buffer[..length as usize];
        if command.fctype() == fctype::AUTH_SEND {
            exchange.on_send(buffer);
            return Outcome::status(Status::SUCCESS);
        }
        match exchange.on_receive(buffer, &*self.target.random) {
            Some(len) => Outcome::Complete {
                status: Status::SUCCESS,
                result: 0,
                reply_len: len as u32,
            },
            None => Outcome::status(Status::INVALID_FIELD),
        }
    }

    // ----- Fabrics Connect -----

    /// Fabrics Connect (NVMe-oF 1.1, section 3.3): creates an admin queue with
    /// a new controller, or an I/O queue of an existing one.
    fn connect(&mut self, command: &Command, buffer: &mut [u8], now: Timestamp) -> Outcome {
        match self.try_connect(command, buffer, now) {
            Ok(result) => Outcome::Complete {
                status: Status::SUCCESS,
                result: u64::from(result),
                reply_len: 0,
            },
            Err((status, result)) => {
                if status == Status::CONNECT_INVALID_HOST {
                    // Decoded before the refusal, so it decodes again.
                    self.refused_host =
                        ConnectData::decode(&buffer[..CONNECT_DATA_LEN])
                            .ok()
                            .map(|data| RefusedHost {
                                subnqn: data.subnqn,
                                hostnqn: data.hostnqn,
                            });
                }
                Outcome::Complete {
                    status,
                    result,
                    reply_len: 0,
                }
            }
        }
    }

    fn try_connect(
        &mut self,
        command: &Command,
        buffer: &mut [u8],
        now: Timestamp,
    ) -> Result<u32, (Status, u64)> {
        let connect = ConnectCommand::decode(command);
        if connect.recfmt != 0 {
            return Err((Status::CONNECT_INCOMPATIBLE_FORMAT, 0));
        }
        if command.sgl.length as usize != CONNECT_DATA_LEN {
            return Err((Status::SGL_LENGTH_INVALID, 0));
        }
        let data = ConnectData::decode(&buffer[..CONNECT_DATA_LEN])
            .map_err(|_| (Status::INTERNAL_ERROR, 0))?;
        let entries = u32::from(connect.sqsize) + 1;
        if connect.sqsize == 0 || entries > u32::from(self.limits.queue_entries_max) {
            return Err(invalid_sqe_field(44));
        }
        // At most queue_entries_max, a u16, as just checked.
        let entries = entries as u16;
        let sq_flow_disabled = connect.cattr & ConnectCommand::CATTR_DISABLE_SQ_FLOW != 0;
        let queue = if connect.qid == 0 {
            self.connect_admin(&data, connect, now)?
        } else {
            self.connect_io(&data, connect)?
        };
        // Discovery is not authenticated: it is not in the configuration's subsystems.
        let authentication = self
            .config
            .subsystem(&data.subnqn)
            .and_then(|subsystem| subsystem.access.keys_of(&data.hostnqn))
            .map(|keys| {
                Box::new(ControllerExchange::new(
                    Arc::clone(keys),
                    &data.hostnqn,
                    &data.subnqn,
                ))
            });
        let result_flags = if authentication.is_some() {
            CONNECT_AUTHREQ_ATR
        } else {
            0
        };
        let info = |controller| QueueInfo {
            qid: connect.qid,
            entries,
            sqhd: 1 % entries,
            sq_flow_disabled,
            controller,
            authentication,
        };
        let (cntlid, state) = match queue {
            NewQueue::Admin(controller, admin) => {
                (controller.cntlid.0, State::Admin(info(controller), admin))
            }
            NewQueue::Io(controller, io) => (controller.cntlid.0, State::Io(info(controller), io)),
        };
        self.state = state;
        // The queue now has its negotiated number of command slots (twice its
        // entries, see `Limits::slots_per_queue`); slot 0 holds this Connect.
        self.free_slots.clear();
        // At most 2 x 32768 - 1 (`Limits::QUEUE_ENTRIES_LIMIT`): a u16.
        self.free_slots
            .extend((1..2 * u32::from(entries)).rev().map(|slot| slot as u16));
        Ok(u32::from(cntlid) | result_flags)
    }

    fn connect_admin(
        &self,
        data: &ConnectData,
        connect: ConnectCommand,
        now: Timestamp,
    ) -> Result<NewQueue, (Status, u64)> {
        if data.cntlid != 0xFFFF {
            // Dynamic controller model: the host must ask for any controller.
            return Err(invalid_data_field(16));
        }
        let kind = if data.subnqn == DISCOVERY_NQN {
            ControllerKind::Discovery
        } else {
            let subsystem = self
                .config
                .subsystem(&data.subnqn)
                .ok_or(invalid_data_field(256))?;
            check_host_allowed(subsystem, data)?;
            ControllerKind::Io
        };
        let controller = self
            .target
            .registry
            .create(
                &data.subnqn,
                &data.hostnqn,
                data.host_id,
                self.limits.controllers_per_subsystem_max,
            )
            // As nvmet when it has no controller ID left: Controller Busy with DNR.
            .map_err(|_| {
                let busy = Status {
                    dnr: true,
                    ..Status::CONNECT_CONTROLLER_BUSY
                };
                (busy, 0)
            })?;
        let admin = AdminQueue::new(Arc::clone(&controller), kind, connect.kato_ms, now);
        Ok(NewQueue::Admin(controller, Box::new(admin)))
    }

    fn connect_io(
        &self,
        data: &ConnectData,
        connect: ConnectCommand,
    ) -> Result<NewQueue, (Status, u64)> {
        let subsystem = self
            .config
            .subsystem_index(&data.subnqn)
            .ok_or(invalid_data_field(256))?;
        check_host_allowed(&self.config.subsystems[subsystem], data)?;
        let controller = self
            .target
            .registry
            .find(&data.subnqn, data.cntlid, &data.hostnqn, data.host_id)
            .map_err(|error| match error {
                RegistryError::UnknownController
                | RegistryError::Exhausted
                | RegistryError::SubsystemFull => invalid_data_field(16),
            })?;
        if !controller.is_ready() {
            return Err((Status::COMMAND_SEQUENCE_ERROR, 0));
        }
        if u32::from(connect.qid) > controller.io_queues_granted() {
            return Err(invalid_sqe_field(42));
        }
        if !controller.claim_io_queue(connect.qid) {
            return Err((Status::CONNECT_CONTROLLER_BUSY, 0));
        }
        let io = IoQueue {
            epoch: controller.epoch(),
            subsystem,
        };
        Ok(NewQueue::Io(controller, io))
    }
}

/// A queue a successful Connect creates.
enum NewQueue {
    Admin(Arc<ControllerShared>, Box<AdminQueue>),
    Io(Arc<ControllerShared>, IoQueue),
}

/// Returns a slot to the free list.
fn release(slots: &mut [Slot], free_slots: &mut Vec<u16>, slot: SlotId) {
    let entry = &mut slots[usize::from(slot.0)];
    debug_assert_ne!(entry.state, SlotState::Free, "slot released twice");
    entry.state = SlotState::Free;
    free_slots.push(slot.0);
}

/// Whether `command` is weft's replica fence (Set Features, FID C0h).
fn is_fence_command(command: &Command) -> bool {
    !command.is_fabrics()
        && command.opcode == crate::command::admin_opcode::SET_FEATURES
        && command.cdw(10) as u8 == FENCE_FEATURE
}

/// Refuses a host the subsystem does not allow with Connect Invalid Host,
/// pointing at the Host NQN in the Connect data (NVMe-oF 1.1, section 3.3,
/// Figure 21; Linux nvmet answers the same).
fn check_host_allowed(
    subsystem: &SubsystemConfig,
    data: &ConnectData,
) -> Result<(), (Status, u64)> {
    if subsystem.access.allows(&data.hostnqn) {
        Ok(())
    } else {
        Err((Status::CONNECT_INVALID_HOST, (1 << 16) | 512))
    }
}

/// Connect Invalid Parameters in the SQE at byte `offset` (IATTR 0).
fn invalid_sqe_field(offset: u64) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, offset)
}

/// Connect Invalid Parameters in the Connect data at byte `offset` (IATTR 1).
fn invalid_data_field(offset: u64) -> (Status, u64) {
    (Status::CONNECT_INVALID_PARAMETERS, (1 << 16) | offset)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transfer {
    /// Everything the command needs is here.
    Ready,
    /// The command's data must be requested with an R2T.
    NeedData(u32),
}

/// How a command's data arrives, from its direction and SGL (NVMe/TCP 1.0, section 3.3).
fn transfer_of(command: &Command, in_capsule_len: u32) -> Result<Transfer, Status> {
    let sgl = command.sgl;
    match command.direction() {
        DataDirection::HostToController => match sgl.kind {
            SglKind::InCapsule if sgl.address != 0 => Err(Status::SGL_OFFSET_INVALID),
            SglKind::InCapsule if sgl.length != in_capsule_len => Err(Status::SGL_LENGTH_INVALID),
            SglKind::InCapsule => Ok(Transfer::Ready),
            SglKind::Transport if in_capsule_len != 0 => Err(Status::SGL_LENGTH_INVALID),
            SglKind::Transport if sgl.length == 0 => Ok(Transfer::Ready),
            SglKind::Transport => Ok(Transfer::NeedData(sgl.length)),
            SglKind::Unsupported(_) => Err(Status::SGL_TYPE_INVALID),
        },
        DataDirection::None | DataDirection::ControllerToHost => {
            if in_capsule_len != 0 {
                Err(Status::INVALID_FIELD)
            } else if sgl.length > 0 && sgl.kind != SglKind::Transport {
                Err(Status::SGL_TYPE_INVALID)
            } else {
                Ok(Transfer::Ready)
            }
        }
        DataDirection::Bidirectional => Err(Status::INVALID_OPCODE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ana::{AnaConfig, AnaGroupId, AnaState};
    use crate::auth::{DhchapSecret, FailureReason, HostAuthError, HostKeys};
    use crate::command::{admin_opcode, io_opcode};
    use crate::pdu::PduType;
    use crate::target::{AddressFamily, AllowedHost, HostAccess, ListenerConfig};
    use crate::testing::*;
    use crate::wire::{ascii_field, hex};
    use std::time::Duration;

    /// An admin queue (kept alive) and a second I/O queue of SQSIZE 3: four entries.
    fn queue_of_four_entries(target: &Arc<Target>) -> (Pair, Pair) {
        let (mut admin, _) = ready_io_queue(target);
        let cntlid = admin.connection.cntlid().unwrap();
        let _ = admin.simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false));
        let mut io = Pair::new(target);
        assert_eq!(io.connect_io(cntlid, 2, 3).status(), Status::SUCCESS);
        (admin, io)
    }

    fn ready_io_queue(target: &Arc<Target>) -> (Pair, Pair) {
        let mut admin = Pair::new(target);
        let cntlid = admin.connect_admin(TEST_NQN, 5000);
        let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
        set_cdw(&mut queues, 10, 0x07);
        set_cdw(&mut queues, 11, 0x0001_0001);
        let response = admin.simple(&queues);
        assert_eq!(response.status(), Status::SUCCESS);
        let mut io = Pair::new(target);
        let connected = io.connect_io(cntlid, 1, 127);
        assert_eq!(connected.status(), Status::SUCCESS);
        (admin, io)
    }

    #[test]
    fn admin_connect_properties_and_identify() {
        let target = test_target();
        let mut host = Pair::new(&target);
        let cntlid = host.connect_admin(TEST_NQN, 5000);
        assert!(cntlid >= 1);
        let cap = host.simple(&property_get(4, 0)).result();
        assert_eq!(cap & 0xFFFF, 127, "MQES");
        assert_eq!((cap >> 37) & 1, 1, "NVM command set");
        assert_eq!(
            host.simple(&property_get(5, 0x1C)).result() & 1,
            1,
            "CSTS.RDY after CC.EN"
        );
        let (data, response) = host.read_data(&identify(6, 1, 0));
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(data.len(), 4096);
        assert_eq!(ascii_field(&data[768..1024]), TEST_NQN);
        assert_eq!(ascii_field(&data[24..64]), "weft");
        assert_eq!(u16::from_le_bytes([data[78], data[79]]), cntlid);
        assert_eq!(
            u32::from_le_bytes(data[516..520].try_into().unwrap()),
            2,
            "NN"
        );
        let (list, _) = host.read_data(&identify(7, 2, 0));
        assert_eq!(&list[..12], &hex("01000000 02000000 00000000")[..]);
        let (ns, _) = host.read_data(&identify(8, 0, 2));
        assert_eq!(u64::from_le_bytes(ns[0..8].try_into().unwrap()), 256);
        assert_eq!(ns[130], 12, "LBADS of namespace 2");
        let (inactive, response) = host.read_data(&identify(9, 0, 9));
        assert_eq!(response.status(), Status::SUCCESS);
        assert!(
            inactive.iter().all(|&b| b == 0),
            "inactive NSIDs read as zeroes"
        );
        let (descriptors, _) = host.read_data(&identify(10, 3, 1));
        assert_eq!(&descriptors[12..16], &[2, 16, 0, 0]);
        assert_eq!(
            host.simple(&identify(11, 0x7F, 0)).status(),
            Status::INVALID_FIELD
        );
    }

    #[test]
    fn features_and_log_pages() {
        let target = test_target();
        let mut host = Pair::new(&target);
        host.connect_admin(TEST_NQN, 5000);
        let mut get_kato = sqe(admin_opcode::GET_FEATURES, 3, 0, 0, false);
        set_cdw(&mut get_kato, 10, 0x0F);
        assert_eq!(host.simple(&get_kato).result(), 5000);
        let mut saveable = sqe(admin_opcode::SET_FEATURES, 4, 0, 0, false);
        set_cdw(&mut saveable, 10, 0x8000_000B);
        assert_eq!(
            host.simple(&saveable).status(),
            Status::FEATURE_NOT_SAVEABLE
        );
        let (smart, response) = host.read_data(&get_log_page(5, 0x02, 512, 0));
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(smart[3], 100, "available spare");
        let (firmware, _) = host.read_data(&get_log_page(6, 0x03, 512, 0));
        assert_eq!(ascii_field(&firmware[8..16]), "0.1.0");
        assert_eq!(
            host.simple(&get_log_page(7, 0x70, 1024, 0)).status(),
            Status::INVALID_LOG_PAGE
        );
        assert_eq!(
            host.simple(&get_log_page(8, 0xC0, 512, 0)).status(),
            Status::INVALID_LOG_PAGE
        );
        let mut mismatched = get_log_page(9, 0x02, 512, 0);
        mismatched[32..36].copy_from_slice(&4096u32.to_le_bytes());
        assert_eq!(
            host.simple(&mismatched).status(),
            Status::SGL_LENGTH_INVALID
        );
        let ka = host.simple(&sqe(admin_opcode::KEEP_ALIVE, 10, 0, 0, false));
        assert_eq!(ka.status(), Status::SUCCESS);
        assert_eq!(ka.cid(), 10);
    }

    #[test]
    fn discovery_log_lists_subsystems_and_windows() {
        let target = test_target();
        let mut host = Pair::new(&target);
        host.connect_admin(DISCOVERY_NQN, 0);
        let (header, response) = host.read_data(&get_log_page(3, 0x70, 1024, 0));
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(
            u64::from_le_bytes(header[8..16].try_into().unwrap()),
            2,
            "the subsystem and the discovery subsystem"
        );
        let (page, _) = host.read_data(&get_log_page(4, 0x70, 3072, 0));
        assert_eq!(ascii_field(&page[1024 + 256..1024 + 512]), TEST_NQN);
        assert_eq!(page[1024 + 2], 2, "NVM subsystem");
        assert_eq!(ascii_field(&page[2048 + 256..2048 + 512]), DISCOVERY_NQN);
        let (second, _) = host.read_data(&get_log_page(5, 0x70, 1024, 2048));
        assert_eq!(
            &second[..],
            &page[2048..3072],
            "a window at an offset is the same bytes"
        );
        let (controller, _) = host.read_data(&identify(6, 1, 0));
        assert_eq!(controller[111], 2, "CNTRLTYPE discovery");
        assert_eq!(
            host.simple(&identify(7, 0, 1)).status(),
            Status::INVALID_FIELD
        );
    }

    #[test]
    fn reads_and_writes_in_capsule_and_by_r2t() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        let block: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let write = rw(io_opcode::WRITE, 1, 2, 3, 1, 4096, true);
        let response = io.command(&write, &block).pop().unwrap();
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(&io.disks[&2][3 * 4096..4 * 4096], &block[..]);
        let (read, response) = io.read_data(&rw(io_opcode::READ, 2, 2, 3, 1, 4096, false));
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(read, block);
        // 64 KiB by R2T, arriving as four H2CData PDUs of 16 KiB.
        let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
        let response = io.write_r2t(
            &rw(io_opcode::WRITE, 3, 1, 10, 128, 65536, false),
            &big,
            16384,
        );
        assert_eq!(response.status(), Status::SUCCESS);
        let (read, _) = io.read_data(&rw(io_opcode::READ, 4, 1, 10, 128, 65536, false));
        assert_eq!(read, big);
        let compare_same = io
            .command(&rw(io_opcode::COMPARE, 5, 2, 3, 1, 4096, true), &block)
            .pop()
            .unwrap();
        assert_eq!(compare_same.status(), Status::SUCCESS);
        let compare_other = io
            .command(&rw(io_opcode::COMPARE, 6, 2, 4, 1, 4096, true), &block)
            .pop()
            .unwrap();
        assert_eq!(compare_other.status(), Status::COMPARE_FAILURE);
        let mut zeroes = rw(io_opcode::WRITE_ZEROES, 7, 2, 3, 1, 0, false);
        set_cdw(&mut zeroes, 12, 1 << 25);
        assert_eq!(io.simple(&zeroes).status(), Status::SUCCESS);
        assert!(io.disks[&2][3 * 4096..4 * 4096].iter().all(|&b| b == 0));
        let flush = io.simple(&sqe(io_opcode::FLUSH, 8, 0xFFFF_FFFF, 0, false));
        assert_eq!(flush.status(), Status::SUCCESS);
    }

    #[test]
    fn dataset_management_deallocates_ranges() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        io.disks.get_mut(&1).unwrap().fill(0xAA);
        let ranges = hex("00000000 02000000 0400000000000000  00000000 01000000 1000000000000000");
        let mut dsm = sqe(io_opcode::DATASET_MANAGEMENT, 1, 1, 32, true);
        set_cdw(&mut dsm, 10, 1);
        set_cdw(&mut dsm, 11, 1 << 2);
        let response = io.command(&dsm, &ranges).pop().unwrap();
        assert_eq!(response.status(), Status::SUCCESS);
        let disk = &io.disks[&1];
        assert!(disk[4 * 512..6 * 512].iter().all(|&b| b == 0));
        assert!(disk[16 * 512..17 * 512].iter().all(|&b| b == 0));
        assert_eq!(disk[6 * 512], 0xAA);
    }

    #[test]
    fn invalid_commands_get_the_spec_status_and_the_queue_carries_on() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        let beyond = io.simple(&rw(io_opcode::READ, 1, 1, 511, 2, 1024, false));
        assert_eq!(beyond.status(), Status::LBA_OUT_OF_RANGE);
        assert_eq!(
            io.simple(&rw(io_opcode::READ, 2, 7, 0, 1, 512, false))
                .status(),
            Status::INVALID_NAMESPACE
        );
        assert_eq!(
            io.simple(&sqe(0x7C, 3, 1, 0, false)).status(),
            Status::INVALID_OPCODE
        );
        let mut prp = rw(io_opcode::READ, 4, 1, 0, 1, 512, false);
        prp[1] = 0;
        assert_eq!(io.simple(&prp).status(), Status::INVALID_FIELD);
        // A write whose SGL promises more than the command transfers.
        let short = io
            .command(&rw(io_opcode::WRITE, 5, 1, 0, 1, 1024, true), &[0u8; 1024])
            .pop()
            .unwrap();
        assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
        let (_, response) = io.read_data(&rw(io_opcode::READ, 6, 1, 0, 1, 512, false));
        assert_eq!(response.status(), Status::SUCCESS);
    }

    #[test]
    fn digests_protect_headers_and_data() {
        let target = test_target();
        let mut admin = Pair::new(&target);
        admin.header_digest = true;
        admin.data_digest = true;
        let cntlid = admin.connect_admin(TEST_NQN, 5000);
        let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
        set_cdw(&mut queues, 10, 0x07);
        assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);
        let mut io = Pair::new(&target);
        io.header_digest = true;
        io.data_digest = true;
        assert_eq!(io.connect_io(cntlid, 1, 63).status(), Status::SUCCESS);
        let data = vec![0x5Au8; 8192];
        let response = io.write_r2t(&rw(io_opcode::WRITE, 1, 2, 0, 2, 8192, false), &data, 4096);
        assert_eq!(response.status(), Status::SUCCESS);
        let (read, _) = io.read_data(&rw(io_opcode::READ, 2, 2, 0, 2, 8192, false));
        assert_eq!(read, data, "C2HData digest verified by the host model");
        // A corrupted data digest fails only that command, with a retryable status.
        let mut capsule = io.capsule(&rw(io_opcode::WRITE, 3, 2, 5, 1, 4096, true), &[1u8; 4096]);
        let last = capsule.len() - 1;
        capsule[last] ^= 0xFF;
        io.send(&capsule);
        let response = io.expect();
        assert_eq!(response.status(), Status::TRANSIENT_TRANSPORT_ERROR);
        assert!(
            io.disks[&2][5 * 4096..6 * 4096].iter().all(|&b| b == 0),
            "nothing written"
        );
        // A corrupted header digest is fatal.
        let mut capsule = io.capsule(&rw(io_opcode::READ, 4, 2, 0, 1, 4096, false), &[]);
        capsule[72] ^= 0xFF;
        io.send(&capsule);
        let term = io.expect();
        assert_eq!(
            term.fatal_status(),
            FatalErrorStatus::HeaderDigestError as u16
        );
        assert!(io.connection.is_closed());
    }

    /// A socket that never sends ICReq holds buffers for nothing: closed at
    /// the ICReq deadline, counted from the first time the driver passes.
    #[test]
    fn a_silent_socket_is_closed_at_the_icreq_deadline() {
        let target = test_target();
        let mut host = Pair::new(&target);
        host.advance(Duration::ZERO);
        assert_eq!(
            host.connection.poll_timeout(),
            Some(Timestamp(Duration::from_secs(10)))
        );
        host.advance(Duration::from_millis(9_999));
        assert!(!host.connection.is_closed());
        host.advance(Duration::from_millis(1));
        assert!(host.connection.is_closed());
        assert_eq!(
            host.connection.termination(),
            Some(&Termination::SetupTimeout)
        );
    }

    /// After ICResp the queue must connect within its deadline; once
    /// connected, the setup deadline no longer applies.
    #[test]
    fn connect_must_follow_icresp_within_its_deadline() {
        let target = test_target();
        let mut slow = Pair::new(&target);
        slow.advance(Duration::from_secs(5));
        slow.initialize(false, false);
        slow.advance(Duration::from_millis(9_999));
        assert!(
            !slow.connection.is_closed(),
            "10 s from ICResp, not from accept"
        );
        slow.advance(Duration::from_millis(1));
        assert_eq!(
            slow.connection.termination(),
            Some(&Termination::SetupTimeout)
        );
        let mut prompt = Pair::new(&target);
        prompt.advance(Duration::ZERO);
        prompt.connect_admin(TEST_NQN, 0);
        prompt.advance(Duration::from_secs(60));
        assert!(!prompt.connection.is_closed());
    }

    /// A subsystem has at most `controllers_per_subsystem_max` controllers;
    /// one more is refused as nvmet refuses when it has no controller ID left.
    #[test]
    fn controllers_per_subsystem_are_limited() {
        let mut config = TargetConfig::clone(&test_target().config());
        config.limits.controllers_per_subsystem_max = 2;
        let target = Target::new(config, Arc::clone(&test_target().random));
        let mut first = Pair::new(&target);
        first.connect_admin(TEST_NQN, 0);
        let mut second = Pair::new(&target);
        second.connect_admin(TEST_NQN, 0);
        let mut third = Pair::new(&target);
        third.initialize(false, false);
        let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
        let response = third.command(&sqe, &data).pop().unwrap();
        assert_eq!(
            response.status(),
            Status {
                dnr: true,
                ..Status::CONNECT_CONTROLLER_BUSY
            }
        );
        // Discovery counts on its own.
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        first.connection.on_closed();
        let mut again = Pair::new(&target);
        again.connect_admin(TEST_NQN, 0);
    }

    #[test]
    fn keep_alive_expiry_tears_the_controller_down() {
        let target = test_target();
        let (mut admin, mut io) = ready_io_queue(&target);
        admin.advance(Duration::from_millis(4000));
        assert_eq!(
            admin
                .simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false))
                .status(),
            Status::SUCCESS
        );
        admin.advance(Duration::from_millis(4000));
        assert!(
            !admin.connection.is_closed(),
            "the Keep Alive restarted the timer"
        );
        admin.advance(Duration::from_millis(1001));
        assert!(
            !admin.connection.is_closed(),
            "KATO (5 s) passed: the timer's granule (1 s) is slack"
        );
        admin.advance(Duration::from_millis(1000));
        assert!(admin.connection.is_closed());
        assert_eq!(
            admin.connection.termination(),
            Some(&Termination::KeepAliveExpired)
        );
        assert!(target.registry.is_empty());
        io.advance(Duration::from_millis(250));
        assert_eq!(
            io.connection.termination(),
            Some(&Termination::ControllerGone)
        );
    }

    #[test]
    fn connect_errors_name_the_parameter() {
        let target = test_target();
        let mut host = Pair::new(&target);
        host.initialize(false, false);
        let (command, data) = connect_command(1, 0, 31, 0, 0xFFFF, "nqn.2026-11.io.weft:missing");
        let response = host.command(&command, &data).pop().unwrap();
        assert_eq!(response.status(), Status::CONNECT_INVALID_PARAMETERS);
        assert_eq!(
            response.result(),
            (1 << 16) | 256,
            "IATTR data, offset of SUBNQN"
        );
        let (command, data) = connect_command(2, 0, 200, 0, 0xFFFF, TEST_NQN);
        let response = host.command(&command, &data).pop().unwrap();
        assert_eq!(response.result(), 44, "offset of SQSIZE in the SQE");
        let mut io = Pair::new(&target);
        assert_eq!(
            io.connect_io(77, 1, 31).status(),
            Status::CONNECT_INVALID_PARAMETERS
        );
        let (admin, _) = ready_io_queue(&target);
        let cntlid = admin.connection.cntlid().unwrap();
        let mut beyond = Pair::new(&target);
        assert_eq!(
            beyond.connect_io(cntlid, 65, 31).result(),
            42,
            "qid beyond the granted queues"
        );
        let mut twice = Pair::new(&target);
        assert_eq!(
            twice.connect_io(cntlid, 1, 31).status(),
            Status::CONNECT_CONTROLLER_BUSY
        );
    }

    #[test]
    fn sq_flow_control_disabled_uses_the_success_flag() {
        let target = test_target();
        let (mut admin, _) = ready_io_queue(&target);
        let cntlid = admin.connection.cntlid().unwrap();
        let _ = admin.simple(&sqe(admin_opcode::KEEP_ALIVE, 9, 0, 0, false));
        let mut io = Pair::new(&target);
        io.initialize(false, false);
        let (mut command, data) = connect_command(1, 2, 31, 0, cntlid, TEST_NQN);
        command[46] = ConnectCommand::CATTR_DISABLE_SQ_FLOW;
        assert_eq!(
            io.command(&command, &data).pop().unwrap().status(),
            Status::SUCCESS
        );
        io.send(&io.capsule(&rw(io_opcode::READ, 2, 1, 0, 1, 512, false), &[]));
        let pdu = io.expect();
        assert_eq!(pdu.pdu_type, PduType::C2hData as u8);
        assert_eq!(
            pdu.flags & (flags::SUCCESS | flags::LAST_PDU),
            flags::SUCCESS | flags::LAST_PDU
        );
        assert!(
            io.receive().is_none(),
            "no CapsuleResp after a SUCCESS C2HData"
        );
    }

    /// Sends `bytes` on a fresh connection (after ICReq, and Connect if `connected`)
    /// and returns the C2HTermReq's FES and FEI.
    fn term_req_for(connected: bool, initialized: bool, bytes: &[u8]) -> (u16, u32) {
        let target = test_target();
        let mut host = Pair::new(&target);
        if connected {
            host.connect_admin(TEST_NQN, 0);
        } else if initialized {
            host.initialize(false, false);
        }
        host.send(bytes);
        let term = host.expect();
        assert!(
            host.connection.is_closed(),
            "a fatal error closes the connection"
        );
        (
            term.fatal_status(),
            u32::from_le_bytes(term.header[10..14].try_into().unwrap()),
        )
    }

    #[test]
    fn malformed_pdus_end_the_connection_with_the_right_status() {
        let capsule_header = |hlen: u8, pdo: u8, plen: u32, pdu_flags: u8| {
            let mut pdu = vec![0x04, pdu_flags, hlen, pdo];
            pdu.extend_from_slice(&plen.to_le_bytes());
            pdu.resize(plen.max(72) as usize, 0);
            pdu
        };
        let identify_capsule = {
            let mut pdu = vec![0x04, 0, 72, 0, 72, 0, 0, 0];
            pdu.extend_from_slice(&identify(1, 1, 0));
            pdu
        };
        let mut icreq = [0u8; 128];
        IcReq {
            pfv: 0,
            hpda: 0,
            digest: 0,
            maxr2t: 0,
        }
        .encode(&mut icreq);
        let mut bad_pfv = icreq;
        bad_pfv[8] = 1;
        let h2c_unknown = {
            let mut pdu = vec![0x06, 0x04, 24, 24];
            pdu.extend_from_slice(&(24u32 + 512).to_le_bytes());
            pdu.extend_from_slice(&hex("0100 0500 00000000 00020000 00000000"));
            pdu.resize(24 + 512, 0);
            pdu
        };
        // (name, connect first, ICReq first, bytes, FES, FEI)
        type Case = (&'static str, bool, bool, Vec<u8>, u16, u32);
        let cases: Vec<Case> = vec![
            (
                "unknown PDU type",
                true,
                true,
                hex("08 00 18 00 18000000 0000000000000000 0000000000000000"),
                1,
                0,
            ),
            (
                "controller-to-host type",
                true,
                true,
                hex("05 00 18 00 18000000 0000000000000000 0000000000000000"),
                1,
                0,
            ),
            (
                "capsule with a wrong HLEN",
                true,
                true,
                capsule_header(50, 0, 72, 0),
                1,
                2,
            ),
            (
                "capsule with PLEN shorter than its header",
                true,
                true,
                capsule_header(72, 0, 40, 0),
                1,
                4,
            ),
            (
                "PDO inside the header",
                true,
                true,
                capsule_header(72, 8, 72 + 512, 0),
                1,
                3,
            ),
            (
                "header digest flag not negotiated",
                true,
                true,
                capsule_header(72, 0, 76, 0x01),
                1,
                1,
            ),
            (
                "in-capsule data beyond IOCCSZ",
                true,
                true,
                capsule_header(72, 72, 72 + 64 * 1024, 0),
                5,
                0,
            ),
            (
                "a command before ICReq",
                false,
                false,
                identify_capsule.clone(),
                2,
                0,
            ),
            (
                "a command other than Connect first",
                false,
                true,
                identify_capsule,
                2,
                0,
            ),
            ("a second ICReq", true, true, icreq.to_vec(), 2, 0),
            ("an unsupported PFV", false, false, bad_pfv.to_vec(), 6, 8),
            (
                "H2CData for an unknown transfer",
                true,
                true,
                h2c_unknown,
                1,
                10,
            ),
        ];
        for (name, connected, initialized, bytes, fes, fei) in cases {
            assert_eq!(
                term_req_for(connected, initialized, &bytes),
                (fes, fei),
                "{name}"
            );
        }
    }

    #[test]
    fn h2c_data_outside_the_r2t_window_is_fatal() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 1, 0, 8, 4096, false), &[]));
        let r2t = io.expect();
        let header = DataHeader::decode(&r2t.header).unwrap();
        let pdu = io.h2c_data(1, header.ttag, 2048, &[0u8; 512], false);
        io.send(&pdu);
        assert_eq!(
            io.expect().fatal_status(),
            FatalErrorStatus::DataTransferOutOfRange as u16
        );
    }

    #[test]
    fn more_commands_than_queue_entries_is_fatal() {
        let target = test_target();
        let (_admin, mut io) = queue_of_four_entries(&target);
        io.hold_io = true;
        // SQSIZE 3: four entries may be outstanding, not five.
        for cid in 0..5 {
            io.send(&io.capsule(&rw(io_opcode::READ, cid, 1, 0, 1, 512, false), &[]));
        }
        assert_eq!(
            io.expect().fatal_status(),
            FatalErrorStatus::PduSequenceError as u16
        );
    }

    /// A host sends its next commands once it has the completions, which
    /// can be before the target reaps the send that carried them (the reads'
    /// slots still hold their data): at the queue's depth, none is refused.
    #[test]
    fn commands_may_follow_completions_whose_send_is_not_reaped() {
        let target = test_target();
        let (_admin, mut io) = queue_of_four_entries(&target);
        io.hold_transmit = true;
        // A host at depth 4: a new command for every completion it has,
        // while the target reaps its sends only when the host waits.
        let (mut sent, mut in_flight, mut done) = (0u16, 0, 0);
        for _ in 0..1000 {
            if done == 40 {
                break;
            }
            while in_flight < 4 && sent < 40 {
                io.send(&io.capsule(&rw(io_opcode::READ, sent, 1, 0, 1, 512, false), &[]));
                sent += 1;
                in_flight += 1;
            }
            let mut completed = 0;
            while let Some(pdu) = io.receive() {
                assert_ne!(pdu.pdu_type, PduType::C2hTermReq as u8, "after {done}");
                if pdu.pdu_type == PduType::CapsuleResp as u8 {
                    completed += 1;
                }
            }
            if completed == 0 {
                io.finish_transmit();
            }
            in_flight -= completed;
            done += completed;
        }
        assert_eq!(done, 40);
        io.finish_transmit();
        assert!(io.connection.termination().is_none());
        // Past the depth (five not completed) is still refused.
        io.hold_io = true;
        for cid in 100..105 {
            io.send(&io.capsule(&rw(io_opcode::READ, cid, 1, 0, 1, 512, false), &[]));
        }
        let mut last = io.expect();
        while let Some(pdu) = io.receive() {
            last = pdu;
        }
        assert_eq!(
            last.fatal_status(),
            FatalErrorStatus::PduSequenceError as u16
        );
    }

    /// A host that stops reading its socket cannot pile up completions the
    /// target must keep: a command counts against the queue's entries until
    /// its completion is handed out to be sent.
    #[test]
    fn a_host_that_does_not_read_its_completions_is_stopped_at_its_depth() {
        let target = test_target();
        let (_admin, mut io) = queue_of_four_entries(&target);
        // The first Flush's completion goes out (and is never reported
        // sent); the next four wait behind it, the sixth is one too many.
        io.hold_transmit = true;
        for cid in 0..5 {
            io.send(&io.capsule(&sqe(io_opcode::FLUSH, cid, 0xFFFF_FFFF, 0, false), &[]));
            assert!(io.connection.termination().is_none(), "flush {cid}");
        }
        io.send(&io.capsule(&sqe(io_opcode::FLUSH, 5, 0xFFFF_FFFF, 0, false), &[]));
        assert_eq!(
            io.connection.termination(),
            Some(&Termination::Protocol(PduError::status(
                FatalErrorStatus::PduSequenceError
            )))
        );
    }

    #[test]
    fn byte_at_a_time_delivery_works() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        let block = vec![0x3Cu8; 512];
        let capsule = io.capsule(&rw(io_opcode::WRITE, 1, 1, 5, 1, 512, true), &block);
        for byte in capsule {
            io.send(&[byte]);
        }
        assert_eq!(io.expect().status(), Status::SUCCESS);
        assert_eq!(&io.disks[&1][5 * 512..6 * 512], &block[..]);
    }

    // ----- configuration updates -----

    /// Applies `change` to a copy of the target's configuration, makes the
    /// copy current and returns it, as the data plane's updater does.
    fn update(target: &Arc<Target>, change: impl FnOnce(&mut TargetConfig)) -> Arc<TargetConfig> {
        let mut config = TargetConfig::clone(&target.config());
        change(&mut config);
        let config = Arc::new(config);
        target.replace_config(Arc::clone(&config));
        config
    }

    fn resize(target: &Arc<Target>, nsid: u32, blocks: u64) -> Arc<TargetConfig> {
        update(target, |config| {
            let ns = config.subsystems[0]
                .namespaces
                .iter_mut()
                .find(|ns| ns.nsid == Nsid(nsid))
                .expect("a test namespace");
            ns.blocks = blocks;
        })
    }

    /// A subsystem `nqn` with one namespace of 64 blocks of 512 bytes.
    fn subsystem(nqn: &str) -> SubsystemConfig {
        let mut subsystem = test_target().config().subsystems[0].clone();
        subsystem.nqn = nqn.into();
        subsystem.namespaces.truncate(1);
        subsystem.namespaces[0].blocks = 64;
        subsystem
    }

    fn async_event_request(cid: u16) -> [u8; 64] {
        sqe(admin_opcode::ASYNC_EVENT_REQUEST, cid, 0, 0, false)
    }

    /// Set Features Asynchronous Event Configuration.
    fn async_event_config(cid: u16, value: u32) -> [u8; 64] {
        let mut command = sqe(admin_opcode::SET_FEATURES, cid, 0, 0, false);
        set_cdw(&mut command, 10, 0x0B);
        set_cdw(&mut command, 11, value);
        command
    }

    /// The NSIDs in a Changed Namespace List, up to the first zero entry.
    fn changed_list(host: &mut Pair, cid: u16, retain_event: bool) -> Vec<u32> {
        let mut command = get_log_page(cid, 0x04, 4096, 0);
        if retain_event {
            // CDW10: LID 04h, NUMDL 1023 (4 KiB), RAE.
            set_cdw(&mut command, 10, 0x04 | (1023 << 16) | (1 << 15));
        }
        let (page, response) = host.read_data(&command);
        assert_eq!(response.status(), Status::SUCCESS);
        page.chunks(4)
            .map(|entry| u32::from_le_bytes(entry.try_into().unwrap()))
            .take_while(|&nsid| nsid != 0)
            .collect()
    }

    /// An admin queue of [`TEST_NQN`] with Namespace Attribute Notices enabled.
    fn admin_with_notices(target: &Arc<Target>) -> Pair {
        let mut admin = Pair::new(target);
        admin.connect_admin(TEST_NQN, 0);
        let response = admin.simple(&async_event_config(3, 1 << 8));
        assert_eq!(response.status(), Status::SUCCESS);
        admin
    }

    #[test]
    fn a_resize_completes_a_parked_async_event_request() {
        let target = test_target();
        let mut admin = admin_with_notices(&target);
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        assert!(admin.receive().is_none(), "the request waits for an event");
        admin.update_config(resize(&target, 2, 512));
        let event = admin.expect();
        assert_eq!(event.cid(), 4);
        assert_eq!(event.status(), Status::SUCCESS);
        assert_eq!(
            event.result() as u32,
            0x0004_0002,
            "Notice, Namespace Attribute Changed, log page 04h"
        );
        assert_eq!(changed_list(&mut admin, 5, false), [2]);
        assert_eq!(changed_list(&mut admin, 6, false), [] as [u32; 0]);
        let (ns, _) = admin.read_data(&identify(7, 0, 2));
        assert_eq!(
            u64::from_le_bytes(ns[0..8].try_into().unwrap()),
            512,
            "NSZE"
        );
        assert_eq!(
            u64::from_le_bytes(ns[8..16].try_into().unwrap()),
            512,
            "NCAP"
        );
    }

    /// A discovery controller with Discovery Log Page Change Notices enabled
    /// gets one event when what its host's log lists changes (a subsystem,
    /// a referral), none for changes it cannot see, and none again until it
    /// reads the log with RAE cleared.
    #[test]
    fn a_discovery_log_change_completes_a_parked_async_event_request() {
        let target = test_target();
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        let (controller, _) = discovery.read_data(&identify(2, 1, 0));
        assert_eq!(
            u32::from_le_bytes(controller[92..96].try_into().unwrap()),
            1 << 31,
            "OAES: Discovery Log Page Change Notices"
        );
        let response = discovery.simple(&async_event_config(3, 1 << 31));
        assert_eq!(response.status(), Status::SUCCESS);
        discovery.send(&discovery.capsule(&async_event_request(4), &[]));
        // A subsystem this host may not connect to: its log does not change.
        discovery.update_config(update(&target, |config| {
            let mut hidden = subsystem("nqn.2026-11.io.weft:hidden");
            hidden.access = HostAccess::Only(Vec::new());
            config.subsystems.push(hidden);
        }));
        assert!(
            discovery.receive().is_none(),
            "nothing this host sees changed"
        );
        discovery.update_config(update(&target, |config| {
            config.referrals.push(ListenerConfig {
                port_id: 1,
                family: AddressFamily::Ipv4,
                address: "10.0.0.7".into(),
                service: "4420".into(),
            });
        }));
        let event = discovery.expect();
        assert_eq!(event.cid(), 4);
        assert_eq!(
            event.result() as u32,
            0x0070_F002,
            "Notice, Discovery Log Page Change, log page 70h"
        );
        // Masked until the host reads the log page (RAE cleared).
        discovery.send(&discovery.capsule(&async_event_request(5), &[]));
        discovery.update_config(update(&target, |config| {
            config.subsystems.push(subsystem("nqn.2026-11.io.weft:new"));
        }));
        assert!(discovery.receive().is_none(), "masked");
        let (_, response) = discovery.read_data(&get_log_page(6, 0x70, 1024, 0));
        assert_eq!(response.status(), Status::SUCCESS);
        discovery.update_config(update(&target, |config| {
            config
                .subsystems
                .push(subsystem("nqn.2026-11.io.weft:newer"));
        }));
        assert_eq!(discovery.expect().result() as u32, 0x0070_F002);
    }

    #[test]
    fn no_event_unless_the_host_enabled_namespace_attribute_notices() {
        let target = test_target();
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        admin.update_config(resize(&target, 1, 1024));
        assert!(admin.receive().is_none(), "no event reported");
        // The log page still lists the change, as nvmet's does.
        assert_eq!(changed_list(&mut admin, 5, false), [1]);
    }

    #[test]
    fn an_event_without_a_parked_request_completes_the_next_one() {
        let target = test_target();
        let mut admin = admin_with_notices(&target);
        admin.update_config(resize(&target, 1, 1024));
        assert!(admin.receive().is_none());
        let event = admin.simple(&async_event_request(4));
        assert_eq!(event.result() as u32, 0x0004_0002);
        // Reported, so masked: the next request waits.
        admin.send(&admin.capsule(&async_event_request(5), &[]));
        assert!(admin.receive().is_none());
    }

    #[test]
    fn the_event_stays_masked_until_the_log_page_is_read_without_rae() {
        let target = test_target();
        let mut admin = admin_with_notices(&target);
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        admin.send(&admin.capsule(&async_event_request(5), &[]));
        admin.update_config(resize(&target, 1, 1024));
        assert_eq!(admin.expect().cid(), 4, "the oldest request reports it");
        admin.update_config(resize(&target, 2, 128));
        assert!(
            admin.receive().is_none(),
            "masked until the host reads the log"
        );
        assert_eq!(changed_list(&mut admin, 6, true), [1, 2]);
        admin.update_config(resize(&target, 2, 64));
        assert!(admin.receive().is_none(), "RAE kept the event, so the mask");
        assert_eq!(changed_list(&mut admin, 7, false), [1, 2]);
        admin.update_config(resize(&target, 1, 2048));
        let event = admin.expect();
        assert_eq!((event.cid(), event.result() as u32), (5, 0x0004_0002));
        assert_eq!(changed_list(&mut admin, 8, false), [1]);
    }

    #[test]
    fn added_and_removed_namespaces_are_changed_ones() {
        let target = test_target();
        let mut admin = admin_with_notices(&target);
        let config = update(&target, |config| {
            let namespaces = &mut config.subsystems[0].namespaces;
            let mut added = namespaces[0].clone();
            added.nsid = Nsid(7);
            namespaces.remove(0);
            namespaces.push(added);
        });
        admin.update_config(config);
        assert_eq!(
            admin.simple(&async_event_request(4)).result() as u32,
            0x0004_0002
        );
        assert_eq!(changed_list(&mut admin, 5, false), [1, 7]);
        let (list, _) = admin.read_data(&identify(6, 2, 0));
        assert_eq!(&list[..12], &hex("02000000 07000000 00000000")[..]);
        let (controller, _) = admin.read_data(&identify(7, 1, 0));
        assert_eq!(
            u32::from_le_bytes(controller[516..520].try_into().unwrap()),
            7,
            "NN"
        );
        assert_eq!(
            u32::from_le_bytes(controller[92..96].try_into().unwrap()) & (1 << 8),
            1 << 8,
            "OAES"
        );
    }

    #[test]
    fn removing_a_subsystem_closes_its_queues() {
        let target = test_target();
        let (mut admin, mut io) = ready_io_queue(&target);
        let config = update(&target, |config| config.subsystems.clear());
        io.update_config(Arc::clone(&config));
        assert!(io.connection.is_closed());
        assert_eq!(
            io.connection.termination(),
            Some(&Termination::SubsystemRemoved)
        );
        assert_eq!(io.connection.subsystem_index(), None);
        admin.update_config(config);
        assert!(admin.connection.is_closed());
        assert_eq!(
            admin.connection.termination(),
            Some(&Termination::SubsystemRemoved)
        );
        admin.connection.on_closed();
        assert!(target.registry.is_empty(), "the controller is gone");
    }

    // ----- host access -----

    /// The test target with its subsystem open to `hosts` only.
    fn target_allowing(hosts: &[&str]) -> Arc<Target> {
        let target = test_target();
        update(&target, |config| {
            config.subsystems[0].access = HostAccess::Only(
                hosts
                    .iter()
                    .map(|h| AllowedHost {
                        nqn: h.to_string(),
                        keys: None,
                    })
                    .collect(),
            );
        });
        target
    }

    #[test]
    fn a_host_not_allowed_is_refused_at_connect_and_not_listed_in_discovery() {
        let target = target_allowing(&["nqn.2014-08.org.nvmexpress:uuid:someone-else"]);
        let mut host = Pair::new(&target);
        host.initialize(false, false);
        let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
        let response = host.command(&sqe, &data).pop().unwrap();
        assert_eq!(response.status(), Status::CONNECT_INVALID_HOST);
        assert_eq!(
            response.result(),
            (1 << 16) | 512,
            "IATTR 1, IPO: the Host NQN"
        );
        assert!(target.registry.is_empty(), "no controller was created");
        let refused = host.connection.take_refused_host().unwrap();
        assert_eq!(refused.subnqn, TEST_NQN);
        assert_eq!(refused.hostnqn, crate::testing::HOST_NQN);
        assert_eq!(host.connection.take_refused_host(), None, "told once");
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        let (page, _) = discovery.read_data(&get_log_page(3, 0x70, 2048, 0));
        assert_eq!(
            u64::from_le_bytes(page[8..16].try_into().unwrap()),
            1,
            "only the discovery subsystem"
        );
        assert_eq!(ascii_field(&page[1024 + 256..1024 + 512]), DISCOVERY_NQN);
    }

    #[test]
    fn an_allowed_host_connects_and_loses_its_queues_when_access_is_revoked() {
        let target = target_allowing(&[HOST_NQN]);
        let (mut admin, mut io) = ready_io_queue(&target);
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        let (header, _) = discovery.read_data(&get_log_page(3, 0x70, 1024, 0));
        assert_eq!(u64::from_le_bytes(header[8..16].try_into().unwrap()), 2);
        let config = update(&target, |config| {
            config.subsystems[0].access = HostAccess::Only(Vec::new());
        });
        io.update_config(Arc::clone(&config));
        admin.update_config(Arc::clone(&config));
        discovery.update_config(config);
        for queue in [&io, &admin] {
            assert_eq!(
                queue.connection.termination(),
                Some(&Termination::AccessRevoked)
            );
        }
        assert!(
            !discovery.connection.is_closed(),
            "discovery is not a subsystem"
        );
    }

    #[test]
    fn an_io_queue_follows_its_subsystem_to_its_new_index() {
        let target = test_target();
        let (mut admin, mut io) = ready_io_queue(&target);
        assert_eq!(io.connection.subsystem_index(), Some(0));
        let config = update(&target, |config| {
            config
                .subsystems
                .insert(0, subsystem("nqn.2026-11.io.weft:first"));
        });
        io.update_config(Arc::clone(&config));
        admin.update_config(config);
        assert_eq!(io.connection.subsystem_index(), Some(1));
        assert!(admin.receive().is_none(), "its namespaces did not change");
        let (_, response) = io.read_data(&rw(io_opcode::READ, 1, 2, 255, 1, 4096, false));
        assert_eq!(response.status(), Status::SUCCESS);
    }

    #[test]
    fn a_write_waiting_for_its_data_is_checked_against_the_new_configuration() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 2, 200, 8, 32768, false), &[]));
        let r2t = DataHeader::decode(&io.expect().header).unwrap();
        io.update_config(resize(&target, 2, 128));
        io.send(&io.h2c_data(1, r2t.ttag, 0, &[0xEE; 32768], true));
        assert_eq!(io.expect().status(), Status::LBA_OUT_OF_RANGE);
        assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
    }

    #[test]
    fn an_added_subsystem_is_connectable_and_discovered() {
        let target = test_target();
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        let mut waiting = Pair::new(&target);
        let added = "nqn.2026-11.io.weft:added";
        let config = update(&target, |config| {
            config.subsystems.push(subsystem(added));
            config.generation += 1;
        });
        discovery.update_config(Arc::clone(&config));
        waiting.update_config(config);
        let (page, _) = discovery.read_data(&get_log_page(3, 0x70, 4096, 0));
        assert_eq!(
            u64::from_le_bytes(page[0..8].try_into().unwrap()),
            2,
            "GENCTR"
        );
        assert_eq!(
            u64::from_le_bytes(page[8..16].try_into().unwrap()),
            3,
            "NUMREC"
        );
        assert_eq!(ascii_field(&page[2048 + 256..2048 + 512]), added);
        waiting.connect_admin(added, 0);
        let (ns, _) = waiting.read_data(&identify(4, 0, 1));
        assert_eq!(u64::from_le_bytes(ns[0..8].try_into().unwrap()), 64);
        Pair::new(&target).connect_admin(added, 0);
    }

    #[test]
    fn each_queue_of_a_host_with_a_secret_authenticates_before_other_commands() {
        let target = authenticating_target(true);
        let mut admin = Pair::new(&target);
        admin.initialize(false, false);
        let (connect, data) = connect_command(1, 0, 31, 0, 0xFFFF, TEST_NQN);
        let response = admin.command(&connect, &data).pop().unwrap();
        assert_eq!(response.status(), Status::SUCCESS);
        let cntlid = response.result() as u16;
        assert_eq!(response.result() >> 16, 2, "AUTHREQ.ATR (bit 17)");
        // Fabrics commands are allowed, others wait for authentication.
        let enable = property_set(2, 0x14, (6 << 16) | (4 << 20) | 1);
        assert_eq!(admin.simple(&enable).status(), Status::SUCCESS);
        let (_, refused) = admin.read_data(&identify(3, 1, 0));
        assert_eq!(refused.status(), Status::AUTH_REQUIRED);
        let secrets = host_keys(true);
        assert_eq!(admin.authenticate(secrets.clone(), TEST_NQN), Ok(()));
        let (_, identified) = admin.read_data(&identify(4, 1, 0));
        assert_eq!(identified.status(), Status::SUCCESS);
        let mut queues = sqe(admin_opcode::SET_FEATURES, 5, 0, 0, false);
        set_cdw(&mut queues, 10, 0x07);
        assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);

        let mut io = Pair::new(&target);
        let connected = io.connect_io(cntlid, 1, 31);
        assert_eq!(connected.result(), u64::from(cntlid) | 1 << 17);
        // A write is refused before any data is asked for.
        let write = rw(io_opcode::WRITE, 5, 1, 0, 8, 4096, false);
        assert_eq!(io.simple(&write).status(), Status::AUTH_REQUIRED);
        assert_eq!(io.authenticate(secrets, TEST_NQN), Ok(()));
        let (_, read) = io.read_data(&rw(io_opcode::READ, 6, 1, 0, 1, 512, false));
        assert_eq!(read.status(), Status::SUCCESS);

        let mut discovery = Pair::new(&target);
        discovery.initialize(false, false);
        let (sqe, data) = connect_command(1, 0, 31, 0, 0xFFFF, DISCOVERY_NQN);
        let response = discovery.command(&sqe, &data).pop().unwrap();
        assert_eq!(response.result() >> 16, 0, "discovery is not authenticated");
    }

    /// A queue whose host must authenticate and does not by the Connect
    /// deadline is closed with its controller; an authenticated one stays.
    #[test]
    fn a_queue_that_does_not_authenticate_by_the_connect_deadline_is_closed() {
        let target = authenticating_target(false);
        let mut lingering = Pair::new(&target);
        lingering.connect_admin(TEST_NQN, 0);
        let mut authenticated = Pair::new(&target);
        authenticated.connect_admin(TEST_NQN, 0);
        assert_eq!(
            authenticated.authenticate(host_keys(false), TEST_NQN),
            Ok(())
        );
        lingering.advance(Duration::from_secs(10));
        authenticated.advance(Duration::from_secs(10));
        assert_eq!(
            lingering.connection.termination(),
            Some(&Termination::SetupTimeout)
        );
        assert!(!authenticated.connection.is_closed());
        assert!(
            !target.registry.is_empty(),
            "the authenticated controller stays"
        );
        lingering.connection.on_closed();
    }

    #[test]
    fn a_wrong_secret_leaves_the_queue_unauthenticated() {
        let target = authenticating_target(false);
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        let wrong = HostKeys {
            host: DhchapSecret::parse(CONTROLLER_SECRET).unwrap(),
            controller: None,
        };
        assert_eq!(
            admin.authenticate(wrong, TEST_NQN),
            Err(HostAuthError::Refused(FailureReason::Failed))
        );
        let (_, refused) = admin.read_data(&identify(3, 1, 0));
        assert_eq!(refused.status(), Status::AUTH_REQUIRED);
        // The host may start over with the right one.
        assert_eq!(admin.authenticate(host_keys(false), TEST_NQN), Ok(()));
        let (_, identified) = admin.read_data(&identify(4, 1, 0));
        assert_eq!(identified.status(), Status::SUCCESS);
    }

    #[test]
    fn authentication_commands_are_checked() {
        let target = authenticating_target(false);
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        let mut wrong_protocol = auth_command(fctype::AUTH_RECEIVE, 3, 4096, false);
        wrong_protocol[43] = 0xEA;
        assert_eq!(
            admin.simple(&wrong_protocol).status(),
            Status::INVALID_FIELD
        );
        let mut no_length = auth_command(fctype::AUTH_RECEIVE, 4, 4096, false);
        no_length[44..48].fill(0);
        assert_eq!(admin.simple(&no_length).status(), Status::INVALID_FIELD);
        let mut other_length = auth_command(fctype::AUTH_RECEIVE, 5, 4096, false);
        other_length[44] = 1;
        assert_eq!(
            admin.simple(&other_length).status(),
            Status::SGL_LENGTH_INVALID
        );
        // A host without a secret here has nothing to authenticate.
        let mut open = Pair::new(&test_target());
        open.connect_admin(TEST_NQN, 0);
        let receive = auth_command(fctype::AUTH_RECEIVE, 6, 4096, false);
        assert_eq!(
            open.simple(&receive).status(),
            Status::COMMAND_SEQUENCE_ERROR
        );
    }

    // ----- Asymmetric Namespace Access -----

    /// Makes the test subsystem's ANA group `group` with `state`.
    fn set_ana(target: &Arc<Target>, group: u32, state: AnaState) -> Arc<TargetConfig> {
        update(target, |config| {
            config.subsystems[0].ana = AnaConfig {
                group: AnaGroupId::new(group).expect("a valid group"),
                state,
            };
        })
    }

    /// Get Log Page ANA (0Ch) of `len` bytes at `offset`, with LSP bit 0
    /// (Return Groups Only) and RAE as asked.
    fn ana_log_page(cid: u16, len: u32, offset: u64, groups_only: bool, retain: bool) -> [u8; 64] {
        let mut command = get_log_page(cid, 0x0C, len, offset);
        let cdw10 = 0x0C
            | (u32::from(groups_only) << 8)
            | (u32::from(retain) << 15)
            | ((len / 4 - 1) << 16);
        set_cdw(&mut command, 10, cdw10);
        command
    }

    fn read_ana_log(host: &mut Pair, command: &[u8; 64]) -> Vec<u8> {
        let (page, response) = host.read_data(command);
        assert_eq!(response.status(), Status::SUCCESS);
        page
    }

    /// Identify Controller of an I/O controller reports ANA (CMIC bit 3,
    /// OAES bit 11, ANATT, ANACAP, ANAGRPMAX, NANAGRPID) with MNAN between 1
    /// and NN; both Identify Namespace structures report the subsystem's
    /// group; a discovery controller reports none of it.
    #[test]
    fn identify_reports_ana() {
        let target = test_target();
        set_ana(&target, 3, AnaState::NonOptimized);
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        let (controller, _) = admin.read_data(&identify(2, 1, 0));
        assert_eq!(
            controller[76], 0x0A,
            "CMIC: multi-controller, ANA reporting"
        );
        assert_eq!(controller[92..96], hex("00090000"), "OAES: bits 8 and 11");
        assert_eq!(
            controller[342..352],
            hex("0a 5f 40000000 40000000"),
            "ANATT 10 s, ANACAP, ANAGRPMAX 64, NANAGRPID 64"
        );
        assert_eq!(controller[516..520], hex("02000000"), "NN");
        assert_eq!(controller[540..544], hex("02000000"), "MNAN");
        let (ns, _) = admin.read_data(&identify(3, 0, 2));
        assert_eq!(ns[92..96], hex("03000000"), "ANAGRPID");
        assert_eq!(ns[16..24], ns[0..8], "NUSE: the path serves the namespace");
        let (independent, _) = admin.read_data(&identify(4, 8, 1));
        assert_eq!(independent[4..8], hex("03000000"), "ANAGRPID");
        let mut discovery = Pair::new(&target);
        discovery.connect_admin(DISCOVERY_NQN, 0);
        let (controller, _) = discovery.read_data(&identify(2, 1, 0));
        assert_eq!(controller[76], 0x02, "CMIC: no ANA");
        assert_eq!(controller[342..352], [0; 10]);
        assert_eq!(
            discovery
                .simple(&ana_log_page(3, 4096, 0, false, false))
                .status(),
            Status::INVALID_LOG_PAGE
        );
    }

    /// The ANA log page of a subsystem in group 3, Inaccessible, with
    /// namespaces 1 and 2: the header (CHGCNT 0, NGRPS 1), one group
    /// descriptor (ANAGRPID 3, NNSIDS 2, CHGCNT 0, ANAS 03h) and the NSIDs;
    /// with RGO the descriptor alone (NNSIDS 0); a window at an offset.
    #[test]
    fn ana_log_page_bytes() {
        let target = test_target();
        set_ana(&target, 3, AnaState::Inaccessible);
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        let header = "0000000000000000 0100 000000000000";
        let descriptor = "03000000 02000000 0000000000000000 03 000000000000000000000000000000";
        let nsids = "01000000 02000000";
        let page = read_ana_log(&mut admin, &ana_log_page(2, 64, 0, false, false));
        assert_eq!(
            page,
            hex(&format!("{header} {descriptor} {nsids} {}", "00".repeat(8)))
        );
        // Linux reads 16 + 64 * 32 + MNAN * 4 bytes: the rest is zeroes.
        let page = read_ana_log(
            &mut admin,
            &ana_log_page(3, 16 + 64 * 32 + 2 * 4, 0, false, false),
        );
        assert_eq!(
            page[..56],
            hex(&format!("{header} {descriptor} {nsids}"))[..]
        );
        assert!(page[56..].iter().all(|&b| b == 0));
        // Return Groups Only: NNSIDS 0 and no NSIDs.
        let groups = read_ana_log(&mut admin, &ana_log_page(4, 64, 0, true, false));
        let descriptor_alone =
            "03000000 00000000 0000000000000000 03 000000000000000000000000000000";
        assert_eq!(
            groups,
            hex(&format!("{header} {descriptor_alone} {}", "00".repeat(16)))
        );
        // From offset 20 (NNSIDS), 36 bytes: up to and including the last NSID.
        let window = read_ana_log(&mut admin, &ana_log_page(5, 36, 20, false, false));
        assert_eq!(
            window,
            hex("02000000 0000000000000000 03 000000000000000000000000000000 01000000 02000000")
        );
        // Past the page's end: zeroes.
        let beyond = read_ana_log(&mut admin, &ana_log_page(6, 8, 56, false, false));
        assert_eq!(beyond, [0; 8]);
    }

    /// An Optimized -> Inaccessible change completes a parked Asynchronous
    /// Event Request with ANA Change (Notice 2h, information 03h, log page
    /// 0Ch) when the host enabled ANA Change Notices (AEC bit 11), and moves
    /// the page's change count; the event type stays masked until the host
    /// reads the ANA log page with RAE cleared.
    #[test]
    fn an_ana_state_change_completes_a_parked_async_event_request() {
        let target = test_target();
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        assert_eq!(
            admin.simple(&async_event_config(2, 1 << 11)).status(),
            Status::SUCCESS
        );
        let mut get_config = sqe(admin_opcode::GET_FEATURES, 3, 0, 0, false);
        set_cdw(&mut get_config, 10, 0x0B);
        assert_eq!(admin.simple(&get_config).result(), 1 << 11, "AEC as set");
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        assert!(admin.receive().is_none());
        admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
        let event = admin.expect();
        assert_eq!((event.cid(), event.status()), (4, Status::SUCCESS));
        assert_eq!(
            event.result() as u32,
            0x000C_0302,
            "Notice, ANA Change, log page 0Ch"
        );
        // Masked: a change back is not reported, not even after a read with RAE.
        admin.send(&admin.capsule(&async_event_request(5), &[]));
        admin.update_config(set_ana(&target, 1, AnaState::Change));
        assert!(admin.receive().is_none(), "masked");
        let page = read_ana_log(&mut admin, &ana_log_page(6, 48, 0, true, true));
        assert_eq!(page[0..8], hex("0200000000000000"), "CHGCNT: two changes");
        assert_eq!(page[24..32], hex("0200000000000000"), "the group's CHGCNT");
        assert_eq!(page[32], 0x0F, "ANAS: change");
        admin.update_config(set_ana(&target, 1, AnaState::Optimized));
        assert!(admin.receive().is_none(), "RAE kept the event, so the mask");
        read_ana_log(&mut admin, &ana_log_page(7, 48, 0, true, false));
        admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
        let event = admin.expect();
        assert_eq!((event.cid(), event.result() as u32), (5, 0x000C_0302));
        // A configuration update that leaves the group as it was reports nothing.
        read_ana_log(&mut admin, &ana_log_page(8, 48, 0, true, false));
        admin.send(&admin.capsule(&async_event_request(9), &[]));
        admin.update_config(update(&target, |config| config.generation += 1));
        assert!(admin.receive().is_none());
    }

    #[test]
    fn no_ana_event_unless_the_host_enabled_ana_change_notices() {
        let target = test_target();
        let mut admin = admin_with_notices(&target); // namespace notices only
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        admin.update_config(set_ana(&target, 1, AnaState::Inaccessible));
        assert!(admin.receive().is_none(), "no event reported");
        // The page reports the new state all the same.
        let page = read_ana_log(&mut admin, &ana_log_page(5, 48, 0, true, false));
        assert_eq!((page[0], page[32]), (1, 0x03), "CHGCNT 1, Inaccessible");
    }

    /// One update that resizes a namespace and changes the ANA state raises
    /// both events, and two parked requests report both.
    #[test]
    fn one_update_reports_a_namespace_and_an_ana_event() {
        let target = test_target();
        let mut admin = Pair::new(&target);
        admin.connect_admin(TEST_NQN, 0);
        admin.simple(&async_event_config(2, (1 << 8) | (1 << 11)));
        admin.send(&admin.capsule(&async_event_request(3), &[]));
        admin.send(&admin.capsule(&async_event_request(4), &[]));
        admin.update_config(update(&target, |config| {
            config.subsystems[0].namespaces[0].blocks = 1024;
            config.subsystems[0].ana.state = AnaState::Change;
        }));
        let first = admin.expect();
        let second = admin.expect();
        assert_eq!((first.cid(), first.result() as u32), (3, 0x0004_0002));
        assert_eq!((second.cid(), second.result() as u32), (4, 0x000C_0302));
    }

    /// Reads and writes on a path whose group is Inaccessible complete with
    /// Asymmetric Access Inaccessible (SCT 3h, SC 02h), and in Change with
    /// Asymmetric Access Transition (SC 03h), DNR clear, before any data
    /// moves; the path serves them again once Non-optimized.
    #[test]
    fn io_on_a_path_that_does_not_serve_it_fails_with_a_path_status() {
        let target = test_target();
        let (mut admin, mut io) = ready_io_queue(&target);
        for (state, sc) in [(AnaState::Inaccessible, 0x02), (AnaState::Change, 0x03)] {
            let config = set_ana(&target, 1, state);
            io.update_config(Arc::clone(&config));
            admin.update_config(config);
            let (data, read) = io.read_data(&rw(io_opcode::READ, 1, 1, 0, 1, 512, false));
            assert!(data.is_empty(), "no data for a refused read");
            let in_capsule = io
                .command(&rw(io_opcode::WRITE, 2, 2, 0, 1, 4096, true), &[0xAB; 4096])
                .pop()
                .unwrap();
            // By R2T: refused at once, without asking for the data.
            let by_r2t = io.simple(&rw(io_opcode::WRITE, 3, 1, 0, 16, 8192, false));
            for response in [read, in_capsule, by_r2t] {
                let status = response.status();
                assert_eq!(
                    (status.sct, status.sc, status.dnr),
                    (crate::status::StatusCodeType::Path, sc, false),
                    "{state}"
                );
                // CQE DW3 status field: DNR (bit 15 of the 16 bits) clear, SCT 3.
                let raw = u16::from_le_bytes([response.header[22], response.header[23]]);
                assert_eq!(raw >> 1, 0x0300 | sc as u16);
            }
        }
        assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
        let config = set_ana(&target, 1, AnaState::NonOptimized);
        io.update_config(Arc::clone(&config));
        admin.update_config(config);
        let (_, read) = io.read_data(&rw(io_opcode::READ, 4, 1, 0, 1, 512, false));
        assert_eq!(read.status(), Status::SUCCESS);
    }

    /// weft's replica fence (Set Features C0h, token in CDW11-13).
    /// Host A's and host B's I/O queues on a target whose namespace 2 has
    /// reservations, both executing reservation commands on one cell.
    fn reservation_hosts() -> (Arc<Target>, Pair, Pair) {
        let target = test_target();
        let cell = Arc::new(ReservationCell::new());
        update(&target, |config| {
            config.subsystems[0].namespaces[1].reservations = Some(Arc::clone(&cell));
        });
        let io_as = |host_id: [u8; 16]| {
            let mut admin = Pair::new(&target);
            admin.host_id = host_id;
            let cntlid = admin.connect_admin(TEST_NQN, 5000);
            let mut queues = sqe(admin_opcode::SET_FEATURES, 3, 0, 0, false);
            set_cdw(&mut queues, 10, 0x07);
            set_cdw(&mut queues, 11, 0x0001_0001);
            assert_eq!(admin.simple(&queues).status(), Status::SUCCESS);
            let mut io = Pair::new(&target);
            io.host_id = host_id;
            assert_eq!(io.connect_io(cntlid, 1, 127).status(), Status::SUCCESS);
            io.reservations = Some(Arc::clone(&cell));
            io
        };
        let a = io_as(HOST_ID);
        let b = io_as([0x22; 16]);
        (target, a, b)
    }

    fn reservation(opcode: u8, cid: u16, cdw10: u32, keys: &[u64]) -> ([u8; 64], Vec<u8>) {
        let data: Vec<u8> = keys.iter().flat_map(|key| key.to_le_bytes()).collect();
        let mut command = sqe(opcode, cid, 2, data.len() as u32, true);
        set_cdw(&mut command, 10, cdw10);
        (command, data)
    }

    fn run(io: &mut Pair, (command, data): ([u8; 64], Vec<u8>)) -> Status {
        io.command(&command, &data)
            .pop()
            .expect("a response")
            .status()
    }

    #[test]
    fn reservations_keep_other_hosts_from_writing_and_a_preempt_fences_the_holder() {
        use crate::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE, REPORT_OPCODE};
        let (target, mut a, mut b) = reservation_hosts();
        let mut out = [0u8; 4096];
        let config = target.config();
        let subsystem = &config.subsystems[0];
        crate::identify::namespace(&subsystem.namespaces[1], &subsystem.ana, &mut out);
        assert_eq!(out[31], 0xFF, "RESCAP");
        crate::identify::namespace(&subsystem.namespaces[0], &subsystem.ana, &mut out);
        assert_eq!(out[31], 0, "no reservations on namespace 1");
        let write = |cid| rw(io_opcode::WRITE, cid, 2, 0, 1, 4096, true);
        let read = |cid| rw(io_opcode::READ, cid, 2, 0, 1, 4096, false);
        // A registers key 1 (CPTPL 11b, as Linux sends) and takes Write Exclusive.
        assert_eq!(
            run(
                &mut a,
                reservation(REGISTER_OPCODE, 1, 0xC000_0000, &[0, 1])
            ),
            Status::SUCCESS
        );
        assert_eq!(
            run(&mut a, reservation(ACQUIRE_OPCODE, 2, 0x100, &[1, 0])),
            Status::SUCCESS
        );
        assert_eq!(
            a.command(&write(3), &[3; 4096]).pop().unwrap().status(),
            Status::SUCCESS
        );
        assert_eq!(
            b.command(&write(4), &[4; 4096]).pop().unwrap().status(),
            Status::RESERVATION_CONFLICT
        );
        assert_eq!(
            b.read_data(&read(5)).1.status(),
            Status::SUCCESS,
            "B still reads"
        );
        // Without a key of its own, B cannot take it.
        assert_eq!(
            run(&mut b, reservation(ACQUIRE_OPCODE, 6, 0x101, &[2, 1])),
            Status::RESERVATION_CONFLICT
        );
        // B registers and preempts A (Exclusive Access, with abort).
        assert_eq!(
            run(&mut b, reservation(REGISTER_OPCODE, 7, 0, &[0, 2])),
            Status::SUCCESS
        );
        assert_eq!(
            run(&mut b, reservation(ACQUIRE_OPCODE, 8, 0x202, &[2, 1])),
            Status::SUCCESS
        );
        assert_eq!(
            a.command(&write(9), &[9; 4096]).pop().unwrap().status(),
            Status::RESERVATION_CONFLICT
        );
        assert_eq!(
            a.read_data(&read(10)).1.status(),
            Status::RESERVATION_CONFLICT
        );
        assert_eq!(
            b.command(&write(11), &[11; 4096]).pop().unwrap().status(),
            Status::SUCCESS
        );
        // Report: the extended structure only.
        let mut report = sqe(REPORT_OPCODE, 12, 2, 4096, false);
        set_cdw(&mut report, 10, 1023);
        let (_, refused) = a.read_data(&report);
        assert_eq!(refused.status(), Status::HOST_ID_INCONSISTENT_FORMAT);
        set_cdw(&mut report, 11, 1);
        let (data, done) = a.read_data(&report);
        assert_eq!(done.status(), Status::SUCCESS);
        assert_eq!(data.len(), 4096, "NUMD + 1 dwords");
        assert_eq!(data[128..], [0; 4096 - 128], "zeroes past the registrants");
        assert_eq!(data[4], 2, "Exclusive Access");
        assert_eq!(u16::from_le_bytes([data[5], data[6]]), 1, "B only");
        assert_eq!(data[64 + 2], 1, "B holds it");
        assert_eq!(data[64 + 16..64 + 32], [0x22; 16]);
        // Namespace 1 has none: the commands are not supported there.
        let (mut command, data) = reservation(REGISTER_OPCODE, 13, 0, &[0, 1]);
        command[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            a.command(&command, &data).pop().unwrap().status(),
            Status::INVALID_OPCODE
        );
    }

    #[test]
    fn a_preempted_hosts_write_on_its_way_to_the_media_holds_the_drain() {
        use crate::reservation::{ACQUIRE_OPCODE, REGISTER_OPCODE};
        let (_target, mut a, mut b) = reservation_hosts();
        let cell = a.reservations.clone().unwrap();
        assert_eq!(
            run(&mut a, reservation(REGISTER_OPCODE, 1, 0, &[0, 1])),
            Status::SUCCESS
        );
        assert_eq!(
            run(&mut b, reservation(REGISTER_OPCODE, 2, 0, &[0, 2])),
            Status::SUCCESS
        );
        // Write Exclusive, Registrants Only: B writes too.
        assert_eq!(
            run(&mut a, reservation(ACQUIRE_OPCODE, 3, 0x300, &[1, 0])),
            Status::SUCCESS
        );
        b.hold_io = true;
        b.send(&b.capsule(&rw(io_opcode::WRITE, 4, 2, 0, 1, 4096, true), &[4; 4096]));
        assert_eq!(b.held_io.len(), 1, "B's write is on the media");
        let before = cell.state().1;
        assert_eq!(
            run(&mut a, reservation(ACQUIRE_OPCODE, 5, 0x102, &[1, 2])),
            Status::SUCCESS
        );
        assert!(
            !cell.drained(&before),
            "B was fenced with a write under way"
        );
        let held = b.held_io.pop().unwrap();
        b.execute(held);
        b.pump();
        assert_eq!(
            b.expect().status(),
            Status::SUCCESS,
            "admitted before the preemption"
        );
        assert!(cell.drained(&before));
        b.hold_io = false;
        let refused = b.command(&rw(io_opcode::WRITE, 6, 2, 0, 1, 4096, true), &[6; 4096]);
        assert_eq!(
            refused.last().unwrap().status(),
            Status::RESERVATION_CONFLICT
        );
    }

    fn fence_command(cid: u16, epoch: u64, session: u32) -> [u8; 64] {
        let mut command = sqe(admin_opcode::SET_FEATURES, cid, 0, 0, false);
        set_cdw(&mut command, 10, u32::from(crate::fence::FENCE_FEATURE));
        let [cdw11, cdw12, cdw13] = crate::fence::FenceToken { epoch, session }.cdws();
        set_cdw(&mut command, 11, cdw11);
        set_cdw(&mut command, 12, cdw12);
        set_cdw(&mut command, 13, cdw13);
        command
    }

    /// On a fenced (replica) subsystem only the fence holder's I/O runs; a
    /// new fence is answered once the previous holder's I/O in flight is
    /// done, so that no older write reaches the media afterwards; tokens
    /// only grow, and a refused fence learns the current epoch.
    #[test]
    fn only_the_fence_holder_writes_and_a_new_fence_waits_for_the_old_holders_io() {
        let target = test_target();
        update(&target, |config| config.subsystems[0].fenced = true);
        let (mut admin_a, mut io_a) = ready_io_queue(&target);
        let (mut admin_b, mut io_b) = ready_io_queue(&target);
        let write = |cid| rw(io_opcode::WRITE, cid, 2, 0, 1, 4096, true);
        let unfenced = io_a.command(&write(1), &[1; 4096]).pop().unwrap();
        assert_eq!(unfenced.status(), Status::RESERVATION_CONFLICT);
        assert_eq!(
            admin_a.simple(&fence_command(5, 1, 1)).status(),
            Status::SUCCESS
        );
        let fenced = io_a.command(&write(2), &[2; 4096]).pop().unwrap();
        assert_eq!(fenced.status(), Status::SUCCESS);
        // A write of A's in flight on the media when B takes the fence.
        io_a.hold_io = true;
        io_a.send(&io_a.capsule(&write(3), &[3; 4096]));
        assert_eq!(io_a.held_io.len(), 1);
        admin_b.send(&admin_b.capsule(&fence_command(6, 2, 1), &[]));
        assert!(admin_b.receive().is_none(), "B's fence waits for A's write");
        admin_b.advance(Duration::from_millis(5));
        assert!(admin_b.receive().is_none(), "still in flight");
        let refused = io_a.command(&write(4), &[4; 4096]).pop().unwrap();
        assert_eq!(
            refused.status(),
            Status::RESERVATION_CONFLICT,
            "A lost it at once"
        );
        let held = io_a.held_io.pop().unwrap();
        io_a.execute(held);
        io_a.pump();
        assert_eq!(io_a.expect().status(), Status::SUCCESS, "A's write done");
        admin_b.advance(Duration::from_millis(1));
        assert_eq!(admin_b.expect().status(), Status::SUCCESS, "then B's fence");
        let by_b = io_b.command(&write(5), &[5; 4096]).pop().unwrap();
        assert_eq!(by_b.status(), Status::SUCCESS);
        assert_eq!(io_b.disks[&2][..4096], [5; 4096]);
        // A write by R2T admitted under B's fence, whose data arrives after
        // C took it, is refused then: it never reaches the media.
        let (mut admin_c, _io_c) = ready_io_queue(&target);
        io_b.send(&io_b.capsule(&rw(io_opcode::WRITE, 6, 2, 2, 2, 8192, false), &[]));
        let r2t = io_b.expect();
        let header = crate::pdu::DataHeader::decode(&r2t.header).unwrap();
        assert_eq!(
            admin_c.simple(&fence_command(9, 3, 1)).status(),
            Status::SUCCESS
        );
        io_b.send(&io_b.h2c_data(header.cccid, header.ttag, 0, &[6; 8192], true));
        assert_eq!(io_b.expect().status(), Status::RESERVATION_CONFLICT);
        assert!(
            io_b.disks[&2][8192..16384].iter().all(|&b| b == 0),
            "not written"
        );
        // A deposed primary's fence is refused and learns the current epoch.
        let stale = admin_a.simple(&fence_command(7, 1, 9));
        assert_eq!(
            (stale.status(), stale.result()),
            (Status::RESERVATION_CONFLICT, 3)
        );
        // A fence on a subsystem that is not fenced is an invalid field.
        update(&target, |config| config.subsystems[0].fenced = false);
        admin_b.update_config(target.config());
        let invalid = admin_b.simple(&fence_command(8, 3, 1));
        assert_eq!(invalid.status(), Status::INVALID_FIELD);
    }

    /// A replica subsystem's write intent: its log page (C0h) lists the
    /// marked regions; Clean (81h) drops regions, only from the fence
    /// holder, and only where the subsystem has an intent.
    #[test]
    fn the_intent_log_page_lists_marked_regions_and_clean_drops_them() {
        use crate::intent::{WriteIntent, CLEAN_OPCODE, INTENT_LOG};
        let target = test_target();
        let intent = Arc::new(WriteIntent::new(64 << 20, 20, [3, 9, 40], false));
        update(&target, |config| {
            config.subsystems[0].fenced = true;
            config.subsystems[0].intent = Some(Arc::clone(&intent));
        });
        let (mut admin, mut io) = ready_io_queue(&target);
        let (mut other_admin, _other_io) = ready_io_queue(&target);
        let (page, response) = admin.read_data(&get_log_page(1, INTENT_LOG, 32, 0));
        assert_eq!(response.status(), Status::SUCCESS);
        assert_eq!(
            page.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "0300000000000000000010000000000003000000090000002800000000000000"
        );
        let clean = |cid: u16, regions: &[u32]| {
            let data: Vec<u8> = regions.iter().flat_map(|r| r.to_le_bytes()).collect();
            let mut command = sqe(CLEAN_OPCODE, cid, 2, data.len() as u32, true);
            set_cdw(&mut command, 10, regions.len() as u32);
            (command, data)
        };
        let (command, data) = clean(2, &[9, 40]);
        let refused = io.command(&command, &data).pop().unwrap();
        assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
        assert_eq!(
            admin.simple(&fence_command(3, 1, 1)).status(),
            Status::SUCCESS
        );
        let done = io.command(&command, &data).pop().unwrap();
        assert_eq!(done.status(), Status::SUCCESS);
        assert_eq!(intent.marked(), vec![3]);
        assert!(intent.take_cleared(), "the node persists it again");
        let (mut wrong, data) = clean(4, &[3]);
        set_cdw(&mut wrong, 10, 2);
        let short = io.command(&wrong, &data).pop().unwrap();
        assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
        // The page from another controller, at an offset: the one region left.
        let (page, _) = other_admin.read_data(&get_log_page(5, INTENT_LOG, 4, 16));
        assert_eq!(page, 3u32.to_le_bytes());
        // Without an intent: no page, no Clean.
        update(&target, |config| config.subsystems[0].intent = None);
        admin.update_config(target.config());
        io.update_config(target.config());
        let none = admin.simple(&get_log_page(6, INTENT_LOG, 16, 0));
        assert_eq!(none.status(), Status::INVALID_LOG_PAGE);
        let (command, data) = clean(7, &[3]);
        let invalid = io.command(&command, &data).pop().unwrap();
        assert_eq!(invalid.status(), Status::INVALID_OPCODE);
    }

    /// A replica's Snapshot (85h) reaches the data plane with its name,
    /// only from the fence holder, only where the subsystem has an intent,
    /// with a name of 1 to 64 bytes that is exactly its data.
    #[test]
    fn a_snapshot_command_carries_its_name_to_the_data_plane() {
        use crate::intent::{WriteIntent, SNAPSHOT_OPCODE};
        let target = test_target();
        let intent = Arc::new(WriteIntent::new(64 << 20, 20, [], false));
        update(&target, |config| {
            config.subsystems[0].fenced = true;
            config.subsystems[0].intent = Some(Arc::clone(&intent));
        });
        let (mut admin, mut io) = ready_io_queue(&target);
        let snapshot = |cid: u16, name: &[u8], declared: u32| {
            let mut command = sqe(SNAPSHOT_OPCODE, cid, 1, name.len() as u32, true);
            set_cdw(&mut command, 10, declared);
            command
        };
        let refused = io.command(&snapshot(2, b"s1", 2), b"s1").pop().unwrap();
        assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
        assert_eq!(
            admin.simple(&fence_command(3, 1, 1)).status(),
            Status::SUCCESS
        );
        let done = io.command(&snapshot(4, b"s1", 2), b"s1").pop().unwrap();
        assert_eq!(done.status(), Status::SUCCESS);
        assert_eq!(io.snapshots, vec!["s1".to_string()]);
        let short = io.command(&snapshot(5, b"s1", 3), b"s1").pop().unwrap();
        assert_eq!(short.status(), Status::SGL_LENGTH_INVALID);
        let long = [b'a'; 65];
        let too_long = io.command(&snapshot(6, &long, 65), &long).pop().unwrap();
        assert_eq!(too_long.status(), Status::INVALID_FIELD);
        let mut other_ns = snapshot(7, b"s2", 2);
        other_ns[4..8].copy_from_slice(&9u32.to_le_bytes());
        let missing = io.command(&other_ns, b"s2").pop().unwrap();
        assert_eq!(missing.status(), Status::INVALID_NAMESPACE);
        update(&target, |config| config.subsystems[0].intent = None);
        io.update_config(target.config());
        let invalid = io.command(&snapshot(8, b"s3", 2), b"s3").pop().unwrap();
        assert_eq!(invalid.status(), Status::INVALID_OPCODE);
        assert_eq!(io.snapshots.len(), 1, "only the valid one ran");
    }

    /// A replica's Grow (84h) reaches the data plane with the new size
    /// (in CDW10-11), in whole blocks; a size reached already is done.
    #[test]
    fn a_grow_command_carries_the_new_size_to_the_data_plane() {
        use crate::intent::{WriteIntent, GROW_OPCODE};
        let target = test_target();
        let intent = Arc::new(WriteIntent::new(64 << 20, 20, [], false));
        update(&target, |config| {
            config.subsystems[0].fenced = true;
            config.subsystems[0].intent = Some(intent);
        });
        let (mut admin, mut io) = ready_io_queue(&target);
        let grow = |cid: u16, size_bytes: u64| {
            let mut command = sqe(GROW_OPCODE, cid, 1, 0, false);
            set_cdw(&mut command, 10, size_bytes as u32);
            set_cdw(&mut command, 11, (size_bytes >> 32) as u32);
            command
        };
        // Namespace 1: 512 blocks of 512 bytes.
        let refused = io.command(&grow(2, 1 << 20), &[]).pop().unwrap();
        assert_eq!(refused.status(), Status::RESERVATION_CONFLICT, "not fenced");
        assert_eq!(
            admin.simple(&fence_command(3, 1, 1)).status(),
            Status::SUCCESS
        );
        let done = io.command(&grow(4, 1 << 20), &[]).pop().unwrap();
        assert_eq!(done.status(), Status::SUCCESS);
        assert_eq!(io.disks[&1].len(), 1 << 20);
        let again = io.command(&grow(5, 128 << 10), &[]).pop().unwrap();
        assert_eq!(again.status(), Status::SUCCESS, "grown past it already");
        assert_eq!(io.disks[&1].len(), 1 << 20);
        for (cid, size) in [(6, 0), (7, (1 << 20) + 100)] {
            let invalid = io.command(&grow(cid, size), &[]).pop().unwrap();
            assert_eq!(invalid.status(), Status::INVALID_FIELD, "{size} bytes");
        }
    }

    /// A write waiting for its data when the path becomes Inaccessible
    /// completes with the path status once its data arrived, unwritten.
    #[test]
    fn a_write_waiting_for_its_data_fails_when_the_path_becomes_inaccessible() {
        let target = test_target();
        let (_admin, mut io) = ready_io_queue(&target);
        io.send(&io.capsule(&rw(io_opcode::WRITE, 1, 2, 0, 2, 8192, false), &[]));
        let r2t = DataHeader::decode(&io.expect().header).unwrap();
        io.update_config(set_ana(&target, 1, AnaState::Inaccessible));
        io.send(&io.h2c_data(1, r2t.ttag, 0, &[0xEE; 8192], true));
        assert_eq!(io.expect().status(), Status::ANA_INACCESSIBLE);
        assert!(io.disks[&2].iter().all(|&b| b == 0), "nothing written");
    }

    /// Hex text of a captured stream, without its `#` comment lines.
    fn captured(text: &str) -> Vec<u8> {
        hex(&text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .collect::<String>())
    }

    /// Replays what the Linux 6.1 host really sent (admin queue, then an I/O
    /// queue, both with header and data digests) and checks every answer.
    #[test]
    fn replays_a_linux_host_session() {
        let target = target_with("nqn.2026-11.io.weft:default", &[(1, 1024, 4096)]);
        let admin_stream = captured(include_str!("testdata/linux-6.1-admin-digests.hex"));
        let io_stream = captured(include_str!("testdata/linux-6.1-io-digests.hex"));
        for stream in [admin_stream, io_stream] {
            let mut host = Pair::new(&target);
            host.send(&stream);
            let mut completions = 0;
            while let Some(pdu) = host.receive() {
                match PduType::from_u8(pdu.pdu_type) {
                    Some(PduType::CapsuleResp) => {
                        assert_eq!(
                            pdu.status(),
                            Status::SUCCESS,
                            "command {} failed",
                            pdu.cid()
                        );
                        completions += 1;
                    }
                    Some(PduType::IcResp | PduType::C2hData) => {}
                    other => panic!("unexpected PDU {other:?} in answer to a real host"),
                }
            }
            assert!(!host.connection.is_closed());
            assert!(completions >= 4, "{completions} completions");
        }
    }
}
