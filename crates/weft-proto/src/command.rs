//! The 64-byte submission queue entry, the opcodes weft implements, the SGL
//! descriptor NVMe/TCP uses, and the Fabrics commands (NVMe over Fabrics 1.1,
//! section 3.3). Decoding checks structure only; whether a command is valid
//! for a queue and namespace is the controller's business.

use crate::types::{Cid, Nsid};
use crate::wire::{ascii_field, Reader, Truncated};

/// Length of a submission queue entry.
pub const SQE_LEN: usize = 64;

/// Admin command opcodes.
pub mod admin_opcode {
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0A;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
}

/// NVM command set I/O opcodes.
pub mod io_opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// The Fabrics command opcode; the command type is in byte 4 (FCTYPE).
pub const FABRICS_OPCODE: u8 = 0x7F;

/// Fabrics command types.
pub mod fctype {
    /// Property Set.
    pub const PROPERTY_SET: u8 = 0x00;
    /// Connect.
    pub const CONNECT: u8 = 0x01;
    /// Property Get.
    pub const PROPERTY_GET: u8 = 0x04;
    /// Authentication Send.
    pub const AUTH_SEND: u8 = 0x05;
    /// Authentication Receive.
    pub const AUTH_RECEIVE: u8 = 0x06;
    /// Disconnect.
    pub const DISCONNECT: u8 = 0x08;
}

/// Direction of a command's data, from opcode bits 1:0 (NVMe Base 2.0, Figure 91).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDirection {
    /// No data.
    None,
    /// Host to controller (writes).
    HostToController,
    /// Controller to host (reads).
    ControllerToHost,
    /// Both (not used by any command weft implements).
    Bidirectional,
}

impl DataDirection {
    /// Direction encoded in an opcode (or a Fabrics FCTYPE).
    pub fn of(code: u8) -> DataDirection {
        match code & 0x3 {
            0 => DataDirection::None,
            1 => DataDirection::HostToController,
            2 => DataDirection::ControllerToHost,
            _ => DataDirection::Bidirectional,
        }
    }
}

/// SGL descriptor types NVMe/TCP uses (NVMe/TCP 1.0, section 3.3.1 / 3.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglKind {
    /// Data Block with offset subtype (01h): data is in the capsule at `address` (an offset).
    InCapsule,
    /// Transport SGL Data Block, transport specific subtype (5Ah): data moves by R2T/H2CData or C2HData.
    Transport,
    /// Any other type/subtype: not supported over TCP.
    Unsupported(u8),
}

/// SGL Descriptor 1 (command bytes 24..40).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    /// Address, or offset into in-capsule data.
    pub address: u64,
    /// Length in bytes.
    pub length: u32,
    /// Type and subtype.
    pub kind: SglKind,
}

/// A decoded submission queue entry: the common fields plus the raw command dwords.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// Opcode.
    pub opcode: u8,
    /// FUSE bits 1:0 and PSDT bits 7:6.
    pub flags: u8,
    /// Command identifier.
    pub cid: Cid,
    /// Namespace ID (for Fabrics commands, byte 4 is FCTYPE instead).
    pub nsid: Nsid,
    /// SGL Descriptor 1.
    pub sgl: Sgl,
    /// Command dwords 10..=15.
    pub cdw: [u32; 6],
    /// The raw 64 bytes (Fabrics commands lay out their own fields).
    pub raw: [u8; SQE_LEN],
}

