//! Shared by the binary's integration tests: a `weft serve` child that is
//! killed when dropped, started and read up to the end of its banner, and
//! the admin command line run against it. (Each test binary uses a part.)

#![allow(dead_code)]

pub mod cluster;
pub mod etcd;
pub mod proxy;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The binary under test.
pub const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// A running `weft serve`, killed on drop.
pub struct Server(Child);

impl Server {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `weft serve ARGS` and returns once its banner (up to the
/// `nvme discover` line) is out, with the banner.
pub fn spawn_serve(args: &[&std::ffi::OsStr]) -> (Server, String) {
    spawn_serve_logging(args, Stdio::null())
}

/// `spawn_serve` with weft's log going to `log`.
pub fn spawn_serve_logging(args: &[&std::ffi::OsStr], log: impl Into<Stdio>) -> (Server, String) {
    spawn_binary_logging(WEFT.as_ref(), args, log)
}

/// `spawn_serve_logging` of the weft binary `binary` (another version's).
pub fn spawn_binary_logging(
    binary: &std::path::Path,
    args: &[&std::ffi::OsStr],
    log: impl Into<Stdio>,
) -> (Server, String) {
    let mut child = Command::new(binary)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut banner = String::new();
    let mut lines = BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        banner.push_str(&line);
        banner.push('\n');
        if line.contains("nvme discover") {
            break;
        }
    }
    // Keep reading what follows, as a terminal would.
    std::thread::spawn(move || lines.for_each(drop));
    (Server(child), banner)
}

/// The first word after `label` on a `weft serve` banner line.
fn banner_field<'a>(banner: &'a str, label: &str) -> Option<&'a str> {
    banner
        .lines()
        .find_map(|line| line.trim().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
}

/// The first `listening` address in a `weft serve` banner (the kernel's
/// choice when weft was told port 0, so parallel tests never race for a port).
pub fn listening_address(banner: &str) -> std::net::SocketAddr {
    banner_field(banner, "listening  ")
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("no listening address in the banner: {banner}"))
}

/// A node started on a data directory, with its API address and token.
pub struct Node {
    _server: Server,
    /// nvme-tcp://127.0.0.1:PORT
    pub nvme: String,
    /// host:port of the API.
    pub api: String,
    /// The API's URL (http:// or https://).
    pub api_url: String,
    /// The API's bearer token.
    pub token: String,
    /// The CA the API's TLS certificate is checked against, if not the system's.
    pub api_ca: Option<std::path::PathBuf>,
    /// What `weft serve` printed as it started.
    pub banner: String,
}

impl Node {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self._server.pid()
    }

    /// Stops the node as an operator does (SIGTERM), and waits until it exited.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self._server.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        self._server.0.wait().unwrap()
    }
}

/// Starts `weft serve` with `data_dir` (and `extra` arguments) on ports the
/// kernel picks; returns when the banner is out.
pub fn start_node(data_dir: &std::path::Path, extra: &[&str]) -> Node {
    start_node_on(data_dir, "127.0.0.1:0", extra)
}

/// [`start_node`] with NVMe/TCP on `listen`. Dropping the node kills it
/// (SIGKILL, as a crash).
pub fn start_node_on(data_dir: &std::path::Path, listen: &str, extra: &[&str]) -> Node {
    start_binary_on(WEFT.as_ref(), data_dir, listen, extra)
}

