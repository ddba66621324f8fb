//! NVMe/TCP PDU headers (NVMe/TCP Transport Specification 1.0, section 3.6).
//!
//! Decoding turns the header bytes of one PDU into a typed header after the
//! checks that depend on the header alone (type, HLEN, PLEN, PDO, flags). The
//! caller (the connection state machine) owns framing: it decides how many
//! bytes make a header and where the data is. Encoding writes the PDUs a
//! controller sends. Nothing here allocates.

use crate::wire::{Reader, Truncated, Writer};
use thiserror::Error;

/// Length of the common header shared by every PDU.
pub const COMMON_HEADER_LEN: usize = 8;
/// Length of a header or data digest (CRC32C).
pub const DIGEST_LEN: usize = 4;
/// Longest header any PDU has (ICReq/ICResp).
pub const MAX_HEADER_LEN: usize = 128;

/// Most bytes before a CapsuleCmd's data: its 72-byte header, a header
/// digest and the padding to the controller's alignment (CPDA + 1 dwords,
/// up to 128 bytes). The worst case, CPDA 17, pads 76 bytes to 144.
pub const CAPSULE_PDO_MAX: usize = capsule_pdo_max();

const fn capsule_pdo_max() -> usize {
    let header = 72 + DIGEST_LEN;
    let (mut alignment, mut max) = (4, 0);
    while alignment <= 128 {
        let pdo = header.div_ceil(alignment) * alignment;
        if pdo > max {
            max = pdo;
        }
        alignment += 4;
    }
    max
}

const _: () = assert!(CAPSULE_PDO_MAX == 144 && CAPSULE_PDO_MAX <= u8::MAX as usize);

/// PDU type values (NVMe/TCP 1.0, Figure 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    /// Initialize Connection Request (host to controller).
    IcReq = 0x00,
    /// Initialize Connection Response (controller to host).
    IcResp = 0x01,
    /// Host to controller terminate connection request.
    H2cTermReq = 0x02,
    /// Controller to host terminate connection request.
    C2hTermReq = 0x03,
    /// Command capsule.
    CapsuleCmd = 0x04,
    /// Response capsule.
    CapsuleResp = 0x05,
    /// Host to controller data.
    H2cData = 0x06,
    /// Controller to host data.
    C2hData = 0x07,
    /// Ready to transfer.
    R2t = 0x09,
}

impl PduType {
    /// Decodes the PDU-type byte.
    pub fn from_u8(value: u8) -> Option<PduType> {
        Some(match value {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2cTermReq,
            0x03 => PduType::C2hTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2cData,
            0x07 => PduType::C2hData,
            0x09 => PduType::R2t,
            _ => return None,
        })
    }

    /// The fixed HLEN of this PDU type.
    pub fn header_len(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            PduType::CapsuleResp => 24,
            PduType::H2cTermReq | PduType::C2hTermReq => 24,
            PduType::H2cData | PduType::C2hData | PduType::R2t => 24,
        }
    }

    /// The name the specification gives it.
    pub fn name(self) -> &'static str {
        match self {
            PduType::IcReq => "ICReq",
            PduType::IcResp => "ICResp",
            PduType::H2cTermReq => "H2CTermReq",
            PduType::C2hTermReq => "C2HTermReq",
            PduType::CapsuleCmd => "CapsuleCmd",
            PduType::CapsuleResp => "CapsuleResp",
            PduType::H2cData => "H2CData",
            PduType::C2hData => "C2HData",
            PduType::R2t => "R2T",
        }
    }

    /// Whether a header digest may follow this PDU's header (never for IC and TermReq PDUs).
    pub fn may_carry_header_digest(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    }
}

impl std::fmt::Display for PduType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Common-header flag bits (NVMe/TCP 1.0, Figure 17 and the data PDUs).
pub mod flags {
    /// A header digest follows the header.
    pub const HDGSTF: u8 = 0x01;
    /// A data digest follows the data.
    pub const DDGSTF: u8 = 0x02;
    /// Last data PDU of a transfer (H2CData, C2HData).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData only: the command completed successfully and no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Digest bits of ICReq/ICResp.
pub mod digest_bits {
    /// Header digest enabled.
    pub const HEADER: u8 = 0x01;
    /// Data digest enabled.
    pub const DATA: u8 = 0x02;

