//! The cluster's own certificate authority: what makes a node a node of
//! this cluster, whatever the store says.
//!
//! `weft cluster init` makes the CA once (an ECDSA P-256 key and a
//! self-signed certificate, ten years) and a certificate for etcd's
//! servers; `weft cluster issue NODE` gives a node its key and certificate
//! (one year), whose name is `NODE.node.weft` ([`node_identity`]). A node
//! presents it to etcd (client certificate), to hosts calling its API
//! (server certificate) and to the other nodes it calls (client
//! certificate); it trusts only this CA, never the system's, and checks
//! that a peer's certificate names the node it meant to reach: a member
//! record pointing a node's address elsewhere no longer redirects a call.
//!
//! What it does not do: read or write files (the CLI does), or keep a list
//! of what it issued (a certificate names its node; replacing one is
//! issuing it again). The CA's key stays where `init` ran, never in the
//! store: a writer of the store cannot make a node.

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// The CA's subject, followed by the start of its key's SHA-256: issued
/// certificates name it as their issuer, and two clusters' CAs differ.
const CA_NAME: &str = "weft cluster CA";

/// How long the CA is valid.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 86_400);

/// How long a node's or etcd's certificate is valid.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(365 * 86_400);

/// Certificates are valid from this long before they were issued, so that
/// a node whose clock is a little behind accepts them.
const CLOCK_SKEW: Duration = Duration::from_secs(3600);

/// The DNS name under which a node's certificate names it.
const NODE_DOMAIN: &str = "node.weft";

/// Why a certificate could not be made.
#[derive(Debug, Error)]
pub enum PkiError {
    /// The CA's key or certificate in PEM could not be read.
    #[error("the cluster CA's {what} is not valid PEM: {source}")]
    Unreadable {
        /// Which file.
        what: &'static str,
        /// Why.
        source: rcgen::Error,
    },
    /// A name could not go in a certificate.
    #[error("{name:?} cannot be named in a certificate: {source}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        source: rcgen::Error,
    },
    /// A name under `node.weft` given to a certificate that is not a node's.
    #[error("{0:?} is a name of the cluster's nodes (under node.weft): only a node's certificate carries one")]
    NodeName(String),
    /// Signing failed.
    #[error("signing the certificate: {0}")]
    Signing(rcgen::Error),
    /// A joining node's public key is not a P-256 point.
    #[error("the public key is not an uncompressed P-256 point (65 bytes, 04 first)")]
    BadPublicKey,
}

/// A joining node's public key: an uncompressed P-256 point (SEC1), what
/// rcgen's `KeyPair::public_key_raw` gives for the keys weft makes.
struct JoiningKey(Vec<u8>);

impl rcgen::PublicKeyData for JoiningKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its key (PKCS#8), to be kept private.
    pub key_pem: String,
}

/// The cluster's CA, able to issue certificates.
pub struct ClusterCa {
    key: KeyPair,
    certificate: Certificate,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

/// A new key for a node joining with a token: its public key (an
/// uncompressed P-256 point, what [`ClusterCa::issue_node_for`] takes) and
/// the key itself (PKCS#8 PEM, to be kept private).
pub fn new_node_key() -> Result<(Vec<u8>, String), PkiError> {
    let key = KeyPair::generate().map_err(PkiError::Signing)?;
    Ok((key.public_key_raw().to_vec(), key.serialize_pem()))
}

/// Checks that `public_key` is an uncompressed P-256 point, what
/// [`ClusterCa::issue_node_for`] certifies.
pub fn check_public_key(public_key: &[u8]) -> Result<(), PkiError> {
    if public_key.len() != 65
        || public_key[0] != 4
        || p256::PublicKey::from_sec1_bytes(public_key).is_err()
    {
        return Err(PkiError::BadPublicKey);
    }
    Ok(())
}

/// The name a node's certificate carries: `NODE.node.weft` (node names
/// are DNS labels, weft-cluster's `check_node_name`).
pub fn node_identity(node: &str) -> String {
    format!("{node}.{NODE_DOMAIN}")
}

/// The node a certificate's name names (`NODE.node.weft`), if it names one.
pub fn node_named(name: &str) -> Option<&str> {
    let node = name.strip_suffix(NODE_DOMAIN)?.strip_suffix('.')?;
    crate::records::check_node_name(node).ok().map(|()| node)
}

impl ClusterCa {
    /// A new CA, valid from `now` for ten years.
    pub fn create(now: SystemTime) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::generate().map_err(PkiError::Signing)?;
        let certificate = ca_params(&key, now)
            .self_signed(&key)
            .map_err(PkiError::Signing)?;
        Ok(ClusterCa { key, certificate })
    }

    /// The CA made earlier, from its key (PEM). Certificates it issues name
    /// the CA's subject and key, the same every time: they chain to the
    /// certificate made at init, which stays the one nodes trust.
    pub fn load(key_pem: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::from_pem(key_pem).map_err(|source| PkiError::Unreadable {
            what: "key",
            source,
        })?;
        let certificate = ca_params(&key, SystemTime::now())
            .self_signed(&key)
            .map_err(PkiError::Signing)?;
        Ok(ClusterCa { key, certificate })
    }

    /// The CA's certificate (PEM): what every node trusts.
    pub fn cert_pem(&self) -> String {
        self.certificate.pem()
    }

