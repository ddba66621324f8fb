//! Whether a reactor may spin after activity: only while its CPU is its own.
//!
//! A reactor busy-polls its ring for a short window after activity because
//! waking a sleeping thread costs more than the spin. That holds while no other
//! thread wants the CPU. When the node's other threads (a replicated volume's
//! replicator and links, the control plane, another process) are runnable on
//! the same CPUs, a spinning reactor takes their time: on two shared CPUs,
//! QD32 writes to a volume on two replicas ran at about 35K IOPS without the
//! spin and 26K with it (docs/PERFORMANCE.md, section 8).
//!
//! The signal is the reactor thread's own run delay (time spent runnable but
//! waiting for a CPU, the second field of `/proc/thread-self/schedstat`): a
//! spinner on a CPU of its own waits about 1% of the time, one that shares it
//! with runnable threads waits 20-30%. Over a tick in which the reactor was
//! allowed to spin, more than [`CONTENDED_PERCENT`] means contention; after
//! [`STRIKES`] such ticks in a row the reactor rests (sleeps as soon as its
//! ring is empty) for a while, then spins again to probe, resting twice as
//! long each time the probe finds contention again (up to [`REST_MAX`]).
//! Over a resting tick the run delay tells nothing (a sleeping thread waits
//! for a CPU at every wake-up), so only spinning ticks are judged.
//!
//! This module decides; it does not spin or sleep. Where the kernel keeps no
//! scheduler statistics the reactor always spins, as before.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// Run delay, in percent of a spinning tick's wall time, above which the
/// reactor's CPU counts as contended.
const CONTENDED_PERCENT: u64 = 10;
/// How long the first rest after contention lasts.
const REST_MIN: Duration = Duration::from_secs(1);
/// The longest rest between two probes.
const REST_MAX: Duration = Duration::from_secs(8);
/// Contended ticks in a row that make the reactor rest: one alone may be a
/// burst (a connection set up, the control plane's work), not contention.
const STRIKES: u32 = 2;

/// Decides, tick by tick, whether the reactor may spin.
#[derive(Debug)]
pub(crate) struct SpinGovernor {
    /// The run delay and wall time at the last tick, if judged from there.
    last: Option<Sample>,
    /// Resting until then; `None`: spinning.
    resting_until: Option<Duration>,
    /// How long the next rest lasts.
    next_rest: Duration,
    /// Contended spinning ticks in a row.
    strikes: u32,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    now: Duration,
    run_delay_ns: u64,
}

impl SpinGovernor {
    pub(crate) fn new() -> SpinGovernor {
        SpinGovernor {
            last: None,
            resting_until: None,
            next_rest: REST_MIN,
            strikes: 0,
        }
    }

    /// Whether the reactor may spin now.
    pub(crate) fn may_spin(&self) -> bool {
        self.resting_until.is_none()
    }

    /// A tick at `now` (monotonic), with the reactor thread's run delay so
    /// far (`None`: unknown, spin as configured).
    pub(crate) fn on_tick(&mut self, now: Duration, run_delay_ns: Option<u64>) {
        let Some(run_delay_ns) = run_delay_ns else {
            self.last = None;
            self.resting_until = None;
            self.strikes = 0;
            return;
        };
        let sample = Sample { now, run_delay_ns };
        match self.resting_until {
            Some(until) if now >= until => {
                // Probe: spin again and judge the ticks that follow.
                self.resting_until = None;
                self.last = Some(sample);
            }
            Some(_) => {}
            None => {
                if let Some(last) = self.last {
                    debug_assert!(sample.now >= last.now);
                    if contended(&last, &sample) {
                        self.strikes += 1;
                    } else {
                        self.strikes = 0;
                        self.next_rest = REST_MIN;
                    }
                }
                if self.strikes >= STRIKES {
                    self.strikes = 0;
                    self.resting_until = Some(now + self.next_rest);
                    self.next_rest = (self.next_rest * 2).min(REST_MAX);
                    self.last = None;
                } else {
                    self.last = Some(sample);
                }
            }
        }
    }
}

/// Whether the thread waited for a CPU more than [`CONTENDED_PERCENT`] of
/// the wall time between two samples.
fn contended(before: &Sample, after: &Sample) -> bool {
    let wall_ns = after.now.saturating_sub(before.now).as_nanos();
    let waited_ns = u128::from(after.run_delay_ns.saturating_sub(before.run_delay_ns));
    wall_ns > 0 && waited_ns * 100 > wall_ns * u128::from(CONTENDED_PERCENT)
}

/// The calling thread's scheduler statistics, kept open: read once a tick.
#[derive(Debug)]
pub(crate) struct RunDelay {
    file: Option<File>,
}

impl RunDelay {
    /// Never known (a reactor that does not spin has nothing to govern).
    pub(crate) fn unknown() -> RunDelay {
        RunDelay { file: None }
    }

