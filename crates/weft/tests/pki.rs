//! The cluster's own CA, as the guide sets a cluster up (docs/guide/04-cluster.md): `weft cluster
//! init` and `weft cluster issue NODE`, etcd over TLS asking every client
//! for a certificate from that CA, and two nodes started with theirs
//! (`--pki`). Nodes call each other with their certificates over TLS only;
//! each attack that worked against a cluster reached by its token alone is
//! tried here, with its refusal: a member record pointed at an attacker
//! no longer gets the cluster's token (it got it in clear text before),
//! the admin token cannot send the calls only nodes forward, and etcd
//! refuses a client without a certificate. Replication links authenticate
//! with secrets only their two nodes can compute (from their certificates):
//! the cluster's token no longer lets a client in as a node.

mod support;

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::etcd::{free_port, Etcd, Tls};
use support::{ok, start_node_on, temp_dir, Node, WEFT};

/// `weft cluster ARGS` with the CA under `pki`: its stdout, or its stderr
/// when it fails.
fn cluster(pki: &Path, args: &[&str]) -> (bool, String) {
    let output = Command::new(WEFT)
        .arg("cluster")
        .args(args)
        .arg("--pki")
        .arg(pki)
        .output()
        .unwrap();
    let text = if output.status.success() {
        &output.stdout
    } else {
        &output.stderr
    };
    (
        output.status.success(),
        String::from_utf8_lossy(text).into_owned(),
    )
}

/// Node `name` with its certificates, its data under `dir/name`.
fn node(dir: &Path, pki: &Path, name: &str, endpoints: &str, token: Option<&Path>) -> Node {
    let certificates = pki.join("nodes").join(name);
    node_with(dir, pki, name, endpoints, token, &certificates, &[])
}

/// [`node`] with its certificates in `certificates` and `extra` arguments.
fn node_with(
    dir: &Path,
    pki: &Path,
    name: &str,
    endpoints: &str,
    token: Option<&Path>,
    certificates: &Path,
    extra: &[&str],
) -> Node {
    let certificates = certificates.to_str().unwrap();
    let mut args = vec![
        "--cluster",
        endpoints,
        "--node",
        name,
        "--pki",
        certificates,
    ];
    args.extend(extra);
    let token_path = token.map(|t| t.to_str().unwrap().to_string());
    if let Some(path) = &token_path {
        args.extend(["--api-token-file", path]);
    }
    let listen = format!("127.0.0.1:{}", free_port());
    let mut node = start_node_on(&dir.join(name), &listen, &args);
    let token = token.map_or(dir.join(name).join("api-token"), Path::to_path_buf);
    node.token = std::fs::read_to_string(token).unwrap().trim().to_string();
    node.api_ca = Some(pki.join("ca.crt"));
    node
}

/// A listener that keeps the first bytes each connection sends.
fn eavesdropper() -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (heard, hear) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            stream
                .set_read_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let mut bytes = vec![0u8; 4096];
            let read = stream.read(&mut bytes).unwrap_or(0);
            bytes.truncate(read);
            let _ = heard.send(bytes);
        }
    });
    (address, hear)
}

/// A cluster CA under `dir/pki` with certificates for `names`, and etcd
/// over TLS asking for them.
fn certified_etcd(dir: &Path, names: &[&str]) -> (Etcd, String, PathBuf) {
    let pki = dir.join("pki");
    let (made, said) = cluster(&pki, &["init"]);
    assert!(made, "{said}");
    for name in names {
        let (made, said) = cluster(&pki, &["issue", name]);
        assert!(made, "{said}");
    }
    let n1_files = pki.join("nodes").join(names[0]);
    let etcd = Etcd::start_tls(
        1,
        dir,
        Tls {
            ca: pki.join("ca.crt"),
            server: (pki.join("etcd.crt"), pki.join("etcd.key")),
            client: (n1_files.join("node.crt"), n1_files.join("node.key")),
        },
    );
    let endpoints = etcd.endpoints();
    (etcd, endpoints, pki)
}

