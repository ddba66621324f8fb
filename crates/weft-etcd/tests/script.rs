//! harness/etcd.sh, which later cluster tests and the guide use, starts
//! members a store can use and stops them.

mod support;

use serde_json::json;
use std::path::Path;
use std::process::Command;
use support::{binary, free_port};
use weft_control::{Change, Store, Txn};
use weft_etcd::{EtcdConfig, EtcdStore};

fn script(args: &[&str], base: u16) -> std::process::Output {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../harness/etcd.sh");
    Command::new(path)
        .args(args)
        .env("WEFT_ETCD_PORT_BASE", base.to_string())
        .output()
        .expect("run harness/etcd.sh")
}

#[test]
fn the_etcd_script_starts_members_a_store_can_use_and_stops_them() {
    binary("etcd"); // Says to run harness/deps.sh when missing.
    let dir = std::env::temp_dir().join(format!("weft-etcd-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Two consecutive ports free a moment ago (the script refuses busy ones).
    let base = (0..50)
        .map(|_| free_port())
        .find(|port| {
            *port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok()
        })
        .expect("two free ports");
    let dir_arg = dir.to_str().expect("UTF-8 path");

    let started = script(&["start", "1", dir_arg], base);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    let urls = String::from_utf8(started.stdout).expect("UTF-8");
    assert_eq!(urls.trim(), format!("http://127.0.0.1:{base}"));

    let endpoints = urls.trim().split(',').map(str::to_string).collect();
    let store = EtcdStore::connect(EtcdConfig::new(endpoints)).expect("connect");
    store
        .commit(Txn::raw(vec![], vec![Change::put("k", json!(1))]))
        .expect("commit");
    drop(store);

    let stopped = script(&["stop", dir_arg], base);
    assert!(stopped.status.success());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", base)).is_err(),
        "stopped"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
