//! [`MemoryStore`]: the [`Store`] in memory, deterministic for tests (time
//! comes from an injected [`Clock`]), and the core of the embedded store,
//! which persists each commit's state before it becomes visible.
//!
//! Leases end when an operation sees that their deadline has passed (there
//! is no timer thread): their entries are deleted by a commit of their own,
//! which watchers see as deletions.

use crate::store::{
    Change, Condition, Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Changes kept for watchers that start after an older revision.
pub(crate) const HISTORY_MAX: usize = 4096;

/// Where a store's leases get their time.
pub trait Clock: Send + Sync {
    /// Time since an arbitrary fixed start.
    fn now(&self) -> Duration;
}

/// The monotonic clock of the machine.
#[derive(Debug)]
pub struct SystemClock(Instant);

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock(Instant::now())
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told (deterministic tests).
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).expect("test durations fit");
        self.0.fetch_add(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.0.load(Ordering::SeqCst))
    }
}

/// Called with every entry not under a lease, before a commit becomes
/// visible; an error fails the commit.
pub(crate) type Persist =
    Box<dyn Fn(&BTreeMap<String, Entry>, Revision) -> Result<(), String> + Send + Sync>;

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl: Duration,
    deadline: Duration,
}

#[derive(Default)]
struct State {
    entries: BTreeMap<String, Entry>,
    revision: Revision,
    leases: HashMap<LeaseId, Lease>,
    next_lease: i64,
    history: VecDeque<(Revision, WatchEvent)>,
    /// The oldest revision after which the history is complete.
    history_after: Revision,
    watchers: Vec<(String, Sender<WatchEvent>)>,
}

/// A store in memory.
pub struct MemoryStore {
    state: Mutex<State>,
    clock: Arc<dyn Clock>,
    persist: Option<Persist>,
    location: String,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock::default()))
    }
}

impl MemoryStore {
    /// An empty store whose leases follow `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            state: Mutex::default(),
            clock,
            persist: None,
            location: "in memory".into(),
        }
    }

    /// A store that starts with `entries` at `revision` and persists every
    /// commit through `persist` (the embedded store).
    pub(crate) fn persistent(
        entries: BTreeMap<String, Entry>,
        revision: Revision,
        persist: Persist,
        location: String,
    ) -> MemoryStore {
        MemoryStore {
            state: Mutex::new(State {
                entries,
                revision,
                history_after: revision,
                ..State::default()
            }),
            clock: Arc::new(SystemClock::default()),
            persist: Some(persist),
            location,
        }
    }

    /// The state, after ending the leases whose time has passed.
    fn lock(&self) -> Result<MutexGuard<'_, State>, StoreError> {
        let mut state = self.state.lock().expect("store lock");
        let now = self.clock.now();
        let expired: Vec<LeaseId> = state
            .leases
            .iter()
            .filter(|(_, lease)| lease.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.end_lease(&mut state, id)?;
        }
        Ok(state)
    }

    fn end_lease(&self, state: &mut State, id: LeaseId) -> Result<(), StoreError> {
        state.leases.remove(&id);
        let keys: Vec<Change> = state
            .entries
            .values()
            .filter(|entry| entry.lease == Some(id))
            .map(|entry| Change::Delete(entry.key.clone()))
            .collect();
        if !keys.is_empty() {
            self.apply(state, &[], keys)?;
        }
        Ok(())
    }

    /// Checks `conditions` and applies `changes`.
    fn apply(
        &self,
        state: &mut State,
        conditions: &[Condition],
        changes: Vec<Change>,
    ) -> Result<Revision, StoreError> {
        for condition in conditions {
            let holds = match (condition, state.entries.get(condition.key())) {
                (Condition::Absent(_), entry) => entry.is_none(),
                (Condition::At(_, revision), Some(entry)) => entry.revision == *revision,
                (Condition::At(..), None) => false,
            };
            if !holds {
                return Err(StoreError::Conflict {
                    key: condition.key().to_string(),
                });
            }
        }
        let revision = Revision(state.revision.0 + 1);
        let mut entries = state.entries.clone();
        let mut events = Vec::with_capacity(changes.len());
        // Only leased entries changing (liveness) leaves the file alone.
        let mut durable_changed = false;
        for change in changes {
            match change {
                Change::Put { key, value, lease } => {
                    if let Some(id) = lease {
                        if !state.leases.contains_key(&id) {
                            return Err(StoreError::LeaseExpired { lease: id.0 });
                        }
                    }
                    durable_changed |=
                        lease.is_none() || entries.get(&key).is_some_and(|old| old.lease.is_none());
                    let entry = Entry {
                        key: key.clone(),
                        value,
                        revision,
                        lease,
                    };
                    events.push(WatchEvent::Put(entry.clone()));
                    entries.insert(key, entry);
                }
                Change::Delete(key) => {
                    if let Some(old) = entries.remove(&key) {
                        durable_changed |= old.lease.is_none();
                        events.push(WatchEvent::Delete(key, revision));
                    }
                }
            }
        }
        if let Some(persist) = self.persist.as_ref().filter(|_| durable_changed) {
            let durable: BTreeMap<String, Entry> = entries
                .iter()
                .filter(|(_, entry)| entry.lease.is_none())
                .map(|(key, entry)| (key.clone(), entry.clone()))
                .collect();
            persist(&durable, revision).map_err(|message| StoreError::Unavailable {
                location: self.location.clone(),
                message,
            })?;
        }
        state.entries = entries;
        state.revision = revision;
        for event in events {
            publish(state, revision, event);
        }
        Ok(revision)
    }
}

