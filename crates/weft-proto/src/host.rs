//! The host side of one NVMe/TCP connection (one NVMe queue), sans-IO: the
//! core of weft's initiator. It sends ICReq and command capsules (data in the
//! capsule when it fits), answers R2Ts with H2CData sent from the command's
//! buffer, places C2HData in that buffer, and turns CapsuleResps into
//! completions. It knows nothing of controllers: Connect, Identify and Keep
//! Alive are commands its owner submits.
//!
//! Driving it mirrors the controller side ([`crate::Connection`]):
//! `handle_input(bytes, buffers)` with everything received, `poll_transmit()`
//! and `on_transmitted()` to send, `poll_completion()` for finished commands.
//! A command's data lives in the buffer of the slot numbered by its CID.

use crate::command::SQE_LEN;
use crate::digest::crc32c;
use crate::framing::{self, DataTarget, Framer, Step};
use crate::pdu::{
    self, data_field_offset, digest_bits, field_offset, flags, CommonHeader, DataHeader, IcReq,
    IcResp, PduError, PduType, COMMON_HEADER_LEN, MAX_HEADER_LEN,
};
use crate::status::Status;
use crate::transmit::{Transmit, Transmitter};
use crate::types::{Cid, SlotId};
use crate::SlotBuffers;
use std::collections::VecDeque;
use thiserror::Error;

/// What the host asks for when the connection opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// Ask for header digests.
    pub header_digest: bool,
    /// Ask for data digests.
    pub data_digest: bool,
    /// Commands that may be outstanding (the queue size, SQSIZE + 1).
    pub queue_entries: u16,
    /// Largest in-capsule data the controller accepts on this queue (IOCCSZ * 16 - 64;
    /// 8 KiB on admin queues); larger writes go by R2T.
    pub in_capsule_bytes_max: u32,
    /// Size of each command's data buffer: the largest transfer of one command.
    pub buffer_bytes: u32,
}

/// Where a command's data goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataTransfer {
    /// No data.
    None,
    /// `len` bytes from the command's buffer to the controller.
    ToController(u32),
    /// `len` bytes from the controller into the command's buffer.
    FromController(u32),
}

impl DataTransfer {
    fn len(self) -> u32 {
        match self {
            DataTransfer::None => 0,
            DataTransfer::ToController(len) | DataTransfer::FromController(len) => len,
        }
    }
}

/// A finished command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostCompletion {
    /// Its command identifier.
    pub cid: Cid,
    /// Completion status.
    pub status: Status,
    /// DW0 and DW1 of the completion.
    pub result: u64,
    /// Data bytes the controller sent for it (C2HData). A controller may
    /// send less than a read asked for (weft's and others' admin commands
    /// answer with what they have); the rest of the buffer is then stale.
    pub received_bytes: u32,
}

/// Why a command could not be submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SubmitError {
    /// The connection is not initialized yet, or has failed.
    #[error("the connection is not ready")]
    NotReady,
    /// As many commands are outstanding as the queue has entries.
    #[error("the queue is full")]
    QueueFull,
    /// The transfer is larger than a command buffer.
    #[error("the transfer is larger than a command buffer")]
    TooLarge,
}

/// Why the connection failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum HostError {
    /// The controller sent a malformed or unexpected PDU; an H2CTermReq was sent.
    #[error("the target broke the protocol: {0}")]
    Protocol(Violation),
    /// The controller ended the connection with a C2HTermReq.
    #[error("the target terminated the connection (C2HTermReq, fatal error status {status:#x})")]
    Terminated {
        /// FES of the C2HTermReq.
        status: u16,
    },
    /// The controller did not enable the digests the host asked for.
    #[error("the target refused the requested digests (asked {asked:#x}, got {granted:#x})")]
    DigestRefused {
        /// Digest bits asked for.
        asked: u8,
        /// Digest bits granted.
        granted: u8,
    },
}

/// What a target sent that the host refuses, in words. The H2CTermReq the
/// host answers with carries [`Violation::pdu_error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Violation {
    /// A check every PDU passes failed (type, lengths, digests, sequence).
    #[error("{0}")]
    Header(PduError),
    /// A PDU that carries no data (CapsuleResp, R2T) is longer than its header.
    #[error("{pdu} with PLEN {plen}: it carries no data, so its PLEN is {expected}")]
    NotHeaderOnly {
        /// The PDU type.
        pdu: PduType,
        /// PLEN received.
        plen: u32,
        /// HLEN plus the header digest.
        expected: u32,
    },
    /// ICResp's MAXH2CDATA is below 4 KiB or not whole dwords.
    #[error("ICResp MAXH2CDATA is {0}; it must be a multiple of 4 and at least 4096")]
    MaxH2cData(u32),
    /// ICResp's CPDA is above 31.
    #[error("ICResp CPDA is {0}; at most 31 dwords of alignment exist")]
    Cpda(u8),
    /// A PDU about a command that is not outstanding.
    #[error("{pdu} for command {cid}, which is not outstanding")]
    UnknownCommand {
        /// The PDU type.
        pdu: PduType,
        /// CCCID.
        cid: u16,
    },
    /// An R2T or C2HData for a command whose data does not move that way.
    #[error("{pdu} for command {cid}, whose data {transfer}")]
    WrongTransfer {
        /// The PDU type.
        pdu: PduType,
        /// CCCID.
        cid: u16,
        /// Where the command's data goes instead.
        transfer: &'static str,
    },
    /// C2HData whose DATAL differs from the data it carries, or that carries none.
    #[error("C2HData for command {cid} says DATAL {datal} and carries {carried} bytes")]
    DataLength {
        /// CCCID.
        cid: u16,
        /// DATAL.
        datal: u32,
        /// Bytes of data in the PDU.
        carried: usize,
    },
    /// Data asked for or sent beyond the command's transfer (and buffer), or none at all.
    #[error("{pdu} for command {cid} covers bytes {offset}..{end} of its {transfer_bytes}-byte transfer")]
    OutOfRange {
        /// The PDU type.
        pdu: PduType,
        /// CCCID.
        cid: u16,
        /// R2TO or DATAO.
        offset: u32,
        /// The offset plus R2TL or DATAL.
        end: u64,
        /// The command's transfer length.
        transfer_bytes: u32,
    },
    /// C2HData that does not start where the previous one ended.
    #[error("C2HData for command {cid} starts at byte {offset}, but {received} bytes had arrived")]
    OutOfOrder {
        /// CCCID.
        cid: u16,
        /// DATAO.
        offset: u32,
        /// Bytes received before it.
        received: u32,
    },
    /// C2HData with the SUCCESS flag that is not the last of its transfer.
    #[error("C2HData for command {cid} has the SUCCESS flag but does not end the transfer")]
    EarlySuccess {
        /// CCCID.
        cid: u16,
    },
}

