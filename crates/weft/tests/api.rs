//! The node API over real HTTP: every route's success and its error paths
//! (status and `{code, message, hint}`), the bearer token, the OpenAPI
//! document, and hosts, attachments and limits after a kill -9 and restart.

mod support;

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use support::{api, ok, refused, start_node, temp_dir, Node, WEFT};

/// Calls the API with the node's token; asserts the status, returns the body.
fn call(node: &Node, method: &str, path: &str, body: Option<Value>, status: u16) -> Value {
    let body = body.map(|b| b.to_string());
    let (got, value) = api(node, Some(&node.token), method, path, body.as_deref());
    assert_eq!(got, status, "{method} {path}: {value}");
    if status >= 400 {
        for field in ["code", "message", "hint"] {
            assert!(
                value[field].is_string(),
                "{method} {path}: no {field} in {value}"
            );
        }
    }
    value
}

/// An error's code.
fn code(value: &Value) -> &str {
    value["code"].as_str().unwrap()
}

/// An error's message.
fn message(value: &Value) -> &str {
    value["message"].as_str().unwrap()
}

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:aaaaaaaa-0000-0000-0000-000000000001";
const NQN_B: &str = "nqn.2014-08.org.nvmexpress:uuid:bbbbbbbb-0000-0000-0000-000000000002";

