//! The admin queue of one controller: controller properties (CC/CSTS
//! handshakes), Identify, Get Log Page, Get/Set Features, Asynchronous Event
//! Requests, Keep Alive and Abort. Commands execute synchronously against the
//! connection's configuration snapshot and fill the command's data buffer;
//! the connection moves the data and the completion.
//!
//! When the configuration changes under an I/O controller, the namespaces of
//! its subsystem that were added, removed or changed go into the Changed
//! Namespace List log page, and a Namespace Attribute Changed event tells the
//! host to look (a Linux host then re-identifies its namespaces and picks up
//! a new size).
//!
//! An I/O controller also reports its subsystem's ANA group and state (see
//! [`crate::ana`]) in the ANA log page, and an ANA Change event tells the
//! host when the state changed (a Linux host then reads the page and moves
//! its I/O to the paths that serve it).

use crate::command::{admin_opcode, fctype, Command, PropertyCommand};
use crate::identify::{self, cns, log_id, ControllerIdentity, ControllerKind, Health};
use crate::status::Status;
use crate::target::{ControllerShared, Limits, SubsystemConfig, TargetConfig};
use crate::types::{Nsid, SlotId, Timestamp};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Controller property offsets (NVMe Base 2.0, section 3.1.4).
pub mod property {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version.
    pub const VS: u32 = 0x08;
    /// Controller Configuration.
    pub const CC: u32 = 0x14;
    /// Controller Status.
    pub const CSTS: u32 = 0x1C;
}

/// Feature identifiers.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Interrupt Vector Configuration.
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
}

/// CC fields.
mod cc {
    pub const ENABLE: u32 = 1 << 0;
    pub fn iosqes(cc: u32) -> u32 {
        (cc >> 16) & 0xF
    }
    pub fn iocqes(cc: u32) -> u32 {
        (cc >> 20) & 0xF
    }
    pub fn mps(cc: u32) -> u32 {
        (cc >> 7) & 0xF
    }
    pub fn css(cc: u32) -> u32 {
        (cc >> 4) & 0x7
    }
    pub fn shn(cc: u32) -> u32 {
        (cc >> 14) & 0x3
    }
}

/// Asynchronous Event Configuration (feature 0Bh) bit 8: Namespace Attribute Notices.
const AEC_NAMESPACE_ATTRIBUTE_NOTICES: u32 = 1 << 8;
/// Asynchronous Event Configuration bit 11: Asymmetric Namespace Access
/// Change Notices (NVMe Base 2.0, Figure 317).
const AEC_ANA_CHANGE_NOTICES: u32 = 1 << 11;
/// Asynchronous Event Configuration bit 31: Discovery Log Page Change Notices
/// (a discovery controller's; NVMe Base 2.0, Figure 317).
const AEC_DISCOVERY_LOG_CHANGE_NOTICES: u32 = 1 << 31;

/// Completion DW0 of an Asynchronous Event Request (NVMe Base 2.0, section
/// 5.2.1): event type in bits 2:0, event information in bits 15:8 and the log
/// page to read in bits 23:16.
const fn async_event(event_type: u8, information: u8, log_page: u8) -> u32 {
    (event_type as u32) | ((information as u32) << 8) | ((log_page as u32) << 16)
}

/// Notice (event type 2h) / Namespace Attribute Changed (information 00h) /
/// Changed Namespace List (log page 04h).
pub const NAMESPACE_ATTRIBUTE_CHANGED: u32 = async_event(0x2, 0x00, log_id::CHANGED_NAMESPACES);

/// Notice (event type 2h) / Asymmetric Namespace Access Change (information
/// 03h) / ANA log page (0Ch): what nvmet sends when an ANA group's state
/// changes, and what makes a Linux host re-read the ANA log page.
pub const ANA_CHANGED: u32 = async_event(0x2, 0x03, log_id::ANA);

/// Notice (event type 2h) / Discovery Log Page Change (information F0h) /
/// Discovery log page (70h): what Linux nvmet sends, and what a host's
/// persistent discovery connection acts on (udev: connect what is new).
pub const DISCOVERY_LOG_CHANGED: u32 = async_event(0x2, 0xF0, log_id::DISCOVERY);

/// CSTS bits.
mod csts {
    pub const READY: u32 = 1 << 0;
    pub const FATAL: u32 = 1 << 1;
    pub const SHUTDOWN_COMPLETE: u32 = 0b10 << 2;
}

/// What executing an admin command leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Complete now with `status`, command-specific `result` and `reply_len` bytes of data for the host.
    Complete {
        /// Completion status.
        status: Status,
        /// DW0 (and DW1).
        result: u64,
        /// Bytes of the slot buffer to send to the host.
        reply_len: u32,
    },
    /// Complete with success and `len` bytes of data for the host, of which
    /// the slot buffer holds the first `filled`: the rest are zeroes (a log
    /// page read past its end), which the connection zeroes as its driver
    /// does best (see [`crate::SlotBuffers::zero`]).
    DataThenZeroes {
        /// Bytes of data written to the slot buffer.
        filled: u32,
        /// Bytes for the host, `filled` or more.
        len: u32,
    },
    /// The command stays outstanding (an Asynchronous Event Request).
    Parked,
}

impl Outcome {
    pub(crate) fn status(status: Status) -> Outcome {
        Outcome::Complete {
            status,
            result: 0,
            reply_len: 0,
        }
    }

    fn result(result: u64) -> Outcome {
        Outcome::Complete {
            status: Status::SUCCESS,
            result,
            reply_len: 0,
        }
    }