    /// Opens the calling thread's `schedstat` (call it on the reactor's own
    /// thread: `thread-self` is resolved when opened).
    pub(crate) fn of_current_thread() -> RunDelay {
        RunDelay {
            file: File::open("/proc/thread-self/schedstat").ok(),
        }
    }

    /// Nanoseconds this thread has waited runnable for a CPU, if known.
    pub(crate) fn read(&self) -> Option<u64> {
        let mut text = [0u8; 96];
        let length = self.file.as_ref()?.read_at(&mut text, 0).ok()?;
        parse_run_delay(&text[..length])
    }
}

/// The second field of a `schedstat` line: "on-CPU ns, run delay ns, slices".
fn parse_run_delay(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text)
        .ok()?
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(250);
    /// Run delay over one tick at `percent` of it.
    fn waited(percent: u64) -> u64 {
        TICK.as_nanos() as u64 * percent / 100
    }

    /// Feeds ticks with `percent` run delay each; returns may_spin after each.
    fn run(
        governor: &mut SpinGovernor,
        start: &mut (Duration, u64),
        percents: &[u64],
    ) -> Vec<bool> {
        percents
            .iter()
            .map(|&percent| {
                start.0 += TICK;
                start.1 += waited(percent);
                governor.on_tick(start.0, Some(start.1));
                governor.may_spin()
            })
            .collect()
    }

    #[test]
    fn spins_while_the_cpu_is_its_own() {
        let mut governor = SpinGovernor::new();
        assert!(governor.may_spin());
        let mut clock = (Duration::ZERO, 0);
        assert_eq!(run(&mut governor, &mut clock, &[1, 1, 2, 4]), [true; 4]);
    }

    #[test]
    fn rests_under_contention_and_probes_with_growing_rests() {
        let mut governor = SpinGovernor::new();
        let mut clock = (Duration::ZERO, 0);
        // The first tick sets the baseline; two contended ones in a row rest.
        assert_eq!(
            run(&mut governor, &mut clock, &[25, 25, 25]),
            [true, true, false]
        );
        // One second of rest (four ticks), whatever the delay meanwhile.
        assert_eq!(run(&mut governor, &mut clock, &[20, 20, 20]), [false; 3]);
        assert_eq!(run(&mut governor, &mut clock, &[20]), [true]);
        // The probe is contended: two seconds of rest this time.
        assert_eq!(run(&mut governor, &mut clock, &[25, 25]), [true, false]);
        assert_eq!(run(&mut governor, &mut clock, &[20; 7]), [false; 7]);
        assert_eq!(run(&mut governor, &mut clock, &[20]), [true]);
        // The probe finds the CPU free: spinning again, and rests start short.
        assert_eq!(run(&mut governor, &mut clock, &[1, 1]), [true, true]);
        assert_eq!(run(&mut governor, &mut clock, &[30, 30]), [true, false]);
        assert_eq!(
            run(&mut governor, &mut clock, &[1, 1, 1, 1]),
            [false, false, false, true]
        );
    }

    #[test]
    fn a_lone_contended_tick_is_a_burst() {
        let mut governor = SpinGovernor::new();
        let mut clock = (Duration::ZERO, 0);
        assert_eq!(
            run(&mut governor, &mut clock, &[1, 40, 1, 40, 1, 40]),
            [true; 6]
        );
    }

    #[test]
    fn rests_are_bounded() {
        let mut governor = SpinGovernor::new();
        let mut clock = (Duration::ZERO, 0);
        let spins = run(&mut governor, &mut clock, &[50; 400]);
        // Under lasting contention the rests grow 1, 2, 4, 8, 8... seconds
        // (4 ticks a second), each after a probe of two spinning ticks.
        let rests: Vec<usize> = spins
            .split(|&spinning| spinning)
            .map(<[bool]>::len)
            .filter(|&ticks| ticks > 0)
            .collect();
        assert_eq!(rests[..6], [4, 8, 16, 32, 32, 32]);
        assert_eq!(governor.next_rest, REST_MAX);
    }

    #[test]
    fn unknown_run_delay_spins() {
        let mut governor = SpinGovernor::new();
        let mut clock = (Duration::ZERO, 0);
        run(&mut governor, &mut clock, &[50, 50, 50]);
        assert!(!governor.may_spin());
        governor.on_tick(clock.0 + TICK, None);
        assert!(governor.may_spin());
    }

    #[test]
    fn parses_schedstat() {
        assert_eq!(parse_run_delay(b"123456 7890 42\n"), Some(7890));
        assert_eq!(parse_run_delay(b"123456\n"), None);
        assert_eq!(parse_run_delay(b""), None);
        assert_eq!(parse_run_delay(b"1 x 2"), None);
    }

    #[test]
    fn reads_this_threads_run_delay_where_the_kernel_keeps_it() {
        let delay = RunDelay::of_current_thread();
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            let first = delay.read().expect("schedstat readable");
            assert!(delay.read().unwrap() >= first, "run delay never decreases");
        }
    }
}
