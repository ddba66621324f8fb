//! The replication simulation over many seeds. `WEFT_SIM_SEEDS` sets how
//! many (default 200; CI runs more), `WEFT_SIM_SEED_BASE` where they start
//! (default 0, so that a run is repeatable). A failing seed prints itself,
//! its last events, and how to replay it: `WEFT_SIM_SEED=N cargo test -p
//! weft-sim --test vopr replay -- --nocapture`.

use weft_sim::{run, SimConfig};

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
    let mut totals = (0, 0, 0, 0, std::time::Duration::ZERO, 0, 0, 0, 0);
    for seed in base..base + count {
        match run(seed, &config) {
            Ok(report) => {
                totals.0 += report.writes;
                totals.1 += report.reads;
                totals.2 += report.promotions;
                totals.3 += report.faults;
                totals.4 = totals.4.max(report.longest_pause);
                totals.5 += report.moves_asked;
                totals.6 += report.moves_done;
                totals.7 += report.power_losses;
                totals.8 += report.member_changes;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    println!(
        "{count} seeds from {base}: {} writes and {} reads checked, {} faults ({} power losses), {} new epochs ({} of {} planned moves done), {} replicas added or removed, longest host pause {:?}",
        totals.0, totals.1, totals.3, totals.7, totals.2, totals.6, totals.5, totals.8, totals.4
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
