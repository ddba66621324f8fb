//! Leases: entries that live as long as their lease (node liveness, the
//! controller's election).

use super::Harness;
use crate::store::{Change, LeaseId, Store, StoreError, Txn};
use serde_json::json;
use std::time::Duration;

fn leased(key: &str, lease: LeaseId) -> Txn {
    Txn::raw(
        vec![],
        vec![Change::Put {
            key: key.into(),
            value: json!({"node": key}),
            lease: Some(lease),
        }],
    )
}

/// An entry put under a lease says so; revoking the lease removes its
/// entries (and only those) at once, after which the lease can neither be
/// kept alive nor used; revoking it again is no error. A lease that was
/// never granted cannot be used either.
pub fn leases_own_their_entries(harness: &dyn Harness) {
    let store = harness.store();
    let lease = store.grant_lease(harness.lease_ttl()).expect("grant");
    let other = store.grant_lease(harness.lease_ttl()).expect("grant");
    assert_ne!(lease, other);
    let revision = store.commit(leased("alive/n1", lease)).expect("put");
    store.commit(leased("alive/n2", other)).expect("put");
    store
        .commit(Txn::raw(vec![], vec![Change::put("plain", json!(1))]))
        .expect("put");
    let entry = store.get("alive/n1").expect("get").expect("leased entry");
    assert_eq!((entry.lease, entry.revision), (Some(lease), revision));
    store.keep_alive(lease).expect("keep alive");

    // A put without a lease over a leased entry takes it out of the lease.
    store.commit(leased("moved", lease)).expect("put");
    store
        .commit(Txn::raw(vec![], vec![Change::put("moved", json!(2))]))
        .expect("put");
    assert_eq!(store.get("moved").expect("get").expect("moved").lease, None);

    store.revoke_lease(lease).expect("revoke");
    assert_eq!(store.get("alive/n1").expect("get"), None);
    assert!(store.get("alive/n2").expect("get").is_some(), "other lease");
    assert!(store.get("plain").expect("get").is_some(), "not leased");
    assert!(store.get("moved").expect("get").is_some(), "moved out");
    assert_eq!(
        store.keep_alive(lease),
        Err(StoreError::LeaseExpired { lease: lease.0 })
    );
    assert_eq!(
        store.commit(leased("alive/n1", lease)),
        Err(StoreError::LeaseExpired { lease: lease.0 })
    );
    store.revoke_lease(lease).expect("revoking twice");

    let never = LeaseId(0x7eed_0000_0000_0001);
    assert_eq!(
        store.commit(leased("alive/n3", never)),
        Err(StoreError::LeaseExpired { lease: never.0 })
    );
    assert_eq!(
        store.keep_alive(never),
        Err(StoreError::LeaseExpired { lease: never.0 })
    );
    store.revoke_lease(other).expect("revoke");
    assert_eq!(store.list("alive/").expect("list").entries, []);
}

/// A lease kept alive outlives its time to live; one that is not ends
/// within about one time to live of the last keep-alive, taking its
/// entries; a transaction that puts under an ended lease changes nothing.
pub fn leases_expire_unless_kept_alive(harness: &dyn Harness) {
    let store = harness.store();
    let ttl = harness.lease_ttl();
    let lease = store.grant_lease(ttl).expect("grant");
    store.commit(leased("alive/n1", lease)).expect("put");
    harness.advance(ttl / 2);
    store.keep_alive(lease).expect("keep alive");
    // Past the first time to live, within the second.
    harness.advance(ttl * 3 / 4);
    assert!(
        store.get("alive/n1").expect("get").is_some(),
        "kept alive, yet gone"
    );
    wait_until_gone(harness, &*store, "alive/n1", ttl);
    assert_eq!(
        store.keep_alive(lease),
        Err(StoreError::LeaseExpired { lease: lease.0 })
    );
    let mixed = Txn::raw(
        vec![],
        vec![
            Change::put("plain", json!(1)),
            Change::Put {
                key: "alive/n1".into(),
                value: json!({}),
                lease: Some(lease),
            },
        ],
    );
    assert_eq!(
        store.commit(mixed),
        Err(StoreError::LeaseExpired { lease: lease.0 })
    );
    assert_eq!(store.get("plain").expect("get"), None);
}

/// Lets time pass in quarters of `ttl` until `key` is gone; fails if it is
/// still there one and a half time to live after it should have ended
/// (real stores check their leases periodically).
fn wait_until_gone(harness: &dyn Harness, store: &dyn Store, key: &str, ttl: Duration) {
    let step = ttl / 4;
    for _ in 0..6 {
        harness.advance(step);
        if store.get(key).expect("get").is_none() {
            return;
        }
    }
    panic!("{key} outlived its lease");
}