impl Violation {
    /// What the H2CTermReq says: FES and FEI (NVMe/TCP 1.0, Figure 26).
    pub fn pdu_error(&self) -> PduError {
        match *self {
            Violation::Header(error) => error,
            Violation::NotHeaderOnly { .. } => PduError::field(field_offset::PLEN),
            Violation::MaxH2cData(_) => PduError::field(12),
            Violation::Cpda(_) => PduError::field(10),
            // The CID of a CapsuleResp sits at byte 12 of its CQE.
            Violation::UnknownCommand {
                pdu: PduType::CapsuleResp,
                ..
            } => PduError::field(COMMON_HEADER_LEN as u32 + 12),
            Violation::UnknownCommand { .. } | Violation::WrongTransfer { .. } => {
                PduError::field(data_field_offset::CCCID)
            }
            Violation::DataLength { .. } => PduError::field(data_field_offset::DATAL),
            Violation::OutOfRange { .. } | Violation::OutOfOrder { .. } => {
                PduError::status(pdu::FatalErrorStatus::DataTransferOutOfRange)
            }
            Violation::EarlySuccess { .. } => PduError::field(field_offset::FLAGS),
        }
    }
}

impl From<PduError> for Violation {
    fn from(error: PduError) -> Violation {
        Violation::Header(error)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    AwaitIcResp,
    Ready,
    Failed(HostError),
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    active: bool,
    transfer: DataTransfer,
    /// The data went in the capsule: no R2T may ask for it.
    in_capsule: bool,
    received: u32,
    /// Transmissions in flight that read this command's buffer.
    sending: u16,
    data_error: bool,
    /// The command's completion arrived (it may not have been taken yet).
    completed: bool,
    /// A completion that arrived while the buffer was still being sent.
    parked: Option<HostCompletion>,
}

/// The host side of one connection.
#[derive(Debug)]
pub struct HostQueue {
    config: HostConfig,
    state: State,
    maxh2cdata: u32,
    h2c_pdo_alignment: usize,
    rx: Framer,
    tx: Transmitter,
    commands: Vec<Outstanding>,
    free: Vec<u16>,
    completions: VecDeque<HostCompletion>,
}

impl HostQueue {
    /// A new connection; the ICReq is queued for sending at once.
    pub fn new(config: HostConfig) -> HostQueue {
        assert!(
            config.queue_entries >= 2,
            "a queue has at least two entries"
        );
        let depth = usize::from(config.queue_entries);
        let idle = Outstanding {
            active: false,
            transfer: DataTransfer::None,
            in_capsule: false,
            received: 0,
            sending: 0,
            data_error: false,
            completed: false,
            parked: None,
        };
        let mut queue = HostQueue {
            config,
            state: State::AwaitIcResp,
            maxh2cdata: 0,
            h2c_pdo_alignment: 4,
            rx: Framer::new(),
            tx: Transmitter::with_capacity(16 * 1024, depth * 4),
            commands: vec![idle; depth],
            free: (0..config.queue_entries).rev().collect(),
            completions: VecDeque::with_capacity(depth),
        };
        let mut icreq = [0u8; 128];
        IcReq::asking(config.header_digest, config.data_digest).encode(&mut icreq);
        queue.tx.push_bytes(&icreq);
        queue
    }

    /// Whether ICResp arrived and commands may be submitted.
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// The failure that ended the connection, if any.
    pub fn error(&self) -> Option<HostError> {
        match self.state {
            State::Failed(error) => Some(error),
            _ => None,
        }
    }

    /// Whether the queue sends a digest of each command's data (negotiated
    /// at ICReq): computed over the data in its slot's buffer, which must
    /// then hold it.
    pub fn data_digest(&self) -> bool {
        self.rx.data_digest
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.commands.len() - self.free.len()
    }

    /// Queues a command. The SQE's CID, PSDT and SGL are filled in here; for
    /// `ToController` the data must already be in the buffer of slot `cid`,
    /// which is only known once this returns, so write the data into
    /// [`HostQueue::next_cid`]'s buffer first.
    pub fn submit(
        &mut self,
        mut sqe: [u8; SQE_LEN],
        transfer: DataTransfer,
        buffers: &mut impl SlotBuffers,
    ) -> Result<Cid, SubmitError> {
        if self.state != State::Ready {
            return Err(SubmitError::NotReady);
        }
        let len = transfer.len();
        if len > self.config.buffer_bytes {
            return Err(SubmitError::TooLarge);
        }
        let cid = self.free.pop().ok_or(SubmitError::QueueFull)?;
        let in_capsule = matches!(transfer, DataTransfer::ToController(len) if len > 0 && len <= self.config.in_capsule_bytes_max);
        sqe[1] = (sqe[1] & 0x3F) | 0x40; // PSDT: SGL, as Fabrics requires
        sqe[2..4].copy_from_slice(&cid.to_le_bytes());
        sqe[24..32].fill(0);
        sqe[32..36].copy_from_slice(&len.to_le_bytes());
        sqe[36..39].fill(0);
        sqe[39] = if in_capsule { 0x01 } else { 0x5A };
        let entry = &mut self.commands[usize::from(cid)];
        *entry = Outstanding {
            active: true,
            transfer,
            in_capsule,
            received: 0,
            sending: 0,
            data_error: false,
            completed: false,
            parked: None,
        };
        self.queue_capsule(&sqe, if in_capsule { len } else { 0 }, SlotId(cid), buffers);
        Ok(Cid(cid))
    }

