//! One-time join tokens: how a new node gets its own certificate from the
//! cluster's CA without an operator copying files to it.
//!
//! An administrator asks any node for a token (`weft token join [--node
//! NAME]`): a random secret, recorded in the store with an expiry and, if
//! given, the one node name it may be used for, under a check that is an
//! HMAC keyed by the cluster's API token (which every node holds and the
//! store never does): a reader of the store learns nothing it can join
//! with, and a writer can neither forge a token nor stretch one. The text
//! handed to the new node, `weftjoin-1:ID:SECRET:PIN`, also carries the
//! SHA-256 of the cluster CA's certificate (the pin, as kubeadm's
//! discovery-token-ca-cert-hash): the new node trusts the CA it fetches only
//! if it hashes to the pin, and sends the secret only to a node whose
//! certificate that CA issued. The node holding the CA's key (`weft serve
//! --ca-key`) takes the token once ([`consume`]: the record is removed at
//! the revision read, so two uses race and one wins) and signs the new
//! node's own public key.
//!
//! What this does not do: sign (weft-cluster's `pki`), or talk to the
//! network (the API and the joining node do).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::time::Duration;
use thiserror::Error;
use weft_control::records::{decode, encode};
use weft_control::store::{Store, StoreError, Txn};

/// Where the tokens' records are.
pub const JOIN_TOKENS_PREFIX: &str = "cluster/join-tokens/";

/// The form of a token's text.
const FORMAT: &str = "weftjoin-1";

/// The longest a token may live.
pub const TTL_MAX: Duration = Duration::from_secs(7 * 86_400);

/// Why a token could not be made, read or used.
#[derive(Debug, Error)]
pub enum JoinError {
    /// The text is not a join token.
    #[error("not a join token (weftjoin-1:ID:SECRET:PIN, as `weft token join` prints it)")]
    Malformed,
    /// No such token: never made, used already, or removed.
    #[error("this join token is unknown or was used already (a token joins one node, once): make another with `weft token join`")]
    Unknown,
    /// Past its expiry.
    #[error("this join token expired: make another with `weft token join`")]
    Expired,
    /// Made for another node's name.
    #[error("this join token is for node {0}, not this one")]
    OtherNode(String),
    /// A token made for no name, used for the name of a member.
    #[error("node {0} is a member already: a token made for no name joins only a new name (to replace {0}, make a token for it: weft token join --node {0})")]
    MemberName(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A token's record: what the store knows of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct JoinTokenRecord {
    /// HMAC-SHA256 under the cluster's key of the id, node, expiry and
    /// secret ([`check`]), hex.
    check: String,
    /// The node name it may join as, if it was made for one.
    node: Option<String>,
    /// When it stops being valid (Unix time, ms).
    expires_unix_ms: u64,
}

/// A join token, as its text carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Which record (hex).
    pub id: String,
    /// The secret (hex): the credential.
    pub secret: String,
    /// SHA-256 of the cluster CA's certificate (DER), hex.
    pub pin: String,
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{FORMAT}:{}:{}:{}", self.id, self.secret, self.pin)
    }
}

impl std::str::FromStr for JoinToken {
    type Err = JoinError;

    fn from_str(text: &str) -> Result<JoinToken, JoinError> {
        let mut parts = text.trim().split(':');
        let (Some(FORMAT), Some(id), Some(secret), Some(pin), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(JoinError::Malformed);
        };
        let hex_of = |text: &str, len: usize| {
            text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit())
        };
        if !(hex_of(id, 16) && hex_of(secret, 64) && hex_of(pin, 64)) {
            return Err(JoinError::Malformed);
        }
        Ok(JoinToken {
            id: id.to_ascii_lowercase(),
            secret: secret.to_ascii_lowercase(),
            pin: pin.to_ascii_lowercase(),
        })
    }
}

/// The pin of a CA certificate: SHA-256 of its DER, hex.
pub fn pin_of(ca_der: &[u8]) -> String {
    crate::token::hex(&Sha256::digest(ca_der))
}

/// Records a new token for `node` (any name if none), valid `ttl` (at most
/// [`TTL_MAX`]) from `now_unix_ms`, whose text pins the CA certificate of
/// pin `pin`; its check is keyed by `key` (the cluster's API token).
pub fn create(
    store: &dyn Store,
    key: &[u8],
    node: Option<&str>,
    ttl: Duration,
    now_unix_ms: u64,
    pin: &str,
) -> Result<JoinToken, JoinError> {
    let id = crate::token::hex(&random::<8>());
    let secret = crate::token::hex(&random::<32>());
    let mut record = JoinTokenRecord {
        check: String::new(),
        node: node.map(str::to_string),
        expires_unix_ms: now_unix_ms + ttl.min(TTL_MAX).as_millis() as u64,
    };
    record.check = check(key, &id, &record, &secret);
    let record_key = format!("{JOIN_TOKENS_PREFIX}{id}");
    store.commit(Txn::new().create(record_key, encode(&record)))?;
    Ok(JoinToken {
        id,
        secret,
        pin: pin.to_string(),
    })
}

