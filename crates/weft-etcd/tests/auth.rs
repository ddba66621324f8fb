//! The etcd store on a cluster with authentication enabled: a user with a
//! password, a user limited to weft's prefix, and the errors of a wrong
//! password, a missing user and a prefix the user may not touch.

mod support;

use serde_json::json;
use std::time::{Duration, Instant};
use support::Etcd;
use weft_control::{Change, Revision, Store, StoreError, Txn, WatchEvent};
use weft_etcd::EtcdStore;

/// A member with users root (password "rootpw") and weft ("weftpw", read
/// and write under /weft/ only), authentication enabled.
fn secured() -> Etcd {
    let etcd = Etcd::start(1, "auth");
    etcd.etcdctl(&["user", "add", "root:rootpw", "--interactive=false"]);
    etcd.etcdctl(&["user", "add", "weft:weftpw", "--interactive=false"]);
    etcd.etcdctl(&["role", "add", "weft"]);
    etcd.etcdctl(&[
        "role",
        "grant-permission",
        "weft",
        "--prefix=true",
        "readwrite",
        "/weft/",
    ]);
    etcd.etcdctl(&["user", "grant-role", "weft", "weft"]);
    etcd.etcdctl(&["auth", "enable"]);
    etcd
}

fn connect(etcd: &Etcd, prefix: &str, user: Option<(&str, &str)>) -> Result<EtcdStore, StoreError> {
    let mut config = etcd.config(prefix);
    config.user = user.map(|(name, password)| (name.to_string(), password.to_string()));
    EtcdStore::connect(config)
}

fn message(error: StoreError) -> String {
    match error {
        StoreError::Unavailable { .. } => error.to_string(),
        other => panic!("not Unavailable: {other:?}"),
    }
}

#[test]
fn users_with_passwords_and_their_errors() {
    let etcd = secured();

    let store = connect(&etcd, "/weft/", Some(("weft", "weftpw"))).expect("weft connects");
    let lease = store.grant_lease(Duration::from_secs(5)).expect("grant");
    let watch = store.watch("", Revision(0)).expect("watch");
    let revision = store
        .commit(Txn::raw(
            vec![],
            vec![Change::Put {
                key: "alive/n1".into(),
                value: json!(1),
                lease: Some(lease),
            }],
        ))
        .expect("commit");
    assert_eq!(
        store.get("alive/n1").expect("get").map(|e| e.revision),
        Some(revision)
    );
    match watch.recv_timeout(Duration::from_secs(5)) {
        Ok(WatchEvent::Put(entry)) => assert_eq!(entry.key, "alive/n1"),
        other => panic!("unexpected {other:?}"),
    }
    store.keep_alive(lease).expect("keep alive");
    store.revoke_lease(lease).expect("revoke");
    let root = connect(&etcd, "/weft/", Some(("root", "rootpw"))).expect("root connects");
    assert_eq!(root.list("").expect("list").entries, []);

    let started = Instant::now();
    let text = message(connect(&etcd, "/weft/", Some(("weft", "wrong"))).unwrap_err());
    eprintln!("{text}");
    assert!(
        text.contains("refused user \"weft\"") && text.contains("wrong user name or password"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(1), "not retried");

    let text = message(connect(&etcd, "/weft/", None).unwrap_err());
    eprintln!("{text}");
    assert!(text.contains("requires a user and password"), "{text}");

    let text = message(connect(&etcd, "/other/", Some(("weft", "weftpw"))).unwrap_err());
    eprintln!("{text}");
    assert!(
        text.contains("may not read or write the keys under /other/"),
        "{text}"
    );
}
