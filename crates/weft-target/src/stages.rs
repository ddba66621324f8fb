//! Where a command's time goes inside the target, stage by stage, so that a
//! benchmark can tell the device's time from the target's own queueing.
//!
//! Each stage keeps how many commands passed through it and the sum of the
//! time they spent in it; by Little's law, a stage's sum over a wall-clock
//! interval divided by that interval is the number of commands in it on
//! average. Four stages, in a command's order:
//! - **receive to start**: from the receive completion that brought the
//!   command (or its last data) to the reactor starting it;
//! - **service**: started to completed (the device's time, a QoS wait
//!   included: the namespaces' latency histograms measure the same span);
//! - **reply wait**: completed to its response queued on the socket;
//! - **send**: queued on the socket to the send completing.
//!
//! Besides them, counters of the reactors' loops: wake-ups, the ones that
//! slept first, receive and send completions. A reactor counts in plain
//! integers ([`LocalStages`]) and adds them to the shared [`StageTotals`]
//! every tick, as the meters do; the only clock reads this adds are two per
//! send that carries responses, on the clock the reactor reads for each
//! command anyway.
//!
//! The counts are the target's I/O requests: a Dataset Management of N
//! ranges, or a Flush of every namespace, is N of them behind one response.
//!
//! What this does not do: per-command histograms of every stage (the
//! namespaces' histograms cover the service time), or the host's side (the
//! initiator measures its own).

use std::sync::atomic::{AtomicU64, Ordering};

/// A stage of a command inside the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Receive completion to the reactor starting the command.
    ReceiveToStart = 0,
    /// Started to completed.
    Service = 1,
    /// Completed to its response queued on the socket.
    ReplyWait = 2,
    /// Queued on the socket to the send completing.
    Send = 3,
}

impl Stage {
    /// Every stage, in a command's order.
    pub const ALL: [Stage; 4] = [
        Stage::ReceiveToStart,
        Stage::Service,
        Stage::ReplyWait,
        Stage::Send,
    ];

    /// The stage's name in reports (snake case).
    pub fn name(self) -> &'static str {
        match self {
            Stage::ReceiveToStart => "receive_to_start",
            Stage::Service => "service",
            Stage::ReplyWait => "reply_wait",
            Stage::Send => "send",
        }
    }
}

/// A counter of the reactors' loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopCounter {
    /// Times a reactor went to the kernel for completions.
    Wakeups = 0,
    /// Of them, the times it slept (nothing was ready after its spin).
    Sleeps = 1,
    /// Receive completions that brought bytes.
    Receives = 2,
    /// Send completions (a partial send's remainder counts again).
    Sends = 3,
    /// Ticks a reactor spent not spinning because other threads wanted its
    /// CPU (see the reactor's spin governor).
    SpinRests = 4,
}

impl LoopCounter {
    /// Every counter.
    pub const ALL: [LoopCounter; 5] = [
        LoopCounter::Wakeups,
        LoopCounter::Sleeps,
        LoopCounter::Receives,
        LoopCounter::Sends,
        LoopCounter::SpinRests,
    ];

    /// The counter's name in reports (snake case).
    pub fn name(self) -> &'static str {
        match self {
            LoopCounter::Wakeups => "wakeups",
            LoopCounter::Sleeps => "sleeps",
            LoopCounter::Receives => "receives",
            LoopCounter::Sends => "sends",
            LoopCounter::SpinRests => "spin_rests",
        }
    }
}

const STAGES: usize = Stage::ALL.len();
const COUNTERS: usize = LoopCounter::ALL.len();

/// One reactor's counts since it last published.
#[derive(Debug, Default)]
pub(crate) struct LocalStages {
    commands: [u64; STAGES],
    sum_ns: [u64; STAGES],
    counters: [u64; COUNTERS],
}

impl LocalStages {
    /// `commands` commands spent `total_ns` in `stage`, together.
    pub(crate) fn add(&mut self, stage: Stage, commands: u64, total_ns: u64) {
        self.commands[stage as usize] += commands;
        self.sum_ns[stage as usize] += total_ns;
    }

    /// One more of `counter`.
    pub(crate) fn count(&mut self, counter: LoopCounter) {
        self.counters[counter as usize] += 1;
    }