impl Command {
    /// Decodes a 64-byte SQE.
    pub fn decode(sqe: &[u8]) -> Result<Command, Truncated> {
        let mut r = Reader::new(sqe);
        let opcode = r.u8()?;
        let flags = r.u8()?;
        let cid = Cid(r.u16()?);
        let nsid = Nsid(r.u32()?);
        r.skip(16)?; // CDW2-3, MPTR
        let address = r.u64()?;
        let length = r.u32()?;
        r.skip(3)?;
        let sgl_type = r.u8()?;
        let kind = match sgl_type {
            0x01 => SglKind::InCapsule,
            0x5A => SglKind::Transport,
            other => SglKind::Unsupported(other),
        };
        let mut cdw = [0u32; 6];
        for dword in cdw.iter_mut() {
            *dword = r.u32()?;
        }
        let mut raw = [0u8; SQE_LEN];
        raw.copy_from_slice(&sqe[..SQE_LEN]);
        Ok(Command {
            opcode,
            flags,
            cid,
            nsid,
            sgl: Sgl {
                address,
                length,
                kind,
            },
            cdw,
            raw,
        })
    }

    /// Command dword `n` (10..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        assert!(
            (10..=15).contains(&n),
            "CDW{n} is not a command-specific dword"
        );
        self.cdw[n - 10]
    }

    /// FCTYPE of a Fabrics command.
    pub fn fctype(&self) -> u8 {
        self.raw[4]
    }

    /// Whether this is a Fabrics command.
    pub fn is_fabrics(&self) -> bool {
        self.opcode == FABRICS_OPCODE
    }

    /// Direction of the command's data.
    pub fn direction(&self) -> DataDirection {
        if self.is_fabrics() {
            DataDirection::of(self.fctype())
        } else {
            DataDirection::of(self.opcode)
        }
    }

    /// PSDT (bits 7:6 of byte 1): 0 = PRP, which Fabrics forbids.
    pub fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// FUSE (bits 1:0 of byte 1).
    pub fn fuse(&self) -> u8 {
        self.flags & 0x3
    }
}

/// Fabrics Connect command fields (NVMe-oF 1.1, Figure 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCommand {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue to create: 0 = admin.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect attributes; bit 2 disables SQ flow control.
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue only).
    pub kato_ms: u32,
}

impl ConnectCommand {
    /// Connect attribute: the host disables SQ flow control (NVMe-oF 1.1, Figure 19).
    pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

    /// Decodes the Connect-specific fields of `command`.
    pub fn decode(command: &Command) -> ConnectCommand {
        let mut r = Reader::new(&command.raw[40..]);
        // The slice is 24 bytes long: these reads cannot fail.
        let recfmt = r.u16().unwrap_or(0);
        let qid = r.u16().unwrap_or(0);
        let sqsize = r.u16().unwrap_or(0);
        let cattr = r.u8().unwrap_or(0);
        let _ = r.skip(1);
        let kato_ms = r.u32().unwrap_or(0);
        ConnectCommand {
            recfmt,
            qid,
            sqsize,
            cattr,
            kato_ms,
        }
    }
}

/// Length of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// Longest NQN, in bytes (NVMe Base 2.0, section 4.5): the Connect data's
/// 256-byte NQN fields hold it and the NUL that ends it.
pub const NQN_BYTES_MAX: usize = 223;

/// Connect data (NVMe-oF 1.1, Figure 20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// Host identifier.
    pub host_id: [u8; 16],
    /// Controller ID: FFFFh asks for any (dynamic) controller on the admin queue;
    /// on I/O queues the controller to attach to.
    pub cntlid: u16,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
}

impl ConnectData {
    /// Decodes the 1024-byte Connect data.
    pub fn decode(data: &[u8]) -> Result<ConnectData, Truncated> {
        let mut r = Reader::new(data);
        let host_id = r.array()?;
        let cntlid = r.u16()?;
        r.skip(238)?;
        let subnqn = ascii_field(r.take(256)?);
        let hostnqn = ascii_field(r.take(256)?);
        r.skip(256)?;
        Ok(ConnectData {
            host_id,
            cntlid,
            subnqn,
            hostnqn,
        })
    }
}

/// Property Get / Property Set fields (NVMe-oF 1.1, Figures 25 and 28).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    /// Size: false = 4 bytes, true = 8 bytes.
    pub eight_bytes: bool,
    /// Property offset.
    pub offset: u32,
    /// Value to set (Property Set only).
    pub value: u64,
}

