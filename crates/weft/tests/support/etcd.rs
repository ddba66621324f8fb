//! A real etcd (Debian's `etcd-server`, installed by harness/deps.sh) for
//! the cluster tests: one or three members on free loopback ports with
//! their data in a temp directory, each stopped and started again at will,
//! all killed on drop.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An etcd cluster of real processes.
pub struct Etcd {
    members: Vec<Member>,
    initial_cluster: String,
    tls: Option<Tls>,
}

/// etcd's TLS for clients: its server certificate, and the CA whose
/// client certificates it requires (`--client-cert-auth`); the test's own
/// etcdctl calls present `client_cert`.
#[derive(Clone)]
pub struct Tls {
    /// The CA clients' certificates must chain to (and etcd's does).
    pub ca: PathBuf,
    /// etcd's certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key for etcdctl.
    pub client: (PathBuf, PathBuf),
}

struct Member {
    name: String,
    client: String,
    peer: String,
    dir: PathBuf,
    process: Option<Child>,
}

/// A port nobody listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Etcd {
    /// Starts `count` members with their data under `dir`; returns when
    /// the cluster answers.
    pub fn start(count: usize, dir: &Path) -> Etcd {
        Etcd::start_with(count, dir, None)
    }

    /// [`Etcd::start`] with TLS for clients, who must present a certificate.
    pub fn start_tls(count: usize, dir: &Path, tls: Tls) -> Etcd {
        Etcd::start_with(count, dir, Some(tls))
    }

    fn start_with(count: usize, dir: &Path, tls: Option<Tls>) -> Etcd {
        let scheme = if tls.is_some() { "https" } else { "http" };
        assert!(
            Path::new("/usr/bin/etcd").exists(),
            "etcd is missing: run harness/deps.sh (it installs Debian's etcd-server)"
        );
        let members: Vec<Member> = (0..count)
            .map(|index| Member {
                name: format!("e{index}"),
                client: format!("{scheme}://127.0.0.1:{}", free_port()),
                peer: format!("http://127.0.0.1:{}", free_port()),
                dir: dir.join(format!("etcd{index}")),
                process: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut etcd = Etcd {
            members,
            initial_cluster,
            tls,
        };
        for index in 0..count {
            etcd.start_member(index);
        }
        etcd.wait_healthy();
        etcd
    }

    /// The client URLs, comma-separated (what `--cluster` takes).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts member `index` (again).
    pub fn start_member(&mut self, index: usize) {
        let initial_cluster = self.initial_cluster.clone();
        let member = &mut self.members[index];
        assert!(member.process.is_none(), "member {index} runs already");
        let log = std::fs::File::create(member.dir.with_extension("log")).unwrap();
        let mut command = Command::new("/usr/bin/etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.0)
                .arg("--key-file")
                .arg(&tls.server.1)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let process = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.dir)
            .args(["--listen-client-urls", &member.client])
            .args(["--advertise-client-urls", &member.client])
            .args(["--listen-peer-urls", &member.peer])
            .args(["--initial-advertise-peer-urls", &member.peer])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        member.process = Some(process);
    }

    /// Starts every member stopped, and waits until the cluster answers.
    pub fn start_stopped(&mut self) {
        for index in 0..self.members.len() {
            if self.members[index].process.is_none() {
                self.start_member(index);
            }
        }
        self.wait_healthy();
    }

    /// Stops member `index` (SIGKILL: as a crash).
    pub fn stop_member(&mut self, index: usize) {
        if let Some(mut process) = self.members[index].process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// The member that leads now, as the running members report it.
    pub fn leader(&self) -> Option<usize> {
        self.members.iter().position(|member| {
            member.process.is_some() && {
                let output = self
                    .ctl(&member.client)
                    .args(["--command-timeout=2s"])
                    .args(["endpoint", "status", "-w", "fields"])
                    .output();
                output.is_ok_and(|o| {
                    let text = String::from_utf8_lossy(&o.stdout).into_owned();
                    let field = |name: &str| {
                        text.lines()
                            .find(|l| l.starts_with(&format!("\"{name}\" :")))
                            .and_then(|l| l.split(':').nth(1))
                            .map(|v| v.trim().to_string())
                    };
                    field("MemberID").is_some() && field("MemberID") == field("Leader")
                })
            }
        })
    }

    /// etcdctl against `endpoints`, with the test's client certificate if
    /// etcd asks for one.
    pub fn ctl(&self, endpoints: &str) -> Command {
        let mut command = Command::new("/usr/bin/etcdctl");
        command
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoints]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.0)
                .arg("--key")
                .arg(&tls.client.1);
        }
        command
    }

    /// Waits until a write through every running member's endpoint succeeds.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            loop {
                let status = self
                    .ctl(&member.client)
                    .args(["--command-timeout=2s"])
                    .args(["put", "weft-test-health", "ok"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .unwrap();
                if status.success() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} did not become healthy",
                    member.name
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for index in 0..self.members.len() {
            self.stop_member(index);
        }
    }
}
