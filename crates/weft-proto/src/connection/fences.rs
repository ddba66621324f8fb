//! The replica fence (see `crate::fence`): a fence Set Features takes the
//! fence of the controller's subsystem once no other controller's I/O is
//! on its way to the media.

use super::*;
use crate::fence::FenceAdmission;

impl Connection {
    /// A fence Set Features: take the fence of this controller's subsystem,
    /// answering once no other controller's I/O is on its way to the media;
    /// only if the subsystem's [`FenceAuthority`] admits it (or once it
    /// does: see `crate::fence`).
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
        match self.fence_admission(token) {
            FenceAdmission::Admitted => self.take_fence(slot, token, now),
            // The result carries the record's epoch: a deposed primary learns of a newer one.
            FenceAdmission::Stale(epoch) => self.respond(slot, Status::RESERVATION_CONFLICT, epoch),
            FenceAdmission::Unknown => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                self.fence_wait = Some(FenceWait {
                    slot,
                    check_at: now.after(FENCE_ADMISSION_CHECK),
                    unadmitted: Some((token, now.after(FENCE_ADMISSION_PATIENCE))),
                });
            }
        }
    }

    /// What the subsystem's current authority says of this controller's
    /// fence with `token` (admitted when it has none).
    fn fence_admission(&self, token: FenceToken) -> FenceAdmission {
        let State::Admin(queue, _) = &self.state else {
            unreachable!("fences are taken on admin queues")
        };
        let controller = &queue.controller;
        match self
            .config
            .subsystem(&controller.subnqn)
            .and_then(|s| s.fence_authority.as_ref())
        {
            Some(authority) => authority.admits(&controller.hostnqn, token),
            None => FenceAdmission::Admitted,
        }
    }

    /// Takes the fence with `token` (refused if not larger than the
    /// current one), answering now or once the others drained and the read
    /// grant it ends ran out.
    fn take_fence(&mut self, slot: SlotId, token: FenceToken, now: Timestamp) {
        let State::Admin(queue, _) = &self.state else {
            unreachable!("fences are taken on admin queues")
        };
        // The fence is a command of the new holder: its grant runs from here.
        queue.controller.heard(now);
        if let Err(current) = self.target.fences.fence(token, &queue.controller) {
            // The result carries the current epoch: the asker learns of a newer primary.
            return self.respond(slot, Status::RESERVATION_CONFLICT, current.epoch);
        }
        match self.fence_settles_at(now) {
            None => {
                self.target.fences.answered(&queue.controller, now);
                self.respond(slot, Status::SUCCESS, 0)
            }
            Some(check_at) => {
                self.slots[usize::from(slot.0)].state = SlotState::Parked;
                self.fence_wait = Some(FenceWait {
                    slot,
                    check_at,
                    unadmitted: None,
                });
            }
        }
    }

    /// None once the fence this controller took may be answered: no other
    /// controller's I/O is on its way to the media and, after a promotion,
    /// the read grant it ended ran out. Else when to look again.
    fn fence_settles_at(&self, now: Timestamp) -> Option<Timestamp> {
        let State::Admin(queue, _) = &self.state else {
            unreachable!("fences are taken on admin queues")
        };
        let fences = &self.target.fences;
        if !fences.drained(&queue.controller) {
            return Some(now.after(FENCE_DRAIN_CHECK));
        }
        let waits = self
            .config
            .subsystem(&queue.controller.subnqn)
            .and_then(|s| s.fence_authority.as_ref())
            .is_some_and(|a| a.waits_for_grants);
        match fences.grant_ends(&queue.controller) {
            Some(ends) if waits && now < ends => Some(ends),
            _ => None,
        }
    }

    /// Answers a waiting fence once it is admitted (or refused: not
    /// admitted in time, or stale), the other controllers drained and the
    /// grant it ended ran out.
    pub(super) fn check_fence(&mut self, now: Timestamp) {
        let Some(wait) = &self.fence_wait else {
            return;
        };
        if let Some((token, refused_at)) = wait.unadmitted {
            return self.check_fence_admission(token, refused_at, now);
        }
        if let Some(check_at) = self.fence_settles_at(now) {
            self.fence_wait.as_mut().expect("waiting").check_at = check_at;
            return;
        }
        let slot = wait.slot;
        self.fence_wait = None;
        if let State::Admin(queue, _) = &self.state {
            self.target.fences.answered(&queue.controller, now);
        }
        self.respond(slot, Status::SUCCESS, 0);
    }

    /// A fence not admitted yet: taken once the configuration admits it,
    /// refused when it says it is stale or at `refused_at`.
    fn check_fence_admission(&mut self, token: FenceToken, refused_at: Timestamp, now: Timestamp) {
        let admission = self.fence_admission(token);
        let Some(wait) = self.fence_wait.as_mut() else {
            return;
        };
        let slot = wait.slot;
        let refusal = match admission {
            FenceAdmission::Admitted => {
                self.fence_wait = None;
                return self.take_fence(slot, token, now);
            }
            FenceAdmission::Stale(epoch) => epoch,
            FenceAdmission::Unknown if now < refused_at => {
                wait.check_at = now.after(FENCE_ADMISSION_CHECK);
                return;
            }
            FenceAdmission::Unknown => self.authority_epoch(),
        };
        self.fence_wait = None;
        self.respond(slot, Status::RESERVATION_CONFLICT, refusal);
    }

    /// The epoch of the record the subsystem's authority holds (0: none).
    fn authority_epoch(&self) -> u64 {
        let State::Admin(queue, _) = &self.state else {
            return 0;
        };
        self.config
            .subsystem(&queue.controller.subnqn)
            .and_then(|s| s.fence_authority.as_ref())
            .map_or(0, |a| a.epoch)
    }

    /// Counts slot `slot`'s command against its subsystem's fence as it
    /// goes to the media; false if the controller no longer holds the fence
    /// (the command must not run).
    pub(super) fn enter_fence(&mut self, slot: SlotId, now: Timestamp) -> bool {
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
        // Heard before it enters: see `ControllerShared::heard`.
        controller.heard(now);
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