    /// The CID the next [`HostQueue::submit`] will use, so its buffer can be filled first.
    pub fn next_cid(&self) -> Option<Cid> {
        self.free.last().map(|&cid| Cid(cid))
    }

    fn queue_capsule(
        &mut self,
        sqe: &[u8; SQE_LEN],
        data_len: u32,
        slot: SlotId,
        buffers: &mut impl SlotBuffers,
    ) {
        let mut header = [0u8; pdu::CAPSULE_PDO_MAX];
        let header_bytes = pdu::encode_capsule_cmd(
            self.rx.header_digest,
            self.rx.data_digest,
            self.h2c_pdo_alignment,
            sqe,
            data_len as usize,
            &mut header,
        );
        self.tx.push_bytes(&header[..header_bytes]);
        if data_len > 0 {
            self.send_slot_data(slot, 0, data_len as usize, buffers);
        }
    }

    /// Queues `len` bytes of a command's buffer (and their digest).
    fn send_slot_data(
        &mut self,
        slot: SlotId,
        offset: usize,
        len: usize,
        buffers: &mut impl SlotBuffers,
    ) {
        self.tx.push_slot(slot, offset..offset + len);
        self.commands[usize::from(slot.0)].sending += 1;
        if self.rx.data_digest {
            let digest = crc32c(&buffers.buffer(slot)[offset..offset + len]);
            self.tx.push_bytes(&digest.to_le_bytes());
        }
    }

    /// What to send next, if nothing is being sent.
    pub fn poll_transmit(&mut self) -> Option<Transmit<'_>> {
        self.tx.poll()
    }

    /// The last transmission was sent: command buffers it read are free to
    /// complete. A completion held for its data goes to the queue; its CID
    /// is freed when it is taken ([`HostQueue::poll_completion`]), once.
    pub fn on_transmitted(&mut self) {
        let (commands, completions) = (&mut self.commands, &mut self.completions);
        self.tx.finish(|slot| {
            let entry = &mut commands[usize::from(slot.0)];
            entry.sending -= 1;
            if entry.sending == 0 {
                if let Some(completion) = entry.parked.take() {
                    completions.push_back(completion);
                }
            }
        });
    }

    /// The next finished command. Its CID (and buffer) is reused only after
    /// this call, so a read's data stays in place until its completion is taken.
    pub fn poll_completion(&mut self) -> Option<HostCompletion> {
        let completion = self.completions.pop_front()?;
        self.commands[usize::from(completion.cid.0)].active = false;
        self.free.push(completion.cid.0);
        Some(completion)
    }

    /// Feeds bytes received from the controller.
    pub fn handle_input(&mut self, mut input: &[u8], buffers: &mut impl SlotBuffers) {
        while !input.is_empty() && !matches!(self.state, State::Failed(_)) {
            let (consumed, step) = self.rx.advance(input, buffers);
            input = &input[consumed..];
            if let Err(error) = self.on_step(step, buffers) {
                self.fail(error);
            }
        }
    }

    fn fail(&mut self, violation: Violation) {
        let mut out = [0u8; 24 + pdu::TERM_REQ_MAX_DATA];
        let len = pdu::encode_c2h_term_req(violation.pdu_error(), self.rx.header(), &mut out);
        out[0] = PduType::H2cTermReq as u8;
        self.tx.push_bytes(&out[..len]);
        self.state = State::Failed(HostError::Protocol(violation));
    }

    fn on_step(&mut self, step: Step, buffers: &mut impl SlotBuffers) -> Result<(), Violation> {
        match step {
            Step::NeedMore => Ok(()),
            Step::CommonHeader(common) => {
                let kind = self.check_common(&common)?;
                self.rx.expect_header(kind);
                Ok(())
            }
            Step::Header => {
                let buffer_bytes = self.config.buffer_bytes as usize;
                let (kind, common, data) = self.rx.parse_header(|_| buffer_bytes)?;
                let expects_data = self.on_header(kind, &common, data, buffers)?;
                if !expects_data && !matches!(self.state, State::Failed(_)) {
                    self.rx.reset();
                }
                Ok(())
            }
            Step::Data { target, intact } => {
                self.rx.reset();
                self.on_data(target, intact);
                Ok(())
            }
        }
    }

    fn check_common(&self, common: &CommonHeader) -> Result<PduType, Violation> {
        let kind =
            PduType::from_u8(common.pdu_type).ok_or(PduError::field(field_offset::PDU_TYPE))?;
        let expected = match self.state {
            State::AwaitIcResp => matches!(kind, PduType::IcResp | PduType::C2hTermReq),
            _ => matches!(
                kind,
                PduType::CapsuleResp | PduType::C2hData | PduType::R2t | PduType::C2hTermReq
            ),
        };
        if !expected {
            return Err(PduError::status(pdu::FatalErrorStatus::PduSequenceError).into());
        }
        self.rx.check_common(common, kind)?;
        if kind == PduType::IcResp && common.plen != 128 {
            return Err(PduError::field(field_offset::PLEN).into());
        }
        // Data after them would be read as the next PDU's header.
        if matches!(kind, PduType::CapsuleResp | PduType::R2t) {
            let expected = (kind.header_len() + self.rx.header_digest_len(kind)) as u32;
            if common.plen != expected {
                return Err(Violation::NotHeaderOnly {
                    pdu: kind,
                    plen: common.plen,
                    expected,
                });
            }
        }
        Ok(kind)
    }