/// [`start_node_on`] with the weft binary `binary` (another version's).
pub fn start_binary_on(
    binary: &std::path::Path,
    data_dir: &std::path::Path,
    listen: &str,
    extra: &[&str],
) -> Node {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "--reactors".as_ref(),
        "2".as_ref(),
        "--api-listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--data-dir".as_ref(),
        data_dir.as_os_str(),
        "--listen".as_ref(),
        listen.as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    // The log goes next to the data directory, for a failed test's post-mortem.
    let log_path = data_dir.with_extension("log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .unwrap();
    let (server, banner) = spawn_binary_logging(binary, &args, log);
    if !banner.contains("nvme discover") {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!("weft serve stopped before its banner was out: {banner}\nits log:\n{log}");
    }
    let api_url = banner_field(&banner, "api        ")
        .unwrap_or_else(|| panic!("no API address in the banner: {banner}"))
        .to_string();
    let api = api_url
        .split_once("://")
        .map_or(&*api_url, |(_, a)| a)
        .to_string();
    // Empty when the node was given its token file elsewhere.
    let token = std::fs::read_to_string(data_dir.join("api-token"))
        .unwrap_or_default()
        .trim()
        .to_string();
    Node {
        _server: server,
        nvme: format!("nvme-tcp://{}", listening_address(&banner)),
        api,
        api_url,
        token,
        api_ca: None,
        banner,
    }
}

/// Node `name` of the cluster at `endpoints` (etcd), NVMe/TCP on `listen`,
/// its data under `dir/name`, with `extra` arguments and the cluster's
/// token (`token_file`: none for the first node, which makes it).
pub fn cluster_node(
    dir: &std::path::Path,
    name: &str,
    listen: &str,
    endpoints: &str,
    token_file: Option<&std::path::Path>,
    extra: &[&str],
) -> Node {
    let data = dir.join(name);
    // The tests' etcd asks for no credential (on loopback, for this test only).
    let mut args = vec!["--cluster", endpoints, "--node", name, "--insecure-store"];
    args.extend(extra);
    let token_path;
    if let Some(file) = token_file {
        token_path = file.to_str().unwrap().to_string();
        args.extend(["--api-token-file", &token_path]);
    }
    let mut node = start_node_on(&data, listen, &args);
    let file = token_file.map_or(data.join("api-token"), std::path::Path::to_path_buf);
    node.token = std::fs::read_to_string(file).unwrap().trim().to_string();
    node
}

/// An I/O queue to subsystem `nqn` on `node`, as host `host_nqn` with Host
/// Identifier `[host_id; 16]` (two identities play two hosts).
pub fn connect_as(
    node: &Node,
    nqn: &str,
    host_nqn: &str,
    host_id: u8,
) -> (weft_initiator::Controller, weft_initiator::Queue) {
    let url = weft_initiator::TargetUrl::parse(&format!("{}/{nqn}", node.nvme)).unwrap();
    let options = weft_initiator::ConnectOptions {
        host_nqn: host_nqn.into(),
        host_id: [host_id; 16],
        ..weft_initiator::ConnectOptions::default()
    };
    let controller = weft_initiator::Controller::connect(&url, options, 1).unwrap();
    let queue = controller.open_io_queue(1).unwrap();
    (controller, queue)
}

/// Pool `p` over `device` (a 256 MiB sparse file, created) with a thin
/// volume `volume` of `size` (e.g. "64MiB").
pub fn pool_with_volume(node: &Node, device: &std::path::Path, volume: &str, size: &str) {
    let device = device.to_str().unwrap();
    ok(
        node,
        &[
            "pool",
            "create",
            "p",
            "--device",
            device,
            "--device-size",
            "256MiB",
        ],
    );
    ok(
        node,
        &["volume", "create", volume, "--pool", "p", "--size", size],
    );
}

/// Runs `weft ARGS` against `node`'s API: (success, stdout, stderr).
pub fn weft(node: &Node, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(WEFT);
    command
        .args(args)
        .env("WEFT_API", &node.api_url)
        .env("WEFT_API_TOKEN", &node.token);
    if let Some(ca) = &node.api_ca {
        command.env("WEFT_API_CA", ca);
    }
    let output = command.output().unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `weft bench` as host `host_nqn` against subsystem `nqn` of `node`, with
/// `options` (e.g. `--verify`): (success, stdout and stderr).
pub fn bench(node: &Node, host_nqn: &str, nqn: &str, options: &[&str]) -> (bool, String) {
    let url = format!("{}/{nqn}", node.nvme);
    let mut args = vec!["bench", "--hostnqn", host_nqn, "--target", &url];
    args.extend_from_slice(options);
    let (success, out, errors) = weft(node, &args);
    (success, format!("{out}{errors}"))
}

/// `weft ARGS` that must succeed; its stdout.
pub fn ok(node: &Node, args: &[&str]) -> String {
    let (success, out, errors) = weft(node, args);
    assert!(success, "weft {args:?}: {errors}");
    out
}

/// Waits (up to 10 s) until `volume` on `node` lists no connected host.
/// A host's TCP close reaches the node's reactor a moment after the
/// client has dropped its queues, so a test that deletes right after
/// reading would race it.
pub fn wait_no_connected_hosts(node: &Node, volume: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let show = ok(node, &["volume", "show", volume, "-o", "json"]);
        if show.contains("\"connected_hosts\": []") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "hosts still connected to {volume} after 10 s: {show}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `weft ARGS` that must fail; its stderr.
pub fn refused(node: &Node, args: &[&str]) -> String {
    let (success, out, errors) = weft(node, args);
    assert!(!success, "weft {args:?} should fail: {out}");
    errors
}

/// A fresh directory under the temp dir, unique to this test process.
/// Those that finished test processes left under the same name go first:
/// a cluster test's etcd data alone is over 100 MiB, and runs add up.
pub fn temp_dir(name: &str) -> TempDir {
    let prefix = format!("weft-test-{name}-");
    remove_left_behind(&prefix);
    let dir = std::env::temp_dir().join(format!("{prefix}{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A test's directory: removed when the test passes (declared first, it is
/// dropped after the processes using it), kept with its logs when it fails.
pub struct TempDir(std::path::PathBuf);

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for TempDir {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Removes the temp dir's `PREFIX<pid>` directories of processes gone, if
/// untouched for 10 minutes (a process in another PID namespace sharing the
/// temp dir looks gone from here).
fn remove_left_behind(prefix: &str) {
    let stale = |entry: &std::fs::DirEntry| {
        entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().unwrap_or_default().as_secs() > 600)
    };
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|name| name.strip_prefix(prefix))
            .and_then(|pid| pid.parse::<u32>().ok());
        let gone = pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
        if gone && stale(&entry) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One API request over HTTP: (status, JSON body).
pub fn api(
    node: &Node,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    api_at(&node.api, token, method, path, body)
}

/// [`api`] at the API's address (host:port), from a thread that holds no [`Node`].
pub fn api_at(
    address: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let body = body.unwrap_or_default();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let value = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string()));
    (status, value)
}

/// A tmpfs of its own at a directory (a filesystem a test can fill up: a
/// real ENOSPC), unmounted when dropped, however the test ends.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (mount's `size=`, e.g. "48m") at `dir`,
    /// created if missing; none where this machine does not let the test
    /// (not root): the caller skips what needs it.
    pub fn mount(dir: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "weft-test"])
            .arg(dir)
            .status();
        matches!(mounted, Ok(status) if status.success()).then(|| Tmpfs(dir.to_path_buf()))
    }

    /// Fills it up with a file of `mib` MiB (or as much as fits): every
    /// write that needs room fails from now on.
    pub fn fill(&self, mib: u32) {
        let filler = self.0.join("filler");
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=1M", &format!("count={mib}")])
            .arg(format!("of={}", filler.display()))
            .stderr(Stdio::null())
            .status();
    }

    /// Makes room again (the filler goes).
    pub fn make_room(&self) {
        let _ = std::fs::remove_file(self.0.join("filler"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Whether the file (a pool's device, a tier's) holds `needle` anywhere.
pub fn device_holds(device: &std::path::Path, needle: &[u8]) -> bool {
    let bytes = std::fs::read(device).unwrap();
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// `weft serve` arguments giving node `name` a key file of its own (a
/// key-encryption key derived from its name, mode 600, under `dir`), for
/// encrypted volumes.
pub fn kek_args(dir: &std::path::Path, name: &str) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{name}.kek"));
    let key = format!("{name:-<8}").repeat(8);
    std::fs::write(&path, format!("{key}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    vec!["--kek-file".into(), path.to_str().unwrap().to_string()]
}
