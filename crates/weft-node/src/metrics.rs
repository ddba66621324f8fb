//! What the node reports about its I/O: per-namespace totals from the data
//! plane's meters (as JSON for `weft top`, `GET /api/v1/stats`) and the
//! Prometheus exposition at `GET /metrics` — per volume and per node
//! commands, bytes, errors, latency histograms, queue depth, connected
//! hosts, QoS limits, pool capacity, rebuilds and the members of replicated
//! volumes.
//!
//! Everything here reads counters the reactors publish every tick; nothing
//! touches the I/O path.

mod members;
mod stages;

pub use members::{node_info, volume_members};
pub use stages::{StageStats, StagesStats};

use crate::status::PoolStatus;
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use weft_target::meter::{ClassSnapshot, Limits, LATENCY_BOUNDS_US};
use weft_target::{Backend, DataPlane};

/// Totals of one class of I/O.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ClassStats {
    /// Completed commands.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Failed commands.
    pub errors: u64,
    /// Sum of service times, nanoseconds.
    pub latency_ns_total: u64,
    /// Commands per latency bucket (bounds in `latency_bounds_us`, then overflow).
    pub buckets: Vec<u64>,
}

impl From<ClassSnapshot> for ClassStats {
    fn from(snapshot: ClassSnapshot) -> Self {
        ClassStats {
            ops: snapshot.ops,
            bytes: snapshot.bytes,
            errors: snapshot.errors,
            latency_ns_total: snapshot.latency_ns_total,
            buckets: snapshot.buckets,
        }
    }
}

impl ClassStats {
    /// Upper bound (us) of the bucket holding quantile `q` of the commands
    /// counted between `earlier` and `self`; None if none completed.
    pub fn quantile_us_since(&self, earlier: &ClassStats, q: f64) -> Option<u64> {
        let buckets: Vec<u64> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, n)| n.saturating_sub(earlier.buckets.get(i).copied().unwrap_or(0)))
            .collect();
        ClassSnapshot {
            buckets,
            ..ClassSnapshot::default()
        }
        .quantile_us(q)
        .or_else(|| (self.ops > earlier.ops).then_some(u64::MAX))
    }
}

/// One namespace's totals.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NamespaceStats {
    /// Subsystem NQN.
    pub nqn: String,
    /// Namespace ID.
    pub nsid: u32,
    /// The volume it serves, if any.
    pub volume: Option<String>,
    /// Commands taken but not completed.
    pub in_flight: u64,
    /// Hosts connected to its subsystem.
    pub connected_hosts: usize,
    /// Reads.
    pub read: ClassStats,
    /// Writes.
    pub write: ClassStats,
    /// Flush, Deallocate, Write Zeroes.
    pub other: ClassStats,
    /// QoS limits in force (0: none).
    pub limits: LimitsView,
    /// Its backing store failed (a sync or FUA write): every I/O fails until cleared.
    #[serde(default)]
    pub failed: bool,
}

/// QoS limits as reported (0: none).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LimitsView {
    /// I/O per second.
    pub iops: u64,
    /// Bytes per second.
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

impl From<Limits> for LimitsView {
    fn from(l: Limits) -> Self {
        LimitsView {
            iops: l.iops,
            bytes: l.bytes,
            read_iops: l.read_iops,
            read_bytes: l.read_bytes,
            write_iops: l.write_iops,
            write_bytes: l.write_bytes,
        }
    }
}

/// Every namespace's totals at one moment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// When, in nanoseconds of the node's monotonic clock.
    pub time_ns: u64,
    /// Upper bounds of the latency buckets, microseconds.
    pub latency_bounds_us: Vec<u64>,
    /// Per namespace.
    pub namespaces: Vec<NamespaceStats>,
    /// Where commands spend their time inside the target.
    #[serde(default)]
    pub stages: StagesStats,
}

/// Reads every namespace's meter.
pub fn collect(plane: &DataPlane, clock: &std::time::Instant) -> Stats {
    let exports = plane.exports();
    let mut namespaces = Vec::new();
    for (subsystem, devices) in exports.config.subsystems.iter().zip(&exports.devices) {
        let connected_hosts = plane.connected_hosts(&subsystem.nqn).len();
        for device in devices {
            let snapshot = device.meter.snapshot();
            namespaces.push(NamespaceStats {
                nqn: subsystem.nqn.clone(),
                nsid: device.nsid.0,
                volume: match &device.backend {
                    Backend::Volume(volume) => Some(volume.volume.clone()),
                    Backend::Device(_) => None,
                },
                in_flight: snapshot.in_flight,
                connected_hosts,
                read: snapshot.read.into(),
                write: snapshot.write.into(),
                other: snapshot.other.into(),
                limits: device.meter.limits().into(),
                failed: device.health.is_failed(),
            });
        }
    }
    Stats {
        time_ns: clock.elapsed().as_nanos() as u64,
        latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
        namespaces,
        stages: plane.stages().into(),
    }
}

