//! Real etcd members for the tests: [`Etcd::start`] runs N members of one
//! cluster from Debian's `etcd` binary on free loopback ports, each with its
//! data directory under a temporary directory, and kills them on drop.
//! Members can be stopped and started again to test failures. Nothing here
//! imitates etcd.

#![allow(dead_code)] // Each test binary uses a part.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use weft_etcd::{EtcdConfig, EtcdStore, EtcdTls};

/// How long a cluster may take to elect a leader.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The etcd binary (Debian's etcd-server), or a message saying how to get it.
pub fn binary(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    match found {
        Some(path) => path,
        None => panic!(
            "`{name}` is not installed: run harness/deps.sh (as root) to install Debian's \
             etcd-server and etcd-client, which the etcd store's tests run against"
        ),
    }
}

/// PEM files of a test CA and the certificates it signed for 127.0.0.1.
#[derive(Debug, Clone)]
pub struct Certificates {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The members' certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key.
    pub client: (PathBuf, PathBuf),
}

impl Certificates {
    /// Makes a CA and its certificates in `dir` with openssl.
    fn make(dir: &Path) -> Certificates {
        std::fs::create_dir_all(dir).expect("certificate directory");
        // Every argument is one word: split at spaces.
        let run = |line: String| {
            let args: Vec<&str> = line.split_whitespace().collect();
            let output = Command::new("openssl")
                .current_dir(dir)
                .args(&args)
                .output()
                .expect("openssl is installed (harness/deps.sh installs it)");
            assert!(
                output.status.success(),
                "openssl {line}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let new_key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        run(format!(
            "req -x509 {new_key} -days 1 -subj /CN=weft-test-CA \
             -addext basicConstraints=critical,CA:TRUE \
             -addext keyUsage=critical,keyCertSign,cRLSign -keyout ca.key -out ca.pem"
        ));
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n\
             basicConstraints=critical,CA:FALSE\n",
        )
        .expect("extensions");
        for name in ["server", "client"] {
            run(format!(
                "req -new {new_key} -subj /CN={name} -keyout {name}.key -out {name}.csr"
            ));
            run(format!(
                "x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
                 -extfile leaf.ext -out {name}.pem"
            ));
        }
        Certificates {
            ca: dir.join("ca.pem"),
            server: (dir.join("server.pem"), dir.join("server.key")),
            client: (dir.join("client.pem"), dir.join("client.key")),
        }
    }

    /// TLS settings of a client with the client certificate.
    pub fn client_tls(&self) -> EtcdTls {
        EtcdTls {
            ca: self.ca.clone(),
            cert: Some(self.client.0.clone()),
            key: Some(self.client.1.clone()),
        }
    }
}

/// One member.
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A cluster of real etcd members on the loopback.
pub struct Etcd {
    dir: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    /// Members serve clients over TLS and require client certificates.
    tls: Option<Certificates>,
}

impl Etcd {
    /// Starts `count` members and waits until they have a leader.
    pub fn start(count: usize, test: &str) -> Etcd {
        Etcd::launch(count, test, false)
    }

    /// Starts one member that serves clients over TLS only, to clients
    /// with a certificate from [`Etcd::certificates`].
    pub fn start_tls(test: &str) -> Etcd {
        Etcd::launch(1, test, true)
    }

    /// The certificates of a cluster started with [`Etcd::start_tls`].
    pub fn certificates(&self) -> &Certificates {
        self.tls.as_ref().expect("a TLS cluster")
    }

