//! Watches: every change under a prefix after a revision, in order, and
//! the refusal to watch after history the store no longer keeps.

use super::{describe, next_events, put, Harness, EVENT_WAIT};
use crate::store::{Change, Revision, StoreError, Txn};
use serde_json::json;
use std::time::Duration;

/// A watch delivers, in order, every change under its prefix after its
/// revision: those already made when it starts, then later ones, each
/// with the revision of its commit; changes elsewhere are not delivered.
pub fn watch_follows_a_prefix(harness: &dyn Harness) {
    let store = harness.store();
    let before = put(&*store, &[("volumes/a", json!(1))]);
    let made = put(&*store, &[("volumes/b", json!(2)), ("hosts/h", json!(0))]);
    let watch = store.watch("volumes/", before).expect("watch");
    assert_eq!(
        next_events(&watch, 1),
        [format!("put volumes/b @{made} = 2")]
    );

    let later = store
        .commit(Txn::raw(
            vec![],
            vec![
                Change::put("hosts/x", json!(0)),
                Change::Delete("volumes/a".into()),
                Change::put("volumes/c", json!({"size": 3})),
                Change::put("volumesx", json!(0)),
            ],
        ))
        .expect("commit");
    let deleted = store
        .commit(Txn::raw(vec![], vec![Change::Delete("volumes/b".into())]))
        .expect("delete");
    // Deleting what is absent is no change to watch.
    store
        .commit(Txn::raw(
            vec![],
            vec![Change::Delete("volumes/never".into())],
        ))
        .expect("delete");
    let last = put(&*store, &[("volumes/last", json!(true))]);
    assert_eq!(
        next_events(&watch, 4),
        [
            format!("delete volumes/a @{later}"),
            format!(r#"put volumes/c @{later} = {{"size":3}}"#),
            format!("delete volumes/b @{deleted}"),
            format!("put volumes/last @{last} = true"),
        ]
    );
    assert!(last > deleted && deleted > later && later > made);

    // A second watch of everything after the first commit sees it all.
    let everything = store.watch("", Revision(before.0 - 1)).expect("watch");
    let seen = next_events(&everything, 9);
    assert_eq!(seen[0], format!("put volumes/a @{before} = 1"));
    assert_eq!(seen[8], format!("put volumes/last @{last} = true"));
}

/// The end of a lease is delivered as the deletion of its entries.
pub fn watch_sees_lease_deletions(harness: &dyn Harness) {
    let store = harness.store();
    let lease = store.grant_lease(harness.lease_ttl()).expect("grant");
    let put = store
        .commit(Txn::raw(
            vec![],
            vec![Change::Put {
                key: "alive/n1".into(),
                value: json!("n1"),
                lease: Some(lease),
            }],
        ))
        .expect("put");
    let watch = store.watch("alive/", put).expect("watch");
    store.revoke_lease(lease).expect("revoke");
    let event = watch.recv_timeout(EVENT_WAIT).expect("deletion");
    let revision = store.list("alive/").expect("list").revision;
    assert_eq!(describe(&event), format!("delete alive/n1 @{revision}"));
    assert!(revision > put);
}

/// A watch after a revision whose changes the store has forgotten is
/// refused with [`StoreError::Compacted`] (list again, then watch after
/// the listing); a watch after the current revision works.
pub fn watch_after_compaction_is_refused(harness: &dyn Harness) {
    let store = harness.store();
    let early = put(&*store, &[("k/a", json!(1))]);
    put(&*store, &[("k/a", json!(2))]);
    harness.compact(&*store);
    assert_eq!(
        store
            .watch("k/", early)
            .expect_err("watch after forgotten changes"),
        StoreError::Compacted { after: early }
    );
    let listing = store.list("k/").expect("list");
    let watch = store.watch("k/", listing.revision).expect("watch");
    let next = put(&*store, &[("k/a", json!(3))]);
    assert_eq!(next_events(&watch, 1), [format!("put k/a @{next} = 3")]);
    assert!(watch.recv_timeout(Duration::from_millis(50)).is_err());
}
