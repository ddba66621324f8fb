//! NVM command set I/O commands: validation of a command against its
//! namespace (before any data moves), the block I/O requests the data plane
//! executes, and the status an I/O failure maps to.
//!
//! A command reaches a namespace only through a path that serves it: when
//! the subsystem's ANA group is Inaccessible, in Persistent Loss or in
//! Change on this target, every command that accesses a namespace fails
//! with the matching path status (see [`crate::ana::AnaState::io_status`]),
//! which the host retries on another path.

use crate::command::{io_opcode, Command};
use crate::reservation::{self, Access, HostIdentifier, ReservationCommand};
use crate::status::Status;
use crate::target::{NamespaceConfig, SubsystemConfig};
use crate::types::{Nsid, SlotId};

/// A block I/O request for the data plane. Offsets and lengths are bytes on
/// the namespace; `buffer_offset` is where in the slot's data buffer the data
/// lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRequest {
    /// Slot whose buffer holds the data and that completes when the request does.
    pub slot: SlotId,
    /// Namespace.
    pub nsid: Nsid,
    /// What to do.
    pub kind: IoKind,
}

/// Kinds of block I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read `len` bytes at `offset` into the slot buffer at `buffer_offset`.
    Read {
        /// Byte offset on the namespace.
        offset: u64,
        /// Length in bytes.
        len: u32,
        /// Offset in the slot buffer.
        buffer_offset: u32,
    },
    /// Write `len` bytes from the slot buffer.
    Write {
        /// Byte offset on the namespace.
        offset: u64,
        /// Length in bytes.
        len: u32,
        /// Offset in the slot buffer.
        buffer_offset: u32,
        /// Force unit access: on stable media before completion.
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
    /// Zero a byte range; `deallocate` lets a thin backend free it instead.
    WriteZeroes {
        /// Byte offset on the namespace.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// The host allows deallocation (DEAC).
        deallocate: bool,
        /// Force unit access: the zeroes are on stable media before completion.
        fua: bool,
    },
    /// Deallocate (discard/punch) a byte range; it reads back as zeroes.
    Deallocate {
        /// Byte offset on the namespace.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Take a snapshot of a replica's copy (a replica subsystem's vendor
    /// command): its name is the first `name_len` bytes of the slot buffer.
    Snapshot {
        /// Length of the name in bytes.
        name_len: u32,
    },
    /// Change the namespace's reservations: `host` ran `command` (see
    /// [`crate::reservation`]); the new state is durable and installed in
    /// the namespace's cell before the completion.
    Reserve {
        /// The host that sent it.
        host: HostIdentifier,
        /// The command with its keys.
        command: ReservationCommand,
    },
    /// Grow a replica's copy to `size_bytes` (a replica subsystem's vendor
    /// command).
    Grow {
        /// The new size in bytes.
        size_bytes: u64,
    },
}

/// How a block I/O failed, as the data plane classifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoError {
    /// Out of space on the backing store (ENOSPC, EDQUOT).
    NoSpace,
    /// The media failed (EIO).
    Media,
    /// The backing store failed earlier (an fdatasync or a FUA write):
    /// nothing is served from it until an operator clears the failure.
    Failed,
    /// The target cannot take the command now (a queue is full): the host
    /// may retry it.
    Busy,
    /// Not served on this path for now (a replicated volume's primary is
    /// being set up or handed over): ANA Transition, retried on any path.
    PathTransition,
    /// Not served on this path (this node is not the volume's primary):
    /// ANA Inaccessible, retried on another path.
    PathInaccessible,
    /// A reservation command conflicts with the registrations or the
    /// reservation held (Reservation Conflict).
    ReservationConflict,
    /// A reservation command's fields are wrong for the state (Invalid
    /// Field in Command, e.g. releasing another type than the one held).
    InvalidField,
    /// Anything else.
    Other,
}

impl IoKind {
    /// The byte range a write, Write Zeroes or Deallocate changes.
    pub fn written_range(&self) -> Option<(u64, u64)> {
        match *self {
            IoKind::Write { offset, len, .. } => Some((offset, u64::from(len))),
            IoKind::WriteZeroes { offset, len, .. } | IoKind::Deallocate { offset, len } => {
                Some((offset, len))
            }
            IoKind::Read { .. }
            | IoKind::Flush
            | IoKind::Snapshot { .. }
            | IoKind::Grow { .. }
            | IoKind::Reserve { .. } => None,
        }
    }
}

