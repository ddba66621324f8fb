//! A cluster of real nodes for the replicated and erasure-coded volume
//! tests: etcd and `weft serve` nodes sharing one API token, and the
//! patience a multipath host has (path errors retried, conditions awaited).

use super::etcd::{free_port, Etcd};
use super::{start_node_on, Node};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use weft_initiator::InitiatorError;
use weft_proto::status::StatusCodeType;

pub fn node(dir: &Path, name: &str, endpoints: &str, token_file: Option<&Path>) -> Node {
    node_configured(dir, name, endpoints, token_file, "")
}

/// [`node`] with more of weft.toml's `[cluster]` table (`cluster`, lines).
pub fn node_configured(
    dir: &Path,
    name: &str,
    endpoints: &str,
    token_file: Option<&Path>,
    cluster: &str,
) -> Node {
    node_with(dir, name, endpoints, token_file, cluster, &[])
}

/// [`node_configured`] with more `weft serve` arguments.
pub fn node_with(
    dir: &Path,
    name: &str,
    endpoints: &str,
    token_file: Option<&Path>,
    cluster: &str,
    more: &[String],
) -> Node {
    let data = dir.join(name);
    let config = dir.join(format!("{name}.toml"));
    let urls: Vec<String> = endpoints.split(',').map(|e| format!("{e:?}")).collect();
    let table = format!(
        "[cluster]\nendpoints = [{}]\nnode = {name:?}\ninsecure_store = true\n{cluster}\n",
        urls.join(", ")
    );
    std::fs::write(&config, table).unwrap();
    let config = config.to_str().unwrap().to_string();
    let mut extra = vec![
        "--config",
        config.as_str(),
        "--cluster",
        endpoints,
        "--node",
        name,
    ];
    let token_path;
    if let Some(file) = token_file {
        token_path = file.to_str().unwrap().to_string();
        extra.extend(["--api-token-file", &token_path]);
    }
    extra.extend(more.iter().map(String::as_str));
    let listen = format!("127.0.0.1:{}", free_port());
    let mut node = start_node_on(&data, &listen, &extra);
    let file = token_file.map_or(data.join("api-token"), Path::to_path_buf);
    node.token = std::fs::read_to_string(file).unwrap().trim().to_string();
    node
}

/// etcd and nodes n1, n2 and n3 (each with the `[cluster]` lines
/// `cluster`), sharing n1's API token: (etcd, its endpoints, the token file, the nodes).
pub fn three_nodes(dir: &Path, cluster: &str) -> (Etcd, String, PathBuf, [Node; 3]) {
    let (etcd, endpoints, token_file, nodes) = nodes(dir, cluster, 3);
    let [n1, n2, n3]: [Node; 3] = nodes.try_into().ok().expect("three");
    (etcd, endpoints, token_file, [n1, n2, n3])
}

/// etcd and nodes n1 to n`count` (each with the `[cluster]` lines
/// `cluster`), sharing n1's API token: (etcd, its endpoints, the token file, the nodes).
pub fn nodes(dir: &Path, cluster: &str, count: usize) -> (Etcd, String, PathBuf, Vec<Node>) {
    nodes_with(dir, cluster, count, |_| Vec::new())
}

/// [`nodes`], each node given the `weft serve` arguments `more(name)`.
pub fn nodes_with(
    dir: &Path,
    cluster: &str,
    count: usize,
    more: impl Fn(&str) -> Vec<String>,
) -> (Etcd, String, PathBuf, Vec<Node>) {
    let etcd = Etcd::start(1, dir);
    let endpoints = etcd.endpoints();
    let n1 = node_with(dir, "n1", &endpoints, None, cluster, &more("n1"));
    let token_file = dir.join("n1").join("api-token");
    let mut nodes = vec![n1];
    for i in 2..=count {
        let name = format!("n{i}");
        nodes.push(node_with(
            dir,
            &name,
            &endpoints,
            Some(&token_file),
            cluster,
            &more(&name),
        ));
    }
    // A node's API answers before n1's copy of the store has seen it join:
    // wait until n1 knows them all (pools are then placed by name).
    let n1 = &nodes[0];
    eventually("n1 knows every node", || {
        let (status, listed) = super::api(n1, Some(&n1.token), "GET", "/api/v1/nodes", None);
        status == 200 && listed.as_array().is_some_and(|nodes| nodes.len() == count)
    });
    (etcd, endpoints, token_file, nodes)
}

/// Polls `check` until it holds (or panics after 30 s, naming `what`).
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    start.elapsed()
}

/// Runs `io` until it succeeds, as a multipath host does while the path is
/// in ANA Transition (the primary fencing): path statuses are
/// retried, anything else fails the test.
pub fn retrying<T>(what: &str, mut io: impl FnMut() -> Result<T, InitiatorError>) -> T {
    let start = Instant::now();
    loop {
        match io() {
            Ok(value) => return value,
            Err(InitiatorError::Command { status, .. })
                if status.sct == StatusCodeType::Path
                    && start.elapsed() < Duration::from_secs(20) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

/// The status a write of `byte`s to block 0 (of `block` bytes) ends with,
/// path statuses retried for up to 20 s.
pub fn write_status(
    queue: &mut weft_initiator::Queue,
    block: u32,
    byte: u8,
) -> weft_proto::status::Status {
    let data = vec![byte; block as usize];
    let start = Instant::now();
    loop {
        match queue.write(1, 0, block, &data) {
            Ok(()) => return weft_proto::status::Status::SUCCESS,
            Err(InitiatorError::Command { status, .. })
                if status.sct == StatusCodeType::Path
                    && start.elapsed() < Duration::from_secs(20) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(InitiatorError::Command { status, .. }) => return status,
            Err(error) => panic!("write: {error}"),
        }
    }
}

/// Through `via`: pool `p` on each node of `names`, over a 256 MiB sparse
/// file `DIR/NAME/p.img`.
pub fn pool_on_each(via: &Node, dir: &Path, names: &[&str]) {
    for name in names {
        let device = dir.join(name).join("p.img");
        let args = ["pool", "create", "p", "--node", name, "--device"];
        let size = ["--device-size", "256MiB"];
        super::ok(
            via,
            &[&args[..], &[device.to_str().unwrap()], &size].concat(),
        );
    }
}

/// `GET volumes/VOLUME` as `node` answers it (null while the call fails).
pub fn volume_view(node: &Node, volume: &str) -> serde_json::Value {
    let path = format!("/api/v1/volumes/{volume}");
    let (status, shown) = super::api(node, Some(&node.token), "GET", &path, None);
    if status == 200 {
        shown
    } else {
        serde_json::Value::Null
    }
}
