//! Per-stripe locks, first come first served: any number of readers of a
//! stripe at once, or one job that changes it (a write or a rebuild).
//!
//! A write holds its stripe from its reads of the old bytes until its
//! in-place writes are durable: the parity it computes is only right for
//! the stripe it read, recovery relies on one unapplied update per stripe at
//! most, and a read that begins after a write was acknowledged must find
//! it in place.
//!
//! What this does not do: time out, or know what the jobs are.

use std::collections::{BTreeMap, VecDeque};

/// A job's number, the caller's.
pub type JobId = u64;

#[derive(Debug, Default)]
struct Lock {
    readers: u32,
    writer: bool,
    /// Waiting jobs, in order, and whether each writes.
    waiting: VecDeque<(JobId, bool)>,
}

/// Every stripe's lock (a stripe nobody holds has none).
#[derive(Debug, Default)]
pub struct StripeLocks {
    locks: BTreeMap<u64, Lock>,
}

impl StripeLocks {
    /// Asks for `stripe` for job `job` (to change it if `write`): `true` if
    /// granted now, else it is granted later by [`StripeLocks::release`].
    pub fn acquire(&mut self, stripe: u64, job: JobId, write: bool) -> bool {
        let lock = self.locks.entry(stripe).or_default();
        let free = lock.waiting.is_empty() && !lock.writer && (lock.readers == 0 || !write);
        if free {
            if write {
                lock.writer = true;
            } else {
                lock.readers += 1;
            }
        } else {
            lock.waiting.push_back((job, write));
        }
        free
    }

    /// Gives `stripe` back (held to change it if `write`); returns the jobs
    /// granted it now, in order.
    pub fn release(&mut self, stripe: u64, write: bool) -> Vec<JobId> {
        let lock = self.locks.get_mut(&stripe).expect("a held lock");
        if write {
            debug_assert!(lock.writer);
            lock.writer = false;
        } else {
            debug_assert!(lock.readers > 0);
            lock.readers -= 1;
        }
        let mut granted = Vec::new();
        while let Some(&(job, writes)) = lock.waiting.front() {
            let fits = !lock.writer && (lock.readers == 0 || !writes);
            if !fits {
                break;
            }
            lock.waiting.pop_front();
            if writes {
                lock.writer = true;
            } else {
                lock.readers += 1;
            }
            granted.push(job);
        }
        if !lock.writer && lock.readers == 0 && lock.waiting.is_empty() {
            self.locks.remove(&stripe);
        }
        granted
    }

    /// Stripes held or waited for.
    pub fn len(&self) -> usize {
        self.locks.len()
    }

    /// Whether no stripe is held or waited for.
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_share_a_stripe_and_a_writer_waits_for_them_in_order() {
        let mut locks = StripeLocks::default();
        assert!(locks.acquire(7, 1, false));
        assert!(locks.acquire(7, 2, false));
        assert!(!locks.acquire(7, 3, true), "a writer waits for readers");
        assert!(
            !locks.acquire(7, 4, false),
            "a reader waits behind a writer"
        );
        assert!(locks.acquire(8, 5, true), "another stripe is free");
        assert_eq!(locks.release(7, false), Vec::<JobId>::new());
        assert_eq!(locks.release(7, false), vec![3]);
        assert_eq!(locks.release(7, true), vec![4]);
        assert_eq!(locks.release(7, false), Vec::<JobId>::new());
        assert_eq!(locks.release(8, true), Vec::<JobId>::new());
        assert!(locks.is_empty());
    }

    #[test]
    fn readers_behind_a_writer_are_granted_together() {
        let mut locks = StripeLocks::default();
        assert!(locks.acquire(1, 1, true));
        assert!(!locks.acquire(1, 2, false));
        assert!(!locks.acquire(1, 3, false));
        assert!(!locks.acquire(1, 4, true));
        assert_eq!(locks.release(1, true), vec![2, 3]);
        assert_eq!(locks.len(), 1);
    }
}
