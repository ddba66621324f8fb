//! What the initiator reads from the Identify structures a target returns:
//! the controller's limits and each namespace's block format, checked
//! before use. A value the initiator cannot use (a block size outside 512
//! bytes to 64 KiB, an LBA format the namespace does not have, a capsule
//! smaller than a command) becomes an [`IdentifyError`] that says what the
//! target reported, instead of a panic or a wrong shift later.

use crate::{ControllerInfo, Namespace};
use thiserror::Error;
use weft_proto::types::Nsid;

/// Length of every Identify structure.
pub(crate) const IDENTIFY_BYTES: usize = 4096;

/// The largest transfer the initiator uses per command, whatever MDTS
/// allows: every queue entry has a buffer this large.
pub const TRANSFER_BYTES_CAP: u32 = 1 << 20;

/// Smallest LBA data size, as a power of two: "A value smaller than 9
/// (i.e., 512 bytes) is not supported" (NVM Command Set 1.0, LBA Format
/// Data Structure).
const LBADS_MIN: u8 = 9;

/// Largest LBA data size the initiator accepts, as a power of two: 64 KiB.
const LBADS_MAX: u8 = 16;

/// Smallest IOCCSZ: a capsule holds at least its 64-byte command (NVMe-oF
/// 1.1, Identify Controller, I/O Queue Command Capsule Supported Size).
const IOCCSZ_MIN: u32 = 4;

/// A value in an Identify structure the initiator cannot use.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentifyError {
    /// LBADS outside 512 bytes to 64 KiB (0 means the format is not in use).
    #[error("namespace {nsid} reports an LBA data size of 2^{lbads} bytes (LBADS {lbads}); the initiator supports 512 bytes to 64 KiB (LBADS {LBADS_MIN} to {LBADS_MAX})")]
    BlockSize {
        /// The namespace.
        nsid: u32,
        /// LBADS of its format.
        lbads: u8,
    },
    /// FLBAS names a format past NLBAF.
    #[error("namespace {nsid} is formatted with LBA format {format}, but reports only {formats} formats (NLBAF {})", formats - 1)]
    LbaFormat {
        /// The namespace.
        nsid: u32,
        /// The format FLBAS names.
        format: u8,
        /// NLBAF + 1.
        formats: u8,
    },
    /// The format carries metadata with each block.
    #[error("namespace {nsid} carries {bytes} bytes of metadata with each block, which the initiator does not transfer")]
    Metadata {
        /// The namespace.
        nsid: u32,
        /// MS of its format.
        bytes: u16,
    },
    /// One block is more than one command may transfer.
    #[error("namespace {nsid} has {block_bytes}-byte blocks, more than the controller's largest transfer ({transfer_bytes_max} bytes)")]
    BlockLargerThanTransfer {
        /// The namespace.
        nsid: u32,
        /// Its block size.
        block_bytes: u32,
        /// The controller's largest transfer, as the initiator uses it.
        transfer_bytes_max: u32,
    },
    /// NSZE blocks do not fit 64 bits of bytes.
    #[error("namespace {nsid} reports {blocks} blocks of {block_bytes} bytes, more bytes than 64 bits count")]
    Capacity {
        /// The namespace.
        nsid: u32,
        /// NSZE.
        blocks: u64,
        /// Its block size.
        block_bytes: u32,
    },
    /// IOCCSZ below one command.
    #[error("the controller reports IOCCSZ {ioccsz}: a command capsule of {} bytes, smaller than the 64-byte command (IOCCSZ is at least {IOCCSZ_MIN})", u64::from(*ioccsz) * 16)]
    CapsuleSize {
        /// IOCCSZ, in 16-byte units.
        ioccsz: u32,
    },
}

/// The largest transfer per command from MDTS (a power of two of the
/// minimum page size; the initiator enables the controller with 4 KiB
/// pages, CC.MPS 0): 0 means no limit. Capped at [`TRANSFER_BYTES_CAP`].
pub(crate) fn transfer_bytes_max(mdts: u8) -> u32 {
    // 4 KiB << 8 is the cap: larger MDTS values are not shifted at all.
    const CAP_MDTS: u8 = (TRANSFER_BYTES_CAP / 4096).trailing_zeros() as u8;
    match mdts {
        0 => TRANSFER_BYTES_CAP,
        mdts => 4096 << mdts.min(CAP_MDTS),
    }
}

