//! The limits on what network peers can hold, as the node is configured
//! (the `[limits]` table of weft.toml, or flags): every one has a default
//! documented here and in the guide (docs/guide/01-single-node.md,
//! "Limits"), and each is logged once when reached where it is enforced
//! (the data plane's listeners, the protocol core, the API server, the
//! volume manager).

use crate::config::ConfigError;
use serde::Deserialize;
use std::time::Duration;
use weft_proto::Limits;
use weft_target::PeerLimits;

/// Concurrent API connections by default; more are answered 503 at once.
pub const API_CONNECTIONS_DEFAULT: u32 = 64;
/// Of those, connections one client address may hold, by default.
pub const API_CONNECTIONS_PER_ADDRESS_DEFAULT: u32 = 16;
/// Time an API client has to send a request's head (and a TLS handshake
/// before it), by default: an idle connection holds its place that long.
pub const API_HEAD_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// Time an API client has to send a whole request, by default.
pub const API_REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Slow-path I/O requests the volume manager may have queued, by default
/// (admin operations have a queue of their own: weft-node's `ADMIN_QUEUE_MAX`).
pub const MANAGER_QUEUE_DEFAULT: u32 = 65_536;

/// Every limit of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLimits {
    /// Connections per listener and per peer address.
    pub peers: PeerLimits,
    /// ICReq and Connect deadlines, controllers per subsystem (the rest of
    /// the protocol limits are fixed by the data plane's buffers).
    pub protocol: Limits,
    /// Concurrent API connections.
    pub api_connections: u32,
    /// Concurrent API connections from one client address.
    pub api_connections_per_address: u32,
    /// Time to send an API request's head.
    pub api_head_timeout: Duration,
    /// Time to send a whole API request.
    pub api_request_timeout: Duration,
    /// Slow-path I/O requests queued for the volume manager.
    pub manager_queue: u32,
}

impl Default for NodeLimits {
    fn default() -> NodeLimits {
        NodeLimits {
            peers: PeerLimits::DEFAULT,
            protocol: Limits::DEFAULT,
            api_connections: API_CONNECTIONS_DEFAULT,
            api_connections_per_address: API_CONNECTIONS_PER_ADDRESS_DEFAULT,
            api_head_timeout: API_HEAD_TIMEOUT_DEFAULT,
            api_request_timeout: API_REQUEST_TIMEOUT_DEFAULT,
            manager_queue: MANAGER_QUEUE_DEFAULT,
        }
    }
}

/// The `[limits]` table of weft.toml; absent keys keep their default.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    connections_per_listener: Option<u32>,
    connections_per_address: Option<u32>,
    icreq_timeout_ms: Option<u32>,
    connect_timeout_ms: Option<u32>,
    controllers_per_subsystem: Option<u16>,
    pending_authentications_per_subsystem: Option<u16>,
    pending_authentications_per_address: Option<u16>,
    discovery_controllers_per_address: Option<u16>,
    controllers_reserved_for_nodes: Option<u16>,
    api_connections: Option<u32>,
    api_connections_per_address: Option<u32>,
    api_head_timeout_ms: Option<u32>,
    api_request_timeout_ms: Option<u32>,
    manager_queue: Option<u32>,
    transfer_max_kib: Option<u32>,
}

