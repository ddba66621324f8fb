//! The DH-HMAC-CHAP secrets of replication links: with which a node
//! connects to another node's replica subsystems (as
//! `nqn.2026-11.io.weft:node:NODE`), and which its own replica subsystems
//! let in, both ways (each end proves itself to the other).
//!
//! In a cluster with certificates (`weft serve --pki`), the secrets of the
//! link from node A to node B derive from the secret A and B share (the
//! ECDH agreement of one's certificate key with the other's, see
//! [`PairSecrets`]): nobody else can compute them, not a holder of the
//! cluster's API token, not a writer of the store (which only carries the
//! certificates, each checked against the cluster CA). So does a TLS PSK:
//! such a link runs in an NVMe/TCP TLS 1.3 stream (encrypted, and the
//! replica subsystem refuses the node in the clear). Without
//! certificates, every link's secrets derive from the cluster's API token,
//! which every node holds: whoever holds it can connect as any node.
//!
//! What it does not do: fetch certificates (the member records carry them,
//! as hex DER) or check what a link does once connected (fences are the
//! replica's: `weft_proto::fence`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use weft_proto::auth::{DhGroup, DhchapSecret, HostKeys};
use weft_proto::tls::psk::ConfiguredPsk;

/// A node's half of the secrets it shares with each other node.
pub trait PairSecrets: Send + Sync + std::fmt::Debug {
    /// This node's certificate (DER), as its member record publishes it.
    fn own_certificate(&self) -> Vec<u8>;

    /// The secret shared with node `node`, whose certificate is
    /// `certificate` (DER): an error if it is not the cluster CA's
    /// certificate of that node.
    fn shared_with(&self, node: &str, certificate: &[u8]) -> Result<[u8; 32], String>;
}

/// Where the secrets of replication links come from.
#[derive(Debug, Clone)]
pub enum LinkKeys {
    /// The cluster's API token: the same secrets for every link.
    Token(Arc<HostKeys>),
    /// The two nodes' certificates.
    Certificates(Arc<CertificateKeys>),
}

/// Secrets from the nodes' certificates, with what was agreed per node.
#[derive(Debug)]
pub struct CertificateKeys {
    secrets: Arc<dyn PairSecrets>,
    /// Per node: the certificate (hex) and what it gave. One entry per
    /// node of the cluster; a new certificate replaces its node's.
    agreed: Mutex<HashMap<String, Agreed>>,
}

/// A node's certificate (hex DER) and the secret agreed with it (or why none).
type Agreed = (String, Result<[u8; 32], String>);

impl LinkKeys {
    /// Every link's secrets from the cluster's API token.
    pub fn of_token(cluster_token: &str) -> LinkKeys {
        LinkKeys::Token(Arc::new(token_keys(cluster_token)))
    }

    /// Each link's secrets from its two nodes' certificates.
    pub fn of_certificates(secrets: Arc<dyn PairSecrets>) -> LinkKeys {
        LinkKeys::Certificates(Arc::new(CertificateKeys {
            secrets,
            agreed: Mutex::default(),
        }))
    }

    /// This node's certificate (hex DER), if links use certificates.
    pub fn own_certificate(&self) -> Option<String> {
        match self {
            LinkKeys::Token(_) => None,
            LinkKeys::Certificates(keys) => {
                Some(crate::identity::hex(&keys.secrets.own_certificate()))
            }
        }
    }

    /// The secrets with which node `host` connects to node `replica`'s
    /// replica subsystems (the same at both ends). `other` is the node at
    /// the other end from this one (`replica` when this node is `host`,
    /// else `host`), as its member record shows it.
    pub fn between(
        &self,
        host: &str,
        replica: &str,
        other: &Peer,
    ) -> Result<LinkCredentials, String> {
        debug_assert!(other.name == host || other.name == replica);
        let keys = match self {
            LinkKeys::Token(keys) => {
                return Ok(LinkCredentials {
                    dhchap: HostKeys::clone(keys),
                    tls_psk: None,
                })
            }
            LinkKeys::Certificates(keys) => keys,
        };
        let shared = keys.agreed(other)?;
        let label = |end: &str| format!("weft replica link: {host} to {replica}: {end}");
        let derive = |end: &str| DhchapSecret::derived(&shared, &label(end));
        let tls_key = hmac_sha256(&shared, label("tls").as_bytes());
        Ok(LinkCredentials {
            dhchap: HostKeys {
                host: derive("host"),
                controller: Some(derive("replica")),
                dh_group: DhGroup::Null,
            },
            tls_psk: Some(ConfiguredPsk::from_key(tls_key)),
        })
    }
}