    /// The digest bits for the given choices.
    pub fn of(header: bool, data: bool) -> u8 {
        (if header { HEADER } else { 0 }) | if data { DATA } else { 0 }
    }
}

/// Fatal Error Status of a C2HTermReq (NVMe/TCP 1.0, Figure 26).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum FatalErrorStatus {
    /// A header field holds an invalid value; FEI is the byte offset of that field.
    InvalidHeaderField = 0x01,
    /// A PDU arrived that is not valid in the current state.
    PduSequenceError = 0x02,
    /// The header digest did not match.
    HeaderDigestError = 0x03,
    /// Data offset or length outside the transfer the controller asked for.
    DataTransferOutOfRange = 0x04,
    /// More data than the negotiated limits allow.
    DataTransferLimitExceeded = 0x05,
    /// A parameter (e.g. PFV) this controller does not support.
    UnsupportedParameter = 0x06,
}

/// The 8-byte common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    /// Raw PDU type (validated separately so that an unknown type can be reported).
    pub pdu_type: u8,
    /// Flag bits, see [`flags`].
    pub flags: u8,
    /// Header length.
    pub hlen: u8,
    /// PDU data offset, 0 if the PDU has no data.
    pub pdo: u8,
    /// Total PDU length including header, digests, padding and data.
    pub plen: u32,
}

/// Byte offsets of common-header fields, reported as FEI.
pub mod field_offset {
    /// PDU-Type.
    pub const PDU_TYPE: u32 = 0;
    /// FLAGS.
    pub const FLAGS: u32 = 1;
    /// HLEN.
    pub const HLEN: u32 = 2;
    /// PDO.
    pub const PDO: u32 = 3;
    /// PLEN.
    pub const PLEN: u32 = 4;
}

impl CommonHeader {
    /// Decodes the first 8 bytes of a PDU.
    pub fn decode(bytes: &[u8]) -> Result<CommonHeader, Truncated> {
        let mut r = Reader::new(bytes);
        Ok(CommonHeader {
            pdu_type: r.u8()?,
            flags: r.u8()?,
            hlen: r.u8()?,
            pdo: r.u8()?,
            plen: r.u32()?,
        })
    }

    fn encode(&self, out: &mut [u8]) {
        Writer::new(out)
            .u8(0, self.pdu_type)
            .u8(1, self.flags)
            .u8(2, self.hlen)
            .u8(3, self.pdo)
            .u32(4, self.plen);
    }
}

/// A header-level protocol violation: what to put in the C2HTermReq.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{} (FES {:#x}, FEI {field_offset})", describe(.status, *.field_offset), *.status as u16)]
pub struct PduError {
    /// FES.
    pub status: FatalErrorStatus,
    /// FEI: byte offset of the offending field for InvalidHeaderField, else 0.
    pub field_offset: u32,
}

impl PduError {
    /// An invalid header field at `field_offset`.
    pub fn field(field_offset: u32) -> Self {
        PduError {
            status: FatalErrorStatus::InvalidHeaderField,
            field_offset,
        }
    }

    /// Any other fatal status (FEI 0).
    pub fn status(status: FatalErrorStatus) -> Self {
        PduError {
            status,
            field_offset: 0,
        }
    }
}

/// A fatal error in words, naming the common-header field an invalid-field
/// error points at.
fn describe(status: &FatalErrorStatus, field_offset: u32) -> String {
    match status {
        FatalErrorStatus::InvalidHeaderField => {
            let field = match field_offset {
                field_offset::PDU_TYPE => " (PDU-Type)",
                field_offset::FLAGS => " (FLAGS)",
                field_offset::HLEN => " (HLEN)",
                field_offset::PDO => " (PDO)",
                field_offset::PLEN => " (PLEN)",
                _ => "",
            };
            format!("invalid header field at byte {field_offset}{field}")
        }
        FatalErrorStatus::PduSequenceError => "a PDU out of sequence".to_string(),
        FatalErrorStatus::HeaderDigestError => "a header digest mismatch".to_string(),
        FatalErrorStatus::DataTransferOutOfRange => {
            "data outside the command's transfer".to_string()
        }
        FatalErrorStatus::DataTransferLimitExceeded => {
            "more data than the negotiated limits allow".to_string()
        }
        FatalErrorStatus::UnsupportedParameter => {
            format!("an unsupported parameter at byte {field_offset}")
        }
    }
}

