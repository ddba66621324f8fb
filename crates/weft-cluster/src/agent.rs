//! The thread that keeps a node in the cluster: a heartbeat every third of
//! the lease's time to live (keeping the lease alive and publishing the
//! node's pools and volume count), and, while this node is the controller,
//! its duties (noting nodes that went down, promoting a new primary for
//! replicated volumes whose primary's node is down, replacing replicas
//! whose node stayed down past the replace delay). It never touches the data
//! plane: a store that is unreachable only delays heartbeats, and the node
//! shows down in the cluster until they succeed again.

use crate::lease::LeaseClock;
use crate::membership::{JoinError, Member, NodeStatus};
use crate::{nodes, replica_members, replicas};
use std::collections::BTreeSet;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weft_control::Store;

/// The running heartbeat; [`Agent::stop`] leaves the cluster.
#[derive(Debug)]
pub struct Agent {
    signals: Sender<Signal>,
    thread: JoinHandle<()>,
}

/// What the agent's thread is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// Leave the cluster.
    Stop,
    /// A node's liveness record ended: beat now (as the controller, note it
    /// down and promote) rather than at the next interval.
    Wake,
}

impl Agent {
    /// Starts heartbeats for `member`; `status` is asked for the node's
    /// pools and volumes at each one; each successful one renews `lease`.
    /// As the controller, it replaces replicas whose node has been down
    /// for `replace_after`.
    pub fn start(
        member: Member,
        store: Arc<dyn Store>,
        interval: Duration,
        status: impl Fn() -> NodeStatus + Send + 'static,
        lease: Arc<LeaseClock>,
        replace_after: Duration,
    ) -> std::io::Result<Agent> {
        let (signals, received) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("cluster-agent".into())
            .spawn(move || {
                let mut member = member;
                let mut state = BeatState {
                    failing: false,
                    replace_after_ms: replace_after.as_millis() as u64,
                    unplaced: BTreeSet::new(),
                };
                loop {
                    let sent = Instant::now();
                    let ttl = member.lease_ttl();
                    let renewed = || lease.renewed(sent, ttl);
                    beat(&mut member, store.as_ref(), &status(), &mut state, &renewed);
                    match received.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) | Ok(Signal::Wake) => {}
                        Ok(Signal::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                let name = member.name().to_string();
                match member.leave() {
                    Ok(()) => log::info!("node {name} left the cluster (shown down)"),
                    Err(error) => log::warn!("node {name} leaving the cluster: {error}"),
                }
            })?;
        Ok(Agent { signals, thread })
    }

    /// Follows `changes` (keys changed in `store`, this node's copy of the
    /// cluster's) on a thread of its own: when a node's liveness record
    /// ends, the agent beats at once, so that the controller notes the node
    /// down and promotes new primaries for its volumes without waiting up
    /// to a heartbeat interval (a third of the lease).
    pub fn wake_on_departures(
        &self,
        changes: mpsc::Receiver<String>,
        store: Arc<dyn Store>,
    ) -> std::io::Result<()> {
        let signals = self.signals.clone();
        std::thread::Builder::new()
            .name("cluster-departures".into())
            .spawn(move || {
                for key in changes {
                    let ended = key.starts_with(crate::records::ALIVE_PREFIX)
                        && matches!(store.get(&key), Ok(None));
                    if ended && signals.send(Signal::Wake).is_err() {
                        break;
                    }
                }
            })
            .map(drop)
    }

    /// Stops the heartbeats and ends the node's lease.
    pub fn stop(self) {
        let _ = self.signals.send(Signal::Stop);
        let _ = self.thread.join();
    }
}

/// How long after a node is noted down the controller promotes new
/// primaries for its volumes: its lease already ended in the store, this
/// covers clock-rate differences between the nodes.
pub const PROMOTION_DELAY: Duration = Duration::from_millis(500);

/// How long a replica's node may stay down before the controller replaces
/// the replica by default (Ceph marks an OSD out after 10 minutes).
pub const REPLACE_AFTER_DEFAULT: Duration = Duration::from_secs(600);

/// What the heartbeats remember between beats.
struct BeatState {
    /// Heartbeats fail (logged once until the next success).
    failing: bool,
    replace_after_ms: u64,
    /// Replicas that found no new place (logged once until they do).
    unplaced: BTreeSet<String>,
}

/// One heartbeat and, for the controller, its duties. Failures are logged
/// once until the next success. Calls `renewed` once the lease was kept
/// alive.
fn beat(
    member: &mut Member,
    store: &dyn Store,
    status: &NodeStatus,
    state: &mut BeatState,
    renewed: &dyn Fn(),
) {
    let now = unix_ms();
    let failing = &mut state.failing;
    let unplaced = &mut state.unplaced;
    let replace_after_ms = state.replace_after_ms;
    let result = member
        .heartbeat_renewing(status, now, renewed)
        .and_then(|controller| {
            // The lease lives from the keep-alive on: the primaries hear so now,
            // not after the controller's work below (store reads and writes, a
            // promotion's delay), which a store slowed by its disk can stretch
            // past the lease, deposing primaries whose lease is alive.
            renewed();
            if controller {
                let noted = nodes::note_down_nodes(store, member.lease(), now)?;
                if !noted.is_empty() {
                    // Promote in this beat rather than the next (a third of the
                    // lease later): failover is the lease plus this delay.
                    std::thread::sleep(PROMOTION_DELAY);
                }
                let delay = PROMOTION_DELAY.as_millis() as u64;
                replicas::promote_primaries(store, member.lease(), unix_ms(), delay)?;
                let replaced = replica_members::replace_lost_replicas(
                    store,
                    member.lease(),
                    now,
                    replace_after_ms,
                )?;
                note_replacements(replaced, unplaced);
                replica_members::finish_all_retirements(store)?;
            }
            Ok(())
        });
    match result {
        Ok(()) if *failing => {
            log::info!("heartbeats of node {} succeed again", member.name());
            *failing = false;
        }
        Ok(()) => {}
        Err(error) if !*failing => {
            let what = match error {
                JoinError::Store(_) => {
                    "volumes keep serving; the cluster shows this node down until the store is back"
                }
                _ => "the cluster shows this node down",
            };
            log::error!("heartbeat of node {}: {error}; {what}", member.name());
            *failing = true;
        }
        Err(_) => {}
    }
}

/// Logs replacements that found no place once (until they do).
fn note_replacements(outcomes: Vec<replica_members::Replacement>, unplaced: &mut BTreeSet<String>) {
    for (volume, outcome) in outcomes {
        match outcome {
            Ok(_) => {
                unplaced.remove(&volume);
            }
            Err(error) => {
                if unplaced.insert(volume.clone()) {
                    log::warn!(
                        "volume {volume}: a replica on a lost node cannot be replaced yet: {error}"
                    );
                }
            }
        }
    }
}

/// Milliseconds since the Unix epoch (what records show as times).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::MemberConfig;
    use std::sync::Mutex;
    use weft_control::intercept::{Call, Hook, Intercepted};
    use weft_control::{MemoryStore, StoreError};

