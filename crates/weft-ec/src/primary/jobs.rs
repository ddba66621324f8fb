//! A primary's jobs: each host read's and write's part in one stripe, and
//! each stripe of a rebuild, from its lock through its reads, the journal
//! and the in-place writes to its end; and the flushes that free journal
//! slots (see the parent module for the order and why).

use super::*;

impl EcPrimary {
    pub(super) fn start_job(&mut self, stripe: u64, kind: JobKind, now: Duration) -> JobId {
        let id = self.next_job;
        self.next_job += 1;
        let job = Job {
            stripe,
            kind,
            step: Step::Locking,
            outstanding: 0,
        };
        let granted = self.locks.acquire(stripe, id, job.writes());
        self.jobs.insert(id, job);
        if granted {
            self.begin_reads(id, now);
        }
        id
    }

    /// The job has its lock: plans and sends its reads.
    pub(super) fn begin_reads(&mut self, id: JobId, now: Duration) {
        let job = &self.jobs[&id];
        let stripe = job.stripe;
        let wants = match &job.kind {
            JobKind::Read { pieces, .. } => pieces
                .iter()
                .map(|(shard, columns, _)| Want {
                    shard: *shard,
                    columns: columns.clone(),
                })
                .collect(),
            JobKind::Write { pieces, .. } => {
                let columns = write_columns(pieces);
                (0..self.config.geometry.layout().data())
                    .filter(|&shard| {
                        !pieces.iter().any(|(s, column, bytes)| {
                            *s == shard
                                && *column == columns.start
                                && bytes.len() == (columns.end - columns.start) as usize
                        })
                    })
                    .map(|shard| Want {
                        shard,
                        columns: columns.clone(),
                    })
                    .collect()
            }
            JobKind::Rebuild { member } => vec![Want {
                shard: self.config.shard_of(*member, stripe),
                columns: 0..self.config.geometry.chunk_bytes(),
            }],
        };
        let layout = self.config.geometry.layout();
        let readable = |shard: usize| {
            matches!(
                self.links[self.config.geometry.member_of(stripe, shard)],
                Link::Up
            )
        };
        let Some(plan) = gather::plan(layout, &wants, readable) else {
            // Fewer than k members: faulting them would have stalled.
            return self.stall();
        };
        let reads = plan.reads();
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = reads.len();
        job.step = Step::Reading {
            plan,
            wants,
            reads: vec![None; reads.len()],
        };
        if reads.is_empty() {
            return self.reads_done(id, now);
        }
        for (index, want) in reads.into_iter().enumerate() {
            let member = self.config.geometry.member_of(stripe, want.shard);
            let offset = self.config.in_place(stripe, want.columns.start);
            let len = want.columns.end - want.columns.start;
            let op = self.member_op(member, Purpose::Job { job: id, index }, now);
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

    pub(super) fn reads_done(&mut self, id: JobId, now: Duration) {
        let layout = self.config.geometry.layout();
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Reading { plan, wants, reads } = std::mem::replace(&mut job.step, Step::Locking)
        else {
            unreachable!("a job done reading was reading")
        };
        let reads: Vec<Vec<u8>> = reads.into_iter().map(|r| r.expect("every read")).collect();
        let got = gather::solve(layout, &plan, &wants, reads).expect("k shards rebuild the rest");
        let stripe = job.stripe;
        match &job.kind {
            JobKind::Read { host, pieces } => {
                let host = *host;
                let op = self.host.get_mut(&host).expect("the host read");
                for ((_, _, at), bytes) in pieces.iter().zip(got) {
                    op.data[*at..*at + bytes.len()].copy_from_slice(&bytes);
                }
                self.finish_job(id, now);
                self.part_done(host, now);
            }
            JobKind::Write { .. } => {
                let JobKind::Write { pieces, .. } = &self.jobs[&id].kind else {
                    unreachable!("a write")
                };
                let changes = self.changes(stripe, pieces, &wants, got);
                let job = self.jobs.get_mut(&id).expect("the job");
                job.step = Step::Slot { changes };
                self.slot_waiters.push_back(id);
                self.give_slots(now);
            }
            JobKind::Rebuild { member } => {
                let member = *member;
                let current =
                    matches!(&self.links[member], Link::Rebuilding(r) if r.running == Some(id));
                if !current {
                    // Its member was lost meanwhile: the stripe stays to rebuild.
                    self.mark_dirty(member, stripe);
                    return self.finish_job(id, now);
                }
                let job = self.jobs.get_mut(&id).expect("the job");
                let data = got.into_iter().next().expect("one want");
                job.step = Step::Applying {
                    slot: None,
                    written: 1 << member,
                };
                job.outstanding = 1;
                let offset = self.config.in_place(stripe, 0);
                let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
                self.send(
                    member,
                    ToMember::Write {
                        token: self.token_of(member),
                        op,
                        offset,
                        data,
                        fua: true,
                    },
                );
            }
        }
    }

    /// A write's new bytes, per member it changes.
    pub(super) fn changes(
        &self,
        stripe: u64,
        pieces: &[(usize, u32, Vec<u8>)],
        wants: &[Want],
        old: Vec<Vec<u8>>,
    ) -> Changes {
        let layout = self.config.geometry.layout();
        let columns = write_columns(pieces);
        let width = (columns.end - columns.start) as usize;
        let mut data = vec![vec![0u8; width]; layout.data()];
        for (want, bytes) in wants.iter().zip(old) {
            data[want.shard] = bytes;
        }
        for (shard, column, bytes) in pieces {
            let at = (column - columns.start) as usize;
            data[*shard][at..at + bytes.len()].copy_from_slice(bytes);
        }
        let mut parity = vec![vec![0u8; width]; layout.parity()];
        {
            let d: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut p: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
            encode(layout, &d, &mut p).expect("a stripe's shape");
        }
        let written: BTreeSet<usize> = pieces.iter().map(|(shard, _, _)| *shard).collect();
        let mut members = Vec::new();
        let mut changed = 0u16;
        for (shard, bytes) in data.into_iter().enumerate().chain(
            parity
                .into_iter()
                .enumerate()
                .map(|(j, p)| (layout.data() + j, p)),
        ) {
            if shard < layout.data() && !written.contains(&shard) {
                continue;
            }
            let member = self.config.geometry.member_of(stripe, shard);
            changed |= 1 << member;
            members.push((member, bytes));
        }
        Changes {
            columns,
            changed,
            members,
        }
    }

    /// The journal slot of `stripe`'s records. Always the same one, so that
    /// a member holds at most one record of a stripe: a record found is the
    /// stripe's last on that member, and writing it in place again changes
    /// nothing another update wrote later (module `journal`).
    pub(super) fn slot_of(&self, stripe: u64) -> u32 {
        (stripe % u64::from(self.config.journal.slots)) as u32
    }

    /// Hands free journal slots to the writes waiting for them, in order.
    pub(super) fn give_slots(&mut self, now: Duration) {
        let mut waiting = std::mem::take(&mut self.slot_waiters);
        while let Some(id) = waiting.pop_front() {
            let slot = self.slot_of(self.jobs[&id].stripe);
            if self.slot_busy[slot as usize] {
                self.slot_waiters.push_back(id);
                continue;
            }
            self.slot_busy[slot as usize] = true;
            self.journal(id, slot, now);
            if self.is_ended() {
                return;
            }
        }
    }

    pub(super) fn is_ended(&self) -> bool {
        matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled)
    }

    pub(super) fn journal(&mut self, id: JobId, slot: u32, now: Duration) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Slot { changes } = std::mem::replace(&mut job.step, Step::Locking) else {
            unreachable!("a job given a slot waited for one")
        };
        let stripe = job.stripe;
        let mut sends = Vec::new();
        for (member, bytes) in &changes.members {
            if !self.writable(*member, stripe) {
                self.mark_dirty(*member, stripe);
                continue;
            }
            let record = Record {
                epoch: self.token.epoch,
                seq,
                stripe,
                member: *member as u16,
                changed: changes.changed,
                column: changes.columns.start,
                data: bytes.clone(),
            };
            sends.push((*member, record.encode(&self.config.journal)));
        }
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = sends.len();
        job.step = Step::Journaling { changes, slot };
        if sends.is_empty() {
            return self.journaled(id, now);
        }
        let offset = self.config.journal.slot_offset(slot);
        for (member, data) in sends {
            let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
            self.send(
                member,
                ToMember::Write {
                    token: self.token_of(member),
                    op,
                    offset,
                    data,
                    fua: true,
                },
            );
        }
    }

