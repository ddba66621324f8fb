//! [`EmbeddedStore`]: the single node's store, one JSON file
//! `<data dir>/state.json` holding every entry not under a lease with its
//! revision, rewritten crash-atomically on every commit (temporary file,
//! fsync, rename, fsync of the directory): after a crash the file holds
//! either the old or the new state, never a mix. The state is small
//! (records of hosts, pools and volumes), so rewriting it whole is cheap.
//!
//! Format 1 (before revisions) is read and written back as format 2 at the
//! next commit.

use crate::memory::MemoryStore;
use crate::store::{Entry, LeaseId, Listing, Revision, Store, StoreError, Txn, WatchEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// Format version of the file.
const FILE_VERSION: u64 = 2;

/// One entry as the file keeps it.
#[derive(Serialize, Deserialize)]
struct FileEntry {
    value: Value,
    revision: Revision,
}

/// The single-node store.
#[derive(Debug)]
pub struct EmbeddedStore {
    memory: MemoryStore,
}

impl EmbeddedStore {
    /// File name inside the data directory.
    pub const FILE_NAME: &'static str = "state.json";

    /// Opens (or starts empty) the store of `data_dir`.
    pub fn open(data_dir: &Path) -> Result<EmbeddedStore, StoreError> {
        let path = data_dir.join(Self::FILE_NAME);
        let location = path.display().to_string();
        let (entries, revision) = match std::fs::read(&path) {
            Ok(bytes) => decode_file(&bytes).map_err(|message| StoreError::Corrupt {
                location: location.clone(),
                message,
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                (BTreeMap::new(), Revision(0))
            }
            Err(error) => {
                return Err(StoreError::Unavailable {
                    location,
                    message: error.to_string(),
                })
            }
        };
        let persist = Box::new(move |entries: &BTreeMap<String, Entry>, revision| {
            save(&path, entries, revision).map_err(|error| error.to_string())
        });
        Ok(EmbeddedStore {
            memory: MemoryStore::persistent(entries, revision, persist, location),
        })
    }
}

/// Writes the entries crash-atomically, readable by the owner only (host
/// secrets are part of the desired state).
fn save(path: &Path, entries: &BTreeMap<String, Entry>, revision: Revision) -> std::io::Result<()> {
    let entries: BTreeMap<&str, FileEntry> = entries
        .iter()
        .map(|(key, entry)| {
            let kept = FileEntry {
                value: entry.value.clone(),
                revision: entry.revision,
            };
            (key.as_str(), kept)
        })
        .collect();
    let document =
        serde_json::json!({"version": FILE_VERSION, "revision": revision, "entries": entries});
    let text = serde_json::to_vec_pretty(&document).expect("JSON values serialise");
    crate::durable::write_file(path, &text, 0o600)
}

fn decode_file(bytes: &[u8]) -> Result<(BTreeMap<String, Entry>, Revision), String> {
    let document: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let entry = |key: String, value, revision| {
        let entry = Entry {
            key: key.clone(),
            value,
            revision,
            lease: None,
        };
        (key, entry)
    };
    match document["version"].as_u64() {
        // Format 1: values without revisions; all count as written at 1.
        Some(1) => {
            let values: BTreeMap<String, Value> =
                serde_json::from_value(document["entries"].clone())
                    .map_err(|e| format!("entries: {e}"))?;
            let entries = values
                .into_iter()
                .map(|(key, value)| entry(key, value, Revision(1)))
                .collect();
            Ok((entries, Revision(1)))
        }
        Some(FILE_VERSION) => {
            let revision: Revision = serde_json::from_value(document["revision"].clone())
                .map_err(|e| format!("revision: {e}"))?;
            let kept: BTreeMap<String, FileEntry> =
                serde_json::from_value(document["entries"].clone())
                    .map_err(|e| format!("entries: {e}"))?;
            let entries = kept
                .into_iter()
                .map(|(key, kept)| entry(key, kept.value, kept.revision))
                .collect();
            Ok((entries, revision))
        }
        Some(other) => Err(format!(
            "format version {other} is newer than this weft understands ({FILE_VERSION})"
        )),
        None => Err("no format version".into()),
    }
}

impl Store for EmbeddedStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.memory.get(key)
    }

    fn list(&self, prefix: &str) -> Result<Listing, StoreError> {
        self.memory.list(prefix)
    }

    fn commit(&self, txn: Txn) -> Result<Revision, StoreError> {
        self.memory.commit(txn)
    }

    fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, StoreError> {
        self.memory.grant_lease(ttl)
    }

    fn keep_alive(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.memory.keep_alive(lease)
    }

    fn revoke_lease(&self, lease: LeaseId) -> Result<(), StoreError> {
        self.memory.revoke_lease(lease)
    }

    fn watch(&self, prefix: &str, after: Revision) -> Result<Receiver<WatchEvent>, StoreError> {
        self.memory.watch(prefix, after)
    }

    fn location(&self) -> String {
        self.memory.location()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Change;
    use serde_json::json;
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn put(key: &str, value: Value) -> Txn {
        Txn::raw(vec![], vec![Change::put(key, value)])
    }

    #[test]
    fn commits_are_visible_and_survive_reopening_with_their_revisions() {
        let dir = scratch("reopen");
        let store = EmbeddedStore::open(&dir).unwrap();
        store
            .commit(Txn::raw(
                vec![],
                vec![
                    Change::put("hosts/a", json!({"nqn": "nqn.a"})),
                    Change::put("hosts/b", json!({"nqn": "nqn.b"})),
                    Change::put("pools/x", json!(1)),
                ],
            ))
            .unwrap();
        let last = store
            .commit(Txn::raw(vec![], vec![Change::Delete("hosts/a".into())]))
            .unwrap();
        let lease = store.grant_lease(Duration::from_secs(60)).unwrap();
        store
            .commit(Txn::raw(
                vec![],
                vec![Change::Put {
                    key: "alive".into(),
                    value: json!(1),
                    lease: Some(lease),
                }],
            ))
            .unwrap();
        drop(store);
        let reopened = EmbeddedStore::open(&dir).unwrap();
        let hosts = reopened.list("hosts/").unwrap();
        assert_eq!(hosts.entries.len(), 1);
        assert_eq!(hosts.entries[0].key, "hosts/b");
        assert_eq!(hosts.entries[0].value, json!({"nqn": "nqn.b"}));
        assert_eq!(hosts.revision, last, "leased entries are not kept");
        assert_eq!(reopened.get("pools/x").unwrap().unwrap().value, json!(1));
        assert_eq!(reopened.get("alive").unwrap(), None);
        let next = reopened.commit(put("pools/y", json!(2))).unwrap();
        assert!(next > last, "revisions go on growing after a restart");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("state.json"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "host secrets are in there");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_format_1_file_is_read_and_rewritten_as_format_2() {
        let dir = scratch("migrate");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(EmbeddedStore::FILE_NAME);
        std::fs::write(
            &path,
            br#"{"version": 1, "entries": {"hosts/web1": {"nqn": "nqn.w"}}}"#,
        )
        .unwrap();
        let store = EmbeddedStore::open(&dir).unwrap();
        let web1 = store.get("hosts/web1").unwrap().unwrap();
        assert_eq!(
            (web1.value, web1.revision),
            (json!({"nqn": "nqn.w"}), Revision(1))
        );
        store
            .commit(put("hosts/web2", json!({"nqn": "nqn.v"})))
            .unwrap();
        let document: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(document["version"], 2);
        assert_eq!(document["revision"], 2);
        assert_eq!(document["entries"]["hosts/web1"]["revision"], 1);
        assert_eq!(document["entries"]["hosts/web1"]["value"]["nqn"], "nqn.w");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_failed_commit_changes_nothing() {
        let dir = scratch("failed");
        let store = EmbeddedStore::open(&dir).unwrap();
        store.commit(put("k", json!(1))).unwrap();
        // A directory where the temporary file goes makes the write fail.
        std::fs::create_dir_all(dir.join("state.json.tmp")).unwrap();
        assert!(store.commit(put("k", json!(2))).is_err());
        assert_eq!(store.get("k").unwrap().unwrap().value, json!(1));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_or_newer_files_are_refused_with_a_reason() {
        let dir = scratch("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(EmbeddedStore::FILE_NAME);
        std::fs::write(&path, b"{\"version\": 2, \"entr").unwrap();
        let message = EmbeddedStore::open(&dir).unwrap_err().to_string();
        assert!(message.contains("restore it from a backup"), "{message}");
        std::fs::write(&path, b"{\"version\": 9, \"entries\": {}}").unwrap();
        let message = EmbeddedStore::open(&dir).unwrap_err().to_string();
        assert!(message.contains("version 9 is newer"), "{message}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
