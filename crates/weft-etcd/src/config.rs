//! [`EtcdConfig`]: where the cluster store is and how to reach it. It only
//! holds and checks settings (and reads the TLS files); connecting is the
//! store's job.

use std::path::PathBuf;
use std::time::Duration;

/// The key prefix a store uses unless told otherwise.
pub const DEFAULT_PREFIX: &str = "/weft/";

/// How long one request may take unless told otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach the etcd cluster that holds weft's desired state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs of the members, e.g. `http://10.0.0.1:2379`; requests
    /// go to any that answers. With [`EtcdConfig::tls`] they must be
    /// `https://` (or bare `host:port`).
    pub endpoints: Vec<String>,
    /// Every key of the store lives under it (it starts and ends with `/`),
    /// so that several weft clusters, or other programs, can share an etcd.
    pub prefix: String,
    /// etcd user and password, for a cluster with authentication enabled.
    pub user: Option<(String, String)>,
    /// TLS to the members, for `https://` endpoints.
    pub tls: Option<EtcdTls>,
    /// The longest any one request (or connecting) may take before the
    /// store is reported unreachable.
    pub request_timeout: Duration,
}

/// TLS settings: the CA that signed the members' certificates and, for
/// clusters that require client certificates, this client's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the certificate authority to trust.
    pub ca: PathBuf,
    /// PEM file of the client certificate (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (with `cert`).
    pub key: Option<PathBuf>,
}

impl EtcdConfig {
    /// The default settings for `endpoints`.
    pub fn new(endpoints: Vec<String>) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            prefix: DEFAULT_PREFIX.to_string(),
            user: None,
            tls: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The endpoints joined by commas, for messages.
    pub fn endpoint_list(&self) -> String {
        self.endpoints.join(",")
    }

    /// Why these settings cannot work, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("no etcd endpoint is configured".into());
        }
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') {
            return Err(format!(
                "the etcd key prefix {:?} must start and end with '/'",
                self.prefix
            ));
        }
        if self.request_timeout.is_zero() {
            return Err("the etcd request timeout must be more than zero".into());
        }
        if let Some(tls) = &self.tls {
            if tls.cert.is_some() != tls.key.is_some() {
                return Err("a client certificate needs its key, and a key its certificate".into());
            }
            if let Some(plain) = self.endpoints.iter().find(|e| e.starts_with("http://")) {
                return Err(format!("endpoint {plain} is http:// but TLS is configured"));
            }
        }
        if let (Some((user, _)), None) = (&self.user, &self.tls) {
            if let Some(remote) = self.endpoints.iter().find(|e| !is_loopback(e)) {
                return Err(format!(
                    "etcd user {user:?}'s password would cross the network in clear to {remote}: give https:// endpoints and the etcd CA (etcd_ca in weft.toml), or authenticate with a client certificate instead"
                ));
            }
        }
        Ok(())
    }
}

/// Whether `endpoint` (a URL or `host:port`) is on this machine's loopback,
/// which no one else sees.
fn is_loopback(endpoint: &str) -> bool {
    let address = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => address,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_checks() {
        let mut config = EtcdConfig::new(vec!["http://127.0.0.1:2379".into()]);
        assert_eq!(config.prefix, "/weft/");
        assert_eq!(config.request_timeout, Duration::from_secs(5));
        assert_eq!(config.check(), Ok(()));

        config.prefix = "/weft".into();
        assert!(config.check().unwrap_err().contains("must start and end"));
        config.prefix = "/weft/".into();

        config.tls = Some(EtcdTls {
            ca: "ca.pem".into(),
            cert: Some("client.pem".into()),
            key: None,
        });
        assert!(config.check().unwrap_err().contains("needs its key"));
        config.tls = Some(EtcdTls {
            ca: "ca.pem".into(),
            cert: None,
            key: None,
        });
        assert!(config.check().unwrap_err().contains("is http://"));

        assert!(EtcdConfig::new(Vec::new()).check().is_err());
    }

    /// A password goes over TLS, or stays on this machine.
    #[test]
    fn a_password_is_refused_over_plain_http_to_another_machine() {
        let user = Some(("weft".to_string(), "secret".to_string()));
        for local in [
            "http://127.0.0.1:2379",
            "http://localhost:2379",
            "http://[::1]:2379",
            "127.0.0.2:2379",
        ] {
            let mut config = EtcdConfig::new(vec![local.into()]);
            config.user = user.clone();
            assert_eq!(config.check(), Ok(()), "{local}");
        }
        let mut config = EtcdConfig::new(vec![
            "http://127.0.0.1:2379".into(),
            "http://10.0.0.2:2379".into(),
        ]);
        config.user = user.clone();
        let error = config.check().unwrap_err();
        assert!(
            error.contains("in clear to http://10.0.0.2:2379") && error.contains("https://"),
            "{error}"
        );
        config.endpoints = vec!["https://10.0.0.2:2379".into()];
        config.tls = Some(EtcdTls {
            ca: "ca.pem".into(),
            cert: None,
            key: None,
        });
        assert_eq!(config.check(), Ok(()));
    }
}