impl From<Truncated> for PduError {
    fn from(_: Truncated) -> Self {
        // Callers hand complete headers; a short one means PLEN/HLEN lied.
        PduError::field(field_offset::HLEN)
    }
}

/// ICReq (NVMe/TCP 1.0, Figure 20).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    /// PDU format version; only 0 exists.
    pub pfv: u16,
    /// Host PDU data alignment, 0's based in dwords.
    pub hpda: u8,
    /// Requested digests, see [`digest_bits`].
    pub digest: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

impl IcReq {
    /// Decodes an ICReq header (128 bytes).
    pub fn decode(header: &[u8]) -> Result<IcReq, PduError> {
        let mut r = Reader::new(header);
        r.skip(COMMON_HEADER_LEN)?;
        Ok(IcReq {
            pfv: r.u16()?,
            hpda: r.u8()?,
            digest: r.u8()?,
            maxr2t: r.u32()?,
        })
    }

    /// The ICReq a host sends: PFV 0, no PDU data alignment, one outstanding
    /// R2T per command, and the digests it asks for.
    pub fn asking(header_digest: bool, data_digest: bool) -> IcReq {
        IcReq {
            pfv: 0,
            hpda: 0,
            digest: digest_bits::of(header_digest, data_digest),
            maxr2t: 0,
        }
    }

    /// Encodes an ICReq (used by the host model in tests and by the initiator).
    pub fn encode(&self, out: &mut [u8; 128]) {
        encode_ic(
            PduType::IcReq,
            self.pfv,
            self.hpda,
            self.digest,
            self.maxr2t,
            out,
        );
    }
}

/// ICReq and ICResp share one layout: PFV, an alignment byte (HPDA/CPDA),
/// the digest bits and a dword (MAXR2T/MAXH2CDATA), zero-padded to 128 bytes.
fn encode_ic(
    pdu_type: PduType,
    pfv: u16,
    alignment: u8,
    digest: u8,
    dword: u32,
    out: &mut [u8; 128],
) {
    out.fill(0);
    CommonHeader {
        pdu_type: pdu_type as u8,
        flags: 0,
        hlen: 128,
        pdo: 0,
        plen: 128,
    }
    .encode(out);
    Writer::new(out)
        .u16(8, pfv)
        .u8(10, alignment)
        .u8(11, digest)
        .u32(12, dword);
}

/// ICResp (NVMe/TCP 1.0, Figure 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    /// PDU format version (0).
    pub pfv: u16,
    /// Controller PDU data alignment, 0's based in dwords.
    pub cpda: u8,
    /// Enabled digests.
    pub digest: u8,
    /// Largest H2CData payload the controller accepts, in bytes.
    pub maxh2cdata: u32,
}

impl IcResp {
    /// Encodes an ICResp.
    pub fn encode(&self, out: &mut [u8; 128]) {
        encode_ic(
            PduType::IcResp,
            self.pfv,
            self.cpda,
            self.digest,
            self.maxh2cdata,
            out,
        );
    }

    /// Decodes an ICResp header.
    pub fn decode(header: &[u8]) -> Result<IcResp, PduError> {
        let mut r = Reader::new(header);
        r.skip(COMMON_HEADER_LEN)?;
        Ok(IcResp {
            pfv: r.u16()?,
            cpda: r.u8()?,
            digest: r.u8()?,
            maxh2cdata: r.u32()?,
        })
    }
}

/// The data-transfer header shared by H2CData, C2HData and R2T (24 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Command capsule CID the transfer belongs to.
    pub cccid: u16,
    /// Transfer tag (R2T, H2CData); reserved in C2HData.
    pub ttag: u16,
    /// Offset of this data within the command's transfer (DATAO / R2TO).
    pub offset: u32,
    /// Length of the data (DATAL / R2TL).
    pub length: u32,
}

/// Byte offsets of data-header fields, reported as FEI.
pub mod data_field_offset {
    /// CCCID.
    pub const CCCID: u32 = 8;
    /// TTAG.
    pub const TTAG: u32 = 10;
    /// DATAO.
    pub const DATAO: u32 = 12;
    /// DATAL.
    pub const DATAL: u32 = 16;
}

