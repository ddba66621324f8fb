//! Replicated volumes' data path on their primary: the replicator (a
//! reactor's guest) that drives the replication core
//! (`weft_replication::Primary`) for one volume, the links that carry its
//! messages to the replicas' nodes over NVMe/TCP, and its access to the
//! local copy.
//!
//! - [`replicator`]: its turns, its events and its actions.
//! - [`link`]: one primary session with one replica (connect, fence, read
//!   the write intent, then writes, copies, flushes and cleans in order).
//! - [`links`]: the replicator's links, and ended sessions' sockets until
//!   their operations completed.
//! - [`link_socket`]: a link's NVMe/TCP connection on the replicator's ring.
//! - [`local`]: the primary's own copy, read and written by a few worker threads.
//! - [`durable`]: the primary's write intent and run file, written by a thread.
//! - [`write_ring`]: the replicator's ring: its mapped local writes, all in
//!   flight at once, its links' socket I/O, and its wait for them and for
//!   its inbox's events.
//! - [`progress`]: the rebuilds' progress as `volume show` and `/metrics` read it.
//! - [`barrier`]: a snapshot taken, or a growth made, at one point of the
//!   write stream on every copy in sync.
//! - [`records`]: its changes to the volume record's replication part.
//!
//! The dependency runs one way: the manager starts replicators and holds
//! their handles; a replicator reaches the manager only through
//! [`NodeServices`], the store through `weft_control`, the data plane
//! through `weft_target`, and shares [`crate::intents`] (the write intent
//! files) and [`crate::admin_error`] with the manager.
//!
//! What this does not do: decide who is primary (the cluster controller
//! promotes, `weft_cluster::replicas`), or serve reads (the reactors do,
//! while the replicator says this node serves).

pub(crate) mod barrier;
mod durable;
mod link;
mod link_socket;
mod links;
mod local;
pub(crate) mod progress;
pub(crate) mod records;
pub(crate) mod replicator;
pub(crate) mod run;
mod write_ring;

use crate::admin_error::AdminError;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use weft_control::ReplicationRecord;
use weft_replication::{FromReplica, NodeId};
use weft_target::replicated::ReplicatedIo;

/// The subsystem through which a volume's primary writes to the replica on
/// another node: private (never in a discovery log, only the cluster's
/// nodes may connect) and fenced (only the primary session holding the
/// fence may run I/O).
pub fn replica_nqn(volume: &str) -> String {
    format!("{REPLICA_NQN_PREFIX}{volume}")
}

const REPLICA_NQN_PREFIX: &str = "nqn.2026-11.io.weft:replica:";

/// The volume whose replica subsystem `nqn` is, if it is one.
pub(crate) fn replica_volume(nqn: &str) -> Option<&str> {
    nqn.strip_prefix(REPLICA_NQN_PREFIX)
}

/// What a replicator asks of its node's volume manager (the manager's
/// handle implements it): the one way from here to the manager.
pub(crate) trait NodeServices: Send + Sync + std::fmt::Debug {
    /// Converge the node again: the replicator's serving changed (the ANA
    /// states follow), or it finished (the next primary may begin).
    fn reconcile(&self);
    /// Converge again, then answer `reply` (a growth recorded: served at its new size).
    fn reconcile_then_answer(&self, reply: Sender<Result<(), AdminError>>);
    /// A change to this node's copy (a snapshot, a growth), answered on the request's reply.
    fn change_copy(&self, request: weft_target::VolumeRequest);
}

/// A replicator's inbox as its senders hold it: a channel, and an eventfd
/// rung with each event, which wakes the replicator from its ring (where it
/// also waits for its local writes and its links' sockets, see [`write_ring`]).
#[derive(Clone, Debug)]
pub(crate) struct Events {
    sender: Sender<Event>,
    doorbell: Arc<Doorbell>,
}

/// A replicator's inbox as it reads it.
pub(crate) struct Inbox {
    pub(crate) receiver: Receiver<Event>,
    /// What its senders ring.
    pub(crate) doorbell: Arc<Doorbell>,
}

/// The eventfd that wakes a replicator, written only when no wake-up is
/// pending (written, not yet read): a burst of events (a reactor's batch
/// of host writes) costs one write(2) and one wake-up, not one each.
#[derive(Debug)]
pub(crate) struct Doorbell {
    eventfd: File,
    /// Set by the sender that writes the eventfd; cleared by the replicator
    /// when it reads the eventfd, before it reads the channel again.
    pending: AtomicBool,
    /// Events delivered without a ring (by its own reactor) since the
    /// replicator last read the channel: a turn has work.
    posted: AtomicBool,
}

impl Doorbell {
    /// The eventfd, for the read on the replicator's ring.
    pub(crate) fn fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// Wakes the replicator, unless a wake-up is pending already.
    fn ring(&self) {
        // After the event was sent: a replicator that cleared the flag
        // before this swap is rung again; one that clears it after reads the event.
        if !self.pending.swap(true, Ordering::AcqRel) {
            // The counter only saturates after 2^64 rings; a failure means the reader is gone.
            let _ = (&self.eventfd).write_all(&1u64.to_ne_bytes());
        }
    }

