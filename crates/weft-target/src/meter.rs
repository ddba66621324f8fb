//! Per-namespace QoS limits and I/O statistics, shared by every reactor.
//!
//! **Limits.** Each limit (IOPS and bytes per second; total, read, write) is
//! a virtual clock (GCRA): an I/O reserves the next `cost` nanoseconds of
//! its clocks when it arrives, and may start when the latest of them says.
//! The reservation is one compare-and-swap per limit in force, so reactors
//! share a limit without a lock and admission is in arrival order across
//! every queue and connection of the namespace: queues that keep the same
//! number of I/Os outstanding get the same share. A clock never runs behind
//! the present, so an idle period earns no burst. Limits change live; a
//! change restarts the clocks. Reads and writes are limited; Flush,
//! Deallocate and Write Zeroes are not (they move no data through the link).
//!
//! **Statistics.** A reactor counts in plain integers of its own
//! ([`LocalStats`]) and adds them to the shared atomic totals every tick, so
//! the hot path touches no shared cache line for statistics. Latency is the
//! target's service time: from the moment the reactor takes the command
//! (QoS delay included) to its completion, in a histogram of fixed buckets.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Upper bounds (microseconds) of the latency histogram's buckets; a last
/// bucket holds everything slower.
pub const LATENCY_BOUNDS_US: [u64; 42] = [
    10, 20, 30, 40, 50, 65, 80, 100, 130, 160, 200, 250, 320, 400, 500, 650, 800, 1_000, 1_300,
    1_600, 2_000, 2_500, 3_200, 4_000, 5_000, 6_500, 8_000, 10_000, 13_000, 16_000, 20_000, 25_000,
    32_000, 40_000, 50_000, 65_000, 80_000, 100_000, 200_000, 500_000, 1_000_000, 5_000_000,
];
/// Buckets, the overflow bucket included.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// What an I/O is, for limits and statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    /// A read.
    Read = 0,
    /// A write.
    Write = 1,
    /// Flush, Deallocate, Write Zeroes.
    Other = 2,
}

/// Number of I/O classes.
pub const IO_CLASSES: usize = 3;

/// A namespace's limits, 0 meaning none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// I/O per second, reads and writes.
    pub iops: u64,
    /// Bytes per second, reads and writes.
    pub bytes: u64,
    /// Reads per second.
    pub read_iops: u64,
    /// Bytes read per second.
    pub read_bytes: u64,
    /// Writes per second.
    pub write_iops: u64,
    /// Bytes written per second.
    pub write_bytes: u64,
}

impl Limits {
    fn as_array(&self) -> [u64; 6] {
        [
            self.iops,
            self.bytes,
            self.read_iops,
            self.read_bytes,
            self.write_iops,
            self.write_bytes,
        ]
    }
}

/// The limits and statistics of one namespace. Kept across exports updates
/// (the volume manager holds one per volume), so that counters and limits
/// outlive a resize.
#[derive(Debug)]
pub struct Meter {
    /// Unique among the meters of the process: reactors index their local
    /// statistics by it.
    pub(crate) id: u32,
    /// Per limit: the limit (0: none) and its virtual clock (ns since the data plane's epoch).
    limits: [AtomicU64; 6],
    clocks: [AtomicU64; 6],
    /// Whether any limit is set (one load for unlimited namespaces).
    limited: AtomicBool,
    stats: SharedStats,
}

static NEXT_METER_ID: AtomicU32 = AtomicU32::new(0);

impl Default for Meter {
    fn default() -> Self {
        Meter::new()
    }
}

impl Meter {
    /// An unlimited meter with zero counters.
    pub fn new() -> Meter {
        Meter {
            id: NEXT_METER_ID.fetch_add(1, Ordering::Relaxed),
            limits: Default::default(),
            clocks: Default::default(),
            limited: AtomicBool::new(false),
            stats: SharedStats::default(),
        }
    }

    /// Applies `limits` from now on and restarts the clocks.
    pub fn set_limits(&self, limits: Limits) {
        for (index, value) in limits.as_array().into_iter().enumerate() {
            self.limits[index].store(value, Ordering::Relaxed);
            self.clocks[index].store(0, Ordering::Relaxed);
        }
        self.limited
            .store(limits != Limits::default(), Ordering::Release);
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        let value = |index: usize| self.limits[index].load(Ordering::Relaxed);
        Limits {
            iops: value(0),
            bytes: value(1),
            read_iops: value(2),
            read_bytes: value(3),
            write_iops: value(4),
            write_bytes: value(5),
        }
    }

