//! `weft cluster init` and `weft cluster issue NODE`: the files of the
//! cluster's certificate authority (weft-cluster's `pki` makes the
//! certificates). Run where the CA's key is to be kept, an operator's
//! machine or the first node, never in the store.
//!
//! Layout of the directory (`--pki DIR`, default ./weft-pki):
//! `ca.crt`, `ca.key` (the CA), `etcd.crt`, `etcd.key` (etcd's servers),
//! and `nodes/NODE/` with `ca.crt`, `node.crt`, `node.key`: what node NODE
//! is given (`weft serve --pki DIR/nodes/NODE`). Keys are written mode 0600,
//! never over an existing file.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use weft_cluster::pki::ClusterCa;

/// The CA's certificate, in the CA's directory and in each node's.
pub const CA_CERT: &str = "ca.crt";
/// The CA's key.
pub const CA_KEY: &str = "ca.key";
/// A node's certificate, in its directory.
pub const NODE_CERT: &str = "node.crt";
/// A node's key.
pub const NODE_KEY: &str = "node.key";

/// What `weft cluster ...` does.
#[derive(Debug)]
pub enum PkiArgs {
    /// `init [--etcd-host H]...`.
    Init {
        /// The CA's directory.
        dir: PathBuf,
        /// Names and addresses etcd's certificate is valid for.
        etcd_hosts: Vec<String>,
    },
    /// `issue-etcd [--etcd-host H]...`: etcd's certificate again.
    IssueEtcd {
        /// The CA's directory.
        dir: PathBuf,
        /// Names and addresses etcd's certificate is valid for.
        etcd_hosts: Vec<String>,
    },
    /// `issue NODE [--address IP]...`.
    Issue {
        /// The CA's directory.
        dir: PathBuf,
        /// The node's name.
        node: String,
        /// Addresses clients name the node's API by.
        addresses: Vec<IpAddr>,
    },
}

