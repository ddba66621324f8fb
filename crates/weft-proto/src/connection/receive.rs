//! Receiving: the PDUs a host sends, framed and checked (ICReq, command
//! capsules, H2CData), and the commands they carry handed to execution.

use super::*;

impl Connection {
    pub(super) fn on_step(
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
    pub(super) fn check_common(&self, common: &CommonHeader) -> Result<PduType, PduError> {
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

    pub(super) fn in_capsule_limit(&self) -> usize {
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

    pub(super) fn dispatch(
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

    pub(super) fn handle_icreq(&mut self) -> Result<(), PduError> {
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

    pub(super) fn handle_capsule(
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

    pub(super) fn handle_h2c_data(&mut self, data: DataLayout) -> Result<(), PduError> {
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
    pub(super) fn data_received(
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

    pub(super) fn handle_data(
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
}
