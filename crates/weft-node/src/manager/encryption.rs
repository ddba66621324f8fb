//! The manager's side of encryption at rest: the node's keyring, handed to
//! every pool it opens or creates (which unlocks the encrypted volumes it
//! can), and a pool's rewrap — the key source read again first, so that
//! rotating a KEK (or supplying a missing one) needs no restart.
//!
//! What this does not do: encrypt (the data plane does, with each volume's
//! cipher) or keep keys on disk.

use super::{AdminError, Manager};
use crate::keys::KeySource;
use std::sync::Arc;
use weft_volume::{FileMedia, Pool};

impl Manager {
    /// Reads the node's key-encryption keys from `source` and unlocks every
    /// pool's encrypted volumes that they open (the others stay locked,
    /// and are not exported).
    pub fn use_keys(&mut self, source: KeySource) -> Result<(), String> {
        let keyring = Arc::new(source.load()?);
        log::info!(
            "encryption at rest: {} key-encryption key(s) from {}, current {}",
            keyring.ids().len(),
            source.describe(),
            keyring.ids()[0]
        );
        self.keys = Some((source, Arc::clone(&keyring)));
        self.published
            .keys
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for pool in self.pools.values_mut() {
            pool.unlock(Arc::clone(&keyring));
        }
        Ok(())
    }

    /// Gives a pool just created or opened the node's keyring.
    pub(super) fn hand_keys(&self, pool: &mut Pool<FileMedia>) {
        if let Some((_, keyring)) = &self.keys {
            pool.unlock(Arc::clone(keyring));
        }
    }

    /// Reads the key source again, unlocks what it now opens on every pool,
    /// and wraps every data key of `pool` with its current KEK.
    pub(super) fn rewrap_pool(&mut self, pool: &str) -> Result<(), AdminError> {
        self.pool_mut(pool)?;
        let Some((source, _)) = &self.keys else {
            return Err(AdminError::Invalid(
                "this node has no key-encryption key: start weft serve with --kek-file PATH or --kek-command CMD".into(),
            ));
        };
        self.use_keys(source.clone()).map_err(AdminError::Invalid)?;
        let current = self.keys.as_ref().map(|(_, keyring)| keyring.ids()[0]);
        let done = self.pool_mut(pool)?.rewrap()?;
        log::info!(
            "pool {pool}: {} data key(s) rewrapped with key-encryption key {}",
            done.rewrapped.len(),
            current.expect("just loaded")
        );
        for (volume, kek) in &done.locked {
            log::warn!("pool {pool}: volume {volume} stays locked: its key-encryption key {kek} is not in the key source");
        }
        Ok(())
    }
}
