//! A primary's members: their ops and answers, their fences, their loss
//! (faulted before any write they missed is acknowledged) and what is
//! given up on with them.

use super::*;

impl EcPrimary {
    pub(super) fn in_sync(&self, member: usize) -> bool {
        self.record.members[member].state == MemberState::InSync
    }

    /// Whether a write of `stripe` goes to `member`.
    pub(super) fn writable(&self, member: usize, stripe: u64) -> bool {
        match &self.links[member] {
            Link::Up => true,
            Link::Rebuilding(r) => r.clearing == 0 && !r.pending.contains(stripe as u32),
            _ => false,
        }
    }

    pub(super) fn mark_dirty(&mut self, member: usize, stripe: u64) {
        if let Some(dirty) = &mut self.dirty[member] {
            dirty.insert(stripe as u32);
        }
        if let Link::Rebuilding(r) = &mut self.links[member] {
            if r.pending.insert(stripe as u32) {
                r.total += 1;
                r.cursor = r.cursor.min(stripe as u32);
            }
        }
    }

    pub(super) fn member_op(&mut self, member: usize, purpose: Purpose, now: Duration) -> MemberOp {
        let op = MemberOp(self.next_op);
        self.next_op += 1;
        self.ops.insert(
            op,
            Outstanding {
                member,
                purpose,
                deadline: now + self.config.member_timeout,
            },
        );
        op
    }

    /// The token of `member`'s current fence session.
    pub(super) fn token_of(&self, member: usize) -> Token {
        Token {
            epoch: self.token.epoch,
            session: self.sessions[member],
        }
    }

    pub(super) fn send(&mut self, member: usize, msg: ToMember) {
        let node = self.record.members[member].node;
        self.actions.push_back(EcAction::Send { member, node, msg });
    }

    /// A member's answer.
    pub fn member_reply(&mut self, member: usize, reply: FromMember, now: Duration) {
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        let ours = self.token_of(member);
        match reply {
            FromMember::Fenced { token } if token == ours => self.fenced(member, now),
            FromMember::Read { token, op, data } if token == ours => {
                self.op_done(member, op, Some(data), now)
            }
            FromMember::Written { token, op } if token == ours => {
                self.op_done(member, op, None, now)
            }
            FromMember::Failed { token, op }
                if token == ours && self.ops.get(&op).is_some_and(|o| o.member == member) =>
            {
                self.lose(member, now)
            }
            FromMember::Refused { token, current } if token == ours => {
                // A member's refusal names the epoch of the fence it holds.
                if current.epoch > ours.epoch {
                    self.depose();
                } else {
                    // It restarted and lost our fence.
                    self.lose(member, now);
                }
            }
            _ => {}
        }
        self.barrier_progress(now);
    }