    fn launch(count: usize, test: &str, tls: bool) -> Etcd {
        let dir = std::env::temp_dir().join(format!("weft-etcd-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temporary directory");
        let members: Vec<Member> = (0..count)
            .map(|n| Member {
                name: format!("m{n}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let tls = tls.then(|| Certificates::make(&dir.join("tls")));
        let mut etcd = Etcd {
            dir,
            members,
            initial_cluster,
            tls,
        };
        for n in 0..count {
            etcd.spawn(n);
        }
        etcd.wait_healthy();
        etcd
    }

    /// The client URLs of every member (stopped or not).
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// Settings for a store of this cluster under `prefix`, with a short
    /// timeout.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        let mut config = EtcdConfig::new(self.endpoints());
        config.prefix = prefix.to_string();
        config.request_timeout = Duration::from_secs(3);
        config.tls = self.tls.as_ref().map(Certificates::client_tls);
        config
    }

    /// A store of this cluster under `prefix`.
    pub fn store(&self, prefix: &str) -> EtcdStore {
        EtcdStore::connect(self.config(prefix)).expect("connect to the test etcd")
    }

    /// Kills member `n` (as a crash would).
    pub fn stop(&mut self, n: usize) {
        if let Some(mut child) = self.members[n].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the stopped members again on their data and waits for a
    /// healthy cluster.
    pub fn restart(&mut self) {
        for n in 0..self.members.len() {
            if self.members[n].child.is_none() {
                self.spawn(n);
            }
        }
        self.wait_healthy();
    }

    /// Runs etcdctl against the running members; panics if it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let output = self.try_etcdctl(args);
        assert!(
            output.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs etcdctl against the running members.
    pub fn try_etcdctl(&self, args: &[&str]) -> Output {
        let endpoints: Vec<String> = self
            .members
            .iter()
            .zip(self.endpoints())
            .filter(|(member, _)| member.child.is_some())
            .map(|(_, endpoint)| endpoint)
            .collect();
        let mut command = Command::new(binary("etcdctl"));
        command
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg("--dial-timeout=3s");
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--cacert={}", tls.ca.display()))
                .arg(format!("--cert={}", tls.client.0.display()))
                .arg(format!("--key={}", tls.client.1.display()));
        }
        command.args(args).output().expect("run etcdctl")
    }

    fn spawn(&mut self, n: usize) {
        let member = &self.members[n];
        let client = self.endpoints()[n].clone();
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let data = self.dir.join(&member.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .expect("member log");
        let mut command = Command::new(binary("etcd"));
        if let Some(tls) = &self.tls {
            command
                .arg(format!("--trusted-ca-file={}", tls.ca.display()))
                .arg(format!("--cert-file={}", tls.server.0.display()))
                .arg(format!("--key-file={}", tls.server.1.display()))
                .arg("--client-cert-auth");
        }
        let child = command
            .arg(format!("--name={}", member.name))
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.dir.display()))
            // Fast elections (and so a 1 s minimum lease) for short tests.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.members[n].child = Some(child);
    }

    /// Waits until every running member says the cluster is healthy.
    pub fn wait_healthy(&mut self) {
        let started = Instant::now();
        for n in 0..self.members.len() {
            if self.members[n].child.is_none() {
                continue;
            }
            let port = self.members[n].client_port;
            while !self.healthy(n, port) {
                if let Some(status) = self.members[n]
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                {
                    panic!(
                        "etcd member {n} exited ({status}); its log is in {}",
                        self.dir.display()
                    );
                }
                assert!(
                    started.elapsed() < START_TIMEOUT,
                    "etcd is not healthy after {START_TIMEOUT:?}; logs in {}",
                    self.dir.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The temporary directory (logs, data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for n in 0..self.members.len() {
            self.stop(n);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port nothing listens on (a moment ago).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

impl Etcd {
    /// Whether member `n` says the cluster is healthy.
    fn healthy(&self, n: usize, port: u16) -> bool {
        if self.tls.is_none() {
            return healthy(port);
        }
        let endpoint = &self.endpoints()[n];
        self.try_etcdctl(&["endpoint", "health", &format!("--endpoints={endpoint}")])
            .status
            .success()
    }
}

/// Whether the plain member at `port` answers its /health endpoint with
/// true.
fn healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.contains("\"health\":\"true\"")
}

/// Calls `check` every 50 ms until it holds; panics after `limit`.
pub fn eventually(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