impl DataHeader {
    /// Decodes the fields after the common header.
    pub fn decode(header: &[u8]) -> Result<DataHeader, PduError> {
        let mut r = Reader::new(header);
        r.skip(COMMON_HEADER_LEN)?;
        Ok(DataHeader {
            cccid: r.u16()?,
            ttag: r.u16()?,
            offset: r.u32()?,
            length: r.u32()?,
        })
    }

    fn encode(&self, out: &mut [u8]) {
        Writer::new(out)
            .u16(8, self.cccid)
            .u16(10, self.ttag)
            .u32(12, self.offset)
            .u32(16, self.length);
    }
}

/// Header, header digest and padding of a data PDU, ready to send: the data
/// and the data digest follow separately. `pdo_alignment` is the receiver's
/// data alignment in bytes ((HPDA or CPDA + 1) * 4). Returns PDO: the bytes of
/// `out` to send before the data.
pub fn encode_data_pdu(
    pdu_type: PduType,
    pdu_flags: u8,
    header_digest: bool,
    data_digest: bool,
    pdo_alignment: usize,
    data: DataHeader,
    out: &mut [u8; MAX_HEADER_LEN],
) -> usize {
    debug_assert!(matches!(pdu_type, PduType::C2hData | PduType::H2cData));
    debug_assert!((4..=MAX_HEADER_LEN).contains(&pdo_alignment) && pdo_alignment.is_multiple_of(4));
    let hdgst = if header_digest { DIGEST_LEN } else { 0 };
    let ddgst = if data_digest && data.length > 0 {
        DIGEST_LEN
    } else {
        0
    };
    let hlen = pdu_type.header_len();
    let pdo = (hlen + hdgst).div_ceil(pdo_alignment) * pdo_alignment;
    let mut flag_bits = pdu_flags;
    if header_digest {
        flag_bits |= flags::HDGSTF;
    }
    if ddgst > 0 {
        flag_bits |= flags::DDGSTF;
    }
    let plen = (pdo + data.length as usize + ddgst) as u32;
    out.fill(0);
    CommonHeader {
        pdu_type: pdu_type as u8,
        flags: flag_bits,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen,
    }
    .encode(out);
    data.encode(out);
    finish_header(out, hlen, header_digest);
    pdo
}

/// Header, header digest and padding of a CapsuleCmd carrying `sqe` and
/// `data_len` bytes of in-capsule data aligned to `pdo_alignment` (the
/// controller's (CPDA + 1) * 4). Returns the bytes of `out` to send before the
/// data; the data and its digest follow separately.
pub fn encode_capsule_cmd(
    header_digest: bool,
    data_digest: bool,
    pdo_alignment: usize,
    sqe: &[u8; 64],
    data_len: usize,
    out: &mut [u8; CAPSULE_PDO_MAX],
) -> usize {
    debug_assert!((4..=128).contains(&pdo_alignment) && pdo_alignment.is_multiple_of(4));
    let hlen = PduType::CapsuleCmd.header_len();
    let hdgst = if header_digest { DIGEST_LEN } else { 0 };
    let ddgst = if data_digest && data_len > 0 {
        DIGEST_LEN
    } else {
        0
    };
    let pdo = if data_len > 0 {
        (hlen + hdgst).div_ceil(pdo_alignment) * pdo_alignment
    } else {
        0
    };
    let plen = if data_len > 0 {
        pdo + data_len + ddgst
    } else {
        hlen + hdgst
    };
    let pdu_flags =
        if hdgst > 0 { flags::HDGSTF } else { 0 } | if ddgst > 0 { flags::DDGSTF } else { 0 };
    out.fill(0);
    CommonHeader {
        pdu_type: PduType::CapsuleCmd as u8,
        flags: pdu_flags,
        hlen: hlen as u8,
        pdo: pdo as u8,
        plen: plen as u32,
    }
    .encode(out);
    Writer::new(out).bytes(COMMON_HEADER_LEN, sqe);
    let header_end = finish_header(out, hlen, header_digest);
    if data_len > 0 {
        pdo
    } else {
        header_end
    }
}