    fn data(reply_len: usize) -> Outcome {
        Outcome::Complete {
            status: Status::SUCCESS,
            result: 0,
            reply_len: reply_len as u32,
        }
    }

    fn data_then_zeroes(filled: usize, len: usize) -> Outcome {
        debug_assert!(filled <= len, "{filled} bytes filled of {len}");
        Outcome::DataThenZeroes {
            filled: filled as u32,
            len: len as u32,
        }
    }
}

/// The Changed Namespace List (NVMe Base 2.0, section 5.16.1.5): NSIDs in
/// increasing order, each once. "If more than 1,024 namespaces have changed
/// attributes since the last time the log page was read, the first entry in
/// the log page shall be set to FFFFFFFFh": the list is then that one entry.
#[derive(Debug, Default)]
struct ChangedNamespaces {
    nsids: Vec<Nsid>,
}

impl ChangedNamespaces {
    fn record(&mut self, nsid: Nsid) {
        debug_assert_ne!(nsid, Nsid::BROADCAST, "not a namespace");
        if self.overflowed() {
            return;
        }
        if let Err(at) = self.nsids.binary_search(&nsid) {
            if self.nsids.len() == identify::CHANGED_NAMESPACES_MAX {
                self.nsids.clear();
                self.nsids.push(Nsid::BROADCAST);
            } else {
                self.nsids.insert(at, nsid);
            }
        }
    }

    fn overflowed(&self) -> bool {
        self.nsids == [Nsid::BROADCAST]
    }
}

/// Where the Namespace Attribute Notice event type stands (NVMe Base 2.0, section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoticeState {
    /// Nothing to report.
    Idle,
    /// An event occurred; the next Asynchronous Event Request reports it.
    Pending,
    /// Reported, so masked: "subsequent events of that event type are
    /// automatically masked by the controller until the host clears that
    /// event", by reading its log page with RAE cleared.
    Masked,
}

/// State of one controller's admin queue.
#[derive(Debug)]
pub struct AdminQueue {
    /// The controller this queue belongs to.
    pub controller: Arc<ControllerShared>,
    /// I/O or discovery controller.
    pub kind: ControllerKind,
    cc: u32,
    csts: u32,
    keep_alive: Option<Duration>,
    keep_alive_deadline: Option<Timestamp>,
    async_event_config: u32,
    changed_namespaces: ChangedNamespaces,
    namespace_notice: NoticeState,
    /// CHGCNT of the ANA log page: "each time the contents of this log page
    /// changes, this value shall be incremented" (NVMe Base 2.0, Figure
    /// 223), rolling over from FFFFFFFF_FFFFFFFFh to 0. Starts at 0, as
    /// nvmet's count does.
    ana_change_count: u64,
    ana_notice: NoticeState,
    discovery_notice: NoticeState,
    /// Slots holding outstanding Asynchronous Event Requests.
    pub parked_events: Vec<SlotId>,
}

impl AdminQueue {
    /// The admin queue of a new controller; `kato_ms` 0 disables keep-alive.
    pub fn new(
        controller: Arc<ControllerShared>,
        kind: ControllerKind,
        kato_ms: u32,
        now: Timestamp,
    ) -> AdminQueue {
        let keep_alive = (kato_ms > 0).then(|| Duration::from_millis(u64::from(kato_ms)));
        AdminQueue {
            controller,
            kind,
            cc: 0,
            csts: 0,
            keep_alive,
            keep_alive_deadline: keep_alive.map(|kato| keep_alive_expiry(now, kato)),
            async_event_config: 0,
            changed_namespaces: ChangedNamespaces::default(),
            namespace_notice: NoticeState::Idle,
            ana_change_count: 0,
            ana_notice: NoticeState::Idle,
            discovery_notice: NoticeState::Idle,
            parked_events: Vec::new(),
        }
    }

    /// The configuration changed from `old` to `new` under this I/O
    /// controller's subsystem: records the namespaces that were added,
    /// removed or changed, and raises a Namespace Attribute Changed event if
    /// the host enabled those notices and the event type is not masked.
    pub fn namespaces_changed(&mut self, old: &SubsystemConfig, new: &SubsystemConfig) {
        debug_assert_eq!(self.kind, ControllerKind::Io);
        let changed = old.changed_namespaces(new);
        for &nsid in &changed {
            self.changed_namespaces.record(nsid);
        }
        let enabled = self.async_event_config & AEC_NAMESPACE_ATTRIBUTE_NOTICES != 0;
        if !changed.is_empty() && enabled && self.namespace_notice == NoticeState::Idle {
            self.namespace_notice = NoticeState::Pending;
        }
    }

    /// The configuration changed from `old` to `new` under this I/O
    /// controller's subsystem: if what the ANA log page reports changed, its
    /// change count moves on; if the group or its state changed, raises an
    /// ANA Change event when the host enabled those notices and the event
    /// type is not masked (NVMe Base 2.0, section 5.2: masked once reported,
    /// until the host reads the ANA log page with RAE cleared).
    pub fn ana_changed(&mut self, old: &SubsystemConfig, new: &SubsystemConfig) {
        debug_assert_eq!(self.kind, ControllerKind::Io);
        let group_changed = old.ana != new.ana;
        let nsid = |ns: &crate::target::NamespaceConfig| ns.nsid;
        let nsids_changed = !old
            .namespaces
            .iter()
            .map(nsid)
            .eq(new.namespaces.iter().map(nsid));
        if group_changed || nsids_changed {
            self.ana_change_count = self.ana_change_count.wrapping_add(1);
        }
        let enabled = self.async_event_config & AEC_ANA_CHANGE_NOTICES != 0;
        if group_changed && enabled && self.ana_notice == NoticeState::Idle {
            self.ana_notice = NoticeState::Pending;
        }
    }

