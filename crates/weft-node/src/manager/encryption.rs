//! The manager's side of encryption at rest: the node's keyring, handed to
//! every pool it opens or creates (which unlocks the encrypted volumes it
//! can), and a pool's rewrap with the keys as the key source gives them now
//! (read by the caller, off the manager's thread), so that rotating a KEK
//! or supplying a missing one needs no restart.
//!
//! What this does not do: encrypt (the data plane does, with each volume's
//! cipher) or keep keys on disk.

use super::{AdminError, Manager, ManagerHandle};
use crate::keys::KeySource;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use weft_volume::compression::Compression;
use weft_volume::crypt::Keyring;
use weft_volume::{FileMedia, Pool};

impl Manager {
    /// Reads the node's key-encryption keys from `source` (at start, before
    /// the manager's thread runs) and unlocks every pool's encrypted volumes
    /// they open (the others stay locked, and are not exported).
    pub fn use_keys(&mut self, source: KeySource) -> Result<(), String> {
        let keyring = Arc::new(source.load()?);
        log::info!(
            "encryption at rest: {} key-encryption key(s) from the {}, current {}",
            keyring.ids().len(),
            source.kind(),
            keyring.ids()[0]
        );
        self.handle.key_source = Some(source);
        self.install_keys(keyring);
        // What was published at open showed them locked.
        self.publish();
        Ok(())
    }

    fn install_keys(&mut self, keyring: Arc<Keyring>) {
        self.keyring = Some(Arc::clone(&keyring));
        self.published.keys.store(true, Ordering::Relaxed);
        for pool in self.pools.values_mut() {
            pool.unlock(Arc::clone(&keyring));
        }
    }

    /// The compression pool `pool`'s record gives its volumes of one copy
    /// by default.
    pub(super) fn pool_compression(&self, pool: &str) -> Result<Compression, AdminError> {
        let name = self
            .desired
            .pools()?
            .get(pool)
            .and_then(|record| record.compression.clone());
        Ok(name.and_then(|n| n.parse().ok()).unwrap_or_default())
    }

    /// Whether `pool` encrypts every volume created in it (its record says).
    pub(super) fn pool_encrypts(&self, pool: &str) -> Result<bool, AdminError> {
        Ok(self
            .desired
            .pools()?
            .get(pool)
            .is_some_and(|record| record.encrypt))
    }

    /// Gives a pool just created or opened the node's keyring.
    pub(super) fn hand_keys(&self, pool: &mut Pool<FileMedia>) {
        if let Some(keyring) = &self.keyring {
            pool.unlock(Arc::clone(keyring));
        }
    }

    /// Takes `keyring` (the key source's keys now) as the node's, unlocking
    /// what it opens on every pool, and wraps every data key of `pool` with
    /// its first KEK.
    pub(super) fn rewrap_pool(
        &mut self,
        pool: &str,
        keyring: Option<Arc<Keyring>>,
    ) -> Result<(), AdminError> {
        self.pool_mut(pool)?;
        let keyring = keyring.ok_or_else(no_key_source)?;
        let current = keyring.ids()[0];
        self.install_keys(keyring);
        let done = self.pool_mut(pool)?.rewrap()?;
        log::info!(
            "pool {pool}: {} data key(s) rewrapped with key-encryption key {current}",
            done.rewrapped.len(),
        );
        for (volume, kek) in &done.locked {
            log::warn!("pool {pool}: volume {volume} stays locked: its key-encryption key {kek} is not in the key source");
        }
        Ok(())
    }
}

impl ManagerHandle {
    /// The key source's keys now, read in the caller's thread.
    pub(super) fn load_keys(&self) -> Result<Arc<Keyring>, AdminError> {
        let source = self.key_source.as_ref().ok_or_else(no_key_source)?;
        source.load().map(Arc::new).map_err(AdminError::Invalid)
    }
}

fn no_key_source() -> AdminError {
    AdminError::Invalid(
        "this node has no key-encryption key: start weft serve with --kek-file PATH or --kek-command CMD".into(),
    )
}
