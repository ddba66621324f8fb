//! Who may hold an API connection: at most so many at once for the node,
//! and fewer for any one client address, so that one client (idle
//! connections reopened as they are cut off) cannot take every place and
//! shut out the others, node-to-node calls included. A client over a limit
//! is answered `503 busy` at once, by one thread of its own, a few at a
//! time (more are closed unanswered): the accepting thread never waits.
//! Each limit is logged once when reached, not once per refused client.
//!
//! What this does not limit: how long a client holds its place (the
//! connection's deadlines do: a short one for the request's head, then one
//! for the whole request).

use crate::failure;
use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use weft_http as http;
use weft_target::LimitReached;

/// API connections being served, in all and per client address.
#[derive(Debug)]
pub(crate) struct Admission {
    connections: u32,
    per_address: u32,
    counts: Mutex<Counts>,
    reached: LimitReached,
    reached_by_address: LimitReached,
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    by_address: HashMap<IpAddr, u32>,
}

/// One connection being served; its place is given back when it drops.
pub(crate) struct Place {
    admission: Arc<Admission>,
    address: IpAddr,
}

/// Which limit refused a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The node serves its most connections.
    Node(u32),
    /// The client's address holds its most.
    Address(u32),
}

impl Admission {
    /// `connections` at once in all, `per_address` of them from one address.
    pub(crate) fn new(connections: u32, per_address: u32) -> Arc<Admission> {
        Arc::new(Admission {
            connections,
            per_address: per_address.min(connections),
            counts: Mutex::default(),
            reached: LimitReached::default(),
            reached_by_address: LimitReached::default(),
        })
    }

    /// A place for a connection from `address`, or the limit that refuses it.
    pub(crate) fn enter(self: &Arc<Self>, address: IpAddr) -> Result<Place, Refused> {
        let mut counts = self.lock();
        let from_address = counts.by_address.get(&address).copied().unwrap_or(0);
        let refused = if counts.total >= self.connections {
            Some((Refused::Node(self.connections), &self.reached))
        } else if from_address >= self.per_address {
            Some((Refused::Address(self.per_address), &self.reached_by_address))
        } else {
            None
        };
        if let Some((refused, reached)) = refused {
            if reached.refuse() {
                match refused {
                    Refused::Node(limit) => log::warn!("API: {limit} connections are being served, the limit (limits.api_connections in weft.toml); answering 503 until some finish"),
                    Refused::Address(limit) => log::warn!("API: {address} holds {limit} connections, the limit per address (limits.api_connections_per_address in weft.toml); answering it 503 until some finish"),
                }
            }
            return Err(refused);
        }
        counts.total += 1;
        *counts.by_address.entry(address).or_insert(0) += 1;
        for reached in [&self.reached, &self.reached_by_address] {
            if let Some(refused) = reached.admit() {
                log::info!("API: serving connections again after answering {refused} busy");
            }
        }
        Ok(Place {
            admission: Arc::clone(self),
            address,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.admission.lock();
        counts.total -= 1;
        if let Some(count) = counts.by_address.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                counts.by_address.remove(&self.address);
            }
        }
    }
}

/// Answers a client over a limit with 503 (plain HTTP, best effort,
/// without waiting for its request).
pub(crate) fn refuse_busy(mut stream: TcpStream, refused: Refused) {
    // The client's request is read first (briefly): closing a socket with
    // unread data resets it, and the client could lose the answer.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = stream.read(&mut [0u8; 16 * 1024]);
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let (message, hint) = match refused {
        Refused::Node(limit) => (
            format!("the node is serving {limit} API connections, its limit"),
            "retry in a moment; raise limits.api_connections in weft.toml if this is normal load",
        ),
        Refused::Address(limit) => (
            format!("this client's address holds {limit} API connections, the limit per address"),
            "close idle connections and retry; raise limits.api_connections_per_address in weft.toml if one address must hold more",
        ),
    };
    let (status, body) = failure(503, "busy", &message, hint);
    let _ = http::write_response(&mut stream, status, http::JSON, body.to_string().as_bytes());
    // Half-close and drain what else comes, so that the close sends no reset.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.read(&mut [0u8; 16 * 1024]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_its_share_and_places_come_back() {
        let admission = Admission::new(4, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = admission.enter(a).ok().unwrap();
        let _second = admission.enter(a).ok().unwrap();
        assert_eq!(admission.enter(a).err(), Some(Refused::Address(2)));
        let _third = admission.enter(b).ok().unwrap();
        let _fourth = admission.enter(b).ok().unwrap();
        assert_eq!(admission.enter(b).err(), Some(Refused::Node(4)));
        drop(first);
        assert!(admission.enter(a).is_ok(), "its place came back");
    }
}
