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
        assert!(
            Path::new("/usr/bin/etcd").exists(),
            "etcd is missing: run harness/deps.sh (it installs Debian's etcd-server)"
        );
        let members: Vec<Member> = (0..count)
            .map(|index| Member {
                name: format!("e{index}"),
                client: format!("http://127.0.0.1:{}", free_port()),
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
        let process = Command::new("/usr/bin/etcd")
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
                let output = Command::new("/usr/bin/etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &member.client, "--command-timeout=2s"])
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

    /// Waits until a write through every running member's endpoint succeeds.
    pub fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for member in self.members.iter().filter(|m| m.process.is_some()) {
            loop {
                let status = Command::new("/usr/bin/etcdctl")
                    .env("ETCDCTL_API", "3")
                    .args(["--endpoints", &member.client, "--command-timeout=2s"])
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
