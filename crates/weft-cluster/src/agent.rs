//! The thread that keeps a node in the cluster: a heartbeat every third of
//! the lease's time to live (keeping the lease alive and publishing the
//! node's pools and volume count), and, while this node is the controller,
//! its duties (noting nodes that went down, promoting a new primary for
//! replicated volumes whose primary's node is down). It never touches the data
//! plane: a store that is unreachable only delays heartbeats, and the node
//! shows down in the cluster until they succeed again.

use crate::lease::LeaseClock;
use crate::membership::{JoinError, Member, NodeStatus};
use crate::{nodes, replicas};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use weft_control::Store;

/// The running heartbeat; [`Agent::stop`] leaves the cluster.
#[derive(Debug)]
pub struct Agent {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Agent {
    /// Starts heartbeats for `member`; `status` is asked for the node's
    /// pools and volumes at each one; each successful one renews `lease`.
    pub fn start(
        member: Member,
        store: Arc<dyn Store>,
        interval: Duration,
        status: impl Fn() -> NodeStatus + Send + 'static,
        lease: Arc<LeaseClock>,
    ) -> std::io::Result<Agent> {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("cluster-agent".into())
            .spawn(move || {
                let mut member = member;
                let mut failing = false;
                loop {
                    let sent = Instant::now();
                    if beat(&mut member, store.as_ref(), &status(), &mut failing) {
                        lease.renewed(sent, member.lease_ttl());
                    }
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
                let name = member.name().to_string();
                match member.leave() {
                    Ok(()) => log::info!("node {name} left the cluster (shown down)"),
                    Err(error) => log::warn!("node {name} leaving the cluster: {error}"),
                }
            })?;
        Ok(Agent { stop, thread })
    }

    /// Stops the heartbeats and ends the node's lease.
    pub fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// How long after a node is noted down the controller promotes new
/// primaries for its volumes: its lease already ended in the store, this
/// covers clock-rate differences between the nodes.
pub const PROMOTION_DELAY: Duration = Duration::from_millis(500);

/// One heartbeat and, for the controller, its duties. Failures are logged
/// once until the next success. Whether the lease was kept alive.
fn beat(member: &mut Member, store: &dyn Store, status: &NodeStatus, failing: &mut bool) -> bool {
    let now = unix_ms();
    let mut renewed = false;
    let result = member.heartbeat(status, now).and_then(|controller| {
        renewed = true;
        if controller {
            let noted = nodes::note_down_nodes(store, member.lease(), now)?;
            if !noted.is_empty() {
                // Promote in this beat rather than the next (a third of the
                // lease later): failover is the lease plus this delay.
                std::thread::sleep(PROMOTION_DELAY);
            }
            let delay = PROMOTION_DELAY.as_millis() as u64;
            replicas::promote_primaries(store, member.lease(), unix_ms(), delay)?;
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
    renewed
}

/// Milliseconds since the Unix epoch (what records show as times).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
