//! `nvme-tcp://HOST:PORT/NQN` target addresses.

use std::net::{SocketAddr, ToSocketAddrs};
use thiserror::Error;
use weft_proto::command::NQN_BYTES_MAX;

/// Where an NVMe/TCP subsystem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetUrl {
    /// Resolved address.
    pub address: SocketAddr,
    /// Subsystem NQN.
    pub nqn: String,
}

/// A target URL that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("\"{text}\" is not a target: {why} (expected nvme-tcp://HOST:PORT/NQN, e.g. nvme-tcp://127.0.0.1:4420/nqn.2026-11.io.weft:default)")]
pub struct UrlError {
    text: String,
    why: String,
}

impl TargetUrl {
    /// Parses `nvme-tcp://HOST[:PORT]/NQN` (port 4420 by default).
    pub fn parse(text: &str) -> Result<TargetUrl, UrlError> {
        let error = |why: &str| UrlError {
            text: text.to_string(),
            why: why.to_string(),
        };
        let rest = text
            .strip_prefix("nvme-tcp://")
            .ok_or_else(|| error("it does not start with nvme-tcp://"))?;
        let (authority, nqn) = rest
            .split_once('/')
            .ok_or_else(|| error("the subsystem NQN is missing"))?;
        if nqn.is_empty() {
            return Err(error("the subsystem NQN is missing"));
        }
        if nqn.len() > NQN_BYTES_MAX {
            return Err(error(&format!(
                "the NQN is {} bytes long; NQNs are at most {NQN_BYTES_MAX} bytes",
                nqn.len()
            )));
        }
        let with_port = if authority
            .rsplit_once(':')
            .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority.to_string()
        } else {
            format!("{authority}:4420")
        };
        let address = with_port
            .to_socket_addrs()
            .map_err(|e| error(&format!("cannot resolve {authority}: {e}")))?
            .next()
            .ok_or_else(|| error("no address"))?;
        Ok(TargetUrl {
            address,
            nqn: nqn.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_explains() {
        let url =
            TargetUrl::parse("nvme-tcp://127.0.0.1:4420/nqn.2026-11.io.weft:default").unwrap();
        assert_eq!(url.address.to_string(), "127.0.0.1:4420");
        assert_eq!(url.nqn, "nqn.2026-11.io.weft:default");
        assert_eq!(
            TargetUrl::parse("nvme-tcp://127.0.0.1/nqn.a:b")
                .unwrap()
                .address
                .port(),
            4420
        );
        assert_eq!(
            TargetUrl::parse("nvme-tcp://[::1]:4421/nqn.a:b")
                .unwrap()
                .address
                .port(),
            4421
        );
        let error = TargetUrl::parse("tcp://x/y").unwrap_err().to_string();
        assert!(error.contains("does not start with nvme-tcp://"), "{error}");
        assert!(TargetUrl::parse("nvme-tcp://127.0.0.1:4420")
            .unwrap_err()
            .to_string()
            .contains("NQN is missing"));
        let longest = format!("nqn.2026-11.io.weft:{}", "a".repeat(223 - 20));
        assert!(TargetUrl::parse(&format!("nvme-tcp://127.0.0.1/{longest}")).is_ok());
        let error = TargetUrl::parse(&format!("nvme-tcp://127.0.0.1/{longest}b"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("the NQN is 224 bytes long; NQNs are at most 223 bytes"),
            "{error}"
        );
    }
}