impl LimitsFile {
    /// The limits the table sets, each checked (a zero would refuse everything).
    pub fn validate(self, origin: &str) -> Result<NodeLimits, ConfigError> {
        let mut limits = NodeLimits::default();
        let positive = |value: Option<u32>, key: &str, default: u32| {
            match value {
            None => Ok(default),
            Some(0) => Err(ConfigError::new(
                origin,
                format!("limits.{key}"),
                "0 would refuse everything; give a positive number (or leave it out for the default)",
            )),
            Some(value) => Ok(value),
        }
        };
        let peers = &mut limits.peers;
        peers.connections_per_listener = positive(
            self.connections_per_listener,
            "connections_per_listener",
            peers.connections_per_listener,
        )?;
        peers.connections_per_address = positive(
            self.connections_per_address,
            "connections_per_address",
            peers.connections_per_address,
        )?;
        let protocol = &mut limits.protocol;
        protocol.icreq_timeout_ms = positive(
            self.icreq_timeout_ms,
            "icreq_timeout_ms",
            protocol.icreq_timeout_ms,
        )?;
        protocol.connect_timeout_ms = positive(
            self.connect_timeout_ms,
            "connect_timeout_ms",
            protocol.connect_timeout_ms,
        )?;
        protocol.controllers_per_subsystem_max = positive(
            self.controllers_per_subsystem.map(u32::from),
            "controllers_per_subsystem",
            u32::from(protocol.controllers_per_subsystem_max),
        )? as u16;
        protocol.pending_authentications_per_subsystem = positive(
            self.pending_authentications_per_subsystem.map(u32::from),
            "pending_authentications_per_subsystem",
            u32::from(protocol.pending_authentications_per_subsystem),
        )?
        .min(u32::from(u16::MAX)) as u16;
        protocol.pending_authentications_per_address = positive(
            self.pending_authentications_per_address.map(u32::from),
            "pending_authentications_per_address",
            u32::from(protocol.pending_authentications_per_address),
        )?
        .min(u32::from(u16::MAX)) as u16;
        protocol.discovery_controllers_per_address = positive(
            self.discovery_controllers_per_address.map(u32::from),
            "discovery_controllers_per_address",
            u32::from(protocol.discovery_controllers_per_address),
        )?
        .min(u32::from(u16::MAX)) as u16;
        // 0 is a choice here (nothing kept for nodes); at most a quarter of
        // each limit is kept, whatever is asked.
        if let Some(kept) = self.controllers_reserved_for_nodes {
            protocol.controllers_reserved_for_nodes = kept;
        }
        limits.api_connections = positive(
            self.api_connections,
            "api_connections",
            limits.api_connections,
        )?;
        limits.api_connections_per_address = positive(
            self.api_connections_per_address,
            "api_connections_per_address",
            limits.api_connections_per_address,
        )?;
        let timeout_ms = positive(
            self.api_request_timeout_ms,
            "api_request_timeout_ms",
            limits.api_request_timeout.as_millis() as u32,
        )?;
        limits.api_request_timeout = Duration::from_millis(u64::from(timeout_ms));
        let head_ms = positive(
            self.api_head_timeout_ms,
            "api_head_timeout_ms",
            limits.api_head_timeout.as_millis() as u32,
        )?;
        // The head is part of the request.
        limits.api_head_timeout =
            Duration::from_millis(u64::from(head_ms)).min(limits.api_request_timeout);
        limits.manager_queue = positive(self.manager_queue, "manager_queue", limits.manager_queue)?;
        if let Some(kib) = self.transfer_max_kib {
            limits.protocol.transfer_bytes_max = transfer_bytes(kib).ok_or_else(|| {
                ConfigError::new(
                    origin,
                    "limits.transfer_max_kib",
                    format!("{kib} is not a power of two from 128 to 2097152 (KiB): MDTS counts powers of two of 4 KiB pages"),
                )
            })?;
        }
        limits
            .protocol
            .validate()
            .map_err(|error| ConfigError::new(origin, "limits", error.to_string()))?;
        Ok(limits)
    }
}

/// The largest transfer of `kib` KiB, in bytes: a power of two from 128 KiB
/// (what the protocol's in-capsule and H2CData limits fit in) to 2 GiB.
fn transfer_bytes(kib: u32) -> Option<u32> {
    let valid =
        kib.is_power_of_two() && (128..=(Limits::TRANSFER_BYTES_LIMIT >> 10)).contains(&kib);
    if !valid {
        return None;
    }
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NodeLimits, ConfigError> {
        toml::from_str::<LimitsFile>(text)
            .map_err(|e| ConfigError::new("t", "syntax", e.to_string()))?
            .validate("t")
    }

    #[test]
    fn absent_keys_keep_their_default_and_zero_is_refused() {
        assert_eq!(parse("").unwrap(), NodeLimits::default());
        let limits = parse("connections_per_address = 8\napi_request_timeout_ms = 500").unwrap();
        assert_eq!(limits.peers.connections_per_address, 8);
        assert_eq!(limits.api_request_timeout, Duration::from_millis(500));
        let error = parse("icreq_timeout_ms = 0").unwrap_err().to_string();
        assert!(
            error.contains("limits.icreq_timeout_ms: 0 would refuse"),
            "{error}"
        );
        assert!(parse("bogus = 1").is_err());
    }

    #[test]
    fn the_largest_transfer_is_a_power_of_two_of_kib() {
        assert_eq!(NodeLimits::default().protocol.transfer_bytes_max, 1 << 20);
        let limits = parse("transfer_max_kib = 4096").unwrap();
        assert_eq!(limits.protocol.transfer_bytes_max, 4 << 20);
        for bad in [
            "transfer_max_kib = 1000",
            "transfer_max_kib = 64",
            "transfer_max_kib = 4194304",
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(error.contains("limits.transfer_max_kib"), "{error}");
        }
    }
}
