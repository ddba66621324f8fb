//! Entries, revisions and transactions: reads, listings, compare-and-swap
//! and atomicity. Leases and watches have their own files.

use super::{put, Harness};
use crate::store::{Change, Condition, Entry, Revision, StoreError, Txn};
use serde_json::json;

/// Every commit has a new, higher revision that its entries keep; a
/// listing is every entry under a prefix (and nothing else), in key order,
/// with the revision it was read at; keys come back as they were given.
pub fn revisions_and_listings(harness: &dyn Harness) {
    let store = harness.store();
    assert_eq!(store.get("hosts/a").expect("get"), None);
    let empty = store.list("hosts/").expect("list");
    assert!(empty.entries.is_empty(), "{empty:?}");

    let first = put(
        &*store,
        &[
            ("hosts/b", json!({"nqn": "b"})),
            ("hosts/a", json!("a")),
            ("hostsx", json!(0)),
            ("pools/p", json!([1, 2])),
        ],
    );
    let second = put(&*store, &[("hosts/b", json!({"nqn": "b2"}))]);
    assert!(second > first, "{second} after {first}");

    assert_eq!(
        store.get("hosts/b").expect("get"),
        Some(Entry {
            key: "hosts/b".into(),
            value: json!({"nqn": "b2"}),
            revision: second,
            lease: None,
        })
    );
    let listing = store.list("hosts/").expect("list");
    assert_eq!(listing.revision, second);
    let listed: Vec<(&str, Revision)> = listing
        .entries
        .iter()
        .map(|entry| (entry.key.as_str(), entry.revision))
        .collect();
    assert_eq!(listed, [("hosts/a", first), ("hosts/b", second)]);
    assert_eq!(listing.entries[0].value, json!("a"));
    // A visit shows what a listing holds, in the same order.
    let mut visited = Vec::new();
    let revision = store
        .visit("hosts/", &mut |entry| visited.push(entry.clone()))
        .expect("visit");
    assert_eq!((visited, revision), (listing.entries.clone(), second));

    let all = store.list("").expect("list everything");
    let keys: Vec<&str> = all.entries.iter().map(|entry| entry.key.as_str()).collect();
    assert_eq!(keys, ["hosts/a", "hosts/b", "hostsx", "pools/p"]);
    assert_eq!(all.revision, second);
}

