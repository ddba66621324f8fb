//! Revoking a scoped token alone: the store keeps which generation of each
//! scoped token is valid ([`Generations`], one record for the node or the
//! whole cluster); `weft token renew csi` moves the CSI token to the next
//! generation, after which every node refuses the old one as soon as it
//! reads the record (its local copy of the store: at once on the node
//! that renewed it, within the store's watch lag on the others) and writes
//! the new one beside its admin token.
//!
//! A node never goes back to an older generation: it keeps the highest it
//! has seen in a file beside its admin token (`api-token.generations`) and
//! takes the greater of that and the store's, so that a writer of etcd who
//! puts an old record back does not bring a revoked token back.
//!
//! What this does not do: keep or compare tokens (they are derived from the
//! admin token, `token::Credentials`), or revoke the admin token (that is
//! rotated by hand: docs/SECURITY.md).

use crate::token::{Credentials, Generations, Role};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use weft_control::records::{decode, encode};
use weft_control::store::{Store, StoreError, Txn};

/// Key of the scoped tokens' generations.
pub const GENERATIONS_KEY: &str = "api/scoped-token-generations";

/// How often a node looks for a renewed token to write beside its admin
/// token (a read of its local copy of the store).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Tries of a renewal racing others before it gives up, and the wait
/// between them (the local copy of the store catching up).
const RENEW_TRIES: usize = 8;
const RENEW_RETRY: Duration = Duration::from_millis(50);

/// Why a scoped token's generation could not be read or moved on.
#[derive(Debug, thiserror::Error)]
pub enum ScopedError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A generation at its largest.
    #[error("{0} is at its last generation: rotate the admin token instead (docs/SECURITY.md)")]
    Exhausted(&'static str),
}

/// A node's view of the scoped tokens' generations: the store's, never
/// below the highest this node has seen.
pub struct ScopedTokens {
    store: Arc<dyn Store>,
    /// The highest seen, and the file that keeps it.
    floor: Mutex<Generations>,
    file: PathBuf,
}

impl ScopedTokens {
    /// Over `store`, with the highest generations seen kept in `file`.
    pub fn new(store: Arc<dyn Store>, file: PathBuf) -> Result<ScopedTokens, String> {
        let floor = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: {e} (the scoped tokens' generations)", file.display()))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Generations::default(),
            Err(error) => return Err(format!("{}: {error}", file.display())),
        };
        Ok(ScopedTokens {
            store,
            floor: Mutex::new(floor),
            file,
        })
    }

    /// The generations valid now: the store's, raised to the highest seen.
    pub fn current(&self) -> Result<Generations, StoreError> {
        let stored = read(self.store.as_ref())?;
        let mut floor = self.floor.lock().expect("not poisoned");
        let now = floor.max(stored);
        if now != *floor {
            *floor = now;
            let text = serde_json::to_vec(&now).expect("serialisable");
            if let Err(error) = weft_control::durable::write_file(&self.file, &text, 0o600) {
                log::warn!("{}: {error}", self.file.display());
            }
        }
        Ok(now)
    }

