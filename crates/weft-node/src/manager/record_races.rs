//! Races on the volume record, made to happen every time: the API path
//! (QoS limits, attach, detach) reads `volumes/<name>`, and while its
//! commit is held at a gate another writer (the primary's replicator,
//! taking a replica that missed writes out of the in-sync set) commits a
//! change of the replication part. Whatever the order, neither change may
//! undo the other: above all, a replica taken out of the in-sync set is
//! never listed in sync again by a writer that read the record before
//! (it could be promoted, and serve stale data).

use super::tests::{pool_with_volume, served_volume, GatedStore, HOST_NQN};
use super::*;
use weft_control::{ReplicaRecord, ReplicaState, ReplicationRecord, Versioned};

/// The record of volume "v" made replicated: primary n1, n2 in sync.
fn make_replicated(desired: &DesiredState) {
    let found: Versioned<VolumeRecord> = desired.read("volumes/v").unwrap().unwrap();
    let member = |node: &str| ReplicaRecord {
        node: node.into(),
        pool: "p".into(),
        state: ReplicaState::InSync,
    };
    let record = VolumeRecord {
        replication: Some(ReplicationRecord {
            epoch: 1,
            primary: "n1".into(),
            members: vec![member("n1"), member("n2")],
            size_bytes: 8 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            move_to: None,
            previous: None,
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure: None,
            cloned_from: None,
        }),
        ..found.record
    };
    desired
        .update("volumes/v", &record, found.revision)
        .unwrap();
}

/// What the replicator does when n2 misses a write: n2 leaves the in-sync
/// set, by compare-and-swap on the record as it reads it now.
fn fault_n2(store: &dyn weft_control::Store) {
    let found: Versioned<VolumeRecord> = weft_control::records::read(store, "volumes/v")
        .unwrap()
        .unwrap();
    let mut record = found.record;
    let replication = record.replication.as_mut().unwrap();
    replication.members[1].state = ReplicaState::Faulted { epoch: 1 };
    let txn = weft_control::Txn::new().update(
        "volumes/v",
        weft_control::records::encode(&record),
        found.revision,
    );
    store
        .commit(txn)
        .expect("the replicator's commit lands first");
}

fn n2_state(desired: &DesiredState) -> ReplicaState {
    let found: Versioned<VolumeRecord> = desired.read("volumes/v").unwrap().unwrap();
    found.record.replication.unwrap().members[1].state
}

/// Runs `op` against a manager whose commit is held until the replicator
/// faulted n2; the record afterwards.
fn raced(test: &str, op: AdminOp) -> VolumeRecord {
    let (desired, dir) = pool_with_volume(test);
    make_replicated(&desired);
    let h2 = weft_control::HostRecord {
        nqn: format!("{HOST_NQN}2"),
        dhchap_secret: None,
        dhchap_ctrl_secret: None,
        tls_psk: None,
        dhchap_group: None,
    };
    desired.create("hosts/h2", &h2).unwrap();
    let gate = Arc::new(GatedStore::closed(Arc::clone(desired.store())));
    let store: Arc<dyn weft_control::Store> = gate.clone();
    let mut manager = tests::idle_manager(DesiredState::shared(store, "n1"));
    let (plane, _controller, _queue) = served_volume(&mut manager);
    let handle = manager.handle();
    manager.spawn(Arc::clone(&plane)).unwrap();
    let admin = std::thread::spawn(move || handle.call(op));
    gate.wait_for_a_commit();
    fault_n2(gate.inner.as_ref());
    gate.open();
    admin.join().unwrap().unwrap();
    assert_eq!(
        n2_state(&desired),
        ReplicaState::Faulted { epoch: 1 },
        "{test}: a replica that missed writes was listed in sync again"
    );
    let found: Versioned<VolumeRecord> = desired.read("volumes/v").unwrap().unwrap();
    std::fs::remove_dir_all(dir).unwrap();
    found.record
}

#[test]
fn a_qos_change_racing_the_replicator_keeps_the_replica_faulted() {
    let changes = QosChanges {
        iops_max: Some(Some(2000)),
        ..QosChanges::default()
    };
    let volume = "v".to_string();
    let record = raced("race-qos", AdminOp::SetQos { volume, changes });
    assert_eq!(record.qos.iops_max, Some(2000), "the QoS change stands too");
}

#[test]
fn an_attach_racing_the_replicator_keeps_the_replica_faulted() {
    let (volume, host) = ("v".to_string(), "h2".to_string());
    let record = raced("race-attach", AdminOp::Attach { volume, host });
    assert!(record.hosts.contains("h2"), "the attachment stands too");
}

#[test]
fn a_detach_racing_the_replicator_keeps_the_replica_faulted() {
    let (volume, host) = ("v".to_string(), "h".to_string());
    let record = raced("race-detach", AdminOp::Detach { volume, host });
    assert!(!record.hosts.contains("h"), "the detachment stands too");
}
