//! What the node service does to the machine it runs on, through the
//! tools every Linux NVMe/TCP host has: nvme-cli (discover, connect,
//! disconnect), sysfs (which block device is the namespace), mount and
//! umount, mkfs, blkid, resize2fs/xfs_growfs, stat and blockdev. Each is a
//! short blocking call; the services call them on tokio's blocking pool.
//!
//! What this does not do: choose what to connect (the services do) or
//! parse the CSI requests.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A command that failed, with what it said.
#[derive(Debug, thiserror::Error)]
#[error("{command}: {message}")]
pub(crate) struct HostError {
    command: String,
    message: String,
}

/// Runs `program` with `args`; its standard output, or what it said on failure.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, HostError> {
    let command = format!("{program} {}", args.join(" "));
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| HostError {
            command: command.clone(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    Err(HostError {
        command,
        message: format!("{} ({})", said.trim(), output.status),
    })
}

/// The NVMe/TCP addresses (`traddr`, `trsvcid`) serving subsystem `nqn` to
/// host `host_nqn`, from the discovery controller at `discovery`
/// (`ADDR:PORT`) and the discovery controllers it refers to (one that does
/// not answer is skipped: the others may serve the volume). An address a
/// target gives as loopback (it listens there only) is taken to be where
/// its discovery controller answered.
pub(crate) fn discover(
    discovery: &str,
    host_nqn: &str,
    nqn: &str,
) -> Result<Vec<(String, String)>, HostError> {
    // nvme-cli needs the kernel's NVMe/TCP host (and its sysfs) loaded;
    // built in, modprobe has nothing to do.
    let _ = run("modprobe", &["nvme-tcp"]);
    let mut to_ask = vec![split_address(discovery)];
    let mut asked: Vec<(String, String)> = Vec::new();
    let mut found = Vec::new();
    while let Some((address, port)) = to_ask.pop() {
        if asked.contains(&(address.clone(), port.clone())) || asked.len() >= 16 {
            continue;
        }
        let first = asked.is_empty();
        asked.push((address.clone(), port.clone()));
        let args = ["-t", "tcp", "-a", &address, "-s", &port, "-o", "json"];
        let log = match nvme_as(host_nqn, "discover", &args) {
            Ok(text) => serde_json::from_str(&text).unwrap_or(Value::Null),
            Err(error) if first => return Err(error),
            Err(_) => continue,
        };
        for record in log["records"].as_array().into_iter().flatten() {
            let text = |key: &str| record[key].as_str().unwrap_or_default().trim().to_string();
            let mut place = (text("traddr"), text("trsvcid"));
            if is_loopback(&place.0) {
                place.0.clone_from(&address);
            }
            if text("subnqn") == nqn {
                if !found.contains(&place) {
                    found.push(place);
                }
            } else if text("subtype") == "discovery subsystem" {
                // A referral (not "current discovery subsystem": the one asked).
                to_ask.push(place);
            }
        }
    }
    Ok(found)
}

fn is_loopback(address: &str) -> bool {
    address.starts_with("127.") || address == "::1" || address == "localhost"
}

fn split_address(address: &str) -> (String, String) {
    match address.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.to_string()),
        None => (address.to_string(), "4420".to_string()),
    }
}

/// The arguments that name host `host_nqn` to nvme-cli. The machine's own
/// NQN (/etc/nvme/hostnqn) goes with its host id (/etc/nvme/hostid, which
/// nvme-cli reads); another NQN of the form `...:uuid:U` with host id U, since
/// the kernel refuses one host id under two NQNs.
fn host_args(host_nqn: &str) -> Vec<String> {
    let mut args = vec!["--hostnqn".to_string(), host_nqn.to_string()];
    let own = std::fs::read_to_string("/etc/nvme/hostnqn").is_ok_and(|own| own.trim() == host_nqn);
    if let (false, Some((_, id))) = (own, host_nqn.rsplit_once(":uuid:")) {
        args.extend(["--hostid".to_string(), id.to_string()]);
    }
    args
}

/// Runs nvme-cli's `verb` with `args` as host `host_nqn`.
fn nvme_as(host_nqn: &str, verb: &str, args: &[&str]) -> Result<String, HostError> {
    let host = host_args(host_nqn);
    let mut all: Vec<&str> = vec![verb];
    all.extend_from_slice(args);
    all.extend(host.iter().map(String::as_str));
    run("nvme", &all)
}

/// The keep-alive timeout the node's controllers are connected with, in
/// seconds (Linux's default is 5): a storage node that hangs (rather than
/// dies) holds the host's I/O on its paths until the host's keep-alive
/// gives up on them, so a shorter one bounds the pause of a replicated
/// volume's failover (measured in the guest: 13 s with 5, 5.3-7.2 s with
/// 2, 3.2-4.6 s with 1). weft's controllers expire a second after KATO, so
/// a Keep Alive a loaded host sends late does not cost a live path.
const KEEP_ALIVE_TIMEOUT_S: &str = "1";

