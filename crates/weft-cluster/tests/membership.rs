//! Membership, liveness, election and node changes on the in-memory store
//! with a manual clock: deterministic, no sleeps.

use std::sync::Arc;
use std::time::Duration;
use weft_cluster::membership::{JoinError, Member, MemberConfig, NodeStatus, STATUS_REFRESH_MS};
use weft_cluster::nodes::{self, NodeError, NodeState};
use weft_cluster::{election, PoolSummary};
use weft_control::intercept::{Hook, Intercepted};
use weft_control::{ManualClock, MemoryStore, Revision, Store, StoreError};

const TTL: Duration = Duration::from_secs(5);

fn store() -> (Arc<dyn Store>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    (Arc::new(MemoryStore::with_clock(clock.clone())), clock)
}

fn config(name: &str, node_id: &str) -> MemberConfig {
    MemberConfig {
        name: name.into(),
        node_id: node_id.into(),
        nvme: vec![format!("127.0.0.1:44{}", &name[1..])],
        peer_nvme: Vec::new(),
        api: format!("http://127.0.0.1:94{}", &name[1..]),
        zone: None,
        lease_ttl: TTL,
        certificate: None,
    }
}

fn join(store: &Arc<dyn Store>, name: &str, node_id: &str) -> Member {
    Member::join(store.clone(), config(name, node_id), None, "c1", 0).unwrap()
}

fn state(store: &Arc<dyn Store>, name: &str) -> NodeState {
    nodes::get(store.as_ref(), name).unwrap().state()
}

#[test]
fn nodes_join_one_cluster_and_show_up_with_their_status() {
    let (store, _) = store();
    let mut n1 = join(&store, "n1", "aa");
    let n2 = Member::join(store.clone(), config("n2", "bb"), None, "other", 0).unwrap();
    assert_eq!(n1.cluster_id(), "c1");
    assert_eq!(n2.cluster_id(), "c1", "the first node's cluster id counts");
    let status = NodeStatus {
        pools: vec![PoolSummary {
            name: "fast".into(),
            capacity_bytes: 100,
            allocated_bytes: 10,
            provisioned_bytes: 10,
            failed: false,
            encrypt: false,
        }],
        volumes: 3,
        keys: false,
    };
    assert!(n1.heartbeat(&status, 1000).unwrap(), "first to campaign");
    let listed = nodes::list(store.as_ref()).unwrap();
    assert_eq!(listed.len(), 2);
    let alive = listed["n1"].alive.as_ref().unwrap();
    assert_eq!((alive.heartbeat_unix_ms, alive.volumes), (1000, 3));
    assert_eq!(alive.pools, status.pools);
    assert!(listed["n1"].controller && !listed["n2"].controller);
    assert_eq!(listed["n2"].state(), NodeState::Up);
}

/// Every node watches the liveness records: one written at every heartbeat
/// made 32 nodes 300 watch events a second at rest (PERFORMANCE.md, 17).
#[test]
fn a_status_is_written_when_it_changes_or_is_a_minute_old() {
    let (store, _) = store();
    let mut n1 = join(&store, "n1", "aa");
    let revision =
        |store: &Arc<dyn Store>| store.get("cluster/alive/n1").unwrap().unwrap().revision;
    let joined = revision(&store);
    n1.heartbeat(&NodeStatus::default(), 1000).unwrap();
    n1.heartbeat(&NodeStatus::default(), 2000).unwrap();
    assert_eq!(revision(&store), joined, "unchanged: not written");
    let busier = NodeStatus {
        volumes: 1,
        ..NodeStatus::default()
    };
    n1.heartbeat(&busier, 3000).unwrap();
    let changed = revision(&store);
    assert!(changed > joined, "a change is written at once");
    n1.heartbeat(&busier, 3000 + STATUS_REFRESH_MS - 1).unwrap();
    assert_eq!(revision(&store), changed);
    n1.heartbeat(&busier, 3000 + STATUS_REFRESH_MS).unwrap();
    assert!(
        revision(&store) > changed,
        "written again once a minute old"
    );
    let listed = nodes::list(store.as_ref()).unwrap();
    let alive = listed["n1"].alive.as_ref().unwrap();
    assert_eq!(
        (alive.heartbeat_unix_ms, alive.volumes),
        (3000 + STATUS_REFRESH_MS, 1)
    );
}