    /// The CA's private key (PEM).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for node `node`, reachable at `addresses` (which a
    /// client of its API may name instead of the node), valid from `now`
    /// for a year, for both ends of a TLS connection.
    pub fn issue_node(
        &self,
        node: &str,
        addresses: &[IpAddr],
        now: SystemTime,
    ) -> Result<Issued, PkiError> {
        let mut names = vec![node_identity(node)];
        names.extend(addresses.iter().map(IpAddr::to_string));
        let usages = [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue(&format!("weft node {node}"), names, &usages, now)
    }

    /// [`ClusterCa::issue_node`] for the key the node made and keeps
    /// (`public_key`: an uncompressed P-256 point): the certificate (PEM)
    /// of a node joining with a token, whose key never leaves it.
    pub fn issue_node_for(
        &self,
        node: &str,
        addresses: &[IpAddr],
        public_key: &[u8],
        now: SystemTime,
    ) -> Result<String, PkiError> {
        check_public_key(public_key)?;
        let mut names = vec![node_identity(node)];
        names.extend(addresses.iter().map(IpAddr::to_string));
        let usages = [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let params = self.leaf_params(&format!("weft node {node}"), names, &usages, now)?;
        let certificate = params
            .signed_by(
                &JoiningKey(public_key.to_vec()),
                &self.certificate,
                &self.key,
            )
            .map_err(PkiError::Signing)?;
        Ok(certificate.pem())
    }

    /// A certificate for etcd's members at `hosts` (DNS names or IP
    /// addresses), valid from `now` for a year: for their clients, and for
    /// each other (etcd's peer TLS presents one certificate both ways). It
    /// names no node (a name under `node.weft` is refused), so a node's API
    /// never takes it for one.
    pub fn issue_etcd(&self, hosts: &[String], now: SystemTime) -> Result<Issued, PkiError> {
        let node_name = |host: &&String| {
            let host = host.to_ascii_lowercase();
            host.trim_end_matches('.').ends_with(NODE_DOMAIN)
        };
        if let Some(host) = hosts.iter().find(node_name) {
            return Err(PkiError::NodeName(host.clone()));
        }
        let usages = [
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.issue("weft etcd", hosts.to_vec(), &usages, now)
    }

    fn issue(
        &self,
        common_name: &str,
        names: Vec<String>,
        usages: &[ExtendedKeyUsagePurpose],
        now: SystemTime,
    ) -> Result<Issued, PkiError> {
        let params = self.leaf_params(common_name, names, usages, now)?;
        let key = KeyPair::generate().map_err(PkiError::Signing)?;
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .map_err(PkiError::Signing)?;
        Ok(Issued {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A leaf certificate's parameters: `common_name`, `names` (DNS names
    /// or IP addresses), `usages`, valid from `now` for a year.
    fn leaf_params(
        &self,
        common_name: &str,
        names: Vec<String>,
        usages: &[ExtendedKeyUsagePurpose],
        now: SystemTime,
    ) -> Result<CertificateParams, PkiError> {
        let mut params = CertificateParams::new(Vec::new()).map_err(PkiError::Signing)?;
        for name in names {
            let san = match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(name.as_str().try_into().map_err(|source| {
                    PkiError::BadName {
                        name: name.clone(),
                        source,
                    }
                })?),
            };
            params.subject_alt_names.push(san);
        }
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        params.use_authority_key_identifier_extension = true;
        // No serial given: rcgen derives it from the new key, unique as it is.
        params.not_before = (now - CLOCK_SKEW).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        Ok(params)
    }
}

/// The CA's parameters: the same subject and usages every time, so that a
/// CA loaded from its key signs as the one created.
fn ca_params(key: &KeyPair, now: SystemTime) -> CertificateParams {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.public_key_raw());
    let id = crate::token::hex(&digest[..8]);
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{CA_NAME} {id}"));
    // It signs nodes' and etcd's certificates, never another CA's.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - CLOCK_SKEW).into();
    params.not_after = (now + CA_VALIDITY).into();
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_identities_are_names_under_the_clusters_domain() {
        assert_eq!(node_identity("n1"), "n1.node.weft");
        assert_eq!(node_identity("rack2-node3"), "rack2-node3.node.weft");
        assert_eq!(node_named("n1.node.weft"), Some("n1"));
        for other in [
            "n1.node.weft.example",
            "node.weft",
            ".node.weft",
            "N1.node.weft",
            "n1",
        ] {
            assert_eq!(node_named(other), None, "{other}");
        }
    }

    #[test]
    fn a_loaded_ca_issues_certificates_as_the_created_one() {
        let now = SystemTime::now();
        let ca = ClusterCa::create(now).unwrap();
        let loaded = ClusterCa::load(&ca.key_pem()).unwrap();
        let issued = loaded
            .issue_node("n1", &["10.0.0.1".parse().unwrap()], now)
            .unwrap();
        assert!(issued.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(issued.key_pem.contains("PRIVATE KEY"));
        assert!(ClusterCa::load("not pem").is_err());
        let etcd = loaded.issue_etcd(&["10.0.0.1".into(), "etcd1".into()], now);
        assert!(etcd.is_ok());
        for named in ["n1.node.weft", "N1.NODE.WEFT", "n1.node.weft."] {
            assert!(loaded.issue_etcd(&[named.into()], now).is_err(), "{named}");
        }
    }

    #[test]
    fn a_joining_nodes_own_key_is_certified_and_a_bad_one_refused() {
        let now = SystemTime::now();
        let ca = ClusterCa::create(now).unwrap();
        let key = KeyPair::generate().unwrap();
        let pem = ca
            .issue_node_for(
                "n3",
                &["10.0.0.3".parse().unwrap()],
                key.public_key_raw(),
                now,
            )
            .unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"));
        // The certificate carries the node's key: it is in its DER.
        use rustls::pki_types::pem::PemObject as _;
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert!(der.windows(65).any(|window| window == key.public_key_raw()));
        for bad in [&[4u8; 65][..], &key.public_key_raw()[1..], &[]] {
            assert!(matches!(
                ca.issue_node_for("n3", &[], bad, now),
                Err(PkiError::BadPublicKey)
            ));
        }
    }
}