/// Connects host `host_nqn` to subsystem `nqn` at each address; what
/// failed (one connected already fails, and is fine: whether the namespace
/// appears is what counts).
pub(crate) fn connect(
    places: &[(String, String)],
    host_nqn: &str,
    nqn: &str,
    secrets: Option<&Secrets>,
) -> Vec<HostError> {
    places
        .iter()
        .filter_map(|(address, port)| {
            let mut args = vec![
                "-t",
                "tcp",
                "-a",
                address,
                "-s",
                port,
                "-n",
                nqn,
                "--keep-alive-tmo",
                KEEP_ALIVE_TIMEOUT_S,
            ];
            if let Some(secrets) = secrets {
                // Bidirectional: the node authenticates the target too.
                args.extend(["--dhchap-secret", &secrets.host]);
                args.extend(["--dhchap-ctrl-secret", &secrets.controller]);
            }
            nvme_as(host_nqn, "connect", &args).err()
        })
        .collect()
}

/// The DH-HMAC-CHAP secrets a node connects with (`DHHC-1` text).
#[derive(Debug, Clone)]
pub(crate) struct Secrets {
    /// The host's.
    pub host: String,
    /// The controller's.
    pub controller: String,
}

/// Disconnects every controller of subsystem `nqn` (none connected is fine).
pub(crate) fn disconnect(nqn: &str) -> Result<(), HostError> {
    run("nvme", &["disconnect", "-n", nqn]).map(|_| ())
}

/// The block device (`/dev/nvmeXnY`) whose namespace UUID is `uuid`,
/// waited for up to `wait` (a namespace appears a moment after its connect).
pub(crate) fn namespace_device(uuid: &str, wait: Duration) -> Option<PathBuf> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(device) = namespace_device_now(uuid) {
            return Some(device);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The namespace block device with `uuid` now.
fn namespace_device_now(uuid: &str) -> Option<PathBuf> {
    let wanted = normal_uuid(uuid);
    let entries = std::fs::read_dir("/sys/block").ok()?;
    entries.flatten().find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        // nvmeXnY: a namespace (with multipath, its head); nvmeXcYnZ are
        // the hidden per-path devices.
        let rest = name.strip_prefix("nvme")?;
        let (controller, namespace) = rest.split_once('n')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(controller) || !digits(namespace) {
            return None;
        }
        let found = std::fs::read_to_string(entry.path().join("uuid")).ok()?;
        (normal_uuid(&found) == wanted).then(|| Path::new("/dev").join(&name))
    })
}

fn normal_uuid(text: &str) -> String {
    text.trim().to_ascii_lowercase().replace('-', "")
}

/// Whether something is mounted at `path`.
pub(crate) fn is_mounted(path: &str) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let path = path.trim_end_matches('/');
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| point.replace("\\040", " ") == path)
}

/// The filesystem on `device`, if any.
pub(crate) fn filesystem_of(device: &Path) -> Option<String> {
    let device = device.to_str()?;
    let kind = run("blkid", &["-p", "-o", "value", "-s", "TYPE", device]).ok()?;
    let kind = kind.trim();
    (!kind.is_empty()).then(|| kind.to_string())
}

/// Makes filesystem `kind` (ext4 or xfs) on `device`.
pub(crate) fn make_filesystem(device: &Path, kind: &str) -> Result<(), HostError> {
    let device = device.to_str().unwrap_or_default();
    match kind {
        "xfs" => run("mkfs.xfs", &["-q", device]),
        _ => run("mkfs.ext4", &["-q", "-F", device]),
    }
    .map(|_| ())
}

/// Grows the filesystem `kind` on `device`, mounted at `mounted_at`.
pub(crate) fn grow_filesystem(
    device: &Path,
    kind: &str,
    mounted_at: &str,
) -> Result<(), HostError> {
    match kind {
        "xfs" => run("xfs_growfs", &[mounted_at]),
        _ => run("resize2fs", &[device.to_str().unwrap_or_default()]),
    }
    .map(|_| ())
}

/// The size of block device `device`, bytes.
pub(crate) fn device_bytes(device: &Path) -> Result<u64, HostError> {
    let text = run(
        "blockdev",
        &["--getsize64", device.to_str().unwrap_or_default()],
    )?;
    text.trim().parse().map_err(|_| HostError {
        command: "blockdev --getsize64".into(),
        message: format!("not a size: {text}"),
    })
}

/// Bytes (total, available, used) and inodes (total, free, used) of the
/// filesystem at `path`.
pub(crate) fn filesystem_usage(path: &str) -> Result<[u64; 6], HostError> {
    let text = run("stat", &["-f", "-c", "%b %f %a %S %c %d", path])?;
    let numbers: Vec<u64> = text
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let [blocks, free, available, block_size, inodes, inodes_free] = numbers[..] else {
        return Err(HostError {
            command: "stat -f".into(),
            message: format!("unexpected output: {text}"),
        });
    };
    Ok([
        blocks * block_size,
        available * block_size,
        (blocks - free) * block_size,
        inodes,
        inodes_free,
        inodes - inodes_free,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_uuids_are_read_as_written() {
        assert_eq!(
            split_address("10.0.2.2:4420"),
            ("10.0.2.2".into(), "4420".into())
        );
        assert_eq!(split_address("host"), ("host".into(), "4420".into()));
        assert_eq!(
            normal_uuid("1B4E28BA-2FA1-11D2-883F-0016D3CCA427\n"),
            "1b4e28ba2fa111d2883f0016d3cca427"
        );
        assert!(is_mounted("/proc") || !Path::new("/proc/self").exists());
    }
}
