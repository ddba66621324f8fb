//! NVMe completion status (NVMe Base 2.0, section 4.6.1.2) and the 16-byte
//! completion queue entry. Every error a command can end with is a `Status`.

use crate::types::Cid;
use crate::wire::Writer;

/// Status Code Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StatusCodeType {
    /// Generic command status.
    Generic = 0,
    /// Command specific status.
    CommandSpecific = 1,
    /// Media and data integrity errors.
    Media = 2,
    /// Path related status.
    Path = 3,
}

/// A completion status: SCT, SC and the Do Not Retry bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Status code type.
    pub sct: StatusCodeType,
    /// Status code.
    pub sc: u8,
    /// Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

impl std::fmt::Display for Status {
    /// e.g. `CAPACITY_EXCEEDED (SCT 0h, SC 81h, DNR)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (SCT {:X}h, SC {:02X}h{})",
            self.name().unwrap_or("status"),
            self.sct as u8,
            self.sc,
            if self.dnr { ", DNR" } else { "" }
        )
    }
}

macro_rules! statuses {
    ($($(#[$doc:meta])* $name:ident = ($sct:ident, $sc:expr, $dnr:expr);)*) => {
        impl Status {
            $($(#[$doc])* pub const $name: Status = Status { sct: StatusCodeType::$sct, sc: $sc, dnr: $dnr };)*

            /// The constant's name for a known status (command-specific codes
            /// are shared between commands: the first listed wins).
            pub fn name(&self) -> Option<&'static str> {
                $(if self.sct == StatusCodeType::$sct && self.sc == $sc {
                    return Some(stringify!($name));
                })*
                None
            }
        }
    };
}

statuses! {
    /// Successful completion.
    SUCCESS = (Generic, 0x00, false);
    /// Invalid Command Opcode.
    INVALID_OPCODE = (Generic, 0x01, true);
    /// Invalid Field in Command.
    INVALID_FIELD = (Generic, 0x02, true);
    /// Data Transfer Error (e.g. a data digest mismatch in the capsule).
    DATA_TRANSFER_ERROR = (Generic, 0x04, false);
    /// Internal Error.
    INTERNAL_ERROR = (Generic, 0x06, false);
    /// Command Abort Requested.
    ABORT_REQUESTED = (Generic, 0x07, false);
    /// Invalid Namespace or Format.
    INVALID_NAMESPACE = (Generic, 0x0B, true);
    /// Command Sequence Error.
    COMMAND_SEQUENCE_ERROR = (Generic, 0x0C, true);
    /// Data SGL Length Invalid.
    SGL_LENGTH_INVALID = (Generic, 0x0F, true);
    /// SGL Descriptor Type Invalid.
    SGL_TYPE_INVALID = (Generic, 0x11, true);
    /// SGL Offset Invalid.
    SGL_OFFSET_INVALID = (Generic, 0x16, true);
    /// Host Identifier Inconsistent Format: a Reservation Report without
    /// the extended data structure, where Host Identifiers are 128-bit.
    HOST_ID_INCONSISTENT_FORMAT = (Generic, 0x18, true);
    /// Transient Transport Error: retrying may succeed (data digest mismatch).
    TRANSIENT_TRANSPORT_ERROR = (Generic, 0x22, false);
    /// LBA Out of Range.
    LBA_OUT_OF_RANGE = (Generic, 0x80, true);
    /// Capacity Exceeded.
    CAPACITY_EXCEEDED = (Generic, 0x81, true);
    /// Namespace Not Ready.
    NAMESPACE_NOT_READY = (Generic, 0x82, false);
    /// Reservation Conflict: another host holds the namespace's
    /// reservation (for weft's replica subsystems: another primary session
    /// holds the fence).
    RESERVATION_CONFLICT = (Generic, 0x83, true);
    /// Abort Command Limit Exceeded.
    ABORT_LIMIT_EXCEEDED = (CommandSpecific, 0x03, true);
    /// Asynchronous Event Request Limit Exceeded.
    AER_LIMIT_EXCEEDED = (CommandSpecific, 0x05, true);
    /// Invalid Log Page.
    INVALID_LOG_PAGE = (CommandSpecific, 0x09, true);
    /// Feature Identifier Not Saveable.
    FEATURE_NOT_SAVEABLE = (CommandSpecific, 0x0D, true);
    /// Fabrics Connect: Incompatible Format.
    CONNECT_INCOMPATIBLE_FORMAT = (CommandSpecific, 0x80, true);
    /// Fabrics Connect: Controller Busy.
    CONNECT_CONTROLLER_BUSY = (CommandSpecific, 0x81, false);
    /// Fabrics Connect: Connect Invalid Parameters.
    CONNECT_INVALID_PARAMETERS = (CommandSpecific, 0x82, true);
    /// Fabrics Connect: Connect Invalid Host.
    CONNECT_INVALID_HOST = (CommandSpecific, 0x84, true);
    /// Authentication Required: the queue must authenticate first.
    AUTH_REQUIRED = (CommandSpecific, 0x91, true);
    /// Write Fault.
    WRITE_FAULT = (Media, 0x80, false);
    /// Unrecovered Read Error.
    UNRECOVERED_READ_ERROR = (Media, 0x81, false);
    /// Compare Failure.
    COMPARE_FAILURE = (Media, 0x85, true);
    /// Asymmetric Access Persistent Loss (path related status, NVMe Base
    /// 2.0, Figure 104): the namespace's ANA group is in Persistent Loss on
    /// this controller. Without DNR: another path may serve the command.
    ANA_PERSISTENT_LOSS = (Path, 0x01, false);
    /// Asymmetric Access Inaccessible: the namespace's ANA group is
    /// Inaccessible on this controller. Without DNR: another path may
    /// serve the command.
    ANA_INACCESSIBLE = (Path, 0x02, false);
    /// Asymmetric Access Transition: the namespace's ANA group is changing
    /// state on this controller. Without DNR: the host retries.
    ANA_TRANSITION = (Path, 0x03, false);
}

impl Status {
    /// The 15-bit status field as it sits in CQE bits 31:17 (without the phase tag).
    pub fn field(self) -> u16 {
        ((self.dnr as u16) << 14) | ((self.sct as u16) << 8) | self.sc as u16
    }

    /// Whether this is a successful completion.
    pub fn is_success(self) -> bool {
        self.sct == StatusCodeType::Generic && self.sc == 0
    }

    /// Decodes the status half of CQE DW3 (bit 0 is the phase tag).
    pub fn from_cqe_status(raw: u16) -> Status {
        let field = raw >> 1;
        let sct = match (field >> 8) & 0x7 {
            0 => StatusCodeType::Generic,
            1 => StatusCodeType::CommandSpecific,
            2 => StatusCodeType::Media,
            _ => StatusCodeType::Path,
        };
        Status {
            sct,
            sc: field as u8,
            dnr: field & (1 << 14) != 0,
        }
    }
}

/// A completion queue entry (NVMe Base 2.0, Figure 89).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// Command specific result, DW0 and DW1 (64 bits for Property Get of an 8-byte property).
    pub result: u64,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier.
    pub cid: Cid,
    /// Status.
    pub status: Status,
}

impl Completion {
    /// The 16 bytes on the wire. The phase tag is 0: fabrics has no completion queue memory.
    pub fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        Writer::new(&mut out)
            .u64(0, self.result)
            .u16(8, self.sqhd)
            .u16(10, self.sqid)
            .u16(12, self.cid.0)
            .u16(14, self.status.field() << 1);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    #[test]
    fn status_field_layout() {
        // LBA out of range with DNR: SC 80h, SCT 0, DNR -> 0x4080, shifted past the phase bit.
        assert_eq!(Status::LBA_OUT_OF_RANGE.field() << 1, 0x8100);
        assert_eq!(Status::CONNECT_INVALID_PARAMETERS.field(), 0x4182);
        assert_eq!(
            Status::from_cqe_status(Status::COMPARE_FAILURE.field() << 1),
            Status::COMPARE_FAILURE
        );
        // Asymmetric Access Inaccessible: SCT 3h, SC 02h, no DNR -> 0x0302.
        assert_eq!(Status::ANA_INACCESSIBLE.field(), 0x0302);
        assert_eq!(
            Status::from_cqe_status(Status::ANA_TRANSITION.field() << 1),
            Status::ANA_TRANSITION
        );
        assert_eq!(
            Status::ANA_INACCESSIBLE.to_string(),
            "ANA_INACCESSIBLE (SCT 3h, SC 02h)"
        );
    }

    #[test]
    fn completion_encoding() {
        let cqe = Completion {
            result: 1,
            sqhd: 2,
            sqid: 0,
            cid: Cid(0x2a),
            status: Status::INVALID_FIELD,
        };
        assert_eq!(
            &cqe.encode()[..],
            &hex("0100000000000000 0200 0000 2a00 0480")[..]
        );
    }
}