    /// The replicator read the eventfd: the next event rings it again.
    pub(crate) fn heard(&self) {
        self.pending.swap(false, Ordering::AcqRel);
    }
}

impl Events {
    /// A new inbox and its senders' side.
    pub(crate) fn channel() -> std::io::Result<(Events, Inbox)> {
        let doorbell = Arc::new(Doorbell {
            eventfd: weft_uring::eventfd()?,
            pending: AtomicBool::new(false),
            posted: AtomicBool::new(false),
        });
        let (sender, receiver) = mpsc::channel();
        let inbox = Inbox {
            receiver,
            doorbell: Arc::clone(&doorbell),
        };
        Ok((Events { sender, doorbell }, inbox))
    }

    /// Delivers `event` without waking the replicator: only for a sender
    /// that gives it a turn anyway (its own reactor).
    // As `mpsc::Sender::send`.
    #[allow(clippy::result_large_err)]
    pub(crate) fn post(&self, event: Event) -> Result<(), mpsc::SendError<Event>> {
        self.sender.send(event)?;
        // After the event: whoever sees the flag finds the event.
        self.doorbell.posted.store(true, Ordering::Release);
        Ok(())
    }

    /// Whether events were posted since the replicator last read its inbox.
    pub(crate) fn posted(&self) -> bool {
        self.doorbell.posted.load(Ordering::Acquire)
    }

    /// The replicator reads its inbox now: what is posted or sent from now
    /// on is news. A sender that finds no wake-up pending after this rings
    /// the doorbell again (cleared only once the eventfd was read, a wake-up
    /// taken for an event read in this turn could hide one sent meanwhile,
    /// which then waited for the replicator's tick).
    pub(crate) fn reading(&self) {
        self.doorbell.posted.store(false, Ordering::Release);
        self.doorbell.heard();
    }

    /// Wakes the replicator as an event would.
    pub(crate) fn wake(&self) {
        self.doorbell.ring();
    }

    /// Delivers `event` and wakes the replicator; the event back if it is gone.
    // As `mpsc::Sender::send`: a host I/O comes back to be answered.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send(&self, event: Event) -> Result<(), mpsc::SendError<Event>> {
        self.sender.send(event)?;
        self.wake();
        Ok(())
    }
}

/// What reaches a replicator.
pub(crate) enum Event {
    /// A host write, Write Zeroes, Deallocate or Flush from a reactor.
    Host(ReplicatedIo),
    /// A replica's answer (from its link).
    Replica { node: NodeId, reply: FromReplica },
    /// A session's connection, fenced, from its attach thread.
    Attached {
        node: NodeId,
        token: weft_replication::Token,
        attachment: Box<link::Attachment>,
    },
    /// A local I/O finished (from a local I/O worker).
    LocalDone {
        op: weft_replication::OpId,
        result: local::LocalResult,
    },
    /// The record change asked for was made, at `revision`.
    Committed {
        revision: u64,
        record: ReplicationRecord,
    },
    /// The record change was not made: the record as it is now, if known.
    CommitFailed(Option<(u64, ReplicationRecord)>),
    /// The record at a new revision (none: the volume is gone).
    Record {
        revision: u64,
        record: Option<ReplicationRecord>,
    },
    /// Take a snapshot or grow, on every copy in sync (`barrier`).
    Barrier {
        op: barrier::BarrierOp,
        reply: Sender<Result<(), AdminError>>,
    },
    /// Barrier `seq`'s snapshot was announced in the record, or why not.
    BarrierAnnounced {
        seq: u64,
        result: Result<(), AdminError>,
    },
    /// A replica answered barrier `seq`'s command.
    BarrierDone { node: NodeId, seq: u64, done: bool },
    /// The primary's own copy made barrier `seq`'s change, or why not.
    BarrierLocal {
        seq: u64,
        result: Result<(), String>,
    },
    /// The primary's files were changed as asked (`durable`), or why not.
    Durable(Result<(), String>),
    /// Stop serving (the volume is deleted, or the node stops).
    Stop,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// What the eventfd counts: the rings since it was last read.
    fn rings(doorbell: &Doorbell) -> u64 {
        let mut count = [0u8; 8];
        (&doorbell.eventfd).read_exact(&mut count).unwrap();
        u64::from_ne_bytes(count)
    }

    #[test]
    fn a_burst_of_events_rings_the_doorbell_once_until_it_is_heard() {
        let (events, inbox) = Events::channel().unwrap();
        for _ in 0..3 {
            events.send(Event::Stop).ok().unwrap();
        }
        events.wake();
        assert_eq!(rings(&inbox.doorbell), 1, "one ring for four events");
        // Heard, then every event sent meanwhile is read: the next rings again.
        inbox.doorbell.heard();
        assert_eq!(inbox.receiver.try_iter().count(), 3);
        events.send(Event::Stop).ok().unwrap();
        assert_eq!(rings(&inbox.doorbell), 1);
        assert_eq!(inbox.receiver.try_iter().count(), 1);
    }
}
