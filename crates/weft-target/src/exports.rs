//! What the data plane serves: a snapshot of the protocol core's target
//! configuration plus the device behind each of its namespaces. A snapshot
//! never changes; an update replaces it whole (see `DataPlane::update_exports`),
//! so that the core's subsystem indices and the devices always agree.

use crate::health::Health;
use crate::meter::Meter;
use crate::volume::VolumeBackend;
use std::sync::Arc;
use weft_proto::types::Nsid;
use weft_proto::TargetConfig;
use weft_storage::BlockDevice;

/// What a namespace's blocks live on.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A whole device (file, block device or RAM), offsets as they are.
    Device(Arc<dyn BlockDevice>),
    /// A volume of a pool, through its chunk map.
    Volume(Arc<VolumeBackend>),
}

/// A namespace's backend.
#[derive(Debug, Clone)]
pub struct NamespaceDevice {
    /// Namespace ID.
    pub nsid: Nsid,
    /// Where its blocks live.
    pub backend: Backend,
    /// Its QoS limits and statistics.
    pub meter: Arc<Meter>,
    /// Its backing store's failure flag: the device's own, or its pool's.
    pub health: Arc<Health>,
}

/// One snapshot of the exports: every reactor holds the same `Arc`.
#[derive(Debug)]
pub struct Exports {
    /// The protocol core's view (subsystems, listeners, limits).
    pub config: Arc<TargetConfig>,
    /// Devices per subsystem, in the order of `config.subsystems`.
    pub devices: Vec<Vec<NamespaceDevice>>,
}

impl Exports {
    /// Pairs `config` with `devices`: one list per subsystem, in the order of
    /// `config.subsystems`, holding a device for each of its namespaces.
    pub fn new(config: Arc<TargetConfig>, devices: Vec<Vec<NamespaceDevice>>) -> Exports {
        assert_eq!(
            config.subsystems.len(),
            devices.len(),
            "one device list per subsystem"
        );
        for (subsystem, devices) in config.subsystems.iter().zip(&devices) {
            for namespace in &subsystem.namespaces {
                assert!(
                    devices.iter().any(|d| d.nsid == namespace.nsid),
                    "no device for namespace {} of {}",
                    namespace.nsid,
                    subsystem.nqn
                );
            }
        }
        Exports { config, devices }
    }

    /// The device of `nsid` in subsystem number `subsystem`.
    pub fn namespace(&self, subsystem: usize, nsid: Nsid) -> Option<&NamespaceDevice> {
        self.devices.get(subsystem)?.iter().find(|d| d.nsid == nsid)
    }

    /// Every whole device, for a final flush (volumes are the manager's to flush).
    pub fn all_devices(&self) -> impl Iterator<Item = &dyn BlockDevice> {
        self.devices
            .iter()
            .flatten()
            .filter_map(|d| match &d.backend {
                Backend::Device(device) => Some(device.as_ref()),
                Backend::Volume(_) => None,
            })
    }
}
