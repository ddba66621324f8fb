//! A primary's start: fencing every member in sync, then the journals'
//! recovery (per stripe its newest update redone if every in-sync member
//! holds it, dropped if not; every slot found cleared).

use super::*;

impl EcPrimary {
    pub(super) fn fencing_progress(&mut self, now: Duration) {
        if self.phase != EcPhase::Fencing || self.committing {
            return;
        }
        let waiting = self
            .links
            .iter()
            .any(|l| matches!(l, Link::Fencing { rejoin: false, .. } | Link::Lost));
        if !waiting {
            self.phase = EcPhase::Recovering;
            self.start_recovery(now);
        }
    }

    pub(super) fn start_recovery(&mut self, now: Duration) {
        self.recovery = RecoveryState {
            reading: true,
            ..RecoveryState::default()
        };
        let slots = self.config.journal.slots;
        let len = self.config.journal.slot_bytes() as u32;
        for member in 0..self.links.len() {
            if !matches!(self.links[member], Link::Up) {
                continue;
            }
            for slot in 0..slots {
                let op = self.member_op(member, Purpose::JournalRead { slot }, now);
                let offset = self.config.journal.slot_offset(slot);
                self.recovery.reads_left += 1;
                self.send(
                    member,
                    ToMember::Read {
                        token: self.token_of(member),
                        op,
                        offset,
                        len,
                    },
                );
            }
        }
        self.recovery_progress(now);
    }

    pub(super) fn recovery_progress(&mut self, now: Duration) {
        if self.phase != EcPhase::Recovering {
            return;
        }
        let r = &mut self.recovery;
        if r.reads_left > 0 || r.writes_left > 0 || self.committing {
            return;
        }
        if r.again {
            return self.start_recovery(now);
        }
        if r.reading {
            r.reading = false;
            r.redoing = true;
            let found = std::mem::take(&mut r.found);
            let record = &self.record;
            let links = &self.links;
            let plan = journal::recovery(found, |m| {
                record.members[m].state == MemberState::InSync && matches!(links[m], Link::Up)
            });
            self.recovery.clear = plan.clear;
            for record in plan.redo {
                let member = usize::from(record.member);
                let offset = self.config.in_place(record.stripe, record.column);
                let op = self.member_op(member, Purpose::RecoveryWrite, now);
                self.recovery.writes_left += 1;
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token_of(member),
                        op,
                        offset,
                        data: record.data,
                        fua: true,
                    },
                );
            }
            return self.recovery_progress(now);
        }
        if r.redoing {
            r.redoing = false;
            let zeros = vec![0; self.config.journal.block_bytes as usize];
            for (member, slot) in std::mem::take(&mut self.recovery.clear) {
                if !matches!(self.links[member], Link::Up) {
                    continue;
                }
                let op = self.member_op(member, Purpose::RecoveryWrite, now);
                self.recovery.writes_left += 1;
                let offset = self.config.journal.slot_offset(slot);
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token_of(member),
                        op,
                        offset,
                        data: zeros.clone(),
                        fua: true,
                    },
                );
            }
            return self.recovery_progress(now);
        }
        self.phase = EcPhase::Active;
    }
}
