//! The etcd store when members fail: unreachable endpoints, a stopped
//! member of three, the whole cluster down and back.

mod support;

use serde_json::json;
use std::net::TcpListener;
use std::time::{Duration, Instant};
use support::{free_port, Etcd};
use weft_control::{Change, Store, StoreError, Txn, WatchEvent};
use weft_etcd::{EtcdConfig, EtcdStore};

fn put(key: &str, value: serde_json::Value) -> Txn {
    Txn::raw(vec![], vec![Change::put(key, value)])
}

/// Asserts `error` says the cluster store is unreachable and names
/// `endpoint`.
fn assert_unreachable(error: &StoreError, endpoint: &str) {
    let text = error.to_string();
    assert!(
        matches!(error, StoreError::Unavailable { .. }),
        "not Unavailable: {error:?}"
    );
    assert!(text.contains("the cluster store is unreachable"), "{text}");
    assert!(text.contains(endpoint), "{text}");
}

#[test]
fn connecting_to_a_dead_endpoint_fails_within_the_timeout_naming_it() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let config = EtcdConfig::new(vec![endpoint.clone()]);
    let started = Instant::now();
    let error = EtcdStore::connect(config).expect_err("nothing listens there");
    let took = started.elapsed();
    assert!(took <= Duration::from_millis(5500), "took {took:?}");
    assert_unreachable(&error, &endpoint);
    assert!(error.to_string().contains("Connection refused"), "{error}");
}

#[test]
fn an_endpoint_that_never_answers_times_out() {
    // Connections complete into the listener's backlog; nothing answers.
    let silent = TcpListener::bind("127.0.0.1:0").expect("listen");
    let endpoint = format!("http://{}", silent.local_addr().expect("address"));
    let mut config = EtcdConfig::new(vec![endpoint.clone()]);
    config.request_timeout = Duration::from_secs(1);
    let started = Instant::now();
    let error = EtcdStore::connect(config).expect_err("nothing answers");
    let took = started.elapsed();
    assert!(took <= Duration::from_millis(1500), "took {took:?}");
    assert_unreachable(&error, &endpoint);
    assert!(error.to_string().contains("no answer within 1s"), "{error}");
}

#[test]
fn three_members_survive_one_and_come_back_after_all() {
    let mut etcd = Etcd::start(3, "three");
    let store = etcd.store("/weft/");
    let timeout = etcd.config("/weft/").request_timeout;
    store.commit(put("a", json!(1))).expect("commit");

    // One member down (perhaps the leader): reads and commits go on.
    etcd.stop(0);
    // Commits in flight while etcd elects a new leader (if it stopped the
    // leader) may time out: etcd drops proposals sent to a dead leader.
    etcd.wait_healthy();
    for n in 0..5 {
        let started = Instant::now();
        store
            .commit(put("a", json!(n)))
            .expect("commit with a member down");
        assert_eq!(
            store.get("a").expect("get").map(|e| e.value),
            Some(json!(n))
        );
        assert!(started.elapsed() < timeout, "took {:?}", started.elapsed());
    }
    let listing = store.list("").expect("list");
    let watch = store.watch("", listing.revision).expect("watch");
    let changed = store.commit(put("b", json!(1))).expect("commit");
    match watch.recv_timeout(Duration::from_secs(5)).expect("event") {
        WatchEvent::Put(entry) => assert_eq!((entry.key.as_str(), entry.revision), ("b", changed)),
        other => panic!("unexpected {other:?}"),
    }

    // Every member down: requests fail within the timeout, the watch is lost.
    etcd.stop(1);
    etcd.stop(2);
    let started = Instant::now();
    let error = store
        .commit(put("c", json!(1)))
        .expect_err("nobody to commit to");
    let took = started.elapsed();
    assert!(
        took <= timeout + Duration::from_millis(500),
        "took {took:?}"
    );
    assert_unreachable(&error, &etcd.endpoints()[0]);
    let error = store.get("a").expect_err("nobody to read from");
    assert_unreachable(&error, &etcd.endpoints()[2]);
    match watch.recv_timeout(Duration::from_secs(5)) {
        Ok(WatchEvent::Lost(why)) => assert!(!why.is_empty()),
        other => panic!("the watch should be lost, got {other:?}"),
    }
    assert!(
        watch.recv_timeout(Duration::from_secs(1)).is_err(),
        "a lost watch ends"
    );

    // Back: the same store works again.
    etcd.restart();
    let revision = store
        .commit(put("c", json!(2)))
        .expect("commit after restart");
    assert_eq!(
        store.get("c").expect("get").map(|e| e.revision),
        Some(revision)
    );
    let watch = store.watch("", revision).expect("watch after restart");
    store.commit(put("d", json!(1))).expect("commit");
    assert!(matches!(
        watch.recv_timeout(Duration::from_secs(5)),
        Ok(WatchEvent::Put(_))
    ));
}
