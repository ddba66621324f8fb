//! Compressed volumes through the binary: `weft volume create
//! --compression`, writes over NVMe/TCP (whole units, single blocks,
//! overwrites, Write Zeroes), what `volume show`, `pool show` and /metrics
//! report, a pool's default, a kill -9 (right after a write not flushed)
//! and a restart with everything read back, one volume compressed and
//! encrypted, and the errors a user sees.

mod support;

use support::{connect_as, kek_args, ok, refused, start_node, temp_dir, Node};

const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000c0c1";
const BLOCK: u32 = 4096;
/// 4 MiB of each volume written.
const BLOCKS: u64 = 1024;

/// Block `n` of `volume`: text that compresses, and recognisably its own.
fn block(volume: &str, n: u64) -> Vec<u8> {
    format!("{volume}-compressible-block-{n:06}-")
        .repeat(200)
        .into_bytes()[..BLOCK as usize]
        .to_vec()
}

fn nqn(volume: &str) -> String {
    format!("nqn.2026-11.io.weft:vol:{volume}")
}

/// Writes blocks 0..BLOCKS in 16-block commands, then overwrites every
/// 7th block alone and zeroes blocks 100..132.
fn write_volume(node: &Node, volume: &str) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for first in (0..BLOCKS).step_by(16) {
        let data: Vec<u8> = (first..first + 16).flat_map(|n| block(volume, n)).collect();
        queue.write(1, first, BLOCK, &data).unwrap();
    }
    for n in (0..BLOCKS).step_by(7) {
        queue.write(1, n, BLOCK, &block("again", n)).unwrap();
    }
    queue.write_zeroes(1, 100, 32).unwrap();
    queue.flush(1).unwrap();
}

fn expected(volume: &str, n: u64) -> Vec<u8> {
    match n {
        100..132 => vec![0; BLOCK as usize],
        n if n % 7 == 0 => block("again", n),
        n => block(volume, n),
    }
}

fn check_volume(node: &Node, volume: &str) {
    let (_controller, mut queue) = connect_as(node, &nqn(volume), HOST_NQN, 1);
    for n in 0..BLOCKS + 16 {
        let want = match n < BLOCKS {
            true => expected(volume, n),
            false => vec![0; BLOCK as usize],
        };
        let seen = queue.read(1, n, BLOCK, BLOCK).unwrap();
        assert!(seen == want, "{volume} block {n} reads back as written");
    }
}

/// The ratio `volume show` prints ("... stored (12.34x)").
fn ratio(show: &str) -> f64 {
    let line = show
        .lines()
        .find(|l| l.starts_with("compression "))
        .unwrap_or_else(|| panic!("no compression line: {show}"));
    let figure = line.rsplit('(').next().unwrap().trim_end_matches("x)");
    figure.parse().unwrap_or_else(|_| panic!("{line}"))
}

#[test]
fn compressed_volumes_store_less_survive_a_kill_and_read_back() {
    let dir = temp_dir("compression");
    let (data, device) = (dir.join("data"), dir.join("d0.img"));
    let keys = kek_args(&dir, "c");
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let node = start_node(&data, &keys);
    let device_arg = device.to_str().unwrap();
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
            "--allocation-unit",
            "1MiB",
        ],
    );
    fn create<'a>(name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["volume", "create", name, "--pool", "p", "--size", "16MiB"];
        args.extend_from_slice(extra);
        args
    }
    let error = refused(&node, &create("x", &["--compression", "gzip"]));
    assert!(error.contains("lz4, zstd or none"), "{error}");
    let error = refused(&node, &create("x", &["--compression", "lz4", "--thick"]));
    assert!(error.contains("drop --thick"), "{error}");
    ok(&node, &create("z", &["--compression", "zstd"]));
    ok(&node, &create("ze", &["--compression", "lz4", "--encrypt"]));
    ok(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    for volume in ["z", "ze"] {
        ok(&node, &["volume", "attach", volume, "--host", "tester"]);
        write_volume(&node, volume);
    }
    let show = ok(&node, &["volume", "show", "z"]);
    assert!(show.contains("compression zstd: 3.9 MiB written"), "{show}");
    assert!(ratio(&show) > 8.0, "{show}");
    let show = ok(&node, &["volume", "show", "ze"]);
    assert!(ratio(&show) > 4.0, "{show}");
    let list = ok(&node, &["volume", "list"]);
    assert!(list.contains("thin,lz4,enc"), "{list}");
    let pool = ok(&node, &["pool", "list"]);
    assert!(
        pool.contains("compressed volumes: 7.9 MiB written"),
        "{pool}"
    );
    let (_, metrics) = support::api(&node, Some(&node.token), "GET", "/metrics", None);
    let metrics = metrics.as_str().unwrap().to_string();
    assert!(
        metrics.contains("weft_pool_compressed_logical_bytes{pool=\"p\"} 8257536"),
        "{metrics}"
    );
    check_volume(&node, "z");

    // A pool's default: its volumes of one copy are compressed unless
    // they ask otherwise.
    let other = dir.join("d1.img");
    ok(
        &node,
        &[
            "pool",
            "create",
            "q",
            "--device",
            other.to_str().unwrap(),
            "--device-size",
            "64MiB",
            "--compression",
            "lz4",
        ],
    );
    assert!(ok(&node, &["pool", "show", "q"]).contains("compressed with lz4"));
    ok(
        &node,
        &["volume", "create", "d", "--pool", "q", "--size", "1MiB"],
    );
    ok(
        &node,
        &[
            "volume",
            "create",
            "n",
            "--pool",
            "q",
            "--size",
            "1MiB",
            "--compression",
            "none",
        ],
    );
    assert!(ok(&node, &["volume", "list"]).contains("thin,lz4"));
    assert!(ok(&node, &["volume", "show", "d"]).contains("compression lz4"));
    assert!(!ok(&node, &["volume", "show", "n"]).contains("compression"));

    // kill -9 right after a write acknowledged and not flushed: it is
    // there after the restart (a killed process loses nothing acknowledged).
    {
        let (_controller, mut queue) = connect_as(&node, &nqn("ze"), HOST_NQN, 1);
        queue
            .write(1, 2000, BLOCK, &block("unflushed", 2000))
            .unwrap();
    }
    drop(node);
    let node = start_node(&data, &keys);
    for volume in ["z", "ze"] {
        check_volume(&node, volume);
    }
    let (_controller, mut queue) = connect_as(&node, &nqn("ze"), HOST_NQN, 1);
    let after_kill = queue.read(1, 2000, BLOCK, BLOCK).unwrap();
    assert!(
        after_kill == block("unflushed", 2000),
        "the write acknowledged before the kill reads back"
    );
    drop(queue);
    node.terminate();
    // Compressed: a unit's text appears once or twice in its extent, not
    // 140 times a block; compressed and encrypted: not at all.
    let bytes = std::fs::read(&device).unwrap();
    let count = |marker: &[u8]| bytes.windows(marker.len()).filter(|w| w == &marker).count();
    let found = count(b"z-compressible-block-");
    assert!(found > 0 && found < 4 * 64, "{found} copies of z's text");
    assert_eq!(
        count(b"ze-compressible-block-"),
        0,
        "ze's text in the clear"
    );
}
