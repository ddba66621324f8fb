//! Revoking a scoped token alone: the store keeps which generation of each
//! scoped token is valid ([`Generations`], one record for the node or the
//! whole cluster); `weft token renew csi` moves the CSI token to the next
//! generation, after which every node refuses the old one as soon as it
//! reads the record (its local copy of the store: at once on the node
//! that renewed it, within the store's watch lag on the others) and writes
//! the new one beside its admin token.
//!
//! What this does not do: keep or compare tokens (they are derived from the
//! admin token, `token::Credentials`), or revoke the admin token (that is
//! rotated by hand: docs/SECURITY.md).

use crate::token::{Credentials, Generations, Role};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use weft_control::records::{decode, encode};
use weft_control::store::{Store, StoreError, Txn};

/// Key of the scoped tokens' generations.
pub const GENERATIONS_KEY: &str = "api/scoped-token-generations";

/// How often a node looks for a renewed token to write beside its admin
/// token (a read of its local copy of the store).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// Tries of a renewal racing others before it gives up.
const RENEW_TRIES: usize = 8;

/// The generations the store holds (none recorded: every one 0).
pub fn read(store: &dyn Store) -> Result<Generations, StoreError> {
    Ok(store
        .get(GENERATIONS_KEY)?
        .map(|entry| decode(GENERATIONS_KEY, entry.value))
        .transpose()?
        .unwrap_or_default())
}

/// Moves `role`'s token to its next generation (compare-and-swap on the
/// record read); the generations now valid.
pub fn renew(store: &dyn Store, role: Role) -> Result<Generations, StoreError> {
    let mut tries = 0;
    loop {
        let entry = store.get(GENERATIONS_KEY)?;
        let current: Generations = entry
            .as_ref()
            .map(|entry| decode(GENERATIONS_KEY, entry.value.clone()))
            .transpose()?
            .unwrap_or_default();
        let next = current.renewed(role);
        let txn = match &entry {
            None => Txn::new().create(GENERATIONS_KEY, encode(&next)),
            Some(entry) => Txn::new().update(GENERATIONS_KEY, encode(&next), entry.revision),
        };
        match store.commit(txn) {
            Ok(_) => return Ok(next),
            Err(StoreError::Conflict { .. }) if tries + 1 < RENEW_TRIES => tries += 1,
            Err(error) => return Err(error),
        }
    }
}

/// Writes the scoped tokens of admin token `admin` at the store's
/// generations beside `admin_path` now (the files written), then follows
/// the store on a thread of its own, writing them again whenever a token
/// is renewed.
pub fn write_and_follow(
    store: Arc<dyn Store>,
    admin: String,
    admin_path: PathBuf,
) -> Result<Vec<PathBuf>, String> {
    let generations = read(store.as_ref()).map_err(|e| e.to_string())?;
    let paths = write(&admin, generations, &admin_path)?;
    std::thread::Builder::new()
        .name("weft-scoped-tokens".into())
        .spawn(move || follow(store.as_ref(), &admin, &admin_path, generations))
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

fn follow(store: &dyn Store, admin: &str, admin_path: &Path, mut written: Generations) {
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        let Ok(now) = read(store) else {
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

    #[test]
    fn renewals_move_one_role_at_a_time_from_nothing_recorded() {
        let store = MemoryStore::default();
        assert_eq!(read(&store).unwrap(), Generations::default());
        assert_eq!(
            renew(&store, Role::Csi).unwrap(),
            Generations {
                csi: 1,
                read_only: 0
            }
        );
        assert_eq!(
            renew(&store, Role::ReadOnly).unwrap(),
            Generations {
                csi: 1,
                read_only: 1
            }
        );
        assert_eq!(
            renew(&store, Role::Csi).unwrap(),
            Generations {
                csi: 2,
                read_only: 1
            }
        );
        assert_eq!(
            read(&store).unwrap(),
            Generations {
                csi: 2,
                read_only: 1
            }
        );
    }

    #[test]
    fn the_files_follow_a_renewal() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let dir = std::env::temp_dir().join(format!("weft-scoped-follow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let admin_path = dir.join(crate::token::FILE_NAME);
        let admin = "admin-token-0123456789abcdef";
        let paths =
            write_and_follow(Arc::clone(&store), admin.to_string(), admin_path.clone()).unwrap();
        let first = crate::token::read_private(&paths[0]).unwrap();
        renew(store.as_ref(), Role::Csi).unwrap();
        let expected = Credentials::of(
            admin,
            Generations {
                csi: 1,
                read_only: 0,
            },
        );
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
