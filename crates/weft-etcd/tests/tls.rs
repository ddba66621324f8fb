//! The etcd store over TLS: a member that requires client certificates,
//! reached with the CA and a client certificate, and refused without.

mod support;

use serde_json::json;
use std::time::Duration;
use support::Etcd;
use weft_control::{Change, Revision, Store, StoreError, Txn, WatchEvent};
use weft_etcd::{EtcdStore, EtcdTls};

#[test]
fn a_client_certificate_reaches_a_tls_member_and_nothing_less_does() {
    let etcd = Etcd::start_tls("tls");
    assert!(etcd.endpoints()[0].starts_with("https://"));

    let store = EtcdStore::connect(etcd.config("/weft/")).expect("connect over TLS");
    let watch = store.watch("", Revision(0)).expect("watch");
    let revision = store
        .commit(Txn::raw(vec![], vec![Change::put("hosts/a", json!("a"))]))
        .expect("commit");
    assert_eq!(
        store.get("hosts/a").expect("get").map(|e| e.revision),
        Some(revision)
    );
    assert!(matches!(
        watch.recv_timeout(Duration::from_secs(5)),
        Ok(WatchEvent::Put(_))
    ));

    // Without a client certificate, the member ends the handshake.
    let mut config = etcd.config("/weft/");
    config.request_timeout = Duration::from_secs(1);
    config.tls = Some(EtcdTls {
        ca: etcd.certificates().ca.clone(),
        cert: None,
        key: None,
    });
    let error = EtcdStore::connect(config.clone()).expect_err("no client certificate");
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    eprintln!("{error}");

    // A CA that did not sign the member's certificate is not trusted.
    let mut untrusting = config.clone();
    untrusting.tls = Some(EtcdTls {
        ca: etcd.certificates().client.0.clone(),
        ..etcd.certificates().client_tls()
    });
    let text = EtcdStore::connect(untrusting)
        .expect_err("untrusted member")
        .to_string();
    eprintln!("{text}");
    assert!(
        text.contains("TLS with etcd at https://127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains("UnknownIssuer"), "{text}");

    // Missing files are named.
    let mut missing = config;
    missing.tls = Some(EtcdTls {
        ca: etcd.dir().join("nowhere.pem"),
        cert: None,
        key: None,
    });
    let text = EtcdStore::connect(missing)
        .expect_err("no CA file")
        .to_string();
    assert!(
        text.contains("cannot read the etcd CA certificate") && text.contains("nowhere.pem"),
        "{text}"
    );
}