/// The controller's answers to Identify Controller (`data`), Connect
/// (`cntlid`) and Set Features Number of Queues (`queues_granted`, its
/// completion DW0) when the host asked for `queues_requested` I/O queues.
pub(crate) fn controller_info(
    data: &[u8],
    cntlid: u16,
    queues_granted: u64,
    queues_requested: u16,
) -> Result<ControllerInfo, IdentifyError> {
    let data = &data[..IDENTIFY_BYTES];
    let transfer_bytes_max = transfer_bytes_max(data[77]);
    let ioccsz = u32::from_le_bytes([data[1792], data[1793], data[1794], data[1795]]);
    if ioccsz < IOCCSZ_MIN {
        return Err(IdentifyError::CapsuleSize { ioccsz });
    }
    // The capsule beyond the command, in u64 (IOCCSZ is 32 bits of 16-byte
    // units); more than a command's buffer is of no use.
    let in_capsule_bytes = (u64::from(ioccsz) * 16 - 64).min(u64::from(transfer_bytes_max));
    // NSQA and NCQA are 0's based: the controller may allocate more than
    // asked; the host uses what it asked for.
    let submission = queues_granted & 0xFFFF;
    let completion = (queues_granted >> 16) & 0xFFFF;
    let granted = submission.min(completion) + 1;
    let io_queues = granted.min(u64::from(queues_requested.max(1))) as u16;
    Ok(ControllerInfo {
        cntlid,
        serial: ascii(&data[4..24]),
        model: ascii(&data[24..64]),
        transfer_bytes_max,
        io_in_capsule_bytes: in_capsule_bytes as u32,
        io_queues,
        optional_commands: u16::from_le_bytes([data[520], data[521]]),
    })
}

/// Namespace `nsid` from its Identify Namespace structure (NVM Command Set
/// 1.0, Figure 97), for a controller whose largest transfer is
/// `transfer_bytes_max`.
pub(crate) fn namespace(
    nsid: u32,
    data: &[u8],
    transfer_bytes_max: u32,
) -> Result<Namespace, IdentifyError> {
    let data = &data[..IDENTIFY_BYTES];
    let blocks = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
    // NLBAF is 0's based, at most 63. FLBAS bits 3:0 are the format's low
    // bits and bits 6:5 its high bits (when NLBAF is 16 or more).
    let formats = (data[25] & 0x3F) + 1;
    let flbas = data[26];
    let format = (flbas & 0x0F) | ((flbas >> 5) & 0x3) << 4;
    if format >= formats {
        return Err(IdentifyError::LbaFormat {
            nsid,
            format,
            formats,
        });
    }
    let at = 128 + usize::from(format) * 4;
    let metadata_bytes = u16::from_le_bytes([data[at], data[at + 1]]);
    let lbads = data[at + 2];
    if !(LBADS_MIN..=LBADS_MAX).contains(&lbads) {
        return Err(IdentifyError::BlockSize { nsid, lbads });
    }
    if metadata_bytes != 0 {
        return Err(IdentifyError::Metadata {
            nsid,
            bytes: metadata_bytes,
        });
    }
    let block_bytes = 1u32 << lbads;
    if block_bytes > transfer_bytes_max {
        return Err(IdentifyError::BlockLargerThanTransfer {
            nsid,
            block_bytes,
            transfer_bytes_max,
        });
    }
    if blocks.checked_mul(u64::from(block_bytes)).is_none() {
        return Err(IdentifyError::Capacity {
            nsid,
            blocks,
            block_bytes,
        });
    }
    Ok(Namespace {
        nsid: Nsid(nsid),
        blocks,
        block_size: block_bytes,
    })
}

