//! The subsystems a node is configured to serve (files, block devices and
//! RAM, declared in weft.toml or by default) and their translation into the
//! data plane's exports, with identities derived from the node's.

use crate::identity::NodeId;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use weft_proto::ana::AnaConfig;
use weft_proto::target::{
    AddressFamily, HostAccess, ListenerConfig, NamespaceConfig, SubsystemConfig,
};
use weft_proto::types::Nsid;
use weft_proto::TargetConfig;
use weft_storage::{BlockDevice, FileDevice, RamDevice};
use weft_target::{Exports, NamespaceDevice};

/// One subsystem to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemSpec {
    /// NQN.
    pub nqn: String,
    /// Model number.
    pub model: String,
    /// Namespaces.
    pub namespaces: Vec<NamespaceSpec>,
}

/// One namespace to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceSpec {
    /// NSID.
    pub nsid: u32,
    /// Backend.
    pub backend: BackendSpec,
    /// Logical block size.
    pub block_size: u32,
}

/// Where a namespace's blocks live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendSpec {
    /// A file or block device; `size_bytes` creates a missing file.
    File {
        /// Path.
        path: PathBuf,
        /// Configured size.
        size_bytes: Option<u64>,
    },
    /// RAM of this size.
    Ram {
        /// Size.
        size_bytes: u64,
    },
}

/// Opens every device of `subsystems` and builds the data plane's exports,
/// served on the `listen` addresses within the protocol's `limits`.
pub fn build_exports(
    subsystems: &[SubsystemSpec],
    listen: &[SocketAddr],
    referrals: &[SocketAddr],
    limits: weft_proto::Limits,
    node: &NodeId,
) -> Result<Arc<Exports>, String> {
    let mut configs = Vec::new();
    let mut devices = Vec::new();
    for subsystem in subsystems {
        let mut namespaces = Vec::new();
        let mut subsystem_devices = Vec::new();
        for namespace in &subsystem.namespaces {
            let device = open_device(namespace).map_err(|error| {
                format!(
                    "subsystem {} namespace {}: {error}",
                    subsystem.nqn, namespace.nsid
                )
            })?;
            let (nguid, uuid, eui64) = node.namespace_ids(&subsystem.nqn, namespace.nsid);
            namespaces.push(NamespaceConfig {
                nsid: Nsid(namespace.nsid),
                blocks: device.size_bytes() / u64::from(device.block_size()),
                block_size: device.block_size(),
                nguid,
                uuid,
                eui64,
                thin: device.is_thin(),
                ready: true,
                reservations: None,
            });
            subsystem_devices.push(NamespaceDevice {
                nsid: Nsid(namespace.nsid),
                backend: weft_target::Backend::Device(device),
                meter: Default::default(),
                health: Default::default(),
            });
        }
        configs.push(SubsystemConfig {
            nqn: subsystem.nqn.clone(),
            serial: node.serial(&subsystem.nqn),
            model: subsystem.model.clone(),
            firmware: env!("CARGO_PKG_VERSION").to_string(),
            namespaces,
            access: HostAccess::Any,
            ana: AnaConfig::DEFAULT,
            fenced: false,
            fence_authority: None,
            intent: None,
        });
        devices.push(subsystem_devices);
    }
    let target_config = TargetConfig {
        subsystems: configs,
        listeners: ports(listen),
        limits,
        referrals: ports(referrals),
        node_addresses: Vec::new(),
        discovery_serial: node.serial(weft_proto::target::DISCOVERY_NQN),
        generation: 1,
    };
    Ok(Arc::new(Exports::new(Arc::new(target_config), devices)))
}

/// Listeners (or referrals) as the discovery log reports them: port IDs
/// count from 1 in the order given.
pub fn ports(addresses: &[SocketAddr]) -> Vec<ListenerConfig> {
    addresses
        .iter()
        .enumerate()
        .map(|(index, address)| ListenerConfig {
            port_id: u16::try_from(index + 1).unwrap_or(u16::MAX),
            family: if address.is_ipv4() {
                AddressFamily::Ipv4
            } else {
                AddressFamily::Ipv6
            },
            address: address.ip().to_string(),
            service: address.port().to_string(),
        })
        .collect()
}

fn open_device(namespace: &NamespaceSpec) -> Result<Arc<dyn BlockDevice>, String> {
    match &namespace.backend {
        BackendSpec::File { path, size_bytes } => {
            FileDevice::open(path, *size_bytes, namespace.block_size)
                .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
        }
        BackendSpec::Ram { size_bytes } => RamDevice::new(*size_bytes, namespace.block_size)
            .map(|d| Arc::new(d) as Arc<dyn BlockDevice>),
    }
    .map_err(|error| error.to_string())
}
