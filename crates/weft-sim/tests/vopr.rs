//! The replication simulation over many seeds. `WEFT_SIM_SEEDS` sets how
//! many (default 200; CI runs more), `WEFT_SIM_SEED_BASE` where they start
//! (default 0, so that a run is repeatable). A failing seed prints itself,
//! its last events, and how to replay it: `WEFT_SIM_SEED=N cargo test -p
//! weft-sim --test vopr replay -- --nocapture`.

use weft_sim::seeds::across_cores;
use weft_sim::{run, Report, SimConfig};

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

#[test]
fn seeds() {
    let count = env_u64("WEFT_SIM_SEEDS").unwrap_or(200);
    let base = env_u64("WEFT_SIM_SEED_BASE").unwrap_or(0);
    let config = SimConfig::default();
    let reports = across_cores(base..base + count, |seed| run(seed, &config))
        .unwrap_or_else(|(_, failure)| panic!("{failure}"));
    let mut t = Report::default();
    for report in &reports {
        t.add(report);
    }
    println!(
        "{count} seeds from {base}: {} writes and {} reads checked, {} writes given up, {} faults ({} power losses, {} disk failures, {} full data directories), {} new epochs ({} taken over by a replica from a silent primary, {} of {} planned moves done), {} replicas added or removed; the store: {} lagging reads, {} commit answers lost; {} file changes failed, {} local writes held; longest host pause {:?}",
        t.writes, t.reads, t.given_up, t.faults, t.power_losses, t.disk_failures, t.files_full, t.promotions, t.takeovers, t.moves_done, t.moves_asked,
        t.member_changes, t.lagging_reads, t.lost_answers, t.files_failed, t.writes_held,
        t.longest_pause
    );
}

#[test]
fn replay() {
    let Some(seed) = env_u64("WEFT_SIM_SEED") else {
        return;
    };
    match run(seed, &SimConfig::default()) {
        Ok(report) => println!("seed {seed} passes: {report:?}"),
        Err(failure) => panic!("{failure}"),
    }
}

#[test]
fn a_seed_replays_the_same_run() {
    let config = SimConfig::default();
    let a = run(7, &config).map(|r| (r.writes, r.reads, r.faults, r.promotions));
    let b = run(7, &config).map(|r| (r.writes, r.reads, r.faults, r.promotions));
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
}
