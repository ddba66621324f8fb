//! Adding, removing and replacing a replicated volume's replicas on the
//! in-memory store with a manual clock: deterministic, no sleeps.

use std::sync::Arc;
use std::time::Duration;
use weft_cluster::membership::{Member, MemberConfig, NodeStatus};
use weft_cluster::replica_members::{
    finish_retirements, replace_lost_replicas, replace_replicas_on, set_replica_count,
    ReplicaChangeError,
};
use weft_cluster::{nodes, PoolSummary};
use weft_control::records::{encode, read};
use weft_control::{
    ErasureRecord, ManualClock, MemoryStore, ReplicaRecord, ReplicaState, ReplicationRecord, Store,
    Txn, VolumeRecord,
};

const TTL: Duration = Duration::from_secs(5);

fn store() -> (Arc<dyn Store>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    (Arc::new(MemoryStore::with_clock(clock.clone())), clock)
}

fn status() -> NodeStatus {
    NodeStatus {
        pools: vec![PoolSummary {
            name: "p".into(),
            capacity_bytes: 1 << 30,
            allocated_bytes: 0,
            provisioned_bytes: 0,
            failed: false,
            encrypt: false,
        }],
        volumes: 0,
        keys: false,
    }
}

/// Nodes n1..n4 up with a pool each; n1 is the controller.
fn cluster(store: &Arc<dyn Store>) -> Vec<Member> {
    (1..=4)
        .map(|i| {
            let name = format!("n{i}");
            let config = MemberConfig {
                name: name.clone(),
                node_id: format!("id{i}"),
                nvme: vec![format!("127.0.0.1:442{i}")],
                peer_nvme: Vec::new(),
                api: format!("http://127.0.0.1:944{i}"),
                zone: None,
                lease_ttl: TTL,
                certificate: None,
            };
            let mut member = Member::join(store.clone(), config, None, "c1", 0).unwrap();
            member.heartbeat(&status(), 0).unwrap();
            member
        })
        .collect()
}