    /// The configuration changed from `old` to `new` under this discovery
    /// controller: if what its host's discovery log lists changed, raises a
    /// Discovery Log Page Change event (when the host enabled those notices
    /// and the event type is not masked), as nvmet does.
    pub fn discovery_changed(&mut self, old: &TargetConfig, new: &TargetConfig) {
        debug_assert_eq!(self.kind, ControllerKind::Discovery);
        let host = &self.controller.hostnqn;
        let changed = !host_discovery_records(old, host).eq(host_discovery_records(new, host));
        let enabled = self.async_event_config & AEC_DISCOVERY_LOG_CHANGE_NOTICES != 0;
        if changed && enabled && self.discovery_notice == NoticeState::Idle {
            self.discovery_notice = NoticeState::Pending;
        }
    }

    /// The completion DW0 of an event waiting to be reported, if any; the
    /// caller completes an Asynchronous Event Request with it.
    pub fn take_async_event(&mut self) -> Option<u32> {
        if self.namespace_notice == NoticeState::Pending {
            self.namespace_notice = NoticeState::Masked;
            return Some(NAMESPACE_ATTRIBUTE_CHANGED);
        }
        if self.ana_notice == NoticeState::Pending {
            self.ana_notice = NoticeState::Masked;
            return Some(ANA_CHANGED);
        }
        if self.discovery_notice == NoticeState::Pending {
            self.discovery_notice = NoticeState::Masked;
            return Some(DISCOVERY_LOG_CHANGED);
        }
        None
    }

    /// When the keep-alive timer expires, if it runs.
    pub fn keep_alive_deadline(&self) -> Option<Timestamp> {
        self.keep_alive_deadline
    }

    fn restart_keep_alive(&mut self, now: Timestamp) {
        self.keep_alive_deadline = self.keep_alive.map(|kato| keep_alive_expiry(now, kato));
    }
}

/// When a keep-alive timer restarted at `now` expires: KATO rounded up to
/// the timer's granularity, "rounded up according to the KAS granularity"
/// (NVMe Base 2.0, 5.27.1.12), plus one granule of slack. A Linux host
/// sends Keep Alive every half KATO, so a host that chose a short KATO
/// (1 s, to give up quickly on a hung node's paths) would lose a live
/// controller to one Keep Alive that a loaded machine delayed by half a
/// second; with the granule it takes 1.5 s. A host that is gone is let go
/// one second later.
fn keep_alive_expiry(now: Timestamp, kato: Duration) -> Timestamp {
    let granule = identify::KEEP_ALIVE_GRANULE;
    // KATO is a u32 of milliseconds: at most 4,294,968 granules, no overflow.
    let granules = kato.as_nanos().div_ceil(granule.as_nanos()) as u32;
    now.after(granule * (granules + 1))
}

/// Executes one admin-queue command whose data (if any) is in `buffer`.
pub fn execute(
    queue: &mut AdminQueue,
    config: &TargetConfig,
    command: &Command,
    buffer: &mut [u8],
    now: Timestamp,
) -> Outcome {
    if command.is_fabrics() {
        return fabrics(queue, config, command);
    }
    let subsystem = config.subsystem(&queue.controller.subnqn);
    if queue.kind == ControllerKind::Io && subsystem.is_none() {
        // The connection ends when its subsystem leaves the configuration, so
        // this is a snapshot the connection was not told about.
        return Outcome::status(Status::INTERNAL_ERROR);
    }
    if !queue.controller.is_ready() && command.opcode != admin_opcode::KEEP_ALIVE {
        return Outcome::status(Status::COMMAND_SEQUENCE_ERROR);
    }
    match command.opcode {
        admin_opcode::IDENTIFY => identify(queue, config, subsystem, command, buffer),
        admin_opcode::GET_LOG_PAGE => get_log_page(queue, config, subsystem, command, buffer),
        admin_opcode::SET_FEATURES => set_features(queue, &config.limits, command, now),
        admin_opcode::GET_FEATURES => get_features(queue, command, buffer),
        admin_opcode::ASYNC_EVENT_REQUEST => async_event_request(queue, &config.limits),
        admin_opcode::KEEP_ALIVE => {
            queue.restart_keep_alive(now);
            Outcome::result(0)
        }
        // Abort: DW0 bit 0 set = command not aborted (as nvmet; commands finish quickly).
        admin_opcode::ABORT => Outcome::result(1),
        _ => Outcome::status(Status::INVALID_OPCODE),
    }
}

fn fabrics(queue: &mut AdminQueue, config: &TargetConfig, command: &Command) -> Outcome {
    match command.fctype() {
        fctype::PROPERTY_GET => {
            property_get(queue, &config.limits, PropertyCommand::decode(command))
        }
        fctype::PROPERTY_SET => property_set(queue, PropertyCommand::decode(command)),
        // A second Connect on a connected queue.
        fctype::CONNECT => Outcome::status(Status::COMMAND_SEQUENCE_ERROR),
        _ => Outcome::status(Status::INVALID_OPCODE),
    }
}

