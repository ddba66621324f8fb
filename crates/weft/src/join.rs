//! `weft serve --join TOKEN --join-via URL --pki DIR`: a new node gets its
//! own key and certificate from the cluster with a one-time token
//! (weft-cluster's `join`), instead of files copied to it.
//!
//! The node fetches the cluster CA's certificate from the node at URL
//! without trusting anything yet, and goes on only if it hashes to the pin
//! the token carries (nothing secret has been sent then); it makes its key,
//! sends the token and its public key over TLS checked against that CA,
//! and keeps what comes back in DIR (`ca.crt`, `node.crt`, and `node.key`,
//! mode 0600, which never left it), and the cluster's API token in its
//! token file unless one is there. A node that holds a certificate in DIR
//! already starts with it and does not use the token.
//!
//! What this does not do: make tokens (`weft token join`) or sign
//! (the node started with `--ca-key`).

use crate::cluster::ClusterSpec;
use crate::pki::{write_new, CA_CERT, NODE_CERT, NODE_KEY};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;
use weft_cluster::join::{pin_of, JoinToken};

/// How long each call of the join may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Joins with `token` through the node at `via`, unless `spec`'s `--pki`
/// directory holds this node's certificate already; the cluster's API
/// token goes to `token_path` unless a file is there.
pub fn join_if_needed(
    token: &str,
    via: &str,
    spec: &ClusterSpec,
    token_path: &Path,
) -> Result<(), String> {
    let dir = spec
        .pki
        .as_ref()
        .ok_or("--join needs --pki DIR: where this node keeps the key and certificate it gets")?;
    if dir.join(NODE_CERT).exists() {
        log::info!(
            "--join: {} holds this node's certificate already; the token is not used",
            dir.display()
        );
        return Ok(());
    }
    // The token is spent once the join answers: what could fail after is checked before.
    if dir.join(NODE_KEY).exists() {
        return Err(format!(
            "--join: {} holds a key but no certificate (a join that did not finish, or another key): move it away and join with a new token",
            dir.join(NODE_KEY).display()
        ));
    }
    let token: JoinToken = token.parse().map_err(|e| format!("--join: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ca_file = dir.join(".ca.crt.joining");
    let ca_pem = pinned_ca(via, &token)?;
    std::fs::write(&ca_file, &ca_pem).map_err(|e| format!("{}: {e}", ca_file.display()))?;
    let (public_key, key_pem) = weft_cluster::pki::new_node_key().map_err(|e| e.to_string())?;
    let mut addresses = vec![std::net::IpAddr::from([127, 0, 0, 1])];
    addresses.extend(spec.advertise);
    let request = json!({
        "token": token.to_string(),
        "node": spec.node,
        "public_key": weft_node::identity::hex(&public_key),
        "addresses": addresses,
    });
    let endpoint = weft_http::Endpoint::parse(via, Some(&ca_file))?;
    let answer = call(
        &endpoint,
        "POST",
        "/api/v1/cluster/join",
        Some(request),
        via,
    )?;
    let cert_pem = answer["cert_pem"]
        .as_str()
        .ok_or_else(|| format!("--join-via {via}: the answer holds no certificate: {answer}"))?;
    if !token_path.exists() {
        let api_token = answer["api_token"]
            .as_str()
            .ok_or_else(|| format!("--join-via {via}: the answer holds no API token"))?;
        weft_control::durable::write_file(token_path, format!("{api_token}\n").as_bytes(), 0o600)
            .map_err(|e| format!("{}: {e}", token_path.display()))?;
    }
    write_new(&dir.join(NODE_KEY), &key_pem, true)?;
    write_new(&dir.join(NODE_CERT), cert_pem, false)?;
    std::fs::rename(&ca_file, dir.join(CA_CERT)).map_err(|e| format!("{}: {e}", dir.display()))?;
    log::info!(
        "joined with a token through {via}: this node's key and certificate are in {}",
        dir.display()
    );
    Ok(())
}

/// The cluster CA's certificate (PEM) as the node at `via` gives it, if it
/// is the one `token` pins.
fn pinned_ca(via: &str, token: &JoinToken) -> Result<String, String> {
    let endpoint = weft_http::Endpoint::unverified(via).map_err(|e| format!("--join-via: {e}"))?;
    let answer = call(&endpoint, "GET", "/api/v1/cluster/ca", None, via)?;
    let ca_pem = answer["ca_pem"]
        .as_str()
        .ok_or_else(|| format!("--join-via {via}: no CA certificate in {answer}"))?;
    pinned(ca_pem, &token.pin).map_err(|e| format!("--join-via {via}: {e}"))?;
    Ok(ca_pem.to_string())
}

/// Checks that `ca_pem` is one certificate, whose SHA-256 is `pin`: the
/// file trusted next holds that certificate and nothing else (another
/// certificate after the pinned one would be trusted too).
fn pinned(ca_pem: &str, pin: &str) -> Result<(), String> {
    let certificates = weft_http::tls::certificates_der(ca_pem)?;
    let [der] = &certificates[..] else {
        return Err(format!(
            "it gives {} certificates as the cluster's CA, not one: someone in between; nothing was sent",
            certificates.len()
        ));
    };
    let got = pin_of(der);
    if got != pin {
        return Err(format!(
            "its cluster CA (SHA-256 {got}) is not the one the token pins ({pin}): a wrong address, or someone in between; nothing was sent"
        ));
    }
    Ok(())
}

/// One call of the join; the answer's JSON, or what went wrong.
fn call(
    endpoint: &weft_http::Endpoint,
    method: &str,
    path: &str,
    body: Option<Value>,
    via: &str,
) -> Result<Value, String> {
    let body = body.map(|b| b.to_string());
    let (status, answer) = weft_http::call(
        endpoint,
        None,
        method,
        path,
        body.as_deref().map(str::as_bytes),
        TIMEOUT,
    )
    .map_err(|e| format!("--join-via {via}: {e}"))?;
    let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
    if status >= 300 {
        let message = answer["message"].as_str().unwrap_or("no message");
        return Err(format!(
            "--join-via {via}: {method} {path}: {status} {message}"
        ));
    }
    Ok(answer)
}

/// The CA of the key in `path` (PEM), which no one but its owner may read.
pub fn load_ca_key(path: &Path) -> Result<weft_cluster::pki::ClusterCa, String> {
    use std::os::unix::fs::PermissionsExt;
    let metadata =
        std::fs::metadata(path).map_err(|e| format!("--ca-key {}: {e}", path.display()))?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "--ca-key {}: others may read or write it (mode {mode:04o}), and whoever reads it can make nodes: chmod 600 {}",
            path.display(),
            path.display()
        ));
    }
    let pem =
        std::fs::read_to_string(path).map_err(|e| format!("--ca-key {}: {e}", path.display()))?;
    weft_cluster::pki::ClusterCa::load(&pem)
        .map_err(|e| format!("--ca-key {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> String {
        weft_cluster::pki::ClusterCa::create(std::time::SystemTime::now())
            .unwrap()
            .cert_pem()
    }

    #[test]
    fn only_the_pinned_certificate_alone_is_trusted() {
        let (ca, other) = (ca_pem(), ca_pem());
        let der = weft_http::tls::certificates_der(&ca).unwrap().remove(0);
        let pin = pin_of(&der);
        assert_eq!(pinned(&ca, &pin), Ok(()));
        // Another CA after the pinned one would be trusted by the next call.
        let appended = format!("{ca}{other}");
        assert!(pinned(&appended, &pin)
            .unwrap_err()
            .contains("2 certificates"));
        assert!(pinned(&other, &pin)
            .unwrap_err()
            .contains("is not the one the token pins"));
        assert!(pinned("", &pin).unwrap_err().contains("0 certificates"));
    }
}