/// Volume "db" on n1 (primary) and n2, both in sync.
fn volume(store: &Arc<dyn Store>) {
    let member = |node: &str| ReplicaRecord {
        node: node.into(),
        pool: "p".into(),
        state: ReplicaState::InSync,
    };
    let record = VolumeRecord {
        id: "ab".into(),
        node: Some("n1".into()),
        pool: Some("p".into()),
        replication: Some(ReplicationRecord {
            epoch: 1,
            primary: "n1".into(),
            members: vec![member("n1"), member("n2")],
            size_bytes: 1 << 20,
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
        ..VolumeRecord::default()
    };
    let txn = Txn::new().create("volumes/db", encode(&record));
    store.commit(txn).unwrap();
}

fn members(store: &Arc<dyn Store>) -> Vec<(String, ReplicaState)> {
    let found = read::<VolumeRecord>(store.as_ref(), "volumes/db")
        .unwrap()
        .unwrap();
    let replication = found.record.replication.unwrap();
    replication
        .members
        .into_iter()
        .map(|m| (m.node, m.state))
        .collect()
}

/// What the primary does with a retired replica: takes it out of the in-sync set.
fn fault(store: &Arc<dyn Store>, node: &str) {
    let found = read::<VolumeRecord>(store.as_ref(), "volumes/db")
        .unwrap()
        .unwrap();
    let mut record = found.record;
    let replication = record.replication.as_mut().unwrap();
    let member = replication
        .members
        .iter_mut()
        .find(|m| m.node == node)
        .unwrap();
    member.state = ReplicaState::Faulted { epoch: 1 };
    let txn = Txn::new().update("volumes/db", encode(&record), found.revision);
    store.commit(txn).unwrap();
}

fn retiring(store: &Arc<dyn Store>) -> Vec<String> {
    let found = read::<VolumeRecord>(store.as_ref(), "volumes/db")
        .unwrap()
        .unwrap();
    found.record.replication.unwrap().retire
}

#[test]
fn replicas_are_added_as_never_in_sync_and_retired_least_useful_first() {
    let (store, _) = store();
    let _members = cluster(&store);
    volume(&store);
    let change = set_replica_count(store.as_ref(), "db", 3).unwrap();
    assert_eq!(change.added.len(), 1);
    let added = change.added[0].node.clone();
    assert!(added == "n3" || added == "n4", "{added}");
    let now = members(&store);
    assert_eq!(now[2], (added.clone(), ReplicaState::Faulted { epoch: 0 }));
    // Unchanged: nothing written.
    let same = set_replica_count(store.as_ref(), "db", 3).unwrap();
    assert!(same.added.is_empty() && same.removed.is_empty());
    // Down to one: the faulted (new) one first, then the other; never the
    // primary. Retired: the faulted one leaves at once, the in-sync one
    // once the primary took it out of the in-sync set.
    let change = set_replica_count(store.as_ref(), "db", 1).unwrap();
    assert_eq!(change.removed, vec![added, "n2".to_string()]);
    assert!(!finish_retirements(store.as_ref(), "db").unwrap());
    assert_eq!(members_of(&store), vec!["n1", "n2"]);
    assert_eq!(retiring(&store), vec!["n2"]);
    // Asked for two again meanwhile: n2 is kept, nothing is added.
    let kept = set_replica_count(store.as_ref(), "db", 2).unwrap();
    assert!(kept.added.is_empty() && retiring(&store).is_empty());
    set_replica_count(store.as_ref(), "db", 1).unwrap();
    fault(&store, "n2");
    assert!(finish_retirements(store.as_ref(), "db").unwrap());
    assert_eq!(members(&store), vec![("n1".into(), ReplicaState::InSync)]);
    assert!(matches!(
        set_replica_count(store.as_ref(), "db", 4),
        Err(ReplicaChangeError::Count(4))
    ));
    assert!(matches!(
        set_replica_count(store.as_ref(), "nope", 2),
        Err(ReplicaChangeError::NotFound(_))
    ));
}

#[test]
fn a_replica_down_past_the_delay_is_replaced_only_while_the_primary_is_up() {
    let (store, clock) = store();
    let mut members = cluster(&store);
    volume(&store);
    // n2 stops heartbeating; the others go on.
    let beat = |members: &mut Vec<Member>, ms: u64| {
        for member in members.iter_mut().filter(|m| m.name() != "n2") {
            member.heartbeat(&status(), ms).unwrap();
        }
    };
    clock.advance(Duration::from_secs(3));
    beat(&mut members, 3000);
    clock.advance(Duration::from_secs(3));
    beat(&mut members, 6000);
    let controller = members[0].lease();
    nodes::note_down_nodes(store.as_ref(), controller, 6000).unwrap();
    let replaced = replace_lost_replicas(store.as_ref(), controller, 7000, 10_000).unwrap();
    assert!(replaced.is_empty(), "not down long enough yet");
    let replaced = replace_lost_replicas(store.as_ref(), controller, 16_000, 10_000).unwrap();
    assert_eq!(replaced.len(), 1);
    let change = replaced[0].1.as_ref().unwrap();
    assert_eq!(change.removed, vec!["n2".to_string()]);
    assert_eq!(change.added.len(), 1);
    // Retired once: the next beats add nothing more.
    assert!(
        replace_lost_replicas(store.as_ref(), controller, 17_000, 10_000)
            .unwrap()
            .is_empty()
    );
    fault(&store, "n2");
    assert!(finish_retirements(store.as_ref(), "db").unwrap());
    let now = members_of(&store);
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|n| n != "n2"), "{now:?}");
    // Only the controller does it.
    let n3 = members[2].lease();
    assert!(replace_lost_replicas(store.as_ref(), n3, 99_000, 0)
        .unwrap()
        .is_empty());
    // The primary's node down: no replica changes (a down primary and an
    // in-sync replica: either may be the copy to come back).
    for ms in [9000, 12_000] {
        clock.advance(Duration::from_secs(3));
        for member in members.iter_mut().skip(2) {
            member.heartbeat(&status(), ms).unwrap();
        }
    }
    let refused = set_replica_count(store.as_ref(), "db", 1).unwrap_err();
    assert!(
        matches!(refused, ReplicaChangeError::PrimaryDown { .. }),
        "{refused}"
    );
}

#[test]
fn a_lost_node_cannot_give_up_a_primary() {
    let (store, _) = store();
    let _members = cluster(&store);
    volume(&store);
    let refused = replace_replicas_on(store.as_ref(), "n1").unwrap_err();
    assert!(matches!(refused, ReplicaChangeError::HoldsPrimary { .. }));
    assert!(refused.to_string().contains("start n1 again"), "{refused}");
    let replaced = replace_replicas_on(store.as_ref(), "n2").unwrap();
    assert_eq!(replaced[0].0, "db");
    assert_eq!(retiring(&store), vec!["n2"]);
    assert_eq!(members_of(&store).len(), 3, "a new replica beside");
}