    /// Every member a write reached holds its record: once no fault is left
    /// to commit, the host may have it and the bytes go in place.
    pub(super) fn journaled(&mut self, id: JobId, now: Duration) {
        self.journaled.push(id);
        self.release_journaled(now);
    }

    /// Acknowledges and applies the journaled writes, unless a member's
    /// fault is still to be committed: until then the member is in sync in
    /// the store's record, the records it lacks are incomplete there, and
    /// a recovery would drop them (so none may be applied anywhere yet).
    pub(super) fn release_journaled(&mut self, now: Duration) {
        if self.links.iter().any(|l| matches!(l, Link::Lost)) {
            return;
        }
        for id in std::mem::take(&mut self.journaled) {
            if self.jobs.contains_key(&id) {
                self.apply(id, now);
            }
            if self.is_ended() {
                return;
            }
        }
    }

    pub(super) fn apply(&mut self, id: JobId, now: Duration) {
        let job = self.jobs.get_mut(&id).expect("the job");
        let Step::Journaling { changes, slot } = std::mem::replace(&mut job.step, Step::Locking)
        else {
            unreachable!("a job journaled was journaling")
        };
        let stripe = job.stripe;
        let JobKind::Write { host, .. } = job.kind else {
            unreachable!("only writes journal")
        };
        let mut sends = Vec::new();
        for (member, bytes) in changes.members {
            if self.writable(member, stripe) {
                sends.push((member, bytes));
            } else {
                self.mark_dirty(member, stripe);
            }
        }
        let written = sends
            .iter()
            .fold(0u16, |mask, (member, _)| mask | 1 << member);
        let job = self.jobs.get_mut(&id).expect("the job");
        job.outstanding = sends.len();
        job.step = Step::Applying {
            slot: Some(slot),
            written,
        };
        self.part_done(host, now);
        if sends.is_empty() {
            return self.applied(id, now);
        }
        let offset = self.config.in_place(stripe, changes.columns.start);
        for (member, data) in sends {
            let op = self.member_op(member, Purpose::Job { job: id, index: 0 }, now);
            self.send(
                member,
                ToMember::Write {
                    token: self.token_of(member),
                    op,
                    offset,
                    data,
                    fua: false,
                },
            );
        }
    }

