//! [`Mirror`]: a local copy of a remote store (etcd) that the node reads
//! from, so that nothing a node does on its own (building exports, serving
//! a slow-path write, answering `volume list`) waits on the network or
//! fails while the cluster store is unreachable. Writes, leases and watches
//! go to the remote store; a write that succeeds is applied to the copy at
//! once (a node reads its own writes), and a thread follows the remote
//! store's changes. When the remote store is lost, the copy keeps serving
//! what it last saw and the thread lists again once the store is back.
//!
//! While the follower knows the remote store is lost (its watch broke and
//! it cannot list or watch again), writes fail at once rather than after
//! the remote store's timeout: a node's volume manager commits from the
//! thread that also serves the data plane's slow path, which must not wait
//! on an unreachable store more than once.
//!
//! Readers may see other nodes' changes a moment late; every decision that
//! must not act on stale records is a transaction with conditions on their
//! revisions, checked by the remote store.

use crate::store::{Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Wait between attempts to reach a lost store.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Copy {
    entries: BTreeMap<String, Entry>,
    /// Keys this node deleted ahead of the watch, with the deletion's
    /// revision: an older put the watch delivers late must not bring them
    /// back. Forgotten once the watch has gone past them.
    deleted: BTreeMap<String, Revision>,
    revision: Revision,
    /// Told the key of every change applied (and "" after a new listing).
    subscribers: Vec<Sender<String>>,
}

impl Copy {
    fn apply(&mut self, event: WatchEvent) {
        let (key, revision) = match event {
            WatchEvent::Put(entry) => {
                let key = entry.key.clone();
                let revision = entry.revision;
                let newer = self
                    .entries
                    .get(&key)
                    .map(|old| old.revision)
                    .or(self.deleted.get(&key).copied())
                    .is_none_or(|old| old < revision);
                if newer {
                    self.entries.insert(key.clone(), entry);
                }
                (key, revision)
            }
            WatchEvent::Delete(key, revision) => {
                if self
                    .entries
                    .get(&key)
                    .is_some_and(|old| old.revision < revision)
                {
                    self.entries.remove(&key);
                    self.deleted.insert(key.clone(), revision);
                }
                (key, revision)
            }
            WatchEvent::Lost(_) => unreachable!("handled by the follower"),
        };
        self.revision = self.revision.max(revision);
        self.notify(&key);
    }

    /// The watch has delivered every change up to `revision`.
    fn followed(&mut self, revision: Revision) {
        self.deleted.retain(|_, deleted| *deleted > revision);
    }

    fn replace(&mut self, listing: Listing) {
        self.deleted.clear();
        self.entries = listing
            .entries
            .into_iter()
            .map(|entry| (entry.key.clone(), entry))
            .collect();
        self.revision = listing.revision;
        self.notify("");
    }

    fn notify(&mut self, key: &str) {
        self.subscribers
            .retain(|subscriber| subscriber.send(key.to_string()).is_ok());
    }
}

/// A local copy of a remote store.
pub struct Mirror {
    remote: Arc<dyn Store>,
    copy: Arc<Mutex<Copy>>,
    stop: Arc<AtomicBool>,
    /// Whether the follower knows the remote store is unreachable.
    lost: Arc<AtomicBool>,
}

impl std::fmt::Debug for Mirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mirror")
            .field("remote", &self.remote.location())
            .finish_non_exhaustive()
    }
}

impl Mirror {
    /// Copies everything `remote` holds and follows its changes; fails if
    /// `remote` cannot be read now.
    pub fn open(remote: Arc<dyn Store>) -> Result<Mirror, StoreError> {
        let listing = remote.list("")?;
        let after = listing.revision;
        let mut copy = Copy::default();
        copy.replace(listing);
        let copy = Arc::new(Mutex::new(copy));
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let follower = Follower {
            remote: Arc::clone(&remote),
            copy: Arc::clone(&copy),
            stop: Arc::clone(&stop),
            lost: Arc::clone(&lost),
        };
        std::thread::Builder::new()
            .name("store-mirror".into())
            .spawn(move || follower.run(after))
            .map_err(|error| StoreError::Unavailable {
                location: remote.location(),
                message: format!("cannot start the mirror's thread: {error}"),
            })?;
        Ok(Mirror {
            remote,
            copy,
            stop,
            lost,
        })
    }