/// What one link authenticates (and encrypts) with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkCredentials {
    /// Its DH-HMAC-CHAP secrets, both ways.
    pub dhchap: HostKeys,
    /// Its TLS PSK, when the link runs in a TLS stream (nodes with certificates).
    pub tls_psk: Option<ConfiguredPsk>,
}

/// HMAC-SHA-256 of `message` under `key`.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, message)
        .as_ref()
        .try_into()
        .expect("32 bytes")
}

/// The secrets of every link in a cluster without certificates: derived
/// from the cluster's API token, which every node holds.
pub fn token_keys(cluster_token: &str) -> HostKeys {
    HostKeys {
        host: DhchapSecret::derived(cluster_token.as_bytes(), "weft replica: node"),
        controller: Some(DhchapSecret::derived(
            cluster_token.as_bytes(),
            "weft replica: replica",
        )),
        dh_group: DhGroup::Null,
    }
}

/// Another node of the cluster, as its member record shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its name.
    pub name: String,
    /// Its certificate (hex DER), if it published one.
    pub certificate: Option<String>,
}

impl CertificateKeys {
    /// The secret shared with `other`, agreed once per certificate; an
    /// error (logged once) if it published none or not the cluster CA's.
    fn agreed(&self, other: &Peer) -> Result<[u8; 32], String> {
        let Some(certificate) = &other.certificate else {
            return Err(format!(
                "node {} published no certificate (started without --pki?), so no link with it can be authenticated",
                other.name
            ));
        };
        let mut agreed = self.agreed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((known, result)) = agreed.get(&other.name) {
            if known == certificate {
                return result.clone();
            }
        }
        let result = crate::identity::parse_hex(certificate)
            .ok_or_else(|| "its certificate is not hex".to_string())
            .and_then(|der| self.secrets.shared_with(&other.name, &der))
            .map_err(|e| format!("node {}: {e}", other.name));
        if let Err(error) = &result {
            log::warn!("replication links with {error}");
        }
        agreed.insert(other.name.clone(), (certificate.clone(), result.clone()));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node whose "agreement" is the XOR of the two names (at most 32
    /// bytes): symmetric, as ECDH is, and different for every pair.
    #[derive(Debug)]
    struct Named(&'static str);

    impl PairSecrets for Named {
        fn own_certificate(&self) -> Vec<u8> {
            self.0.as_bytes().to_vec()
        }

        fn shared_with(&self, node: &str, certificate: &[u8]) -> Result<[u8; 32], String> {
            if certificate != node.as_bytes() {
                return Err(format!("not {node}'s certificate"));
            }
            let mut shared = [0u8; 32];
            for (i, byte) in self.0.bytes().enumerate() {
                shared[i] ^= byte;
            }
            for (i, byte) in node.bytes().enumerate() {
                shared[i] ^= byte;
            }
            Ok(shared)
        }
    }

    fn peer(name: &str) -> Peer {
        Peer {
            name: name.into(),
            certificate: Some(crate::identity::hex(name.as_bytes())),
        }
    }

    #[test]
    fn both_ends_of_a_link_derive_its_secrets_and_no_other_pair_does() {
        let n1 = LinkKeys::of_certificates(Arc::new(Named("n1")));
        let n2 = LinkKeys::of_certificates(Arc::new(Named("n2")));
        let n3 = LinkKeys::of_certificates(Arc::new(Named("n3")));
        let at_host = n1.between("n1", "n2", &peer("n2")).unwrap();
        assert_eq!(n2.between("n1", "n2", &peer("n1")).unwrap(), at_host);
        assert_ne!(
            n2.between("n2", "n1", &peer("n1")).unwrap(),
            at_host,
            "the other way"
        );
        let third = n3.between("n3", "n2", &peer("n2")).unwrap();
        assert_ne!(third.dhchap.host, at_host.dhchap.host);
        assert_ne!(third.tls_psk, at_host.tls_psk);
        assert!(at_host.tls_psk.is_some(), "certificates' links run in TLS");
        assert_ne!(at_host.dhchap.host, at_host.dhchap.controller.unwrap());
        let forged = Peer {
            certificate: peer("n3").certificate,
            ..peer("n2")
        };
        assert!(n1.between("n1", "n2", &forged).is_err());
        let unpublished = Peer {
            certificate: None,
            ..peer("n2")
        };
        assert!(n1.between("n1", "n2", &unpublished).is_err());
        let token = LinkKeys::of_token("token");
        let by_token = token.between("n1", "n2", &unpublished).unwrap();
        assert_eq!(
            (by_token.dhchap, by_token.tls_psk),
            (token_keys("token"), None)
        );
        assert_eq!(n1.own_certificate(), peer("n1").certificate);
    }
}
