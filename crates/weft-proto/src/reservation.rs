//! NVMe reservations (NVMe Base 2.0, section 8.19, and the Reservation
//! Register, Acquire, Release and Report commands): which hosts are
//! registered with a namespace, which one holds its reservation, and which
//! I/O commands each host may run.
//!
//! A host is its 128-bit Host Identifier (Connect's HOSTID): every
//! controller of one host shares its registration, as the spec wants.
//! [`ReservationState::apply`] is the whole command semantics as a pure
//! function; [`ReservationCell`] is the state as the data plane reads it,
//! shared by every queue that serves the namespace.
//!
//! The cell counts writes on their way to the media (each host's while a
//! reservation is held, all of them on one counter while none is), so that
//! a change that takes write access from a host completes only once it has
//! none left (as Preempt and Abort asks; the node waits with
//! [`ReservationCell::drained`]): no write of a fenced host lands after the
//! host that fenced it was told so.
//!
//! What this module does not do: persist the state (the node writes it to
//! its store before a command completes, see `weft-node`), send
//! reservation notifications (no Reservation Notification log page), or
//! abort commands (a fenced host's writes already under way finish first).
//!
//! The state always persists through power loss (RESCAP bit 0, PTPLS 1):
//! a Register that asks to clear PTPL is refused. Linux's own persistent
//! reservation calls always ask to set it.

use crate::status::Status;
use crate::wire::Writer;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Reservation Register.
pub const REGISTER_OPCODE: u8 = 0x0D;
/// Reservation Report.
pub const REPORT_OPCODE: u8 = 0x0E;
/// Reservation Acquire.
pub const ACQUIRE_OPCODE: u8 = 0x11;
/// Reservation Release.
pub const RELEASE_OPCODE: u8 = 0x15;

/// RESCAP of a namespace with reservations: persist through power loss,
/// all six types, and IEKEY as NVMe 1.3 defines it (bit 7).
pub const RESCAP: u8 = 0xFF;

/// Length of the extended Reservation Status header and of each extended
/// Registered Controller data structure (NVMe Base 2.0, Figures 400-401).
const EXTENDED_ENTRY_BYTES: usize = 64;

/// Registered hosts one namespace may have: a Register beyond is answered
/// Reservation Conflict (the spec names no status for it; nvmet has no
/// limit). Failover clusters register a handful.
pub const REGISTRANTS_MAX: usize = 64;

/// The controller ID reported for every registrant: weft's controllers are
/// dynamic (a registration belongs to a host, not to one controller).
const DYNAMIC_CNTLID: u16 = 0xFFFF;

/// A host as reservations know it: its Host Identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostIdentifier(pub [u8; 16]);

/// The six reservation types (NVMe Base 2.0, Figure 396).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReservationType {
    /// Only the holder writes; everyone reads.
    WriteExclusive = 1,
    /// Only the holder reads or writes.
    ExclusiveAccess = 2,
    /// Registrants write; everyone reads.
    WriteExclusiveRegistrantsOnly = 3,
    /// Only registrants read or write.
    ExclusiveAccessRegistrantsOnly = 4,
    /// Registrants write (each one a holder); everyone reads.
    WriteExclusiveAllRegistrants = 5,
    /// Only registrants (each one a holder) read or write.
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    /// The type with code `raw`, if there is one.
    pub fn from_raw(raw: u8) -> Option<ReservationType> {
        use ReservationType::*;
        Some(match raw {
            1 => WriteExclusive,
            2 => ExclusiveAccess,
            3 => WriteExclusiveRegistrantsOnly,
            4 => ExclusiveAccessRegistrantsOnly,
            5 => WriteExclusiveAllRegistrants,
            6 => ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant holds the reservation.
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ReservationType::WriteExclusiveAllRegistrants
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants that do not hold it may still read and write.
    fn registrants_access(self) -> bool {
        !matches!(
            self,
            ReservationType::WriteExclusive | ReservationType::ExclusiveAccess
        )
    }

    /// Reads are restricted too.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            ReservationType::ExclusiveAccess
                | ReservationType::ExclusiveAccessRegistrantsOnly
                | ReservationType::ExclusiveAccessAllRegistrants
        )
    }
}

/// A registered host and its reservation key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// The host.
    pub host: HostIdentifier,
    /// Its reservation key.
    pub key: u64,
}

/// A namespace's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// The host that acquired it (for the all-registrants types, one of the
    /// holders: every registrant holds it).
    pub holder: HostIdentifier,
    /// Its type.
    pub kind: ReservationType,
}

/// Registrants and reservation of one namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationState {
    /// Persist Through Power Loss generation: counts successful Register
    /// commands, preemptions and clears.
    pub generation: u32,
    /// Registered hosts, in registration order.
    pub registrants: Vec<Registrant>,
    /// The reservation, if one is held.
    pub reservation: Option<Reservation>,
}

/// What an I/O command does to a namespace, as reservations see it
/// (NVMe Base 2.0, Figure 395, and the NVM Command Set's command groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read, Compare.
    Read,
    /// Write, Write Zeroes, Dataset Management, Flush.
    Write,
}

