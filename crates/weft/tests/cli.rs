//! The `weft` command line, end to end: serve from a config file, load it
//! with `weft bench` (table and fio JSON), and the errors a user sees.

mod support;

use std::process::Command;
use support::{listening_address, spawn_serve, Server, WEFT};

/// Starts `weft serve` on a port the kernel picks, with a RAM namespace; returns it and the target URL.
fn serve(name: &str) -> (Server, String) {
    let dir = std::env::temp_dir().join(format!("weft-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("weft.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = \"{}\"\nlisten = [\"127.0.0.1:0\"]\nreactors = 1\n[[subsystem]]\nnqn = \"nqn.2026-11.io.weft:cli\"\n[[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"64MiB\"\n",
            dir.display()
        ),
    )
    .unwrap();
    let (server, banner) = spawn_serve(&[
        "--api-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ]);
    let port = listening_address(&banner).port();
    assert!(
        banner.contains(&format!("nvme discover -t tcp -a 127.0.0.1 -s {port}")),
        "{banner}"
    );
    assert!(banner.contains("ram 64 MiB"), "{banner}");
    (
        server,
        format!("nvme-tcp://127.0.0.1:{port}/nqn.2026-11.io.weft:cli"),
    )
}

/// The CPUs each reactor thread of process `pid` may run on.
fn reactor_cpus(pid: u32) -> Vec<String> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        if !name.starts_with("weft-reactor") {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_default();
        found.push(cpus.trim().to_string());
    }
    found
}

/// `taskset -c N weft serve`: the reactors stay on the CPUs the process was
/// given (they are pinned to the i-th allowed CPU, not to CPU i).
#[test]
fn reactors_stay_on_the_cpus_the_process_may_use() {
    // The last allowed CPU: not CPU 0 where there are two or more (where
    // every reactor 0 went before), so the old placement fails here.
    let last = *weft_uring::allowed_cpus().unwrap().last().unwrap();
    // Started from a thread pinned to `last`: the child inherits its affinity.
    let (server, _) = std::thread::spawn(move || {
        weft_uring::pin_current_thread_to_cpu(last).unwrap();
        serve("pinned")
    })
    .join()
    .unwrap();
    // The banner can come before the reactor thread named and pinned itself.
    let wanted = vec![last.to_string()];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut found = reactor_cpus(server.pid());
    while found != wanted && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        found = reactor_cpus(server.pid());
    }
    assert_eq!(found, wanted);
}

/// A sparse 16 MiB file under the temp dir, unique to this test process.
fn temp_image(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("weft-cli-{name}-{}.img", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    path
}

fn weft(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(WEFT).args(args).output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bench_loads_a_served_namespace() {
    let (_server, url) = serve("bench");
    let (ok, table, errors) = weft(&[
        "bench",
        "--target",
        &url,
        "--rw",
        "randrw",
        "--bs",
        "8k",
        "--iodepth",
        "8",
        "--runtime",
        "500ms",
    ]);
    assert!(ok, "{errors}");
    assert!(
        table.contains("read") && table.contains("write") && table.contains("p99.9 us"),
        "{table}"
    );
    let (ok, json, errors) = weft(&[
        "bench",
        "--target",
        &url,
        "--rw",
        "randread",
        "--iodepth",
        "4",
        "--runtime",
        "300ms",
        "--json",
        "--queues",
        "2",
    ]);
    assert!(ok, "{errors}");
    assert!(json.starts_with("{\"fio version\""), "{json}");
    assert!(json.contains("\"99.000000\":"), "{json}");
    let (ok, _, errors) = weft(&[
        "bench",
        "--target",
        &url,
        "--nsid",
        "7",
        "--runtime",
        "100ms",
    ]);
    assert!(!ok);
    assert!(errors.contains("namespace 7 does not exist"), "{errors}");
    let (ok, _, errors) = weft(&[
        "bench",
        "--target",
        &url,
        "--bs",
        "2m",
        "--runtime",
        "100ms",
    ]);
    assert!(!ok);
    assert!(
        errors.contains("--bs 2MiB is above this target's largest transfer, 1MiB (its MDTS)"),
        "{errors}"
    );
}

#[test]
fn compare_and_floor_report_side_by_side() {
    let (_server, url) = serve("compare");
    let path = temp_image("compare");
    let json_path = path.with_extension("json");
    let plot_path = path.with_extension("svg");
    let args = [
        "bench",
        "compare",
        "--local",
        path.to_str().unwrap(),
        "--remote",
        &url,
        "--sweep",
        "iodepth=1,4",
        "--runtime",
        "200ms",
        "--json",
        json_path.to_str().unwrap(),
        "--plot",
        plot_path.to_str().unwrap(),
    ];
    let (ok, report, errors) = weft(&args);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "{errors}");
    assert_eq!(report.matches(" ratio ").count(), 2, "{report}");
    let json = std::fs::read_to_string(&json_path).unwrap();
    assert_eq!(json.matches("\"iops_ratio\":").count(), 2, "{json}");
    assert!(
        json.contains("\"remote\":{\"read\":{\"total_ios\":"),
        "{json}"
    );
    let svg = std::fs::read_to_string(&plot_path).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    let _ = std::fs::remove_file(&json_path);
    let _ = std::fs::remove_file(&plot_path);
    let (ok, floor, errors) = weft(&["bench", "floor", "--runtime", "200ms"]);
    assert!(ok, "{errors}");
    assert!(floor.lines().count() >= 4, "{floor}");
    let (ok, _, errors) = weft(&["bench", "compare", "--local", "x"]);
    assert!(!ok);
    assert!(
        errors.contains("needs --local PATH and --remote"),
        "{errors}"
    );
}

#[test]
fn verify_checks_what_it_wrote_on_both_sides() {
    let (_server, url) = serve("verify");
    let path = temp_image("verify");
    for target in [url.as_str(), path.to_str().unwrap()] {
        for (rw, extra) in [("randrw", "--runtime"), ("randread", "--size")] {
            let amount = if extra == "--runtime" { "300ms" } else { "1m" };
            let (ok, table, errors) = weft(&[
                "bench",
                "--target",
                target,
                "--rw",
                rw,
                "--bs",
                "8k",
                "--iodepth",
                "8",
                "--queues",
                "2",
                "--verify",
                extra,
                amount,
            ]);
            assert!(ok, "{target} {rw}: {errors}");
            let checked: u64 = table
                .split("verify: ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{table}"));
            assert!(checked > 0, "{table}");
        }
    }
    // Writes alone, one pass: every block is read back and checked at the end.
    let (ok, table, errors) = weft(&[
        "bench",
        "--target",
        path.to_str().unwrap(),
        "--rw",
        "write",
        "--size",
        "64k",
        "--verify",
    ]);
    assert!(ok, "{errors}");
    assert!(table.contains("verify: 16 reads checked"), "{table}");
    let _ = std::fs::remove_file(&path);
}