#[test]
fn tokens_routes_and_the_openapi_document() {
    let dir = temp_dir("api-basics");
    let node = start_node(&dir.join("data"), &[]);
    // Created, never shown: the banner lands in logs.
    assert_eq!(node.token.len(), 64);
    assert!(!node.banner.contains(&node.token), "{}", node.banner);
    assert!(node.banner.contains("api-token (new)"), "{}", node.banner);
    // The scoped tokens beside it, private: each calls what its role may, and
    // is answered 403 beyond (reads for Prometheus; volume lifecycle for CSI).
    let scoped = |suffix: &str| {
        let path = dir.join("data").join(format!("api-token.{suffix}"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
        std::fs::read_to_string(path).unwrap().trim().to_string()
    };
    let (read_only, csi) = (scoped("read-only"), scoped("csi"));
    assert!(!node.banner.contains(&read_only) && !node.banner.contains(&csi));
    let (status, _) = api(&node, Some(&read_only), "GET", "/api/v1/pools", None);
    assert_eq!(status, 200);
    let host = json!({"name": "scoped", "nqn": NQN_A});
    let (status, error) = api(
        &node,
        Some(&read_only),
        "POST",
        "/api/v1/hosts",
        Some(&host.to_string()),
    );
    assert_eq!((status, code(&error)), (403, "forbidden"), "{error}");
    assert!(
        message(&error).contains("read-only token may not call POST /api/v1/hosts"),
        "{error}"
    );
    let (status, _) = api(
        &node,
        Some(&csi),
        "POST",
        "/api/v1/hosts",
        Some(&host.to_string()),
    );
    assert_eq!(status, 201);
    // The CSI token sets the secrets of its own (`csi-`) hosts only.
    let unset = json!({"dhchap_secret": null}).to_string();
    let (status, error) = api(
        &node,
        Some(&csi),
        "PATCH",
        "/api/v1/hosts/scoped",
        Some(&unset),
    );
    assert_eq!((status, code(&error)), (403, "forbidden"), "{error}");
    let pool = json!({"name": "p", "devices": [dir.join("d.img")]});
    let (status, error) = api(
        &node,
        Some(&csi),
        "POST",
        "/api/v1/pools",
        Some(&pool.to_string()),
    );
    assert_eq!((status, code(&error)), (403, "forbidden"), "{error}");
    // Only nodes forward calls (a forwarded call skips the cluster's checks).
    let (status, error) = api(&node, Some(&csi), "GET", "/api/v1/pools?local=1", None);
    assert_eq!((status, code(&error)), (403, "forbidden"), "{error}");
    call(&node, "DELETE", "/api/v1/hosts/scoped", None, 200);
    let (status, document) = api(&node, None, "GET", "/api/v1/openapi.json", None);
    assert_eq!(status, 200);
    assert!(document["paths"]["/api/v1/volumes/{volume}/qos"]["patch"].is_object());
    let (status, error) = api(&node, None, "GET", "/api/v1/volumes", None);
    assert_eq!((status, code(&error)), (401, "unauthorized"));
    assert!(error["hint"].as_str().unwrap().contains("api-token"));
    let (status, error) = api(&node, Some("not-the-token"), "GET", "/api/v1/volumes", None);
    assert_eq!((status, code(&error)), (401, "unauthorized"));
    let error = call(&node, "GET", "/api/v1/nothing", None, 404);
    assert_eq!(code(&error), "no_route");
    let error = call(&node, "GET", "/elsewhere", None, 404);
    assert_eq!(code(&error), "no_route");
    let error = call(&node, "PUT", "/api/v1/volumes/x", None, 405);
    assert_eq!(code(&error), "method_not_allowed");
    assert!(error["hint"].as_str().unwrap().contains("GET or DELETE"));
    let error = call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": 1})),
        400,
    );
    assert_eq!(code(&error), "invalid_json");
    let (status, error) = api(
        &node,
        Some(&node.token),
        "POST",
        "/api/v1/pools",
        Some("{not json"),
    );
    assert_eq!((status, code(&error)), (400, "invalid_json"));
    let error = call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "a", "nqn": NQN_A, "extra": 1})),
        400,
    );
    assert!(message(&error).contains("unknown field"), "{error}");
    // A token file of the operator's choosing: refused while others may
    // read it, by the node and by the command line, each saying the fix.
    let file = dir.join("secret-token");
    std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let fix = format!("chmod 600 {}", file.display());
    let refused = Command::new(WEFT)
        .args([
            "serve",
            "--api-listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.join("data2"))
        .arg("--api-token-file")
        .arg(&file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains(&fix), "{said}");
    let refused = Command::new(WEFT)
        .args(["volume", "list", "--api", &node.api, "--api-token-file"])
        .arg(&file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains(&fix), "{said}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    drop(node);
    let mut node = start_node(
        &dir.join("data2"),
        &["--api-token-file", file.to_str().unwrap()],
    );
    node.token = "0123456789abcdef0123456789abcdef".into();
    call(&node, "GET", "/api/v1/hosts", None, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A leaked scoped token is revoked alone (`weft token renew`): refused
/// at once, its successor written beside the admin token and accepted,
/// the other scoped token and the admin token untouched, across a restart.
#[test]
fn a_scoped_token_is_revoked_alone_and_its_successor_written() {
    let dir = temp_dir("api-renew");
    let node = start_node(&dir.join("data"), &[]);
    let file = dir.join("data").join("api-token.csi");
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap().trim().to_string();
    let (old_csi, read_only) = (read(&file), read(&dir.join("data/api-token.read-only")));
    let (status, _) = api(&node, Some(&old_csi), "GET", "/api/v1/volumes", None);
    assert_eq!(status, 200);
    // Only the admin token renews; a scoped token may not, the admin token has no generation.
    let (status, error) = api(
        &node,
        Some(&old_csi),
        "POST",
        "/api/v1/tokens/csi/renew",
        None,
    );
    assert_eq!((status, code(&error)), (403, "forbidden"), "{error}");
    let said = refused(&node, &["token", "renew", "admin"]);
    assert!(
        said.contains("the scoped tokens are csi and read-only"),
        "{said}"
    );
    let said = ok(&node, &["token", "renew", "csi"]);
    assert!(
        said.contains("renewed") && said.contains("api-token.ROLE"),
        "{said}"
    );
    let (status, error) = api(&node, Some(&old_csi), "GET", "/api/v1/volumes", None);
    assert_eq!(
        (status, code(&error)),
        (401, "unauthorized"),
        "the old token: {error}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while read(&file) == old_csi {
        assert!(
            std::time::Instant::now() < deadline,
            "the new CSI token was not written"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let new_csi = read(&file);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!node.banner.contains(&new_csi));
    let host = json!({"name": "renewed", "nqn": NQN_A}).to_string();
    let (status, _) = api(&node, Some(&new_csi), "POST", "/api/v1/hosts", Some(&host));
    assert_eq!(status, 201);
    let (status, _) = api(&node, Some(&read_only), "GET", "/api/v1/hosts", None);
    assert_eq!(status, 200, "the read-only token is untouched");
    // The generation is in the node's store: the same tokens after a restart.
    let token = node.token.clone();
    assert!(node.terminate().success());
    let node = start_node(&dir.join("data"), &[]);
    assert_eq!(node.token, token);
    assert_eq!(read(&file), new_csi);
    for (presented, status) in [(&old_csi, 401), (&new_csi, 200), (&read_only, 200)] {
        let (got, _) = api(&node, Some(presented), "GET", "/api/v1/hosts", None);
        assert_eq!(got, status);
    }
}

#[test]
fn every_route_answers_and_fails_as_documented_and_state_survives_kill_9() {
    let dir = temp_dir("api-routes");
    let data = dir.join("data");
    let node = start_node(&data, &[]);
    let device = dir.join("d0.img");
    let pool = json!({"name": "p", "devices": [device], "device_size_bytes": 64 << 20, "allocation_unit_bytes": 1 << 20});
    // Pools.
    call(&node, "POST", "/api/v1/pools", Some(pool.clone()), 201);
    assert_eq!(
        code(&call(&node, "POST", "/api/v1/pools", Some(pool), 409)),
        "exists"
    );
    let other = json!({"name": "q", "devices": [device]});
    assert_eq!(
        code(&call(&node, "POST", "/api/v1/pools", Some(other), 400)),
        "invalid"
    );
    let pools = call(&node, "GET", "/api/v1/pools", None, 200);
    assert_eq!(pools[0]["name"], "p");
    // Volumes.
    let volume = |name: &str, size: u64| json!({"name": name, "pool": "p", "size_bytes": size});
    call(
        &node,
        "POST",
        "/api/v1/volumes",
        Some(volume("db1", 16 << 20)),
        201,
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes",
            Some(volume("db1", 1 << 20)),
            409
        )),
        "exists"
    );
    let missing_pool = json!({"name": "x", "pool": "nope", "size_bytes": 1 << 20});
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes",
            Some(missing_pool),
            404
        )),
        "not_found"
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes",
            Some(json!({"name": "x"})),
            400
        )),
        "invalid"
    );
    let too_big = json!({"name": "thick", "pool": "p", "size_bytes": 1u64 << 30, "thick": true});
    assert_eq!(
        code(&call(&node, "POST", "/api/v1/volumes", Some(too_big), 507)),
        "pool_full"
    );
    assert_eq!(
        call(&node, "GET", "/api/v1/volumes", None, 200)
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        call(&node, "GET", "/api/v1/volumes/db1", None, 200)["size_bytes"],
        16 << 20
    );
    assert_eq!(
        code(&call(&node, "GET", "/api/v1/volumes/nope", None, 404)),
        "not_found"
    );
    call(
        &node,
        "POST",
        "/api/v1/volumes/db1/resize",
        Some(json!({"size_bytes": 32 << 20})),
        200,
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes/db1/resize",
            Some(json!({"size_bytes": 1 << 20})),
            400
        )),
        "invalid"
    );
    // Snapshots, clones, flatten.
    call(
        &node,
        "POST",
        "/api/v1/volumes/db1/snapshots",
        Some(json!({"name": "s1"})),
        201,
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes/db1/snapshots",
            Some(json!({"name": "s1"})),
            409
        )),
        "exists"
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes",
            Some(json!({"name": "c", "source": "db1"})),
            400
        )),
        "invalid"
    );
    call(
        &node,
        "POST",
        "/api/v1/volumes",
        Some(json!({"name": "c1", "source": "db1@s1"})),
        201,
    );
    call(&node, "POST", "/api/v1/volumes/c1/flatten", None, 200);
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes/nope/flatten",
            None,
            404
        )),
        "not_found"
    );
    assert_eq!(
        code(&call(&node, "DELETE", "/api/v1/volumes/db1", None, 409)),
        "has_snapshots"
    );
    assert_eq!(
        code(&call(
            &node,
            "DELETE",
            "/api/v1/volumes/db1/snapshots/s9",
            None,
            404
        )),
        "not_found"
    );
    call(
        &node,
        "DELETE",
        "/api/v1/volumes/db1/snapshots/s1",
        None,
        200,
    );
    // Hosts.
    call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "web1", "nqn": NQN_A})),
        201,
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/hosts",
            Some(json!({"name": "web1", "nqn": NQN_B})),
            409
        )),
        "exists"
    );
    let same_nqn = call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "web2", "nqn": NQN_A})),
        409,
    );
    assert!(message(&same_nqn).contains("already registered as host web1"));
    let bad_nqn = call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "web2", "nqn": "web 2"})),
        400,
    );
    assert!(message(&bad_nqn).contains("' ' is not allowed in an NQN"));
    call(
        &node,
        "POST",
        "/api/v1/hosts",
        Some(json!({"name": "web2", "nqn": NQN_B})),
        201,
    );
    assert_eq!(
        call(&node, "GET", "/api/v1/hosts", None, 200)
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        call(&node, "GET", "/api/v1/hosts/web1", None, 200)["nqn"],
        NQN_A
    );
    assert_eq!(
        code(&call(&node, "GET", "/api/v1/hosts/nope", None, 404)),
        "not_found"
    );
    dhchap_secrets_are_checked_stored_and_never_shown(&node);
    // Attachments.
    call(
        &node,
        "POST",
        "/api/v1/volumes/db1/hosts",
        Some(json!({"host": "web1"})),
        200,
    );
    call(
        &node,
        "POST",
        "/api/v1/volumes/c1/hosts",
        Some(json!({"host": "web2"})),
        200,
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes/db1/hosts",
            Some(json!({"host": "nope"})),
            404
        )),
        "not_found"
    );
    assert_eq!(
        code(&call(
            &node,
            "POST",
            "/api/v1/volumes/nope/hosts",
            Some(json!({"host": "web1"})),
            404
        )),
        "not_found"
    );
    assert_eq!(
        call(&node, "GET", "/api/v1/hosts/web1", None, 200)["volumes"],
        json!(["db1"])
    );
    assert_eq!(
        code(&call(&node, "DELETE", "/api/v1/hosts/web1", None, 409)),
        "attached"
    );
    call(&node, "DELETE", "/api/v1/volumes/c1/hosts/web2", None, 200);
    call(&node, "DELETE", "/api/v1/hosts/web2", None, 200);
    assert_eq!(
        code(&call(&node, "DELETE", "/api/v1/hosts/web2", None, 404)),
        "not_found"
    );
    // Limits.
    call(
        &node,
        "PATCH",
        "/api/v1/volumes/db1/qos",
        Some(json!({"iops_max": 20000, "write_bw_max": 200 << 20})),
        200,
    );
    call(
        &node,
        "PATCH",
        "/api/v1/volumes/db1/qos",
        Some(json!({"read_iops_max": 5000, "write_bw_max": null})),
        200,
    );
    assert_eq!(
        code(&call(
            &node,
            "PATCH",
            "/api/v1/volumes/db1/qos",
            Some(json!({"bw_max": 5})),
            400
        )),
        "invalid"
    );
    assert_eq!(
        code(&call(
            &node,
            "PATCH",
            "/api/v1/volumes/nope/qos",
            Some(json!({"iops_max": 100})),
            404
        )),
        "not_found"
    );
    let shown = call(&node, "GET", "/api/v1/volumes/db1", None, 200);
    assert_eq!(shown["qos"]["iops_max"], 20000);
    assert_eq!(shown["qos"]["read_iops_max"], 5000);
    assert!(shown["qos"]["write_bw_max"].is_null());
    assert_eq!(shown["hosts"], json!(["web1"]));
    let volumes = call(&node, "GET", "/api/v1/volumes", None, 200);
    let hosts = call(&node, "GET", "/api/v1/hosts", None, 200);
    let pools = call(&node, "GET", "/api/v1/pools", None, 200);
    // kill -9 (the test server's drop kills it) and restart: the same state.
    drop(node);
    let node = start_node(&data, &[]);
    assert_eq!(call(&node, "GET", "/api/v1/volumes", None, 200), volumes);
    assert_eq!(call(&node, "GET", "/api/v1/hosts", None, 200), hosts);
    assert_eq!(call(&node, "GET", "/api/v1/pools", None, 200), pools);
    // Deleting a volume forgets its record: a new one of that name starts clean.
    call(&node, "DELETE", "/api/v1/volumes/db1/hosts/web1", None, 200);
    call(
        &node,
        "POST",
        "/api/v1/volumes/db1/hosts",
        Some(json!({"host": "web1"})),
        200,
    );
    call(&node, "DELETE", "/api/v1/volumes/db1", None, 200);
    call(
        &node,
        "POST",
        "/api/v1/volumes",
        Some(volume("db1", 8 << 20)),
        201,
    );
    let fresh = call(&node, "GET", "/api/v1/volumes/db1", None, 200);
    assert_eq!(fresh["hosts"], json!([]));
    assert!(fresh["qos"]["iops_max"].is_null());
    call(&node, "DELETE", "/api/v1/hosts/web1", None, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

const SECRET_A: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
const SECRET_B: &str = "DHHC-1:01:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:";

/// POST /hosts with secrets and PATCH /hosts/{host}: validated, summarised
/// as none/host/bidirectional, never echoed.
fn dhchap_secrets_are_checked_stored_and_never_shown(node: &Node) {
    let nqn = "nqn.2014-08.org.nvmexpress:uuid:33333333-3333-3333-3333-333333333333";
    let add = |body: Value, status: u16| call(node, "POST", "/api/v1/hosts", Some(body), status);
    let patch =
        |body: Value, status: u16| call(node, "PATCH", "/api/v1/hosts/web3", Some(body), status);
    let dhchap = || call(node, "GET", "/api/v1/hosts/web3", None, 200)["dhchap"].clone();
    let typo = SECRET_A.replace("ia6z", "ia7z");
    let refused = add(
        json!({"name": "web3", "nqn": nqn, "dhchap_secret": typo}),
        400,
    );
    assert_eq!(code(&refused), "invalid");
    assert!(message(&refused).contains("checksum"), "{refused}");
    assert!(message(&refused).contains("gen-dhchap-key"), "{refused}");
    let controller_only = json!({"name": "web3", "nqn": nqn, "dhchap_ctrl_secret": SECRET_B});
    assert_eq!(code(&add(controller_only, 400)), "invalid");
    let same_twice = json!({"name": "web3", "nqn": nqn, "dhchap_secret": SECRET_A, "dhchap_ctrl_secret": SECRET_A});
    assert_eq!(code(&add(same_twice, 400)), "invalid");
    add(
        json!({"name": "web3", "nqn": nqn, "dhchap_secret": SECRET_A}),
        201,
    );
    assert_eq!(dhchap(), "host");
    patch(json!({"dhchap_ctrl_secret": SECRET_B}), 200);
    assert_eq!(dhchap(), "bidirectional");
    let listed = call(node, "GET", "/api/v1/hosts", None, 200).to_string();
    assert!(
        !listed.contains("DHHC-1"),
        "secrets are never shown: {listed}"
    );
    assert_eq!(code(&patch(json!({"dhchap_secret": null}), 400)), "invalid");
    assert_eq!(
        code(&patch(json!({"secret": SECRET_A}), 400)),
        "invalid_json"
    );
    let unknown = call(
        node,
        "PATCH",
        "/api/v1/hosts/nope",
        Some(json!({"dhchap_secret": null})),
        404,
    );
    assert_eq!(code(&unknown), "not_found");
    patch(
        json!({"dhchap_secret": null, "dhchap_ctrl_secret": null}),
        200,
    );
    assert_eq!(dhchap(), "none");
    call(node, "DELETE", "/api/v1/hosts/web3", None, 200);
}

/// A self-signed certificate for 127.0.0.1 made with openssl: (cert, key).
fn self_signed(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("api.crt"), dir.join("api.key"));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=weft-test"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl is installed (test.sh installs it)");
    assert!(status.success());
    (cert, key)
}