const USAGE: &str = "weft cluster init [--pki DIR] [--etcd-host HOST]...   (the cluster's CA, once)
weft cluster issue NODE [--pki DIR] [--address IP]...   (a node's certificate)
weft cluster issue-etcd [--pki DIR] [--etcd-host HOST]...   (etcd's certificate, renewed)";

/// Parses what follows `weft cluster`.
pub fn parse(parser: &mut lexopt::Parser) -> Result<PkiArgs, String> {
    use lexopt::prelude::*;
    let mut command = None;
    let mut node = None;
    let mut dir = PathBuf::from("weft-pki");
    let mut etcd_hosts = Vec::new();
    let mut addresses = Vec::new();
    while let Some(arg) = parser.next().map_err(|e| format!("{e}; usage:\n{USAGE}"))? {
        match arg {
            Value(value) if command.is_none() => {
                command = Some(value.string().map_err(|_| "not UTF-8".to_string())?)
            }
            Value(value) if node.is_none() => {
                node = Some(value.string().map_err(|_| "not UTF-8".to_string())?)
            }
            Long("pki") => dir = parser.value().map_err(|e| e.to_string())?.into(),
            Long("etcd-host") => etcd_hosts.push(text(parser, "--etcd-host")?),
            Long("address") => {
                let address = text(parser, "--address")?;
                addresses.push(
                    address
                        .parse()
                        .map_err(|_| format!("--address: {address:?} is not an IP address"))?,
                );
            }
            other => return Err(format!("{}; usage:\n{USAGE}", other.unexpected())),
        }
    }
    if etcd_hosts.is_empty() {
        etcd_hosts = vec!["127.0.0.1".into(), "localhost".into()];
    }
    match (command.as_deref(), node) {
        (Some("init"), None) => Ok(PkiArgs::Init { dir, etcd_hosts }),
        (Some("issue-etcd"), None) => Ok(PkiArgs::IssueEtcd { dir, etcd_hosts }),
        (Some("issue"), Some(node)) => {
            weft_cluster::records::check_node_name(&node)?;
            // The node's own CLI reaches its API at 127.0.0.1.
            addresses.insert(0, IpAddr::from([127, 0, 0, 1]));
            Ok(PkiArgs::Issue {
                dir,
                node,
                addresses,
            })
        }
        _ => Err(format!("usage:\n{USAGE}")),
    }
}

fn text(parser: &mut lexopt::Parser, option: &str) -> Result<String, String> {
    use lexopt::prelude::*;
    parser
        .value()
        .map_err(|e| e.to_string())?
        .string()
        .map_err(|_| format!("{option} is not UTF-8"))
}

/// Runs `weft cluster ...`.
pub fn run(args: PkiArgs) -> Result<(), String> {
    let now = SystemTime::now();
    match args {
        PkiArgs::Init { dir, etcd_hosts } => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            if dir.join(CA_KEY).exists() {
                return Err(format!(
                    "{} holds a cluster CA already; issue nodes' certificates with `weft cluster issue NODE --pki {}`",
                    dir.display(),
                    dir.display()
                ));
            }
            let ca = ClusterCa::create(now).map_err(|e| e.to_string())?;
            write_new(&dir.join(CA_KEY), &ca.key_pem(), true)?;
            write_new(&dir.join(CA_CERT), &ca.cert_pem(), false)?;
            issue_etcd(&ca, &dir, &etcd_hosts, now)?;
            let d = dir.display();
            outln!("cluster CA in {d} (keep {d}/{CA_KEY} safe: whoever holds it can make nodes)");
            outln!(
                "etcd's certificate for {}: run etcd with",
                etcd_hosts.join(", ")
            );
            outln!("  --cert-file {d}/etcd.crt --key-file {d}/etcd.key --client-cert-auth --trusted-ca-file {d}/{CA_CERT}");
            outln!("  --listen-client-urls https://HOST:2379 --advertise-client-urls https://HOST:2379");
            outln!("then give each node its certificate: weft cluster issue NODE --pki {d} --address NODE_IP");
            Ok(())
        }
        PkiArgs::IssueEtcd { dir, etcd_hosts } => {
            let (ca, _) = load(&dir)?;
            issue_etcd(&ca, &dir, &etcd_hosts, now)?;
            outln!(
                "etcd's certificate for {} in {}: restart etcd's members on it",
                etcd_hosts.join(", "),
                dir.display()
            );
            Ok(())
        }
        PkiArgs::Issue {
            dir,
            node,
            addresses,
        } => {
            let (ca, ca_cert) = load(&dir)?;
            let issued = ca
                .issue_node(&node, &addresses, now)
                .map_err(|e| e.to_string())?;
            let out = dir.join("nodes").join(&node);
            std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            write_new(&out.join(NODE_KEY), &issued.key_pem, true)?;
            write_new(&out.join(NODE_CERT), &issued.cert_pem, false)?;
            write_new(&out.join(CA_CERT), &ca_cert, false)?;
            let o = out.display();
            outln!("node {node}'s certificate in {o} (valid a year)");
            outln!("copy {o} to {node} and start it with:");
            outln!("  weft serve --cluster https://ETCD:2379 --node {node} --pki DIR");
            Ok(())
        }
    }
}

/// The CA in `dir`, and its certificate (PEM).
fn load(dir: &Path) -> Result<(ClusterCa, String), String> {
    let key = std::fs::read_to_string(dir.join(CA_KEY)).map_err(|e| {
        format!(
            "{}: {e} (make the cluster's CA first: weft cluster init --pki {})",
            dir.join(CA_KEY).display(),
            dir.display()
        )
    })?;
    let cert = std::fs::read_to_string(dir.join(CA_CERT))
        .map_err(|e| format!("{}: {e}", dir.join(CA_CERT).display()))?;
    let ca = ClusterCa::load(&key).map_err(|e| e.to_string())?;
    Ok((ca, cert))
}

/// etcd's server certificate for `hosts`, into `dir`.
fn issue_etcd(ca: &ClusterCa, dir: &Path, hosts: &[String], now: SystemTime) -> Result<(), String> {
    let etcd = ca.issue_etcd(hosts, now).map_err(|e| e.to_string())?;
    write_new(&dir.join("etcd.key"), &etcd.key_pem, true)?;
    write_new(&dir.join("etcd.crt"), &etcd.cert_pem, false)
}

/// Writes `text` to a new file `path` (never over one), mode 0600 if `private`.
pub(crate) fn write_new(path: &Path, text: &str, private: bool) -> Result<(), String> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!(
                "{} exists already: move it away to make a new one",
                path.display()
            ),
            _ => format!("{}: {e}", path.display()),
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}
