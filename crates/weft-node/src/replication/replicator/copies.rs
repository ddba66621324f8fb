//! The rebuild bandwidth limit on the copies a primary sends.

/// A token bucket on the bytes copied to rebuilt replicas (a burst of a
/// tenth of a second, and at least one region, may pass at once).
pub(super) struct CopyLimiter {
    bytes_per_s: u64,
    allowance: f64,
    last: std::time::Instant,
}

impl CopyLimiter {
    pub(super) fn new(bytes_per_s: u64) -> CopyLimiter {
        CopyLimiter {
            bytes_per_s,
            allowance: 0.0,
            last: std::time::Instant::now(),
        }
    }

    /// Whether `bytes` may be copied now (taken from the allowance if so).
    pub(super) fn take(&mut self, bytes: u64) -> bool {
        let now = std::time::Instant::now();
        let burst = (self.bytes_per_s as f64 / 10.0).max(bytes as f64);
        let earned = now.duration_since(self.last).as_secs_f64() * self.bytes_per_s as f64;
        self.allowance = (self.allowance + earned).min(burst);
        self.last = now;
        if self.allowance >= bytes as f64 {
            self.allowance -= bytes as f64;
            true
        } else {
            false
        }
    }
}
