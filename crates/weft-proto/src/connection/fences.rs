//! The replica fence (see `crate::fence`): a fence Set Features takes the
//! fence of the controller's subsystem once no other controller's I/O is
//! on its way to the media.

use super::*;

impl Connection {
    /// A fence Set Features: take the fence of this controller's subsystem,
    /// answering once no other controller's I/O is on its way to the media.
    pub(super) fn fence(&mut self, slot: SlotId, command: &Command, now: Timestamp) {
        let State::Admin(queue, _) = &self.state else {
            unreachable!("fences are taken on admin queues")
        };
        let fenced = self
            .config
            .subsystem(&queue.controller.subnqn)
            .is_some_and(|s| s.fenced);
        if !fenced || !queue.controller.is_ready() {
            return self.respond(slot, Status::INVALID_FIELD, 0);
        }
        if self.fence_wait.is_some() {
            // One fence at a time per controller.
            return self.respond(slot, Status::COMMAND_SEQUENCE_ERROR, 0);
        }
        let token = FenceToken::from_cdws(command.cdw(11), command.cdw(12), command.cdw(13));
        let fences = &self.target.fences;
        match fences.fence(token, &queue.controller) {
            // The result carries the current epoch: the asker learns of a newer primary.
            Err(current) => self.respond(slot, Status::RESERVATION_CONFLICT, current.epoch),
            Ok(()) if fences.drained(&queue.controller) => self.respond(slot, Status::SUCCESS, 0),
            Ok(()) => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                self.fence_wait = Some(FenceWait {
                    slot,
                    check_at: now.after(FENCE_DRAIN_CHECK),
                });
            }
        }
    }

    /// Answers a waiting fence once the other controllers drained.
    pub(super) fn check_fence_drain(&mut self, now: Timestamp) {
        let (Some(wait), State::Admin(queue, _)) = (&mut self.fence_wait, &self.state) else {
            return;
        };
        if !self.target.fences.drained(&queue.controller) {
            wait.check_at = now.after(FENCE_DRAIN_CHECK);
            return;
        }
        let slot = wait.slot;
        self.fence_wait = None;
        self.respond(slot, Status::SUCCESS, 0);
    }

    /// Counts slot `slot`'s command against its subsystem's fence as it
    /// goes to the media; false if the controller no longer holds the fence
    /// (the command must not run).
    pub(super) fn enter_fence(&mut self, slot: SlotId) -> bool {
        let State::Io(queue, io) = &self.state else {
            return true;
        };
        if !self.config.subsystems[io.subsystem].fenced {
            return true;
        }
        let controller = &queue.controller;
        if self.fence_controller.is_none() {
            self.target.fences.join(controller);
            self.fence_controller = Some(Arc::clone(controller));
        }
        if !controller.fenced_io_enter() {
            return false;
        }
        self.slots[usize::from(slot.0)].fenced = true;
        true
    }

    /// Slot `slot`'s command no longer counts against a fence or a
    /// reservation (done, or never to run).
    pub(super) fn fenced_done(&mut self, slot: SlotId) {
        let entry = &mut self.slots[usize::from(slot.0)];
        if let Some((cell, counted)) = entry.reserved.take() {
            cell.written(counted);
        }
        if std::mem::take(&mut entry.fenced) {
            if let Some(controller) = &self.fence_controller {
                controller.fenced_io_done();
            }
        }
    }
}

/// Whether `command` is weft's replica fence (Set Features, FID C0h).
pub(super) fn is_fence_command(command: &Command) -> bool {
    !command.is_fabrics()
        && command.opcode == crate::command::admin_opcode::SET_FEATURES
        && command.cdw(10) as u8 == FENCE_FEATURE
}
