//! Joining a cluster with a one-time token (weft-cluster's `join`): the
//! routes a new node calls before it holds any credential, and the one an
//! administrator makes tokens with.
//!
//! - `GET cluster/ca` (no token): the cluster CA's certificate, which the
//!   new node checks against the pin in its token before trusting it.
//! - `POST cluster/join-tokens {node?, ttl_s?}` (admin token): a token.
//! - `POST cluster/join {token, node, public_key, addresses}` (no bearer
//!   token: the join token is the credential), on the node holding the
//!   CA's key: the token is taken once and the node's own public key
//!   certified; the answer is its certificate, the CA's, and the cluster's
//!   API token, which every node holds (a join token makes a node).
//!
//! The signing node also remembers the tokens it took (a file in its data
//! directory, until they would have expired): a writer of etcd who kept a
//! used token's record and learnt its text cannot put it back and join
//! again.
//!
//! What this does not do: keep the CA's key (the node is started with it:
//! `weft serve --ca-key`) or decide who may join beyond the token.

use crate::{failure, Response};
use serde::Deserialize;
use serde_json::json;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use weft_cluster::join::{self, JoinError, JoinToken};
use weft_cluster::pki::ClusterCa;
use weft_control::Store;

/// The default time a token lives.
const TTL_DEFAULT: Duration = Duration::from_secs(3600);

/// What a cluster node with certificates needs to let others join.
pub struct Joins {
    /// The cluster CA's certificate (PEM), as this node trusts it.
    ca_pem: String,
    /// Its pin (SHA-256 of its DER, hex).
    pin: String,
    /// The CA itself, on the node started with its key: it signs.
    signer: Option<Arc<ClusterCa>>,
    /// The tokens it took, and when each would have expired.
    used: Mutex<UsedTokens>,
}

/// Tokens a signing node took: their ids and expiries (Unix ms), kept in
/// a file so that a restart forgets none.
#[derive(Debug, Default, serde::Serialize, Deserialize)]
struct UsedTokens {
    #[serde(skip)]
    file: Option<PathBuf>,
    taken: Vec<(String, u64)>,
}

impl UsedTokens {
    fn load(file: PathBuf) -> Result<UsedTokens, String> {
        let mut used = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice::<UsedTokens>(&bytes)
                .map_err(|e| format!("{}: {e} (the join tokens this node took)", file.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => UsedTokens::default(),
            Err(error) => return Err(format!("{}: {error}", file.display())),
        };
        used.file = Some(file);
        Ok(used)
    }

    fn contains(&self, id: &str) -> bool {
        self.taken.iter().any(|(taken, _)| taken == id)
    }

    /// Remembers `id`, forgetting those past their expiry at `now`.
    fn insert(&mut self, id: &str, expires_unix_ms: u64, now: u64) {
        self.taken.retain(|(_, expires)| *expires > now);
        self.taken.push((id.to_string(), expires_unix_ms));
        let Some(file) = &self.file else {
            return;
        };
        let text = serde_json::to_vec(&*self).expect("serialisable");
        if let Err(error) = weft_control::durable::write_file(file, &text, 0o600) {
            log::warn!(
                "{}: {error}: a token taken now is remembered until this node restarts",
                file.display()
            );
        }
    }
}

impl Joins {
    /// From the CA's certificate `ca_pem`, and the CA if this node signs;
    /// `used_file` keeps the tokens it took.
    pub fn new(
        ca_pem: String,
        signer: Option<ClusterCa>,
        used_file: PathBuf,
    ) -> Result<Joins, String> {
        let used = match &signer {
            Some(_) => UsedTokens::load(used_file)?,
            None => UsedTokens::default(),
        };
        let der = match &weft_http::tls::certificates_der(&ca_pem)?[..] {
            [der] => der.clone(),
            other => {
                return Err(format!(
                    "the cluster CA's file holds {} certificates: give it the CA's alone (ca.crt)",
                    other.len()
                ))
            }
        };
        Ok(Joins {
            pin: join::pin_of(&der),
            ca_pem,
            signer: signer.map(Arc::new),
            used: Mutex::new(used),
        })
    }

