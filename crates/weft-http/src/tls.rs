//! TLS for the API with rustls (ring provider, TLS 1.2 and 1.3): the server
//! side from a certificate chain and key in PEM files, the client side
//! trusting a CA bundle in PEM; and a cluster node's identity
//! ([`NodeIdentity`]): its certificate from the cluster's CA (weft-cluster's
//! `pki` issues them), presented at both ends of the calls between nodes,
//! and that CA the only one it trusts for them.

use crate::DeadlineStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls::{StreamOwned, SupportedProtocolVersion};
use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// The bundle Debian's ca-certificates installs, trusted when no CA file is given.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

const VERSIONS: &[&SupportedProtocolVersion] = rustls::ALL_VERSIONS;

/// The server side: what every accepted connection is wrapped in.
#[derive(Debug, Clone)]
pub struct Server(Arc<ServerConfig>);

/// A connection served over TLS.
pub type ServerStream = StreamOwned<ServerConnection, DeadlineStream>;

impl Server {
    /// From PEM files: `cert_file` the certificate chain (leaf first),
    /// `key_file` its private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem_files(cert_file: &Path, key_file: &Path) -> Result<Server, String> {
        let (chain, key) = read_pair(cert_file, key_file)?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("TLS certificate and key do not go together: {e}"))?;
        Ok(Server(Arc::new(config)))
    }

    /// Wraps an accepted connection; the handshake happens on first use.
    pub fn accept(&self, stream: DeadlineStream) -> io::Result<ServerStream> {
        let connection = ServerConnection::new(Arc::clone(&self.0)).map_err(io::Error::other)?;
        Ok(StreamOwned::new(connection, stream))
    }
}

/// The client side, for one server name.
#[derive(Debug, Clone)]
pub struct Client {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Client {
    /// Trusting the CA certificates in `ca_file` (PEM; default the system
    /// bundle) for server `host` (a DNS name or an IP address).
    pub fn new(host: &str, ca_file: Option<&Path>) -> Result<Client, String> {
        let ca_file = ca_file.unwrap_or(Path::new(SYSTEM_CA_BUNDLE));
        let roots = read_roots(ca_file).map_err(|e| format!("{e} (give --api-ca FILE)"))?;
        let name = server_name(host)?;
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client {
            config: Arc::new(config),
            name,
        })
    }

    /// Trusting no one: for fetching what is checked by other means, and
    /// nothing secret (a joining node fetches the cluster's CA certificate
    /// with it, then checks it against the pin its join token carries). The
    /// server must still hold the key of the certificate it presents.
    pub fn unverified(host: &str) -> Result<Client, String> {
        let name = server_name(host)?;
        let config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
            .with_no_client_auth();
        Ok(Client {
            config: Arc::new(config),
            name,
        })
    }

    /// Wraps a connected stream; the handshake happens on first use.
    pub fn connect(
        &self,
        stream: TcpStream,
    ) -> io::Result<StreamOwned<ClientConnection, TcpStream>> {
        let connection = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(io::Error::other)?;
        Ok(StreamOwned::new(connection, stream))
    }
}

/// A cluster node's identity: its certificate and key, and the cluster CA,
/// the only one it trusts for calls between nodes. As a server it asks
/// clients for a certificate and accepts those without one (operators and
/// the CSI driver come with a bearer token); as a client it presents its
/// own and checks that the server's names the node it means to reach.
#[derive(Clone)]
pub struct NodeIdentity {
    names: Vec<String>,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// What shares secrets with the other nodes (see `crate::pair`).
    pub(crate) pair: crate::pair::PairKey,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// From PEM files: the cluster's CA certificate, the node's certificate
    /// (issued by it) and its key.
    pub fn from_pem_files(
        ca_file: &Path,
        cert_file: &Path,
        key_file: &Path,
    ) -> Result<NodeIdentity, String> {
        let roots = Arc::new(read_roots(ca_file)?);
        let (chain, key) = read_pair(cert_file, key_file)?;
        let names = dns_names(&chain[0]);
        let pair = crate::pair::PairKey::new(Arc::clone(&roots), &chain[0], &key)
            .map_err(|e| format!("{}: {e}", key_file.display()))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(&roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?;
        let mismatch = |e: rustls::Error| {
            let (cert, key) = (cert_file.display(), key_file.display());
            format!("{cert} and {key} do not go together: {e}")
        };
        let server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(mismatch)?;
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(mismatch)?;
        Ok(NodeIdentity {
            names,
            server: Arc::new(server),
            client: Arc::new(client),
            pair,
        })
    }

    /// The DNS names the node's own certificate carries.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The server side of the node's API: its certificate, and clients'
    /// certificates checked against the cluster's CA when they give one.
    pub fn server(&self) -> Server {
        Server(Arc::clone(&self.server))
    }

    /// The client side of a call to the node whose certificate carries
    /// `name`: trusting the cluster's CA only, presenting this node's own.
    pub fn client_for(&self, name: &str) -> Result<Client, String> {
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| format!("{name}: not a name for TLS: {e}"))?;
        Ok(Client {
            config: Arc::clone(&self.client),
            name,
        })
    }
}

/// The DNS names of the certificate a client presented, when the server
/// asked for one and it chained to the CA the server trusts (a
/// [`NodeIdentity`]'s): rustls keeps only certificates it verified.
pub fn client_names(connection: &ServerConnection) -> Vec<String> {
    connection
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(dns_names)
        .unwrap_or_default()
}

