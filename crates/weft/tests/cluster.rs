//! A cluster of real processes: etcd (three members, Debian's etcd-server)
//! and three `weft serve` nodes on loopback. Pools and volumes are made
//! and changed through any node's API and served by the node that holds
//! them; two nodes creating one name at once: one wins; a node killed is
//! shown down within its lease and comes back as itself; one etcd member
//! lost changes nothing; all lost: I/O goes on and changes are refused with
//! 503 until etcd is back.

mod support;

use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};
use support::etcd::{free_port, Etcd};
use support::{ok, refused, temp_dir, weft, Node, WEFT};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000c1a5";

/// Node `name` of the cluster at `endpoints`, NVMe/TCP on `port`, its data
/// under `dir/name`, with the cluster's token (`token_file`: none for the
/// first node, which makes it).
fn node(dir: &Path, name: &str, port: u16, endpoints: &str, token_file: Option<&Path>) -> Node {
    let listen = format!("127.0.0.1:{port}");
    support::cluster_node(dir, name, &listen, endpoints, token_file, &[])
}

fn json(node: &Node, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(node, &all)).unwrap()
}

/// Polls `check` until it holds (or panics after `limit`, naming `what`).
fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    start.elapsed()
}

fn node_state(node: &Node, name: &str) -> String {
    json(node, &["node", "show", name])["state"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `weft bench --verify` as the test host against `volume` on `node`.
fn verify(node: &Node, volume: &str, rw: &str) -> (bool, String) {
    let nqn = format!("nqn.2026-11.io.weft:vol:{volume}");
    let options = [
        "--rw",
        rw,
        "--bs",
        "4k",
        "--iodepth",
        "4",
        "--size",
        "4MiB",
        "--verify",
    ];
    support::bench(node, HOST_NQN, &nqn, &options)
}

#[test]
fn three_nodes_share_one_desired_state_in_etcd() {
    let dir = temp_dir("cluster");
    let mut etcd = Etcd::start(3, &dir);
    let endpoints = etcd.endpoints();
    let ports = [free_port(), free_port(), free_port()];
    let n1 = node(&dir, "n1", ports[0], &endpoints, None);
    let token_file = dir.join("n1").join("api-token");
    // A store reached without any credential is refused unless the
    // operator says so; a node without the cluster's token is refused;
    // each saying what to do.
    let serve_n9 = |extra: &[&str]| {
        std::process::Command::new(WEFT)
            .args(["serve", "--cluster", &endpoints, "--node", "n9", "--listen"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(["--api-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.join("n9"))
            .args(extra)
            .output()
            .unwrap()
    };
    let output = serve_n9(&[]);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        errors.contains("without any credential") && errors.contains("--insecure-store"),
        "{errors}"
    );
    let output = serve_n9(&["--insecure-store"]);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(errors.contains("--api-token-file"), "{errors}");
    let n2 = node(&dir, "n2", ports[1], &endpoints, Some(&token_file));
    let n3 = node(&dir, "n3", ports[2], &endpoints, Some(&token_file));
    // n1 learns of the others through its copy of the store, a watch behind
    // etcd: a pool named on a node it has not seen yet is refused.
    eventually(Duration::from_secs(10), "n1 sees every node", || {
        json(&n1, &["node", "list"]).as_array().unwrap().len() == 3
    });

    // Pools on every node, made through n1.
    support::cluster::pool_on_each(&n1, &dir, &["n1", "n2", "n3"]);
    let pools = json(&n2, &["pool", "list"]);
    let mut pool_nodes: Vec<&str> = pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["node"].as_str().unwrap())
        .collect();
    pool_nodes.sort();
    assert_eq!(pool_nodes, ["n1", "n2", "n3"]);
    eventually(
        Duration::from_secs(10),
        "every node's heartbeat shows its pool",
        || {
            json(&n3, &["node", "list"])
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n["state"] == "up" && n["pools"].as_array().unwrap().len() == 1)
        },
    );
    // Each node its own ordinal, hence its own controller IDs.
    let mut ordinals: Vec<u64> = json(&n2, &["node", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["ordinal"].as_u64().expect("an ordinal"))
        .collect();
    ordinals.sort();
    assert_eq!(ordinals, [0, 1, 2]);

    // Volumes created through one node, served by another.
    ok(
        &n1,
        &["volume", "create", "v2", "--size", "32MiB", "--node", "n2"],
    );
    ok(
        &n1,
        &["volume", "create", "v3", "--size", "32MiB", "--node", "n3"],
    );
    ok(&n3, &["volume", "create", "auto", "--size", "32MiB"]);
    let volumes = json(&n1, &["volume", "list"]);
    let on = |name: &str| {
        volumes
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {volumes}"))["node"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!((on("v2").as_str(), on("v3").as_str()), ("n2", "n3"));
    assert!(!on("auto").is_empty());

    // Two nodes creating one name at once: exactly one wins.
    let results: Vec<(bool, String, String)> = std::thread::scope(|scope| {
        let a = scope.spawn(|| {
            weft(
                &n1,
                &["volume", "create", "dup", "--size", "8MiB", "--node", "n1"],
            )
        });
        let b = scope.spawn(|| {
            weft(
                &n2,
                &["volume", "create", "dup", "--size", "8MiB", "--node", "n2"],
            )
        });
        vec![a.join().unwrap(), b.join().unwrap()]
    });
    assert_eq!(results.iter().filter(|r| r.0).count(), 1, "{results:?}");
    let loser = results.iter().find(|r| !r.0).unwrap();
    assert!(loser.2.contains("already exists"), "{loser:?}");

    // Hosts are the cluster's; attach, resize and snapshot through other nodes.
    ok(&n2, &["host", "add", "tester", "--nqn", HOST_NQN]);
    ok(&n1, &["volume", "attach", "v3", "--host", "tester"]);
    ok(&n1, &["volume", "attach", "v2", "--host", "tester"]);
    // Attachments are the cluster's: a node holding neither volume (it
    // does not reconcile their records) lists them as well.
    eventually(
        Duration::from_secs(10),
        "n1 lists tester's attachments",
        || json(&n1, &["host", "show", "tester"])["volumes"] == serde_json::json!(["v2", "v3"]),
    );
    ok(&n3, &["volume", "resize", "v2", "--size", "48MiB"]);
    ok(&n1, &["snapshot", "create", "v2@s1"]);
    let v2 = json(&n3, &["volume", "show", "v2"]);
    assert_eq!(v2["size_bytes"], 48 << 20);
    assert_eq!(v2["snapshots"][0], "s1");
    assert_eq!(v2["node"], "n2");
    // Served by the owning node, to the attached host only.
    let (success, out) = verify(&n3, "v3", "randwrite");
    assert!(success, "{out}");
    let (success, out) = verify(&n2, "v2", "randwrite");
    assert!(success, "{out}");
    // A host's DH-HMAC-CHAP secret is sealed in etcd (a reader finds no
    // secret there), and the node that serves the volume opens it.
    const SECURED: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000005ec";
    const SECRET: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    ok(
        &n1,
        &[
            "host",
            "add",
            "secured",
            "--nqn",
            SECURED,
            "--dhchap-secret",
            SECRET,
        ],
    );
    ok(&n1, &["volume", "attach", "v3", "--host", "secured"]);
    let stored = std::process::Command::new("/usr/bin/etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoints, "get", "/weft/hosts/secured"])
        .output()
        .unwrap();
    let stored = String::from_utf8_lossy(&stored.stdout).into_owned();
    assert!(
        stored.contains("sealed-v1:") && !stored.contains("DHHC"),
        "{stored}"
    );
    let nqn = "nqn.2026-11.io.weft:vol:v3";
    let options = [
        "--rw",
        "randwrite",
        "--bs",
        "4k",
        "--size",
        "1MiB",
        "--runtime",
        "200ms",
    ];
    let (success, out) = support::bench(
        &n3,
        SECURED,
        nqn,
        &[&options[..], &["--dhchap-secret", SECRET]].concat(),
    );
    assert!(success, "{out}");
    let (success, out) = support::bench(&n3, SECURED, nqn, &options);
    assert!(
        !success && out.contains("requires this host to authenticate"),
        "{out}"
    );

    // A replicated volume: a replica on each node, one primary.
    ok(
        &n2,
        &[
            "volume",
            "create",
            "rep",
            "--size",
            "16MiB",
            "--replicas",
            "3",
        ],
    );
    ok(&n1, &["volume", "attach", "rep", "--host", "tester"]);
    let rep = json(&n3, &["volume", "show", "rep"]);
    let replicas = rep["replicas"].as_array().unwrap().clone();
    let mut holders: Vec<&str> = replicas
        .iter()
        .map(|r| r["node"].as_str().unwrap())
        .collect();
    assert_eq!(replicas[0]["role"], "primary", "{rep}");
    assert!(replicas.iter().all(|r| r["state"] == "in-sync"), "{rep}");
    let primary = holders[0].to_string();
    holders.sort();
    assert_eq!(holders, ["n1", "n2", "n3"], "{rep}");
    let listed = json(&n1, &["volume", "list"]);
    let times = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "rep")
        .count();
    assert_eq!(times, 1, "listed once, by its primary's node: {listed}");
    let named = [("n1", &n1), ("n2", &n2), ("n3", &n3)];
    let by_name = |name: &str| named.iter().find(|(n, _)| *n == name).unwrap().1;
    for (_, node) in named {
        eventually(Duration::from_secs(10), "every replica created", || {
            let (status, _) = support::api(
                node,
                Some(&node.token),
                "GET",
                "/api/v1/volumes/rep?local=1",
                None,
            );
            status == 200
        });
    }
    // The primary serves it once it has fenced and attached its replicas
    // (until then it answers ANA Transition, which a host retries); the
    // others answer I/O with an ANA path status (Inaccessible), so that a
    // multipath host uses the primary.
    eventually(Duration::from_secs(10), "the primary serves", || {
        verify(by_name(&primary), "rep", "randwrite").0
    });
    let secondary = named.iter().find(|(n, _)| *n != primary).unwrap().1;
    let (success, out) = verify(secondary, "rep", "randread");
    assert!(!success, "a secondary must not serve I/O: {out}");
    let errors = refused(&n1, &["volume", "resize", "rep", "--size", "1MiB"]);
    assert!(errors.contains("only grow"), "{errors}");
    ok(&n3, &["volume", "delete", "rep"]);
    for (name, node) in named {
        let (status, body) = support::api(
            node,
            Some(&node.token),
            "GET",
            "/api/v1/volumes/rep?local=1",
            None,
        );
        assert_eq!(status, 404, "{name}: {body}");
    }

    // A node killed is down within its lease; its volumes are unavailable.
    drop(n3);
    let took = eventually(Duration::from_secs(10), "n3 shown down", || {
        node_state(&n1, "n3") == "down"
    });
    eprintln!("n3 shown down {took:?} after its kill");
    let v3 = json(&n1, &["volume", "list"]);
    let v3 = v3
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "v3")
        .unwrap()
        .clone();
    assert_eq!(v3["state"], "unavailable", "{v3}");
    let errors = refused(&n1, &["volume", "resize", "v3", "--size", "64MiB"]);
    assert!(errors.contains("is down"), "{errors}");
    // It comes back as itself with its data.
    let n3 = node(&dir, "n3", ports[2], &endpoints, Some(&token_file));
    assert_eq!(node_state(&n1, "n3"), "up");
    let (success, out) = verify(&n3, "v3", "randread");
    assert!(success, "{out}");

    // One of three etcd members lost: nothing changes (once the others have
    // elected a leader, if it was the leader: a change caught in the election
    // may fail with 503, as with any etcd client).
    etcd.stop_member(2);
    etcd.wait_healthy();
    ok(
        &n2,
        &["volume", "create", "v4", "--size", "8MiB", "--node", "n1"],
    );

    // All lost: I/O goes on, changes are refused with 503.
    etcd.stop_member(0);
    etcd.stop_member(1);
    let (success, out) = verify(&n2, "v2", "randread");
    assert!(success, "I/O must not wait for etcd: {out}");
    // A change fails within the store's timeout (5 s; at once when the node
    // already knows the store is lost), and the volume manager serves
    // slow-path I/O meanwhile.
    let asked = Instant::now();
    let errors = refused(
        &n1,
        &["volume", "create", "v5", "--size", "8MiB", "--node", "n1"],
    );
    assert!(errors.contains("unreachable"), "{errors}");
    assert!(
        asked.elapsed() < Duration::from_secs(8),
        "{:?}",
        asked.elapsed()
    );
    let (status, body) = support::api(
        &n1,
        Some(&n1.token),
        "POST",
        "/api/v1/hosts",
        Some(r#"{"name":"h2","nqn":"nqn.2014-08.org.nvmexpress:uuid:2"}"#),
    );
    assert_eq!(status, 503, "{body}");
    // Back: the nodes reconnect and converge.
    for index in 0..3 {
        etcd.start_member(index);
    }
    etcd.wait_healthy();
    eventually(Duration::from_secs(30), "changes accepted again", || {
        weft(
            &n1,
            &["volume", "create", "v5", "--size", "8MiB", "--node", "n3"],
        )
        .0
    });
    eventually(Duration::from_secs(15), "every node up again", || {
        json(&n2, &["node", "list"])
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["state"] == "up")
    });
    let names: Vec<String> = json(&n3, &["volume", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    for name in ["v2", "v3", "auto", "dup", "v4", "v5"] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} missing from {names:?}"
        );
    }
    drop((n1, n2, n3));
    drop(etcd);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_unreachable_store_at_start_is_named() {
    let dir = temp_dir("cluster-unreachable");
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let start = Instant::now();
    let output = std::process::Command::new(WEFT)
        .args([
            "serve",
            "--cluster",
            &endpoint,
            "--node",
            "n1",
            "--insecure-store",
        ])
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--api-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&*dir)
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        errors.contains(&endpoint) && errors.contains("unreachable"),
        "{errors}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
    std::fs::remove_dir_all(dir).unwrap();
}