/// Reservation Register's action (RREGA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// Register the new key.
    Register,
    /// Unregister.
    Unregister,
    /// Replace the key with the new one.
    Replace,
}

/// Reservation Acquire's action (RACQA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    /// Acquire.
    Acquire,
    /// Preempt the registrants with the preempt key.
    Preempt,
    /// Preempt, aborting their commands (here: as Preempt).
    PreemptAndAbort,
}

/// Reservation Release's action (RRELA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Release the reservation held.
    Release,
    /// Release it and unregister every host.
    Clear,
}

/// A Reservation Register, Acquire or Release command with its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationCommand {
    /// Reservation Register.
    Register {
        /// What to do.
        action: RegisterAction,
        /// Ignore Existing Key: do not check the current key.
        ignore_key: bool,
        /// Current reservation key (CRKEY).
        current_key: u64,
        /// New reservation key (NRKEY).
        new_key: u64,
    },
    /// Reservation Acquire.
    Acquire {
        /// What to do.
        action: AcquireAction,
        /// The type to acquire.
        kind: ReservationType,
        /// Current reservation key (CRKEY).
        current_key: u64,
        /// Preempt reservation key (PRKEY).
        preempt_key: u64,
    },
    /// Reservation Release.
    Release {
        /// What to do.
        action: ReleaseAction,
        /// The type to release (RTYPE, as sent: it must match the one held).
        kind: u8,
        /// Current reservation key (CRKEY).
        current_key: u64,
    },
}

impl ReservationCommand {
    /// Bytes of data the command with `opcode` carries (its keys), if it
    /// is one of the three that change the state.
    pub fn data_len(opcode: u8) -> Option<u32> {
        match opcode {
            REGISTER_OPCODE | ACQUIRE_OPCODE => Some(16),
            RELEASE_OPCODE => Some(8),
            _ => None,
        }
    }

    /// Decodes the command from its CDW10 and data (at least
    /// [`ReservationCommand::data_len`] bytes, checked by the caller).
    pub fn decode(opcode: u8, cdw10: u32, data: &[u8]) -> Result<ReservationCommand, Status> {
        let key = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
        let action = cdw10 & 0x7;
        let ignore_key = cdw10 & (1 << 3) != 0;
        let kind = (cdw10 >> 8) as u8;
        match opcode {
            REGISTER_OPCODE => {
                let action = match action {
                    0 => RegisterAction::Register,
                    1 => RegisterAction::Unregister,
                    2 => RegisterAction::Replace,
                    _ => return Err(Status::INVALID_FIELD),
                };
                // CPTPL, bits 31:30: 00b no change, 11b set. Clearing it
                // (10b) would ask for state lost at power loss, which weft
                // does not offer; 01b is reserved.
                if !matches!(cdw10 >> 30, 0b00 | 0b11) {
                    return Err(Status::INVALID_FIELD);
                }
                Ok(ReservationCommand::Register {
                    action,
                    ignore_key,
                    current_key: key(0),
                    new_key: key(8),
                })
            }
            ACQUIRE_OPCODE => {
                let action = match action {
                    0 => AcquireAction::Acquire,
                    1 => AcquireAction::Preempt,
                    2 => AcquireAction::PreemptAndAbort,
                    _ => return Err(Status::INVALID_FIELD),
                };
                // IEKEY is reserved in Acquire since NVMe 1.3 (RESCAP bit 7).
                if ignore_key {
                    return Err(Status::INVALID_FIELD);
                }
                let kind = ReservationType::from_raw(kind).ok_or(Status::INVALID_FIELD)?;
                Ok(ReservationCommand::Acquire {
                    action,
                    kind,
                    current_key: key(0),
                    preempt_key: key(8),
                })
            }
            RELEASE_OPCODE => {
                let action = match action {
                    0 => ReleaseAction::Release,
                    1 => ReleaseAction::Clear,
                    _ => return Err(Status::INVALID_FIELD),
                };
                if ignore_key {
                    return Err(Status::INVALID_FIELD);
                }
                Ok(ReservationCommand::Release {
                    action,
                    kind,
                    current_key: key(0),
                })
            }
            _ => Err(Status::INVALID_OPCODE),
        }
    }
}

impl ReservationState {
    /// The registrant `host`, if registered.
    pub fn registrant(&self, host: HostIdentifier) -> Option<&Registrant> {
        self.registrants.iter().find(|r| r.host == host)
    }

    /// Whether `host` holds the reservation.
    pub fn holds(&self, host: HostIdentifier) -> bool {
        match self.reservation {
            Some(r) if r.kind.all_registrants() => self.registrant(host).is_some(),
            Some(r) => r.holder == host,
            None => false,
        }
    }

    /// Whether `host` may run a command with `access` (NVMe Base 2.0,
    /// Figure 395): Reservation Conflict if not.
    pub fn check(&self, host: HostIdentifier, access: Access) -> Result<(), Status> {
        let Some(reservation) = self.reservation else {
            return Ok(());
        };
        let restricted = access == Access::Write || reservation.kind.exclusive_access();
        let allowed = !restricted
            || self.holds(host)
            || (reservation.kind.registrants_access() && self.registrant(host).is_some());
        if allowed {
            Ok(())
        } else {
            Err(Status::RESERVATION_CONFLICT)
        }
    }

