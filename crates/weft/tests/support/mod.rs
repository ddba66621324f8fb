//! Shared by the binary's integration tests: a `weft serve` child that is
//! killed when dropped, started and read up to the end of its banner.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The binary under test.
pub const WEFT: &str = env!("CARGO_BIN_EXE_weft");

/// A running `weft serve`, killed on drop.
pub struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `weft serve ARGS` and returns once its banner (up to the first
/// `nvme connect` line) is out, with the banner.
pub fn spawn_serve(args: &[&std::ffi::OsStr]) -> (Server, String) {
    let mut child = Command::new(WEFT)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut banner = String::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        banner.push_str(&line);
        banner.push('\n');
        if line.contains("nvme connect") {
            break;
        }
    }
    (Server(child), banner)
}

/// A free TCP port on 127.0.0.1 (free when asked).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