/// Asynchronous Event Request (NVMe Base 2.0, section 5.2): an event that
/// occurred while no request was outstanding completes this one at once;
/// otherwise it stays outstanding until an event occurs.
fn async_event_request(queue: &mut AdminQueue, limits: &Limits) -> Outcome {
    if let Some(event) = queue.take_async_event() {
        return Outcome::result(u64::from(event));
    }
    if queue.parked_events.len() >= usize::from(limits.async_events_max) {
        return Outcome::status(Status::AER_LIMIT_EXCEEDED);
    }
    Outcome::Parked
}

fn property_get(queue: &AdminQueue, limits: &Limits, property: PropertyCommand) -> Outcome {
    let (value, eight_bytes) = match property.offset {
        property::CAP => {
            let mqes = u64::from(limits.queue_entries_max - 1);
            // CQR (bit 16): contiguous queues required; TO (31:24): 15 * 500 ms ready timeout;
            // CSS bit 37: NVM command set. MPSMIN = MPSMAX = 0 (4 KiB).
            (mqes | (1 << 16) | (15 << 24) | (1 << 37), true)
        }
        property::VS => (u64::from(identify::NVME_VERSION), false),
        property::CC => (u64::from(queue.cc), false),
        property::CSTS => (u64::from(queue.csts), false),
        _ => return Outcome::status(Status::INVALID_FIELD),
    };
    if property.eight_bytes != eight_bytes {
        return Outcome::status(Status::INVALID_FIELD);
    }
    Outcome::result(value)
}

fn property_set(queue: &mut AdminQueue, property: PropertyCommand) -> Outcome {
    if property.offset != property::CC || property.eight_bytes {
        return Outcome::status(Status::INVALID_FIELD);
    }
    let new = property.value as u32;
    let old = queue.cc;
    queue.cc = new;
    let enable = new & cc::ENABLE != 0;
    let was_enabled = old & cc::ENABLE != 0;
    if enable && !was_enabled {
        start_controller(queue);
    } else if !enable && was_enabled {
        // Controller reset: I/O queues of the old epoch close.
        queue.controller.set_ready(false);
        queue.csts = 0;
    }
    if cc::shn(new) != 0 && cc::shn(old) == 0 {
        // Nothing is cached in the controller: shutdown completes at once.
        queue.csts |= csts::SHUTDOWN_COMPLETE;
    } else if cc::shn(new) == 0 {
        queue.csts &= !csts::SHUTDOWN_COMPLETE;
    }
    Outcome::result(0)
}

/// CC.EN 0 -> 1: check the configuration the host chose (as nvmet does) and become ready.
fn start_controller(queue: &mut AdminQueue) {
    let io_entry_sizes_ok = queue.kind == ControllerKind::Discovery
        || (cc::iosqes(queue.cc) == 6 && cc::iocqes(queue.cc) == 4);
    if !io_entry_sizes_ok || cc::mps(queue.cc) != 0 || cc::css(queue.cc) != 0 {
        queue.csts = csts::FATAL;
        return;
    }
    queue.csts = csts::READY;
    queue.controller.set_ready(true);
}

fn identify(
    queue: &AdminQueue,
    config: &TargetConfig,
    subsystem: Option<&SubsystemConfig>,
    command: &Command,
    buffer: &mut [u8],
) -> Outcome {
    if command.sgl.length as usize != identify::IDENTIFY_LEN {
        return Outcome::status(Status::SGL_LENGTH_INVALID);
    }
    let out = &mut buffer[..identify::IDENTIFY_LEN];
    out.fill(0);
    let cns = command.cdw(10) as u8;
    let csi = (command.cdw(11) >> 24) as u8;
    if cns == cns::CONTROLLER {
        identify::controller(&controller_identity(queue, config, subsystem), out);
        return Outcome::data(identify::IDENTIFY_LEN);
    }
    let Some(subsystem) = subsystem else {
        // The discovery controller has no namespaces.
        return Outcome::status(Status::INVALID_FIELD);
    };
    let nsid = command.nsid;
    let active = subsystem.namespace(nsid);
    let written = match cns {
        cns::NAMESPACE if nsid.0 == 0 || nsid == Nsid::BROADCAST => {
            return Outcome::status(Status::INVALID_NAMESPACE)
        }
        // An inactive NSID returns a zeroed structure.
        cns::NAMESPACE => active.map_or(identify::IDENTIFY_LEN, |ns| {
            identify::namespace(ns, &subsystem.ana, out)
        }),
        cns::ACTIVE_NAMESPACES | cns::CS_ACTIVE_NAMESPACES
            if cns == cns::ACTIVE_NAMESPACES || csi == 0 =>
        {
            if nsid.0 >= 0xFFFF_FFFE {
                return Outcome::status(Status::INVALID_NAMESPACE);
            }
            identify::active_namespaces(subsystem, nsid, out)
        }
        cns::NS_DESCRIPTORS => match active {
            Some(ns) => identify::namespace_descriptors(ns, out),
            None => return Outcome::status(Status::INVALID_NAMESPACE),
        },
        // The NVM command set specific structures: all fields zero is valid (no extended LBA formats).
        cns::CS_NAMESPACE if csi == 0 => match active {
            Some(_) => identify::IDENTIFY_LEN,
            None => return Outcome::status(Status::INVALID_NAMESPACE),
        },
        cns::CS_CONTROLLER if csi == 0 => identify::IDENTIFY_LEN,
        cns::CS_INDEPENDENT_NAMESPACE => active.map_or(identify::IDENTIFY_LEN, |ns| {
            identify::cs_independent_namespace(ns, &subsystem.ana, out)
        }),
        cns::COMMAND_SETS => identify::command_sets(out),
        _ => return Outcome::status(Status::INVALID_FIELD),
    };
    Outcome::data(written)
}