    /// The state after `host` ran `command`, or the status that refuses it
    /// (the state is then unchanged).
    pub fn apply(
        &self,
        host: HostIdentifier,
        command: ReservationCommand,
    ) -> Result<ReservationState, Status> {
        let mut next = self.clone();
        match command {
            ReservationCommand::Register {
                action,
                ignore_key,
                current_key,
                new_key,
            } => next.register(host, action, ignore_key, current_key, new_key)?,
            ReservationCommand::Acquire {
                action,
                kind,
                current_key,
                preempt_key,
            } => {
                next.check_key(host, current_key)?;
                match action {
                    AcquireAction::Acquire => next.acquire(host, kind)?,
                    AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                        next.preempt(host, kind, preempt_key)?;
                        next.generation = next.generation.wrapping_add(1);
                    }
                }
            }
            ReservationCommand::Release {
                action,
                kind,
                current_key,
            } => {
                next.check_key(host, current_key)?;
                match action {
                    ReleaseAction::Release => next.release(host, kind)?,
                    ReleaseAction::Clear => {
                        next.reservation = None;
                        next.registrants.clear();
                        next.generation = next.generation.wrapping_add(1);
                    }
                }
            }
        }
        Ok(next)
    }

    /// Reservation Conflict unless `host` is registered with `key`.
    fn check_key(&self, host: HostIdentifier, key: u64) -> Result<(), Status> {
        match self.registrant(host) {
            Some(registrant) if registrant.key == key => Ok(()),
            _ => Err(Status::RESERVATION_CONFLICT),
        }
    }

    fn register(
        &mut self,
        host: HostIdentifier,
        action: RegisterAction,
        ignore_key: bool,
        current_key: u64,
        new_key: u64,
    ) -> Result<(), Status> {
        let registered = self.registrant(host).map(|r| r.key);
        match (action, registered) {
            // Registering again with the key held is no change; with
            // another key it is a conflict.
            (RegisterAction::Register, Some(key)) if key != new_key => {
                return Err(Status::RESERVATION_CONFLICT)
            }
            (RegisterAction::Register, Some(_)) => {}
            // Registrants are a resource hosts hold (each one a commit to
            // the node's store): a namespace has at most REGISTRANTS_MAX.
            (RegisterAction::Register, None) if self.registrants.len() >= REGISTRANTS_MAX => {
                return Err(Status::RESERVATION_CONFLICT)
            }
            (RegisterAction::Register, None) => {
                self.registrants.push(Registrant { host, key: new_key })
            }
            (_, None) => return Err(Status::RESERVATION_CONFLICT),
            (_, Some(key)) if !ignore_key && key != current_key => {
                return Err(Status::RESERVATION_CONFLICT)
            }
            (RegisterAction::Unregister, Some(_)) => self.unregister(host),
            (RegisterAction::Replace, Some(_)) => {
                let registrant = self
                    .registrants
                    .iter_mut()
                    .find(|r| r.host == host)
                    .expect("registered");
                registrant.key = new_key;
            }
        }
        self.generation = self.generation.wrapping_add(1);
        Ok(())
    }

    /// Removes `host`'s registration; a reservation it held goes with it,
    /// except an all-registrants one while other registrants remain.
    fn unregister(&mut self, host: HostIdentifier) {
        self.registrants.retain(|r| r.host != host);
        if let Some(reservation) = &mut self.reservation {
            if reservation.kind.all_registrants() {
                match self.registrants.first() {
                    Some(next) if reservation.holder == host => reservation.holder = next.host,
                    Some(_) => {}
                    None => self.reservation = None,
                }
            } else if reservation.holder == host {
                self.reservation = None;
            }
        }
    }

    fn acquire(&mut self, host: HostIdentifier, kind: ReservationType) -> Result<(), Status> {
        match self.reservation {
            None => {
                self.reservation = Some(Reservation { holder: host, kind });
                Ok(())
            }
            Some(held) if self.holds(host) && held.kind == kind => Ok(()),
            Some(_) => Err(Status::RESERVATION_CONFLICT),
        }
    }

    /// Preempt (NVMe Base 2.0, section 8.19.7 and Figure 397).
    fn preempt(
        &mut self,
        host: HostIdentifier,
        kind: ReservationType,
        preempt_key: u64,
    ) -> Result<(), Status> {
        let Some(held) = self.reservation else {
            return self.unregister_by_key(preempt_key, None);
        };
        if held.kind.all_registrants() {
            if preempt_key == 0 {
                self.reservation = Some(Reservation { holder: host, kind });
                self.unregister_others(host);
                return Ok(());
            }
            return self.unregister_by_key(preempt_key, None);
        }
        let holder_key = self.registrant(held.holder).map(|r| r.key);
        if holder_key == Some(preempt_key) {
            self.reservation = Some(Reservation { holder: host, kind });
            // The preempted holder goes (unless it preempts itself, to
            // change the type); the new one stays even when its key is the
            // same.
            let _ = self.unregister_by_key(preempt_key, Some(host));
            return Ok(());
        }
        if preempt_key == 0 {
            return Err(Status::INVALID_FIELD);
        }
        self.unregister_by_key(preempt_key, None)
    }

    /// Unregisters every host registered with `key` but `keep`; Reservation
    /// Conflict if there is none.
    fn unregister_by_key(&mut self, key: u64, keep: Option<HostIdentifier>) -> Result<(), Status> {
        let hosts: Vec<HostIdentifier> = self
            .registrants
            .iter()
            .filter(|r| r.key == key && Some(r.host) != keep)
            .map(|r| r.host)
            .collect();
        if hosts.is_empty() && keep.is_none() {
            return Err(Status::RESERVATION_CONFLICT);
        }
        for host in hosts {
            self.unregister(host);
        }
        Ok(())
    }

    fn unregister_others(&mut self, host: HostIdentifier) {
        self.registrants.retain(|r| r.host == host);
    }

    fn release(&mut self, host: HostIdentifier, kind: u8) -> Result<(), Status> {
        let Some(held) = self.reservation else {
            return Ok(());
        };
        if !self.holds(host) {
            // Releasing a reservation one does not hold is no change.
            return Ok(());
        }
        if held.kind as u8 != kind {
            return Err(Status::INVALID_FIELD);
        }
        self.reservation = None;
        Ok(())
    }

    /// Reservation Report: the extended Reservation Status data structure
    /// (NVMe Base 2.0, Figure 400) in `out`, truncated to its length;
    /// returns the bytes written. Only the extended structure is offered,
    /// since Host Identifiers are 128-bit on NVMe over Fabrics (without
    /// EDS: Host Identifier Inconsistent Format).
    pub fn report(&self, extended: bool, out: &mut [u8]) -> Result<usize, Status> {
        if !extended {
            return Err(Status::HOST_ID_INCONSISTENT_FORMAT);
        }
        let len = EXTENDED_ENTRY_BYTES * (1 + self.registrants.len());
        let mut full = vec![0u8; len];
        let mut w = Writer::new(&mut full);
        w.u32(0, self.generation)
            .u8(4, self.reservation.map_or(0, |r| r.kind as u8))
            .u16(5, self.registrants.len() as u16)
            .u8(9, 1); // PTPLS: the state persists through power loss.
        for (index, registrant) in self.registrants.iter().enumerate() {
            let at = EXTENDED_ENTRY_BYTES * (index + 1);
            w.u16(at, DYNAMIC_CNTLID)
                .u8(at + 2, u8::from(self.holds(registrant.host)))
                .u64(at + 8, registrant.key)
                .bytes(at + 16, &registrant.host.0);
        }
        let written = len.min(out.len());
        out[..written].copy_from_slice(&full[..written]);
        Ok(written)
    }
}

