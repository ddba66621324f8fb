//! Receive-side PDU framing shared by both ends of a connection: it gathers
//! a PDU's header, then streams its data straight into the slot buffer the
//! owner names, checking the data digest on the way. What a header means, and
//! which data goes where, is the owner's decision (controller or host side).

use crate::connection::SlotBuffers;
use crate::digest::{crc32c, crc32c_append};
use crate::pdu::{
    field_offset, flags, CommonHeader, FatalErrorStatus, PduError, PduType, COMMON_HEADER_LEN,
    DIGEST_LEN, MAX_HEADER_LEN,
};
use crate::types::SlotId;

/// Where a PDU's data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataTarget {
    /// Slot whose buffer receives the data.
    pub slot: SlotId,
    /// Offset in that buffer.
    pub buffer_offset: usize,
    /// Data length.
    pub len: usize,
    /// Whether a data digest follows.
    pub digest: bool,
    /// Owner-defined: capsule data (controller) or the last data PDU (host).
    pub tag: bool,
}

/// Padding and data of a PDU, from its common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataLayout {
    /// Bytes between the header (and digest) and PDO.
    pub padding: usize,
    /// Data length.
    pub len: usize,
    /// Whether a data digest follows the data.
    pub digest: bool,
}

/// What a call to [`Framer::advance`] reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// The input ran out mid-way.
    NeedMore,
    /// The 8-byte common header is in: the owner checks it and calls [`Framer::expect_header`].
    CommonHeader(CommonHeader),
    /// The whole header (and digest) is in: the owner handles it, then calls
    /// [`Framer::expect_data`] or [`Framer::reset`].
    Header,
    /// All data of the PDU is in the slot buffer; `intact` tells the data digest's verdict.
    Data { target: DataTarget, intact: bool },
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Header,
    Padding {
        remaining: usize,
        data: DataTarget,
    },
    Data {
        target: DataTarget,
        remaining: usize,
        crc: u32,
    },
    DataDigest {
        target: DataTarget,
        crc: u32,
    },
}

/// Receive state of one connection.
#[derive(Debug)]
pub(crate) struct Framer {
    /// Header digests negotiated (ICReq/ICResp); the sending side follows the same choice.
    pub header_digest: bool,
    /// Data digests negotiated.
    pub data_digest: bool,
    header: [u8; MAX_HEADER_LEN + DIGEST_LEN],
    have: usize,
    need: usize,
    digest: [u8; DIGEST_LEN],
    digest_have: usize,
    phase: Phase,
}

impl Framer {
    pub fn new() -> Framer {
        Framer {
            header_digest: false,
            data_digest: false,
            header: [0; MAX_HEADER_LEN + DIGEST_LEN],
            have: 0,
            need: COMMON_HEADER_LEN,
            digest: [0; DIGEST_LEN],
            digest_have: 0,
            phase: Phase::Header,
        }
    }

    /// The header bytes received so far (for handling, and for quoting in a TermReq).
    pub fn header(&self) -> &[u8] {
        &self.header[..self.have]
    }

    /// Back to waiting for the next PDU's common header.
    pub fn reset(&mut self) {
        self.have = 0;
        self.need = COMMON_HEADER_LEN;
        self.phase = Phase::Header;
    }

