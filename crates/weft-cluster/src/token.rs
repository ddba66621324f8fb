//! One API token for the whole cluster: the first node records its token's
//! SHA-256 in the store (`cluster/token`, never the token itself: whoever
//! reads the store cannot call the API), and every node that joins must
//! hold the same token, so that any node's API accepts what the others do
//! and nodes can call each other's APIs with it.

use sha2::{Digest, Sha256};
use weft_control::{Store, StoreError, Txn};

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
    let digest = digest(token);
    if let Some(entry) = store.get(TOKEN_KEY)? {
        return if entry.value.as_str() == Some(digest.as_str()) {
            Ok(())
        } else {
            Err(TokenError::Mismatch {
                path: path.to_string(),
            })
        };
    }
    let txn = Txn::new().create(TOKEN_KEY, digest.into());
    match store.commit(txn) {
        Ok(_) => Ok(()),
        // Another node recorded its token at the same moment: compare with it.
        Err(StoreError::Conflict { .. }) => adopt(store, token, path),
        Err(error) => Err(error.into()),
    }
}

fn digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
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
        assert_eq!(kept.as_str().unwrap().len(), 64);
        assert!(!kept.to_string().contains("first-token"), "only its digest");
    }
}