fn controller_identity<'a>(
    queue: &AdminQueue,
    config: &'a TargetConfig,
    subsystem: Option<&'a SubsystemConfig>,
) -> ControllerIdentity<'a> {
    let limits = &config.limits;
    let mdts = (limits.transfer_bytes_max / 4096).trailing_zeros() as u8;
    let (subnqn, serial, model, firmware, max_nsid) = match subsystem {
        Some(s) => (
            s.nqn.as_str(),
            s.serial.as_str(),
            s.model.as_str(),
            s.firmware.as_str(),
            s.max_nsid(),
        ),
        None => (
            crate::target::DISCOVERY_NQN,
            config.discovery_serial.as_str(),
            "weft discovery",
            env!("CARGO_PKG_VERSION"),
            0,
        ),
    };
    let (max_nsid, max_namespaces) = match subsystem {
        Some(_) => identify::namespace_limits(max_nsid, limits.transfer_bytes_max),
        None => (0, 0),
    };
    ControllerIdentity {
        kind: queue.kind,
        cntlid: queue.controller.cntlid,
        subnqn,
        serial,
        model,
        firmware,
        max_nsid,
        max_namespaces,
        mdts,
        max_commands: limits.queue_entries_max,
        io_in_capsule_bytes: limits.io_in_capsule_bytes_max,
        async_events_max: limits.async_events_max,
    }
}

/// Get Log Page fields (NVMe Base 2.0, Figures 197-200).
struct LogRequest {
    id: u8,
    /// LSP (CDW10 bits 14:08): log specific field.
    specific: u8,
    offset: u64,
    len: usize,
    /// RAE (CDW10 bit 15): reading the page leaves its event uncleared.
    retain_event: bool,
}

/// LSP bit 0 of the ANA log page: Return Groups Only (RGO), the group
/// descriptors without their NSIDs (NVMe Base 2.0, Figure 199).
const ANA_LSP_GROUPS_ONLY: u8 = 1 << 0;

