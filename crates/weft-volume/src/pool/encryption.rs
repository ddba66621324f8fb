//! Encrypted volumes on a pool (see [`crate::crypt`]): each has a random
//! data key, stored only wrapped by a key-encryption key of the node's
//! keyring (a `SetVolumeKey` record committed with the volume). The pool
//! keeps each unlocked volume's cipher for the data plane; a volume whose
//! key no KEK here unwraps stays *locked*: listed, never readable.
//!
//! Deleting an encrypted volume destroys its key (crypto-erase): once the
//! delete commits, both checkpoint slots are rewritten whole and the
//! journal zeroed, so no earlier copy of the wrapped key stays on the
//! devices. Rewrapping (KEK rotation) does the same after it commits, so
//! the old KEK opens nothing left behind. A clone shares its source's
//! key, which lives as long as one of them does.
//!
//! What this does not do: read data (the data plane does, with
//! [`Pool::cipher`]), or find KEKs (the node hands a [`Keyring`] over).

use super::Pool;
use crate::crypt::{DataKey, KeyError, KeyId, Keyring, VolumeCipher};
use crate::media::Media;
use crate::state::Record;
use crate::VolumeError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Whether and how a volume is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encryption {
    /// The KEK its data key is wrapped with.
    pub kek_id: KeyId,
    /// Whether this node holds that KEK (else the volume is locked).
    pub unlocked: bool,
}

/// What a rewrap did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rewrapped {
    /// Volumes whose key is now wrapped by the current KEK.
    pub rewrapped: Vec<String>,
    /// Volumes left as they were: locked (no KEK here unwraps them).
    pub locked: Vec<(String, KeyId)>,
}

impl<M: Media> Pool<M> {
    /// Gives the pool the node's keyring and unlocks every encrypted volume
    /// a KEK in it unwraps; returns the volumes that stay locked and why.
    pub fn unlock(&mut self, keyring: Arc<Keyring>) -> Vec<(String, KeyError)> {
        self.keyring = Some(keyring);
        self.unlock_volumes()
    }

    /// Rebuilds every cipher from the state (after open, reload or unlock).
    pub(super) fn unlock_volumes(&mut self) -> Vec<(String, KeyError)> {
        let mut ciphers = BTreeMap::new();
        let mut locked = Vec::new();
        for volume in self.state.volumes.values() {
            let Some(wrapped) = &volume.key else { continue };
            let unwrapped = match &self.keyring {
                Some(keyring) => keyring.unwrap(wrapped, &self.superblock.pool_uuid),
                None => Err(KeyError::Missing {
                    id: wrapped.kek_id(),
                }),
            };
            match unwrapped {
                Ok(key) => {
                    let cipher = VolumeCipher::new(&key, volume.block_size, wrapped.kek_id());
                    ciphers.insert(volume.name.clone(), Arc::new(cipher));
                }
                Err(error) => locked.push((volume.name.clone(), error)),
            }
        }
        for (volume, error) in &locked {
            log::warn!(
                "pool {}: volume {volume} stays locked: {error}",
                self.name()
            );
        }
        self.ciphers = ciphers;
        locked
    }

    /// The cipher of `name`: none if it is not encrypted, an error if it is
    /// locked.
    pub fn cipher(&self, name: &str) -> Result<Option<Arc<VolumeCipher>>, VolumeError> {
        let volume = self.existing(name)?;
        let Some(wrapped) = &volume.key else {
            return Ok(None);
        };
        match self.ciphers.get(name) {
            Some(cipher) => Ok(Some(Arc::clone(cipher))),
            None => Err(VolumeError::Locked {
                volume: name.to_string(),
                source: self.lock_reason(wrapped),
            }),
        }
    }

    fn lock_reason(&self, wrapped: &crate::crypt::WrappedKey) -> KeyError {
        match &self.keyring {
            Some(keyring) => keyring
                .unwrap(wrapped, &self.superblock.pool_uuid)
                .err()
                .unwrap_or(KeyError::Missing {
                    id: wrapped.kek_id(),
                }),
            None => KeyError::Missing {
                id: wrapped.kek_id(),
            },
        }
    }

