//! A pool with a write tier through the binary: `weft pool create
//! --write-tier`, volumes (one encrypted) written and read over NVMe/TCP,
//! their writes acknowledged from the tier, a kill -9 before they were
//! destaged (replayed at the next start), the destage when the node is
//! idle, `weft pool set --write-tier` online and `--no-write-tier`, and the
//! refusals a user sees.

mod support;

use support::{
    api, connect_as, device_holds, kek_args, ok, pool_with_volume, refused, start_node, temp_dir,
    Node,
};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000713e";
const BLOCK: u32 = 4096;
const BLOCKS: u64 = 48;

fn nqn(volume: &str) -> String {
    format!("nqn.2026-11.io.weft:vol:{volume}")
}

/// Block `n`'s content in round `round`: recognisable on a device.
fn block(round: u8, n: u64) -> Vec<u8> {
    format!("weft-tier-marker-{round}-{n:06}-")
        .repeat(200)
        .into_bytes()[..BLOCK as usize]
        .to_vec()
}

/// Writes blocks 0, 2, 4... (no flush: each is durable once acknowledged)
/// and a 512-byte piece into block 1, then reads everything back.
fn write_and_check(node: &Node, volume: &str, round: u8) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for n in 0..BLOCKS {
        queue.write(1, n * 2, BLOCK, &block(round, n)).unwrap();
    }
    check(node, volume, round);
}

fn check(node: &Node, volume: &str, round: u8) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for n in 0..BLOCKS {
        let read = queue.read(1, n * 2, BLOCK, BLOCK).unwrap();
        assert!(read == block(round, n), "{volume} block {n}, round {round}");
        let gap = queue.read(1, n * 2 + 1, BLOCK, BLOCK).unwrap();
        assert!(
            gap.iter().all(|&b| b == 0),
            "{volume}: an unwritten block reads as zeroes"
        );
    }
}