    /// Reserves room for an I/O of `class` and `bytes` arriving at `now_ns`;
    /// returns when it may start (`now_ns` when no limit holds it back).
    pub fn reserve(&self, now_ns: u64, class: IoClass, bytes: u32) -> u64 {
        if class == IoClass::Other || !self.limited.load(Ordering::Acquire) {
            return now_ns;
        }
        let (iops, bandwidth) = match class {
            IoClass::Read => (2, 3),
            IoClass::Write => (4, 5),
            IoClass::Other => unreachable!("not limited"),
        };
        [
            (0, 1),
            (1, u64::from(bytes)),
            (iops, 1),
            (bandwidth, u64::from(bytes)),
        ]
        .into_iter()
        .map(|(index, units)| self.take(index, now_ns, units))
        .max()
        .unwrap_or(now_ns)
    }

    /// Advances clock `index` by `units` at its limit's rate; returns the start it grants.
    fn take(&self, index: usize, now_ns: u64, units: u64) -> u64 {
        let limit = self.limits[index].load(Ordering::Relaxed);
        if limit == 0 {
            return now_ns;
        }
        let cost_ns = ((u128::from(units) * 1_000_000_000) / u128::from(limit)) as u64;
        let clock = &self.clocks[index];
        let mut current = clock.load(Ordering::Relaxed);
        loop {
            let start = current.max(now_ns);
            match clock.compare_exchange_weak(
                current,
                start + cost_ns,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return start,
                Err(actual) => current = actual,
            }
        }
    }

    /// Totals so far.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

/// Totals of one class, shared.
#[derive(Debug)]
struct SharedClass {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    latency_ns_total: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for SharedClass {
    fn default() -> Self {
        SharedClass {
            ops: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_ns_total: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

#[derive(Debug, Default)]
struct SharedStats {
    classes: [SharedClass; IO_CLASSES],
    started: AtomicU64,
}

impl SharedStats {
    fn snapshot(&self) -> StatsSnapshot {
        let class = |c: &SharedClass| ClassSnapshot {
            ops: c.ops.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            latency_ns_total: c.latency_ns_total.load(Ordering::Relaxed),
            buckets: c
                .buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
        };
        let classes: Vec<ClassSnapshot> = self.classes.iter().map(class).collect();
        let completed: u64 = classes.iter().map(|c| c.ops).sum();
        StatsSnapshot {
            in_flight: self
                .started
                .load(Ordering::Relaxed)
                .saturating_sub(completed),
            read: classes[0].clone(),
            write: classes[1].clone(),
            other: classes[2].clone(),
        }
    }
}

/// Totals of one class at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassSnapshot {
    /// Completed commands.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Commands that failed.
    pub errors: u64,
    /// Sum of latencies, nanoseconds.
    pub latency_ns_total: u64,
    /// Commands per latency bucket (see [`LATENCY_BOUNDS_US`]).
    pub buckets: Vec<u64>,
}

impl ClassSnapshot {
    /// Upper bound (us) of the bucket holding quantile `q` (0..1), None if
    /// no command completed or it is past the last bound.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return LATENCY_BOUNDS_US.get(index).copied();
            }
        }
        None
    }
}

/// A namespace's totals at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Commands taken but not completed (queue depth at the target).
    pub in_flight: u64,
    /// Reads.
    pub read: ClassSnapshot,
    /// Writes.
    pub write: ClassSnapshot,
    /// Flush, Deallocate, Write Zeroes.
    pub other: ClassSnapshot,
}

/// One reactor's counts for one meter since it last published them.
#[derive(Debug, Clone)]
pub(crate) struct LocalStats {
    classes: [LocalClass; IO_CLASSES],
    started: u64,
    dirty: bool,
}

#[derive(Debug, Clone)]
struct LocalClass {
    ops: u64,
    bytes: u64,
    errors: u64,
    latency_ns_total: u64,
    buckets: [u64; LATENCY_BUCKETS],
}

impl Default for LocalStats {
    fn default() -> Self {
        let class = LocalClass {
            ops: 0,
            bytes: 0,
            errors: 0,
            latency_ns_total: 0,
            buckets: [0; LATENCY_BUCKETS],
        };
        LocalStats {
            classes: [class.clone(), class.clone(), class],
            started: 0,
            dirty: false,
        }
    }
}

impl LocalStats {
    /// A command was taken.
    pub(crate) fn start(&mut self) {
        self.started += 1;
        self.dirty = true;
    }

    /// A command completed after `latency_ns`.
    pub(crate) fn finish(&mut self, class: IoClass, bytes: u32, latency_ns: u64, ok: bool) {
        let local = &mut self.classes[class as usize];
        local.ops += 1;
        if ok {
            local.bytes += u64::from(bytes);
        } else {
            local.errors += 1;
        }
        local.latency_ns_total += latency_ns;
        local.buckets[bucket_of(latency_ns / 1000)] += 1;
        self.dirty = true;
    }