/// A validated I/O command: what to do once its data (if any) is in the slot buffer.
/// Fields are byte offsets and lengths on the namespace, as in [`IoKind`].
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPlan {
    /// Read: data flows to the host after completion.
    Read { nsid: Nsid, offset: u64, len: u32 },
    /// Write from the slot buffer.
    Write {
        nsid: Nsid,
        offset: u64,
        len: u32,
        fua: bool,
    },
    /// Compare host data (slot buffer front) with media (read into the slot buffer after it).
    Compare { nsid: Nsid, offset: u64, len: u32 },
    /// Flush one namespace or all.
    Flush { nsid: Nsid },
    /// Write Zeroes.
    WriteZeroes {
        nsid: Nsid,
        offset: u64,
        len: u64,
        deallocate: bool,
        fua: bool,
    },
    /// Dataset Management with `ranges` 16-byte range descriptors in the slot buffer.
    DatasetManagement {
        nsid: Nsid,
        ranges: u16,
        deallocate: bool,
    },
    /// A read grant's renewal (see [`crate::fence::GRANT_OPCODE`]): nothing
    /// but the fence's check.
    Grant,
    /// Clean: drop `regions` regions (u32s in the slot buffer) from the
    /// replica's write intent (see [`crate::intent`]).
    Clean { regions: u32 },
    /// Snapshot: take a snapshot of the replica's copy, named by the first
    /// `name_len` bytes of the slot buffer (see [`crate::intent`]).
    Snapshot { nsid: Nsid, name_len: u32 },
    /// Grow: grow the replica's copy to `size_bytes` (see [`crate::intent`]).
    Grow { nsid: Nsid, size_bytes: u64 },
    /// Reservation Register, Acquire or Release: decoded with its keys once
    /// its data is in the slot buffer (see [`crate::reservation`]).
    Reserve { nsid: Nsid, opcode: u8, cdw10: u32 },
    /// Reservation Report of `len` bytes, the extended structure if asked.
    ReservationReport {
        nsid: Nsid,
        len: u32,
        extended: bool,
    },
}

impl IoPlan {
    /// What the command does to its namespace, for its reservation check.
    pub fn access(&self) -> Option<(Nsid, Access)> {
        match *self {
            IoPlan::Read { nsid, .. } | IoPlan::Compare { nsid, .. } => Some((nsid, Access::Read)),
            IoPlan::Write { nsid, .. }
            | IoPlan::Flush { nsid }
            | IoPlan::WriteZeroes { nsid, .. }
            | IoPlan::DatasetManagement { nsid, .. } => Some((nsid, Access::Write)),
            IoPlan::Clean { .. }
            | IoPlan::Grant
            | IoPlan::Snapshot { .. }
            | IoPlan::Grow { .. }
            | IoPlan::Reserve { .. }
            | IoPlan::ReservationReport { .. } => None,
        }
    }
}

