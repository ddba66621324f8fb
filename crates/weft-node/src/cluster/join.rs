//! Joining the cluster at start: the API token must be the cluster's (the
//! first node records its digest), the data directory must belong to this
//! cluster (its `cluster-id` file, written at the first join), and the node
//! name must be this data directory's. Every refusal says what to do.
//!
//! What it does not do: keep the lease afterwards (weft-cluster's agent).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weft_cluster::agent::unix_ms;
use weft_cluster::{token, JoinError, Member, MemberConfig};
use weft_control::Store;

/// The file in the data directory naming the cluster it joined.
pub const CLUSTER_ID_FILE: &str = "cluster-id";

/// Joins the cluster in `store` as `config` describes, from the data
/// directory `data_dir`, with the API token `api_token` (kept in
/// `token_path`). After a crash the old process's lease may still be
/// alive: joining waits for it to end (at most its time to live).
pub fn join(
    store: Arc<dyn Store>,
    data_dir: &Path,
    config: MemberConfig,
    api_token: &str,
    token_path: &Path,
) -> Result<Member, String> {
    token::adopt(store.as_ref(), api_token, &token_path.display().to_string())
        .map_err(|e| e.to_string())?;
    let id_path = data_dir.join(CLUSTER_ID_FILE);
    let known = match std::fs::read_to_string(&id_path) {
        Ok(text) => Some(text.trim().to_string()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => return Err(format!("{}: {error}", id_path.display())),
    };
    let new_cluster = crate::identity::hex(
        &crate::identity::random_bytes::<16>().map_err(|e| format!("random bytes: {e}"))?,
    );
    let deadline = Instant::now() + config.lease_ttl + Duration::from_secs(1);
    let mut waited = false;
    let member = loop {
        match Member::join(
            Arc::clone(&store),
            config.clone(),
            known.as_deref(),
            &new_cluster,
            unix_ms(),
        ) {
            Err(JoinError::AlreadyUp { .. }) if Instant::now() < deadline => {
                if !waited {
                    log::info!(
                        "node {}: the lease of its previous process is still alive; waiting up to {} s for it to end",
                        config.name,
                        config.lease_ttl.as_secs()
                    );
                    waited = true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            result => break result.map_err(|e| e.to_string())?,
        }
    };
    if known.as_deref() != Some(member.cluster_id()) {
        weft_control::durable::write_file(&id_path, member.cluster_id().as_bytes(), 0o644)
            .map_err(|e| format!("{}: {e}", id_path.display()))?;
    }
    Ok(member)
}