#[test]
fn the_api_is_served_over_tls_when_given_a_certificate() {
    let dir = temp_dir("api-tls");
    let (cert, key) = self_signed(&dir);
    let node = start_node(
        &dir.join("data"),
        &[
            "--api-tls-cert",
            cert.to_str().unwrap(),
            "--api-tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(node.api_url.starts_with("https://"), "{}", node.api_url);
    let weft = |extra: &[&str]| {
        std::process::Command::new(support::WEFT)
            .args(["host", "list", "--api", &node.api_url])
            .args(extra)
            .env("WEFT_API_TOKEN", &node.token)
            .output()
            .unwrap()
    };
    let listed = weft(&["--api-ca", cert.to_str().unwrap()]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains("NAME"));
    // Without the CA the certificate is not trusted.
    let untrusted = weft(&["--api-ca", "/etc/ssl/certs/ca-certificates.crt"]);
    assert!(!untrusted.status.success());
    let errors = String::from_utf8_lossy(&untrusted.stderr);
    assert!(errors.contains("certificate"), "{errors}");
    // Plain HTTP to the TLS port is told to use https.
    let plain = std::process::Command::new(support::WEFT)
        .args(["host", "list", "--api", &format!("http://{}", node.api)])
        .env("WEFT_API_TOKEN", &node.token)
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&plain.stderr);
    assert!(
        !plain.status.success() && errors.contains("https://"),
        "{errors}"
    );
    // Half a TLS configuration is refused at start.
    let half = std::process::Command::new(support::WEFT)
        .args([
            "serve",
            "--api-listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.join("half"))
        .args(["--api-tls-cert", cert.to_str().unwrap()])
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&half.stderr);
    assert!(
        !half.status.success() && errors.contains("go together"),
        "{errors}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pools_are_shown_per_device_deleted_when_empty_and_failures_cleared_on_purpose() {
    let dir = temp_dir("api-pools");
    let node = start_node(&dir.join("data"), &[]);
    let devices = [dir.join("m0.img"), dir.join("m1.img")];
    let pool = json!({"name": "p", "devices": devices, "device_size_bytes": 64 << 20});
    call(&node, "POST", "/api/v1/pools", Some(pool.clone()), 201);
    let volume = json!({"name": "v", "pool": "p", "size_bytes": 8 << 20});
    call(&node, "POST", "/api/v1/volumes", Some(volume), 201);
    let shown = call(&node, "GET", "/api/v1/pools/p", None, 200);
    assert_eq!(shown["state"], "online");
    let members = shown["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    assert!(members
        .iter()
        .all(|m| m["metadata_copy"] == true && m["state"] == "online"));
    assert_eq!(
        code(&call(&node, "GET", "/api/v1/pools/nope", None, 404)),
        "not_found"
    );
    // Refused while it holds volumes, naming them.
    let error = call(&node, "DELETE", "/api/v1/pools/p", None, 400);
    assert!(message(&error).contains("it holds volumes v"), "{error}");
    // A failure can only be cleared where there is one.
    let error = call(&node, "POST", "/api/v1/pools/p/clear-failure", None, 400);
    assert!(message(&error).contains("has not failed"), "{error}");
    let default = "/api/v1/subsystems/nqn.2026-11.io.weft:default/namespaces";
    let error = call(
        &node,
        "POST",
        &format!("{default}/1/clear-failure"),
        None,
        400,
    );
    assert!(message(&error).contains("has not failed"), "{error}");
    call(
        &node,
        "POST",
        &format!("{default}/9/clear-failure"),
        None,
        404,
    );
    call(
        &node,
        "POST",
        &format!("{default}/x/clear-failure"),
        None,
        400,
    );
    // Empty: deleted, and its devices make a new pool without --force.
    call(&node, "DELETE", "/api/v1/volumes/v", None, 200);
    call(&node, "DELETE", "/api/v1/pools/p", None, 200);
    assert_eq!(call(&node, "GET", "/api/v1/pools", None, 200), json!([]));
    call(&node, "POST", "/api/v1/pools", Some(pool), 201);
}

/// The API's limits from weft.toml: a client that trickles its request is
/// cut off at the request deadline, and connections over the limit are
/// answered 503 at once while the others are served.
#[test]
fn the_api_limits_connections_and_the_time_to_send_a_request() {
    use std::io::{Read, Write};
    let dir = temp_dir("api-limits");
    let config = dir.join("weft.toml");
    std::fs::write(
        &config,
        "[limits]\napi_connections = 2\napi_request_timeout_ms = 600\n\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.weft:limits\"\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    let node = start_node(&dir.join("data"), &["--config", config.to_str().unwrap()]);
    // A slow client: one byte every 100 ms never finishes its request line.
    let started = std::time::Instant::now();
    let mut slow = std::net::TcpStream::connect(&node.api).unwrap();
    let mut answer = String::new();
    for byte in b"GET /api/v1/pools HTTP/1.1\r\n".iter().cycle().take(40) {
        if slow.write_all(&[*byte]).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = slow.read_to_string(&mut answer);
    assert!(started.elapsed() < std::time::Duration::from_secs(3));
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("request_timeout"),
        "{answer}"
    );
    drop(slow);
    // Two idle connections hold both places; a third is told the node is busy.
    let idle: Vec<_> = (0..2)
        .map(|_| std::net::TcpStream::connect(&node.api).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (status, error) = api(&node, Some(&node.token), "GET", "/api/v1/pools", None);
    assert_eq!((status, code(&error)), (503, "busy"), "{error}");
    drop(idle);
    // Their places come back when they are cut off or close.
    std::thread::sleep(std::time::Duration::from_millis(800));
    call(&node, "GET", "/api/v1/pools", None, 200);
}

/// One client address cannot take every API connection (idle ones reopened
/// as they are cut off used to shut out every other client, node-to-node
/// calls included): past its share it is answered 503 while another
/// address is served, and an idle connection holds its place only for the
/// head's deadline, not the whole request's.
#[test]
fn one_address_cannot_hold_every_api_connection() {
    use std::io::{Read, Write};
    let dir = temp_dir("api-per-address");
    let config = dir.join("weft.toml");
    std::fs::write(
        &config,
        "[limits]\napi_connections = 8\napi_connections_per_address = 3\napi_head_timeout_ms = 500\n\n\
         [[subsystem]]\nnqn = \"nqn.2026-11.io.weft:per-address\"\n\
         [[subsystem.namespace]]\nbackend = \"ram\"\nsize = \"1MiB\"\n",
    )
    .unwrap();
    let node = start_node(&dir.join("data"), &["--config", config.to_str().unwrap()]);
    let idle: Vec<_> = (0..3)
        .map(|_| std::net::TcpStream::connect(&node.api).unwrap())
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (status, error) = api(&node, Some(&node.token), "GET", "/api/v1/pools", None);
    assert_eq!((status, code(&error)), (503, "busy"), "{error}");
    assert!(message(&error).contains("per address"), "{error}");
    // Another address is served meanwhile.
    let port: u16 = node.api.rsplit_once(':').unwrap().1.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let mut other = runtime
        .block_on(async {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().unwrap())?;
            socket
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
        })
        .unwrap()
        .into_std()
        .unwrap();
    other.set_nonblocking(false).unwrap();
    let request = format!(
        "GET /api/v1/pools HTTP/1.1\r\nHost: weft\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        node.token
    );
    other.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    other.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The idle ones are cut off at the head's deadline (the request's is 10 s).
    std::thread::sleep(std::time::Duration::from_millis(800));
    call(&node, "GET", "/api/v1/pools", None, 200);
    drop(idle);
}

#[test]
fn a_caller_learns_its_role_and_a_long_poll_wakes_at_a_change() {
    let dir = temp_dir("api-changes");
    let node = start_node(&dir.join("data"), &[]);
    let read_only = std::fs::read_to_string(dir.join("data/api-token.read-only")).unwrap();
    let session = call(&node, "GET", "/api/v1/session", None, 200);
    assert_eq!(
        session,
        json!({"role": "admin", "node": null, "cluster": false})
    );
    let (status, session) = api(
        &node,
        Some(read_only.trim()),
        "GET",
        "/api/v1/session",
        None,
    );
    assert_eq!((status, &session["role"]), (200, &json!("read-only")));
    let (status, _) = api(&node, None, "GET", "/api/v1/session", None);
    assert_eq!(status, 401);

    // Without `after`, the generation now; with it and no change, the same
    // one once the wait is over.
    let now = call(&node, "GET", "/api/v1/changes", None, 200)["generation"]
        .as_u64()
        .unwrap();
    let started = std::time::Instant::now();
    let path = format!("/api/v1/changes?after={now}&wait_ms=300");
    assert_eq!(call(&node, "GET", &path, None, 200)["generation"], now);
    assert!(started.elapsed() >= std::time::Duration::from_millis(250));
    // A change made meanwhile wakes a long poll at once.
    let waiter = {
        let (address, token) = (node.api.clone(), node.token.clone());
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let path = format!("/api/v1/changes?after={now}&wait_ms=10000");
            let (status, body) = support::api_at(&address, Some(&token), "GET", &path, None);
            (status, body, started.elapsed())
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let host = json!({"name": "woken", "nqn": NQN_A});
    call(&node, "POST", "/api/v1/hosts", Some(host), 201);
    let (status, body, waited) = waiter.join().unwrap();
    assert_eq!(status, 200);
    assert!(body["generation"].as_u64().unwrap() > now, "{body}");
    assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    // Mistakes are named.
    let error = call(&node, "GET", "/api/v1/changes?after=soon", None, 400);
    assert!(
        message(&error).contains("after=\"soon\" is not a number"),
        "{error}"
    );
    let error = call(&node, "GET", "/api/v1/changes?since=1", None, 400);
    assert!(
        message(&error).contains("unknown parameter \"since\""),
        "{error}"
    );
}
