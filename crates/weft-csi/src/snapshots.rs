//! Snapshots through the Controller service. A CSI snapshot is a weft
//! snapshot of its source volume named `csi-`, 24 hex digits of the SHA-256
//! of the CSI name and the creation time in Unix seconds: the name makes
//! CreateSnapshot idempotent, the time is the creation time CSI requires
//! (weft's snapshots do not record one). The snapshot's id is
//! `VOLUME@SNAPSHOT`, as weft's clone source is written.

use crate::controller::ControllerService;
use crate::csi::Snapshot;
use crate::errors::status;
use serde_json::{json, Value};
use tonic::Status;

/// The start of the weft name of CSI snapshot `name`.
fn name_prefix(name: &str) -> String {
    format!("csi-{}-", crate::controller::hashed(name, 12))
}

/// The creation time a weft snapshot's name holds (none: not one the
/// plugin made).
fn created_of(snapshot: &str) -> Option<i64> {
    let rest = snapshot.strip_prefix("csi-")?;
    let (hash, seconds) = rest.split_once('-')?;
    (hash.len() == 24).then_some(())?;
    seconds.parse().ok()
}

/// `VOLUME@SNAPSHOT` split.
pub(crate) fn split_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('@')
        .filter(|(v, s)| !v.is_empty() && !s.is_empty())
}

/// A weft snapshot of `volume` (the API's JSON) as a CSI snapshot.
fn csi_snapshot(volume: &Value, snapshot: &str) -> Snapshot {
    let source = volume["name"].as_str().unwrap_or_default();
    Snapshot {
        size_bytes: volume["size_bytes"].as_i64().unwrap_or(0),
        snapshot_id: format!("{source}@{snapshot}"),
        source_volume_id: source.to_string(),
        creation_time: Some(prost_types::Timestamp {
            seconds: created_of(snapshot).unwrap_or(0),
            nanos: 0,
        }),
        ready_to_use: true,
        group_snapshot_id: String::new(),
        accessible_topology: Vec::new(),
    }
}

impl ControllerService {
    /// Every snapshot, as (volume, snapshot name), sorted.
    async fn all_snapshots(&self) -> Result<Vec<(Value, String)>, Status> {
        let mut found = Vec::new();
        for volume in self.volumes().await? {
            let names: Vec<String> = volume["snapshots"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(String::from))
                // A clone's snapshot of its source lives only while the clone is made.
                .filter(|s| !s.starts_with(crate::controller::CLONE_SNAPSHOT_PREFIX))
                .collect();
            found.extend(names.into_iter().map(|name| (volume.clone(), name)));
        }
        found.sort_by(|a, b| (a.0["name"].as_str(), &a.1).cmp(&(b.0["name"].as_str(), &b.1)));
        Ok(found)
    }

    /// Takes snapshot `name` of `source` (idempotent by name).
    pub(crate) async fn create_snapshot(
        &self,
        source: &str,
        name: &str,
    ) -> Result<Snapshot, Status> {
        if source.is_empty() || name.is_empty() {
            return Err(Status::invalid_argument(
                "source_volume_id and name are required",
            ));
        }
        let prefix = name_prefix(name);
        let existing = self.all_snapshots().await?;
        if let Some((volume, snapshot)) = existing.iter().find(|(_, s)| s.starts_with(&prefix)) {
            if volume["name"].as_str() != Some(source) {
                return Err(Status::already_exists(format!(
                    "snapshot {name} exists of another volume"
                )));
            }
            return Ok(csi_snapshot(volume, snapshot));
        }
        let volume = self
            .find(source)
            .await?
            .ok_or_else(|| Status::not_found(format!("no volume {source}")))?;
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let snapshot = format!("{prefix}{seconds}");
        let body = json!({"name": snapshot});
        let path = format!("volumes/{source}/snapshots");
        self.api
            .call("POST", path, Some(body))
            .await
            .map_err(|e| status(&e))?;
        Ok(csi_snapshot(&volume, &snapshot))
    }

    /// Deletes snapshot `id` (one that does not exist is deleted).
    pub(crate) async fn delete_snapshot(&self, id: &str) -> Result<(), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument("snapshot_id is required"));
        }
        let Some((volume, snapshot)) = split_id(id) else {
            return Ok(());
        };
        let path = format!("volumes/{volume}/snapshots/{snapshot}");
        match self.api.call("DELETE", path, None).await {
            Ok(_) => Ok(()),
            Err(error) if error.status == Some(404) => Ok(()),
            Err(error) => Err(status(&error)),
        }
    }

    /// The snapshots (of `source` if given; only `id` if given).
    pub(crate) async fn list_snapshots(
        &self,
        source: &str,
        id: &str,
    ) -> Result<Vec<Snapshot>, Status> {
        let all = self.all_snapshots().await?;
        Ok(all
            .iter()
            .filter(|(volume, _)| source.is_empty() || volume["name"].as_str() == Some(source))
            .map(|(volume, snapshot)| csi_snapshot(volume, snapshot))
            .filter(|snapshot| id.is_empty() || snapshot.snapshot_id == id)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_carry_the_csi_name_and_the_creation_time() {
        let prefix = name_prefix("snap-1");
        assert_eq!(prefix.len(), 29);
        assert_eq!(
            created_of(&format!("{prefix}1764000000")),
            Some(1_764_000_000)
        );
        assert_eq!(created_of("s1"), None, "an operator's snapshot");
        assert_eq!(split_id("v@s"), Some(("v", "s")));
        assert_eq!(split_id("v@"), None);
        assert_eq!(split_id("nothing"), None);
    }
}
