//! The conformance suite of the [`Store`] trait: one set of tests that
//! every implementation (the memory store here, etcd in weft-etcd) must
//! pass, so that code written and tested against [`crate::MemoryStore`]
//! behaves the same on a cluster. [`MemoryStore`] is the reference: each
//! test states what it does, and the other stores are held to it.
//!
//! Only built with the `testing` feature (and for this crate's own tests):
//! no test code ships. The suite does not start stores itself: a
//! [`Harness`] hands it fresh ones and says how time passes for their
//! leases and how their history is forgotten.
//!
//! Tests assume nothing else writes to the stores they are given while they
//! run (they compare exact revisions), and they panic on the first failure
//! with the name of the test.

mod entries;
mod leases;
mod watch;

use crate::memory::HISTORY_MAX;
use crate::store::{Change, Revision, Store, Txn, WatchEvent};
use crate::{ManualClock, MemoryStore};
use serde_json::Value;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// How the suite gets stores and moves their world.
pub trait Harness {
    /// A new store that holds no key (no key any earlier store of this
    /// harness wrote is visible through it).
    fn store(&self) -> Box<dyn Store>;
    /// The time to live the lease tests grant: at least the shortest the
    /// store honours exactly.
    fn lease_ttl(&self) -> Duration;
    /// Lets `by` pass for the leases of the harness's stores (a manual
    /// clock moves; a real store is slept on).
    fn advance(&self, by: Duration);
    /// Makes `store` forget every change made so far, so that a watch
    /// after any revision before the call is refused (it may commit
    /// changes of its own to get there, leaving no key behind).
    fn compact(&self, store: &dyn Store);
}

/// One test of the suite.
pub type Test = fn(&dyn Harness);

/// Every test, by name, in the order [`run_all`] runs them.
pub const TESTS: &[(&str, Test)] = &[
    ("revisions_and_listings", entries::revisions_and_listings),
    (
        "of_racing_creates_one_wins",
        entries::of_racing_creates_one_wins,
    ),
    (
        "stale_conditions_conflict",
        entries::stale_conditions_conflict,
    ),
    ("deletes", entries::deletes),
    ("transactions_are_atomic", entries::transactions_are_atomic),
    ("leases_own_their_entries", leases::leases_own_their_entries),
    (
        "leases_expire_unless_kept_alive",
        leases::leases_expire_unless_kept_alive,
    ),
    ("watch_follows_a_prefix", watch::watch_follows_a_prefix),
    (
        "watch_sees_lease_deletions",
        watch::watch_sees_lease_deletions,
    ),
    (
        "watch_after_compaction_is_refused",
        watch::watch_after_compaction_is_refused,
    ),
];

/// Runs every test against fresh stores of `harness`, in order; panics on
/// the first failure (the test's name is printed before it starts).
pub fn run_all(harness: &dyn Harness) {
    for (name, test) in TESTS {
        eprintln!("store conformance: {name}");
        let started = std::time::Instant::now();
        test(harness);
        eprintln!(
            "store conformance: {name} passed in {:?}",
            started.elapsed()
        );
    }
}

/// Memory stores whose leases follow one [`ManualClock`].
#[derive(Debug, Default)]
pub struct MemoryHarness {
    clock: Arc<ManualClock>,
}

impl Harness for MemoryHarness {
    fn store(&self) -> Box<dyn Store> {
        Box::new(MemoryStore::with_clock(self.clock.clone()))
    }

    fn lease_ttl(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    fn compact(&self, store: &dyn Store) {
        // A memory store forgets the oldest changes once it keeps more
        // than HISTORY_MAX of them.
        for n in 0..=HISTORY_MAX {
            store
                .commit(Txn::raw(
                    vec![],
                    vec![Change::put("compaction", Value::from(n))],
                ))
                .expect("commit");
        }
        store
            .commit(Txn::raw(vec![], vec![Change::Delete("compaction".into())]))
            .expect("commit");
    }
}

/// How long a test waits for a watch event that should come.
const EVENT_WAIT: Duration = Duration::from_secs(5);

/// Commits unconditional puts of `pairs`, expecting success.
fn put(store: &dyn Store, pairs: &[(&str, Value)]) -> Revision {
    let changes = pairs
        .iter()
        .map(|(key, value)| Change::put(*key, value.clone()))
        .collect();
    store.commit(Txn::raw(vec![], changes)).expect("commit")
}

/// A watch event as one line (`put KEY @REV = VALUE`, `delete KEY @REV`).
fn describe(event: &WatchEvent) -> String {
    match event {
        WatchEvent::Put(entry) => {
            format!("put {} @{} = {}", entry.key, entry.revision, entry.value)
        }
        WatchEvent::Delete(key, revision) => format!("delete {key} @{revision}"),
        WatchEvent::Lost(why) => format!("lost: {why}"),
    }
}

/// The next `count` events of `watch`, described; panics if they do not
/// come in time.
fn next_events(watch: &Receiver<WatchEvent>, count: usize) -> Vec<String> {
    (0..count)
        .map(|n| match watch.recv_timeout(EVENT_WAIT) {
            Ok(event) => describe(&event),
            Err(error) => panic!("watch event {} of {count} did not come: {error}", n + 1),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_store_conforms() {
        run_all(&MemoryHarness::default());
    }
}
