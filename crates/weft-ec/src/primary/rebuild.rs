//! A primary's time: ops and fences that time out, members asked back,
//! and rebuilds started as the bandwidth allows.

use super::*;

impl EcPrimary {
    /// The time passes.
    pub fn tick(&mut self, now: Duration) {
        if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        let late: BTreeSet<usize> = self
            .ops
            .values()
            .filter(|o| o.deadline <= now)
            .map(|o| o.member)
            .chain(self.links.iter().enumerate().filter_map(|(m, l)| match l {
                Link::Fencing { deadline, .. } if *deadline <= now => Some(m),
                _ => None,
            }))
            .collect();
        for member in late {
            if let Link::Fencing { rejoin: true, .. } = self.links[member] {
                self.links[member] = Link::Away {
                    retry_at: now + self.config.reattach_interval,
                };
                continue;
            }
            self.lose(member, now);
            if matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
                return;
            }
        }
        if self.phase != EcPhase::Active {
            return;
        }
        for member in 0..self.links.len() {
            if let Link::Away { retry_at } = self.links[member] {
                if retry_at <= now {
                    self.links[member] = Link::Fencing {
                        deadline: now + self.config.member_timeout,
                        rejoin: true,
                    };
                    // A new session: the member may hold the last one's
                    // fence (see `sessions`).
                    self.sessions[member] += 1;
                    let token = self.token_of(member);
                    self.send(member, ToMember::Fence { token });
                }
            }
        }
        self.advance_rebuilds(now);
        self.barrier_progress(now);
        self.hand_over();
    }

    /// Starts the next stripe of each rebuild the bandwidth allows, and
    /// puts a rebuilt member back in sync.
    pub(super) fn advance_rebuilds(&mut self, now: Duration) {
        if self.phase != EcPhase::Active || self.moving_to().is_some() {
            return;
        }
        self.refill_budget(now);
        let chunk = u64::from(self.config.geometry.chunk_bytes());
        let stripes = self.config.stripes() as u32;
        for member in 0..self.links.len() {
            let Link::Rebuilding(r) = &mut self.links[member] else {
                continue;
            };
            if r.clearing > 0 || r.running.is_some() || r.joining {
                continue;
            }
            while r.cursor < stripes && !r.pending.contains(r.cursor) {
                r.cursor += 1;
            }
            if r.cursor >= stripes {
                // Every update that skipped it is applied (its stripe's
                // rebuild waited for the lock); it joins once they are
                // flushed too: a recovery would drop their records, which
                // it lacks, once it is in sync.
                let quiet = self.unflushed.is_empty() && self.flushing.is_none();
                let gate = *r.join_after.get_or_insert(self.flush_generation + 2);
                // Not while a control is under way: every member in sync
                // when it ends made it (or was faulted).
                if self.barrier.is_some() {
                    continue;
                }
                if quiet || self.flush_generation >= gate {
                    r.joining = true;
                    self.commit_changes();
                }
                continue;
            }
            let limited = self.config.rebuild_bytes_per_sec > 0;
            if limited && self.rebuild_budget < chunk {
                continue;
            }
            if limited {
                self.rebuild_budget -= chunk;
            }
            let stripe = r.cursor;
            r.pending.remove(stripe);
            let id = self.next_job;
            r.running = Some(id);
            let started = self.start_job(u64::from(stripe), JobKind::Rebuild { member }, now);
            debug_assert_eq!(started, id);
        }
    }

    pub(super) fn refill_budget(&mut self, now: Duration) {
        let rate = self.config.rebuild_bytes_per_sec;
        let elapsed = now.saturating_sub(self.budget_at);
        let earned = (elapsed.as_nanos() * u128::from(rate) / 1_000_000_000) as u64;
        if earned > 0 {
            // At most a tenth of a second's worth saved up.
            let cap = (rate / 10).max(u64::from(self.config.geometry.chunk_bytes()));
            self.rebuild_budget = (self.rebuild_budget + earned).min(cap);
            self.budget_at = now;
        }
    }
}
