//! Pools and volumes end to end through the binary: `weft serve` with its
//! API on a free port, the admin commands over real HTTP, `weft bench
//! --verify` through the user-space initiator against volume subsystems,
//! the errors a user sees, and everything back after a restart.

mod support;

use std::process::Command;
use support::{ok, pool_with_volume, refused, start_node, temp_dir, weft, Node, WEFT};

/// The host NQN the tests' initiator connects as.
const HOST_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-00000000b0b1";

fn start(data_dir: &std::path::Path) -> Node {
    start_node(data_dir, &[])
}

fn volume_url(node: &Node, volume: &str) -> String {
    format!("{}/nqn.2026-11.io.weft:vol:{volume}", node.nvme)
}

#[test]
fn volumes_are_carved_served_snapshotted_and_survive_a_restart() {
    let dir = temp_dir("life");
    let devices = [dir.join("d0.img"), dir.join("d1.img")];
    let node = start(&dir.join("data"));
    ok(
        &node,
        &[
            "pool",
            "create",
            "fast",
            "--device",
            devices[0].to_str().unwrap(),
            "--device",
            devices[1].to_str().unwrap(),
            "--device-size",
            "64MiB",
            "--allocation-unit",
            "256KiB",
        ],
    );
    let pools = ok(&node, &["pool", "list"]);
    assert!(
        pools.contains("fast") && pools.contains("256 KiB"),
        "{pools}"
    );
    ok(
        &node,
        &[
            "volume", "create", "db1", "--pool", "fast", "--size", "32MiB",
        ],
    );
    ok(
        &node,
        &[
            "volume",
            "create",
            "db2",
            "--pool",
            "fast",
            "--size",
            "8MiB",
            "--thick",
            "--block-size",
            "512",
        ],
    );
    // Only attached hosts may connect. Without a secret, the NQN alone
    // names the host: said, with the fix.
    let (added, _, warned) = weft(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    assert!(added, "{warned}");
    assert!(
        warned.contains("no DH-HMAC-CHAP secret")
            && warned.contains("weft host set tester --dhchap-secret"),
        "{warned}"
    );
    let (success, _, errors) = weft(
        &node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &volume_url(&node, "db1"),
            "--runtime",
            "100ms",
        ],
    );
    assert!(!success, "an unattached host must be refused");
    assert!(errors.contains("refused host"), "{errors}");
    assert!(errors.contains("weft host add NAME --nqn"), "{errors}");
    let log = std::fs::read_to_string(dir.join("data.log")).unwrap();
    assert!(
        log.contains(&format!("host {HOST_NQN} refused for volume db1 (Connect Invalid Host): it is not attached; to allow it: weft host add NAME --nqn {HOST_NQN} && weft volume attach db1 --host NAME")),
        "{log}"
    );
    for volume in ["db1", "db2"] {
        ok(&node, &["volume", "attach", volume, "--host", "tester"]);
    }
    let hosts = ok(&node, &["host", "list"]);
    assert!(
        hosts.contains("tester") && hosts.contains("db1, db2"),
        "{hosts}"
    );
    ok(
        &node,
        &[
            "volume",
            "set",
            "db2",
            "--iops-max",
            "20000",
            "--bw-max",
            "200MiB",
        ],
    );
    ok(
        &node,
        &[
            "volume",
            "set",
            "db2",
            "--write-iops-max",
            "5000",
            "--iops-max",
            "none",
        ],
    );
    let show = ok(&node, &["volume", "show", "db2"]);
    assert!(show.contains("attached    tester"), "{show}");
    assert!(
        show.contains("limits      200 MiB/s, write 5000 IOPS"),
        "{show}"
    );
    let error = refused(&node, &["volume", "set", "db2"]);
    assert!(
        error.contains("--replicas N, or at least one of --iops-max"),
        "{error}"
    );
    let error = refused(&node, &["volume", "set", "db2", "--bw-max", "lots"]);
    assert!(error.contains("--bw-max"), "{error}");
    let error = refused(&node, &["host", "delete", "tester"]);
    assert!(error.contains("detach it first"), "{error}");
    let error = refused(&node, &["host", "add", "other", "--nqn", "other host"]);
    assert!(error.contains("' ' is not allowed in an NQN"), "{error}");
    // A name Linux nvmet accepts is accepted, with a note on its form.
    let said = ok(&node, &["host", "add", "other", "--nqn", "blktests-host-1"]);
    assert!(
        said.contains("not in the NVMe specification's NQN form"),
        "{said}"
    );
    ok(&node, &["host", "delete", "other"]);
    let output = Command::new(WEFT)
        .args(["host", "list", "--api", &node.api])
        .env_remove("WEFT_API_TOKEN")
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        error.contains("needs a bearer token") && error.contains("--api-token-file"),
        "{error}"
    );
    ok(
        &node,
        &[
            "volume",
            "set",
            "db2",
            "--bw-max",
            "none",
            "--write-iops-max",
            "none",
        ],
    );
    // Data through the data plane, checked block by block.
    let (success, out, errors) = weft(
        &node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &volume_url(&node, "db1"),
            "--rw",
            "randrw",
            "--bs",
            "4k",
            "--iodepth",
            "16",
            "--queues",
            "2",
            "--runtime",
            "1s",
            "--verify",
        ],
    );
    assert!(success, "{errors}");
    assert!(out.contains("all intact"), "{out}");
    let (success, out, errors) = weft(
        &node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &volume_url(&node, "db2"),
            "--rw",
            "write",
            "--bs",
            "64k",
            "--iodepth",
            "4",
            "--size",
            "8MiB",
            "--verify",
        ],
    );
    assert!(success, "{errors}");
    assert!(out.contains("all intact"), "{out}");
    ok(&node, &["snapshot", "create", "db1@s1"]);
    ok(&node, &["volume", "clone", "db1@s1", "db1-copy"]);
    ok(&node, &["volume", "resize", "db1", "--size", "48MiB"]);
    let show = ok(&node, &["volume", "show", "db1-copy"]);
    assert!(show.contains("origin      db1@s1"), "{show}");
    let json = ok(&node, &["volume", "show", "db1", "-o", "json"]);
    assert!(json.contains("\"size_bytes\": 50331648"), "{json}");
    // Mistakes get clear errors and change nothing.
    let error = refused(&node, &["volume", "delete", "db1"]);
    assert!(error.contains("has snapshots (s1)"), "{error}");
    let error = refused(&node, &["volume", "resize", "db1", "--size", "1MiB"]);
    assert!(error.contains("only grow"), "{error}");
    let error = refused(
        &node,
        &[
            "volume", "create", "db1", "--pool", "fast", "--size", "1MiB",
        ],
    );
    assert!(error.contains("exists"), "{error}");
    let error = refused(
        &node,
        &["volume", "create", "x", "--pool", "nope", "--size", "1MiB"],
    );
    assert!(error.contains("pool nope does not exist"), "{error}");
    let error = refused(&node, &["snapshot", "create", "db1"]);
    assert!(error.contains("VOLUME@SNAPSHOT"), "{error}");
    let error = refused(
        &node,
        &[
            "volume", "create", "bad/name", "--pool", "fast", "--size", "1MiB",
        ],
    );
    assert!(error.contains("not allowed"), "{error}");
    // A full pool: a write that needs space fails; the volume stays usable.
    ok(
        &node,
        &[
            "volume", "create", "big", "--pool", "fast", "--size", "1GiB",
        ],
    );
    ok(&node, &["volume", "attach", "big", "--host", "tester"]);
    let (success, _, errors) = weft(
        &node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &volume_url(&node, "big"),
            "--rw",
            "write",
            "--bs",
            "128k",
            "--iodepth",
            "4",
            "--size",
            "256MiB",
        ],
    );
    assert!(!success, "filling beyond the pool must fail");
    assert!(
        errors.contains("CAPACITY_EXCEEDED (SCT 0h, SC 81h, DNR)"),
        "{errors}"
    );
    support::wait_no_connected_hosts(&node, "big");
    ok(&node, &["volume", "delete", "big"]);
    ok(&node, &["volume", "flatten", "db1-copy"]);
    let before = ok(&node, &["volume", "list"]);
    drop(node);

    let node = start(&dir.join("data"));
    let after = ok(&node, &["volume", "list"]);
    assert_eq!(after, before, "the same volumes after a restart");
    let (success, out, errors) = weft(
        &node,
        &[
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &volume_url(&node, "db2"),
            "--rw",
            "randread",
            "--bs",
            "4k",
            "--iodepth",
            "8",
            "--runtime",
            "300ms",
        ],
    );
    assert!(success && out.contains("read"), "{errors}");
    ok(&node, &["snapshot", "delete", "db1@s1"]);
    ok(&node, &["volume", "delete", "db1"]);
    let pools = ok(&node, &["pool", "list", "-o", "json"]);
    assert!(pools.contains("\"volumes\": 2"), "{pools}");
    let _ = std::fs::remove_dir_all(&dir);
}

