//! The replicated volumes this node is the primary of: a replicator each
//! (see `crate::replication`), started when the record names this node
//! primary and none runs, stopped with the volume. Every replicated volume's
//! backend carries a path (`Replicated`) so that no write of a replicated
//! volume can reach the local copy alone: the replicator's when one runs,
//! else one that refuses everything.

use super::intents::intent_of;
use super::replicas::node_host_nqn;
use super::Manager;
use crate::erasure::server::ErasureSetup;
use crate::replication::replicator::{self, ReplicatorSetup};
use std::path::PathBuf;
use std::sync::Arc;
use weft_control::VolumeRecord;
use weft_proto::ana::AnaState;
use weft_proto::IoError;
use weft_target::replicated::{Replicated, ReplicatedIo, ReplicatedSink, Serving};
use weft_target::{VolumeBackend, VolumeOutcome};

/// The path of a replicated volume this node does not serve.
struct Refuse;

impl ReplicatedSink for Refuse {
    fn submit(&self, io: ReplicatedIo) {
        io.reply
            .send(VolumeOutcome::Done(Err(IoError::PathInaccessible)));
    }
}

fn refusing() -> Arc<Replicated> {
    let path = Replicated::new(Box::new(Refuse));
    path.set_serving(Serving::Inaccessible);
    Arc::new(path)
}

impl Manager {
    /// The data plane's path for replicated volume `name` (none for a
    /// volume of one copy): its replicator's, started if this node is its
    /// primary and none runs, else one that refuses everything. A
    /// replicator whose copy changed under it (grown: a new chunk map)
    /// ends by itself, and the reconcile after that starts another.
    pub(super) fn replicated_path(
        &mut self,
        name: &str,
        record: &VolumeRecord,
        backend: &Arc<VolumeBackend>,
        members: &[PathBuf],
        local_size_bytes: u64,
    ) -> Option<Arc<Replicated>> {
        let replication = record.replication.as_ref()?;
        if replication.erasure.is_some() {
            return Some(self.erasure_path(name, record));
        }
        let me = self.cluster_node.clone();
        let (Some(me), Some(lease)) = (me, self.cluster_lease.clone()) else {
            return Some(refusing());
        };
        if replication.primary != me {
            if let Some(running) = self.replicators.remove(name) {
                running.stop();
            }
            return Some(refusing());
        }
        if let Some(running) = self.replicators.get(name).filter(|r| r.is_running()) {
            return Some(Arc::clone(&running.path));
        }
        if self.shut_down {
            return Some(refusing());
        }
        let found = self
            .desired
            .read::<VolumeRecord>(&format!("volumes/{name}"));
        let Ok(Some(found)) = found else {
            return Some(refusing());
        };
        let volume_id = found.record.id.clone();
        let replication = found.record.replication?;
        if local_size_bytes < replication.size_bytes {
            // The volume grew while this copy was out of sync: the
            // reconcile grows it first (`grow_copies_to_records`).
            log::info!("volume {name}: this node's copy is smaller than the volume; it grows before it serves");
            return Some(refusing());
        }
        let dir = self.cluster_dir.clone()?;
        intent_of(&mut self.intents, Some(&dir), name, local_size_bytes)?;
        let setup = ReplicatorSetup {
            volume: name.to_string(),
            volume_id,
            me: me.clone(),
            revision: found.revision.0,
            replication,
            backend: Arc::clone(backend),
            members: members.to_vec(),
            intent: Arc::clone(&self.intents[name]),
            desired: self.desired.clone(),
            lease,
            connect: weft_initiator::ConnectOptions {
                host_nqn: node_host_nqn(&me),
                ..weft_initiator::ConnectOptions::default()
            },
            link_keys: self.link_keys.clone()?,
            manager: Arc::new(self.handle.clone()),
            dir,
            published: Arc::clone(&self.published),
            rebuild_bytes_per_s: self.rebuild_bytes_per_s,
            plane: self.plane.clone(),
        };
        match replicator::start(setup) {
            Ok(running) => {
                let path = Arc::clone(&running.path);
                self.replicators.insert(name.to_string(), running);
                Some(path)
            }
            Err(error) => {
                log::error!("volume {name}: cannot start its replicator: {error}");
                Some(refusing())
            }
        }
    }

    /// The ANA state of a replicated volume's path through this node.
    pub(super) fn replicated_ana_state(path: &Replicated) -> AnaState {
        match path.serving() {
            Serving::Yes | Serving::Resyncing => AnaState::Optimized,
            Serving::Transition => AnaState::Change,
            Serving::Inaccessible => AnaState::Inaccessible,
        }
    }

    /// Stops the replicator of `name`, if one runs (the volume is deleted).
    pub(super) fn stop_replicator(&mut self, name: &str) {
        if let Some(running) = self.replicators.remove(name) {
            running.stop();
        }
        if let Some(running) = self.erasures.remove(name) {
            running.stop();
        }
    }

    /// The path of erasure-coded volume `name` through this node: its
    /// primary's (started if the record names this node and none runs),
    /// else one that refuses everything. The local volume is a member's
    /// shard: nothing reads or writes it but through the primary.
    fn erasure_path(&mut self, name: &str, record: &VolumeRecord) -> Arc<Replicated> {
        let replication = record.replication.as_ref().expect("replicated");
        let me = self.cluster_node.clone();
        let (Some(me), Some(lease)) = (me, self.cluster_lease.clone()) else {
            return refusing();
        };
        if replication.primary != me {
            if let Some(running) = self.erasures.remove(name) {
                running.stop();
            }
            return refusing();
        }
        if let Some(running) = self.erasures.get(name).filter(|r| r.is_running()) {
            return Arc::clone(&running.path);
        }
        if self.shut_down {
            return refusing();
        }
        let found = self
            .desired
            .read::<VolumeRecord>(&format!("volumes/{name}"));
        let (Ok(Some(found)), Some(dir), Some(link_keys)) =
            (found, self.cluster_dir.clone(), self.link_keys.clone())
        else {
            return refusing();
        };
        let Some(replication) = found.record.replication else {
            return refusing();
        };
        let setup = ErasureSetup {
            volume: name.to_string(),
            me: me.clone(),
            replication,
            revision: found.revision.0,
            desired: self.desired.clone(),
            lease,
            connect: weft_initiator::ConnectOptions {
                host_nqn: node_host_nqn(&me),
                ..weft_initiator::ConnectOptions::default()
            },
            link_keys,
            manager: Arc::new(self.handle.clone()),
            dir,
            rebuild_bytes_per_s: self.rebuild_bytes_per_s,
            published: Arc::clone(&self.published),
        };
        match crate::erasure::server::start(setup) {
            Ok(running) => {
                let path = Arc::clone(&running.path);
                self.erasures.insert(name.to_string(), running);
                path
            }
            Err(error) => {
                log::error!("volume {name}: cannot start its primary: {error}");
                refusing()
            }
        }
    }
}