    /// The job's in-place writes are done (a rebuild's durable): the
    /// stripe is free again; a write's slot waits for the next flush.
    pub(super) fn applied(&mut self, id: JobId, now: Duration) {
        let job = &self.jobs[&id];
        let Step::Applying { slot, written } = job.step else {
            unreachable!("a job applied was applying")
        };
        if let JobKind::Rebuild { member } = job.kind {
            if let Link::Rebuilding(r) = &mut self.links[member] {
                if r.running == Some(id) {
                    r.done += 1;
                    r.running = None;
                }
            }
        }
        if let Some(slot) = slot {
            let stripe = job.stripe;
            self.unflushed.push(Applied {
                slot,
                stripe,
                written,
            });
        }
        self.finish_job(id, now);
        self.flush_applied(now);
        self.advance_rebuilds(now);
    }

    /// Flushes the members the applied writes went to, unless a flush is
    /// under way; once it is done their slots are free: the next update of
    /// those stripes may overwrite their records, the in-place bytes being
    /// durable. Under load, one flush covers the writes of many updates.
    pub(super) fn flush_applied(&mut self, now: Duration) {
        if self.flushing.is_some() || self.unflushed.is_empty() || self.is_ended() {
            return;
        }
        let batch = std::mem::take(&mut self.unflushed);
        let members = batch.iter().fold(0u16, |mask, a| mask | a.written);
        let mut outstanding = 0;
        for member in (0..self.links.len()).filter(|&m| members & (1 << m) != 0) {
            // A member lost since is faulted: what it lacks is rebuilt.
            if matches!(self.links[member], Link::Up | Link::Rebuilding(_)) {
                let op = self.member_op(member, Purpose::Flush, now);
                self.send(
                    member,
                    ToMember::Flush {
                        token: self.token_of(member),
                        op,
                    },
                );
                outstanding += 1;
            }
        }
        self.flushing = Some((batch, outstanding));
        if outstanding == 0 {
            self.flushed(now);
        }
    }

    /// A flush's member answered (or was lost).
    pub(super) fn flush_done(&mut self, now: Duration) {
        if let Some((_, outstanding)) = &mut self.flushing {
            *outstanding -= 1;
            if *outstanding == 0 {
                self.flushed(now);
            }
        }
    }

    /// Every member flushed, or was lost: the slots are free, once no
    /// lost member's fault is left to commit (until then it is in sync in
    /// the store's record, and its journal's records are what a recovery
    /// would write again over what its lost cache held).
    pub(super) fn flushed(&mut self, now: Duration) {
        if self.links.iter().any(|l| matches!(l, Link::Lost)) {
            return;
        }
        let (batch, _) = self.flushing.take().expect("a flush");
        for applied in batch {
            self.slot_busy[applied.slot as usize] = false;
        }
        self.flush_generation += 1;
        self.give_slots(now);
        self.flush_applied(now);
        self.advance_rebuilds(now);
    }

    /// A flush that waited for a fault's commit ends now.
    pub(super) fn flushed_after_commit(&mut self, now: Duration) {
        if matches!(self.flushing, Some((_, 0))) {
            self.flushed(now);
        }
    }

    /// Gives back the job's lock and starts the jobs waiting for it.
    pub(super) fn finish_job(&mut self, id: JobId, now: Duration) {
        let job = self.jobs.remove(&id).expect("the job");
        for next in self.locks.release(job.stripe, job.writes()) {
            if self.jobs.contains_key(&next) {
                self.begin_reads(next, now);
            }
        }
    }

    /// One stripe's part of a host command is done.
    pub(super) fn part_done(&mut self, host: OpId, now: Duration) {
        let op = self.host.get_mut(&host).expect("the host op");
        op.parts_left -= 1;
        if op.parts_left > 0 {
            return;
        }
        if op.write {
            self.host.remove(&host);
            self.complete(host, HostResult::Ok, Vec::new());
        } else {
            let op = self.host.remove(&host).expect("the host op");
            // Read from members a newer primary may have fenced since,
            // once this node's lease is gone (module docs).
            if now < self.lease_until {
                self.complete(host, HostResult::Ok, op.data);
            } else {
                self.complete(host, HostResult::Transition, Vec::new());
            }
        }
    }
}