/// The reservation state of one namespace as the data plane reads it: every
/// queue serving the namespace shares one cell, and the node installs each
/// new state (once it is durable) before the command that made it completes.
///
/// No I/O takes a lock: while no reservation is held a command reads one
/// flag (a write also bumps one counter); while one is held, each queue
/// keeps a [`ReservationView`] of the state, checked against the cell's
/// version (one atomic load) and refreshed under the cell's lock only when
/// a new state was installed. A write is counted on the state it was
/// admitted under, in its host's counter, and re-checked against the
/// version once counted, so that a state installed meanwhile either sees
/// the count or refuses the write.
#[derive(Debug, Default)]
pub struct ReservationCell {
    held: AtomicBool,
    /// Bumped by every install, after the new state is current.
    version: AtomicU64,
    /// Writes admitted while no reservation was held, still on their way
    /// to the media (not attributed to a host: a change that takes write
    /// access from any host waits for all of them).
    unheld_writes: AtomicU64,
    installed: Mutex<Installed>,
}

#[derive(Debug, Default)]
struct Installed {
    revision: u64,
    current: Arc<Generation>,
    /// Every state installed that a write may still be counted on.
    generations: Vec<Weak<Generation>>,
}

/// One installed state and, per registrant (by index), its writes on their
/// way to the media (only registrants write while a reservation is held).
#[derive(Debug, Default)]
pub struct Generation {
    state: ReservationState,
    writing: Box<[AtomicU32]>,
}

impl Generation {
    fn new(state: ReservationState) -> Generation {
        let writing = state
            .registrants
            .iter()
            .map(|_| AtomicU32::new(0))
            .collect();
        Generation { state, writing }
    }
}

/// A queue's copy of the state it last read, with the version it was
/// installed at.
#[derive(Debug)]
pub struct ReservationView {
    version: u64,
    generation: Arc<Generation>,
}

/// How a write was counted by [`ReservationCell::enter_write`].
#[derive(Debug)]
pub enum CountedWrite {
    /// Admitted while no reservation was held.
    Unheld,
    /// Admitted under a reservation, as registrant `index` of `generation`.
    Registrant {
        /// The state it was admitted under.
        generation: Arc<Generation>,
        /// Its host's place among that state's registrants.
        index: usize,
    },
}

