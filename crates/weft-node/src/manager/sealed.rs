//! Host secrets as a cluster's store keeps them: sealed (ChaCha20-Poly1305)
//! with a key derived from the cluster's API token, which every node holds
//! in its token file and the store never sees. Whoever reads etcd reads
//! `sealed-v1:` and hex, not a DH-HMAC-CHAP secret; whoever copies one
//! host's sealed secret to another host's record gets a secret that does
//! not open (the host's name is the seal's associated data).
//!
//! What this does not do: keep a writer of the store from removing or
//! replacing a secret (a new one it sealed itself it cannot make: it lacks
//! the key), or seal a single node's secrets (they stay in its own state
//! file, mode 0600, next to the token that would seal them). A secret
//! stored in the clear by an older build is read as it is, and sealed when
//! the node joins its cluster.

use super::Manager;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::rand::{SecureRandom, SystemRandom};
use weft_control::{HostRecord, StoreError};

/// What a sealed secret starts with (the version of the sealing).
const SEALED: &str = "sealed-v1:";

/// The key that seals host secrets in a cluster's store.
pub(crate) struct Seal {
    key: LessSafeKey,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seal")
    }
}

/// Why a stored secret does not open.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SealError {
    /// Not hex, or too short to hold a nonce and a tag.
    #[error("not a sealed secret")]
    Malformed,
    /// Sealed with another key (another cluster token), for another host, or changed.
    #[error("sealed with another cluster token, for another host, or changed in the store")]
    Unopened,
}

impl Seal {
    /// The seal of the cluster whose API token is `token`.
    pub(crate) fn of_cluster_token(token: &str) -> Seal {
        let salt = Salt::new(HKDF_SHA256, b"weft");
        let mut key = [0u8; 32];
        salt.extract(token.as_bytes())
            .expand(&[b"weft host secrets v1"], &CHACHA20_POLY1305)
            .and_then(|okm| okm.fill(&mut key))
            .expect("32 bytes is ChaCha20-Poly1305's key length");
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key).expect("a 32-byte key");
        Seal {
            key: LessSafeKey::new(unbound),
        }
    }

    /// `secret` of host `host`, sealed.
    pub(crate) fn seal(&self, host: &str, secret: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .expect("the kernel's random source answers");
        let mut sealed = secret.as_bytes().to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(host.as_bytes()),
                &mut sealed,
            )
            .expect("a secret is far shorter than ChaCha20-Poly1305's limit");
        format!(
            "{SEALED}{}{}",
            crate::identity::hex(&nonce),
            crate::identity::hex(&sealed)
        )
    }

    /// Host `host`'s secret as stored: opened if sealed, as it is if an
    /// older build stored it in the clear.
    pub(crate) fn open(&self, host: &str, stored: &str) -> Result<String, SealError> {
        let Some(hex) = stored.strip_prefix(SEALED) else {
            return Ok(stored.to_string());
        };
        let bytes = decode_hex(hex).ok_or(SealError::Malformed)?;
        if bytes.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(SealError::Malformed);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Malformed)?;
        let mut sealed = sealed.to_vec();
        let opened = self
            .key
            .open_in_place(nonce, Aad::from(host.as_bytes()), &mut sealed)
            .map_err(|_| SealError::Unopened)?;
        String::from_utf8(opened.to_vec()).map_err(|_| SealError::Unopened)
    }
}

/// Whether `stored` is sealed (a secret an older build stored is not).
fn is_sealed(stored: &str) -> bool {
    stored.starts_with(SEALED)
}

impl Manager {
    /// Host `name`'s `secret` as the store keeps it: sealed in a cluster.
    pub(super) fn seal_secret(&self, name: &str, secret: &str) -> String {
        match &self.seal {
            Some(seal) if !is_sealed(secret) => seal.seal(name, secret),
            _ => secret.to_string(),
        }
    }

    /// `record` as the store keeps it: its secrets sealed in a cluster.
    pub(super) fn sealed(&self, name: &str, mut record: HostRecord) -> HostRecord {
        for secret in [
            &mut record.dhchap_secret,
            &mut record.dhchap_ctrl_secret,
            &mut record.tls_psk,
        ]
        .into_iter()
        .flatten()
        {
            *secret = self.seal_secret(name, secret);
        }
        record
    }

    /// `record` with its secrets in the clear (one that does not open stays
    /// as stored, and does not parse).
    pub(super) fn opened(&self, name: &str, mut record: HostRecord) -> HostRecord {
        if let Some(seal) = &self.seal {
            for secret in [
                &mut record.dhchap_secret,
                &mut record.dhchap_ctrl_secret,
                &mut record.tls_psk,
            ]
            .into_iter()
            .flatten()
            {
                if let Ok(opened) = seal.open(name, secret) {
                    *secret = opened;
                }
            }
        }
        record
    }