/// R2T header (and digest), NVMe/TCP 1.0 Figure 31.
pub fn encode_r2t(header_digest: bool, r2t: DataHeader, out: &mut [u8; 28]) -> usize {
    let hlen = PduType::R2t.header_len();
    let plen = (hlen + if header_digest { DIGEST_LEN } else { 0 }) as u32;
    out.fill(0);
    let flag_bits = if header_digest { flags::HDGSTF } else { 0 };
    CommonHeader {
        pdu_type: PduType::R2t as u8,
        flags: flag_bits,
        hlen: hlen as u8,
        pdo: 0,
        plen,
    }
    .encode(out);
    r2t.encode(out);
    finish_header(out, hlen, header_digest)
}

/// CapsuleResp: header plus the 16-byte completion queue entry.
pub fn encode_capsule_resp(header_digest: bool, cqe: &[u8; 16], out: &mut [u8; 28]) -> usize {
    let hlen = PduType::CapsuleResp.header_len();
    let plen = (hlen + if header_digest { DIGEST_LEN } else { 0 }) as u32;
    out.fill(0);
    let flag_bits = if header_digest { flags::HDGSTF } else { 0 };
    CommonHeader {
        pdu_type: PduType::CapsuleResp as u8,
        flags: flag_bits,
        hlen: hlen as u8,
        pdo: 0,
        plen,
    }
    .encode(out);
    Writer::new(out).bytes(COMMON_HEADER_LEN, cqe);
    finish_header(out, hlen, header_digest)
}

/// Most bytes of the offending PDU a TermReq carries (NVMe/TCP 1.0: 152-byte maximum PDU, 24-byte header).
pub const TERM_REQ_MAX_DATA: usize = 128;

/// C2HTermReq (NVMe/TCP 1.0, Figure 27): header, then up to 128 bytes of the
/// offending PDU's header. Never carries digests.
pub fn encode_c2h_term_req(
    error: PduError,
    offending_header: &[u8],
    out: &mut [u8; 24 + TERM_REQ_MAX_DATA],
) -> usize {
    let data = &offending_header[..offending_header.len().min(TERM_REQ_MAX_DATA)];
    let hlen = PduType::C2hTermReq.header_len();
    let plen = hlen + data.len();
    out.fill(0);
    let pdo = if data.is_empty() { 0 } else { hlen as u8 };
    CommonHeader {
        pdu_type: PduType::C2hTermReq as u8,
        flags: 0,
        hlen: hlen as u8,
        pdo,
        plen: plen as u32,
    }
    .encode(out);
    Writer::new(out)
        .u16(8, error.status as u16)
        .u32(10, error.field_offset)
        .bytes(hlen, data);
    plen
}

/// Appends the header digest when enabled; returns the header length on the wire.
fn finish_header(out: &mut [u8], hlen: usize, header_digest: bool) -> usize {
    if !header_digest {
        return hlen;
    }
    let digest = crate::digest::crc32c(&out[..hlen]);
    Writer::new(out).u32(hlen, digest);
    hlen + DIGEST_LEN
}