    /// Adds the counts to `meter`'s totals and starts again from zero.
    pub(crate) fn publish(&mut self, meter: &Meter) {
        if !self.dirty {
            return;
        }
        let shared = &meter.stats;
        shared.started.fetch_add(self.started, Ordering::Relaxed);
        for (local, total) in self.classes.iter().zip(&shared.classes) {
            let add = |counter: &AtomicU64, value: u64| {
                if value != 0 {
                    counter.fetch_add(value, Ordering::Relaxed);
                }
            };
            add(&total.ops, local.ops);
            add(&total.bytes, local.bytes);
            add(&total.errors, local.errors);
            add(&total.latency_ns_total, local.latency_ns_total);
            for (bucket, value) in total.buckets.iter().zip(local.buckets) {
                add(bucket, value);
            }
        }
        *self = LocalStats::default();
    }
}

/// The bucket of a latency in microseconds.
fn bucket_of(latency_us: u64) -> usize {
    LATENCY_BOUNDS_US.partition_point(|&bound| bound < latency_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND_NS: u64 = 1_000_000_000;

    #[test]
    fn unlimited_io_starts_at_once() {
        let meter = Meter::new();
        assert_eq!(meter.reserve(5, IoClass::Read, 4096), 5);
        meter.set_limits(Limits {
            read_iops: 10,
            ..Limits::default()
        });
        assert_eq!(
            meter.reserve(7, IoClass::Write, 4096),
            7,
            "writes are not limited"
        );
        assert_eq!(meter.reserve(7, IoClass::Other, 0), 7);
    }

    #[test]
    fn an_iops_limit_spaces_starts_evenly_in_arrival_order() {
        let meter = Meter::new();
        meter.set_limits(Limits {
            iops: 1000,
            ..Limits::default()
        });
        // 10 I/Os arrive at once: they start 1 ms apart.
        let starts: Vec<u64> = (0..10)
            .map(|_| meter.reserve(SECOND_NS, IoClass::Read, 4096))
            .collect();
        let expected: Vec<u64> = (0..10).map(|i| SECOND_NS + i * 1_000_000).collect();
        assert_eq!(starts, expected);
        // After a long idle period there is no burst credit beyond the present.
        let later = 5 * SECOND_NS;
        assert_eq!(meter.reserve(later, IoClass::Write, 4096), later);
        assert_eq!(
            meter.reserve(later, IoClass::Write, 4096),
            later + 1_000_000
        );
    }

    #[test]
    fn the_tightest_limit_decides_and_rates_hold_over_a_second() {
        let meter = Meter::new();
        meter.set_limits(Limits {
            iops: 20_000,
            bytes: 200 << 20,
            write_bytes: 50 << 20,
            ..Limits::default()
        });
        // 128 KiB writes: 50 MiB/s allows 400 per second, the tightest.
        let mut count = 0;
        while meter.reserve(0, IoClass::Write, 128 << 10) < SECOND_NS {
            count += 1;
        }
        assert_eq!(count, 400);
        // Reads of 4 KiB after the clocks restart: IOPS (20000/s) is tighter
        // than 200 MiB/s (51200/s).
        meter.set_limits(meter.limits());
        let mut reads = 0;
        while meter.reserve(0, IoClass::Read, 4096) < SECOND_NS {
            reads += 1;
        }
        assert_eq!(reads, 20_000);
    }

    #[test]
    fn queues_reserving_alternately_share_evenly() {
        let meter = Meter::new();
        meter.set_limits(Limits {
            iops: 100,
            ..Limits::default()
        });
        let mut per_queue = [0u32; 4];
        let mut queue = 0;
        while meter.reserve(0, IoClass::Read, 512) < SECOND_NS {
            per_queue[queue] += 1;
            queue = (queue + 1) % 4;
        }
        assert_eq!(per_queue, [25; 4]);
    }

    #[test]
    fn local_counts_reach_the_totals_when_published() {
        let meter = Meter::new();
        let mut local = LocalStats::default();
        local.start();
        local.start();
        local.finish(IoClass::Read, 4096, 90_000, true);
        assert_eq!(meter.snapshot().read.ops, 0, "nothing published yet");
        local.publish(&meter);
        local.start();
        local.finish(IoClass::Write, 8192, 3_000_000, false);
        local.publish(&meter);
        let totals = meter.snapshot();
        assert_eq!(totals.in_flight, 1);
        assert_eq!((totals.read.ops, totals.read.bytes), (1, 4096));
        assert_eq!(
            (totals.write.ops, totals.write.bytes, totals.write.errors),
            (1, 0, 1)
        );
        assert_eq!(totals.read.quantile_us(0.99), Some(100));
        assert_eq!(totals.write.quantile_us(0.5), Some(3_200));
        assert_eq!(totals.other.quantile_us(0.5), None);
    }

    #[test]
    fn buckets_hold_latencies_up_to_their_bound() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(10), 0);
        assert_eq!(bucket_of(11), 1);
        assert_eq!(bucket_of(5_000_000), LATENCY_BOUNDS_US.len() - 1);
        assert_eq!(bucket_of(u64::MAX), LATENCY_BOUNDS_US.len());
    }
}
