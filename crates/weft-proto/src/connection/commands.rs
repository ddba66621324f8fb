//! Commands: a command's data transfer planned (in capsule or by R2T),
//! its execution (admin, Fabrics, I/O through the driver), and its completion
//! and data sent back; the command slots they use.

use super::*;

impl Connection {
    pub(super) fn advance_sqhd(&mut self) {
        if let State::Admin(queue, _) | State::Io(queue, _) = &mut self.state {
            // SQHD is below the queue's entries, a u16: the increment fits.
            queue.sqhd = (queue.sqhd + 1) % queue.entries;
        }
    }

    /// A command capsule is complete (with its in-capsule data, if any).
    pub(super) fn command_received(
        &mut self,
        slot: SlotId,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) -> Result<(), PduError> {
        let command = self.slots[usize::from(slot.0)].command;
        if matches!(self.state, State::AwaitConnect)
            && !(command.is_fabrics() && command.fctype() == fctype::CONNECT)
        {
            return Err(PduError::status(FatalErrorStatus::PduSequenceError));
        }
        self.advance_sqhd();
        match self.prepare(slot) {
            Err(status) => self.complete(slot, status, 0, 0, buffers),
            Ok(Transfer::Ready) => self.execute(slot, now, buffers),
            Ok(Transfer::NeedData(len)) => self.request_data(slot, len),
        }
        Ok(())
    }

    /// Checks a command's data transfer and, on I/O queues, the command itself,
    /// before any data moves.
    pub(super) fn prepare(&mut self, slot: SlotId) -> Result<Transfer, Status> {
        let entry = &self.slots[usize::from(slot.0)];
        let command = entry.command;
        if command.psdt() == 0 || command.fuse() != 0 {
            return Err(Status::INVALID_FIELD);
        }
        if command.sgl.length as usize > self.limits.slot_buffer_bytes() {
            return Err(Status::SGL_LENGTH_INVALID);
        }
        if let State::Admin(queue, _) | State::Io(queue, _) = &self.state {
            // Only Fabrics commands until the queue authenticated (NVMe Base
            // 2.0, section 8.13.1; nvmet answers the same).
            if !command.is_fabrics() && !queue.authenticated() {
                return Err(Status::AUTH_REQUIRED);
            }
        }
        let transfer = transfer_of(&command, entry.in_capsule_len)?;
        if let State::Io(queue, io) = &self.state {
            if !command.is_fabrics() {
                let subsystem = &self.config.subsystems[io.subsystem];
                let plan =
                    IoPlan::from_command(&command, subsystem, self.limits.transfer_bytes_max)?;
                // Only the fence holder's I/O runs (see crate::fence): refused
                // here at once, and checked again when it reaches the media.
                if subsystem.fenced && !queue.controller.holds_fence() {
                    return Err(Status::RESERVATION_CONFLICT);
                }
                self.slots[usize::from(slot.0)].io_plan = Some(plan);
            }
        }
        Ok(transfer)
    }

    /// Sends an R2T for the whole transfer: one outstanding R2T per command, within any MAXR2T.
    pub(super) fn request_data(&mut self, slot: SlotId, len: u32) {
        let entry = &mut self.slots[usize::from(slot.0)];
        entry.state = SlotState::AwaitingH2cData;
        let r2t = DataHeader {
            cccid: entry.command.cid.0,
            ttag: slot.0,
            offset: 0,
            length: len,
        };
        let mut out = [0u8; 28];
        let header_len = pdu::encode_r2t(self.rx.header_digest, r2t, &mut out);
        self.tx.push_bytes(&out[..header_len]);
    }

