//! Limits on the connections network peers may hold: per listener and per
//! peer address. A connection over a limit is closed as soon as it is
//! accepted, before it gets a reactor or a buffer; each limit is logged once
//! when it is reached (and once more, with the count refused, when
//! connections are accepted again), not once per refused socket.
//!
//! What this module does not limit: what a connection may do once accepted
//! (queue depth, transfers: the protocol core's `Limits`), nor how long it
//! may take to set up (the core's ICReq and Connect deadlines).

use crate::limit::LimitReached;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many connections peers may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerLimits {
    /// Open connections of one listener, all peers together.
    pub connections_per_listener: u32,
    /// Open connections of one listener from one peer address. A Linux host
    /// opens one per I/O queue (one per CPU by default) plus an admin queue,
    /// for every volume it connects: keep room for many volumes.
    pub connections_per_address: u32,
}

impl PeerLimits {
    /// The defaults. A connection that has not connected a queue holds
    /// about 17 KiB (one command slot, and the pages of its buffers it
    /// touched), a discovery controller about as much, so 4096 strangers'
    /// idle connections hold under 100 MiB (tests/idle_memory.rs); a
    /// connected I/O queue holds its command slots' tables (two per queue
    /// entry) and the buffers its commands used.
    pub const DEFAULT: PeerLimits = PeerLimits {
        connections_per_listener: 4096,
        connections_per_address: 1024,
    };
}

/// Which limit refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    Listener,
    Address,
}

/// Open connections of one listener.
#[derive(Debug)]
pub(crate) struct ConnectionCounts {
    limits: PeerLimits,
    inner: Mutex<Counts>,
    reached: LimitReached,
}

#[derive(Debug, Default)]
struct Counts {
    total: u32,
    per_address: HashMap<IpAddr, u32>,
}

/// One admitted connection; dropping it (when the reactor releases the
/// connection) gives its place back.
#[derive(Debug)]
pub(crate) struct PeerAdmission {
    counts: Arc<ConnectionCounts>,
    address: IpAddr,
}

impl ConnectionCounts {
    pub(crate) fn new(limits: PeerLimits) -> Arc<ConnectionCounts> {
        Arc::new(ConnectionCounts {
            limits,
            inner: Mutex::default(),
            reached: LimitReached::default(),
        })
    }

    /// Counts a connection from `peer`, or says which limit refuses it. The
    /// first refusal after an accepted connection is logged, and the first
    /// acceptance after refusals.
    pub(crate) fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<PeerAdmission, Refused> {
        let mut counts = self.lock();
        let address = peer.ip();
        let from_address = counts.per_address.get(&address).copied().unwrap_or(0);
        let refused = if counts.total >= self.limits.connections_per_listener {
            Some(Refused::Listener)
        } else if from_address >= self.limits.connections_per_address {
            Some(Refused::Address)
        } else {
            None
        };
        if let Some(refused) = refused {
            if self.reached.refuse() {
                match refused {
                    Refused::Listener => log::warn!(
                        "{peer}: connection refused: this listener has {} connections, its limit (limits.connections_per_listener in weft.toml); refusing more until some close",
                        self.limits.connections_per_listener
                    ),
                    Refused::Address => log::warn!(
                        "{peer}: connection refused: {address} has {} connections to this listener, the limit per address (limits.connections_per_address in weft.toml)",
                        self.limits.connections_per_address
                    ),
                }
            }
            return Err(refused);
        }
        if let Some(refused) = self.reached.admit() {
            log::info!("accepting connections again after refusing {refused} over a limit");
        }
        counts.total += 1;
        *counts.per_address.entry(address).or_insert(0) += 1;
        Ok(PeerAdmission {
            counts: Arc::clone(self),
            address,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for PeerAdmission {
    fn drop(&mut self) {
        let mut counts = self.counts.lock();
        counts.total -= 1;
        let from_address = counts
            .per_address
            .get_mut(&self.address)
            .expect("an admitted address is counted");
        *from_address -= 1;
        if *from_address == 0 {
            counts.per_address.remove(&self.address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(address: &str) -> SocketAddr {
        address.parse().unwrap()
    }

    #[test]
    fn connections_are_limited_per_listener_and_per_address_and_freed_on_drop() {
        let counts = ConnectionCounts::new(PeerLimits {
            connections_per_listener: 3,
            connections_per_address: 2,
        });
        let a1 = counts.admit(peer("10.0.0.1:1000")).unwrap();
        let _a2 = counts.admit(peer("10.0.0.1:1001")).unwrap();
        assert_eq!(
            counts.admit(peer("10.0.0.1:1002")).unwrap_err(),
            Refused::Address
        );
        let _b1 = counts.admit(peer("10.0.0.2:1000")).unwrap();
        assert_eq!(
            counts.admit(peer("10.0.0.3:1000")).unwrap_err(),
            Refused::Listener
        );
        drop(a1);
        let _a3 = counts.admit(peer("10.0.0.1:1003")).unwrap();
        assert_eq!(counts.lock().total, 3);
        assert_eq!(counts.reached.admit(), None, "reset when accepting again");
    }
}
