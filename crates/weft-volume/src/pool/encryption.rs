//! Encrypted volumes on a pool (see [`crate::crypt`]): each has a random
//! data key, stored only wrapped by a key-encryption key of the node's
//! keyring (a `SetVolumeKey` record committed with the volume). The pool
//! keeps each unlocked volume's cipher for the data plane; a volume whose
//! key no KEK here unwraps stays *locked*: listed, never readable.
//!
//! Deleting an encrypted volume destroys its key (crypto-erase): once the
//! delete commits, both checkpoint slots are rewritten whole and the
//! journal overwritten with zeroes, so no earlier copy of the wrapped key
//! stays in the pool's metadata. Rewrapping (KEK rotation) does the same
//! after it commits, so the old KEK opens nothing left behind. The commit
//! itself records that a scrub is owed, so a crash or failure before it
//! finished is made good at the next open. A clone shares its source's
//! key, which lives as long as one of them does. (What a flash device
//! keeps of overwritten blocks internally is beyond any software's reach:
//! the wrapped key is useless without the KEK, which weft never stores.)
//!
//! What this does not do: read data (the data plane does, with
//! [`Pool::cipher`]), or find KEKs (the node hands a [`Keyring`] over).

use super::Pool;
use crate::crypt::{DataKey, KeyError, KeyId, Keyring, VolumeCipher, WrappedKey};
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
    /// A volume unlocked before stays so (its key is in memory) even if
    /// this keyring lacks its KEK: a rewrap then wraps it anew.
    pub fn unlock(&mut self, keyring: Arc<Keyring>) -> Vec<(String, KeyError)> {
        self.keyring = Some(keyring);
        self.unlock_volumes()
    }

    /// Unlocks every encrypted volume not unlocked yet that the keyring
    /// opens (after open, reload or unlock); drops the ciphers of volumes
    /// gone.
    pub(super) fn unlock_volumes(&mut self) -> Vec<(String, KeyError)> {
        let mut ciphers = BTreeMap::new();
        let mut locked = Vec::new();
        for volume in self.state.volumes.values() {
            let Some(wrapped) = &volume.key else { continue };
            if let Some(cipher) = self.ciphers.get(&volume.id) {
                ciphers.insert(volume.id, Arc::clone(cipher));
                continue;
            }
            let unwrapped = match &self.keyring {
                Some(keyring) => keyring.unwrap(wrapped, &self.superblock.pool_uuid),
                None => Err(KeyError::Missing {
                    id: wrapped.kek_id(),
                }),
            };
            match unwrapped {
                Ok(key) => {
                    let cipher = VolumeCipher::new(&key, volume.block_size);
                    ciphers.insert(volume.id, Arc::new(cipher));
                }
                Err(error) => locked.push((volume.name.clone(), error)),
            }
        }
        if self.keyring.is_some() {
            for (volume, error) in &locked {
                log::warn!(
                    "pool {}: volume {volume} stays locked: {error}",
                    self.name()
                );
            }
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
        match self.ciphers.get(&volume.id) {
            Some(cipher) => Ok(Some(Arc::clone(cipher))),
            None => Err(VolumeError::Locked {
                volume: name.to_string(),
                source: self.lock_reason(wrapped),
            }),
        }
    }

    fn lock_reason(&self, wrapped: &WrappedKey) -> KeyError {
        let missing = KeyError::Missing {
            id: wrapped.kek_id(),
        };
        match &self.keyring {
            Some(keyring) => keyring
                .unwrap(wrapped, &self.superblock.pool_uuid)
                .err()
                .unwrap_or(missing),
            None => missing,
        }
    }

    /// Whether `name` is encrypted, and unlocked.
    pub(super) fn encryption(&self, name: &str) -> Option<Encryption> {
        let volume = self.state.volumes.get(name)?;
        let wrapped = volume.key.as_ref()?;
        Some(Encryption {
            kek_id: wrapped.kek_id(),
            unlocked: self.ciphers.contains_key(&volume.id),
        })
    }

    /// A fresh data key for a new volume, wrapped by the current KEK (for
    /// its `CreateVolume` record), and its cipher.
    pub(super) fn new_volume_key(
        &self,
        name: &str,
        block_size: u32,
    ) -> Result<(WrappedKey, Arc<VolumeCipher>), VolumeError> {
        let no_keyring = || VolumeError::NoKeyring {
            volume: name.to_string(),
        };
        let keyring = self.keyring.as_ref().ok_or_else(no_keyring)?;
        let kek = keyring.current().ok_or_else(no_keyring)?;
        let locked = |source| VolumeError::Locked {
            volume: name.to_string(),
            source,
        };
        let key = DataKey::generate().map_err(locked)?;
        let wrapped = kek.wrap(&key, &self.superblock.pool_uuid).map_err(locked)?;
        let cipher = VolumeCipher::new(&key, block_size);
        Ok((wrapped, Arc::new(cipher)))
    }

    /// Records the cipher of a volume just created or cloned (by id: a
    /// name may be reused, an id never).
    pub(super) fn keep_cipher(&mut self, name: &str, cipher: Option<Arc<VolumeCipher>>) {
        let Some(id) = self.state.volumes.get(name).map(|v| v.id) else {
            return;
        };
        match cipher {
            Some(cipher) => self.ciphers.insert(id, cipher),
            None => self.ciphers.remove(&id),
        };
    }

    /// Wraps every volume key not wrapped by the keyring's current KEK with
    /// it (KEK rotation: no data is rewritten), then scrubs the old
    /// wrappings off the devices. A volume whose KEK the keyring lacks is
    /// rewrapped from its key in memory if it is unlocked, else left locked.
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
            .filter_map(|v| Some((v.name.clone(), v.id, v.key.clone()?)))
            .filter(|(_, _, wrapped)| wrapped.kek_id() != current.id())
            .collect();
        for (name, id, wrapped) in keyed {
            let key = match keyring.unwrap(&wrapped, &uuid) {
                Ok(key) => key,
                Err(_) => match self.ciphers.get(&id) {
                    Some(cipher) => cipher.data_key().clone(),
                    None => {
                        done.locked.push((name, wrapped.kek_id()));
                        continue;
                    }
                },
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
        self.commit()?;
        self.scrub_if_owed()?;
        Ok(done)
    }

    /// Scrubs the metadata if a committed change left an old wrapped key in
    /// it (see [`Pool::scrub_metadata`]).
    pub(super) fn scrub_if_owed(&mut self) -> Result<(), VolumeError> {
        match self.state.scrub_owed {
            true => self.scrub_metadata(),
            false => Ok(()),
        }
    }

    /// Leaves no metadata older than the committed state on the devices:
    /// the state written whole into both checkpoint slots (each slot's
    /// tail and extents overwritten with zeroes), the journal overwritten with zeroes,
    /// and only then a third checkpoint saying the scrub is done. A crash
    /// at any step opens to a checkpoint of the committed state, still
    /// owing the scrub until the last step.
    fn scrub_metadata(&mut self) -> Result<(), VolumeError> {
        self.commit()?;
        let scrubbed = (|| {
            for _slot in 0..2 {
                self.sequence += 1;
                self.write_checkpoint(true)?;
            }
            let (at, len) = (self.layout().journal_offset(), self.layout().journal_bytes);
            for member in 0..self.layout().metadata_copies() {
                super::write_zeroes(&mut self.media, member, at, len)?;
                self.media.sync(member)?;
            }
            self.state.scrub_owed = false;
            self.sequence += 1;
            self.write_checkpoint(true)
        })();
        scrubbed.map_err(|error: std::io::Error| {
            let reason = format!("erasing old metadata: {error}");
            log::error!("pool {}: {reason}", self.name());
            self.failed = Some(reason);
            self.failed_error()
        })
    }
}