/// Text being written in the Prometheus exposition format.
struct Exposition(String);

/// `value` as a label value of the text format: backslash, double quote and
/// line feed escaped (an NQN may hold the first two).
fn escape(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut escaped = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    std::borrow::Cow::Owned(escaped)
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        let _ = if labels.is_empty() {
            writeln!(self.0, "{name} {value}")
        } else {
            writeln!(self.0, "{name}{{{labels}}} {value}")
        };
    }
}

type ClassValue = fn(&ClassStats) -> u64;

/// A namespace's classes by operation label.
fn classes(ns: &NamespaceStats) -> [(&'static str, &ClassStats); 3] {
    [
        ("read", &ns.read),
        ("write", &ns.write),
        ("other", &ns.other),
    ]
}

type NamespaceValue = fn(&NamespaceStats) -> u64;
/// A pool's figure, if it has that one (a write tier's, if it has a tier).
type PoolValue = fn(&PoolStatus) -> Option<u64>;

/// The Prometheus text exposition (format 0.0.4) of `stats` and `pools`.
pub fn prometheus(stats: &Stats, pools: &[PoolStatus]) -> String {
    let mut out = Exposition(String::new());
    let labels = |ns: &NamespaceStats| {
        format!(
            "subsystem=\"{}\",nsid=\"{}\",volume=\"{}\"",
            escape(&ns.nqn),
            ns.nsid,
            escape(ns.volume.as_deref().unwrap_or(""))
        )
    };
    // Per namespace and operation (bytes: reads and writes only).
    let per_operation: [(&str, &str, &str, ClassValue, usize); 3] = [
        (
            "weft_namespace_ops_total",
            "counter",
            "Commands completed, by namespace and operation.",
            |c| c.ops,
            3,
        ),
        (
            "weft_namespace_bytes_total",
            "counter",
            "Bytes read or written, by namespace.",
            |c| c.bytes,
            2,
        ),
        (
            "weft_namespace_errors_total",
            "counter",
            "Commands that completed with an error, by namespace and operation.",
            |c| c.errors,
            3,
        ),
    ];
    for (name, kind, help, value, operations) in per_operation {
        out.family(name, kind, help);
        for ns in &stats.namespaces {
            for (op, class) in classes(ns).into_iter().take(operations) {
                out.sample(name, &format!("{},op=\"{op}\"", labels(ns)), value(class));
            }
        }
    }
    let histogram = "weft_namespace_latency_seconds";
    out.family(
        histogram,
        "histogram",
        "Target service time (command taken to completion, QoS wait included).",
    );
    for ns in &stats.namespaces {
        for (op, class) in classes(ns) {
            let labels = format!("{},op=\"{op}\"", labels(ns));
            let mut cumulative = 0;
            for (index, count) in class.buckets.iter().enumerate() {
                cumulative += count;
                let le = match stats.latency_bounds_us.get(index) {
                    Some(bound) => (*bound as f64 / 1e6).to_string(),
                    None => "+Inf".to_string(),
                };
                out.sample(
                    &format!("{histogram}_bucket"),
                    &format!("{labels},le=\"{le}\""),
                    cumulative,
                );
            }
            out.sample(
                &format!("{histogram}_sum"),
                &labels,
                class.latency_ns_total as f64 / 1e9,
            );
            out.sample(&format!("{histogram}_count"), &labels, class.ops);
        }
    }
    let per_namespace: [(&str, &str, NamespaceValue); 3] = [
        (
            "weft_namespace_queue_depth",
            "Commands taken by the target and not yet completed.",
            |ns| ns.in_flight,
        ),
        (
            "weft_namespace_connected_hosts",
            "Controllers connected to the namespace's subsystem.",
            |ns| ns.connected_hosts as u64,
        ),
        (
            "weft_namespace_failed",
            "1 when the namespace's backing store failed (an fdatasync or FUA write): every I/O fails until an operator clears it.",
            |ns| u64::from(ns.failed),
        ),
    ];
    for (name, help, value) in per_namespace {
        out.family(name, "gauge", help);
        for ns in &stats.namespaces {
            out.sample(name, &labels(ns), value(ns));
        }
    }
    let limit = "weft_namespace_qos_limit";
    out.family(
        limit,
        "gauge",
        "QoS limits in force (IOPS, or bytes per second); absent when unlimited.",
    );
    for ns in &stats.namespaces {
        let l = ns.limits;
        let limits = [
            ("iops", l.iops),
            ("bytes", l.bytes),
            ("read_iops", l.read_iops),
            ("read_bytes", l.read_bytes),
            ("write_iops", l.write_iops),
            ("write_bytes", l.write_bytes),
        ];
        for (kind, value) in limits.into_iter().filter(|(_, v)| *v > 0) {
            out.sample(limit, &format!("{},limit=\"{kind}\"", labels(ns)), value);
        }
    }
    node_totals(&mut out, stats);
    stages::expose(&mut out, &stats.stages);
    let per_pool: [(&str, &str, PoolValue); 9] = [
        ("weft_pool_capacity_bytes", "Data space of the pool.", |p| {
            Some(p.info.capacity_bytes)
        }),
        (
            "weft_pool_allocated_bytes",
            "Bytes of the pool's allocation units in use.",
            |p| Some(p.info.allocated_bytes),
        ),
        (
            "weft_pool_provisioned_bytes",
            "Sum of the sizes of the pool's volumes.",
            |p| Some(p.info.provisioned_bytes),
        ),
        (
            "weft_pool_failed",
            "1 when the pool failed (a sync, FUA or metadata write): every I/O on its volumes fails until an operator clears it.",
            |p| Some(u64::from(p.failure.is_some())),
        ),
        (
            "weft_pool_write_tier_capacity_bytes",
            "Bytes of the log of the pool's write tier (pools with one).",
            |p| Some(p.write_tier.as_ref()?.info.capacity_bytes),
        ),
        (
            "weft_pool_write_tier_used_bytes",
            "Bytes of the pool's write tier that hold writes not destaged to its devices yet.",
            |p| Some(p.write_tier.as_ref()?.info.used_bytes),
        ),
        (
            "weft_pool_compressed_logical_bytes",
            "Bytes of the units its compressed volumes have written, as they came (pools with compressed volumes); over the stored bytes, the ratio.",
            |p| compressed(p).then_some(p.info.compressed_logical_bytes),
        ),
        (
            "weft_pool_compressed_stored_bytes",
            "Bytes those units take compressed.",
            |p| compressed(p).then_some(p.info.compressed_stored_bytes),
        ),
        (
            "weft_pool_compressed_segment_bytes",
            "Bytes of the allocation units holding them, with what the cleaner has yet to reclaim.",
            |p| compressed(p).then_some(p.info.segment_bytes),
        ),
    ];
    for (name, help, value) in per_pool {
        out.family(name, "gauge", help);
        for pool in pools {
            if let Some(value) = value(pool) {
                out.sample(name, &format!("pool=\"{}\"", pool.info.name), value);
            }
        }
    }
    out.0
}

/// Whether a pool has compressed volumes or holds their extents.
fn compressed(pool: &PoolStatus) -> bool {
    pool.info.segment_bytes > 0 || pool.info.compressed_logical_bytes > 0
}

/// Appends the rebuilds in progress (volume, replica) to an exposition.
pub fn rebuilds(text: &mut String, rebuilds: &[(String, crate::status::RebuildStatus)]) {
    let mut out = Exposition(std::mem::take(text));
    type RebuildValue = fn(&crate::status::RebuildStatus) -> u64;
    let families: [(&str, &str, RebuildValue); 3] = [
        (
            "weft_rebuild_done_bytes",
            "Bytes a rebuilding replica has been copied.",
            |r| r.done_bytes,
        ),
        (
            "weft_rebuild_total_bytes",
            "Bytes a rebuilding replica is to be copied in all.",
            |r| r.total_bytes,
        ),
        (
            "weft_rebuild_rate_bytes_per_second",
            "Copy rate of a rebuild since it began.",
            |r| r.rate_bytes_per_s,
        ),
    ];
    for (name, help, value) in families {
        out.family(name, "gauge", help);
        for (volume, rebuild) in rebuilds {
            let labels = format!("volume=\"{volume}\",replica=\"{}\"", rebuild.replica);
            out.sample(name, &labels, value(rebuild));
        }
    }
    *text = out.0;
}

/// Node-wide sums of the namespace counters.
fn node_totals(out: &mut Exposition, stats: &Stats) {
    let sum =
        |value: &dyn Fn(&NamespaceStats) -> u64| stats.namespaces.iter().map(value).sum::<u64>();
    out.family(
        "weft_node_ops_total",
        "counter",
        "Commands completed on the node, by operation.",
    );
    for (op, ops) in [
        ("read", sum(&|n| n.read.ops)),
        ("write", sum(&|n| n.write.ops)),
        ("other", sum(&|n| n.other.ops)),
    ] {
        out.sample("weft_node_ops_total", &format!("op=\"{op}\""), ops);
    }
    out.family(
        "weft_node_bytes_total",
        "counter",
        "Bytes read or written on the node.",
    );
    for (op, bytes) in [
        ("read", sum(&|n| n.read.bytes)),
        ("write", sum(&|n| n.write.bytes)),
    ] {
        out.sample("weft_node_bytes_total", &format!("op=\"{op}\""), bytes);
    }
    let gauges: [(&str, &str, &str, u64); 3] = [
        (
            "weft_node_errors_total",
            "counter",
            "Commands that failed on the node.",
            sum(&|n| n.read.errors + n.write.errors + n.other.errors),
        ),
        (
            "weft_node_queue_depth",
            "gauge",
            "Commands in progress on the node.",
            sum(&|n| n.in_flight),
        ),
        (
            "weft_node_namespaces",
            "gauge",
            "Namespaces served.",
            stats.namespaces.len() as u64,
        ),
    ];
    for (name, kind, help, value) in gauges {
        out.family(name, kind, help);
        out.sample(name, "", value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("nqn.2026-11.io.weft:a"), "nqn.2026-11.io.weft:a");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    fn class(ops: u64, fast: u64) -> ClassStats {
        let mut buckets = vec![0; LATENCY_BOUNDS_US.len() + 1];
        buckets[0] = fast;
        buckets[20] = ops - fast;
        ClassStats {
            ops,
            bytes: ops * 4096,
            errors: 0,
            latency_ns_total: ops * 1000,
            buckets,
        }
    }

    #[test]
    fn the_exposition_has_cumulative_buckets_and_every_family() {
        let stats = Stats {
            time_ns: 0,
            latency_bounds_us: LATENCY_BOUNDS_US.to_vec(),
            namespaces: vec![NamespaceStats {
                nqn: "nqn.2026-11.io.weft:vol:db1".into(),
                nsid: 1,
                volume: Some("db1".into()),
                in_flight: 3,
                connected_hosts: 1,
                read: class(10, 4),
                write: class(5, 5),
                other: ClassStats::default(),
                limits: LimitsView {
                    iops: 20000,
                    ..LimitsView::default()
                },
                failed: true,
            }],
            stages: StagesStats {
                stages: vec![StageStats {
                    stage: "service".into(),
                    commands: 15,
                    ns_total: 1_500_000_000,
                }],
                wakeups: 7,
                ..StagesStats::default()
            },
        };
        let text = prometheus(&stats, &[]);
        let labels = "subsystem=\"nqn.2026-11.io.weft:vol:db1\",nsid=\"1\",volume=\"db1\"";
        for line in [
            format!("weft_namespace_ops_total{{{labels},op=\"read\"}} 10"),
            format!(
                "weft_namespace_latency_seconds_bucket{{{labels},op=\"read\",le=\"0.00001\"}} 4"
            ),
            format!(
                "weft_namespace_latency_seconds_bucket{{{labels},op=\"read\",le=\"0.002\"}} 10"
            ),
            format!("weft_namespace_latency_seconds_bucket{{{labels},op=\"read\",le=\"+Inf\"}} 10"),
            format!("weft_namespace_latency_seconds_count{{{labels},op=\"read\"}} 10"),
            format!("weft_namespace_queue_depth{{{labels}}} 3"),
            format!("weft_namespace_failed{{{labels}}} 1"),
            format!("weft_namespace_qos_limit{{{labels},limit=\"iops\"}} 20000"),
            "weft_node_ops_total{op=\"write\"} 5".to_string(),
            "weft_stage_seconds_total{stage=\"service\"} 1.5".to_string(),
            "weft_stage_commands_total{stage=\"service\"} 15".to_string(),
            "weft_reactor_events_total{event=\"wakeups\"} 7".to_string(),
            "# TYPE weft_namespace_latency_seconds histogram".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(
            !text.contains("limit=\"bytes\""),
            "unlimited limits are absent"
        );
    }

    #[test]
    fn quantiles_come_from_the_interval_only() {
        let before = class(10, 10);
        let after = class(20, 10);
        // The 10 new commands were all slow (bucket 20: 2 ms).
        assert_eq!(after.quantile_us_since(&before, 0.99), Some(2_000));
        assert_eq!(before.quantile_us_since(&before, 0.99), None);
    }
}