    pub(super) fn execute(&mut self, slot: SlotId, now: Timestamp, buffers: &mut impl SlotBuffers) {
        let command = self.slots[usize::from(slot.0)].command;
        let connected = matches!(self.state, State::Admin(..) | State::Io(..));
        if connected
            && command.is_fabrics()
            && matches!(command.fctype(), fctype::AUTH_SEND | fctype::AUTH_RECEIVE)
        {
            let outcome = self.authentication_command(&command, buffers.buffer(slot));
            self.finish(slot, outcome, buffers);
            return;
        }
        match &mut self.state {
            State::AwaitConnect => {
                let outcome = self.connect(&command, buffers.buffer(slot), now);
                self.finish(slot, outcome, buffers);
            }
            State::Admin(..) if is_fence_command(&command) => self.fence(slot, &command, now),
            State::Admin(_, admin) => {
                let outcome =
                    admin::execute(admin, &self.config, &command, buffers.buffer(slot), now);
                self.finish(slot, outcome, buffers);
            }
            State::Io(..) if command.is_fabrics() => {
                let outcome = match command.fctype() {
                    fctype::DISCONNECT => {
                        self.complete(slot, Status::SUCCESS, 0, 0, buffers);
                        self.end(Termination::Disconnected);
                        return;
                    }
                    fctype::CONNECT => Outcome::Complete {
                        status: Status::COMMAND_SEQUENCE_ERROR,
                        result: 0,
                        reply_len: 0,
                    },
                    _ => Outcome::Complete {
                        status: Status::INVALID_OPCODE,
                        result: 0,
                        reply_len: 0,
                    },
                };
                self.finish(slot, outcome, buffers);
            }
            State::Io(..) => self.start_io(slot, now, buffers),
            State::AwaitIcReq | State::Closing => {
                unreachable!("commands are only received on initialized queues")
            }
        }
    }