impl ReservationCell {
    /// A cell with no registrant.
    pub fn new() -> ReservationCell {
        ReservationCell::default()
    }

    /// Whether `host` may run a command with `access` now; `view` is the
    /// asking queue's copy of the state (refreshed when stale).
    pub fn check(
        &self,
        view: &mut Option<ReservationView>,
        host: HostIdentifier,
        access: Access,
    ) -> Result<(), Status> {
        if !self.held.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.current_view(view).generation.state.check(host, access)
    }

    /// [`ReservationCell::check`] for a command that changes data, which
    /// is counted: the caller calls [`ReservationCell::written`] with the
    /// count once the media answered.
    pub fn enter_write(
        &self,
        view: &mut Option<ReservationView>,
        host: HostIdentifier,
    ) -> Result<CountedWrite, Status> {
        // Counted before the flag is read: a write racing with an Acquire
        // is counted one way or the other.
        self.unheld_writes.fetch_add(1, Ordering::SeqCst);
        if !self.held.load(Ordering::SeqCst) {
            return Ok(CountedWrite::Unheld);
        }
        self.unheld_writes.fetch_sub(1, Ordering::SeqCst);
        loop {
            let seen = self.current_view(view);
            let generation = Arc::clone(&seen.generation);
            let version = seen.version;
            generation.state.check(host, Access::Write)?;
            // A registrant's write counts as its own; any other (the state
            // holds no reservation any more) as one admitted unheld.
            let index = generation
                .state
                .registrants
                .iter()
                .position(|r| r.host == host);
            let counted = match index {
                Some(index) => {
                    generation.writing[index].fetch_add(1, Ordering::SeqCst);
                    CountedWrite::Registrant { generation, index }
                }
                None => {
                    self.unheld_writes.fetch_add(1, Ordering::SeqCst);
                    CountedWrite::Unheld
                }
            };
            if self.version.load(Ordering::SeqCst) == version {
                return Ok(counted);
            }
            // A new state was installed meanwhile: check against it.
            self.written(counted);
        }
    }