/// Of two creates of one key (condition: absent), exactly one wins, also
/// when they race from several threads; the loser learns which key.
pub fn of_racing_creates_one_wins(harness: &dyn Harness) {
    let store = harness.store();
    let create = |value| {
        Txn::raw(
            vec![Condition::Absent("volumes/db1".into())],
            vec![Change::put("volumes/db1", value)],
        )
    };
    store.commit(create(json!("first"))).expect("create");
    assert_eq!(
        store.commit(create(json!("second"))),
        Err(StoreError::Conflict {
            key: "volumes/db1".into()
        })
    );
    assert_eq!(
        store.get("volumes/db1").expect("get").map(|e| e.value),
        Some(json!("first"))
    );

    let racers = 6;
    let store = &*store;
    let won: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..racers)
            .map(|n| {
                scope.spawn(move || {
                    let txn = Txn::raw(
                        vec![Condition::Absent("volumes/race".into())],
                        vec![Change::put("volumes/race", json!(n))],
                    );
                    match store.commit(txn) {
                        Ok(_) => Some(n),
                        Err(StoreError::Conflict { key }) => {
                            assert_eq!(key, "volumes/race");
                            None
                        }
                        Err(error) => panic!("racing create {n}: {error}"),
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .filter_map(|thread| thread.join().expect("racer"))
            .collect()
    });
    assert_eq!(won.len(), 1, "winners: {won:?}");
    assert_eq!(
        store.get("volumes/race").expect("get").map(|e| e.value),
        Some(json!(won[0]))
    );
}

/// An update based on a stale read (condition: unchanged since a revision)
/// fails and changes nothing; so does one on a key that is gone; the
/// conflict names the first condition, in order, that does not hold.
pub fn stale_conditions_conflict(harness: &dyn Harness) {
    let store = harness.store();
    let read = put(&*store, &[("k", json!(1)), ("other", json!(0))]);
    let update = |value: serde_json::Value| {
        Txn::raw(
            vec![Condition::At("k".into(), read)],
            vec![Change::put("k", value.clone()), Change::put("other", value)],
        )
    };
    let updated = store.commit(update(json!(2))).expect("first update");
    assert_eq!(
        store.commit(update(json!(3))),
        Err(StoreError::Conflict { key: "k".into() })
    );
    let k = store.get("k").expect("get").expect("k");
    assert_eq!((k.value, k.revision), (json!(2), updated));
    assert_eq!(
        store.get("other").expect("get").map(|e| e.value),
        Some(json!(2))
    );

    let missing = Txn::raw(
        vec![Condition::At("gone".into(), read)],
        vec![Change::put("k", json!(4))],
    );
    assert_eq!(
        store.commit(missing),
        Err(StoreError::Conflict { key: "gone".into() })
    );

    let several = Txn::raw(
        vec![
            Condition::At("k".into(), updated),
            Condition::Absent("other".into()),
            Condition::At("k2".into(), read),
        ],
        vec![Change::put("k", json!(5))],
    );
    assert_eq!(
        store.commit(several),
        Err(StoreError::Conflict {
            key: "other".into()
        })
    );
    let holding = Txn::raw(
        vec![
            Condition::At("k".into(), updated),
            Condition::Absent("k2".into()),
        ],
        vec![Change::put("k", json!(6))],
    );
    let last = store.commit(holding).expect("conditions hold");
    assert!(last > updated);
    assert_eq!(
        store.get("k").expect("get").map(|e| e.value),
        Some(json!(6))
    );
}

/// A delete removes the key (a later create of it succeeds); deleting a
/// key that is absent is no error.
pub fn deletes(harness: &dyn Harness) {
    let store = harness.store();
    put(&*store, &[("hosts/a", json!(1)), ("hosts/b", json!(2))]);
    store
        .commit(Txn::raw(vec![], vec![Change::Delete("hosts/a".into())]))
        .expect("delete");
    assert_eq!(store.get("hosts/a").expect("get"), None);
    let keys: Vec<String> = store
        .list("hosts/")
        .expect("list")
        .entries
        .into_iter()
        .map(|entry| entry.key)
        .collect();
    assert_eq!(keys, ["hosts/b"]);
    store
        .commit(Txn::raw(vec![], vec![Change::Delete("hosts/never".into())]))
        .expect("deleting an absent key");
    let recreate = Txn::raw(
        vec![Condition::Absent("hosts/a".into())],
        vec![Change::put("hosts/a", json!(3))],
    );
    let revision = store.commit(recreate).expect("create after delete");
    assert_eq!(
        store.get("hosts/a").expect("get").map(|e| e.revision),
        Some(revision)
    );
}

/// A transaction's changes are applied all at one revision, in order
/// (the last change of a key wins), or none at all.
pub fn transactions_are_atomic(harness: &dyn Harness) {
    let store = harness.store();
    put(&*store, &[("a", json!(0)), ("gone", json!(0))]);
    let revision = store
        .commit(Txn::raw(
            vec![],
            vec![
                Change::put("a", json!(1)),
                Change::put("b", json!(1)),
                Change::Delete("gone".into()),
                Change::put("c", json!("first")),
                Change::put("c", json!("last")),
            ],
        ))
        .expect("commit");
    let listing = store.list("").expect("list");
    let state: Vec<(&str, &serde_json::Value, Revision)> = listing
        .entries
        .iter()
        .map(|entry| (entry.key.as_str(), &entry.value, entry.revision))
        .collect();
    assert_eq!(
        state,
        [
            ("a", &json!(1), revision),
            ("b", &json!(1), revision),
            ("c", &json!("last"), revision)
        ]
    );

    let failing = Txn::raw(
        vec![Condition::Absent("a".into())],
        vec![Change::put("d", json!(1)), Change::Delete("b".into())],
    );
    assert!(matches!(
        store.commit(failing),
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(store.list("").expect("list").entries, listing.entries);
}