    /// Handles a complete header; true if data follows into a command buffer.
    fn on_header(
        &mut self,
        kind: PduType,
        common: &CommonHeader,
        data: framing::DataLayout,
        buffers: &mut impl SlotBuffers,
    ) -> Result<bool, Violation> {
        match kind {
            PduType::IcResp => self.on_icresp().map(|_| false),
            PduType::C2hTermReq => {
                let status = u16::from_le_bytes([self.rx.header()[8], self.rx.header()[9]]);
                self.state = State::Failed(HostError::Terminated { status });
                Ok(false)
            }
            PduType::CapsuleResp => self.on_capsule_resp().map(|_| false),
            PduType::R2t => self.on_r2t(buffers).map(|_| false),
            PduType::C2hData => self.on_c2h_data(common, data),
            _ => unreachable!("rejected by check_common"),
        }
    }

    fn on_icresp(&mut self) -> Result<(), Violation> {
        let response = IcResp::decode(self.rx.header())?;
        if response.pfv != 0 {
            return Err(PduError::field(8).into());
        }
        if response.cpda > 31 {
            return Err(Violation::Cpda(response.cpda));
        }
        // MAXH2CDATA "is a multiple of dwords and should be no less than
        // 4,096" (NVMe/TCP 1.0, Figure 21): H2CData PDUs are cut to it.
        if response.maxh2cdata < 4096 || !response.maxh2cdata.is_multiple_of(4) {
            return Err(Violation::MaxH2cData(response.maxh2cdata));
        }
        let asked = digest_bits::of(self.config.header_digest, self.config.data_digest);
        let granted = response.digest & (digest_bits::HEADER | digest_bits::DATA);
        if granted != asked {
            self.state = State::Failed(HostError::DigestRefused { asked, granted });
            return Ok(());
        }
        self.rx.header_digest = granted & digest_bits::HEADER != 0;
        self.rx.data_digest = granted & digest_bits::DATA != 0;
        self.maxh2cdata = response.maxh2cdata;
        self.h2c_pdo_alignment = (usize::from(response.cpda) + 1) * 4;
        self.state = State::Ready;
        Ok(())
    }

    fn active(&self, cid: u16, pdu: PduType) -> Result<&Outstanding, Violation> {
        self.commands
            .get(usize::from(cid))
            .filter(|entry| entry.active && !entry.completed)
            .ok_or(Violation::UnknownCommand { pdu, cid })
    }

    fn on_capsule_resp(&mut self) -> Result<(), Violation> {
        let header = self.rx.header();
        let cqe = &header[COMMON_HEADER_LEN..COMMON_HEADER_LEN + 16];
        let mut result_bytes = [0u8; 8];
        result_bytes.copy_from_slice(&cqe[..8]);
        let cid = u16::from_le_bytes([cqe[12], cqe[13]]);
        let mut status = Status::from_cqe_status(u16::from_le_bytes([cqe[14], cqe[15]]));
        let entry = *self.active(cid, PduType::CapsuleResp)?;
        if entry.data_error && status.is_success() {
            status = Status::DATA_TRANSFER_ERROR;
        }
        self.finish(
            cid,
            HostCompletion {
                cid: Cid(cid),
                status,
                result: u64::from_le_bytes(result_bytes),
                received_bytes: entry.received,
            },
        );
        Ok(())
    }

    /// A command is done; its completion is handed out once its buffer is no longer being sent.
    fn finish(&mut self, cid: u16, completion: HostCompletion) {
        let entry = &mut self.commands[usize::from(cid)];
        entry.completed = true;
        if entry.sending > 0 {
            entry.parked = Some(completion);
        } else {
            self.completions.push_back(completion);
        }
    }

    fn on_r2t(&mut self, buffers: &mut impl SlotBuffers) -> Result<(), Violation> {
        let r2t = DataHeader::decode(self.rx.header())?;
        let cid = r2t.cccid;
        let entry = *self.active(cid, PduType::R2t)?;
        let wrong = |transfer| Violation::WrongTransfer {
            pdu: PduType::R2t,
            cid,
            transfer,
        };
        let len = match entry.transfer {
            DataTransfer::ToController(_) if entry.in_capsule => {
                return Err(wrong("went in the command capsule"))
            }
            DataTransfer::ToController(len) => len,
            DataTransfer::FromController(_) => return Err(wrong("goes to the host")),
            DataTransfer::None => return Err(wrong("does not exist")),
        };
        // R2TO + R2TL in u64: both come from the target. The data sent is
        // the command's buffer up to its transfer length, nothing beyond.
        let end = u64::from(r2t.offset) + u64::from(r2t.length);
        if r2t.length == 0 || end > u64::from(len) {
            return Err(Violation::OutOfRange {
                pdu: PduType::R2t,
                cid,
                offset: r2t.offset,
                end,
                transfer_bytes: len,
            });
        }
        let mut offset = r2t.offset;
        while offset < end as u32 {
            let chunk = (end as u32 - offset).min(self.maxh2cdata);
            let last = offset + chunk == end as u32;
            let header = DataHeader {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                offset,
                length: chunk,
            };
            let mut out = [0u8; MAX_HEADER_LEN];
            let pdu_flags = if last { flags::LAST_PDU } else { 0 };
            let pdo = pdu::encode_data_pdu(
                PduType::H2cData,
                pdu_flags,
                self.rx.header_digest,
                self.rx.data_digest,
                self.h2c_pdo_alignment,
                header,
                &mut out,
            );
            self.tx.push_bytes(&out[..pdo]);
            self.send_slot_data(SlotId(r2t.cccid), offset as usize, chunk as usize, buffers);
            offset += chunk;
        }
        Ok(())
    }