/// Takes `token` for node `node` at `now_unix_ms`, once: its record is
/// removed (at the revision read, so that of two uses one wins); returns
/// when it would have expired. A token past its expiry is removed too, and
/// refused; one whose record does not check under `key` (forged or changed
/// in the store) is unknown; one made for no name does not join a member's
/// name.
pub fn consume(
    store: &dyn Store,
    key: &[u8],
    token: &JoinToken,
    node: &str,
    now_unix_ms: u64,
) -> Result<u64, JoinError> {
    let record_key = format!("{JOIN_TOKENS_PREFIX}{}", token.id);
    let entry = store.get(&record_key)?.ok_or(JoinError::Unknown)?;
    let record: JoinTokenRecord = decode(&record_key, entry.value)?;
    let expected = check(key, &token.id, &record, &token.secret);
    if !same(record.check.as_bytes(), expected.as_bytes()) {
        return Err(JoinError::Unknown);
    }
    match &record.node {
        Some(bound) if bound != node => return Err(JoinError::OtherNode(bound.clone())),
        None if store.get(&crate::records::member_key(node))?.is_some() => {
            return Err(JoinError::MemberName(node.to_string()))
        }
        _ => {}
    }
    let removed = store.commit(Txn::new().remove(record_key, entry.revision));
    if now_unix_ms >= record.expires_unix_ms {
        return Err(JoinError::Expired);
    }
    match removed {
        Ok(_) => Ok(record.expires_unix_ms),
        Err(StoreError::Conflict { .. }) => Err(JoinError::Unknown),
        Err(error) => Err(error.into()),
    }
}

/// HMAC-SHA256 under `key` of token `id`'s record fields and `secret`.
fn check(key: &[u8], id: &str, record: &JoinTokenRecord, secret: &str) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    let node = record.node.as_deref().unwrap_or("");
    let fields = format!(
        "weft join token\0{id}\0{node}\0{}\0{secret}",
        record.expires_unix_ms
    );
    mac.update(fields.as_bytes());
    crate::token::hex(&mac.finalize().into_bytes())
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `N` bytes from the kernel's random source.
fn random<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .expect("the kernel's random source answers");
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::MemoryStore;

    const PIN: &str = "aa00000000000000000000000000000000000000000000000000000000000000";
    const KEY: &[u8] = b"the cluster's api token";

    /// A writer of the store records a token of its own, or stretches a
    /// real one's node or expiry: neither checks under the cluster's key.
    #[test]
    fn a_token_the_store_was_given_by_another_is_unknown() {
        let store = MemoryStore::default();
        let hour = Duration::from_secs(3600);
        let token = create(&store, b"another key", None, hour, 1_000, PIN).unwrap();
        assert!(matches!(
            consume(&store, KEY, &token, "n3", 2_000),
            Err(JoinError::Unknown)
        ));
        let real = create(&store, KEY, Some("n3"), hour, 1_000, PIN).unwrap();
        let key = format!("{JOIN_TOKENS_PREFIX}{}", real.id);
        let entry = store.get(&key).unwrap().unwrap();
        let mut record: JoinTokenRecord = decode(&key, entry.value).unwrap();
        record.node = None;
        record.expires_unix_ms += 1_000_000;
        store
            .commit(Txn::new().update(key, encode(&record), entry.revision))
            .unwrap();
        assert!(matches!(
            consume(&store, KEY, &real, "n4", 2_000),
            Err(JoinError::Unknown)
        ));
    }

    #[test]
    fn a_token_joins_once_within_its_time_and_for_its_node() {
        let store = MemoryStore::default();
        let hour = Duration::from_secs(3600);
        let token = create(&store, KEY, Some("n3"), hour, 1_000, PIN).unwrap();
        let text = token.to_string();
        assert!(text.starts_with("weftjoin-1:"), "{text}");
        let parsed: JoinToken = text.parse().unwrap();
        assert_eq!(parsed, token);
        // The store holds no secret.
        let listed = store.list(JOIN_TOKENS_PREFIX).unwrap();
        assert!(!format!("{:?}", listed.entries).contains(&token.secret));
        let forged = JoinToken {
            secret: "0".repeat(64),
            ..token.clone()
        };
        assert!(matches!(
            consume(&store, KEY, &forged, "n3", 2_000),
            Err(JoinError::Unknown)
        ));
        assert!(matches!(
            consume(&store, KEY, &token, "n4", 2_000),
            Err(JoinError::OtherNode(node)) if node == "n3"
        ));
        assert_eq!(
            consume(&store, KEY, &token, "n3", 2_000).unwrap(),
            1_000 + 3_600_000
        );
        assert!(matches!(
            consume(&store, KEY, &token, "n3", 2_000),
            Err(JoinError::Unknown)
        ));
        let any = create(&store, KEY, None, hour, 1_000, PIN).unwrap();
        store
            .commit(Txn::new().create(crate::records::member_key("n1"), serde_json::json!({})))
            .unwrap();
        assert!(matches!(
            consume(&store, KEY, &any, "n1", 2_000),
            Err(JoinError::MemberName(node)) if node == "n1"
        ));
        assert!(matches!(
            consume(&store, KEY, &any, "n9", 1_000 + 3_600_000),
            Err(JoinError::Expired)
        ));
        assert!(
            matches!(
                consume(&store, KEY, &any, "n9", 1_000),
                Err(JoinError::Unknown)
            ),
            "removed once expired"
        );
    }

    #[test]
    fn only_a_whole_token_parses() {
        let good = format!("weftjoin-1:{}:{}:{PIN}", "0123456789abcdef", "f".repeat(64));
        assert!(good.parse::<JoinToken>().is_ok());
        for bad in [
            "",
            "weftjoin-1:0123456789abcdef",
            &good.replace("weftjoin-1", "weftjoin-2"),
            &format!("{good}:extra"),
            &good.replace("0123456789abcdef", "0123456789abcdeg"),
        ] {
            assert!(
                matches!(bad.parse::<JoinToken>(), Err(JoinError::Malformed)),
                "{bad}"
            );
        }
    }
}