impl LogRequest {
    fn decode(command: &Command) -> Result<LogRequest, Status> {
        // NUMDU:NUMDL is 0's based: up to 2^32 dwords, 2^34 bytes, in u64.
        let dwords = u64::from((command.cdw(11) & 0xFFFF) << 16 | command.cdw(10) >> 16) + 1;
        let offset = u64::from(command.cdw(12)) | (u64::from(command.cdw(13)) << 32);
        if offset % 4 != 0 {
            return Err(Status::INVALID_FIELD);
        }
        // The SGL length is at most a slot buffer (checked before any
        // command runs), so the length that equals it indexes the buffer.
        if dwords * 4 != u64::from(command.sgl.length) {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        Ok(LogRequest {
            id: command.cdw(10) as u8,
            specific: ((command.cdw(10) >> 8) & 0x7F) as u8,
            offset,
            len: command.sgl.length as usize,
            retain_event: command.cdw(10) & (1 << 15) != 0,
        })
    }
}

fn get_log_page(
    queue: &mut AdminQueue,
    config: &TargetConfig,
    subsystem: Option<&SubsystemConfig>,
    command: &Command,
    buffer: &mut [u8],
) -> Outcome {
    let request = match LogRequest::decode(command) {
        Ok(request) => request,
        Err(status) => return Outcome::status(status),
    };
    let out = &mut buffer[..request.len];
    if request.id == log_id::DISCOVERY {
        if queue.kind != ControllerKind::Discovery {
            return Outcome::status(Status::INVALID_LOG_PAGE);
        }
        // Only the page's own bytes are written: the rest of a transfer as
        // large as the host likes (anyone may connect to discovery) holds
        // no memory.
        let filled = discovery_log(config, &queue.controller.hostnqn, request.offset, out);
        // Reading the page with RAE cleared clears the event (NVMe Base 2.0, section 5.2).
        if !request.retain_event {
            queue.discovery_notice = NoticeState::Idle;
        }
        return Outcome::data_then_zeroes(filled, request.len);
    }
    out.fill(0);
    let Some(subsystem) = subsystem.filter(|_| queue.kind == ControllerKind::Io) else {
        return Outcome::status(Status::INVALID_LOG_PAGE);
    };
    if request.id == log_id::ANA {
        ana_log(queue, subsystem, &request, out);
        return Outcome::data(request.len);
    }
    if request.id == crate::intent::INTENT_LOG {
        let Some(intent) = &subsystem.intent else {
            return Outcome::status(Status::INVALID_LOG_PAGE);
        };
        intent.log_page(request.offset, out);
        return Outcome::data(request.len);
    }
    // Every other page fits in 4 KiB: build it whole, then copy the window asked for.
    let mut page = [0u8; 4096];
    let page_len = match request.id {
        log_id::ERROR => identify::ERROR_ENTRY_LEN,
        log_id::SMART => identify::smart(&health(&queue.controller), &mut page),
        log_id::FIRMWARE_SLOT => identify::firmware_slot(&subsystem.firmware, &mut page),
        log_id::CHANGED_NAMESPACES => changed_namespace_list(queue, &request, &mut page),
        _ => return Outcome::status(Status::INVALID_LOG_PAGE),
    };
    copy_window(&page[..page_len], request.offset, out);
    Outcome::data(request.len)
}

/// The Changed Namespace List. Reading it with RAE cleared clears the list and
/// the Namespace Attribute Changed event, which unmasks the event type
/// (NVMe Base 2.0, section 5.2).
fn changed_namespace_list(queue: &mut AdminQueue, request: &LogRequest, page: &mut [u8]) -> usize {
    let len = identify::changed_namespaces(&queue.changed_namespaces.nsids, page);
    if !request.retain_event {
        queue.changed_namespaces.nsids.clear();
        queue.namespace_notice = NoticeState::Idle;
    }
    len
}

/// The ANA log page (NVMe Base 2.0, section 5.16.1.13) of an I/O controller,
/// generated only for the window [offset, offset + out.len()) (bytes past
/// the page's end stay zero): one group descriptor, the subsystem's group
/// with its state, followed by the subsystem's NSIDs in ascending order
/// unless the host asked for groups only (RGO). Reading it with RAE cleared
/// clears the ANA Change event, which unmasks the event type (section 5.2).
///
/// The page is at most 16 + 32 + 4 * NSIDs bytes, within the ANA log page a
/// Linux host sizes from NANAGRPID and MNAN (see
/// [`identify::namespace_limits`]), which fits MDTS.
fn ana_log(
    queue: &mut AdminQueue,
    subsystem: &SubsystemConfig,
    request: &LogRequest,
    out: &mut [u8],
) {
    let groups_only = request.specific & ANA_LSP_GROUPS_ONLY != 0;
    let namespaces: &[crate::target::NamespaceConfig] = if groups_only {
        &[]
    } else {
        &subsystem.namespaces
    };
    debug_assert!(namespaces
        .windows(2)
        .all(|pair| pair[0].nsid < pair[1].nsid));
    let offset = request.offset;
    let mut header = [0u8; identify::ANA_HEADER_LEN];
    identify::ana_header(queue.ana_change_count, 1, &mut header);
    copy_into_window(&header, 0, offset, out);
    let mut descriptor = [0u8; identify::ANA_DESCRIPTOR_LEN];
    // NNSIDS: a subsystem's namespaces fit a u32 (NSIDs are distinct u32s).
    identify::ana_group_descriptor(
        &subsystem.ana,
        namespaces.len() as u32,
        queue.ana_change_count,
        &mut descriptor,
    );
    const DESCRIPTOR_AT: u64 = identify::ANA_HEADER_LEN as u64;
    copy_into_window(&descriptor, DESCRIPTOR_AT, offset, out);
    const NSIDS_AT: u64 = DESCRIPTOR_AT + identify::ANA_DESCRIPTOR_LEN as u64;
    let window_end = offset.saturating_add(out.len() as u64);
    for (index, ns) in (0u64..).zip(namespaces) {
        let position = NSIDS_AT + index * 4;
        if position >= window_end {
            break;
        }
        copy_into_window(&ns.nsid.0.to_le_bytes(), position, offset, out);
    }
    if !request.retain_event {
        queue.ana_notice = NoticeState::Idle;
    }
}

/// Copies `page[offset..]` into `out`; bytes past the page's end stay zero.
fn copy_window(page: &[u8], offset: u64, out: &mut [u8]) {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(page.len());
    let available = &page[start..];
    let len = available.len().min(out.len());
    out[..len].copy_from_slice(&available[..len]);
}

/// Discovery log page for host `hostnqn`, generated only for the window
/// [offset, offset + out.len()); returns how many bytes of `out` that is
/// (bytes past the page's end are not written: they are zeroes).
/// Subsystems the host may not connect to are left out, as Linux nvmet does.
fn discovery_log(config: &TargetConfig, hostnqn: &str, offset: u64, out: &mut [u8]) -> usize {
    let records = host_discovery_records(config, hostnqn);
    let count = records.clone().count() as u64;
    let page_len = identify::DISCOVERY_HEADER_LEN as u64 + count * DISCOVERY_ENTRY_BYTES;
    if offset >= page_len {
        return 0;
    }
    // Within the window: less than a slot buffer.
    let filled = (page_len - offset).min(out.len() as u64) as usize;
    // From here the offset lies within the page, so the window's end
    // (offset plus at most a slot buffer) cannot overflow.
    let window_end = offset + out.len() as u64;
    let mut header = [0u8; identify::DISCOVERY_HEADER_LEN];
    identify::discovery_header(config.generation, count, &mut header);
    copy_into_window(&header, 0, offset, out);
    let mut entry = [0u8; identify::DISCOVERY_ENTRY_LEN];
    for (index, record) in (0u64..).zip(records) {
        let position = identify::DISCOVERY_HEADER_LEN as u64 + index * DISCOVERY_ENTRY_BYTES;
        if position >= window_end {
            break;
        }
        if position + DISCOVERY_ENTRY_BYTES <= offset {
            continue;
        }
        entry.fill(0);
        identify::discovery_entry(&record, &mut entry);
        copy_into_window(&entry, position, offset, out);
    }
    filled
}

/// The records of host `hostnqn`'s discovery log: subsystems it may not
/// connect to are left out, as Linux nvmet does.
fn host_discovery_records<'a>(
    config: &'a TargetConfig,
    hostnqn: &'a str,
) -> impl Iterator<Item = identify::DiscoveryRecord<'a>> + Clone {
    identify::discovery_records(&config.subsystems, &config.listeners, &config.referrals)
        .filter(move |record| {
            record.kind != identify::RecordKind::Nvm
                || config
                    .subsystem(record.subnqn)
                    .is_some_and(|s| s.access.allows(hostnqn) && !s.fenced)
        })
        .map(move |mut record| {
            record.tls = record.kind == identify::RecordKind::Nvm
                && config
                    .subsystem(record.subnqn)
                    .is_some_and(|s| s.access.tls_psk_of(hostnqn).is_some());
            record
        })
}