    fn on_c2h_data(
        &mut self,
        common: &CommonHeader,
        data: framing::DataLayout,
    ) -> Result<bool, Violation> {
        let header = DataHeader::decode(self.rx.header())?;
        let cid = header.cccid;
        let entry = *self.active(cid, PduType::C2hData)?;
        let len = match entry.transfer {
            DataTransfer::FromController(len) => len,
            DataTransfer::ToController(_) => {
                return Err(Violation::WrongTransfer {
                    pdu: PduType::C2hData,
                    cid,
                    transfer: "goes to the controller",
                })
            }
            DataTransfer::None => {
                return Err(Violation::WrongTransfer {
                    pdu: PduType::C2hData,
                    cid,
                    transfer: "does not exist",
                })
            }
        };
        if header.length as usize != data.len || data.len == 0 {
            return Err(Violation::DataLength {
                cid,
                datal: header.length,
                carried: data.len,
            });
        }
        // DATAO + DATAL in u64: both come from the target. The data lands in
        // the command's buffer, which holds its transfer length and no more.
        let end = u64::from(header.offset) + u64::from(header.length);
        if end > u64::from(len) {
            return Err(Violation::OutOfRange {
                pdu: PduType::C2hData,
                cid,
                offset: header.offset,
                end,
                transfer_bytes: len,
            });
        }
        if header.offset != entry.received {
            return Err(Violation::OutOfOrder {
                cid,
                offset: header.offset,
                received: entry.received,
            });
        }
        let success = common.flags & flags::SUCCESS != 0;
        if success && (common.flags & flags::LAST_PDU == 0 || end != u64::from(len)) {
            return Err(Violation::EarlySuccess { cid });
        }
        let target = DataTarget {
            slot: SlotId(header.cccid),
            buffer_offset: header.offset as usize,
            len: data.len,
            digest: data.digest,
            tag: success,
        };
        self.rx.expect_data(data.padding, target);
        Ok(true)
    }

