//! weft-control's store conformance suite against a real etcd member, and
//! what only a real store can show about watches.

mod support;

use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use support::{eventually, Etcd};
use weft_control::conformance::{run_all, Harness};
use weft_control::{Change, Revision, Store, Txn};

/// Fresh stores are fresh prefixes of one member; time is real.
struct EtcdHarness {
    etcd: Etcd,
    stores: AtomicUsize,
}

impl Harness for EtcdHarness {
    fn store(&self) -> Box<dyn Store> {
        let n = self.stores.fetch_add(1, Ordering::SeqCst);
        Box::new(self.etcd.store(&format!("/conformance-{n}/")))
    }

    fn lease_ttl(&self) -> Duration {
        // Whole seconds, and etcd checks for ended leases every 500 ms.
        Duration::from_secs(2)
    }

    fn advance(&self, by: Duration) {
        std::thread::sleep(by);
    }

    fn compact(&self, store: &dyn Store) {
        // etcd keeps the changes of the revision it compacts at: make one
        // more (and leave no key behind), so that every earlier change is
        // forgotten.
        store
            .commit(Txn::raw(vec![], vec![Change::put("compaction", json!(0))]))
            .expect("commit");
        let revision = store
            .commit(Txn::raw(vec![], vec![Change::Delete("compaction".into())]))
            .expect("commit");
        self.etcd
            .etcdctl(&["compact", &revision.to_string(), "--physical"]);
    }
}

#[test]
fn the_etcd_store_conforms() {
    let harness = EtcdHarness {
        etcd: Etcd::start(1, "conformance"),
        stores: AtomicUsize::new(0),
    };
    run_all(&harness);
}

#[test]
fn a_watch_ends_after_its_receiver_is_dropped() {
    let etcd = Etcd::start(1, "watch-drop");
    let store = etcd.store("/weft/");
    let watch = store.watch("volumes/", Revision(0)).expect("watch");
    let other = store.watch("hosts/", Revision(0)).expect("watch");
    assert_eq!(store.watches(), 2);
    drop(watch);
    store
        .commit(Txn::raw(vec![], vec![Change::put("volumes/a", json!(1))]))
        .expect("commit");
    eventually("the dropped watch ends", Duration::from_secs(5), || {
        store.watches() == 1
    });
    drop(other);
    drop(store);
}

#[test]
fn keys_live_under_the_prefix_in_etcd() {
    let etcd = Etcd::start(1, "prefix");
    let store = etcd.store("/weft/");
    let neighbour = etcd.store("/other/");
    store
        .commit(Txn::raw(
            vec![],
            vec![Change::put("volumes/db1", json!({"size": 1}))],
        ))
        .expect("commit");
    assert_eq!(
        etcd.etcdctl(&["get", "/weft/volumes/db1", "--print-value-only"])
            .trim(),
        r#"{"size":1}"#
    );
    assert_eq!(neighbour.list("").expect("list").entries, []);
    assert!(store.location().contains(&etcd.endpoints()[0]));
}

#[test]
fn long_listings_are_read_in_pages_of_one_revision() {
    let etcd = Etcd::start(1, "pages");
    let store = etcd.store("/weft/");
    // etcd takes at most 128 changes per transaction.
    for chunk in 0..5 {
        let changes = (0..120)
            .map(|n| Change::put(format!("volumes/v{:04}", chunk * 120 + n), json!(n)))
            .collect();
        store.commit(Txn::raw(vec![], changes)).expect("commit");
    }
    let last = store
        .commit(Txn::raw(vec![], vec![Change::put("volumesx", json!(0))]))
        .expect("commit");
    let listing = store.list("volumes/").expect("list");
    assert_eq!(listing.revision, last);
    let keys: Vec<String> = listing.entries.into_iter().map(|e| e.key).collect();
    let expected: Vec<String> = (0..600).map(|n| format!("volumes/v{n:04}")).collect();
    assert_eq!(keys, expected);
}