#[test]
fn a_node_is_down_once_its_lease_ends_and_up_again_when_it_returns() {
    let (store, clock) = store();
    let mut n1 = join(&store, "n1", "aa");
    let n2 = join(&store, "n2", "bb");
    n1.heartbeat(&NodeStatus::default(), 0).unwrap();
    clock.advance(Duration::from_secs(3));
    n1.heartbeat(&NodeStatus::default(), 3000).unwrap();
    clock.advance(Duration::from_secs(3));
    n1.heartbeat(&NodeStatus::default(), 6000).unwrap();
    assert_eq!(state(&store, "n1"), NodeState::Up, "kept alive");
    assert_eq!(state(&store, "n2"), NodeState::Down, "no heartbeat for 6 s");
    let noted = nodes::note_down_nodes(store.as_ref(), n1.lease(), 6000).unwrap();
    assert_eq!(noted, ["n2"]);
    assert!(nodes::note_down_nodes(store.as_ref(), n1.lease(), 7000)
        .unwrap()
        .is_empty());
    let down = nodes::get(store.as_ref(), "n2").unwrap();
    assert_eq!(down.member.down_since_unix_ms, Some(6000));
    drop(n2);
    // Restarted with its data directory: the same name and node id.
    let n2 = Member::join(store.clone(), config("n2", "bb"), Some("c1"), "x", 9000).unwrap();
    let back = nodes::get(store.as_ref(), "n2").unwrap();
    assert_eq!(back.state(), NodeState::Up);
    assert_eq!(back.member.down_since_unix_ms, None);
    n2.leave().unwrap();
    assert_eq!(
        state(&store, "n2"),
        NodeState::Down,
        "leaving ends the lease at once"
    );
}

#[test]
fn only_a_controller_notes_nodes_down() {
    let (store, clock) = store();
    let mut n1 = join(&store, "n1", "aa");
    let n2 = join(&store, "n2", "bb");
    n1.heartbeat(&NodeStatus::default(), 0).unwrap();
    clock.advance(Duration::from_secs(6));
    n1.heartbeat(&NodeStatus::default(), 6000).unwrap();
    assert!(nodes::note_down_nodes(store.as_ref(), n2.lease(), 6000)
        .unwrap()
        .is_empty());
}

#[test]
fn the_controller_hands_over_when_its_lease_ends() {
    let (store, clock) = store();
    let mut n1 = join(&store, "n1", "aa");
    let mut n2 = join(&store, "n2", "bb");
    assert!(n1.heartbeat(&NodeStatus::default(), 0).unwrap());
    assert!(!n2.heartbeat(&NodeStatus::default(), 0).unwrap());
    // n1 stops; n2 keeps beating.
    for second in 1..=6 {
        clock.advance(Duration::from_secs(1));
        let controller = n2.heartbeat(&NodeStatus::default(), second * 1000).unwrap();
        assert_eq!(controller, second >= 5, "second {second}");
    }
    let current = election::controller(store.as_ref()).unwrap().unwrap();
    assert_eq!((current.node.as_str(), current.since_unix_ms), ("n2", 5000));
    // n1's lease is gone: its next heartbeat joins again, not as controller.
    assert!(!n1.heartbeat(&NodeStatus::default(), 7000).unwrap());
    assert_eq!(state(&store, "n1"), NodeState::Up);
}

#[test]
fn a_name_held_by_another_node_or_a_live_process_is_refused() {
    let (store, clock) = store();
    let n1 = join(&store, "n1", "aa");
    let taken = Member::join(store.clone(), config("n1", "zz"), None, "c1", 0).unwrap_err();
    assert!(
        matches!(taken, JoinError::NameTaken { state: "up", .. }),
        "{taken}"
    );
    assert!(taken.to_string().contains("weft node remove n1"), "{taken}");
    let twice = Member::join(store.clone(), config("n1", "aa"), Some("c1"), "c1", 0).unwrap_err();
    assert!(matches!(twice, JoinError::AlreadyUp { .. }), "{twice}");
    drop(n1);
    clock.advance(TTL);
    let down = Member::join(store.clone(), config("n1", "zz"), None, "c1", 0).unwrap_err();
    assert!(
        matches!(down, JoinError::NameTaken { state: "down", .. }),
        "{down}"
    );
}

#[test]
fn a_data_directory_of_another_cluster_is_refused() {
    let (store, _) = store();
    join(&store, "n1", "aa");
    let error = Member::join(store.clone(), config("n2", "bb"), Some("c9"), "c2", 0).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("belongs to cluster c9"), "{message}");
    assert!(message.contains("holds cluster c1"), "{message}");
    let bad_name = Member::join(store.clone(), config("N_2", "bb"), None, "c1", 0).unwrap_err();
    assert!(bad_name.to_string().contains("not a valid node name"));
}

