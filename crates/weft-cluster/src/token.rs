//! One API token for the whole cluster: the first node records a check of
//! its token in the store (`cluster/token`, never the token itself: whoever
//! reads the store cannot call the API), and every node that joins must
//! hold the same token, so that any node's API accepts what the others do
//! and nodes can call each other's APIs with it.
//!
//! The check is PBKDF2-HMAC-SHA256 with a random salt and 100,000
//! iterations: a reader of the store who guesses tokens (an operator may
//! choose a weak one) pays that much per guess, not one SHA-256. A cluster
//! started by an older build keeps the plain SHA-256 it recorded (rewriting
//! it would lock out a node of that build that restarts during an upgrade).

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use weft_control::{Store, StoreError, Txn};

/// What a check recorded by this build starts with.
const PBKDF2: &str = "pbkdf2-sha256";
/// Its iterations.
const ITERATIONS: u32 = 100_000;

/// Key of the token's digest.
pub const TOKEN_KEY: &str = "cluster/token";

/// Why a node's token was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The node holds another token.
    #[error("this node's API token ({path}) is not the cluster's: copy the api-token file of a node that is in the cluster (the first node's data directory holds it) and give it with --api-token-file")]
    Mismatch {
        /// Where this node's token is.
        path: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Records `token` as the cluster's if there is none yet, or checks that
/// it is the cluster's; `path` names its file for the message.
pub fn adopt(store: &dyn Store, token: &str, path: &str) -> Result<(), TokenError> {
    if let Some(entry) = store.get(TOKEN_KEY)? {
        return if entry
            .value
            .as_str()
            .is_some_and(|check| verifies(check, token))
        {
            Ok(())
        } else {
            Err(TokenError::Mismatch {
                path: path.to_string(),
            })
        };
    }
    let txn = Txn::new().create(TOKEN_KEY, check(token, &salt()).into());
    match store.commit(txn) {
        Ok(_) => Ok(()),
        // Another node recorded its token at the same moment: compare with it.
        Err(StoreError::Conflict { .. }) => adopt(store, token, path),
        Err(error) => Err(error.into()),
    }
}

/// The check of `token` with `salt`: `pbkdf2-sha256:ITERATIONS:SALT:HASH`, in hex.
fn check(token: &str, salt: &[u8; 16]) -> String {
    let hash = pbkdf2(token.as_bytes(), salt, ITERATIONS);
    format!("{PBKDF2}:{ITERATIONS}:{}:{}", hex(salt), hex(&hash))
}

/// Whether `check` (this build's, or an older build's plain SHA-256) is of `token`.
fn verifies(check: &str, token: &str) -> bool {
    let computed = match check.split(':').collect::<Vec<_>>()[..] {
        [PBKDF2, iterations, salt, _] => {
            let (Ok(iterations), Some(salt)) = (iterations.parse::<u32>(), unhex(salt)) else {
                return false;
            };
            // Bounded: a writer of the store could ask for years of work.
            if iterations == 0 || iterations > 10 * ITERATIONS {
                return false;
            }
            let hash = pbkdf2(token.as_bytes(), &salt, iterations);
            format!("{PBKDF2}:{iterations}:{}:{}", hex(&salt), hex(&hash))
        }
        _ => hex(&Sha256::digest(token.as_bytes())),
    };
    // In time that does not depend on where they differ.
    computed.len() == check.len()
        && computed
            .bytes()
            .zip(check.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// PBKDF2-HMAC-SHA256 (RFC 8018, section 5.2) with one 32-byte block.
fn pbkdf2(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let prf = Hmac::<Sha256>::new_from_slice(password).expect("HMAC takes a key of any length");
    let mut mac = prf.clone();
    mac.update(salt);
    mac.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = mac.finalize().into_bytes().into();
    let mut t = u;
    for _ in 1..iterations {
        let mut mac = prf.clone();
        mac.update(&u);
        u = mac.finalize().into_bytes().into();
        for (t, u) in t.iter_mut().zip(u) {
            *t ^= u;
        }
    }
    t
}

/// 16 bytes from the kernel's random source.
fn salt() -> [u8; 16] {
    use std::io::Read;
    let mut salt = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut salt))
        .expect("the kernel's random source answers");
    salt
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::MemoryStore;

    #[test]
    fn the_first_token_is_the_clusters_and_others_are_refused() {
        let store = MemoryStore::default();
        adopt(&store, "first-token-0123456789", "/n1/api-token").unwrap();
        adopt(&store, "first-token-0123456789", "/n2/api-token").unwrap();
        let refused = adopt(&store, "other-token-0123456789", "/n3/api-token").unwrap_err();
        assert!(refused.to_string().contains("/n3/api-token"), "{refused}");
        let kept = store.get(TOKEN_KEY).unwrap().unwrap().value;
        let kept = kept.as_str().unwrap();
        assert!(kept.starts_with("pbkdf2-sha256:100000:"), "{kept}");
        assert!(!kept.contains("first-token"), "only its check");
    }

    /// RFC 7914, section 11: PBKDF2-HMAC-SHA256 of "passwd" with salt
    /// "salt" and one iteration.
    #[test]
    fn pbkdf2_matches_the_published_vector() {
        let hash = pbkdf2(b"passwd", b"salt", 1);
        assert_eq!(
            hex(&hash),
            "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
        );
    }

    /// A cluster an older build started recorded the token's plain SHA-256:
    /// still accepted (and left as it is).
    #[test]
    fn an_older_builds_digest_is_still_checked() {
        let store = MemoryStore::default();
        let old = hex(&Sha256::digest(b"old-cluster-token-0123456789"));
        let txn = Txn::new().create(TOKEN_KEY, old.clone().into());
        store.commit(txn).unwrap();
        adopt(&store, "old-cluster-token-0123456789", "/n2/api-token").unwrap();
        assert!(adopt(&store, "another-token-0123456789abc", "/n3/api-token").is_err());
        let kept = store.get(TOKEN_KEY).unwrap().unwrap().value;
        assert_eq!(kept.as_str(), Some(old.as_str()));
        assert!(
            !verifies("pbkdf2-sha256:4000000000:00:00", "any"),
            "bounded work"
        );
    }
}