    /// Whether `name` is encrypted, and unlocked.
    pub(super) fn encryption(&self, name: &str) -> Option<Encryption> {
        let wrapped = self.state.volumes.get(name)?.key.as_ref()?;
        Some(Encryption {
            kek_id: wrapped.kek_id(),
            unlocked: self.ciphers.contains_key(name),
        })
    }

    /// Stages a fresh key for the new volume `name` (its `CreateVolume`
    /// staged just before); the cipher is kept once the commit succeeds.
    pub(super) fn stage_new_key(
        &mut self,
        name: &str,
        block_size: u32,
    ) -> Result<Arc<VolumeCipher>, VolumeError> {
        let keyring = self
            .keyring
            .clone()
            .filter(|keyring| keyring.current().is_some())
            .ok_or_else(|| VolumeError::NoKeyring {
                volume: name.to_string(),
            })?;
        let kek = keyring.current().expect("checked");
        let locked = |source| VolumeError::Locked {
            volume: name.to_string(),
            source,
        };
        let key = DataKey::generate().map_err(locked)?;
        let wrapped = kek.wrap(&key, &self.superblock.pool_uuid).map_err(locked)?;
        self.stage(Record::SetVolumeKey {
            volume: name.to_string(),
            key: wrapped,
        });
        Ok(Arc::new(VolumeCipher::new(&key, block_size, kek.id())))
    }

    /// Checks, before staging anything, that a new encrypted volume can be
    /// keyed here.
    pub(super) fn check_keyring(&self, name: &str) -> Result<(), VolumeError> {
        match self.keyring.as_ref().and_then(|k| k.current()) {
            Some(_) => Ok(()),
            None => Err(VolumeError::NoKeyring {
                volume: name.to_string(),
            }),
        }
    }

    /// Wraps every volume key not wrapped by the keyring's current KEK with
    /// it (KEK rotation: no data is rewritten), then scrubs the old
    /// wrappings off the devices. Locked volumes are left as they are.
    pub fn rewrap(&mut self) -> Result<Rewrapped, VolumeError> {
        self.check_usable()?;
        let Some(keyring) = self.keyring.clone() else {
            return Err(VolumeError::invalid(
                "rewrap",
                "this node has no key-encryption key: start weft serve with --kek-file or --kek-command",
            ));
        };
        let current = keyring.current().expect("a parsed keyring holds a key");
        let uuid = self.superblock.pool_uuid;
        let mut done = Rewrapped::default();
        let keyed: Vec<_> = self
            .state
            .volumes
            .values()
            .filter_map(|v| Some((v.name.clone(), v.key.clone()?)))
            .filter(|(_, wrapped)| wrapped.kek_id() != current.id())
            .collect();
        for (name, wrapped) in keyed {
            let Ok(key) = keyring.unwrap(&wrapped, &uuid) else {
                done.locked.push((name, wrapped.kek_id()));
                continue;
            };
            let rewrapped = current
                .wrap(&key, &uuid)
                .map_err(|source| VolumeError::Locked {
                    volume: name.clone(),
                    source,
                })?;
            self.stage(Record::SetVolumeKey {
                volume: name.clone(),
                key: rewrapped,
            });
            done.rewrapped.push(name);
        }
        if !done.rewrapped.is_empty() {
            self.commit()?;
            self.scrub_metadata()?;
            self.unlock_volumes();
        }
        Ok(done)
    }

    /// Leaves no metadata older than the committed state on the devices:
    /// the state written whole into both checkpoint slots (each slot's
    /// tail zeroed), then the journal zeroed. Crash-safe: every step leaves
    /// a checkpoint of the committed state.
    pub(super) fn scrub_metadata(&mut self) -> Result<(), VolumeError> {
        self.commit()?;
        let scrubbed = (|| {
            for _slot in 0..2 {
                self.sequence += 1;
                self.write_checkpoint(true)?;
            }
            let (at, len) = (self.layout().journal_offset(), self.layout().journal_bytes);
            for member in 0..self.layout().metadata_copies() {
                self.media.zero(member, at, len)?;
                self.media.sync(member)?;
            }
            Ok(())
        })();
        scrubbed.map_err(|error: std::io::Error| {
            let reason = format!("erasing old metadata: {error}");
            log::error!("pool {}: {reason}", self.name());
            self.failed = Some(reason);
            self.failed_error()
        })
    }
}
