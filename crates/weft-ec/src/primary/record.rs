//! A primary's record: the members' faults and returns it commits, and
//! the store's answers and changes.

use super::*;

impl EcPrimary {
    /// Commits the members' changes (faults, returns) if none is in flight.
    pub(super) fn commit_changes(&mut self) {
        if self.committing || self.is_ended() {
            return;
        }
        let mut next = self.record.clone();
        let mut changed = false;
        for (member, link) in self.links.iter().enumerate() {
            let state = &mut next.members[member].state;
            match link {
                Link::Lost => {
                    *state = MemberState::Faulted {
                        epoch: self.token.epoch,
                    };
                    changed = true;
                }
                Link::Rebuilding(r) if r.joining => {
                    *state = MemberState::InSync;
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            self.committing = true;
            self.actions.push_back(EcAction::Commit {
                base_revision: self.revision,
                record: next,
            });
        }
    }

    /// The record change asked for is in the store at `revision`.
    pub fn committed(&mut self, revision: u64, record: ReplicaSet, now: Duration) {
        if !self.committing || matches!(self.phase, EcPhase::Deposed | EcPhase::Stalled) {
            return;
        }
        self.committing = false;
        self.revision = revision;
        for member in 0..self.links.len() {
            let now_in_sync = record.members[member].state == MemberState::InSync;
            match &self.links[member] {
                Link::Lost if !now_in_sync => {
                    self.links[member] = Link::Away {
                        retry_at: now + self.config.reattach_interval,
                    };
                }
                Link::Rebuilding(r) if r.joining && now_in_sync => {
                    self.links[member] = Link::Up;
                }
                _ => {}
            }
        }
        self.record = record;
        if self.record.primary != self.config.me {
            // Handed over (a planned move).
            return self.depose();
        }
        self.commit_changes();
        self.release_journaled(now);
        self.flushed_after_commit(now);
        match self.phase {
            EcPhase::Fencing => self.fencing_progress(now),
            EcPhase::Recovering => self.recovery_progress(now),
            _ => self.barrier_progress(now),
        }
    }

    /// The compare-and-swap failed; `current` is the record now (None: deleted).
    pub fn commit_failed(&mut self, current: Option<(u64, ReplicaSet)>, now: Duration) {
        if self.is_ended() {
            return;
        }
        self.committing = false;
        match current {
            Some((revision, record)) => {
                self.record_changed(revision, record, now);
                self.commit_changes();
            }
            None => self.stall(),
        }
        self.barrier_progress(now);
    }

    /// The store's record changed (a watch).
    pub fn record_changed(&mut self, revision: u64, record: ReplicaSet, _now: Duration) {
        if record.epoch > self.token.epoch || record.primary != self.config.me {
            return self.depose();
        }
        if record.epoch < self.token.epoch || revision <= self.revision {
            return;
        }
        let same_nodes = record
            .members
            .iter()
            .zip(&self.record.members)
            .all(|(a, b)| a.node == b.node);
        if !same_nodes || record.members.len() != self.record.members.len() {
            return self.stall();
        }
        // Ours to change: the members' states. Anything else is taken.
        let mut record = record;
        for (mine, theirs) in self.record.members.iter().zip(record.members.iter_mut()) {
            theirs.state = mine.state;
        }
        self.revision = revision;
        self.record = record;
    }
}