    fn on_data(&mut self, target: DataTarget, intact: bool) {
        let cid = target.slot.0;
        let entry = &mut self.commands[usize::from(cid)];
        entry.received += target.len as u32;
        if !intact {
            entry.data_error = true;
        }
        // The tag marks a C2HData with the SUCCESS flag: no CapsuleResp follows.
        if target.tag {
            let status = if entry.data_error {
                Status::DATA_TRANSFER_ERROR
            } else {
                Status::SUCCESS
            };
            let received_bytes = entry.received;
            self.finish(
                cid,
                HostCompletion {
                    cid: Cid(cid),
                    status,
                    result: 0,
                    received_bytes,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{admin_opcode, io_opcode};
    use crate::testing::{self, test_target, Pair, VecBuffers, TEST_NQN};
    use crate::{wire, Limits};

    /// A host queue wired to a target connection in memory.
    struct Link {
        host: HostQueue,
        host_buffers: VecBuffers,
        target: Pair,
    }

    impl Link {
        fn new(target: &std::sync::Arc<crate::Target>, digests: bool) -> Link {
            let config = HostConfig {
                header_digest: digests,
                data_digest: digests,
                queue_entries: 32,
                in_capsule_bytes_max: 8192,
                buffer_bytes: 128 * 1024,
            };
            let mut link = Link {
                host: HostQueue::new(config),
                host_buffers: VecBuffers::new(&Limits::DEFAULT),
                target: Pair::new(target),
            };
            link.pump();
            assert!(link.host.is_ready());
            link
        }

        /// Moves bytes both ways until both sides are idle.
        fn pump(&mut self) {
            loop {
                let mut moved = false;
                if let Some(transmit) = self.host.poll_transmit() {
                    let mut bytes = Vec::new();
                    let (inline, segments) = (transmit.bytes.to_vec(), transmit.segments.to_vec());
                    for segment in segments {
                        match segment {
                            crate::TxSegment::Bytes(range) => {
                                bytes.extend_from_slice(&inline[range])
                            }
                            crate::TxSegment::Slot(slot, range) => {
                                bytes.extend_from_slice(&self.host_buffers.buffer(slot)[range])
                            }
                        }
                    }
                    self.host.on_transmitted();
                    self.target.send(&bytes);
                    moved = true;
                }
                if !self.target.sent.is_empty() {
                    let bytes = std::mem::take(&mut self.target.sent);
                    self.host.handle_input(&bytes, &mut self.host_buffers);
                    moved = true;
                }
                if !moved {
                    return;
                }
            }
        }

        fn run(&mut self, sqe: [u8; 64], transfer: DataTransfer) -> HostCompletion {
            let cid = self
                .host
                .submit(sqe, transfer, &mut self.host_buffers)
                .unwrap();
            self.pump();
            let completion = self.host.poll_completion().expect("a completion");
            assert_eq!(completion.cid, cid);
            completion
        }

        fn connect(&mut self, qid: u16, cntlid: u16) -> HostCompletion {
            let (sqe, data) = testing::connect_command(0, qid, 31, 5000, cntlid, TEST_NQN);
            let cid = self.host.next_cid().unwrap();
            self.host_buffers.buffer(SlotId(cid.0))[..1024].copy_from_slice(&data);
            self.run(sqe, DataTransfer::ToController(1024))
        }
    }

    #[test]
    fn host_and_target_cores_talk_in_memory() {
        for digests in [false, true] {
            let target = test_target();
            let mut admin = Link::new(&target, digests);
            let connected = admin.connect(0, 0xFFFF);
            assert_eq!(connected.status, Status::SUCCESS);
            let cntlid = connected.result as u16;
            assert_eq!(
                admin
                    .run(
                        testing::property_set(0, 0x14, (6 << 16) | (4 << 20) | 1),
                        DataTransfer::None
                    )
                    .status,
                Status::SUCCESS
            );
            let identify = admin.run(
                testing::identify(0, 1, 0),
                DataTransfer::FromController(4096),
            );
            assert_eq!(identify.status, Status::SUCCESS);
            assert_eq!(
                &admin.host_buffers.buffer(SlotId(identify.cid.0))[24..28],
                b"weft"
            );
            let mut queues = testing::sqe(admin_opcode::SET_FEATURES, 0, 0, 0, false);
            testing::set_cdw(&mut queues, 10, 0x07);
            assert_eq!(
                admin.run(queues, DataTransfer::None).status,
                Status::SUCCESS
            );

            let mut io = Link::new(&target, digests);
            assert_eq!(io.connect(1, cntlid).status, Status::SUCCESS);
            // 4 KiB in the capsule, then 64 KiB by R2T (the target's MAXH2CDATA is 128 KiB).
            for (slba, len) in [(0u64, 4096u32), (8, 65536)] {
                let pattern: Vec<u8> = (0..len).map(|i| (i as u64 * 31 + slba) as u8).collect();
                let cid = io.host.next_cid().unwrap();
                io.host_buffers.buffer(SlotId(cid.0))[..len as usize].copy_from_slice(&pattern);
                let write = testing::rw(io_opcode::WRITE, 0, 2, slba, len / 4096, len, false);
                assert_eq!(
                    io.run(write, DataTransfer::ToController(len)).status,
                    Status::SUCCESS
                );
                let read = testing::rw(io_opcode::READ, 0, 2, slba, len / 4096, len, false);
                let done = io.run(read, DataTransfer::FromController(len));
                assert_eq!(done.status, Status::SUCCESS);
                assert_eq!(
                    &io.host_buffers.buffer(SlotId(done.cid.0))[..len as usize],
                    &pattern[..]
                );
            }
            let beyond = testing::rw(io_opcode::READ, 0, 2, 10_000, 1, 4096, false);
            assert_eq!(
                io.run(beyond, DataTransfer::FromController(4096)).status,
                Status::LBA_OUT_OF_RANGE
            );
        }
    }

    #[test]
    fn many_commands_in_flight_complete_each_once() {
        let target = test_target();
        let mut admin = Link::new(&target, false);
        let cntlid = admin.connect(0, 0xFFFF).result as u16;
        admin.run(
            testing::property_set(0, 0x14, (6 << 16) | (4 << 20) | 1),
            DataTransfer::None,
        );
        let mut queues = testing::sqe(admin_opcode::SET_FEATURES, 0, 0, 0, false);
        testing::set_cdw(&mut queues, 10, 0x07);
        admin.run(queues, DataTransfer::None);
        let mut io = Link::new(&target, false);
        io.connect(1, cntlid);
        let mut submitted = Vec::new();
        while let Ok(cid) = io.host.submit(
            testing::rw(io_opcode::READ, 0, 1, 0, 8, 4096, false),
            DataTransfer::FromController(4096),
            &mut io.host_buffers,
        ) {
            submitted.push(cid);
        }
        assert_eq!(submitted.len(), 32);
        assert_eq!(
            io.host.submit(
                testing::rw(io_opcode::READ, 0, 1, 0, 8, 4096, false),
                DataTransfer::FromController(4096),
                &mut io.host_buffers
            ),
            Err(SubmitError::QueueFull)
        );
        io.pump();
        let mut completed: Vec<Cid> = std::iter::from_fn(|| io.host.poll_completion())
            .map(|c| c.cid)
            .collect();
        completed.sort_by_key(|cid| cid.0);
        submitted.sort_by_key(|cid| cid.0);
        assert_eq!(completed, submitted);
        assert_eq!(io.host.outstanding(), 0);
    }

    /// A host queue past ICResp (MAXH2CDATA 4 KiB), with nothing to send.
    fn ready_host(in_capsule_bytes_max: u32, buffer_bytes: u32) -> (HostQueue, VecBuffers) {
        let mut host = HostQueue::new(HostConfig {
            header_digest: false,
            data_digest: false,
            queue_entries: 4,
            in_capsule_bytes_max,
            buffer_bytes,
        });
        let mut buffers = VecBuffers::new(&Limits::DEFAULT);
        sent(&mut host);
        let mut icresp = wire::hex("01 00 80 00 80000000 0000 00 00 00100000");
        icresp.resize(128, 0);
        host.handle_input(&icresp, &mut buffers);
        assert!(host.is_ready());
        (host, buffers)
    }

    /// The inline bytes the host queued (its slot data left out).
    fn sent(host: &mut HostQueue) -> Vec<u8> {
        let mut bytes = Vec::new();
        while let Some(transmit) = host.poll_transmit() {
            for segment in transmit.segments {
                if let crate::TxSegment::Bytes(range) = segment {
                    bytes.extend_from_slice(&transmit.bytes[range.clone()]);
                }
            }
            host.on_transmitted();
        }
        bytes
    }

    /// Feeds `pdu` (hex) and returns the violation and the H2CTermReq's FES and FEI.
    fn refused(host: &mut HostQueue, buffers: &mut VecBuffers, pdu: &str) -> (String, u16, u32) {
        host.handle_input(&wire::hex(pdu), buffers);
        let Some(HostError::Protocol(violation)) = host.error() else {
            panic!("accepted: {pdu}");
        };
        let term = sent(host);
        assert_eq!(term[0], PduType::H2cTermReq as u8);
        let fes = u16::from_le_bytes([term[8], term[9]]);
        let fei = u32::from_le_bytes([term[10], term[11], term[12], term[13]]);
        (violation.to_string(), fes, fei)
    }

    fn submit(host: &mut HostQueue, buffers: &mut VecBuffers, transfer: DataTransfer) -> u16 {
        let read = testing::rw(io_opcode::READ, 0, 1, 0, 8, 0, false);
        let cid = host.submit(read, transfer, buffers).expect("submitted");
        sent(host);
        cid.0
    }

    #[test]
    fn c2h_data_beyond_the_command_buffer_is_refused_with_its_range() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        let cid = submit(&mut host, &mut buffers, DataTransfer::FromController(4096));
        assert_eq!(cid, 0, "the first free CID");
        // C2HData LAST_PDU, CCCID 0, DATAO 0, DATAL 8192 (PLEN 24 + 8192): more than asked for.
        let (violation, fes, fei) = refused(
            &mut host,
            &mut buffers,
            "07 04 18 18 18200000 0000 0000 00000000 00200000 00000000",
        );
        assert_eq!(
            violation,
            "C2HData for command 0 covers bytes 0..8192 of its 4096-byte transfer"
        );
        assert_eq!((fes, fei), (0x04, 0));

        // DATAO FFFFF000h + DATAL 4096 ends at 2^32: no wrap to offset 0.
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::FromController(4096));
        let (violation, ..) = refused(
            &mut host,
            &mut buffers,
            "07 04 18 18 18100000 0000 0000 00f0ffff 00100000 00000000",
        );
        assert!(
            violation.ends_with("bytes 4294963200..4294967296 of its 4096-byte transfer"),
            "{violation}"
        );
    }

    #[test]
    fn c2h_data_without_data_or_out_of_order_is_refused() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::FromController(4096));
        // DATAL 0, PLEN 24: no data at all.
        let (violation, _, fei) = refused(
            &mut host,
            &mut buffers,
            "07 04 18 00 18000000 0000 0000 00000000 00000000 00000000",
        );
        assert_eq!(
            violation,
            "C2HData for command 0 says DATAL 0 and carries 0 bytes"
        );
        assert_eq!(fei, 16);
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::FromController(4096));
        // DATAO 512 before anything arrived (4 bytes of data).
        let (violation, ..) = refused(
            &mut host,
            &mut buffers,
            "07 00 18 18 1c000000 0000 0000 00020000 04000000 00000000 a5a5a5a5",
        );
        assert_eq!(
            violation,
            "C2HData for command 0 starts at byte 512, but 0 bytes had arrived"
        );
    }

    /// A completion that comes while the command's data is still queued to
    /// go (a controller that answers after its R2T without waiting for the
    /// data) frees its CID once, when it is taken: not also when the data
    /// went out, which put the CID on the free list twice and gave it to
    /// two commands at once.
    #[test]
    fn a_completion_before_its_data_went_out_frees_its_cid_once() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        let cid = submit(&mut host, &mut buffers, DataTransfer::ToController(4096));
        // R2T CCCID 0, TTAG 1, R2TO 0, R2TL 4096: the host queues its H2CData...
        let r2t = "09 00 18 00 18000000 0000 0100 00000000 00100000 00000000";
        host.handle_input(&wire::hex(r2t), &mut buffers);
        let queued = host.poll_transmit().is_some();
        assert!(queued, "the H2CData is queued");
        // ...and before it went out, the controller answers (CapsuleResp, CID 0).
        let resp = "05 00 18 00 18000000 00000000 00000000 0000 0000 0000 0000";
        host.handle_input(&wire::hex(resp), &mut buffers);
        assert!(host.poll_completion().is_none(), "held until the data went");
        host.on_transmitted();
        assert_eq!(host.poll_completion().map(|c| c.cid.0), Some(cid));
        let mut cids: Vec<u16> = (0..4)
            .map(|_| submit(&mut host, &mut buffers, DataTransfer::None))
            .collect();
        cids.sort_unstable();
        cids.dedup();
        assert_eq!(cids.len(), 4, "four commands, four CIDs");
        let fifth = testing::rw(io_opcode::READ, 0, 1, 0, 8, 0, false);
        let full = host.submit(fifth, DataTransfer::None, &mut buffers);
        assert_eq!(full, Err(SubmitError::QueueFull));
    }

    #[test]
    fn r2t_beyond_the_transfer_is_refused_with_its_range() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        let cid = submit(&mut host, &mut buffers, DataTransfer::ToController(8192));
        assert_eq!(cid, 0, "the first free CID");
        // R2T CCCID 0, TTAG 1, R2TO 4096, R2TL 8192: past the 8 KiB the command writes.
        let (violation, fes, _) = refused(
            &mut host,
            &mut buffers,
            "09 00 18 00 18000000 0000 0100 00100000 00200000 00000000",
        );
        assert_eq!(
            violation,
            "R2T for command 0 covers bytes 4096..12288 of its 8192-byte transfer"
        );
        assert_eq!(fes, 0x04);
        // R2TO FFFFFFFFh, R2TL 1: ends at 2^32, not at 0.
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::ToController(8192));
        let (violation, ..) = refused(
            &mut host,
            &mut buffers,
            "09 00 18 00 18000000 0000 0100 ffffffff 01000000 00000000",
        );
        assert!(violation.contains("4294967295..4294967296"), "{violation}");
    }

    /// Data that went in the capsule is not sent again because an R2T asks.
    #[test]
    fn r2t_for_in_capsule_data_is_refused() {
        let (mut host, mut buffers) = ready_host(8192, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::ToController(4096));
        let (violation, _, fei) = refused(
            &mut host,
            &mut buffers,
            "09 00 18 00 18000000 0000 0100 00000000 00100000 00000000",
        );
        assert_eq!(
            violation,
            "R2T for command 0, whose data went in the command capsule"
        );
        assert_eq!(fei, 8);
    }

    /// An R2T with data after its header (PLEN 32) would desynchronize the
    /// stream: the data would be read as the next PDU's header.
    #[test]
    fn r2t_and_capsule_resp_carry_no_data() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        submit(&mut host, &mut buffers, DataTransfer::ToController(8192));
        let (violation, fes, fei) = refused(
            &mut host,
            &mut buffers,
            "09 00 18 18 20000000 0000 0100 00000000 00200000 00000000 0000000000000000",
        );
        assert_eq!(
            violation,
            "R2T with PLEN 32: it carries no data, so its PLEN is 24"
        );
        assert_eq!((fes, fei), (0x01, 4));
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        let (violation, ..) = refused(
            &mut host,
            &mut buffers,
            "05 00 18 00 1c000000 00000000 00000000 0000 0000 0000 0000 00000000",
        );
        assert_eq!(
            violation,
            "CapsuleResp with PLEN 28: it carries no data, so its PLEN is 24"
        );
    }

    /// A completion says how much data came with it: a read answered
    /// before all its data carries the shorter count.
    #[test]
    fn a_completion_counts_the_data_that_came() {
        let (mut host, mut buffers) = ready_host(0, 16 * 1024);
        let cid = submit(&mut host, &mut buffers, DataTransfer::FromController(8));
        // 4 of the 8 bytes (C2HData, not last), then a successful CapsuleResp.
        host.handle_input(
            &wire::hex("07 00 18 18 1c000000 0000 0000 00000000 04000000 00000000 a5a5a5a5"),
            &mut buffers,
        );
        host.handle_input(
            &wire::hex("05 00 18 00 18000000 00000000 00000000 0000 0000 0000 0000"),
            &mut buffers,
        );
        let completion = host.poll_completion().expect("completed");
        assert_eq!((completion.cid.0, completion.received_bytes), (cid, 4));
        assert!(completion.status.is_success());
    }

    /// A CPDA of 16 (68-byte alignment) pads the 72-byte CapsuleCmd header
    /// to 136 bytes, past the longest header: found by the `host` fuzz
    /// target, it overran the header buffer. Every CPDA, with and without
    /// a header digest, puts the data at the next multiple of the alignment.
    #[test]
    fn in_capsule_data_is_aligned_for_every_cpda() {
        for (cpda, header_digest) in (0..=31u8).flat_map(|cpda| [(cpda, false), (cpda, true)]) {
            let mut host = HostQueue::new(HostConfig {
                header_digest,
                data_digest: false,
                queue_entries: 4,
                in_capsule_bytes_max: 4096,
                buffer_bytes: 4096,
            });
            let mut buffers = VecBuffers::new(&Limits::DEFAULT);
            sent(&mut host);
            let digest = if header_digest { "01" } else { "00" };
            let mut icresp = wire::hex(&format!(
                "01 00 80 00 80000000 0000 {cpda:02x} {digest} 00100000"
            ));
            icresp.resize(128, 0);
            host.handle_input(&icresp, &mut buffers);
            assert!(host.is_ready(), "CPDA {cpda}");
            let write = testing::rw(io_opcode::WRITE, 0, 1, 0, 1, 0, false);
            host.submit(write, DataTransfer::ToController(512), &mut buffers)
                .expect("submitted");
            let transmit = host.poll_transmit().expect("the capsule");
            let header = transmit.bytes;
            let (pdo, plen) = (
                usize::from(header[3]),
                u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize,
            );
            let alignment = (usize::from(cpda) + 1) * 4;
            let header_end: usize = 72 + if header_digest { 4 } else { 0 };
            assert_eq!(
                pdo,
                header_end.div_ceil(alignment) * alignment,
                "CPDA {cpda}"
            );
            assert_eq!(plen, pdo + 512);
            assert_eq!(
                header.len(),
                pdo,
                "header, digest and padding are sent inline"
            );
        }
    }

    #[test]
    fn icresp_maxh2cdata_must_be_whole_dwords_of_at_least_4_kib() {
        for (maxh2cdata, hex) in [(4098, "02100000"), (2048, "00080000")] {
            let mut host = HostQueue::new(HostConfig {
                header_digest: false,
                data_digest: false,
                queue_entries: 4,
                in_capsule_bytes_max: 0,
                buffer_bytes: 4096,
            });
            let mut buffers = VecBuffers::new(&Limits::DEFAULT);
            sent(&mut host);
            let mut icresp = wire::hex(&format!("01 00 80 00 80000000 0000 00 00 {hex}"));
            icresp.resize(128, 0);
            host.handle_input(&icresp, &mut buffers);
            assert_eq!(
                host.error(),
                Some(HostError::Protocol(Violation::MaxH2cData(maxh2cdata)))
            );
            assert_eq!(
                host.error().unwrap().to_string(),
                format!("the target broke the protocol: ICResp MAXH2CDATA is {maxh2cdata}; it must be a multiple of 4 and at least 4096")
            );
        }
    }

    #[test]
    fn a_target_termination_is_reported() {
        let mut host = HostQueue::new(HostConfig {
            header_digest: false,
            data_digest: false,
            queue_entries: 4,
            in_capsule_bytes_max: 8192,
            buffer_bytes: 4096,
        });
        let mut buffers = VecBuffers::new(&Limits::DEFAULT);
        let mut term = [0u8; 152];
        let len = pdu::encode_c2h_term_req(
            PduError::status(pdu::FatalErrorStatus::PduSequenceError),
            &[],
            &mut term,
        );
        host.handle_input(&term[..len], &mut buffers);
        assert_eq!(host.error(), Some(HostError::Terminated { status: 2 }));
        let mut garbage = HostQueue::new(HostConfig {
            header_digest: false,
            data_digest: false,
            queue_entries: 4,
            in_capsule_bytes_max: 8192,
            buffer_bytes: 4096,
        });
        garbage.handle_input(&[0x05, 0, 24, 0, 24, 0, 0, 0], &mut buffers);
        assert!(
            matches!(garbage.error(), Some(HostError::Protocol(_))),
            "a CapsuleResp before ICResp"
        );
    }
}