    /// Adds everything to `totals` and starts again from zero.
    pub(crate) fn publish(&mut self, totals: &StageTotals) {
        let pairs = self
            .commands
            .iter_mut()
            .zip(&totals.commands)
            .chain(self.sum_ns.iter_mut().zip(&totals.sum_ns))
            .chain(self.counters.iter_mut().zip(&totals.counters));
        for (local, shared) in pairs {
            if *local != 0 {
                shared.fetch_add(std::mem::take(local), Ordering::Relaxed);
            }
        }
    }
}

/// Every reactor's counts, added up.
#[derive(Debug, Default)]
pub struct StageTotals {
    commands: [AtomicU64; STAGES],
    sum_ns: [AtomicU64; STAGES],
    counters: [AtomicU64; COUNTERS],
}

/// One stage's totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTotal {
    /// Commands that went through it.
    pub commands: u64,
    /// The time they spent in it, added up, nanoseconds.
    pub sum_ns: u64,
}

/// The totals at one moment (published up to the last tick).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StagesSnapshot {
    /// Per stage, in [`Stage::ALL`] order.
    pub stages: [StageTotal; STAGES],
    /// Per counter, in [`LoopCounter::ALL`] order.
    pub counters: [u64; COUNTERS],
}

impl StageTotals {
    /// What has been published so far.
    pub fn snapshot(&self) -> StagesSnapshot {
        let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
        StagesSnapshot {
            stages: std::array::from_fn(|index| StageTotal {
                commands: load(&self.commands[index]),
                sum_ns: load(&self.sum_ns[index]),
            }),
            counters: std::array::from_fn(|index| load(&self.counters[index])),
        }
    }
}

/// Responses that completed and wait for a send, or ride one: how many and
/// the sum of their completion times, so that the time each waits adds up
/// exactly without keeping a time per response.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Waiting {
    commands: u64,
    sum_since_ns: u64,
}

impl Waiting {
    /// One more, since `now_ns`.
    pub(crate) fn push(&mut self, now_ns: u64) {
        self.commands += 1;
        self.sum_since_ns = self.sum_since_ns.wrapping_add(now_ns);
    }

    /// All of them leave at `now_ns`: (how many, the time they waited added up).
    /// Wrapping arithmetic: the sums may pass 2^64 after days of uptime,
    /// but their difference, the time waited, fits and comes out exact.
    pub(crate) fn leave(&mut self, now_ns: u64) -> (u64, u64) {
        let left = std::mem::take(self);
        let total_ns = left
            .commands
            .wrapping_mul(now_ns)
            .wrapping_sub(left.sum_since_ns);
        (left.commands, total_ns)
    }

    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.commands == 0
    }

    /// `commands` start waiting at `now_ns` together.
    pub(crate) fn all_since(commands: u64, now_ns: u64) -> Waiting {
        Waiting {
            commands,
            sum_since_ns: commands.wrapping_mul(now_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_adds_up_each_command_s_own_wait() {
        let mut waiting = Waiting::default();
        assert!(waiting.is_empty());
        waiting.push(100);
        waiting.push(250);
        // 400 - 100 + 400 - 250.
        assert_eq!(waiting.leave(400), (2, 450));
        assert!(waiting.is_empty());
        assert_eq!(waiting.leave(500), (0, 0));
        let mut sending = Waiting::all_since(3, 1_000);
        assert_eq!(sending.leave(1_010), (3, 30));
        // Sums past 2^64 (days of uptime, many waiting) still give the wait.
        let late = u64::MAX / 2;
        let mut waiting = Waiting::default();
        waiting.push(late);
        waiting.push(late + 10);
        waiting.push(late + 20);
        assert_eq!(waiting.leave(late + 30), (3, 60));
    }

    #[test]
    fn a_publish_adds_and_starts_from_zero() {
        let totals = StageTotals::default();
        let mut local = LocalStages::default();
        local.add(Stage::Service, 2, 70);
        local.count(LoopCounter::Wakeups);
        local.count(LoopCounter::Wakeups);
        local.publish(&totals);
        local.add(Stage::Service, 1, 30);
        local.add(Stage::Send, 4, 8);
        local.publish(&totals);
        local.publish(&totals);
        let snapshot = totals.snapshot();
        let service = snapshot.stages[Stage::Service as usize];
        assert_eq!(
            service,
            StageTotal {
                commands: 3,
                sum_ns: 100
            }
        );
        assert_eq!(snapshot.stages[Stage::Send as usize].commands, 4);
        assert_eq!(snapshot.counters[LoopCounter::Wakeups as usize], 2);
        assert_eq!(snapshot.counters[LoopCounter::Sends as usize], 0);
    }
}