impl IoPlan {
    /// Validates an I/O command against the subsystem (NVM Command Set 1.0, section 3).
    /// `transfer_bytes_max` is the slot buffer size.
    ///
    /// The order of the checks is nvmet's: the opcode, the namespace, then
    /// the path's ANA state, then the command's own fields.
    pub fn from_command(
        command: &Command,
        subsystem: &SubsystemConfig,
        transfer_bytes_max: u32,
    ) -> Result<IoPlan, Status> {
        // "If the ANA state is ... Inaccessible ... then commands that ...
        // access user data ... shall be aborted" (NVMe Base 2.0, 8.1.3.3;
        // Persistent Loss 8.1.3.4 and Change 8.1.3.5 alike). Every
        // namespace of the subsystem is in its one group, so a Flush of all
        // namespaces is refused as one of any.
        let path = subsystem.ana.state.io_status();
        if command.opcode == io_opcode::FLUSH && command.nsid == Nsid::BROADCAST {
            if let Some(status) = path {
                return Err(status);
            }
            return Ok(IoPlan::Flush {
                nsid: Nsid::BROADCAST,
            });
        }
        if command.opcode == crate::intent::CLEAN_OPCODE {
            return clean(command, subsystem);
        }
        if command.opcode == crate::fence::GRANT_OPCODE {
            // Only a fenced subsystem grants reads.
            return match subsystem.fenced {
                true => Ok(IoPlan::Grant),
                false => Err(Status::INVALID_OPCODE),
            };
        }
        if command.opcode == crate::intent::SNAPSHOT_OPCODE {
            return snapshot(command, subsystem);
        }
        if command.opcode == crate::intent::GROW_OPCODE {
            return grow(command, subsystem);
        }
        let known = matches!(
            command.opcode,
            io_opcode::FLUSH
                | io_opcode::WRITE
                | io_opcode::READ
                | io_opcode::COMPARE
                | io_opcode::WRITE_ZEROES
                | io_opcode::DATASET_MANAGEMENT
                | reservation::REGISTER_OPCODE
                | reservation::ACQUIRE_OPCODE
                | reservation::RELEASE_OPCODE
                | reservation::REPORT_OPCODE
        );
        if !known {
            return Err(Status::INVALID_OPCODE);
        }
        let ns = subsystem
            .namespace(command.nsid)
            .ok_or(Status::INVALID_NAMESPACE)?;
        if let Some(status) = path {
            return Err(status);
        }
        if !ns.ready {
            return Err(Status::NAMESPACE_NOT_READY);
        }
        match command.opcode {
            io_opcode::FLUSH => Ok(IoPlan::Flush { nsid: ns.nsid }),
            io_opcode::DATASET_MANAGEMENT => dataset_management(command, ns),
            reservation::REPORT_OPCODE => reservation_report(command, ns, transfer_bytes_max),
            reservation::REGISTER_OPCODE
            | reservation::ACQUIRE_OPCODE
            | reservation::RELEASE_OPCODE => reservation_change(command, ns),
            io_opcode::WRITE_ZEROES => {
                let (offset, len) = lba_range(command, ns)?;
                // CDW12: DEAC is bit 25, FUA bit 30 (NVM Command Set 1.0, 3.3.7).
                let deallocate = command.cdw(12) & (1 << 25) != 0;
                let fua = command.cdw(12) & (1 << 30) != 0;
                Ok(IoPlan::WriteZeroes {
                    nsid: ns.nsid,
                    offset,
                    len,
                    deallocate,
                    fua,
                })
            }
            opcode => data_command(opcode, command, ns, transfer_bytes_max),
        }
    }
}

