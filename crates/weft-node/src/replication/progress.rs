//! Rebuild progress of the replicas of the volumes this node is primary
//! of, as the replicators publish it (every tick, when it changed) and
//! `volume show` and `/metrics` read it: bytes to copy and copied, the
//! rate since the rebuild began and the time left at that rate.

use crate::status::RebuildStatus;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

/// Every rebuild in progress on this node, by volume.
#[derive(Debug, Default)]
pub(crate) struct Rebuilds {
    volumes: Mutex<BTreeMap<String, Vec<RebuildStatus>>>,
}

impl Rebuilds {
    /// The rebuilds of `volume` now.
    pub(crate) fn of(&self, volume: &str) -> Vec<RebuildStatus> {
        let volumes = self.volumes.lock().unwrap_or_else(PoisonError::into_inner);
        volumes.get(volume).cloned().unwrap_or_default()
    }

    /// Every rebuild, with its volume.
    pub(crate) fn all(&self) -> Vec<(String, RebuildStatus)> {
        let volumes = self.volumes.lock().unwrap_or_else(PoisonError::into_inner);
        volumes
            .iter()
            .flat_map(|(volume, list)| list.iter().map(|r| (volume.clone(), r.clone())))
            .collect()
    }

    /// `volume`'s rebuilds are now `list` (empty: none).
    pub(crate) fn set(&self, volume: &str, list: Vec<RebuildStatus>) {
        let mut volumes = self.volumes.lock().unwrap_or_else(PoisonError::into_inner);
        if list.is_empty() {
            volumes.remove(volume);
        } else {
            volumes.insert(volume.to_string(), list);
        }
    }
}

/// One replica's rebuild as the replicator tracks it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tracker {
    started: Instant,
    /// Regions left when it began (the most seen: the set can grow).
    total: u32,
}

impl Tracker {
    pub(crate) fn new(left: u32) -> Tracker {
        Tracker {
            started: Instant::now(),
            total: left,
        }
    }

    /// Regions to copy in all (the most seen).
    pub(crate) fn total(&self) -> u32 {
        self.total
    }

    /// Since it began.
    pub(crate) fn elapsed(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The status with `left` regions of `region_bytes` still to copy.
    pub(crate) fn status(&mut self, replica: &str, left: u32, region_bytes: u64) -> RebuildStatus {
        self.total = self.total.max(left);
        let total_bytes = u64::from(self.total) * region_bytes;
        let done_bytes = u64::from(self.total - left) * region_bytes;
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = if seconds > 0.0 {
            (done_bytes as f64 / seconds) as u64
        } else {
            0
        };
        let left_bytes = total_bytes - done_bytes;
        RebuildStatus {
            replica: replica.to_string(),
            done_bytes,
            total_bytes,
            rate_bytes_per_s: rate,
            eta_s: (rate > 0).then(|| left_bytes.div_ceil(rate)),
        }
    }
}