impl PropertyCommand {
    /// Decodes the property fields of `command`.
    pub fn decode(command: &Command) -> PropertyCommand {
        let raw = &command.raw;
        let eight_bytes = raw[40] & 0x7 == 1;
        let offset = u32::from_le_bytes([raw[44], raw[45], raw[46], raw[47]]);
        let mut value_bytes = [0u8; 8];
        value_bytes.copy_from_slice(&raw[48..56]);
        PropertyCommand {
            eight_bytes,
            offset,
            value: u64::from_le_bytes(value_bytes),
        }
    }
}

// Sizes fixed by the specifications (NVMe Base 2.0 Figure 88; NVMe-oF 1.1 Figure 20).
const _: () = assert!(SQE_LEN == 64 && CONNECT_DATA_LEN == 1024);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    /// An admin Connect SQE as the Linux host sends it (qid 0, sqsize 31, kato 5000 ms,
    /// in-capsule SGL of 1024 bytes).
    pub(crate) fn linux_admin_connect_sqe() -> Vec<u8> {
        hex("7f 40 0000 01000000 0000000000000000 0000000000000000
             0000000000000000 00040000 000000 01
             0000 0000 1f00 00 00 88130000 000000000000000000000000")
    }

    #[test]
    fn decodes_linux_admin_connect() {
        let sqe = linux_admin_connect_sqe();
        assert_eq!(sqe.len(), SQE_LEN);
        let command = Command::decode(&sqe).unwrap();
        assert!(command.is_fabrics());
        assert_eq!(command.fctype(), fctype::CONNECT);
        assert_eq!(command.direction(), DataDirection::HostToController);
        assert_eq!(command.psdt(), 1);
        assert_eq!(
            command.sgl,
            Sgl {
                address: 0,
                length: 1024,
                kind: SglKind::InCapsule
            }
        );
        let connect = ConnectCommand::decode(&command);
        assert_eq!(
            connect,
            ConnectCommand {
                recfmt: 0,
                qid: 0,
                sqsize: 31,
                cattr: 0,
                kato_ms: 5000
            }
        );
    }

    #[test]
    fn decodes_read_command() {
        // Read nsid 1, slba 0x10, nlb 7 (8 blocks), transport SGL of 32 KiB.
        let sqe = hex("02 40 0500 01000000 0000000000000000 0000000000000000
                       0000000000000000 00800000 000000 5a
                       10000000 00000000 07000000 00000000 00000000 00000000");
        let command = Command::decode(&sqe).unwrap();
        assert_eq!(command.opcode, io_opcode::READ);
        assert_eq!(command.cid, Cid(5));
        assert_eq!(command.nsid, Nsid(1));
        assert_eq!(command.sgl.kind, SglKind::Transport);
        assert_eq!(command.sgl.length, 0x8000);
        assert_eq!(command.cdw(10), 0x10);
        assert_eq!(command.cdw(12), 7);
        assert_eq!(command.direction(), DataDirection::ControllerToHost);
    }

    #[test]
    fn decodes_connect_data() {
        let mut data = vec![0u8; CONNECT_DATA_LEN];
        data[..16].copy_from_slice(&[0xab; 16]);
        data[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
        data[256..256 + 9].copy_from_slice(b"nqn.a:sub");
        data[512..512 + 10].copy_from_slice(b"nqn.b:host");
        let decoded = ConnectData::decode(&data).unwrap();
        assert_eq!(decoded.cntlid, 0xffff);
        assert_eq!(decoded.subnqn, "nqn.a:sub");
        assert_eq!(decoded.hostnqn, "nqn.b:host");
        assert!(ConnectData::decode(&data[..1000]).is_err());
    }

    #[test]
    fn short_sqe_is_an_error() {
        assert!(Command::decode(&[0u8; 63]).is_err());
    }
}
