//! A clean shutdown (SIGTERM or SIGINT of `weft serve`), before the node
//! leaves its cluster: its replicators stop first (host I/O on them ends
//! with an ANA path status and is retried on another path; the cluster
//! promotes another primary once the node has left), then every replicated
//! volume's write gate closes for good and waits for the writes in flight,
//! the pools are flushed, and each replica's write intent file records the
//! clean shutdown. A node that boots again then finds its replicas clean
//! rather than possibly power-lost: no full rebuild after a planned reboot.
//!
//! What this does not do: hand the primary roles over first (`weft node
//! drain` does, and is the way to restart a node with no failover pause).

use super::{AdminError, Manager};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the replicators get to finish what they hold.
const REPLICATORS_STOP: Duration = Duration::from_secs(5);

impl Manager {
    /// Flushes every pool.
    pub(super) fn flush_pools(&mut self) -> Result<(), AdminError> {
        for (name, pool) in &mut self.pools {
            let result = pool.flush();
            super::note_pool_failure(pool, &self.health[name]);
            result?;
        }
        Ok(())
    }

    /// See the module's documentation.
    pub(super) fn shut_down(&mut self) -> Result<(), AdminError> {
        self.shut_down = true;
        for replicator in self.replicators.values() {
            replicator.stop();
        }
        let deadline = Instant::now() + REPLICATORS_STOP;
        while self.replicators.values().any(|r| r.is_running()) {
            if Instant::now() >= deadline {
                log::warn!("replicators still running {REPLICATORS_STOP:?} after being stopped: the replicas are not marked clean");
                return self.flush_pools();
            }
            // Their local I/O's slow path is this thread's (refused now:
            // what they hold ends with a path error, retried elsewhere).
            self.serve_waiting_io();
            std::thread::sleep(Duration::from_millis(10));
        }
        // Writes to replicated volumes: those in flight drain, later ones
        // go to this (manager) thread, which refuses them from now on.
        let gates: Vec<Arc<weft_volume::map::WriteGate>> = self
            .pools
            .values()
            .flat_map(|pool| pool.volumes())
            .filter(|volume| self.intents.contains_key(&volume.name))
            .map(|volume| Arc::clone(&volume.gate))
            .collect();
        for gate in &gates {
            // Closed until the process exits.
            std::mem::forget(gate.quiesce());
        }
        self.flush_pools()?;
        for (volume, intent) in &self.intents {
            match intent.mark_shut_down() {
                Ok(true) => log::info!("volume {volume}: replica shut down cleanly"),
                Ok(false) => {}
                Err(error) => log::warn!(
                    "volume {volume}: cannot record the clean shutdown of its replica: {error}"
                ),
            }
        }
        Ok(())
    }
}
