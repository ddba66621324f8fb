//! Secrets two nodes of a cluster share without anyone else: the
//! Diffie-Hellman agreement (ECDH on P-256) of one node's key with the key
//! in the other's certificate, once that certificate is checked as the
//! cluster CA's for the node named. Only the two nodes can compute it: not
//! a reader or writer of the store (which carries the certificates), nor a
//! holder of the cluster's API token. weft derives the keys of the
//! replication links between two nodes from it.
//!
//! The key is the node's certificate key (ECDSA P-256, from `weft cluster
//! issue`), used for a static ECDH as the ECDH_ECDSA cipher suites of TLS
//! 1.2 used theirs: the agreement is never signed and is only an input to
//! HMAC-based derivations, so neither use helps an attack on the other.
//!
//! What it does not do: check revocation (a certificate is good until it
//! expires: docs/SECURITY.md says what a removed node keeps), or cache (the
//! caller keeps what it derived).

use crate::tls::{provider, NodeIdentity};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey};
use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::RootCertStore;
use std::sync::Arc;

/// A node's half of its shared secrets: its key, its certificate, and the
/// cluster CA that the other nodes' certificates are checked against.
#[derive(Clone)]
pub(crate) struct PairKey {
    /// None when the node's key is not a P-256 one.
    key: Option<Arc<p256::SecretKey>>,
    certificate_der: Vec<u8>,
    verifier: Arc<WebPkiServerVerifier>,
}

impl PairKey {
    /// From the node's certificate and key, trusting `roots` (the cluster CA).
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        certificate: &CertificateDer<'_>,
        key: &PrivateKeyDer<'_>,
    ) -> Result<PairKey, String> {
        let key = match key {
            PrivateKeyDer::Pkcs8(der) => {
                p256::SecretKey::from_pkcs8_der(der.secret_pkcs8_der()).ok()
            }
            PrivateKeyDer::Sec1(der) => p256::SecretKey::from_sec1_der(der.secret_sec1_der()).ok(),
            _ => None,
        };
        let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(PairKey {
            key: key.map(Arc::new),
            certificate_der: certificate.to_vec(),
            verifier,
        })
    }
}

impl NodeIdentity {
    /// This node's certificate (DER), which the other nodes share secrets
    /// with (see [`NodeIdentity::shared_secret`]).
    pub fn certificate_der(&self) -> &[u8] {
        &self.pair.certificate_der
    }

    /// The secret this node shares with the node whose certificate is
    /// `certificate_der` and must carry `name` (its `NODE.node.weft`),
    /// checked against the cluster CA: the x coordinate of their ECDH
    /// agreement. Either node computes the same from the other's
    /// certificate.
    pub fn shared_secret(&self, name: &str, certificate_der: &[u8]) -> Result<[u8; 32], String> {
        let Some(key) = &self.pair.key else {
            return Err(
                "this node's key is not an ECDSA P-256 key (`weft cluster issue` makes one)".into(),
            );
        };
        let certificate = CertificateDer::from(certificate_der);
        let server_name = ServerName::try_from(name.to_string())
            .map_err(|e| format!("{name}: not a certificate name: {e}"))?;
        self.pair
            .verifier
            .verify_server_cert(&certificate, &[], &server_name, &[], UnixTime::now())
            .map_err(|e| format!("the certificate given for {name}: {e}"))?;
        let parsed = webpki::EndEntityCert::try_from(&certificate).map_err(|e| e.to_string())?;
        let public =
            p256::PublicKey::from_public_key_der(parsed.subject_public_key_info().as_ref())
                .map_err(|_| format!("the certificate of {name} has no P-256 key"))?;
        let agreed = p256::ecdh::diffie_hellman(key.to_nonzero_scalar(), public.as_affine());
        Ok((*agreed.raw_secret_bytes()).into())
    }
}

#[cfg(test)]
mod tests {
    use crate::tls::tests::issued_by as identity;
    use std::time::SystemTime;
    use weft_cluster::pki::{node_identity, ClusterCa};

    /// Two nodes compute the same secret from each other's certificates;
    /// a third computes another; a certificate of another CA, or given
    /// for another node's name, is refused.
    #[test]
    fn two_nodes_share_a_secret_no_one_else_computes() {
        let dir = std::env::temp_dir().join(format!("weft-http-pair-{}", std::process::id()));
        let ca = ClusterCa::create(SystemTime::now()).unwrap();
        let [n1, n2, n3] = ["n1", "n2", "n3"].map(|n| identity(&dir, &ca, &ca, n));
        let (name1, name2) = (node_identity("n1"), node_identity("n2"));
        let one_two = n1.shared_secret(&name2, n2.certificate_der()).unwrap();
        assert_eq!(
            n2.shared_secret(&name1, n1.certificate_der()).unwrap(),
            one_two
        );
        assert_ne!(
            n3.shared_secret(&name2, n2.certificate_der()).unwrap(),
            one_two
        );
        let refused = n1.shared_secret(&name2, n3.certificate_der()).unwrap_err();
        assert!(refused.contains("n2.node.weft"), "{refused}");
        let other_ca = ClusterCa::create(SystemTime::now()).unwrap();
        let stranger = identity(&dir.join("other"), &ca, &other_ca, "n2");
        assert!(n1
            .shared_secret(&name2, stranger.certificate_der())
            .is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