/// Waits until `pool show` says its tier holds nothing to destage.
fn wait_destaged(node: &Node, pool: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let show = ok(node, &["pool", "show", pool]);
        if show.contains(": 0 B of ") {
            return show;
        }
        assert!(std::time::Instant::now() < deadline, "not destaged: {show}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn writes_acknowledged_from_a_write_tier_survive_kill_9_and_are_destaged() {
    let dir = temp_dir("tier");
    let (data, device, tier) = (dir.join("data"), dir.join("d0.img"), dir.join("t0.img"));
    let keys = kek_args(&dir, "tiered");
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let node = start_node(&data, &keys);
    let (device_arg, tier_arg) = (device.to_str().unwrap(), tier.to_str().unwrap());
    ok(
        &node,
        &[
            "pool",
            "create",
            "p",
            "--device",
            device_arg,
            "--device-size",
            "256MiB",
            "--write-tier",
            tier_arg,
            "--write-tier-size",
            "32MiB",
        ],
    );
    let show = ok(&node, &["pool", "show", "p"]);
    assert!(show.contains(&format!("write tier {tier_arg}")), "{show}");
    ok(
        &node,
        &["volume", "create", "v", "--pool", "p", "--size", "16MiB"],
    );
    let encrypted = [
        "volume",
        "create",
        "sec",
        "--pool",
        "p",
        "--size",
        "16MiB",
        "--encrypt",
    ];
    ok(&node, &encrypted);
    ok(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    // "sec" gets round 9's blocks: their text must be found on no device.
    for (volume, round) in [("v", 1), ("sec", 9)] {
        ok(&node, &["volume", "attach", volume, "--host", "tester"]);
        write_and_check(&node, volume, round);
    }
    // Killed at once: what was acknowledged may be in the tier alone.
    drop(node);
    let node = start_node(&data, &keys);
    check(&node, "v", 1);
    check(&node, "sec", 9);
    let show = wait_destaged(&node, "p");
    assert!(show.contains("write tier"), "{show}");
    assert!(
        device_holds(&device, &block(1, 5)),
        "destaged to the pool's device"
    );
    assert!(
        device_holds(&tier, &block(1, 5)),
        "the plain volume's writes were in the tier"
    );
    for place in [&device, &tier] {
        assert!(
            !device_holds(place, b"weft-tier-marker-9-"),
            "{}: the encrypted volume is ciphertext there",
            place.display()
        );
    }
    // Overwritten, then read back after a clean restart.
    write_and_check(&node, "v", 2);
    node.terminate();
    let node = start_node(&data, &keys);
    check(&node, "v", 2);
    check(&node, "sec", 9);

    let error = refused(&node, &["pool", "set", "p", "--write-tier", tier_arg]);
    assert!(error.contains("has one already"), "{error}");
    let other = dir.join("q0.img");
    let error = refused(
        &node,
        &[
            "pool",
            "create",
            "q",
            "--device",
            other.to_str().unwrap(),
            "--device-size",
            "64MiB",
            "--write-tier",
            tier_arg,
        ],
    );
    assert!(
        error.contains("already the write tier of pool p"),
        "{error}"
    );
    let alias = dir.join("tier-alias.img");
    std::os::unix::fs::symlink(&tier, &alias).unwrap();
    let error = refused(
        &node,
        &["pool", "set", "p", "--write-tier", alias.to_str().unwrap()],
    );
    assert!(error.contains("has one already"), "{error}");
    let q_device = other.to_str().unwrap();
    let q = [
        "pool",
        "create",
        "q",
        "--device",
        q_device,
        "--device-size",
        "64MiB",
    ];
    ok(&node, &q);
    let error = refused(
        &node,
        &["pool", "set", "q", "--write-tier", alias.to_str().unwrap()],
    );
    assert!(
        error.contains("already the write tier of pool p"),
        "{error}"
    );
    // Once p is deleted, its tier's device may serve another pool.
    for volume in ["v", "sec"] {
        ok(&node, &["volume", "delete", volume]);
    }
    ok(&node, &["pool", "delete", "p"]);
    ok(
        &node,
        &["pool", "set", "q", "--write-tier", alias.to_str().unwrap()],
    );
}

#[test]
fn a_write_tier_is_given_to_a_pool_online() {
    let dir = temp_dir("tier-online");
    let (data, device, tier) = (dir.join("data"), dir.join("d0.img"), dir.join("t0.img"));
    let node = start_node(&data, &[]);
    let device_arg = device.to_str().unwrap();
    pool_with_volume(&node, &device, "v", "16MiB");
    ok(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    ok(&node, &["volume", "attach", "v", "--host", "tester"]);
    write_and_check(&node, "v", 1);
    let error = refused(&node, &["pool", "set", "p", "--write-tier", device_arg]);
    assert!(error.contains("also one of the pool's devices"), "{error}");
    let error = refused(&node, &["pool", "set", "p"]);
    assert!(error.contains("give the tier's device"), "{error}");
    let tier_arg = tier.to_str().unwrap();
    let set = ok(
        &node,
        &[
            "pool",
            "set",
            "p",
            "--write-tier",
            tier_arg,
            "--write-tier-size",
            "256KiB",
        ],
    );
    assert!(set.contains("write tier"), "{set}");
    check(&node, "v", 1);
    // A tier of 62 blocks: each round (48 blocks, and a header each) fills
    // it, and writes wait for destages.
    for round in 2..=4 {
        write_and_check(&node, "v", round);
    }
    assert!(
        device_holds(&tier, &block(4, BLOCKS - 1)),
        "written through the tier"
    );
    drop(node);
    let node = start_node(&data, &[]);
    check(&node, "v", 4);
    let list = ok(&node, &["pool", "list", "-o", "json"]);
    assert!(list.contains("\"write_tier\""), "{list}");
    let (status, metrics) = api(&node, Some(&node.token), "GET", "/metrics", None);
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert_eq!(status, 200);
    for family in ["capacity", "used"] {
        let sample = format!("weft_pool_write_tier_{family}_bytes{{pool=\"p\"}} ");
        assert!(metrics.contains(&sample), "{sample} in {metrics}");
    }
    // Removed online, with writes still in it (destaged first), and
    // given again: its device was erased.
    write_and_check(&node, "v", 5);
    let removed = ok(&node, &["pool", "set", "p", "--no-write-tier"]);
    assert!(removed.contains("destaged and removed"), "{removed}");
    assert!(device_holds(&device, &block(5, BLOCKS - 1)), "destaged");
    let show = ok(&node, &["pool", "show", "p"]);
    assert!(!show.contains("write tier"), "{show}");
    let error = refused(&node, &["pool", "set", "p", "--no-write-tier"]);
    assert!(error.contains("it has none"), "{error}");
    write_and_check(&node, "v", 6);
    drop(node);
    let node = start_node(&data, &[]);
    check(&node, "v", 6);
    ok(&node, &["pool", "set", "p", "--write-tier", tier_arg]);
    check(&node, "v", 6);
}
