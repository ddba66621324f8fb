//! How long this node may trust its own lease: until a tenth of the TTL
//! before the store could end it, counted from when the last successful
//! keep-alive was sent (the store counts from its arrival, later). A
//! replicated volume's primary serves only within it, and the controller
//! promotes another only after the store ended it, so an old primary has
//! stopped serving before a new one exists (see `weft_replication`).
//!
//! Time is monotonic, from the clock's creation: the replicator reads it as
//! the replication core's `Duration` time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The node's lease as the node itself may trust it.
#[derive(Debug)]
pub struct LeaseClock {
    base: Instant,
    until_ns: AtomicU64,
}

impl Default for LeaseClock {
    fn default() -> Self {
        LeaseClock {
            base: Instant::now(),
            until_ns: AtomicU64::new(0),
        }
    }
}

impl LeaseClock {
    /// The time since the clock's creation.
    pub fn now(&self) -> Duration {
        self.base.elapsed()
    }

    /// The time `instant` stands for on this clock.
    pub fn at(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.base)
    }

    /// A keep-alive sent at `sent` succeeded for a lease of `ttl`.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = self.at(sent) + ttl - ttl / 10;
        let until_ns = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        self.until_ns.fetch_max(until_ns, Ordering::AcqRel);
    }

    /// Until when the lease may be trusted (zero: never renewed).
    pub fn until(&self) -> Duration {
        Duration::from_nanos(self.until_ns.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_is_trusted_until_a_tenth_of_the_ttl_before_it_ends() {
        let clock = LeaseClock::default();
        assert_eq!(clock.until(), Duration::ZERO);
        let sent = clock.base + Duration::from_secs(2);
        clock.renewed(sent, Duration::from_secs(5));
        assert_eq!(clock.until(), Duration::from_millis(6500));
        clock.renewed(clock.base, Duration::from_secs(5));
        assert_eq!(
            clock.until(),
            Duration::from_millis(6500),
            "never goes back"
        );
    }
}
