//! The data plane's stage counts (see `weft_target::stages`) as the node
//! reports them: in `GET /api/v1/stats` and at `GET /metrics`.

use super::Exposition;
use serde::{Deserialize, Serialize};
use weft_target::stages::{LoopCounter, Stage, StagesSnapshot};

/// One stage of a command inside the target, totals since the node started.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StageStats {
    /// `receive_to_start`, `service`, `reply_wait` or `send`.
    pub stage: String,
    /// Commands that went through it.
    pub commands: u64,
    /// The time they spent in it, added up, nanoseconds.
    pub ns_total: u64,
}

/// Where commands spend their time inside the target, and how often the
/// reactors woke, slept, received and sent. Over an interval, a stage's
/// `ns_total` growth divided by the interval is how many commands were in
/// it on average (Little's law).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StagesStats {
    /// In a command's order.
    pub stages: Vec<StageStats>,
    /// Times the reactors went to the kernel for completions.
    pub wakeups: u64,
    /// Of them, the times they slept first.
    pub sleeps: u64,
    /// Receive completions with bytes.
    pub receives: u64,
    /// Send completions.
    pub sends: u64,
    /// Ticks (250 ms each, per reactor) the reactors did not spin because
    /// other threads were waiting for their CPUs.
    #[serde(default)]
    pub spin_rests: u64,
}

impl From<StagesSnapshot> for StagesStats {
    fn from(snapshot: StagesSnapshot) -> Self {
        let counter = |c: LoopCounter| snapshot.counters[c as usize];
        StagesStats {
            stages: Stage::ALL
                .iter()
                .map(|&stage| StageStats {
                    stage: stage.name().into(),
                    commands: snapshot.stages[stage as usize].commands,
                    ns_total: snapshot.stages[stage as usize].sum_ns,
                })
                .collect(),
            wakeups: counter(LoopCounter::Wakeups),
            sleeps: counter(LoopCounter::Sleeps),
            receives: counter(LoopCounter::Receives),
            sends: counter(LoopCounter::Sends),
            spin_rests: counter(LoopCounter::SpinRests),
        }
    }
}

/// The stage and loop counters in the Prometheus exposition.
pub(super) fn expose(out: &mut Exposition, stats: &StagesStats) {
    let seconds = "weft_stage_seconds_total";
    out.family(
        seconds,
        "counter",
        "Time commands spent in each stage inside the target, added up (its rate is the commands in the stage on average).",
    );
    for stage in &stats.stages {
        let labels = format!("stage=\"{}\"", stage.stage);
        out.sample(seconds, &labels, stage.ns_total as f64 / 1e9);
    }
    let commands = "weft_stage_commands_total";
    out.family(
        commands,
        "counter",
        "Commands through each stage inside the target.",
    );
    for stage in &stats.stages {
        out.sample(
            commands,
            &format!("stage=\"{}\"", stage.stage),
            stage.commands,
        );
    }
    let events = "weft_reactor_events_total";
    out.family(
        events,
        "counter",
        "Reactor loop events: wake-ups, wake-ups that slept first, receives and sends completed, ticks without spinning (CPU contended).",
    );
    for (event, count) in [
        ("wakeups", stats.wakeups),
        ("sleeps", stats.sleeps),
        ("receives", stats.receives),
        ("sends", stats.sends),
        ("spin_rests", stats.spin_rests),
    ] {
        out.sample(events, &format!("event=\"{event}\""), count);
    }
}