    /// Notes each read, commit and keep-alive, in order, in a log the test shares.
    struct Noting(Arc<Mutex<Vec<&'static str>>>);

    impl Hook for Noting {
        fn before(&self, call: Call, _inner: &Arc<dyn Store>) -> Result<(), StoreError> {
            if matches!(
                call,
                Call::Get | Call::List | Call::Commit | Call::KeepAlive
            ) {
                self.0.lock().unwrap().push(call.name());
            }
            Ok(())
        }
    }

    #[test]
    fn the_lease_is_renewed_before_the_controller_s_duties() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let store: Arc<dyn Store> = Arc::new(Intercepted::new(
            Arc::new(MemoryStore::default()),
            Noting(log.clone()),
        ));
        let config = MemberConfig {
            name: "n1".into(),
            node_id: "aa".into(),
            nvme: vec!["127.0.0.1:4420".into()],
            peer_nvme: Vec::new(),
            api: "http://127.0.0.1:9400".into(),
            zone: None,
            lease_ttl: Duration::from_secs(3),
            certificate: None,
        };
        let mut member = Member::join(store.clone(), config, None, "c1", 0).unwrap();
        let mut state = BeatState {
            failing: false,
            replace_after_ms: 60_000,
            unplaced: BTreeSet::new(),
        };
        let renewed = || log.lock().unwrap().push("renewed");
        // The first beat makes n1 the controller; the second, logged, has its duties.
        for _ in 0..2 {
            log.lock().unwrap().clear();
            let status = NodeStatus::default();
            beat(&mut member, store.as_ref(), &status, &mut state, &renewed);
        }
        let calls = log.lock().unwrap().clone();
        let at = calls.iter().position(|&c| c == "renewed").expect("renewed");
        assert_eq!(
            calls[at - 1],
            "keep_alive",
            "renewed as soon as the lease was kept alive, before the liveness record's update: {calls:?}"
        );
        assert!(
            calls[at + 1..].contains(&"list"),
            "the controller's store reads come after the renewal: {calls:?}"
        );
    }
}