    /// The key of every change the copy takes from now on ("" when it was
    /// listed again whole): a node's reconcilers wake up on it.
    pub fn subscribe(&self) -> Receiver<String> {
        let (sender, receiver) = mpsc::channel();
        self.copy
            .lock()
            .expect("mirror lock")
            .subscribers
            .push(sender);
        receiver
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The thread that follows the remote store.
struct Follower {
    remote: Arc<dyn Store>,
    copy: Arc<Mutex<Copy>>,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl Follower {
    fn run(self, mut after: Revision) {
        let mut lost = false;
        while !self.stop.load(Ordering::Relaxed) {
            match self.remote.watch("", after) {
                Ok(events) => {
                    self.lost.store(false, Ordering::Relaxed);
                    if lost {
                        log::info!(
                            "the cluster store {} is reachable again",
                            self.remote.location()
                        );
                        lost = false;
                    }
                    self.follow(&events);
                }
                Err(StoreError::Compacted { .. }) => {}
                Err(error) => {
                    self.lost.store(true, Ordering::Relaxed);
                    if !lost {
                        log::warn!("{error}; volumes keep serving from the last known state, changes wait until it is back");
                        lost = true;
                    }
                    std::thread::sleep(RETRY);
                    continue;
                }
            }
            // The watch ended: changes may have been missed; list again.
            match self.remote.list("") {
                Ok(listing) => {
                    after = listing.revision;
                    self.copy.lock().expect("mirror lock").replace(listing);
                }
                Err(_) => {
                    self.lost.store(true, Ordering::Relaxed);
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// Applies events until the watch ends or the mirror is dropped.
    fn follow(&self, events: &Receiver<WatchEvent>) {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            match events.recv_timeout(RETRY) {
                Ok(WatchEvent::Lost(why)) => {
                    log::warn!("following the cluster store: {why}; listing it again");
                    return;
                }
                Ok(event) => {
                    let revision = match &event {
                        WatchEvent::Put(entry) => entry.revision,
                        WatchEvent::Delete(_, revision) => *revision,
                        WatchEvent::Lost(_) => unreachable!("matched above"),
                    };
                    let mut copy = self.copy.lock().expect("mirror lock");
                    copy.apply(event);
                    copy.followed(revision);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

impl Store for Mirror {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self
            .copy
            .lock()
            .expect("mirror lock")
            .entries
            .get(key)
            .cloned())
    }

    fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        let copy = self.copy.lock().expect("mirror lock");
        Ok(Listing {
            entries: copy
                .entries
                .range(prefix.to_string()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(_, entry)| entry.clone())
                .collect(),
            revision: copy.revision,
        })
    }

    fn visit(&self, prefix: &str, visit: &mut dyn FnMut(&Entry)) -> Result<Revision, StoreError> {
        let copy = self.copy.lock().expect("mirror lock");
        copy.entries
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .for_each(|(_, entry)| visit(entry));
        Ok(copy.revision)
    }

    fn commit(&self, txn: Txn) -> Result<Revision, StoreError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(StoreError::Unavailable {
                location: self.remote.location(),
                message: "the cluster store is unreachable (this node lost it and retries every second); the change was not made".into(),
            });
        }
        let changes = txn.changes().to_vec();
        let revision = self.remote.commit(txn)?;
        let mut copy = self.copy.lock().expect("mirror lock");
        for change in changes {
            let event = match change {
                crate::store::Change::Put { key, value, lease } => WatchEvent::Put(Entry {
                    key,
                    value,
                    revision,
                    lease,
                }),
                crate::store::Change::Delete(key) => WatchEvent::Delete(key, revision),
            };
            copy.apply(event);
        }
        Ok(revision)
    }

    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.remote.grant_lease(ttl)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.remote.keep_alive(lease)
    }

    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.remote.revoke_lease(lease)
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError> {
        self.remote.watch(prefix, after)
    }

    fn location(&self) -> String {
        self.remote.location()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intercept::{Call, Hook, Intercepted};
    use crate::store::Change;
    use crate::MemoryStore;
    use serde_json::json;
    use std::time::Instant;

    /// A store that can be made unreachable (its leases stay reachable).
    struct Down(AtomicBool);

    impl Hook for Down {
        fn before(&self, call: Call, _inner: &Arc<dyn Store>) -> Result<(), StoreError> {
            let leases = matches!(call, Call::GrantLease | Call::KeepAlive | Call::RevokeLease);
            if self.0.load(Ordering::SeqCst) && !leases {
                return Err(StoreError::Unavailable {
                    location: "flaky".into(),
                    message: "down".into(),
                });
            }
            Ok(())
        }
    }

    fn put(key: &str, value: serde_json::Value) -> Txn {
        Txn::raw(vec![], vec![Change::put(key, value)])
    }

    /// Waits (up to 5 s) until `check` holds.
    fn eventually(what: &str, check: impl Fn() -> bool) {
        let start = Instant::now();
        while !check() {
            assert!(start.elapsed() < Duration::from_secs(5), "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn reads_come_from_the_copy_which_follows_other_writers() {
        let remote = Arc::new(MemoryStore::default());
        remote.commit(put("hosts/a", json!(1))).unwrap();
        let mirror = Mirror::open(remote.clone()).unwrap();
        let changes = mirror.subscribe();
        assert_eq!(mirror.get("hosts/a").unwrap().unwrap().value, json!(1));
        mirror.commit(put("hosts/b", json!(2))).unwrap();
        assert!(
            mirror.get("hosts/b").unwrap().is_some(),
            "reads its own write"
        );
        assert_eq!(remote.get("hosts/b").unwrap().unwrap().value, json!(2));
        // Another node's writes arrive through the watch.
        remote.commit(put("hosts/c", json!(3))).unwrap();
        remote
            .commit(Txn::raw(vec![], vec![Change::Delete("hosts/a".into())]))
            .unwrap();
        eventually("the other writes arrive", || {
            mirror.list("hosts/").unwrap().entries.len() == 2
                && mirror.get("hosts/c").unwrap().is_some()
        });
        let keys: Vec<String> = changes.try_iter().collect();
        assert!(keys.contains(&"hosts/c".to_string()), "{keys:?}");
    }

    #[test]
    fn the_copy_serves_while_the_remote_is_lost_and_catches_up_after() {
        let remote = Arc::new(Intercepted::new(
            Arc::new(MemoryStore::default()),
            Down(AtomicBool::new(false)),
        ));
        remote
            .commit(put("volumes/db1", json!({"hosts": []})))
            .unwrap();
        let mirror = Mirror::open(remote.clone()).unwrap();
        remote.hook().0.store(true, Ordering::SeqCst);
        assert!(mirror.get("volumes/db1").unwrap().is_some());
        let refused = mirror.commit(put("volumes/db2", json!({}))).unwrap_err();
        assert!(matches!(refused, StoreError::Unavailable { .. }));
        assert!(
            mirror.get("volumes/db2").unwrap().is_none(),
            "a failed write is not applied"
        );
        // Changes made while the mirror could not follow (its watch sees
        // them, or its next listing does).
        remote
            .inner()
            .commit(put("volumes/db3", json!({})))
            .unwrap();
        remote.hook().0.store(false, Ordering::SeqCst);
        eventually("caught up", || mirror.get("volumes/db3").unwrap().is_some());
    }

    #[test]
    fn late_events_never_undo_newer_state() {
        let mut copy = Copy::default();
        let entry = |revision| Entry {
            key: "k".into(),
            value: json!(revision),
            revision: Revision(revision),
            lease: None,
        };
        copy.apply(WatchEvent::Put(entry(5)));
        copy.apply(WatchEvent::Put(entry(4)));
        copy.apply(WatchEvent::Delete("k".into(), Revision(3)));
        assert_eq!(copy.entries["k"].revision, Revision(5));
        copy.apply(WatchEvent::Delete("k".into(), Revision(6)));
        assert!(copy.entries.is_empty());
        copy.apply(WatchEvent::Put(entry(5)));
        assert!(copy.entries.is_empty(), "a late put after our delete");
        copy.followed(Revision(6));
        assert!(copy.deleted.is_empty());
        copy.apply(WatchEvent::Put(entry(7)));
        assert_eq!(copy.entries["k"].revision, Revision(7));
    }
}