/// The DNS names in `certificate`'s subject alternative names.
fn dns_names(certificate: &CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(certificate)
        .map(|parsed| parsed.valid_dns_names().map(str::to_string).collect())
        .unwrap_or_default()
}

/// The certificates of a CA file (PEM).
/// The name a client checks the server's certificate against: `host` (a
/// DNS name or an IP address, bracketed or not).
fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host}: not a host name for TLS: {e}"))
}

/// Every certificate of `pem`, as DER, in order.
pub fn certificates_der(pem: &str) -> Result<Vec<Vec<u8>>, String> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|der| der.map(|der| der.to_vec()).map_err(|e| e.to_string()))
        .collect()
}

/// A verifier that takes any certificate ([`Client::unverified`]), and
/// checks only that the server signs with its key.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn read_roots(ca_file: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certificates = CertificateDer::pem_file_iter(ca_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?;
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "CA file {}: no PEM certificate in it",
            ca_file.display()
        ));
    }
    Ok(roots)
}

/// A certificate chain (leaf first) and its key, from PEM files.
fn read_pair(
    cert_file: &Path,
    key_file: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS certificate {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "TLS certificate {}: no PEM certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("TLS key {}: {e} (a PEM private key)", key_file.display()))?;
    Ok((chain, key))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::SystemTime;
    use weft_cluster::pki::{node_identity, ClusterCa};

    /// A cluster CA's files and node `node`'s under `dir`.
    fn identity(dir: &Path, ca: &ClusterCa, node: &str) -> NodeIdentity {
        issued_by(dir, ca, ca, node)
    }

    /// Node `node`'s identity trusting `ca`, its certificate from `issuer`.
    pub(crate) fn issued_by(
        dir: &Path,
        ca: &ClusterCa,
        issuer: &ClusterCa,
        node: &str,
    ) -> NodeIdentity {
        let issued = issuer.issue_node(node, &[], SystemTime::now()).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let file = |name: &str, text: &str| {
            let path = dir.join(format!("{node}-{name}"));
            std::fs::write(&path, text).unwrap();
            path
        };
        NodeIdentity::from_pem_files(
            &file("ca.crt", &ca.cert_pem()),
            &file("node.crt", &issued.cert_pem),
            &file("node.key", &issued.key_pem),
        )
        .unwrap()
    }

    /// Runs the handshake of `client` with `server` in memory; the server's
    /// connection when both ends accepted each other.
    fn handshake(client: &Client, server: &Server) -> Result<ServerConnection, rustls::Error> {
        let mut client = ClientConnection::new(Arc::clone(&client.config), client.name.clone())?;
        let mut server = ServerConnection::new(Arc::clone(&server.0))?;
        for _ in 0..10 {
            let mut bytes = Vec::new();
            client.write_tls(&mut bytes).unwrap();
            server.read_tls(&mut bytes.as_slice()).unwrap();
            server.process_new_packets()?;
            let mut bytes = Vec::new();
            server.write_tls(&mut bytes).unwrap();
            client.read_tls(&mut bytes.as_slice()).unwrap();
            client.process_new_packets()?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(server);
            }
        }
        panic!("the handshake did not end");
    }

    fn temp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("weft-http-tls-{name}-{}", std::process::id()))
    }

    #[test]
    fn nodes_of_one_cluster_authenticate_each_other_by_name() {
        let dir = temp("names");
        let ca = ClusterCa::create(SystemTime::now()).unwrap();
        let (n1, n2) = (identity(&dir, &ca, "n1"), identity(&dir, &ca, "n2"));
        assert_eq!(n1.names(), [node_identity("n1")]);
        let client = n1.client_for(&node_identity("n2")).unwrap();
        let server = handshake(&client, &n2.server()).unwrap();
        assert_eq!(client_names(&server), [node_identity("n1")]);
        // A client without a certificate (an operator with a token) is let
        // in, and names nobody.
        std::fs::write(dir.join("ca.crt"), ca.cert_pem()).unwrap();
        let operator = Client::new("n2.node.weft", Some(&dir.join("ca.crt"))).unwrap();
        let server = handshake(&operator, &n2.server()).unwrap();
        assert!(client_names(&server).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_node_refuses_a_server_of_another_ca_or_of_another_name() {
        let dir = temp("refusals");
        let ca = ClusterCa::create(SystemTime::now()).unwrap();
        let n1 = identity(&dir, &ca, "n1");
        // Where a member record was pointed: a server with a certificate
        // for n2 from a CA of its own, and n3 of the same cluster.
        let other_ca = ClusterCa::create(SystemTime::now()).unwrap();
        let other = identity(&dir.join("other"), &other_ca, "n2");
        let n3 = identity(&dir, &ca, "n3");
        let client = n1.client_for(&node_identity("n2")).unwrap();
        let error = handshake(&client, &other.server()).unwrap_err();
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");
        let error = handshake(&client, &n3.server()).unwrap_err();
        assert!(error.to_string().contains("not valid for name"), "{error}");
        // And a client presenting another CA's certificate is refused.
        let stranger = issued_by(&dir.join("stranger"), &ca, &other_ca, "n2");
        let stranger = stranger.client_for(&node_identity("n1")).unwrap();
        let error = handshake(&stranger, &n1.server()).unwrap_err();
        assert!(error.to_string().contains("UnknownIssuer"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