    /// Moves `role`'s token to its next generation (compare-and-swap on
    /// the record read, from no lower than this node has seen); the
    /// generations now valid.
    pub fn renew(&self, role: Role) -> Result<Generations, ScopedError> {
        let mut tries = 0;
        loop {
            let entry = self.store.get(GENERATIONS_KEY)?;
            let stored: Generations = entry
                .as_ref()
                .map(|entry| decode(GENERATIONS_KEY, entry.value.clone()))
                .transpose()?
                .unwrap_or_default();
            let seen = *self.floor.lock().expect("not poisoned");
            let next = seen
                .max(stored)
                .renewed(role)
                .ok_or(ScopedError::Exhausted(role.describe()))?;
            let txn = match &entry {
                None => Txn::new().create(GENERATIONS_KEY, encode(&next)),
                Some(entry) => Txn::new().update(GENERATIONS_KEY, encode(&next), entry.revision),
            };
            match self.store.commit(txn) {
                Ok(_) => {
                    self.current()?;
                    return Ok(next);
                }
                Err(StoreError::Conflict { .. }) if tries + 1 < RENEW_TRIES => {
                    tries += 1;
                    std::thread::sleep(RENEW_RETRY);
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// The generations the store holds (none recorded: every one 0).
pub fn read(store: &dyn Store) -> Result<Generations, StoreError> {
    Ok(store
        .get(GENERATIONS_KEY)?
        .map(|entry| decode(GENERATIONS_KEY, entry.value))
        .transpose()?
        .unwrap_or_default())
}

/// Writes the scoped tokens of admin token `admin` at the generations
/// valid now beside `admin_path` (the files written), then follows the
/// generations on a thread of its own, writing them again whenever a token
/// is renewed.
pub fn write_and_follow(
    tokens: Arc<ScopedTokens>,
    admin: String,
    admin_path: PathBuf,
) -> Result<Vec<PathBuf>, String> {
    let generations = tokens.current().map_err(|e| e.to_string())?;
    let paths = write(&admin, generations, &admin_path)?;
    std::thread::Builder::new()
        .name("weft-scoped-tokens".into())
        .spawn(move || follow(&tokens, &admin, &admin_path, generations))
        .map_err(|e| e.to_string())?;
    Ok(paths)
}

fn write(admin: &str, generations: Generations, admin_path: &Path) -> Result<Vec<PathBuf>, String> {
    Credentials::of(admin, generations)
        .write_scoped(admin_path)
        .map_err(|e| {
            format!(
                "writing the scoped tokens beside {}: {e}",
                admin_path.display()
            )
        })
}

fn follow(tokens: &ScopedTokens, admin: &str, admin_path: &Path, mut written: Generations) {
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        let Ok(now) = tokens.current() else {
            continue;
        };
        if now == written {
            continue;
        }
        match write(admin, now, admin_path) {
            Ok(paths) => {
                for (role, path) in [(Role::Csi, &paths[0]), (Role::ReadOnly, &paths[1])] {
                    if now.of(role) != written.of(role) {
                        log::info!(
                            "{} renewed (generation {}): the old one is refused; the new one is in {}",
                            role.describe(),
                            now.of(role),
                            path.display()
                        );
                    }
                }
                written = now;
            }
            Err(error) => log::warn!("{error}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_control::MemoryStore;

    fn generations(csi: u64, read_only: u64) -> Generations {
        Generations { csi, read_only }
    }

    /// A fresh directory for one test.
    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weft-scoped-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn renewals_move_one_role_at_a_time_from_nothing_recorded() {
        let dir = dir("renew");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let tokens = ScopedTokens::new(Arc::clone(&store), dir.join("g")).unwrap();
        assert_eq!(tokens.current().unwrap(), Generations::default());
        assert_eq!(tokens.renew(Role::Csi).unwrap(), generations(1, 0));
        assert_eq!(tokens.renew(Role::ReadOnly).unwrap(), generations(1, 1));
        assert_eq!(tokens.renew(Role::Csi).unwrap(), generations(2, 1));
        assert_eq!(read(store.as_ref()).unwrap(), generations(2, 1));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A writer of the store puts an old record back: the node keeps the
    /// generations it saw, across a restart, and renews from them.
    #[test]
    fn an_old_record_put_back_brings_no_revoked_token_back() {
        let dir = dir("rollback");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let tokens = ScopedTokens::new(Arc::clone(&store), dir.join("g")).unwrap();
        tokens.renew(Role::Csi).unwrap();
        tokens.renew(Role::Csi).unwrap();
        let entry = store.get(GENERATIONS_KEY).unwrap().unwrap();
        store
            .commit(Txn::new().update(GENERATIONS_KEY, encode(&generations(0, 0)), entry.revision))
            .unwrap();
        assert_eq!(tokens.current().unwrap(), generations(2, 0));
        let restarted = ScopedTokens::new(Arc::clone(&store), dir.join("g")).unwrap();
        assert_eq!(restarted.current().unwrap(), generations(2, 0));
        assert_eq!(restarted.renew(Role::Csi).unwrap(), generations(3, 0));
        // The last generation is said, not wrapped to the first.
        let entry = store.get(GENERATIONS_KEY).unwrap().unwrap();
        store
            .commit(Txn::new().update(
                GENERATIONS_KEY,
                encode(&generations(u64::MAX, 0)),
                entry.revision,
            ))
            .unwrap();
        assert!(matches!(
            restarted.renew(Role::Csi),
            Err(ScopedError::Exhausted(_))
        ));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_files_follow_a_renewal() {
        let dir = dir("follow");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let tokens = Arc::new(ScopedTokens::new(store, dir.join("g")).unwrap());
        let admin_path = dir.join(crate::token::FILE_NAME);
        let admin = "admin-token-0123456789abcdef";
        let paths =
            write_and_follow(Arc::clone(&tokens), admin.to_string(), admin_path.clone()).unwrap();
        let first = crate::token::read_private(&paths[0]).unwrap();
        tokens.renew(Role::Csi).unwrap();
        let expected = Credentials::of(admin, generations(1, 0));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while crate::token::read_private(&paths[0]).unwrap() == first {
            assert!(std::time::Instant::now() < deadline, "not followed");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            crate::token::read_private(&paths[0]).unwrap(),
            expected.token_of(Role::Csi)
        );
        assert_eq!(
            crate::token::read_private(&paths[1]).unwrap(),
            expected.token_of(Role::ReadOnly)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