/// Length of one discovery log entry, in the u64 arithmetic of log page offsets.
const DISCOVERY_ENTRY_BYTES: u64 = identify::DISCOVERY_ENTRY_LEN as u64;

/// Copies `piece`, which sits at `position` of a log page, into the window of
/// the page that starts at `window_offset` and is `out.len()` long. The
/// window's offset comes from the host: its end saturates at u64::MAX, where
/// no page reaches.
fn copy_into_window(piece: &[u8], position: u64, window_offset: u64, out: &mut [u8]) {
    let piece_end = position + piece.len() as u64;
    let window_end = window_offset.saturating_add(out.len() as u64);
    let start = position.max(window_offset);
    let end = piece_end.min(window_end);
    if start >= end {
        return;
    }
    // Offsets within the piece and the window, both slices: they fit usize.
    let from = (start - position) as usize;
    let to = (start - window_offset) as usize;
    let len = (end - start) as usize;
    out[to..to + len].copy_from_slice(&piece[from..from + len]);
}

fn health(controller: &ControllerShared) -> Health {
    let counters = &controller.counters;
    Health {
        read_bytes: counters.read_bytes.load(Ordering::Relaxed),
        written_bytes: counters.written_bytes.load(Ordering::Relaxed),
        read_commands: counters.read_commands.load(Ordering::Relaxed),
        write_commands: counters.write_commands.load(Ordering::Relaxed),
    }
}

fn set_features(
    queue: &mut AdminQueue,
    limits: &Limits,
    command: &Command,
    now: Timestamp,
) -> Outcome {
    if command.cdw(10) & (1 << 31) != 0 {
        return Outcome::status(Status::FEATURE_NOT_SAVEABLE);
    }
    let value = command.cdw(11);
    match command.cdw(10) as u8 {
        feature::NUMBER_OF_QUEUES if queue.kind == ControllerKind::Io => {
            let (submission, completion) = (value & 0xFFFF, value >> 16);
            if submission == 0xFFFF || completion == 0xFFFF {
                return Outcome::status(Status::INVALID_FIELD);
            }
            let granted = u32::from(limits.io_queues_max);
            queue.controller.grant_io_queues(granted);
            // NSQA/NCQA, 0's based: every controller gets the maximum, as nvmet does.
            Outcome::result(u64::from((granted - 1) | ((granted - 1) << 16)))
        }
        feature::ASYNC_EVENT_CONFIG => {
            queue.async_event_config = value;
            Outcome::result(0)
        }
        feature::KEEP_ALIVE_TIMER => {
            queue.keep_alive = (value > 0).then(|| Duration::from_millis(u64::from(value)));
            queue.restart_keep_alive(now);
            Outcome::result(0)
        }
        feature::VOLATILE_WRITE_CACHE if queue.kind == ControllerKind::Io => {
            queue
                .controller
                .write_cache_enabled
                .store(value & 1 != 0, Ordering::Release);
            Outcome::result(0)
        }
        // The host identifier is fixed by Connect (NVMe-oF 1.1, section 3.3).
        feature::HOST_IDENTIFIER => Outcome::status(Status::COMMAND_SEQUENCE_ERROR),
        _ => Outcome::status(Status::INVALID_FIELD),
    }
}