const SECRET_A: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
const SECRET_B: &str = "DHHC-1:01:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:";

/// `weft bench` against `volume` as the authenticating host, with extra options.
fn bench_as(node: &Node, volume: &str, extra: &[&str]) -> (bool, String, String) {
    let url = volume_url(node, volume);
    let mut args = vec!["bench", "--hostnqn", HOST_NQN, "--target", &url];
    args.extend_from_slice(&["--runtime", "300ms", "--queues", "2", "--verify"]);
    args.extend_from_slice(extra);
    weft(node, &args)
}

#[test]
fn a_host_with_a_dhchap_secret_must_authenticate_each_queue() {
    let dir = temp_dir("dhchap");
    let node = start(&dir.join("data"));
    pool_with_volume(&node, &dir.join("d0.img"), "v1", "8MiB");
    let typo = SECRET_A.replace("ia6z", "ia7z");
    let errors = refused(
        &node,
        &[
            "host",
            "add",
            "h",
            "--nqn",
            HOST_NQN,
            "--dhchap-secret",
            &typo,
        ],
    );
    assert!(errors.contains("checksum"), "{errors}");
    let add = [
        "host",
        "add",
        "h",
        "--nqn",
        HOST_NQN,
        "--dhchap-secret",
        SECRET_A,
    ];
    let (added, _, said) = weft(&node, &add);
    assert!(added && !said.contains("warning"), "{said}");
    ok(&node, &["volume", "attach", "v1", "--host", "h"]);
    let (success, _, errors) = bench_as(&node, "v1", &[]);
    assert!(
        !success && errors.contains("requires this host to authenticate"),
        "{errors}"
    );
    let (success, _, errors) = bench_as(&node, "v1", &["--dhchap-secret", SECRET_B]);
    assert!(!success && errors.contains("wrong secret"), "{errors}");
    let (success, out, errors) = bench_as(&node, "v1", &["--dhchap-secret", SECRET_A]);
    assert!(success && out.contains("all intact"), "{errors}");

    // The host authenticates the node too once the node has a controller secret.
    ok(
        &node,
        &["host", "set", "h", "--dhchap-ctrl-secret", SECRET_B],
    );
    let hosts = ok(&node, &["host", "list"]);
    assert!(
        hosts.contains("bidirectional") && !hosts.contains("DHHC"),
        "{hosts}"
    );
    let both = [
        "--dhchap-secret",
        SECRET_A,
        "--dhchap-ctrl-secret",
        SECRET_B,
    ];
    let (success, out, errors) = bench_as(&node, "v1", &both);
    assert!(success && out.contains("all intact"), "{errors}");
    // Same key, another transform: a different controller secret.
    let impostor = SECRET_B.replace(":01:", ":02:");
    let wrong = [
        "--dhchap-secret",
        SECRET_A,
        "--dhchap-ctrl-secret",
        &impostor,
    ];
    let (success, _, errors) = bench_as(&node, "v1", &wrong);
    assert!(
        !success && errors.contains("does not match the controller secret"),
        "{errors}"
    );
    let errors = refused(&node, &["host", "set", "h"]);
    assert!(errors.contains("--dhchap-secret"), "{errors}");

    // Secrets removed: the host connects without authenticating.
    ok(
        &node,
        &[
            "host",
            "set",
            "h",
            "--dhchap-secret",
            "none",
            "--dhchap-ctrl-secret",
            "none",
        ],
    );
    let (success, _, errors) = bench_as(&node, "v1", &[]);
    assert!(success, "{errors}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `weft host add --tls` makes a PSK, shows it once with the host's
/// commands, and from then on the host is refused in the clear (weft's
/// initiator, which speaks no TLS yet, stands in for a host without it);
/// `host set --tls-psk` rotates or removes it.
#[test]
fn a_host_given_a_tls_psk_is_refused_in_the_clear_until_it_is_removed() {
    let dir = temp_dir("tls-host");
    let node = start(&dir.join("data"));
    pool_with_volume(&node, &dir.join("d0.img"), "v1", "8MiB");
    let errors = refused(
        &node,
        &[
            "host",
            "add",
            "h",
            "--nqn",
            HOST_NQN,
            "--tls-psk",
            "NVMeTLSkey-1:01:AAAA:",
        ],
    );
    assert!(
        errors.contains("TLS PSK") && errors.contains("nvme gen-tls-key"),
        "{errors}"
    );
    let (added, out, said) = weft(&node, &["host", "add", "h", "--nqn", HOST_NQN, "--tls"]);
    assert!(added && !said.contains("warning"), "{said}");
    let psk = out
        .split_whitespace()
        .find(|word| word.starts_with("NVMeTLSkey-1:01:"))
        .expect("the new PSK shown");
    assert!(
        out.contains("nvme check-tls-key") && out.contains("--tls"),
        "{out}"
    );
    ok(&node, &["volume", "attach", "v1", "--host", "h"]);
    let hosts = ok(&node, &["host", "list"]);
    assert!(
        hosts.contains(" yes ") && !hosts.contains("NVMeTLSkey"),
        "{hosts}"
    );
    let (success, _, errors) = bench_as(&node, "v1", &[]);
    assert!(!success && errors.contains("connect over TLS"), "{errors}");
    let rotated = ok(&node, &["host", "set", "h", "--tls-psk", "new"]);
    assert!(
        rotated.contains("NVMeTLSkey-1:01:") && !rotated.contains(psk),
        "{rotated}"
    );
    ok(&node, &["host", "set", "h", "--tls-psk", "none"]);
    let (success, _, errors) = bench_as(&node, "v1", &[]);
    assert!(success, "in the clear again: {errors}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn admin_commands_say_when_no_node_answers() {
    let output = Command::new(WEFT)
        .args(["volume", "list", "--api", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("is `weft serve` running"), "{errors}");
}

/// `weft pool add-device`: a full pool grows online, the new capacity is
/// usable at once (a thick volume that did not fit now does), data written
/// before and after stays, and the pool keeps its devices after a restart.
#[test]
fn a_pool_grows_online_and_keeps_its_new_device_after_a_restart() {
    let dir = temp_dir("grow");
    let [d0, d1] =
        [dir.join("d0.img"), dir.join("d1.img")].map(|p| p.to_str().unwrap().to_string());
    let node = start(&dir.join("data"));
    ok(
        &node,
        &[
            "pool",
            "create",
            "g",
            "--device",
            &d0,
            "--device-size",
            "64MiB",
        ],
    );
    ok(
        &node,
        &[
            "volume", "create", "small", "--pool", "g", "--size", "16MiB", "--thick",
        ],
    );
    let thick = [
        "volume", "create", "big", "--pool", "g", "--size", "96MiB", "--thick",
    ];
    assert!(refused(&node, &thick).contains("is full"));
    ok(&node, &["host", "add", "tester", "--nqn", HOST_NQN]);
    ok(&node, &["volume", "attach", "small", "--host", "tester"]);
    let bench = |node: &Node, args: &[&str]| {
        let url = volume_url(node, "small");
        let mut all = vec![
            "bench",
            "--hostnqn",
            HOST_NQN,
            "--target",
            &url,
            "--bs",
            "64k",
            "--verify",
        ];
        all.extend_from_slice(args);
        ok(node, &all)
    };
    bench(&node, &["--rw", "write", "--size", "16MiB"]);
    let added = ok(
        &node,
        &[
            "pool",
            "add-device",
            "g",
            "--device",
            &d1,
            "--device-size",
            "128MiB",
        ],
    );
    assert!(added.contains("usable now"), "{added}");
    ok(&node, &thick);
    let shown = ok(&node, &["pool", "show", "g"]);
    assert!(shown.contains(&d0) && shown.contains(&d1), "{shown}");
    let error = refused(&node, &["pool", "add-device", "g", "--device", &d1]);
    assert!(error.contains("already a member"), "{error}");
    drop(node);
    let node = start(&dir.join("data"));
    let shown = ok(&node, &["pool", "show", "g"]);
    assert!(
        shown.contains(&d1),
        "the new device after a restart: {shown}"
    );
    assert!(ok(&node, &["volume", "list"]).contains("big"));
    bench(&node, &["--rw", "randrw", "--runtime", "300ms"]);
}

/// A volume created with the NQN, UUID and NGUID a host already knows
/// (moved from another target) is served as them, keeps them across a
/// restart and a delete and re-create, and no other volume may take them.
#[test]
fn a_volume_may_be_given_the_identity_hosts_know() {
    let dir = temp_dir("identity");
    const NQN: &str = "nqn.2014-08.com.example:storage:legacy-db";
    const UUID: &str = "6f1c9b0e-2a4d-4e8b-9c55-0d3e7a1b2c4d";
    const NGUID: &str = "0123456789abcdef0123456789abcdef";
    let create = [
        "volume", "create", "legacy", "--pool", "p", "--size", "8MiB", "--nqn", NQN, "--uuid",
        UUID, "--nguid", NGUID,
    ];
    let check = |node: &Node| {
        let shown: serde_json::Value =
            serde_json::from_str(&ok(node, &["volume", "show", "legacy", "-o", "json"])).unwrap();
        assert_eq!(
            (
                shown["nqn"].as_str(),
                shown["uuid"].as_str(),
                shown["nguid"].as_str()
            ),
            (Some(NQN), Some(UUID), Some(NGUID)),
            "{shown}"
        );
        let (success, out) =
            support::bench(node, HOST_NQN, NQN, &["--runtime", "200ms", "--verify"]);
        assert!(success, "{out}");
    };
    {
        let node = start(&dir.join("data"));
        pool_with_volume(&node, &dir.join("d0.img"), "v1", "8MiB");
        ok(&node, &create);
        ok(&node, &["host", "add", "h", "--nqn", HOST_NQN]);
        ok(&node, &["volume", "attach", "legacy", "--host", "h"]);
        check(&node);
        let taken = [
            "volume", "create", "other", "--pool", "p", "--size", "8MiB", "--nqn", NQN,
        ];
        assert!(refused(&node, &taken).contains("already volume legacy's"));
        let taken = [
            "volume", "create", "other", "--pool", "p", "--size", "8MiB", "--uuid", NGUID,
        ];
        assert!(refused(&node, &taken).contains("already volume legacy's"));
        let bad = [
            "volume", "create", "other", "--pool", "p", "--size", "8MiB", "--uuid", "xyz",
        ];
        assert!(refused(&node, &bad).contains("32 hex digits"));
    }
    let node = start(&dir.join("data"));
    check(&node);
    support::wait_no_connected_hosts(&node, "legacy");
    ok(&node, &["volume", "delete", "legacy"]);
    ok(&node, &create);
    ok(&node, &["volume", "attach", "legacy", "--host", "h"]);
    check(&node);
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