    /// Bytes of header digest a `kind` PDU carries on this connection.
    pub fn header_digest_len(&self, kind: PduType) -> usize {
        if self.header_digest && kind.may_carry_header_digest() {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Checks of a common header that hold for every PDU type: HLEN, the
    /// header digest flag, and a PLEN that covers the header (in that order,
    /// so FEI names the first bad field).
    pub fn check_common(&self, common: &CommonHeader, kind: PduType) -> Result<(), PduError> {
        if usize::from(common.hlen) != kind.header_len() {
            return Err(PduError::field(field_offset::HLEN));
        }
        if kind.may_carry_header_digest()
            && (common.flags & flags::HDGSTF != 0) != self.header_digest
        {
            return Err(PduError::field(field_offset::FLAGS));
        }
        if (common.plen as usize) < kind.header_len() + self.header_digest_len(kind) {
            return Err(PduError::field(field_offset::PLEN));
        }
        Ok(())
    }

    /// After the common header: gather the rest of a `kind` header (and its digest).
    pub fn expect_header(&mut self, kind: PduType) {
        self.need = kind.header_len() + self.header_digest_len(kind);
    }

    /// The complete header: its type, common header and data layout, after the
    /// header digest and PDO checks. `data_limit` is the most data a PDU of a
    /// type may carry.
    pub fn parse_header(
        &self,
        data_limit: impl FnOnce(PduType) -> usize,
    ) -> Result<(PduType, CommonHeader, DataLayout), PduError> {
        let common = CommonHeader::decode(self.header())?;
        let kind =
            PduType::from_u8(common.pdu_type).ok_or(PduError::field(field_offset::PDU_TYPE))?;
        let digest_len = self.header_digest_len(kind);
        self.check_header_digest(kind.header_len(), digest_len > 0)?;
        let data = data_layout(
            &common,
            kind,
            kind.header_len() + digest_len,
            self.data_digest,
            data_limit(kind),
        )?;
        Ok((kind, common, data))
    }

    /// After the header: `layout.padding` bytes to skip, then data into `target`.
    pub fn expect_data(&mut self, padding: usize, target: DataTarget) {
        self.phase = Phase::Padding {
            remaining: padding,
            data: target,
        };
    }

    /// Consumes input up to the next step; returns the bytes consumed.
    pub fn advance(&mut self, input: &[u8], buffers: &mut impl SlotBuffers) -> (usize, Step) {
        match self.phase {
            Phase::Header => {
                let take = (self.need - self.have).min(input.len());
                self.header[self.have..self.have + take].copy_from_slice(&input[..take]);
                self.have += take;
                let step = match self.have {
                    have if have < self.need => Step::NeedMore,
                    COMMON_HEADER_LEN if self.need == COMMON_HEADER_LEN => Step::CommonHeader(
                        CommonHeader::decode(&self.header).expect("8 bytes are a common header"),
                    ),
                    _ => Step::Header,
                };
                (take, step)
            }
            Phase::Padding { remaining, data } => {
                let skipped = remaining.min(input.len());
                self.phase = if skipped == remaining {
                    Phase::Data {
                        target: data,
                        remaining: data.len,
                        crc: 0,
                    }
                } else {
                    Phase::Padding {
                        remaining: remaining - skipped,
                        data,
                    }
                };
                (skipped, Step::NeedMore)
            }
            Phase::Data {
                target,
                remaining,
                crc,
            } => {
                let take = remaining.min(input.len());
                let start = target.buffer_offset + (target.len - remaining);
                let chunk = &input[..take];
                buffers.buffer(target.slot)[start..start + take].copy_from_slice(chunk);
                let crc = if target.digest {
                    crc32c_append(crc, chunk)
                } else {
                    crc
                };
                if take < remaining {
                    self.phase = Phase::Data {
                        target,
                        remaining: remaining - take,
                        crc,
                    };
                    (take, Step::NeedMore)
                } else if target.digest {
                    self.digest_have = 0;
                    self.phase = Phase::DataDigest { target, crc };
                    (take, Step::NeedMore)
                } else {
                    self.phase = Phase::Header;
                    (
                        take,
                        Step::Data {
                            target,
                            intact: true,
                        },
                    )
                }
            }
            Phase::DataDigest { target, crc } => {
                let take = (DIGEST_LEN - self.digest_have).min(input.len());
                self.digest[self.digest_have..self.digest_have + take]
                    .copy_from_slice(&input[..take]);
                self.digest_have += take;
                if self.digest_have < DIGEST_LEN {
                    return (take, Step::NeedMore);
                }
                self.phase = Phase::Header;
                (
                    take,
                    Step::Data {
                        target,
                        intact: u32::from_le_bytes(self.digest) == crc,
                    },
                )
            }
        }
    }

    /// Checks the header digest of a `hlen`-byte header, if one was expected.
    fn check_header_digest(&self, hlen: usize, digest: bool) -> Result<(), PduError> {
        if !digest {
            return Ok(());
        }
        let received = u32::from_le_bytes([
            self.header[hlen],
            self.header[hlen + 1],
            self.header[hlen + 2],
            self.header[hlen + 3],
        ]);
        if crc32c(&self.header[..hlen]) != received {
            return Err(PduError::status(FatalErrorStatus::HeaderDigestError));
        }
        Ok(())
    }
}

/// Padding, data length and data digest of a PDU, checked against PDO.
/// `header_total` is HLEN plus the header digest; `data_digest` whether data
/// digests were negotiated; `limit` the most data this PDU may carry
/// (exceeding it is DataTransferLimitExceeded).
fn data_layout(
    common: &CommonHeader,
    kind: PduType,
    header_total: usize,
    data_digest: bool,
    limit: usize,
) -> Result<DataLayout, PduError> {
    let plen = common.plen as usize;
    if plen == header_total
        || matches!(
            kind,
            PduType::IcReq | PduType::IcResp | PduType::H2cTermReq | PduType::C2hTermReq
        )
    {
        return Ok(DataLayout {
            padding: 0,
            len: 0,
            digest: false,
        });
    }
    let digest = common.flags & flags::DDGSTF != 0;
    if digest != data_digest {
        return Err(PduError::field(field_offset::FLAGS));
    }
    let digest_len = if digest { DIGEST_LEN } else { 0 };
    let pdo = usize::from(common.pdo);
    if pdo < header_total || pdo + digest_len > plen {
        return Err(PduError::field(field_offset::PDO));
    }
    let len = plen - pdo - digest_len;
    if len > limit {
        return Err(PduError::status(
            FatalErrorStatus::DataTransferLimitExceeded,
        ));
    }
    Ok(DataLayout {
        padding: pdo - header_total,
        len,
        digest,
    })
}