fn ascii(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches([' ', '\0'])
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::wire::hex;

    /// A 4096-byte Identify structure starting with `prefix` (hex), the rest zero.
    fn structure(prefix: &str) -> Vec<u8> {
        let mut data = hex(prefix);
        data.resize(IDENTIFY_BYTES, 0);
        data
    }

    /// Identify Namespace: NSZE `nsze` (hex, 8 bytes), NLBAF, FLBAS, and
    /// LBA format 0 as MS (2 bytes), LBADS and RP.
    fn identify_namespace(nsze: &str, nlbaf: u8, flbas: u8, format0: &str) -> Vec<u8> {
        let mut data = structure(nsze);
        data[25] = nlbaf;
        data[26] = flbas;
        let format0 = hex(format0);
        data[128..128 + format0.len()].copy_from_slice(&format0);
        data
    }

    #[test]
    fn a_namespace_of_4_kib_blocks() {
        // NSZE 256, one format: MS 0, LBADS 12 (4 KiB), RP 0.
        let data = identify_namespace("0001000000000000", 0, 0, "0000 0c 00");
        assert_eq!(
            namespace(2, &data, 128 * 1024),
            Ok(Namespace {
                nsid: Nsid(2),
                blocks: 256,
                block_size: 4096
            })
        );
    }

    /// LBADS 0 (a format not in use) used to give 1-byte blocks and LBADS 64
    /// overflowed the shift; neither is a block size.
    #[test]
    fn lba_data_sizes_outside_512_bytes_to_64_kib_are_refused() {
        for lbads in [0u8, 8, 17, 32, 64, 255] {
            let format0 = format!("0000 {lbads:02x} 00");
            let data = identify_namespace("0001000000000000", 0, 0, &format0);
            assert_eq!(
                namespace(1, &data, TRANSFER_BYTES_CAP),
                Err(IdentifyError::BlockSize { nsid: 1, lbads })
            );
        }
        let data = identify_namespace("0001000000000000", 0, 0, "0000 00 00");
        assert_eq!(
            namespace(1, &data, TRANSFER_BYTES_CAP).unwrap_err().to_string(),
            "namespace 1 reports an LBA data size of 2^0 bytes (LBADS 0); the initiator supports 512 bytes to 64 KiB (LBADS 9 to 16)"
        );
        let data = identify_namespace("0001000000000000", 0, 0, "0000 10 00");
        assert_eq!(
            namespace(1, &data, TRANSFER_BYTES_CAP).map(|ns| ns.block_size),
            Ok(65536)
        );
    }

    #[test]
    fn the_format_in_use_must_exist_and_carry_no_metadata() {
        // FLBAS 1 with NLBAF 0: format 1 does not exist.
        let data = identify_namespace("0001000000000000", 0, 1, "0000 09 00");
        assert_eq!(
            namespace(1, &data, TRANSFER_BYTES_CAP),
            Err(IdentifyError::LbaFormat {
                nsid: 1,
                format: 1,
                formats: 1
            })
        );
        // FLBAS bits 6:5 are the high bits of the format: 20h names format 16.
        let mut data = identify_namespace("0001000000000000", 16, 0x20, "0000 09 00");
        data[128 + 16 * 4 + 2] = 12;
        assert_eq!(
            namespace(1, &data, TRANSFER_BYTES_CAP).map(|ns| ns.block_size),
            Ok(4096)
        );
        // MS 8: eight bytes of metadata with each 512-byte block.
        let data = identify_namespace("0001000000000000", 0, 0, "0800 09 00");
        assert_eq!(
            namespace(1, &data, TRANSFER_BYTES_CAP),
            Err(IdentifyError::Metadata { nsid: 1, bytes: 8 })
        );
    }

    #[test]
    fn blocks_must_fit_a_transfer_and_the_capacity_64_bits() {
        let data = identify_namespace("0001000000000000", 0, 0, "0000 10 00");
        assert_eq!(
            namespace(1, &data, 32 * 1024),
            Err(IdentifyError::BlockLargerThanTransfer {
                nsid: 1,
                block_bytes: 65536,
                transfer_bytes_max: 32 * 1024
            })
        );
        // NSZE 2^56 blocks of 512 bytes: 2^65 bytes.
        let data = identify_namespace("0000000000000001", 0, 0, "0000 09 00");
        assert!(matches!(
            namespace(1, &data, TRANSFER_BYTES_CAP),
            Err(IdentifyError::Capacity { blocks, .. }) if blocks == 1 << 56
        ));
    }

    #[test]
    fn mdts_gives_the_transfer_size_up_to_the_cap() {
        assert_eq!(transfer_bytes_max(0), TRANSFER_BYTES_CAP, "no limit");
        assert_eq!(transfer_bytes_max(1), 8192);
        assert_eq!(transfer_bytes_max(5), 128 * 1024);
        assert_eq!(transfer_bytes_max(8), TRANSFER_BYTES_CAP);
        assert_eq!(transfer_bytes_max(9), TRANSFER_BYTES_CAP);
        assert_eq!(transfer_bytes_max(255), TRANSFER_BYTES_CAP);
    }

    /// Identify Controller with MDTS, IOCCSZ (hex, 4 bytes) and ONCS.
    fn identify_controller(mdts: u8, ioccsz: &str) -> Vec<u8> {
        let mut data = structure("0000 0000");
        data[4..8].copy_from_slice(b"s123");
        data[24..28].copy_from_slice(b"weft");
        data[77] = mdts;
        data[1792..1796].copy_from_slice(&hex(ioccsz));
        data[520] = 0x0D;
        data
    }

    #[test]
    fn controller_limits_are_read_without_overflow() {
        // IOCCSZ 1028: 16 KiB of in-capsule data; NSQA 3, NCQA 7 (0's based).
        let info = controller_info(&identify_controller(5, "04040000"), 7, 0x0007_0003, 8)
            .expect("usable");
        assert_eq!(
            (info.serial.as_str(), info.model.as_str(), info.cntlid),
            ("s123", "weft", 7)
        );
        assert_eq!(info.transfer_bytes_max, 128 * 1024);
        assert_eq!(info.io_in_capsule_bytes, 16 * 1024);
        assert_eq!(info.io_queues, 4, "the fewer of NSQA and NCQA, plus one");
        assert_eq!(info.optional_commands, 0x0D);
        // IOCCSZ FFFFFFFFh times 16 overflowed 32 bits; NSQA = NCQA = FFFFh overflowed 16.
        let info = controller_info(&identify_controller(5, "ffffffff"), 7, 0xFFFF_FFFF, 64)
            .expect("usable");
        assert_eq!(
            info.io_in_capsule_bytes,
            128 * 1024,
            "capped at a command's buffer"
        );
        assert_eq!(info.io_queues, 64, "what the host asked for");
    }

    #[test]
    fn a_capsule_smaller_than_a_command_is_refused() {
        let error = controller_info(&identify_controller(5, "03000000"), 7, 0, 1).unwrap_err();
        assert_eq!(error, IdentifyError::CapsuleSize { ioccsz: 3 });
        assert_eq!(
            error.to_string(),
            "the controller reports IOCCSZ 3: a command capsule of 48 bytes, smaller than the 64-byte command (IOCCSZ is at least 4)"
        );
    }
}