/// `--poll`: the initiator spins on its sockets instead of sleeping (one
/// 64k write needs several receives: the R2T, then the completion), and
/// what it wrote reads back.
#[test]
fn a_polled_initiator_keeps_what_it_wrote() {
    let (_server, url) = serve("poll");
    let (ok, table, errors) = weft(&[
        "bench",
        "--target",
        &url,
        "--rw",
        "randrw",
        "--bs",
        "64k",
        "--iodepth",
        "4",
        "--poll",
        "--verify",
        "--runtime",
        "300ms",
    ]);
    assert!(ok, "{errors}");
    assert!(table.contains("verify: "), "{table}");
}

#[test]
fn bench_runs_on_a_local_file() {
    let path = temp_image("local");
    let (ok, table, errors) = weft(&[
        "bench",
        "--target",
        path.to_str().unwrap(),
        "--rw",
        "write",
        "--bs",
        "64k",
        "--iodepth",
        "4",
        "--runtime",
        "300ms",
    ]);
    let _ = std::fs::remove_file(&path);
    assert!(ok, "{errors}");
    assert!(table.contains("write"), "{table}");
}

#[test]
fn errors_say_what_is_wrong() {
    let (ok, _, errors) = weft(&["serve", "--config", "/nonexistent/weft.toml"]);
    assert!(!ok);
    assert!(
        errors.contains("/nonexistent/weft.toml: file: cannot read it"),
        "{errors}"
    );
    let (ok, _, errors) = weft(&[
        "bench",
        "--target",
        "nvme-tcp://127.0.0.1:1/nqn.2026-11.io.weft:x",
        "--runtime",
        "100ms",
    ]);
    assert!(!ok);
    assert!(errors.contains("cannot reach 127.0.0.1:1"), "{errors}");
    let (ok, _, errors) = weft(&["bench", "--target", "x", "--rw", "sideways"]);
    assert!(!ok);
    assert!(
        errors.contains("--rw \"sideways\" is not one of"),
        "{errors}"
    );
    let (ok, _, errors) = weft(&[
        "csi",
        "--endpoint",
        "unix:///tmp/weft-cli-test.sock",
        "--mode",
        "node",
        "--node-name",
        "n1",
        "--host-nqn",
        "blktests-host-1",
    ]);
    assert!(!ok);
    assert!(
        errors.contains("\"blktests-host-1\" is not in the NVMe specification's form"),
        "{errors}"
    );
    let (ok, _, errors) = weft(&["frobnicate"]);
    assert!(!ok);
    assert!(
        errors.contains("unknown command \"frobnicate\""),
        "{errors}"
    );
}

/// Every command and subcommand takes --help and answers with its own
/// part of the usage text (and success), not with an error.
#[test]
fn every_command_takes_help() {
    for command in [
        "serve",
        "pool",
        "volume",
        "snapshot",
        "host",
        "namespace",
        "node",
        "token",
        "top",
        "cluster",
        "bench",
        "csi",
    ] {
        let (ok, help, errors) = weft(&[command, "--help"]);
        assert!(ok, "weft {command} --help: {errors}");
        assert!(
            help.contains(&format!("  weft {command}")),
            "weft {command} --help: {help}"
        );
        assert!(help.contains("weft --help shows every command"), "{help}");
    }
    let (ok, help, _) = weft(&["volume", "create", "--help"]);
    assert!(ok && help.contains("--replicas N"), "{help}");
    assert!(help.contains("admin commands talk to a running"), "{help}");
    let (ok, help, _) = weft(&["bench", "compare", "-h"]);
    assert!(
        ok && help.contains("Bench options:") && !help.contains("Serve options:"),
        "{help}"
    );
    let (ok, help, _) = weft(&["serve", "--help"]);
    assert!(
        ok && help.contains("--kek-file FILE") && !help.contains("Bench options:"),
        "{help}"
    );
    let (ok, help, _) = weft(&["csi", "--help"]);
    assert!(
        ok && help.contains("snapshotted (VolumeSnapshot)"),
        "{help}"
    );
    let (ok, help, _) = weft(&["--help"]);
    assert!(ok && help.contains("Bench options:") && help.contains("Serve options:"));
}

/// A reader that leaves early (`weft volume show v | grep -q x` under
/// pipefail) ends the command quietly with success, not with a panic.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(WEFT)
        .arg("--help")
        .stdout(writer)
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {errors}", output.status);
    assert!(errors.is_empty(), "{errors}");
}