fn get_features(queue: &AdminQueue, command: &Command, buffer: &mut [u8]) -> Outcome {
    // SEL 011b: supported capabilities; none of weft's features are saveable or namespace specific.
    let select = (command.cdw(10) >> 8) & 0x7;
    let id = command.cdw(10) as u8;
    let controller = &queue.controller;
    let value = match id {
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | feature::TEMPERATURE_THRESHOLD
        | feature::ERROR_RECOVERY
        | feature::INTERRUPT_COALESCING
        | feature::INTERRUPT_VECTOR_CONFIG
        | feature::WRITE_ATOMICITY => 0,
        feature::VOLATILE_WRITE_CACHE => {
            u32::from(controller.write_cache_enabled.load(Ordering::Acquire))
        }
        feature::NUMBER_OF_QUEUES => {
            let granted = controller.io_queues_granted().max(1) - 1;
            granted | (granted << 16)
        }
        feature::ASYNC_EVENT_CONFIG => queue.async_event_config,
        // Set from a u32 of milliseconds (Connect KATO or Set Features): it fits.
        feature::KEEP_ALIVE_TIMER => queue.keep_alive.map_or(0, |kato| kato.as_millis() as u32),
        feature::HOST_IDENTIFIER => {
            // Only the 128-bit extended host identifier exists over Fabrics (EXHID must be set).
            if command.cdw(11) & 1 == 0 || command.sgl.length != 16 {
                return Outcome::status(Status::INVALID_FIELD);
            }
            buffer[..16].copy_from_slice(&controller.host_id);
            return Outcome::data(16);
        }
        _ => return Outcome::status(Status::INVALID_FIELD),
    };
    Outcome::result(u64::from(if select == 3 { 0 } else { value }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::ControllerRegistry;
    use crate::testing;
    use crate::wire::hex;

    /// A ready admin queue of a `kind` controller of the test target.
    fn admin_queue(kind: ControllerKind) -> (AdminQueue, Arc<TargetConfig>) {
        let config = testing::test_target().config();
        let subnqn = match kind {
            ControllerKind::Io => testing::TEST_NQN,
            ControllerKind::Discovery => crate::target::DISCOVERY_NQN,
        };
        let controller = ControllerRegistry::default()
            .create(subnqn, testing::HOST_NQN, testing::HOST_ID, 8)
            .expect("a controller ID");
        controller.set_ready(true);
        let queue = AdminQueue::new(controller, kind, 0, Timestamp::default());
        (queue, config)
    }

    fn run(queue: &mut AdminQueue, config: &TargetConfig, sqe: &str) -> (Outcome, Vec<u8>) {
        let command = Command::decode(&hex(sqe)).expect("an SQE");
        let mut buffer = vec![0xEE; config.limits.slot_buffer_bytes()];
        let outcome = execute(queue, config, &command, &mut buffer, Timestamp::default());
        (outcome, buffer)
    }

    /// Get Log Page with LPO FFFFFFFF_FFFFFFFCh, the last dword-aligned offset:
    /// the window lies past the end of every page, so it reads as zeroes
    /// (the end of the window used to overflow u64).
    #[test]
    fn log_page_offsets_near_the_end_of_u64_read_zeroes() {
        // Discovery log (LID 70h), NUMDL FFh (1024 bytes), LPOL FFFFFFFCh, LPOU FFFFFFFFh.
        let discovery = "02 40 0300 ffffffff 0000000000000000 0000000000000000
                         0000000000000000 00040000 000000 5a
                         7000ff00 00000000 fcffffff ffffffff 00000000 00000000";
        let (mut queue, config) = admin_queue(ControllerKind::Discovery);
        let (outcome, buffer) = run(&mut queue, &config, discovery);
        // Nothing of the page is in the window: the connection zeroes it all.
        assert_eq!(outcome, Outcome::data_then_zeroes(0, 1024));
        assert!(buffer[..1024].iter().all(|&b| b == 0xEE), "not written");
        // SMART (LID 02h), NUMDL 7Fh (512 bytes), the same offset.
        let smart = "02 40 0400 ffffffff 0000000000000000 0000000000000000
                     0000000000000000 00020000 000000 5a
                     02007f00 00000000 fcffffff ffffffff 00000000 00000000";
        let (mut queue, config) = admin_queue(ControllerKind::Io);
        let (outcome, buffer) = run(&mut queue, &config, smart);
        assert_eq!(outcome, Outcome::data(512));
        assert!(buffer[..512].iter().all(|&b| b == 0));
    }

    /// NUMDU:NUMDL FFFFFFFFh asks for 16 GiB: a length no SGL can match.
    #[test]
    fn the_largest_log_page_length_is_refused_by_the_sgl_check() {
        let (mut queue, config) = admin_queue(ControllerKind::Io);
        let all_dwords = "02 40 0500 ffffffff 0000000000000000 0000000000000000
                          0000000000000000 00000000 000000 5a
                          0200ffff ffff0000 00000000 00000000 00000000 00000000";
        let (outcome, _) = run(&mut queue, &config, all_dwords);
        assert_eq!(outcome, Outcome::status(Status::SGL_LENGTH_INVALID));
    }

    #[test]
    fn log_window_copies_the_overlap_only() {
        let mut out = [0u8; 8];
        copy_into_window(&[1, 2, 3, 4], 6, 4, &mut out);
        assert_eq!(out, [0, 0, 1, 2, 3, 4, 0, 0]);
        let mut out = [0u8; 2];
        copy_into_window(&[1, 2, 3, 4], 6, 7, &mut out);
        assert_eq!(out, [2, 3]);
        copy_window(&[9, 9], 100, &mut out);
        assert_eq!(out, [2, 3], "an offset past the page copies nothing");
        copy_into_window(&[9, 9], 0, u64::MAX - 1, &mut out);
        assert_eq!(out, [2, 3], "a window ending past u64::MAX copies nothing");
    }

    #[test]
    fn changed_namespace_list_is_sorted_and_overflows_to_one_marker() {
        let mut list = ChangedNamespaces::default();
        for nsid in [5, 1, 5, 3] {
            list.record(Nsid(nsid));
        }
        assert_eq!(list.nsids, [Nsid(1), Nsid(3), Nsid(5)]);
        for nsid in 1..=1024 {
            list.record(Nsid(nsid));
        }
        assert_eq!(list.nsids.len(), 1024, "1024 entries fit");
        list.record(Nsid(1025));
        assert_eq!(list.nsids, [Nsid::BROADCAST]);
        list.record(Nsid(2));
        assert_eq!(list.nsids, [Nsid::BROADCAST], "overflowed until read");
    }

    #[test]
    fn async_event_dword_zero_layout() {
        assert_eq!(NAMESPACE_ATTRIBUTE_CHANGED, 0x0004_0002);
        // Linux: NVME_AER_NOTICE (2) | NVME_AER_NOTICE_ANA (03h) << 8 | NVME_LOG_ANA (0Ch) << 16.
        assert_eq!(ANA_CHANGED, 0x000C_0302);
        assert_eq!(DISCOVERY_LOG_CHANGED, 0x0070_F002);
    }

    #[test]
    fn keep_alive_expires_a_granule_after_kato_rounded_up() {
        let now = Timestamp(Duration::from_secs(10));
        let expiry = |kato_ms| keep_alive_expiry(now, Duration::from_millis(kato_ms)).0;
        assert_eq!(expiry(400), Duration::from_secs(12));
        assert_eq!(expiry(1000), Duration::from_secs(12));
        assert_eq!(expiry(1500), Duration::from_secs(13));
        assert_eq!(
            expiry(u64::from(u32::MAX)),
            Duration::from_secs(10 + 4_294_968 + 1)
        );
    }
}