    /// `GET cluster/ca`.
    pub(crate) fn ca(&self) -> Response {
        (200, json!({"ca_pem": self.ca_pem, "pin": self.pin}))
    }

    /// `POST cluster/join-tokens`.
    pub(crate) fn create_token(&self, store: &dyn Store, key: &str, body: &[u8]) -> Response {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Asked {
            node: Option<String>,
            ttl_s: Option<u64>,
        }
        let asked: Asked = match serde_json::from_slice(if body.is_empty() { b"{}" } else { body })
        {
            Ok(asked) => asked,
            Err(error) => return bad_request(&error.to_string()),
        };
        if let Some(node) = &asked.node {
            if let Err(message) = weft_cluster::records::check_node_name(node) {
                return bad_request(&format!("node: {message}"));
            }
        }
        let ttl = asked.ttl_s.map_or(TTL_DEFAULT, Duration::from_secs);
        match join::create(
            store,
            key.as_bytes(),
            asked.node.as_deref(),
            ttl,
            now_ms(),
            &self.pin,
        ) {
            Ok(token) => (
                201,
                json!({
                    "token": token.to_string(),
                    "node": asked.node,
                    "expires_in_s": ttl.min(join::TTL_MAX).as_secs(),
                }),
            ),
            Err(error) => join_failure(&error),
        }
    }

    /// `POST cluster/join`.
    pub(crate) fn join(&self, store: &dyn Store, key: &str, body: &[u8]) -> Response {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Joining {
            token: String,
            node: String,
            public_key: String,
            #[serde(default)]
            addresses: Vec<IpAddr>,
        }
        let Some(signer) = &self.signer else {
            return failure(
                409,
                "cannot_sign",
                "this node does not hold the cluster CA's key",
                "send the join to the node started with --ca-key (where `weft cluster init` ran)",
            );
        };
        let joining: Joining = match serde_json::from_slice(body) {
            Ok(joining) => joining,
            Err(error) => return bad_request(&error.to_string()),
        };
        if let Err(message) = weft_cluster::records::check_node_name(&joining.node) {
            return bad_request(&format!("node: {message}"));
        }
        let Some(public_key) = weft_node::identity::parse_hex(&joining.public_key) else {
            return bad_request("public_key: not hex");
        };
        // A key that cannot be certified does not use the token up.
        if let Err(error) = weft_cluster::pki::check_public_key(&public_key) {
            return bad_request(&format!("public_key: {error}"));
        }
        let token: JoinToken = match joining.token.parse() {
            Ok(token) => token,
            Err(error) => return join_failure(&error),
        };
        let mut used = self.used.lock().expect("not poisoned");
        if used.contains(&token.id) {
            return join_failure(&JoinError::Unknown);
        }
        let now = now_ms();
        match join::consume(store, key.as_bytes(), &token, &joining.node, now) {
            Ok(expires) => used.insert(&token.id, expires, now),
            Err(error) => return join_failure(&error),
        }
        drop(used);
        match signer.issue_node_for(
            &joining.node,
            &joining.addresses,
            &public_key,
            SystemTime::now(),
        ) {
            Ok(cert_pem) => {
                log::info!(
                    "node {} joined with a token: its certificate issued (addresses {:?})",
                    joining.node,
                    joining.addresses
                );
                (
                    200,
                    json!({"cert_pem": cert_pem, "ca_pem": self.ca_pem, "api_token": key}),
                )
            }
            Err(error) => bad_request(&error.to_string()),
        }
    }
}

fn now_ms() -> u64 {
    weft_cluster::agent::unix_ms()
}

fn bad_request(message: &str) -> Response {
    failure(
        400,
        "bad_request",
        message,
        "see the OpenAPI document (GET /api/v1/openapi.json)",
    )
}

fn join_failure(error: &JoinError) -> Response {
    match error {
        JoinError::Store(error) => crate::cluster::store_failure(error),
        JoinError::Malformed => bad_request(&error.to_string()),
        JoinError::Unknown
        | JoinError::Expired
        | JoinError::OtherNode(_)
        | JoinError::MemberName(_) => failure(
            403,
            "join_refused",
            &error.to_string(),
            "ask an administrator for a new token: weft token join --node NAME",
        ),
    }
}