/// A Reservation Register, Acquire or Release: on a namespace with
/// reservations, with at least its keys as data.
fn reservation_change(command: &Command, ns: &NamespaceConfig) -> Result<IoPlan, Status> {
    if ns.reservations.is_none() {
        return Err(Status::INVALID_OPCODE);
    }
    let needed = ReservationCommand::data_len(command.opcode).expect("a reservation change");
    if command.sgl.length < needed {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok(IoPlan::Reserve {
        nsid: ns.nsid,
        opcode: command.opcode,
        cdw10: command.cdw(10),
    })
}

/// A Reservation Report: on a namespace with reservations, NUMD + 1
/// dwords (CDW10, 0's based) within the transfer and the slot buffer; EDS
/// is CDW11 bit 0.
fn reservation_report(
    command: &Command,
    ns: &NamespaceConfig,
    transfer_bytes_max: u32,
) -> Result<IoPlan, Status> {
    if ns.reservations.is_none() {
        return Err(Status::INVALID_OPCODE);
    }
    let len = (u64::from(command.cdw(10)) + 1) * 4;
    let len = len.min(u64::from(command.sgl.length)) as u32;
    if len > transfer_bytes_max {
        return Err(Status::INVALID_FIELD);
    }
    Ok(IoPlan::ReservationReport {
        nsid: ns.nsid,
        len,
        extended: command.cdw(11) & 1 != 0,
    })
}

/// A Clean: only on a subsystem with a write intent (a replica subsystem),
/// with 1 to [`crate::intent::CLEAN_REGIONS_MAX`] regions in CDW10 and
/// exactly their bytes of data.
fn clean(command: &Command, subsystem: &SubsystemConfig) -> Result<IoPlan, Status> {
    if subsystem.intent.is_none() {
        return Err(Status::INVALID_OPCODE);
    }
    let regions = command.cdw(10);
    if !(1..=crate::intent::CLEAN_REGIONS_MAX).contains(&regions) {
        return Err(Status::INVALID_FIELD);
    }
    if command.sgl.length != regions * 4 {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok(IoPlan::Clean { regions })
}

/// A Snapshot: only on a volume's private subsystem (a replica's or a
/// member's), for one of its namespaces, with a name of 1 to
/// [`crate::intent::SNAPSHOT_NAME_BYTES_MAX`] bytes (CDW10) as its data.
fn snapshot(command: &Command, subsystem: &SubsystemConfig) -> Result<IoPlan, Status> {
    if !is_private(subsystem) {
        return Err(Status::INVALID_OPCODE);
    }
    let ns = subsystem
        .namespace(command.nsid)
        .ok_or(Status::INVALID_NAMESPACE)?;
    let name_len = command.cdw(10);
    if !(1..=crate::intent::SNAPSHOT_NAME_BYTES_MAX).contains(&name_len) {
        return Err(Status::INVALID_FIELD);
    }
    if command.sgl.length != name_len {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok(IoPlan::Snapshot {
        nsid: ns.nsid,
        name_len,
    })
}

/// Whether `subsystem` is a volume's private one, whose only host is its
/// primary: a replica's (with a write intent) or an erasure-coded member's
/// (fenced, without one). Snapshot and Grow are its primary's alone.
fn is_private(subsystem: &SubsystemConfig) -> bool {
    subsystem.intent.is_some() || subsystem.fenced
}

/// A Grow: only on a volume's private subsystem (a replica's or a member's),
/// for one of its namespaces, to a size of whole blocks (the node checks
/// the rest, as for any resize). A size the namespace has reached already
/// is done: a growth tried again after its record failed finds its
/// replicas grown.
fn grow(command: &Command, subsystem: &SubsystemConfig) -> Result<IoPlan, Status> {
    if !is_private(subsystem) {
        return Err(Status::INVALID_OPCODE);
    }
    let ns = subsystem
        .namespace(command.nsid)
        .ok_or(Status::INVALID_NAMESPACE)?;
    let size_bytes = u64::from(command.cdw(10)) | (u64::from(command.cdw(11)) << 32);
    if size_bytes == 0 || size_bytes % u64::from(ns.block_size) != 0 {
        return Err(Status::INVALID_FIELD);
    }
    if command.sgl.length != 0 {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    Ok(IoPlan::Grow {
        nsid: ns.nsid,
        size_bytes,
    })
}

fn data_command(
    opcode: u8,
    command: &Command,
    ns: &NamespaceConfig,
    transfer_bytes_max: u32,
) -> Result<IoPlan, Status> {
    let (offset, len) = lba_range(command, ns)?;
    // A Compare holds host data and media data side by side in one slot buffer.
    let limit = if opcode == io_opcode::COMPARE {
        transfer_bytes_max / 2
    } else {
        transfer_bytes_max
    };
    if len > u64::from(limit) {
        return Err(Status::INVALID_FIELD);
    }
    let len = len as u32;
    if command.sgl.length != len {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    let fua = command.cdw(12) & (1 << 30) != 0;
    Ok(match opcode {
        io_opcode::READ => IoPlan::Read {
            nsid: ns.nsid,
            offset,
            len,
        },
        io_opcode::WRITE => IoPlan::Write {
            nsid: ns.nsid,
            offset,
            len,
            fua,
        },
        _ => IoPlan::Compare {
            nsid: ns.nsid,
            offset,
            len,
        },
    })
}

/// SLBA (CDW10-11) and NLB (CDW12 15:0, 0's based) as a byte range, checked against the capacity.
fn lba_range(command: &Command, ns: &NamespaceConfig) -> Result<(u64, u64), Status> {
    let slba = u64::from(command.cdw(10)) | (u64::from(command.cdw(11)) << 32);
    let blocks = u64::from(command.cdw(12) & 0xFFFF) + 1;
    block_range(ns, slba, blocks)
}

/// `blocks` blocks at `slba` as a byte range, if it lies within the namespace.
/// The shifts cannot overflow once the range ends within the namespace,
/// whose size in bytes fits in u64.
fn block_range(ns: &NamespaceConfig, slba: u64, blocks: u64) -> Result<(u64, u64), Status> {
    match slba.checked_add(blocks) {
        Some(end) if end <= ns.blocks => Ok((slba << ns.block_shift(), blocks << ns.block_shift())),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

fn dataset_management(command: &Command, ns: &NamespaceConfig) -> Result<IoPlan, Status> {
    let ranges = (command.cdw(10) & 0xFF) as u16 + 1;
    if command.sgl.length != u32::from(ranges) * DSM_RANGE_LEN as u32 {
        return Err(Status::SGL_LENGTH_INVALID);
    }
    let deallocate = command.cdw(11) & (1 << 2) != 0;
    Ok(IoPlan::DatasetManagement {
        nsid: ns.nsid,
        ranges,
        deallocate,
    })
}

/// Length of one Dataset Management range descriptor.
pub const DSM_RANGE_LEN: usize = 16;

/// Decodes the byte ranges of a Dataset Management command from its data,
/// checking each against the namespace. Zero-length ranges are skipped.
pub fn dsm_ranges(
    data: &[u8],
    ns: &NamespaceConfig,
    out: &mut Vec<(u64, u64)>,
) -> Result<(), Status> {
    out.clear();
    for descriptor in data.chunks_exact(DSM_RANGE_LEN) {
        let blocks = u64::from(u32::from_le_bytes([
            descriptor[4],
            descriptor[5],
            descriptor[6],
            descriptor[7],
        ]));
        let mut slba_bytes = [0u8; 8];
        slba_bytes.copy_from_slice(&descriptor[8..16]);
        let slba = u64::from_le_bytes(slba_bytes);
        if blocks == 0 {
            continue;
        }
        out.push(block_range(ns, slba, blocks)?);
    }
    Ok(())
}

/// The status an I/O failure completes with.
pub fn status_of(error: IoError, is_read: bool) -> Status {
    match error {
        IoError::NoSpace => Status::CAPACITY_EXCEEDED,
        IoError::Media if is_read => Status::UNRECOVERED_READ_ERROR,
        IoError::Media => Status::WRITE_FAULT,
        // Sticky: DNR, so that the host fails the I/O at once instead of
        // retrying what cannot succeed before an operator acts.
        IoError::Failed if is_read => Status {
            dnr: true,
            ..Status::UNRECOVERED_READ_ERROR
        },
        IoError::Failed => Status {
            dnr: true,
            ..Status::WRITE_FAULT
        },
        // Not ready, without DNR: a Linux host retries the command.
        IoError::Busy => Status::NAMESPACE_NOT_READY,
        IoError::PathTransition => Status::ANA_TRANSITION,
        IoError::PathInaccessible => Status::ANA_INACCESSIBLE,
        IoError::ReservationConflict => Status::RESERVATION_CONFLICT,
        IoError::InvalidField => Status::INVALID_FIELD,
        IoError::Other => Status::INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ana::{AnaConfig, AnaState};
    use crate::target::HostAccess;
    use crate::wire::hex;

    fn subsystem() -> SubsystemConfig {
        SubsystemConfig {
            nqn: "nqn.test:s".into(),
            serial: "s".into(),
            model: "m".into(),
            firmware: "f".into(),
            namespaces: vec![NamespaceConfig {
                nsid: Nsid(1),
                blocks: 100,
                block_size: 512,
                nguid: [0; 16],
                uuid: [0; 16],
                eui64: [0; 8],
                thin: true,
                ready: true,
                reservations: None,
            }],
            access: HostAccess::Any,
            ana: AnaConfig::DEFAULT,
            fenced: false,
            fence_authority: None,
            intent: None,
        }
    }

    fn command(opcode: u8, nsid: u32, sgl_len: u32, cdw10: u32, cdw12: u32) -> Command {
        let mut sqe = vec![0u8; 64];
        sqe[0] = opcode;
        sqe[1] = 0x40;
        sqe[4..8].copy_from_slice(&nsid.to_le_bytes());
        sqe[32..36].copy_from_slice(&sgl_len.to_le_bytes());
        sqe[39] = 0x5a;
        sqe[40..44].copy_from_slice(&cdw10.to_le_bytes());
        sqe[48..52].copy_from_slice(&cdw12.to_le_bytes());
        Command::decode(&sqe).unwrap()
    }

    #[test]
    fn read_within_range() {
        let plan = IoPlan::from_command(
            &command(io_opcode::READ, 1, 1024, 98, 1),
            &subsystem(),
            65536,
        );
        assert_eq!(
            plan,
            Ok(IoPlan::Read {
                nsid: Nsid(1),
                offset: 98 * 512,
                len: 1024
            })
        );
    }

    #[test]
    fn errors_have_the_spec_status() {
        let s = subsystem();
        assert_eq!(
            IoPlan::from_command(&command(io_opcode::READ, 1, 1536, 98, 2), &s, 65536),
            Err(Status::LBA_OUT_OF_RANGE)
        );
        assert_eq!(
            IoPlan::from_command(&command(io_opcode::READ, 2, 512, 0, 0), &s, 65536),
            Err(Status::INVALID_NAMESPACE)
        );
        assert_eq!(
            IoPlan::from_command(&command(0x7e, 1, 0, 0, 0), &s, 65536),
            Err(Status::INVALID_OPCODE)
        );
        assert_eq!(
            IoPlan::from_command(&command(io_opcode::WRITE, 1, 512, 0, 1), &s, 65536),
            Err(Status::SGL_LENGTH_INVALID)
        );
        assert_eq!(
            IoPlan::from_command(&command(io_opcode::READ, 1, 8192, 0, 15), &s, 4096),
            Err(Status::INVALID_FIELD)
        );
        // SLBA near u64::MAX must not overflow.
        let mut huge = command(io_opcode::READ, 1, 512, u32::MAX, 0);
        huge.cdw[1] = u32::MAX;
        assert_eq!(
            IoPlan::from_command(&huge, &s, 65536),
            Err(Status::LBA_OUT_OF_RANGE)
        );
    }

    /// Every command that accesses a namespace fails on a path whose group
    /// does not serve I/O, with the state's path status and DNR clear; an
    /// unknown NSID or opcode still gets its own status first, as in nvmet.
    #[test]
    fn paths_that_do_not_serve_io_fail_namespace_commands() {
        let commands = [
            command(io_opcode::READ, 1, 512, 0, 0),
            command(io_opcode::WRITE, 1, 512, 0, 0),
            command(io_opcode::COMPARE, 1, 512, 0, 0),
            command(io_opcode::FLUSH, 1, 0, 0, 0),
            command(io_opcode::FLUSH, Nsid::BROADCAST.0, 0, 0, 0),
            command(io_opcode::WRITE_ZEROES, 1, 0, 0, 0),
            command(io_opcode::DATASET_MANAGEMENT, 1, 16, 0, 0),
        ];
        let mut s = subsystem();
        for state in [AnaState::Optimized, AnaState::NonOptimized] {
            s.ana.state = state;
            for c in &commands {
                assert!(IoPlan::from_command(c, &s, 65536).is_ok(), "{state} {c:?}");
            }
        }
        for (state, status) in [
            (AnaState::Inaccessible, Status::ANA_INACCESSIBLE),
            (AnaState::PersistentLoss, Status::ANA_PERSISTENT_LOSS),
            (AnaState::Change, Status::ANA_TRANSITION),
        ] {
            s.ana.state = state;
            for c in &commands {
                assert_eq!(IoPlan::from_command(c, &s, 65536), Err(status), "{c:?}");
                assert!(!status.dnr);
            }
            // Beyond the namespace: the path status all the same (nvmet checks the range later).
            assert_eq!(
                IoPlan::from_command(&command(io_opcode::READ, 1, 512, 100, 0), &s, 65536),
                Err(status)
            );
            assert_eq!(
                IoPlan::from_command(&command(io_opcode::READ, 2, 512, 0, 0), &s, 65536),
                Err(Status::INVALID_NAMESPACE)
            );
            assert_eq!(
                IoPlan::from_command(&command(0x7e, 1, 0, 0, 0), &s, 65536),
                Err(Status::INVALID_OPCODE)
            );
        }
    }

    #[test]
    fn dsm_ranges_decode() {
        let s = subsystem();
        let data = hex("00000000 08000000 0a00000000000000  00000000 00000000 0000000000000000");
        let mut out = Vec::new();
        dsm_ranges(&data, &s.namespaces[0], &mut out).unwrap();
        assert_eq!(out, vec![(10 * 512, 8 * 512)]);
        let beyond = hex("00000000 08000000 6000000000000000");
        assert_eq!(
            dsm_ranges(&beyond, &s.namespaces[0], &mut out),
            Err(Status::LBA_OUT_OF_RANGE)
        );
    }
}
