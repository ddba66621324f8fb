//! The erasure-coded simulation over many seeds, each of the issue's
//! layouts in turn. `WEFT_EC_SIM_SEEDS` sets how many (default 60; CI runs
//! more), `WEFT_SIM_SEED_BASE` where they start. A failing seed prints
//! itself, its last events, and how to replay it: `WEFT_SIM_SEED=N cargo
//! test -p weft-sim --test ec replay -- --nocapture`.

use weft_ec::Layout;
use weft_sim::ec::{run_ec, EcReport, EcSimConfig};
use weft_sim::seeds::across_cores;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

/// The layout seed `seed` runs: 2+1, 4+2, 4+1, 8+2 in turn.
fn config(seed: u64) -> EcSimConfig {
    let (k, m) = [(2, 1), (4, 2), (4, 1), (8, 2)][(seed % 4) as usize];
    EcSimConfig::new(Layout::new(k, m).expect("a layout"))
}

#[test]
fn seeds() {
    let count = env_u64("WEFT_EC_SIM_SEEDS").unwrap_or(60);
    let base = env_u64("WEFT_SIM_SEED_BASE").unwrap_or(0);
    let reports = across_cores(base..base + count, |seed| run_ec(seed, &config(seed)))
        .unwrap_or_else(|(_, failure)| {
            panic!(
                "{}",
                failure.to_string().replace("--test vopr", "--test ec")
            )
        });
    let mut t = EcReport::default();
    for report in &reports {
        t.add(report);
    }
    println!(
        "{count} seeds from {base}: {} writes and {} reads checked, {} retries; {} crashes ({} writes torn), {} pauses, {} cuts, {} disk failures; {} of {} planned moves done, {} new epochs, {} members rebuilt into sync; {} of {} snapshots taken and checked",
        t.writes, t.reads, t.retries, t.crashes, t.torn_writes, t.pauses, t.cuts, t.disk_failures, t.moves_done, t.moves_asked, t.promotions, t.rejoins, t.snapshots_taken, t.snapshots_asked
    );
}

#[test]
fn replay() {
    let Some(seed) = env_u64("WEFT_SIM_SEED") else {
        return;
    };
    match run_ec(seed, &config(seed)) {
        Ok(report) => println!("seed {seed} passes: {report:?}"),
        Err(failure) => panic!(
            "{}",
            failure.to_string().replace("--test vopr", "--test ec")
        ),
    }
}