// Compile-time size checks of the fixed-size headers (cf. SPDK's SPDK_STATIC_ASSERTs).
const _: () = assert!(
    COMMON_HEADER_LEN + 64 == 72,
    "CapsuleCmd header is common header + SQE"
);
const _: () = assert!(
    COMMON_HEADER_LEN + 16 == 24,
    "CapsuleResp header is common header + CQE"
);
const _: () = assert!(
    24 + TERM_REQ_MAX_DATA == 152,
    "TermReq PDUs are at most 152 bytes"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    #[test]
    fn icreq_from_linux_host_decodes() {
        // ICReq as sent by Linux nvme-tcp with --hdr-digest --data-digest (hpda 0, maxr2t 0).
        let mut bytes = hex("00 00 80 00 80000000 0000 00 03 00000000");
        bytes.resize(128, 0);
        let common = CommonHeader::decode(&bytes).unwrap();
        assert_eq!(
            common,
            CommonHeader {
                pdu_type: 0,
                flags: 0,
                hlen: 128,
                pdo: 0,
                plen: 128
            }
        );
        assert_eq!(
            IcReq::decode(&bytes).unwrap(),
            IcReq {
                pfv: 0,
                hpda: 0,
                digest: 3,
                maxr2t: 0
            }
        );
        let mut reencoded = [0u8; 128];
        IcReq {
            pfv: 0,
            hpda: 0,
            digest: 3,
            maxr2t: 0,
        }
        .encode(&mut reencoded);
        assert_eq!(&reencoded[..], &bytes[..]);
    }

    #[test]
    fn icresp_encodes_maxh2cdata() {
        let mut out = [0u8; 128];
        IcResp {
            pfv: 0,
            cpda: 0,
            digest: 1,
            maxh2cdata: 0x20000,
        }
        .encode(&mut out);
        assert_eq!(
            &out[..16],
            &hex("01 00 80 00 80000000 0000 00 01 00000200")[..]
        );
        assert!(out[16..].iter().all(|&b| b == 0));
    }

    #[test]
    fn c2hdata_header_with_digests() {
        let mut out = [0u8; MAX_HEADER_LEN];
        let data = DataHeader {
            cccid: 0x0a,
            ttag: 0,
            offset: 0,
            length: 4096,
        };
        let len = encode_data_pdu(
            PduType::C2hData,
            flags::LAST_PDU,
            true,
            true,
            4,
            data,
            &mut out,
        );
        assert_eq!(len, 28);
        // flags: HDGSTF|DDGSTF|LAST; pdo 28; plen 24+4+4096+4 = 4128 = 0x1020
        assert_eq!(
            &out[..24],
            &hex("07 07 18 1c 20100000 0a00 0000 00000000 00100000 00000000")[..]
        );
        let digest = crate::digest::crc32c(&out[..24]);
        assert_eq!(&out[24..28], &digest.to_le_bytes());
    }

    #[test]
    fn c2hdata_pads_to_host_alignment() {
        let mut out = [0u8; MAX_HEADER_LEN];
        let data = DataHeader {
            cccid: 1,
            ttag: 0,
            offset: 0,
            length: 512,
        };
        // HPDA 7: data aligned to 32 bytes, so PDO 32 and 8 bytes of padding after the header.
        let pdo = encode_data_pdu(PduType::C2hData, 0, false, false, 32, data, &mut out);
        assert_eq!(pdo, 32);
        assert_eq!(out[3], 32);
        assert_eq!(u32::from_le_bytes(out[4..8].try_into().unwrap()), 32 + 512);
        assert!(out[24..32].iter().all(|&b| b == 0));
    }

    #[test]
    fn r2t_header() {
        let mut out = [0u8; 28];
        let len = encode_r2t(
            false,
            DataHeader {
                cccid: 3,
                ttag: 7,
                offset: 0,
                length: 0x8000,
            },
            &mut out,
        );
        assert_eq!(len, 24);
        assert_eq!(
            &out[..24],
            &hex("09 00 18 00 18000000 0300 0700 00000000 00800000 00000000")[..]
        );
    }

    #[test]
    fn capsule_resp_header() {
        let mut out = [0u8; 28];
        let cqe = hex("01000000 00000000 0100 0000 2a00 0000");
        let len = encode_capsule_resp(false, &cqe.try_into().unwrap(), &mut out);
        assert_eq!(len, 24);
        assert_eq!(&out[..8], &hex("05 00 18 00 18000000")[..]);
    }

    #[test]
    fn term_req_carries_offending_header() {
        let mut out = [0u8; 152];
        let offending = hex("04 00 32 00 48000000");
        let len = encode_c2h_term_req(PduError::field(field_offset::HLEN), &offending, &mut out);
        assert_eq!(len, 32);
        assert_eq!(
            &out[..len],
            &hex("03 00 18 18 20000000 0100 02000000 00000000000000000000 0400320048000000")[..]
        );
    }

    #[test]
    fn pdu_errors_say_what_was_wrong() {
        assert_eq!(
            PduError::field(field_offset::PLEN).to_string(),
            "invalid header field at byte 4 (PLEN) (FES 0x1, FEI 4)"
        );
        assert_eq!(
            PduError::status(FatalErrorStatus::DataTransferOutOfRange).to_string(),
            "data outside the command's transfer (FES 0x4, FEI 0)"
        );
    }

    #[test]
    fn pdu_type_round_trip() {
        for value in 0..=255u8 {
            if let Some(kind) = PduType::from_u8(value) {
                assert_eq!(kind as u8, value);
            }
        }
        assert_eq!(PduType::from_u8(0x08), None);
    }
}
