//! TLS for the API with rustls (ring provider, TLS 1.2 and 1.3): the server
//! side from a certificate chain and key in PEM files, the client side
//! trusting a CA bundle in PEM. Certificates are the operator's (from their
//! CA, or self-signed with openssl); weft does not issue any.

use crate::DeadlineStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls::{StreamOwned, SupportedProtocolVersion};
use std::io;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

/// The bundle Debian's ca-certificates installs, trusted when no CA file is given.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
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
        let mut roots = RootCertStore::empty();
        let certificates = CertificateDer::pem_file_iter(ca_file)
            .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
            .map_err(|e| format!("CA file {}: {e} (give --api-ca FILE)", ca_file.display()))?;
        for certificate in certificates {
            roots
                .add(certificate)
                .map_err(|e| format!("CA file {}: {e}", ca_file.display()))?;
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| format!("{host}: not a host name for TLS: {e}"))?;
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