/// The replication links of a cluster with certificates: the primary
/// writes to its replica with secrets derived from the two nodes'
/// certificates. A client holding the cluster's token connected to a
/// replica subsystem as the primary's node with the secrets the token
/// gives (and could then fence and write the copy); it is refused now.
#[test]
fn replication_links_use_secrets_only_their_two_nodes_hold() {
    use weft_initiator::{ConnectOptions, Controller, TargetUrl};
    use weft_node::manager::{node_host_nqn, replica_nqn};
    let dir = temp_dir("pki-links");
    let (etcd, endpoints, pki) = certified_etcd(&dir, &["n1", "n2"]);
    let n1 = node(&dir, &pki, "n1", &endpoints, None);
    let token_file = dir.join("n1").join("api-token");
    let n2 = node(&dir, &pki, "n2", &endpoints, Some(&token_file));
    let start = std::time::Instant::now();
    while !ok(&n1, &["node", "list"]).contains("n2") {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(200));
    }
    for name in ["n1", "n2"] {
        let device = dir.join(name).join("p.img");
        let device = device.to_str().unwrap();
        let args = ["pool", "create", "p", "--node", name, "--device", device];
        ok(&n1, &[&args[..], &["--device-size", "256MiB"]].concat());
    }
    let create = [
        "volume",
        "create",
        "rep",
        "--size",
        "16MiB",
        "--replicas",
        "2",
    ];
    let create = [&create[..], &["--node", "n1"]].concat();
    let start = std::time::Instant::now();
    while !support::weft(&n1, &create).0 {
        assert!(start.elapsed() < Duration::from_secs(20), "never created");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The primary's link to n2 authenticates: the replica comes in sync.
    let start = std::time::Instant::now();
    loop {
        let shown = ok(&n1, &["volume", "show", "rep"]);
        if shown.matches("in-sync").count() == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{shown}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let records = etcd
        .ctl(&endpoints)
        .args(["get", "/weft/cluster/members/n2", "--print-value-only"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&records.stdout).contains("\"certificate\""));
    // (The links between certified nodes run in TLS streams.)
    // n1's own credentials for the link to n2 (from n1's key and n2's
    // certificate, as n1 derives them) connect in a TLS stream with its PSK,
    // once n2 exports the replica (it makes its copy as it sees the record).
    let record: serde_json::Value = serde_json::from_slice(&records.stdout).unwrap();
    let n2_peer = weft_node::link_keys::Peer {
        name: "n2".into(),
        certificate: Some(record["certificate"].as_str().unwrap().to_string()),
    };
    let files = pki.join("nodes/n1");
    let n1_identity = weft_http::tls::NodeIdentity::from_pem_files(
        &pki.join("ca.crt"),
        &files.join("node.crt"),
        &files.join("node.key"),
    )
    .unwrap();
    let keys =
        weft_node::link_keys::LinkKeys::of_certificates(std::sync::Arc::new(Pair(n1_identity)));
    let credentials = keys.between("n1", "n2", &n2_peer).unwrap();
    let url = TargetUrl::parse(&format!("{}/{}", n2.nvme, replica_nqn("rep"))).unwrap();
    let as_n1 = |dhchap, tls_psk| ConnectOptions {
        host_nqn: node_host_nqn("n1"),
        dhchap: Some(dhchap),
        tls_psk,
        ..ConnectOptions::default()
    };
    let in_tls = as_n1(credentials.dhchap.clone(), credentials.tls_psk.clone());
    let start = std::time::Instant::now();
    while let Err(error) = Controller::connect(&url, in_tls.clone(), 1) {
        assert!(start.elapsed() < Duration::from_secs(10), "{error}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A host's writes through the primary are acknowledged once n2 has
    // them (over the TLS link), and n2's copy holds them: read back as n1
    // once fenced at the record's epoch (which ends the primary's session).
    let host_nqn = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000ae9a2";
    ok(&n1, &["host", "add", "tester", "--nqn", host_nqn]);
    ok(&n1, &["volume", "attach", "rep", "--host", "tester"]);
    let volume = TargetUrl::parse(&format!("{}/nqn.2026-11.io.weft:vol:rep", n1.nvme)).unwrap();
    let as_host = ConnectOptions {
        host_nqn: host_nqn.into(),
        ..ConnectOptions::default()
    };
    let host = Controller::connect(&volume, as_host, 1).unwrap();
    let mut queue = host.open_io_queue(1).unwrap();
    let block = |n: u64| vec![n as u8 + 1; 4096];
    for n in 0..64 {
        let start = std::time::Instant::now();
        while let Err(error) = queue.write(1, n, 4096, &block(n)) {
            // (ANA transition while the primary starts to serve.)
            assert!(start.elapsed() < Duration::from_secs(10), "{error}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let shown = ok(&n1, &["volume", "show", "rep"]);
    assert_eq!(shown.matches("in-sync").count(), 2, "{shown}");
    drop((queue, host));
    let volume_record = etcd
        .ctl(&endpoints)
        .args(["get", "/weft/volumes/rep", "--print-value-only"])
        .output()
        .unwrap();
    let volume_record: serde_json::Value = serde_json::from_slice(&volume_record.stdout).unwrap();
    let epoch = volume_record["replication"]["epoch"].as_u64().unwrap();
    let reader = Controller::connect(&url, in_tls.clone(), 1).unwrap();
    let token = weft_proto::fence::FenceToken {
        epoch,
        session: u32::MAX,
    };
    assert_eq!(reader.fence(token).unwrap(), Ok(()));
    let mut copy = reader.open_io_queue(1).unwrap();
    for n in 0..64 {
        assert_eq!(
            copy.read(1, n, 4096, 4096).unwrap(),
            &block(n)[..],
            "block {n}"
        );
    }
    // The same in the clear: refused (the link must be encrypted).
    let clear = Controller::connect(&url, as_n1(credentials.dhchap, None), 1).unwrap_err();
    assert!(clear.to_string().contains("refused host"), "{clear}");
    // The token's secrets, as node n1: refused, in the clear and in TLS
    // (the token gives no PSK either: a token-derived one is refused too).
    let token_keys = weft_node::link_keys::token_keys(&n1.token);
    let refused = Controller::connect(&url, as_n1(token_keys.clone(), None), 1).unwrap_err();
    assert!(refused.to_string().contains("refused host"), "{refused}");
    let guessed = Some(weft_proto::tls::psk::ConfiguredPsk::from_key([7; 32]));
    let refused = Controller::connect(&url, as_n1(token_keys, guessed), 1).unwrap_err();
    assert!(refused.to_string().contains("TLS"), "{refused}");
    drop((n2, etcd));
}

/// A node's half of the link secrets, from its certificate files (as the
/// node itself holds it).
#[derive(Debug)]
struct Pair(weft_http::tls::NodeIdentity);

impl weft_node::link_keys::PairSecrets for Pair {
    fn own_certificate(&self) -> Vec<u8> {
        self.0.certificate_der().to_vec()
    }

    fn shared_with(&self, node: &str, certificate: &[u8]) -> Result<[u8; 32], String> {
        let name = weft_cluster::pki::node_identity(node);
        self.0.shared_secret(&name, certificate)
    }
}

#[test]
fn nodes_with_the_clusters_certificates_call_only_each_other() {
    let dir = temp_dir("pki");
    let pki = dir.join("pki");
    let (made, said) = cluster(&pki, &["init"]);
    assert!(made && said.contains("--client-cert-auth"), "{said}");
    let (made, said) = cluster(&pki, &["init"]);
    assert!(
        !made && said.contains("holds a cluster CA already"),
        "{said}"
    );
    for name in ["n1", "n2"] {
        let (made, said) = cluster(&pki, &["issue", name]);
        assert!(made && said.contains("--pki"), "{said}");
    }
    let mode = |path: PathBuf| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode(pki.join("ca.key")), 0o600);
    assert_eq!(mode(pki.join("nodes/n1/node.key")), 0o600);

    let n1_files = pki.join("nodes/n1");
    let etcd = Etcd::start_tls(
        1,
        &dir,
        Tls {
            ca: pki.join("ca.crt"),
            server: (pki.join("etcd.crt"), pki.join("etcd.key")),
            client: (n1_files.join("node.crt"), n1_files.join("node.key")),
        },
    );
    let endpoints = etcd.endpoints();
    // etcd refuses a client without a certificate from the cluster's CA.
    let anonymous = Command::new("/usr/bin/etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoints, "--command-timeout=3s"])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .args(["get", "--prefix", "/weft"])
        .output()
        .unwrap();
    assert!(!anonymous.status.success());

    let n1 = node(&dir, &pki, "n1", &endpoints, None);
    assert!(n1.api_url.starts_with("https://"), "{}", n1.banner);
    let token_file = dir.join("n1").join("api-token");
    let n2 = node(&dir, &pki, "n2", &endpoints, Some(&token_file));
    // Another node's certificates are not this node's.
    let wrong = Command::new(WEFT)
        .args(["serve", "--cluster", &endpoints, "--node", "n3", "--pki"])
        .arg(pki.join("nodes/n2"))
        .args(["--api-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("n3"))
        .output()
        .unwrap();
    let errors = String::from_utf8_lossy(&wrong.stderr);
    assert!(errors.contains("not node n3's"), "{errors}");

    // n1 forwards to n2 with its certificate: a pool made on n2 through n1,
    // and listed through n1.
    let listed = || ok(&n1, &["node", "list"]);
    let start = std::time::Instant::now();
    while !listed().contains("n2") {
        assert!(start.elapsed() < Duration::from_secs(10), "{}", listed());
        std::thread::sleep(Duration::from_millis(200));
    }
    let device = dir.join("n2").join("p.img");
    let pool = [
        "pool",
        "create",
        "p",
        "--node",
        "n2",
        "--device",
        device.to_str().unwrap(),
        "--device-size",
        "256MiB",
    ];
    ok(&n1, &pool);
    assert!(ok(&n1, &["pool", "list"]).contains("n2"));

    // The admin token cannot send what only nodes forward.
    let endpoint = weft_http::Endpoint::parse(&n2.api_url, n2.api_ca.as_deref()).unwrap();
    let (status, body) = weft_http::call(
        &endpoint,
        Some(&n2.token),
        "GET",
        "/api/v1/pools?local=1",
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&body));

    // A leaked CSI token, revoked through n1: n2 refuses it too once it
    // reads the record (both nodes write the new one beside the admin
    // token file they share here).
    let status_on_n2 = |token: &str| {
        weft_http::call(
            &endpoint,
            Some(token),
            "GET",
            "/api/v1/volumes",
            None,
            Duration::from_secs(10),
        )
        .unwrap()
        .0
    };
    let csi_file = dir.join("n1").join("api-token.csi");
    let read = |path: &Path| std::fs::read_to_string(path).unwrap().trim().to_string();
    let old_csi = read(&csi_file);
    assert_eq!(status_on_n2(&old_csi), 200);
    ok(&n1, &["token", "renew", "csi"]);
    let start = std::time::Instant::now();
    while status_on_n2(&old_csi) != 401 || read(&csi_file) == old_csi {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "n2 still takes the old CSI token"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status_on_n2(&read(&csi_file)), 200);

    // A writer of etcd points n2's member record at an eavesdropper: n1's
    // next call to n2 goes there, and carries no token (before, it carried
    // the cluster's admin token in clear text); it fails, saying why.
    let (attacker, heard) = eavesdropper();
    let key = "/weft/cluster/members/n2";
    let record = etcd
        .ctl(&endpoints)
        .args(["get", key, "--print-value-only"])
        .output()
        .unwrap();
    let record = String::from_utf8(record.stdout).unwrap();
    let api = n2.api_url.trim_start_matches("https://");
    assert!(record.contains(api), "{record}");
    let forged = record.trim().replace(api, &attacker);
    let put = etcd
        .ctl(&endpoints)
        .args(["put", key, &forged])
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let start = std::time::Instant::now();
    let (bytes, errors) = loop {
        let (success, _, errors) = support::weft(&n1, &["pool", "show", "p", "--node", "n2"]);
        if let Ok(bytes) = heard.try_recv() {
            assert!(!success, "a call that reached the eavesdropper succeeded");
            break (bytes, errors);
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "n1 never called the forged address"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(errors.contains("node n2"), "{errors}");
    // A TLS ClientHello (record type 16h), and nothing a token is in.
    assert_eq!(bytes.first(), Some(&0x16));
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        !text.contains(&n1.token) && !text.contains("Bearer"),
        "{text}"
    );
    drop(n2);
}

/// `weft serve` for node `name` joining with `token` through `via`, its
/// certificates to go to `certificates`, that must fail: what it said.
fn join_refused(
    dir: &Path,
    name: &str,
    endpoints: &str,
    certificates: &Path,
    token: &str,
    via: &str,
) -> String {
    let output = Command::new("timeout")
        .arg("30")
        .arg(WEFT)
        .args(["serve", "--cluster", endpoints, "--node", name, "--pki"])
        .arg(certificates)
        .args([
            "--join",
            token,
            "--join-via",
            via,
            "--api-listen",
            "127.0.0.1:0",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(dir.join(name))
        .output()
        .unwrap();
    assert!(!output.status.success(), "{name} joined");
    assert!(!certificates.join("node.key").exists(), "{name} kept a key");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A node joins with a one-time token instead of files copied to it: the
/// administrator makes a token for n2 through n1's API (n1 holds the CA's
/// key); n2 fetches the CA, checks it against the token's pin, makes its
/// own key and gets its certificate, then runs as a member n1 forwards to.
/// A token with another pin sends nothing; a token for n2 does not join
/// n3; a token used once does not join again.
#[test]
fn a_node_joins_with_a_one_time_token_and_its_own_key() {
    let dir = temp_dir("pki-join");
    let (etcd, endpoints, pki) = certified_etcd(&dir, &["n1"]);
    let ca_key = pki.join("ca.key");
    let n1 = node_with(
        &dir,
        &pki,
        "n1",
        &endpoints,
        None,
        &pki.join("nodes/n1"),
        &["--ca-key", ca_key.to_str().unwrap()],
    );
    let said = ok(&n1, &["token", "join", "--node", "n2", "--ttl", "10m"]);
    let token = said
        .split_whitespace()
        .find(|word| word.starts_with("weftjoin-1:"))
        .unwrap_or_else(|| panic!("{said}"))
        .to_string();
    assert!(said.contains("--join-via"), "{said}");
    // Only the admin token makes them.
    let csi = std::fs::read_to_string(dir.join("n1").join("api-token.csi")).unwrap();
    let endpoint = weft_http::Endpoint::parse(&n1.api_url, Some(&pki.join("ca.crt"))).unwrap();
    let (status, _) = weft_http::call(
        &endpoint,
        Some(csi.trim()),
        "POST",
        "/api/v1/cluster/join-tokens",
        Some(b"{}"),
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(status, 403);

    // A writer of etcd keeps the token's record, to put it back once used.
    let record_key = format!(
        "/weft/cluster/join-tokens/{}",
        token.split(':').nth(1).unwrap()
    );
    let kept = etcd
        .ctl(&endpoints)
        .args(["get", &record_key, "--print-value-only"])
        .output()
        .unwrap();
    let kept = String::from_utf8(kept.stdout).unwrap().trim().to_string();
    assert!(
        kept.contains("check") && !kept.contains(token.split(':').nth(2).unwrap()),
        "{kept}"
    );

    let joined = dir.join("n2-pki");
    // A token whose pin is not this cluster's CA (someone in between): nothing sent.
    let mut tampered = token.clone();
    let last = if tampered.ends_with('0') { "1" } else { "0" };
    tampered.replace_range(tampered.len() - 1.., last);
    let said = join_refused(&dir, "n2", &endpoints, &joined, &tampered, &n1.api_url);
    assert!(said.contains("is not the one the token pins"), "{said}");
    // A token for n2 does not join n3 (and stays n2's).
    let said = join_refused(
        &dir,
        "n3",
        &endpoints,
        &dir.join("n3-pki"),
        &token,
        &n1.api_url,
    );
    assert!(said.contains("for node n2"), "{said}");

    // No file copied: its certificate and the cluster's API token come with the join.
    let n2 = node_with(
        &dir,
        &pki,
        "n2",
        &endpoints,
        None,
        &joined,
        &["--join", &token, "--join-via", &n1.api_url],
    );
    assert_eq!(n2.token, n1.token);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(joined.join("node.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        std::fs::read(joined.join("ca.crt")).unwrap(),
        std::fs::read(pki.join("ca.crt")).unwrap()
    );
    // n2 is a member n1 forwards to with certificates: a pool made on n2 through n1.
    let start = std::time::Instant::now();
    while !ok(&n1, &["node", "list"]).contains("n2") {
        assert!(start.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(200));
    }
    let device = dir.join("n2").join("p.img");
    ok(
        &n1,
        &[
            "pool",
            "create",
            "p",
            "--node",
            "n2",
            "--device",
            device.to_str().unwrap(),
            "--device-size",
            "64MiB",
        ],
    );
    assert!(ok(&n2, &["pool", "list"]).contains("n2"));
    // Used once: it joins nothing again.
    let said = join_refused(
        &dir,
        "n2",
        &endpoints,
        &dir.join("again-pki"),
        &token,
        &n1.api_url,
    );
    assert!(said.contains("unknown or was used already"), "{said}");
    // Nor with its record put back in etcd: the signing node remembers it.
    let put = etcd
        .ctl(&endpoints)
        .args(["put", &record_key, &kept])
        .output()
        .unwrap();
    assert!(put.status.success());
    let said = join_refused(
        &dir,
        "n2",
        &endpoints,
        &dir.join("replayed-pki"),
        &token,
        &n1.api_url,
    );
    assert!(said.contains("unknown or was used already"), "{said}");
}