    pub(super) fn finish(
        &mut self,
        slot: SlotId,
        outcome: Outcome,
        buffers: &mut impl SlotBuffers,
    ) {
        match outcome {
            Outcome::Complete {
                status,
                result,
                reply_len,
            } => self.complete(slot, status, result, reply_len, buffers),
            Outcome::DataThenZeroes { filled, len } => {
                let len = len.min(self.slots[usize::from(slot.0)].command.sgl.length);
                if filled < len {
                    buffers.zero(slot, filled as usize..len as usize);
                }
                self.complete(slot, Status::SUCCESS, 0, len, buffers)
            }
            Outcome::Parked => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                if let State::Admin(_, admin) = &mut self.state {
                    admin.parked_events.push(slot);
                }
            }
        }
    }

    pub(super) fn start_io(
        &mut self,
        slot: SlotId,
        now: Timestamp,
        buffers: &mut impl SlotBuffers,
    ) {
        if !self.enter_fence(slot, now) {
            return self.complete(slot, Status::RESERVATION_CONFLICT, 0, 0, buffers);
        }
        let plan = self.slots[usize::from(slot.0)]
            .io_plan
            .expect("I/O commands are planned in prepare");
        match self.reservation_check(plan) {
            Ok(reserved) => self.slots[usize::from(slot.0)].reserved = reserved,
            Err(status) => return self.complete(slot, status, 0, 0, buffers),
        }
        let State::Io(queue, io_queue) = &self.state else {
            unreachable!("start_io on an I/O queue")
        };
        let host = HostIdentifier(queue.controller.host_id);
        let write_cache = queue.controller.write_cache_enabled.load(Ordering::Relaxed);
        let mut push =
            |nsid: Nsid, kind: IoKind| self.io_requests.push_back(IoRequest { slot, nsid, kind });
        let pending = match plan {
            IoPlan::Read { nsid, offset, len } => {
                push(
                    nsid,
                    IoKind::Read {
                        offset,
                        len,
                        buffer_offset: 0,
                    },
                );
                1
            }
            IoPlan::Write {
                nsid,
                offset,
                len,
                fua,
            } => {
                push(
                    nsid,
                    IoKind::Write {
                        offset,
                        len,
                        buffer_offset: 0,
                        fua: fua || !write_cache,
                    },
                );
                1
            }
            IoPlan::Compare { nsid, offset, len } => {
                push(
                    nsid,
                    IoKind::Read {
                        offset,
                        len,
                        buffer_offset: len,
                    },
                );
                1
            }
            IoPlan::Flush { nsid } if nsid == Nsid::BROADCAST => {
                let subsystem = &self.config.subsystems[io_queue.subsystem];
                for ns in &subsystem.namespaces {
                    push(ns.nsid, IoKind::Flush);
                }
                subsystem.namespaces.len()
            }
            IoPlan::Flush { nsid } => {
                push(nsid, IoKind::Flush);
                1
            }
            IoPlan::WriteZeroes {
                nsid,
                offset,
                len,
                deallocate,
                fua,
            } => {
                push(
                    nsid,
                    IoKind::WriteZeroes {
                        offset,
                        len,
                        deallocate,
                        fua,
                    },
                );
                1
            }
            IoPlan::DatasetManagement {
                nsid,
                ranges,
                deallocate,
            } => {
                if !deallocate {
                    // Only attribute hints: nothing to do.
                    0
                } else {
                    let subsystem = &self.config.subsystems[io_queue.subsystem];
                    let ns = subsystem
                        .namespace(nsid)
                        .expect("planned against this subsystem");
                    let data = &buffers.buffer(slot)[..usize::from(ranges) * io::DSM_RANGE_LEN];
                    if let Err(status) = io::dsm_ranges(data, ns, &mut self.dsm_ranges) {
                        self.complete(slot, status, 0, 0, buffers);
                        return;
                    }
                    for &(offset, len) in &self.dsm_ranges {
                        self.io_requests.push_back(IoRequest {
                            slot,
                            nsid,
                            kind: IoKind::Deallocate { offset, len },
                        });
                    }
                    self.dsm_ranges.len()
                }
            }
            // The fence let it in: that is all a grant asks.
            IoPlan::Grant => 0,
            IoPlan::Clean { regions } => {
                let subsystem = &self.config.subsystems[io_queue.subsystem];
                let intent = subsystem
                    .intent
                    .as_ref()
                    .expect("planned: it has an intent");
                let data = &buffers.buffer(slot)[..regions as usize * 4];
                intent.clean(crate::intent::clean_regions(data, regions));
                0
            }
            IoPlan::Snapshot { nsid, name_len } => {
                push(nsid, IoKind::Snapshot { name_len });
                1
            }
            IoPlan::Grow { nsid, size_bytes } => {
                push(nsid, IoKind::Grow { size_bytes });
                1
            }
            IoPlan::Reserve {
                nsid,
                opcode,
                cdw10,
            } => match ReservationCommand::decode(opcode, cdw10, buffers.buffer(slot)) {
                Ok(command) => {
                    push(nsid, IoKind::Reserve { host, command });
                    1
                }
                Err(status) => return self.complete(slot, status, 0, 0, buffers),
            },
            IoPlan::ReservationReport {
                nsid,
                len,
                extended,
            } => {
                let cell = self.config.subsystems[io_queue.subsystem]
                    .namespace(nsid)
                    .and_then(|ns| ns.reservations.as_ref())
                    .expect("planned: the namespace has reservations");
                // All NUMD dwords go to the host, zeroes past the structure.
                let out = &mut buffers.buffer(slot)[..len as usize];
                out.fill(0);
                return match cell.state().1.report(extended, out) {
                    Ok(_) => self.complete(slot, Status::SUCCESS, 0, len, buffers),
                    Err(status) => self.complete(slot, status, 0, 0, buffers),
                };
            }
        };
        if pending == 0 {
            self.complete(slot, Status::SUCCESS, 0, 0, buffers);
            return;
        }
        let entry = &mut self.slots[usize::from(slot.0)];
        entry.state = SlotState::Executing;
        entry.io_pending = pending;
    }

    /// Reservation Conflict if a reservation on the command's namespace
    /// (every namespace, for a Flush of all) keeps this host from it; the
    /// cell that counts it if it is a write counted there.
    pub(super) fn reservation_check(
        &mut self,
        plan: IoPlan,
    ) -> Result<Option<(Arc<ReservationCell>, CountedWrite)>, Status> {
        let Some((nsid, access)) = plan.access() else {
            return Ok(None);
        };
        let State::Io(queue, io_queue) = &self.state else {
            return Ok(None);
        };
        let host = HostIdentifier(queue.controller.host_id);
        let cells = self.config.subsystems[io_queue.subsystem]
            .namespaces
            .iter()
            .filter(|ns| nsid == Nsid::BROADCAST || ns.nsid == nsid)
            .filter_map(|ns| ns.reservations.as_ref());
        let changes_data = matches!(
            plan,
            IoPlan::Write { .. }
                | IoPlan::WriteZeroes { .. }
                | IoPlan::DatasetManagement {
                    deallocate: true,
                    ..
                }
        );
        for cell in cells {
            // The queue's view of the cell (a queue serves one namespace
            // with reservations: a volume's).
            let view = match &mut self.reservation_view {
                Some((viewed, view)) if Arc::ptr_eq(viewed, cell) => view,
                other => &mut other.insert((Arc::clone(cell), None)).1,
            };
            if changes_data {
                // A data command has one namespace.
                return Ok(Some((Arc::clone(cell), cell.enter_write(view, host)?)));
            }
            cell.check(view, host, access)?;
        }
        Ok(None)
    }

    pub(super) fn count_io(&self, plan: IoPlan, status: Status) {
        let State::Io(queue, _) = &self.state else {
            return;
        };
        if !status.is_success() {
            return;
        }
        let counters = &queue.controller.counters;
        match plan {
            IoPlan::Read { len, .. } => {
                counters.read_commands.fetch_add(1, Ordering::Relaxed);
                counters
                    .read_bytes
                    .fetch_add(u64::from(len), Ordering::Relaxed);
            }
            IoPlan::Write { len, .. } => {
                counters.write_commands.fetch_add(1, Ordering::Relaxed);
                counters
                    .written_bytes
                    .fetch_add(u64::from(len), Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Queues the completion (with C2HData first when there is data for the host).
    pub(super) fn complete(
        &mut self,
        slot: SlotId,
        status: Status,
        result: u64,
        reply_len: u32,
        buffers: &mut impl SlotBuffers,
    ) {
        self.fenced_done(slot);
        let sq_flow_disabled = match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => queue.sq_flow_disabled,
            _ => false,
        };
        let entry = &self.slots[usize::from(slot.0)];
        let cid = entry.command.cid;
        let reply_len = reply_len.min(entry.command.sgl.length);
        if !status.is_success() || reply_len == 0 {
            self.respond(slot, status, result);
            return;
        }
        // With SQ flow control disabled the C2HData SUCCESS flag replaces the
        // CapsuleResp (NVMe/TCP 1.0, section 3.6.2.8).
        let last_flags = flags::LAST_PDU | if sq_flow_disabled { flags::SUCCESS } else { 0 };
        self.queue_c2h_data(slot, cid, reply_len, last_flags, buffers);
        // The slot is free again once its data has been sent; the command is
        // complete now (the host may send another once it has the data).
        self.slots[usize::from(slot.0)].state = SlotState::Transmitting;
        self.command_done();
        if !sq_flow_disabled {
            self.push_response(slot, status, result);
        }
    }

    /// Completes a command that sends no data: its CapsuleResp, and the slot is free.
    pub(super) fn respond(&mut self, slot: SlotId, status: Status, result: u64) {
        self.fenced_done(slot);
        self.push_response(slot, status, result);
        self.release(slot);
        self.command_done();
    }

    /// One command of the host's is complete: its completion is queued,
    /// and stops counting against the host once handed out to be sent.
    pub(super) fn command_done(&mut self) {
        debug_assert!(
            self.completions_queued < self.outstanding,
            "a command completed twice"
        );
        self.completions_queued += 1;
    }

    /// Queues the CapsuleResp of the command in `slot`.
    pub(super) fn push_response(&mut self, slot: SlotId, status: Status, result: u64) {
        let (qid, sqhd) = match &self.state {
            State::Admin(queue, _) | State::Io(queue, _) => (queue.qid, queue.sqhd),
            _ => (0, 0),
        };
        let cid = self.slots[usize::from(slot.0)].command.cid;
        let cqe = Completion {
            result,
            sqhd,
            sqid: qid,
            cid,
            status,
        }
        .encode();
        let mut out = [0u8; 28];
        let len = pdu::encode_capsule_resp(self.rx.header_digest, &cqe, &mut out);
        self.tx.push_bytes(&out[..len]);
    }

    pub(super) fn queue_c2h_data(
        &mut self,
        slot: SlotId,
        cid: Cid,
        len: u32,
        pdu_flags: u8,
        buffers: &mut impl SlotBuffers,
    ) {
        let header = DataHeader {
            cccid: cid.0,
            ttag: 0,
            offset: 0,
            length: len,
        };
        let mut out = [0u8; MAX_HEADER_LEN];
        let pdo = pdu::encode_data_pdu(
            PduType::C2hData,
            pdu_flags,
            self.rx.header_digest,
            self.rx.data_digest,
            self.c2h_pdo_alignment,
            header,
            &mut out,
        );
        self.tx.push_bytes(&out[..pdo]);
        self.tx.push_slot(slot, 0..len as usize);
        if self.rx.data_digest {
            let digest = crc32c(&buffers.buffer(slot)[..len as usize]);
            self.tx.push_bytes(&digest.to_le_bytes());
        }
    }

    pub(super) fn release(&mut self, slot: SlotId) {
        release(&mut self.slots, &mut self.free_slots, slot);
    }
}

/// Returns a slot to the free list.
pub(super) fn release(slots: &mut [Slot], free_slots: &mut Vec<u16>, slot: SlotId) {
    let entry = &mut slots[usize::from(slot.0)];
    debug_assert_ne!(entry.state, SlotState::Free, "slot released twice");
    entry.state = SlotState::Free;
    free_slots.push(slot.0);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transfer {
    /// Everything the command needs is here.
    Ready,
    /// The command's data must be requested with an R2T.
    NeedData(u32),
}

/// How a command's data arrives, from its direction and SGL (NVMe/TCP 1.0, section 3.3).
pub(super) fn transfer_of(command: &Command, in_capsule_len: u32) -> Result<Transfer, Status> {
    let sgl = command.sgl;
    match command.direction() {
        DataDirection::HostToController => match sgl.kind {
            SglKind::InCapsule if sgl.address != 0 => Err(Status::SGL_OFFSET_INVALID),
            SglKind::InCapsule if sgl.length != in_capsule_len => Err(Status::SGL_LENGTH_INVALID),
            SglKind::InCapsule => Ok(Transfer::Ready),
            SglKind::Transport if in_capsule_len != 0 => Err(Status::SGL_LENGTH_INVALID),
            SglKind::Transport if sgl.length == 0 => Ok(Transfer::Ready),
            SglKind::Transport => Ok(Transfer::NeedData(sgl.length)),
            SglKind::Unsupported(_) => Err(Status::SGL_TYPE_INVALID),
        },
        DataDirection::None | DataDirection::ControllerToHost => {
            if in_capsule_len != 0 {
                Err(Status::INVALID_FIELD)
            } else if sgl.length > 0 && sgl.kind != SglKind::Transport {
                Err(Status::SGL_TYPE_INVALID)
            } else {
                Ok(Transfer::Ready)
            }
        }
        DataDirection::Bidirectional => Err(Status::INVALID_OPCODE),
    }
}
