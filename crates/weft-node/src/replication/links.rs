//! A replicator's links, one per replica node, and the sessions that
//! ended while their socket still had operations on the ring (a socket is
//! closed only once none is in flight, so no operation reaches a file that
//! reused its number).
//!
//! What this does not do: decide when a session starts or ends (the
//! replication core does, by its messages and replies), or wait (the
//! replicator's ring does, see `super::write_ring`).

use super::link::{Attachment, Link, LinkTarget, Outgoing, Session};
use super::link_socket::socket_of;
use super::write_ring::WriteRing;
use super::{Event, Events};
use std::collections::BTreeMap;
use weft_replication::{FromReplica, NodeId, Token};
use weft_uring::Completion;

/// The links and their sockets.
pub(crate) struct Links {
    links: BTreeMap<NodeId, Link>,
    /// Ended sessions whose socket operations have not all completed.
    closing: Vec<Session>,
    /// The next socket's id (never reused within a replicator).
    next_socket: u32,
    /// For the attach threads to hand their connections over.
    events: Events,
}

impl Links {
    pub(crate) fn new(events: Events) -> Links {
        Links {
            links: BTreeMap::new(),
            closing: Vec::new(),
            next_socket: 0,
            events,
        }
    }

    /// Starts a session with `target`'s replica under `token`, in place of
    /// any it had (closed: a new connection for a new fence).
    pub(crate) fn start(&mut self, target: &LinkTarget, token: Token) {
        let link = Link::start(target.clone(), token, self.events.clone());
        if let Some(mut old) = self.links.insert(target.node, link) {
            retire(&mut self.closing, old.close());
        }
    }

    /// Queues a message for `node`'s session, if it has one.
    pub(crate) fn send(&mut self, node: NodeId, outgoing: Outgoing) {
        if let Some(link) = self.links.get_mut(&node) {
            link.send(outgoing);
        }
    }

    /// Whether `node` has a session (attaching, open or ended).
    pub(crate) fn contains(&self, node: NodeId) -> bool {
        self.links.contains_key(&node)
    }

    /// A session's connection, from its attach thread: opened on the ring
    /// if the session is still `node`'s, the reply for the core then
    /// (dropped, closing the connection, if a newer session replaced it).
    pub(crate) fn attached(
        &mut self,
        node: NodeId,
        token: Token,
        attachment: Box<Attachment>,
    ) -> Option<FromReplica> {
        let link = self
            .links
            .get_mut(&node)
            .filter(|link| link.token() == token && link.is_attaching())?;
        let id = self.next_socket;
        self.next_socket = self.next_socket.wrapping_add(1);
        Some(link.open(*attachment, id))
    }

    /// Submits every session's waiting commands and starts their sockets'
    /// I/O (the ring submits it at its next wait); a session that fails
    /// ends, its refusal for the core in `replies`.
    pub(crate) fn start_io(&mut self, ring: &mut WriteRing, replies: &mut Vec<Event>) {
        for link in self.links.values_mut() {
            retire(&mut self.closing, link.start_io(ring, replies));
        }
    }

    /// A socket operation completed (its token without the ring's socket
    /// bit): the replies it brought, or its session's end, in `replies`.
    pub(crate) fn completed(
        &mut self,
        completion: Completion,
        ring: &mut WriteRing,
        replies: &mut Vec<Event>,
    ) {
        let id = socket_of(completion.user_data);
        let open = self.links.values_mut().find(|l| l.socket_id() == Some(id));
        if let Some(link) = open {
            retire(&mut self.closing, link.completed(completion, ring, replies));
            return;
        }
        let Some(at) = self.closing.iter().position(|s| s.socket_id() == id) else {
            unreachable!("a completion for socket {id}, which is neither open nor closing");
        };
        // Only its buffers matter now.
        let _ = self.closing[at].socket().completed(completion, ring);
        if self.closing[at].socket().is_idle() {
            self.closing.swap_remove(at);
        }
    }

    /// Ends every session (the replicator stops).
    pub(crate) fn close_all(&mut self) {
        for (_, mut link) in std::mem::take(&mut self.links) {
            retire(&mut self.closing, link.close());
        }
    }

    /// No socket operation is in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.closing.is_empty() && self.links.values().all(|l| l.socket_id().is_none())
    }
}

/// Keeps an ended session until its socket's operations completed.
fn retire(closing: &mut Vec<Session>, session: Option<Box<Session>>) {
    if let Some(mut session) = session {
        if !session.socket().is_idle() {
            closing.push(*session);
        }
    }
}