/// Sends `event` to the watchers of its key and keeps it in the history.
fn publish(state: &mut State, revision: Revision, event: WatchEvent) {
    let key = match &event {
        WatchEvent::Put(entry) => entry.key.as_str(),
        WatchEvent::Delete(key, _) => key.as_str(),
        WatchEvent::Lost(_) => unreachable!("stores never record a lost watch"),
    };
    state
        .watchers
        .retain(|(prefix, sender)| !key.starts_with(prefix) || sender.send(event.clone()).is_ok());
    state.history.push_back((revision, event));
    while state.history.len() > HISTORY_MAX {
        let (dropped, _) = state.history.pop_front().expect("not empty");
        state.history_after = dropped;
    }
}

fn key_of(event: &WatchEvent) -> &str {
    match event {
        WatchEvent::Put(entry) => &entry.key,
        WatchEvent::Delete(key, _) | WatchEvent::Lost(key) => key,
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.lock()?.entries.get(key).cloned())
    }

    fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let state = self.lock()?;
        Ok(Listing {
            entries: state
                .entries
                .range(prefix.to_string()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(_, entry)| entry.clone())
                .collect(),
            revision: state.revision,
        })
    }

    fn commit(&self, txn: Txn) -> Result<Revision, StoreError> {
        let mut state = self.lock()?;
        let (conditions, changes) = txn.into_parts();
        self.apply(&mut state, &conditions, changes)
    }

    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let mut state = self.lock()?;
        state.next_lease += 1;
        let id = LeaseId(state.next_lease);
        let deadline = self.clock.now() + ttl;
        state.leases.insert(id, Lease { ttl, deadline });
        Ok(id)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        let mut state = self.lock()?;
        let now = self.clock.now();
        match state.leases.get_mut(&lease) {
            Some(kept) => {
                kept.deadline = now + kept.ttl;
                Ok(())
            }
            None => Err(StoreError::LeaseExpired { lease: lease.0 }),
        }
    }

    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        let mut state = self.lock()?;
        self.end_lease(&mut state, lease)
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError> {
        let mut state = self.lock()?;
        if after < state.history_after {
            return Err(StoreError::Compacted { after });
        }
        let (sender, receiver) = mpsc::channel();
        for (revision, event) in &state.history {
            if *revision > after && key_of(event).starts_with(prefix) {
                sender.send(event.clone()).expect("receiver is here");
            }
        }
        state.watchers.push((prefix.to_string(), sender));
        Ok(receiver)
    }

    fn location(&self) -> String {
        self.location.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> (MemoryStore, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        (MemoryStore::with_clock(clock.clone()), clock)
    }

    #[test]
    fn every_commit_has_a_new_revision_kept_by_its_entries() {
        let (store, _) = store();
        let first = store
            .commit(Txn::raw(
                vec![],
                vec![
                    Change::put("hosts/a", json!(1)),
                    Change::put("hosts/b", json!(2)),
                ],
            ))
            .unwrap();
        let second = store
            .commit(Txn::raw(vec![], vec![Change::put("hosts/b", json!(3))]))
            .unwrap();
        assert!(second > first);
        let listing = store.list("hosts/").unwrap();
        assert_eq!(listing.revision, second);
        let revisions: Vec<_> = listing.entries.iter().map(|e| e.revision).collect();
        assert_eq!(revisions, vec![first, second]);
        assert_eq!(store.get("hosts/b").unwrap().unwrap().value, json!(3));
        assert_eq!(store.get("hosts/c").unwrap(), None);
    }

    #[test]
    fn of_two_creates_of_one_key_exactly_one_wins() {
        let (store, _) = store();
        let create = |value| {
            Txn::raw(
                vec![Condition::Absent("volumes/db1".into())],
                vec![Change::put("volumes/db1", value)],
            )
        };
        store.commit(create(json!("first"))).unwrap();
        assert_eq!(
            store.commit(create(json!("second"))),
            Err(StoreError::Conflict {
                key: "volumes/db1".into()
            })
        );
        assert_eq!(
            store.get("volumes/db1").unwrap().unwrap().value,
            json!("first")
        );
    }

    #[test]
    fn an_update_based_on_a_stale_read_fails_and_changes_nothing() {
        let (store, _) = store();
        let read = store
            .commit(Txn::raw(vec![], vec![Change::put("k", json!(1))]))
            .unwrap();
        let update = |value| {
            Txn::raw(
                vec![Condition::At("k".into(), read)],
                vec![Change::put("k", value), Change::put("other", json!(0))],
            )
        };
        store.commit(update(json!(2))).unwrap();
        assert!(matches!(
            store.commit(update(json!(3))),
            Err(StoreError::Conflict { .. })
        ));
        assert_eq!(store.get("k").unwrap().unwrap().value, json!(2));
        let missing = Txn::raw(vec![Condition::At("gone".into(), read)], vec![]);
        assert!(store.commit(missing).is_err());
    }

    #[test]
    fn leased_entries_end_with_their_lease_unless_kept_alive() {
        let (store, clock) = store();
        let lease = store.grant_lease(Duration::from_secs(5)).unwrap();
        store
            .commit(Txn::raw(
                vec![],
                vec![Change::Put {
                    key: "alive/n1".into(),
                    value: json!({}),
                    lease: Some(lease),
                }],
            ))
            .unwrap();
        clock.advance(Duration::from_secs(4));
        store.keep_alive(lease).unwrap();
        clock.advance(Duration::from_secs(4));
        assert!(store.get("alive/n1").unwrap().is_some(), "kept alive");
        clock.advance(Duration::from_secs(1));
        assert!(store.get("alive/n1").unwrap().is_none(), "expired");
        assert_eq!(
            store.keep_alive(lease),
            Err(StoreError::LeaseExpired { lease: lease.0 })
        );
        let put = Txn::raw(
            vec![],
            vec![Change::Put {
                key: "alive/n1".into(),
                value: json!({}),
                lease: Some(lease),
            }],
        );
        assert!(matches!(
            store.commit(put),
            Err(StoreError::LeaseExpired { .. })
        ));
    }

    #[test]
    fn a_revoked_lease_removes_its_entries_at_once() {
        let (store, _) = store();
        let lease = store.grant_lease(Duration::from_secs(5)).unwrap();
        store
            .commit(Txn::raw(
                vec![],
                vec![Change::Put {
                    key: "controller".into(),
                    value: json!("n1"),
                    lease: Some(lease),
                }],
            ))
            .unwrap();
        store.revoke_lease(lease).unwrap();
        assert!(store.get("controller").unwrap().is_none());
    }

    #[test]
    fn watchers_see_every_change_under_their_prefix_after_a_revision() {
        let (store, clock) = store();
        let before = store
            .commit(Txn::raw(vec![], vec![Change::put("volumes/a", json!(1))]))
            .unwrap();
        store
            .commit(Txn::raw(vec![], vec![Change::put("volumes/b", json!(2))]))
            .unwrap();
        let watch = store.watch("volumes/", before).unwrap();
        let lease = store.grant_lease(Duration::from_secs(1)).unwrap();
        store
            .commit(Txn::raw(
                vec![],
                vec![
                    Change::put("hosts/x", json!(0)),
                    Change::Delete("volumes/a".into()),
                    Change::Put {
                        key: "volumes/c".into(),
                        value: json!(3),
                        lease: Some(lease),
                    },
                ],
            ))
            .unwrap();
        clock.advance(Duration::from_secs(2));
        store.list("").unwrap();
        let events: Vec<String> = watch
            .try_iter()
            .map(|event| match event {
                WatchEvent::Put(entry) => format!("put {} @{}", entry.key, entry.revision),
                WatchEvent::Delete(key, revision) => format!("delete {key} @{revision}"),
                WatchEvent::Lost(why) => format!("lost {why}"),
            })
            .collect();
        assert_eq!(
            events,
            [
                "put volumes/b @2",
                "delete volumes/a @3",
                "put volumes/c @3",
                "delete volumes/c @4"
            ]
        );
    }

    #[test]
    fn a_watch_after_a_forgotten_revision_is_refused() {
        let (store, _) = store();
        for n in 0..HISTORY_MAX + 2 {
            store
                .commit(Txn::raw(vec![], vec![Change::put("k", json!(n))]))
                .unwrap();
        }
        assert_eq!(
            store.watch("k", Revision(1)).unwrap_err(),
            StoreError::Compacted { after: Revision(1) }
        );
        assert!(store.watch("k", Revision(3)).is_ok());
    }
}
