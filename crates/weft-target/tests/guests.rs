//! A reactor's guests (`weft_target::guest`): a guest with a ring of its
//! own gets its turns from the reactor that hosts it, woken by its
//! doorbell alone (its timers, another thread's eventfd), and is dropped
//! once it says it has finished.

mod support;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use weft_target::guest::Guest;
use weft_uring::{Op, Ring};

const TIMER: u64 = 1;
const KICKED: u64 = 2;

/// Fires its timer `timers` times, then waits for a kick and finishes.
struct Ticker {
    ring: Ring,
    timers_left: u32,
    kicked: bool,
    /// Open while its read is on the ring (ops borrow descriptors by number).
    _kick: File,
    fired: Arc<AtomicU32>,
    dropped: Arc<AtomicBool>,
}

impl Guest for Ticker {
    fn has_work(&mut self) -> bool {
        self.ring.has_work()
    }

    fn turn(&mut self) -> bool {
        while let Some(completion) = self.ring.pop() {
            match completion.user_data {
                TIMER => {
                    self.fired.fetch_add(1, Ordering::AcqRel);
                    self.timers_left -= 1;
                    if self.timers_left > 0 {
                        let after = Duration::from_millis(5);
                        self.ring.push(Op::Timeout { after }, TIMER).unwrap();
                    }
                }
                KICKED => self.kicked = true,
                other => panic!("unknown completion {other}"),
            }
        }
        if self.timers_left == 0 && self.kicked {
            return false;
        }
        self.ring.submit_and_wait(0).unwrap();
        true
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Release);
    }
}

/// Hosts on `plane`, by `key`, a [`Ticker`] of `timers` timers: how many
/// fired, whether it was dropped, and the eventfd that kicks it.
fn host_ticker(
    plane: &weft_target::DataPlane,
    key: &str,
    timers: u32,
) -> (Arc<AtomicU32>, Arc<AtomicBool>, File) {
    let kick = weft_uring::eventfd().unwrap();
    let mut ring = Ring::new(8).unwrap();
    let after = Duration::from_millis(5);
    ring.push(Op::Timeout { after }, TIMER).unwrap();
    let fd = kick.as_raw_fd();
    ring.push(Op::ReadEventfd { fd }, KICKED).unwrap();
    let doorbell = weft_uring::eventfd().unwrap();
    ring.register_eventfd(doorbell.as_raw_fd()).unwrap();
    let (fired, dropped) = (Arc::default(), Arc::default());
    let ticker = Ticker {
        ring,
        timers_left: timers,
        kicked: false,
        _kick: kick.try_clone().unwrap(),
        fired: Arc::clone(&fired),
        dropped: Arc::clone(&dropped),
    };
    plane.host(key, Box::new(ticker), doorbell);
    (fired, dropped, kick)
}

#[test]
fn a_guest_is_given_turns_by_its_doorbell_and_dropped_once_finished() {
    let plane = support::start_plane("guests");
    let (fired, dropped, kick) = host_ticker(&plane, "ticker", 3);

    // Each timer is pushed in a turn, and its completion brings the next.
    support::eventually("three timers fired", || fired.load(Ordering::Acquire) == 3);
    std::thread::sleep(Duration::from_millis(20));
    assert!(!dropped.load(Ordering::Acquire), "still waits for its kick");
    (&kick).write_all(&1u64.to_ne_bytes()).unwrap();
    support::eventually("the guest dropped", || dropped.load(Ordering::Acquire));
}

/// Counts its turns and the thread they came on; its ring never has work.
struct Idle {
    ring: Ring,
    turns: Arc<AtomicU32>,
    thread: Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>,
}

impl Guest for Idle {
    fn has_work(&mut self) -> bool {
        self.ring.has_work()
    }

    fn turn(&mut self) -> bool {
        self.turns.fetch_add(1, Ordering::AcqRel);
        *self.thread.lock().unwrap() = Some(std::thread::current().id());
        true
    }
}

/// Every replicator ticks on its own doorbell; a reactor that turned all
/// its guests at any doorbell spent G^2 turns per tick on G guests, which
/// starved nodes holding a hundred replicated volumes while at rest.
#[test]
fn a_doorbell_turns_its_own_guest_and_no_other() {
    let plane = support::start_plane("guests-own-turns");
    let idle: Vec<_> = (0..8)
        .map(|n| {
            let (turns, thread) = (Arc::new(AtomicU32::new(0)), Arc::default());
            let doorbell = weft_uring::eventfd().unwrap();
            let mut ring = Ring::new(8).unwrap();
            ring.register_eventfd(doorbell.as_raw_fd()).unwrap();
            let guest = Idle {
                ring,
                turns: Arc::clone(&turns),
                thread: Arc::clone(&thread),
            };
            plane.host(&format!("idle-{n}"), Box::new(guest), doorbell);
            (turns, thread)
        })
        .collect();
    support::eventually("every idle guest had its first turn", || {
        idle.iter()
            .all(|(turns, _)| turns.load(Ordering::Acquire) >= 1)
    });
    // A ticker on each reactor: twenty timers each, a doorbell each.
    let tickers: Vec<_> = (0..8)
        .map(|n| {
            let (fired, _, kick) = host_ticker(&plane, &format!("ticker-{n}"), 20);
            (fired, kick)
        })
        .collect();
    support::eventually("every ticker fired its timers", || {
        tickers
            .iter()
            .all(|(fired, _)| fired.load(Ordering::Acquire) == 20)
    });
    for (turns, thread) in &idle {
        assert!(thread.lock().unwrap().is_some());
        assert_eq!(
            turns.load(Ordering::Acquire),
            1,
            "turned by the doorbells of others on its reactor"
        );
    }
    for (_, kick) in &tickers {
        (&*kick).write_all(&1u64.to_ne_bytes()).unwrap();
    }
}