#[test]
fn cordon_and_remove_follow_the_rules() {
    let (store, clock) = store();
    let n1 = join(&store, "n1", "aa");
    let n2 = join(&store, "n2", "bb");
    nodes::set_cordoned(store.as_ref(), "n2", true).unwrap();
    assert_eq!(state(&store, "n2"), NodeState::Cordoned);
    nodes::set_cordoned(store.as_ref(), "n2", false).unwrap();
    assert_eq!(state(&store, "n2"), NodeState::Up);
    assert!(matches!(
        nodes::set_cordoned(store.as_ref(), "n7", true),
        Err(NodeError::NotFound(_))
    ));
    let up = nodes::remove(store.as_ref(), "n2", vec![], vec![]).unwrap_err();
    assert!(matches!(up, NodeError::Up(_)), "{up}");
    n2.leave().unwrap();
    let holds = nodes::remove(
        store.as_ref(),
        "n2",
        vec!["db1".into(), "db2".into()],
        vec![],
    )
    .unwrap_err();
    assert!(holds.to_string().contains("db1, db2"), "{holds}");
    nodes::remove(store.as_ref(), "n2", vec![], vec![]).unwrap();
    assert!(matches!(
        nodes::get(store.as_ref(), "n2"),
        Err(NodeError::NotFound(_))
    ));
    // The name is free again: a new data directory may take it.
    clock.advance(Duration::from_secs(1));
    Member::join(store.clone(), config("n2", "cc"), None, "c1", 0).unwrap();
    drop(n1);
}

#[test]
fn each_node_keeps_its_own_ordinal_and_a_removed_node_frees_it() {
    let (store, clock) = store();
    let n1 = join(&store, "n1", "aa");
    let n2 = join(&store, "n2", "bb");
    assert_eq!((n1.ordinal(), n2.ordinal()), (0, 1));
    n2.leave().unwrap();
    let n3 = join(&store, "n3", "cc");
    assert_eq!(n3.ordinal(), 2, "n2 is down, not gone: its ordinal stays");
    let n2 = join(&store, "n2", "bb");
    assert_eq!(n2.ordinal(), 1, "back with its ordinal");
    n2.leave().unwrap();
    nodes::remove(store.as_ref(), "n2", vec![], vec![]).unwrap();
    clock.advance(Duration::from_secs(1));
    let n4 = join(&store, "n4", "dd");
    assert_eq!(n4.ordinal(), 1, "n2's ordinal is free again");
    drop((n1, n3));
}

/// Loses the answer of the next commit when told: applied, but answered
/// with an error, as when etcd applies a transaction and the connection
/// breaks before its answer arrives.
struct LosesAnAnswer(std::sync::atomic::AtomicBool);

impl Hook for LosesAnAnswer {
    fn answer(&self, applied: Revision) -> Result<Revision, StoreError> {
        if self.0.swap(false, std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                location: "test".into(),
                message: "the connection broke before the answer".into(),
            });
        }
        Ok(applied)
    }
}

/// Found by the nemesis (an etcd member killed under a heartbeat): a
/// heartbeat whose liveness update landed but whose answer was lost left the
/// node with a stale revision of its own record; every later heartbeat then
/// failed as if another process held the name, so the node's primaries,
/// whose lease was alive in etcd, never heard it renewed and stopped
/// serving, while the cluster still saw the node up (no failover).
#[test]
fn a_heartbeat_whose_answer_was_lost_does_not_stop_the_next_ones() {
    let (inner, _) = store();
    let lose = LosesAnAnswer(std::sync::atomic::AtomicBool::new(false));
    let lossy = Arc::new(Intercepted::new(inner, lose));
    let store: Arc<dyn Store> = lossy.clone();
    let mut n1 = join(&store, "n1", "aa");
    // A status that changes at every heartbeat, so that each writes.
    let status = |at: u64| NodeStatus {
        volumes: (at / 1000) as u32,
        ..NodeStatus::default()
    };
    n1.heartbeat(&status(1000), 1000).unwrap();
    lossy
        .hook()
        .0
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(
        n1.heartbeat(&status(2000), 2000).is_err(),
        "the answer was lost"
    );
    for at in [3000, 4000] {
        n1.heartbeat(&status(at), at).unwrap();
    }
    let listed = nodes::list(store.as_ref()).unwrap();
    assert_eq!(listed["n1"].alive.as_ref().unwrap().heartbeat_unix_ms, 4000);
    // A second process of the name is still refused while this one lives.
    let again = Member::join(store.clone(), config("n1", "aa"), None, "c1", 0);
    assert!(
        matches!(again, Err(JoinError::AlreadyUp { .. })),
        "{again:?}"
    );
}