fn members_of(store: &Arc<dyn Store>) -> Vec<String> {
    members(store).into_iter().map(|(node, _)| node).collect()
}

/// Volume "ec", erasure-coded 2+1: n1 (primary), n2, n3, all in sync.
fn erasure_coded_volume(store: &Arc<dyn Store>) {
    let member = |node: &str| ReplicaRecord {
        node: node.into(),
        pool: "p".into(),
        state: ReplicaState::InSync,
    };
    let record = VolumeRecord {
        id: "ec".into(),
        node: Some("n1".into()),
        pool: Some("p".into()),
        replication: Some(ReplicationRecord {
            epoch: 1,
            primary: "n1".into(),
            members: vec![member("n1"), member("n2"), member("n3")],
            size_bytes: 1 << 20,
            block_size: 4096,
            thick: false,
            encrypted: false,
            move_to: None,
            previous: None,
            retire: Vec::new(),
            snapshots: Vec::new(),
            erasure: Some(ErasureRecord {
                data_shards: 2,
                parity_shards: 1,
                chunk_bytes: 65536,
                journal_slots: 64,
            }),
            cloned_from: None,
        }),
        ..VolumeRecord::default()
    };
    let txn = Txn::new().create("volumes/ec", encode(&record));
    store.commit(txn).unwrap();
}

fn erasure_members(store: &Arc<dyn Store>) -> ReplicationRecord {
    let found = read::<VolumeRecord>(store.as_ref(), "volumes/ec")
        .unwrap()
        .unwrap();
    found.record.replication.unwrap()
}

#[test]
fn an_erasure_coded_member_lost_for_good_is_replaced_in_its_place() {
    let (store, clock) = store();
    let mut members = cluster(&store);
    erasure_coded_volume(&store);
    // Its members are one per shard: their count is not the operator's.
    let refused = set_replica_count(store.as_ref(), "ec", 2).unwrap_err();
    assert!(
        matches!(refused, ReplicaChangeError::ErasureCoded { .. }),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("erasure-coded (2+1)"),
        "{refused}"
    );
    // n2 removed for good: n4 takes its place (the same shard), to be
    // rebuilt in full; nothing is retired.
    let replaced = replace_replicas_on(store.as_ref(), "n2").unwrap();
    assert_eq!(replaced[0].0, "ec");
    let record = erasure_members(&store);
    let nodes: Vec<&str> = record.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(nodes, ["n1", "n4", "n3"]);
    assert_eq!(record.members[1].state, ReplicaState::Faulted { epoch: 0 });
    assert!(record.retire.is_empty());
    assert!(record.erasure.is_some());
    // The primary rebuilds n4 and puts it in sync.
    let found = read::<VolumeRecord>(store.as_ref(), "volumes/ec")
        .unwrap()
        .unwrap();
    let mut rebuilt = found.record;
    rebuilt.replication.as_mut().unwrap().members[1].state = ReplicaState::InSync;
    let txn = Txn::new().update("volumes/ec", encode(&rebuilt), found.revision);
    store.commit(txn).unwrap();
    // n3 down past the delay: the controller puts it in the one node not
    // among the members (n2, still up in this store).
    for ms in [3000, 6000] {
        clock.advance(Duration::from_secs(3));
        for member in members.iter_mut().filter(|m| m.name() != "n3") {
            member.heartbeat(&status(), ms).unwrap();
        }
    }
    let controller = members[0].lease();
    nodes::note_down_nodes(store.as_ref(), controller, 6000).unwrap();
    let replaced = replace_lost_replicas(store.as_ref(), controller, 16_000, 10_000).unwrap();
    assert_eq!(replaced.len(), 1, "{replaced:?}");
    let record = erasure_members(&store);
    let nodes: Vec<&str> = record.members.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(nodes, ["n1", "n4", "n2"]);
    assert_eq!(record.primary, "n1");
    // Now n1 and n4 are in sync (n2 is to be rebuilt): n4 cannot be
    // replaced, since n1 alone (k = 2) could not rebuild it.
    let refused = replace_replicas_on(store.as_ref(), "n4").unwrap_err();
    assert!(
        matches!(
            refused,
            ReplicaChangeError::TooFewInSync {
                in_sync: 1,
                needed: 2,
                ..
            }
        ),
        "{refused}"
    );
    assert!(
        refused
            .to_string()
            .contains("start the lost members' nodes again"),
        "{refused}"
    );
}
