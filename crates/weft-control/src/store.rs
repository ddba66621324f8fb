//! The [`Store`] trait: a small transactional key-value map of JSON values,
//! the subset of etcd the node needs (get, list by prefix, an atomic batch
//! of puts and deletes). Keys are `/`-separated paths; node-local records
//! live under `nodes/<node id>/`, so that a cluster store can hold every
//! node's records side by side.
//!
//! [`EmbeddedStore`] keeps the whole map in one JSON file under the data
//! directory, rewritten crash-atomically on every commit (temporary file,
//! fsync, rename, fsync of the directory): after a crash the file holds
//! either the old or the new map, never a mix. The map is small (records
//! of hosts, pools and volumes), so rewriting it whole is cheap.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One change of a commit.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Set `key` to the value.
    Put(String, Value),
    /// Remove `key` (no error if absent).
    Delete(String),
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backing file or service failed.
    #[error("state store {location}: {message}")]
    Unavailable {
        /// File or endpoint.
        location: String,
        /// What failed.
        message: String,
    },
    /// What the store holds cannot be read.
    #[error("state store {location}: {message}; restore it from a backup or fix it by hand")]
    Corrupt {
        /// File or endpoint.
        location: String,
        /// What is wrong.
        message: String,
    },
}

/// Desired state storage. Every commit is atomic and durable when it returns.
pub trait Store: Send {
    /// The value at `key`.
    fn get(&self, key: &str) -> Result<Option<Value>, StoreError>;
    /// Every key starting with `prefix`, with its value, in key order.
    fn list(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError>;
    /// Applies `changes` all or none.
    fn commit(&mut self, changes: Vec<Change>) -> Result<(), StoreError>;
}

/// A store that lives in memory only (tests, and the in-memory model).
#[derive(Debug, Default, Clone)]
pub struct MemoryStore {
    entries: BTreeMap<String, Value>,
}

impl MemoryStore {
    fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Put(key, value) => {
                    self.entries.insert(key, value);
                }
                Change::Delete(key) => {
                    self.entries.remove(&key);
                }
            }
        }
    }
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        Ok(self.entries.get(key).cloned())
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        Ok(self
            .entries
            .range(prefix.to_string()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect())
    }

    fn commit(&mut self, changes: Vec<Change>) -> Result<(), StoreError> {
        self.apply(changes);
        Ok(())
    }
}

/// The single-node store: a JSON file, `<data dir>/state.json`.
#[derive(Debug)]
pub struct EmbeddedStore {
    path: PathBuf,
    memory: MemoryStore,
}

/// Format version of the embedded store's file.
const FILE_VERSION: u64 = 1;

impl EmbeddedStore {
    /// File name inside the data directory.
    pub const FILE_NAME: &'static str = "state.json";

    /// Opens (or starts empty) the store of `data_dir`.
    pub fn open(data_dir: &Path) -> Result<EmbeddedStore, StoreError> {
        let path = data_dir.join(Self::FILE_NAME);
        let location = path.display().to_string();
        let entries = match std::fs::read(&path) {
            Ok(bytes) => decode_file(&bytes).map_err(|message| StoreError::Corrupt {
                location: location.clone(),
                message,
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(error) => {
                return Err(StoreError::Unavailable {
                    location,
                    message: error.to_string(),
                })
            }
        };
        Ok(EmbeddedStore {
            path,
            memory: MemoryStore { entries },
        })
    }

    /// Writes `entries` crash-atomically, readable by the owner only (host
    /// secrets are part of the desired state).
    fn save(&self, entries: &BTreeMap<String, Value>) -> std::io::Result<()> {
        let document = serde_json::json!({"version": FILE_VERSION, "entries": entries});
        let text = serde_json::to_vec_pretty(&document).expect("JSON values serialise");
        crate::durable::write_file(&self.path, &text, 0o600)
    }
}

fn decode_file(bytes: &[u8]) -> Result<BTreeMap<String, Value>, String> {
    let document: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    match document["version"].as_u64() {
        Some(FILE_VERSION) => {}
        Some(other) => {
            return Err(format!(
                "format version {other} is newer than this weft understands ({FILE_VERSION})"
            ))
        }
        None => return Err("no format version".into()),
    }
    serde_json::from_value(document["entries"].clone()).map_err(|e| format!("entries: {e}"))
}

impl Store for EmbeddedStore {
    fn get(&self, key: &str) -> Result<Option<Value>, StoreError> {
        self.memory.get(key)
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Value)>, StoreError> {
        self.memory.list(prefix)
    }

    fn commit(&mut self, changes: Vec<Change>) -> Result<(), StoreError> {
        let mut next = self.memory.clone();
        next.apply(changes);
        self.save(&next.entries)
            .map_err(|error| StoreError::Unavailable {
                location: self.path.display().to_string(),
                message: error.to_string(),
            })?;
        self.memory = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn commits_are_visible_and_survive_reopening() {
        let dir = scratch("reopen");
        let mut store = EmbeddedStore::open(&dir).unwrap();
        store
            .commit(vec![
                Change::Put("hosts/a".into(), json!({"nqn": "nqn.a"})),
                Change::Put("hosts/b".into(), json!({"nqn": "nqn.b"})),
                Change::Put("pools/x".into(), json!(1)),
            ])
            .unwrap();
        store
            .commit(vec![Change::Delete("hosts/a".into())])
            .unwrap();
        let reopened = EmbeddedStore::open(&dir).unwrap();
        let hosts = reopened.list("hosts/").unwrap();
        assert_eq!(
            hosts,
            vec![("hosts/b".to_string(), json!({"nqn": "nqn.b"}))]
        );
        assert_eq!(reopened.get("pools/x").unwrap(), Some(json!(1)));
        assert_eq!(reopened.get("pools/y").unwrap(), None);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.join("state.json"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "host secrets are in there");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_failed_commit_changes_nothing() {
        let dir = scratch("failed");
        let mut store = EmbeddedStore::open(&dir).unwrap();
        store
            .commit(vec![Change::Put("k".into(), json!(1))])
            .unwrap();
        // A directory where the temporary file goes makes the write fail.
        std::fs::create_dir_all(dir.join("state.json.tmp")).unwrap();
        assert!(store
            .commit(vec![Change::Put("k".into(), json!(2))])
            .is_err());
        assert_eq!(store.get("k").unwrap(), Some(json!(1)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn damaged_or_newer_files_are_refused_with_a_reason() {
        let dir = scratch("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(EmbeddedStore::FILE_NAME);
        std::fs::write(&path, b"{\"version\": 1, \"entr").unwrap();
        let message = EmbeddedStore::open(&dir).unwrap_err().to_string();
        assert!(message.contains("restore it from a backup"), "{message}");
        std::fs::write(&path, b"{\"version\": 9, \"entries\": {}}").unwrap();
        let message = EmbeddedStore::open(&dir).unwrap_err().to_string();
        assert!(message.contains("version 9 is newer"), "{message}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