    pub(super) fn fenced(&mut self, member: usize, now: Duration) {
        let Link::Fencing { rejoin, .. } = self.links[member] else {
            return;
        };
        if !rejoin {
            self.links[member] = Link::Up;
            return self.fencing_progress(now);
        }
        // Coming back: clear its journal, then rebuild what it missed.
        let stripes = self.config.stripes() as u32;
        let pending = self.dirty[member]
            .take()
            .unwrap_or_else(|| RegionSet::full(stripes));
        let total = u64::from(pending.len());
        let slots = self.config.journal.slots;
        self.links[member] = Link::Rebuilding(Rebuild {
            clearing: slots,
            pending,
            cursor: 0,
            running: None,
            join_after: None,
            done: 0,
            total,
            joining: false,
        });
        let zeros = vec![0; self.config.journal.block_bytes as usize];
        for slot in 0..slots {
            let op = self.member_op(member, Purpose::Clear, now);
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
    }

    pub(super) fn op_done(
        &mut self,
        member: usize,
        op: MemberOp,
        data: Option<Vec<u8>>,
        now: Duration,
    ) {
        let Some(out) = self.ops.get(&op) else {
            return; // Given up on (its member was lost, or its job read again).
        };
        if out.member != member || !self.whole_read(&out.purpose, data.as_deref()) {
            // A member that answers another's op, or reads short, is not
            // trusted with the stripe: out, and rebuilt.
            return self.lose(out.member, now);
        }
        let out = self.ops.remove(&op).expect("the op");
        match out.purpose {
            Purpose::Job { job, index } => {
                let Some(j) = self.jobs.get_mut(&job) else {
                    return;
                };
                if let (Step::Reading { reads, .. }, Some(data)) = (&mut j.step, data) {
                    reads[index] = Some(data);
                }
                j.outstanding -= 1;
                if j.outstanding == 0 {
                    self.job_step_done(job, now);
                }
            }
            Purpose::JournalRead { slot } => {
                if let Some(record) = data.and_then(|d| Record::decode(&d, &self.config.journal)) {
                    self.recovery.found.push((member, slot, record));
                }
                self.recovery.reads_left -= 1;
                self.recovery_progress(now);
            }
            Purpose::RecoveryWrite => {
                self.recovery.writes_left -= 1;
                self.recovery_progress(now);
            }
            Purpose::Clear => {
                if let Link::Rebuilding(r) = &mut self.links[member] {
                    r.clearing -= 1;
                }
                self.advance_rebuilds(now);
            }
            Purpose::Flush => self.flush_done(now),
            Purpose::Control => self.control_answered(member, true),
        }
    }

    /// Whether a job's read gave the bytes it asked for (other ops pass).
    pub(super) fn whole_read(&self, purpose: &Purpose, data: Option<&[u8]>) -> bool {
        let (Purpose::Job { job, index }, Some(data)) = (purpose, data) else {
            return true;
        };
        match self.jobs.get(job).map(|j| &j.step) {
            Some(Step::Reading { plan, .. }) => plan
                .reads()
                .get(*index)
                .is_some_and(|w| data.len() == (w.columns.end - w.columns.start) as usize),
            _ => true,
        }
    }

    pub(super) fn job_step_done(&mut self, id: JobId, now: Duration) {
        match self.jobs[&id].step {
            Step::Reading { .. } => self.reads_done(id, now),
            Step::Journaling { .. } => self.journaled(id, now),
            Step::Applying { .. } => self.applied(id, now),
            Step::Locking | Step::Slot { .. } => unreachable!("no ops outstanding"),
        }
    }

    /// `member` failed or fell silent: out of use at once, faulted in the
    /// record before any write it missed is acknowledged.
    pub(super) fn lose(&mut self, member: usize, now: Duration) {
        // In sync, or its return being committed: the record says so then.
        let joining = matches!(&self.links[member], Link::Rebuilding(r) if r.joining);
        let was_in_sync = self.in_sync(member) || joining;
        let mut dirty = match &self.links[member] {
            Link::Lost | Link::Away { .. } => {
                // Out already: only its ops are given up on.
                return self.give_up_ops(member, now);
            }
            // Its stripes to rebuild are what it missed before.
            Link::Fencing { rejoin: true, .. } => None,
            // What it still lacks stays to be rebuilt.
            Link::Rebuilding(r) => Some(r.pending.clone()),
            // Lost before serving: what the journals' recovery wrote
            // without it is not known here, so all of it is rebuilt.
            Link::Fencing { .. } | Link::Up if self.phase != EcPhase::Active => None,
            Link::Fencing { .. } | Link::Up => Some(RegionSet::new(self.config.stripes() as u32)),
        };
        if let Some(dirty) = &mut dirty {
            // And the stripes being changed now: their writes to it may
            // not have landed; and those written but not flushed: its
            // cache may have lost them.
            for job in self.jobs.values() {
                let rebuilding_it =
                    matches!(job.kind, JobKind::Rebuild { member: m } if m == member);
                if rebuilding_it || (job.writes() && !matches!(job.step, Step::Locking)) {
                    dirty.insert(job.stripe as u32);
                }
            }
            let flushing = self.flushing.iter().flat_map(|(batch, _)| batch.iter());
            for applied in self.unflushed.iter().chain(flushing) {
                if applied.written & (1 << member) != 0 {
                    dirty.insert(applied.stripe as u32);
                }
            }
            self.dirty[member] = Some(dirty.clone());
        }
        self.links[member] = if was_in_sync {
            Link::Lost
        } else {
            Link::Away {
                retry_at: now + self.config.reattach_interval,
            }
        };
        self.give_up_ops(member, now);
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        if was_in_sync {
            let left = (0..self.links.len())
                .filter(|&m| self.in_sync(m) && !matches!(self.links[m], Link::Lost))
                .count();
            if left < self.config.geometry.layout().data() {
                return self.stall();
            }
            if self.phase == EcPhase::Recovering {
                self.recovery.again = true;
            }
            self.commit_changes();
        }
        if self.phase == EcPhase::Fencing {
            self.fencing_progress(now);
        } else if self.phase == EcPhase::Recovering {
            self.recovery_progress(now);
        }
    }

    /// Gives up on `member`'s ops: reads are made again from others,
    /// writes count as done without it.
    pub(super) fn give_up_ops(&mut self, member: usize, now: Duration) {
        let gone: Vec<MemberOp> = self
            .ops
            .iter()
            .filter(|(_, o)| o.member == member)
            .map(|(&op, _)| op)
            .collect();
        let mut reread = BTreeSet::new();
        for op in gone {
            // A job that went on may have ended the primary meanwhile.
            let Some(out) = self.ops.remove(&op) else {
                continue;
            };
            match out.purpose {
                Purpose::Job { job, .. } => {
                    let Some(j) = self.jobs.get_mut(&job) else {
                        continue;
                    };
                    if matches!(j.step, Step::Reading { .. }) {
                        reread.insert(job);
                    } else {
                        j.outstanding -= 1;
                        if j.outstanding == 0 {
                            self.job_step_done(job, now);
                        }
                    }
                }
                Purpose::JournalRead { .. } => self.recovery.reads_left -= 1,
                Purpose::RecoveryWrite => self.recovery.writes_left -= 1,
                Purpose::Clear => {}
                Purpose::Flush => self.flush_done(now),
                Purpose::Control => self.control_answered(member, false),
            }
        }
        if self.is_ended() {
            return;
        }
        for job in reread {
            self.reread(job, now);
        }
    }

    /// A job whose read lost its member reads again from those left.
    pub(super) fn reread(&mut self, id: JobId, now: Duration) {
        if self.phase != EcPhase::Active && self.phase != EcPhase::Recovering {
            return;
        }
        let stale: Vec<MemberOp> = self
            .ops
            .iter()
            .filter(|(_, o)| matches!(o.purpose, Purpose::Job { job, .. } if job == id))
            .map(|(&op, _)| op)
            .collect();
        for op in stale {
            self.ops.remove(&op);
        }
        self.begin_reads(id, now);
    }
}
