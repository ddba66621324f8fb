//! QoS limits in the data plane and the statistics that show them, through
//! the binary: `weft volume set` limits hold for `weft bench` through the
//! user-space initiator (with a margin here; docs/PERFORMANCE.md has the
//! benchmark), apply live, survive a kill -9, and `weft top`, the stats
//! route and `/metrics` report the I/O.

mod support;

use serde_json::Value;
use support::{api, ok, pool_with_volume, start_node, temp_dir, weft, Node};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000000c5";

/// IOPS and bytes per second of `weft bench` on volume `volume`, with
/// `depth` I/Os outstanding on each of 2 queues. (Its figures include the
/// drain of the last I/Os after the run: at a limit, depth x 2 times the
/// spacing of starts; kept small against the 2 s run.)
fn bench(node: &Node, volume: &str, rw: &str, bs: &str, depth: &str) -> (f64, f64) {
    let url = format!("{}/nqn.2026-11.io.weft:vol:{volume}", node.nvme);
    let (success, out, errors) = weft(
        node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &url,
            "--rw",
            rw,
            "--bs",
            bs,
            "--iodepth",
            depth,
            "--queues",
            "2",
            "--runtime",
            "2s",
            "--ramp",
            "300ms",
            "--json",
        ],
    );
    assert!(success, "{rw} {bs} depth {depth}: {errors}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let side = if rw.contains("read") { "read" } else { "write" };
    let job = &report["jobs"][0][side];
    (
        job["iops"].as_f64().unwrap(),
        job["bw_bytes"].as_f64().unwrap(),
    )
}

/// The limit holds: `measure` (a rate) never passes `limit` by more than
/// 5%, and reaches at least 85% of it. A reading under the floor is taken
/// again, 10 s later, up to three in all (about half a minute): this
/// machine's disk has slow spells, when it cannot do even the limit's rate
/// (one run read 408 writes/s against a limit of 500 right after a
/// restart); a reading over the limit fails at once, as it is the limit's
/// own fault.
fn assert_near(mut measure: impl FnMut() -> f64, limit: f64, what: &str) {
    let mut readings = Vec::new();
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_secs(10));
        }
        let measured = measure();
        let ratio = measured / limit;
        readings.push(format!("{measured:.0} ({ratio:.3})"));
        assert!(
            ratio <= 1.05,
            "{what}: {measured:.0} against a limit of {limit:.0} ({ratio:.3})"
        );
        if ratio >= 0.85 {
            return;
        }
    }
    panic!(
        "{what}: under 85% of the limit of {limit:.0} in every reading: {}",
        readings.join(", ")
    );
}

#[test]
fn limits_hold_live_and_after_kill_9_and_the_statistics_show_the_io() {
    let dir = temp_dir("qos");
    let data = dir.join("data");
    let node = start_node(&data, &[]);
    pool_with_volume(&node, &dir.join("pool.img"), "v1", "64MiB");
    ok(&node, &["host", "add", "bench", "--nqn", HOST_NQN]);
    ok(&node, &["volume", "attach", "v1", "--host", "bench"]);
    let (unlimited, _) = bench(&node, "v1", "randread", "4k", "16");
    assert!(
        unlimited > 2000.0,
        "unlimited reads only reached {unlimited:.0} IOPS"
    );
    ok(&node, &["volume", "set", "v1", "--iops-max", "800"]);
    assert_near(
        || bench(&node, "v1", "randread", "4k", "16").0,
        800.0,
        "iops-max 800, reads",
    );
    // Separate read and write limits; the tighter one decides.
    ok(
        &node,
        &[
            "volume",
            "set",
            "v1",
            "--iops-max",
            "none",
            "--write-iops-max",
            "500",
            "--read-bw-max",
            "4MiB",
        ],
    );
    assert_near(
        || bench(&node, "v1", "randwrite", "4k", "16").0,
        500.0,
        "write-iops-max 500",
    );
    assert_near(
        || bench(&node, "v1", "randread", "64k", "1").1,
        4.0 * 1048576.0,
        "read-bw-max 4MiB, bytes/s",
    );
    // The statistics: top (two frames as JSON lines), the stats route, /metrics.
    let (success, frames, errors) = weft(
        &node,
        &["top", "--interval", "200ms", "--count", "2", "-o", "json"],
    );
    assert!(success, "{errors}");
    assert_eq!(frames.lines().count(), 2, "{frames}");
    let (status, stats) = api(&node, Some(&node.token), "GET", "/api/v1/stats", None);
    assert_eq!(status, 200);
    let v1 = stats["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|ns| ns["volume"] == "v1")
        .unwrap()
        .clone();
    assert!(v1["read"]["ops"].as_u64().unwrap() > 1000, "{v1}");
    assert!(v1["write"]["ops"].as_u64().unwrap() > 500, "{v1}");
    assert_eq!(v1["limits"]["write_iops"], 500);
    let (status, metrics) = api(&node, Some(&node.token), "GET", "/metrics", None);
    assert_eq!(status, 200);
    let metrics = metrics.as_str().unwrap().to_string();
    for family in [
        "weft_namespace_ops_total{subsystem=\"nqn.2026-11.io.weft:vol:v1\",nsid=\"1\",volume=\"v1\",op=\"read\"}",
        "weft_namespace_latency_seconds_bucket{subsystem=\"nqn.2026-11.io.weft:vol:v1\",nsid=\"1\",volume=\"v1\",op=\"write\",le=\"+Inf\"}",
        "weft_namespace_qos_limit{subsystem=\"nqn.2026-11.io.weft:vol:v1\",nsid=\"1\",volume=\"v1\",limit=\"write_iops\"} 500",
        "weft_pool_capacity_bytes{pool=\"p\"}",
        "weft_node_ops_total{op=\"read\"}",
    ] {
        assert!(metrics.contains(family), "no {family} in\n{metrics}");
    }
    let (status, _) = api(&node, None, "GET", "/metrics", None);
    assert_eq!(status, 401, "metrics need the token too");
    // kill -9, restart: the limits are back in the data plane.
    drop(node);
    let node = start_node(&data, &[]);
    assert_near(
        || bench(&node, "v1", "randwrite", "4k", "16").0,
        500.0,
        "write-iops-max 500 after kill -9",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