    /// Seals the secrets an older build stored in the clear (when the node
    /// joins its cluster; a record changed meanwhile is read again).
    pub(super) fn seal_stored_secrets(&mut self) -> Result<(), StoreError> {
        if self.seal.is_none() {
            return Ok(());
        }
        for (name, record) in self.desired.hosts()? {
            let in_clear = [
                &record.dhchap_secret,
                &record.dhchap_ctrl_secret,
                &record.tls_psk,
            ]
            .into_iter()
            .flatten()
            .any(|secret| !is_sealed(secret));
            if in_clear {
                let sealed = |found: Option<HostRecord>| found.map(|r| self.sealed(&name, r));
                self.desired.change_host(&name, sealed)?;
                log::info!("host {name}: its secrets are sealed in the store from now on");
            }
        }
        Ok(())
    }
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::claims::tests::{member, scratch};
    use crate::manager::{allowed_host, HostSecrets, SecretChanges};
    use std::sync::Arc;
    use weft_control::{DesiredState, MemoryStore, Store};
    use weft_proto::auth::DhchapSecret;

    const SECRET: &str = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
    const CONTROLLER_SECRET: &str = "DHHC-1:01:MWPqcx1Ug1debg8fPIGpkqbQhLcYUt39k7UWirkblaKEH1kE:";
    const TLS_PSK: &str = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
    const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0badc0de-0000-4000-8000-0000000000a1";

    /// The store's bytes of host `name`'s record.
    fn stored(store: &Arc<dyn Store>, name: &str) -> String {
        store
            .get(&format!("hosts/{name}"))
            .unwrap()
            .unwrap()
            .value
            .to_string()
    }

    /// What a reader of etcd finds is sealed; the node serves the secret
    /// (the host's keys in its export entry); a change keeps the other
    /// secret as it was; a secret an older build stored in the clear is
    /// sealed when a node joins.
    #[test]
    fn a_clusters_host_secrets_are_sealed_in_its_store() {
        let dir = scratch("sealed");
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut n1 = member(&store, "n1", &dir);
        let secrets = HostSecrets {
            host: Some(SECRET.into()),
            controller: None,
            tls_psk: Some(TLS_PSK.into()),
            dh_group: Some("ffdhe3072".into()),
        };
        n1.create_host("web1", NQN.into(), secrets).unwrap();
        let kept = stored(&store, "web1");
        assert!(kept.contains(SEALED) && !kept.contains("DHHC"), "{kept}");
        assert!(!kept.contains("NVMeTLSkey"), "{kept}");
        let record = n1.desired.hosts().unwrap().remove("web1").unwrap();
        let allowed = allowed_host("web1", &record, n1.seal.as_ref()).unwrap();
        assert_eq!(allowed.tls_psk.expect("its PSK").to_string(), TLS_PSK);
        let keys = allowed.keys.expect("its keys");
        assert!(keys.host == DhchapSecret::parse(SECRET).unwrap());
        assert_eq!(keys.dh_group, weft_proto::auth::DhGroup::Ffdhe3072);
        let changes = SecretChanges {
            host: None,
            controller: Some(Some(CONTROLLER_SECRET.into())),
            tls_psk: None,
            dh_group: None,
        };
        n1.set_host_secrets("web1", changes).unwrap();
        let kept = stored(&store, "web1");
        assert!(!kept.contains("DHHC"), "{kept}");
        let record = n1.desired.hosts().unwrap().remove("web1").unwrap();
        let keys = allowed_host("web1", &record, n1.seal.as_ref())
            .unwrap()
            .keys
            .unwrap();
        assert!(
            keys.host == DhchapSecret::parse(SECRET).unwrap(),
            "kept as it was"
        );
        assert!(keys.controller == Some(DhchapSecret::parse(CONTROLLER_SECRET).unwrap()));
        // Another cluster's node (another token) cannot open it: the host stays out.
        assert!(allowed_host(
            "web1",
            &record,
            Some(&Seal::of_cluster_token("other-token-0123456789"))
        )
        .is_none());
        // An older build's record, in the clear: sealed at the next join.
        let old = HostRecord {
            nqn: format!("{NQN}2"),
            dhchap_secret: Some(SECRET.into()),
            dhchap_ctrl_secret: None,
            tls_psk: None,
            dhchap_group: None,
        };
        DesiredState::shared(Arc::clone(&store), "n1")
            .create("hosts/old", &old)
            .unwrap();
        let _n2 = member(&store, "n2", &dir);
        let kept = stored(&store, "old");
        assert!(kept.contains(SEALED) && !kept.contains("DHHC"), "{kept}");
    }

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_for_its_host() {
        let seal = Seal::of_cluster_token("token-of-the-cluster-0123456789");
        let sealed = seal.seal("web1", SECRET);
        assert!(is_sealed(&sealed) && !sealed.contains("DHHC"), "{sealed}");
        assert_ne!(sealed, seal.seal("web1", SECRET), "a fresh nonce each time");
        assert_eq!(seal.open("web1", &sealed).unwrap(), SECRET);
        assert_eq!(
            seal.open("web2", &sealed),
            Err(SealError::Unopened),
            "another host's"
        );
        let other = Seal::of_cluster_token("another-token-0123456789abcdef");
        assert_eq!(other.open("web1", &sealed), Err(SealError::Unopened));
        let mut changed = sealed.clone().into_bytes();
        let last = changed.len() - 1;
        changed[last] = if changed[last] == b'0' { b'1' } else { b'0' };
        let changed = String::from_utf8(changed).unwrap();
        assert_eq!(seal.open("web1", &changed), Err(SealError::Unopened));
        assert_eq!(
            seal.open("web1", "sealed-v1:abc"),
            Err(SealError::Malformed)
        );
        // Stored in the clear by an older build: read as it is.
        assert_eq!(seal.open("web1", SECRET).unwrap(), SECRET);
    }
}