    /// A counted write is done (or will never reach the media).
    pub fn written(&self, counted: CountedWrite) {
        match counted {
            CountedWrite::Unheld => {
                self.unheld_writes.fetch_sub(1, Ordering::SeqCst);
            }
            CountedWrite::Registrant { generation, index } => {
                generation.writing[index].fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Whether no host that `before` let write and the installed state does
    /// not has a write on its way to the media (when one lost write access,
    /// no write admitted while nothing was held either).
    pub fn drained(&self, before: &ReservationState) -> bool {
        let installed = self.lock();
        let now = &installed.current.state;
        let lost = |host: HostIdentifier| {
            before.check(host, Access::Write).is_ok() && now.check(host, Access::Write).is_err()
        };
        let anyone_lost = before.registrants.iter().any(|r| lost(r.host))
            || before.reservation.is_none() && now.reservation.is_some();
        if anyone_lost && self.unheld_writes.load(Ordering::SeqCst) > 0 {
            return false;
        }
        installed
            .generations
            .iter()
            .filter_map(Weak::upgrade)
            .all(|generation| {
                let registrants = generation.state.registrants.iter();
                registrants
                    .zip(generation.writing.iter())
                    .all(|(r, count)| !lost(r.host) || count.load(Ordering::SeqCst) == 0)
            })
    }

    /// The state installed and the revision it was installed at.
    pub fn state(&self) -> (u64, ReservationState) {
        let installed = self.lock();
        (installed.revision, installed.current.state.clone())
    }

    /// Installs `state` made at `revision` (of the node's store), unless a
    /// state of a later revision is installed already; whether it was.
    pub fn install(&self, revision: u64, state: ReservationState) -> bool {
        let mut installed = self.lock();
        if revision <= installed.revision && installed.revision != 0 {
            return false;
        }
        let held = state.reservation.is_some();
        let generation = Arc::new(Generation::new(state));
        installed.generations.retain(|g| g.strong_count() > 0);
        installed.generations.push(Arc::downgrade(&generation));
        installed.current = generation;
        installed.revision = revision;
        self.version.fetch_add(1, Ordering::SeqCst);
        self.held.store(held, Ordering::SeqCst);
        true
    }

    /// `view`, refreshed under the lock if a newer state was installed.
    fn current_view<'a>(&self, view: &'a mut Option<ReservationView>) -> &'a ReservationView {
        let version = self.version.load(Ordering::SeqCst);
        if view.as_ref().is_none_or(|v| v.version != version) {
            let installed = self.lock();
            *view = Some(ReservationView {
                version: self.version.load(Ordering::SeqCst),
                generation: Arc::clone(&installed.current),
            });
        }
        view.as_ref().expect("set above")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Installed> {
        // A panic while installing leaves a whole state behind: go on.
        self.installed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Two cells are equal when they are the same object (a configuration
/// compares equal only if it shares the namespace's live cell).
impl PartialEq for ReservationCell {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for ReservationCell {}

#[cfg(test)]
mod tests {
    use super::*;
    use ReservationType::*;

    const A: HostIdentifier = HostIdentifier([0xA; 16]);
    const B: HostIdentifier = HostIdentifier([0xB; 16]);
    const C: HostIdentifier = HostIdentifier([0xC; 16]);

    fn register(state: &ReservationState, host: HostIdentifier, key: u64) -> ReservationState {
        let command = ReservationCommand::Register {
            action: RegisterAction::Register,
            ignore_key: false,
            current_key: 0,
            new_key: key,
        };
        state.apply(host, command).expect("registers")
    }

    fn acquire(
        action: AcquireAction,
        kind: ReservationType,
        key: u64,
        preempt_key: u64,
    ) -> ReservationCommand {
        ReservationCommand::Acquire {
            action,
            kind,
            current_key: key,
            preempt_key,
        }
    }

    fn registered(hosts: &[(HostIdentifier, u64)]) -> ReservationState {
        hosts
            .iter()
            .fold(ReservationState::default(), |state, &(host, key)| {
                register(&state, host, key)
            })
    }

    #[test]
    fn decodes_register_acquire_and_release_from_cdw10_and_data() {
        let data = hex("1100000000000000 2200000000000000");
        // RREGA 2 (replace), IEKEY, CPTPL 11b.
        assert_eq!(
            ReservationCommand::decode(REGISTER_OPCODE, 0xC000_000A, &data),
            Ok(ReservationCommand::Register {
                action: RegisterAction::Replace,
                ignore_key: true,
                current_key: 0x11,
                new_key: 0x22,
            })
        );
        // CPTPL 10b: clearing persistence is not offered.
        assert_eq!(
            ReservationCommand::decode(REGISTER_OPCODE, 0x8000_0000, &data),
            Err(Status::INVALID_FIELD)
        );
        // RACQA 2 (preempt and abort), RTYPE 4.
        assert_eq!(
            ReservationCommand::decode(ACQUIRE_OPCODE, 0x0000_0402, &data),
            Ok(acquire(
                AcquireAction::PreemptAndAbort,
                ExclusiveAccessRegistrantsOnly,
                0x11,
                0x22
            ))
        );
        assert_eq!(
            ReservationCommand::decode(ACQUIRE_OPCODE, 0x0000_0700, &data),
            Err(Status::INVALID_FIELD),
            "RTYPE 7"
        );
        assert_eq!(
            ReservationCommand::decode(RELEASE_OPCODE, 0x0000_0101, &data[..8]),
            Ok(ReservationCommand::Release {
                action: ReleaseAction::Clear,
                kind: 1,
                current_key: 0x11,
            })
        );
        assert_eq!(
            ReservationCommand::decode(RELEASE_OPCODE, 0x0000_0008, &data[..8]),
            Err(Status::INVALID_FIELD),
            "IEKEY in Release"
        );
    }

    #[test]
    fn registration_needs_the_right_key_unless_told_to_ignore_it() {
        let state = registered(&[(A, 1)]);
        assert_eq!(state.generation, 1);
        assert_eq!(register(&state, A, 1).generation, 2, "same key: success");
        let again = ReservationCommand::Register {
            action: RegisterAction::Register,
            ignore_key: false,
            current_key: 0,
            new_key: 2,
        };
        assert_eq!(state.apply(A, again), Err(Status::RESERVATION_CONFLICT));
        let replace = |ignore_key, current_key| ReservationCommand::Register {
            action: RegisterAction::Replace,
            ignore_key,
            current_key,
            new_key: 9,
        };
        assert_eq!(
            state.apply(A, replace(false, 5)),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            state.apply(B, replace(true, 0)),
            Err(Status::RESERVATION_CONFLICT)
        );
        let replaced = state.apply(A, replace(true, 5)).expect("IEKEY");
        assert_eq!(replaced.registrant(A).map(|r| r.key), Some(9));
    }

    #[test]
    fn a_namespace_takes_at_most_its_registrants_limit() {
        let mut state = ReservationState::default();
        for host in 0..REGISTRANTS_MAX {
            state = register(&state, HostIdentifier([host as u8 + 1; 16]), 1);
        }
        let one_more = ReservationCommand::Register {
            action: RegisterAction::Register,
            ignore_key: false,
            current_key: 0,
            new_key: 1,
        };
        let refused = state.apply(HostIdentifier([0xFF; 16]), one_more);
        assert_eq!(refused, Err(Status::RESERVATION_CONFLICT));
        assert!(
            state.apply(HostIdentifier([1; 16]), one_more).is_ok(),
            "registered already"
        );
    }

    #[test]
    fn write_exclusive_lets_everyone_read_and_only_the_holder_write() {
        let state = registered(&[(A, 1), (B, 2)]);
        let state = state
            .apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0))
            .expect("acquires");
        assert_eq!(state.check(A, Access::Write), Ok(()));
        assert_eq!(state.check(B, Access::Read), Ok(()));
        assert_eq!(
            state.check(B, Access::Write),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            state.check(C, Access::Write),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            state.apply(B, acquire(AcquireAction::Acquire, WriteExclusive, 2, 0)),
            Err(Status::RESERVATION_CONFLICT),
            "held by another"
        );
        assert_eq!(
            state.apply(A, acquire(AcquireAction::Acquire, ExclusiveAccess, 1, 0)),
            Err(Status::RESERVATION_CONFLICT),
            "another type"
        );
        assert_eq!(
            state.apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 7, 0)),
            Err(Status::RESERVATION_CONFLICT),
            "wrong key"
        );
    }

    #[test]
    fn each_type_restricts_what_the_spec_says() {
        // (type, holder write, registrant read, registrant write, other read, other write)
        let table = [
            (WriteExclusive, true, true, false, true, false),
            (ExclusiveAccess, true, false, false, false, false),
            (WriteExclusiveRegistrantsOnly, true, true, true, true, false),
            (
                ExclusiveAccessRegistrantsOnly,
                true,
                true,
                true,
                false,
                false,
            ),
            (WriteExclusiveAllRegistrants, true, true, true, true, false),
            (
                ExclusiveAccessAllRegistrants,
                true,
                true,
                true,
                false,
                false,
            ),
        ];
        for (kind, holder_write, reg_read, reg_write, other_read, other_write) in table {
            let state = registered(&[(A, 1), (B, 2)])
                .apply(A, acquire(AcquireAction::Acquire, kind, 1, 0))
                .expect("acquires");
            let ok = |host, access| state.check(host, access).is_ok();
            assert_eq!(ok(A, Access::Write), holder_write, "{kind:?}");
            assert_eq!(ok(B, Access::Read), reg_read, "{kind:?}");
            assert_eq!(ok(B, Access::Write), reg_write, "{kind:?}");
            assert_eq!(ok(C, Access::Read), other_read, "{kind:?}");
            assert_eq!(ok(C, Access::Write), other_write, "{kind:?}");
        }
    }

    #[test]
    fn preempting_the_holder_takes_its_reservation_and_registration() {
        let state = registered(&[(A, 1), (B, 2)])
            .apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0))
            .expect("acquires");
        let generation = state.generation;
        let state = state
            .apply(
                B,
                acquire(AcquireAction::PreemptAndAbort, ExclusiveAccess, 2, 1),
            )
            .expect("preempts");
        assert_eq!(state.registrant(A), None, "A is unregistered");
        assert_eq!(
            state.reservation,
            Some(Reservation {
                holder: B,
                kind: ExclusiveAccess
            })
        );
        assert_eq!(state.generation, generation + 1);
        assert_eq!(
            state.check(A, Access::Write),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            state.apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0)),
            Err(Status::RESERVATION_CONFLICT),
            "A's key is gone"
        );
    }

    #[test]
    fn a_holder_preempting_another_key_keeps_its_type_and_its_own_key_changes_it() {
        let state = registered(&[(A, 1), (B, 2)])
            .apply(
                A,
                acquire(AcquireAction::Acquire, WriteExclusiveRegistrantsOnly, 1, 0),
            )
            .expect("acquires");
        let other = state
            .apply(A, acquire(AcquireAction::Preempt, WriteExclusive, 1, 2))
            .expect("preempts B");
        assert_eq!(other.registrant(B), None);
        assert_eq!(
            other.reservation.map(|r| r.kind),
            Some(WriteExclusiveRegistrantsOnly)
        );
        let own = state
            .apply(A, acquire(AcquireAction::Preempt, WriteExclusive, 1, 1))
            .expect("preempts itself");
        assert_eq!(own.registrants.len(), 2, "B keeps its registration");
        assert_eq!(
            own.reservation,
            Some(Reservation {
                holder: A,
                kind: WriteExclusive
            })
        );
    }

    #[test]
    fn preempting_without_a_reservation_or_with_an_unknown_key() {
        let state = registered(&[(A, 1), (B, 2)]);
        let preempt = |key| acquire(AcquireAction::Preempt, WriteExclusive, 2, key);
        let state = state.apply(B, preempt(1)).expect("unregisters A");
        assert_eq!(state.registrants.len(), 1);
        assert_eq!(state.reservation, None);
        assert_eq!(
            state.apply(B, preempt(7)),
            Err(Status::RESERVATION_CONFLICT)
        );
        let held = registered(&[(A, 1), (B, 2)])
            .apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0))
            .expect("acquires");
        assert_eq!(held.apply(B, preempt(0)), Err(Status::INVALID_FIELD));
    }

    #[test]
    fn an_all_registrants_reservation_outlives_its_acquirer_and_yields_to_key_zero() {
        let state = registered(&[(A, 1), (B, 2), (C, 3)])
            .apply(
                A,
                acquire(AcquireAction::Acquire, WriteExclusiveAllRegistrants, 1, 0),
            )
            .expect("acquires");
        assert!(state.holds(B), "every registrant holds it");
        let unregister = ReservationCommand::Register {
            action: RegisterAction::Unregister,
            ignore_key: false,
            current_key: 1,
            new_key: 0,
        };
        let state = state.apply(A, unregister).expect("unregisters");
        assert!(state.reservation.is_some(), "B and C still hold it");
        let state = state
            .apply(B, acquire(AcquireAction::Preempt, ExclusiveAccess, 2, 0))
            .expect("key 0 preempts every other registrant");
        assert_eq!(state.registrants, vec![Registrant { host: B, key: 2 }]);
        assert_eq!(state.reservation.map(|r| r.kind), Some(ExclusiveAccess));
    }

    #[test]
    fn release_needs_the_type_held_and_clear_forgets_everyone() {
        let state = registered(&[(A, 1), (B, 2)])
            .apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0))
            .expect("acquires");
        let release = |kind, key| ReservationCommand::Release {
            action: ReleaseAction::Release,
            kind,
            current_key: key,
        };
        assert_eq!(state.apply(A, release(2, 1)), Err(Status::INVALID_FIELD));
        assert_eq!(
            state.apply(A, release(1, 9)),
            Err(Status::RESERVATION_CONFLICT)
        );
        assert_eq!(
            state
                .apply(B, release(1, 2))
                .map(|s| s.reservation.is_some()),
            Ok(true)
        );
        assert_eq!(
            state.apply(A, release(1, 1)).map(|s| s.reservation),
            Ok(None)
        );
        let clear = ReservationCommand::Release {
            action: ReleaseAction::Clear,
            kind: 0,
            current_key: 2,
        };
        let cleared = state.apply(B, clear).expect("clears");
        assert_eq!(cleared.registrants, vec![]);
        assert_eq!(cleared.reservation, None);
        assert_eq!(cleared.generation, state.generation + 1);
    }

    #[test]
    fn report_is_the_extended_structure() {
        let state = registered(&[(A, 0x1122)])
            .apply(
                A,
                acquire(AcquireAction::Acquire, WriteExclusive, 0x1122, 0),
            )
            .expect("acquires");
        let mut out = [0u8; 256];
        assert_eq!(
            state.report(false, &mut out),
            Err(Status::HOST_ID_INCONSISTENT_FORMAT)
        );
        assert_eq!(state.report(true, &mut out), Ok(128));
        let mut expected = hex("01000000 01 0100 0000 01 0000000000000000000000000000");
        expected.resize(64, 0);
        expected.extend(hex("ffff 01 0000000000 2211000000000000"));
        expected.extend([0xA; 16]);
        expected.resize(128, 0);
        assert_eq!(&out[..128], &expected[..]);
        let mut short = [0u8; 8];
        assert_eq!(
            state.report(true, &mut short),
            Ok(8),
            "truncated to the buffer"
        );
    }

    #[test]
    fn a_cell_installs_only_newer_revisions_and_a_view_follows_them() {
        let cell = ReservationCell::new();
        let mut view = None;
        assert_eq!(cell.check(&mut view, B, Access::Write), Ok(()));
        assert!(view.is_none(), "nothing held: no view needed");
        let held = registered(&[(A, 1)])
            .apply(A, acquire(AcquireAction::Acquire, WriteExclusive, 1, 0))
            .expect("acquires");
        assert!(cell.install(5, held));
        let conflict = cell.check(&mut view, B, Access::Write);
        assert_eq!(conflict, Err(Status::RESERVATION_CONFLICT));
        assert!(!cell.install(4, ReservationState::default()), "older");
        assert!(cell.install(6, ReservationState::default()));
        assert_eq!(cell.check(&mut view, B, Access::Write), Ok(()));
        assert_eq!(cell.state().0, 6);
    }

    #[test]
    fn a_preemption_is_drained_once_the_fenced_hosts_writes_are_done() {
        let cell = ReservationCell::new();
        let (mut view_a, mut view_b) = (None, None);
        let early = cell.enter_write(&mut view_b, B).expect("nothing held");
        assert!(matches!(early, CountedWrite::Unheld));
        let shared = registered(&[(A, 1), (B, 2)])
            .apply(
                A,
                acquire(AcquireAction::Acquire, WriteExclusiveRegistrantsOnly, 1, 0),
            )
            .expect("acquires");
        cell.install(1, shared.clone());
        let nothing = ReservationState::default();
        assert!(!cell.drained(&nothing), "B's early write");
        cell.written(early);
        assert!(cell.drained(&nothing));
        let b = cell.enter_write(&mut view_b, B).expect("a registrant");
        let a = cell.enter_write(&mut view_a, A).expect("the holder");
        assert!(matches!(b, CountedWrite::Registrant { index: 1, .. }));
        let fenced = shared
            .apply(
                A,
                acquire(AcquireAction::PreemptAndAbort, WriteExclusive, 1, 2),
            )
            .expect("preempts B");
        cell.install(2, fenced);
        let refused = cell.enter_write(&mut view_b, B).map(drop);
        assert_eq!(
            refused,
            Err(Status::RESERVATION_CONFLICT),
            "B's view follows"
        );
        assert!(!cell.drained(&shared), "B's write is on its way");
        cell.written(a);
        assert!(!cell.drained(&shared));
        cell.written(b);
        assert!(cell.drained(&shared));
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits: String = text.split_whitespace().collect();
        (0..digits.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&digits[at..at + 2], 16).expect("hex"))
            .collect()
    }
}
