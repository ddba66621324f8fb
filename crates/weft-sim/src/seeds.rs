//! Runs many seeds across the machine's cores. Each seed is a world of its
//! own, so runs share nothing. Seeds are taken in increasing order and a
//! failure stops only the seeds above it, so the failure reported is always
//! the lowest failing seed, whatever the threads' timing: a run's verdict is
//! the same on one core or many. `WEFT_SIM_THREADS` caps the threads
//! (default: the cores available).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Runs `run` for every seed of `seeds` on as many threads as there are
/// cores. Returns each seed's result in seed order, or the lowest failing
/// seed with its failure.
pub fn across_cores<R, E>(
    seeds: Range<u64>,
    run: impl Fn(u64) -> Result<R, E> + Sync,
) -> Result<Vec<R>, (u64, E)>
where
    R: Send,
    E: Send,
{
    let next = AtomicU64::new(seeds.start);
    let lowest_failure = AtomicU64::new(u64::MAX);
    let passed = Mutex::new(Vec::new());
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads() {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= seeds.end || seed > lowest_failure.load(Ordering::Relaxed) {
                    return;
                }
                match run(seed) {
                    Ok(report) => lock(&passed).push((seed, report)),
                    Err(failure) => {
                        lowest_failure.fetch_min(seed, Ordering::Relaxed);
                        lock(&failed).push((seed, failure));
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(lowest) = failed.into_iter().min_by_key(|(seed, _)| *seed) {
        return Err(lowest);
    }
    let mut passed = passed.into_inner().unwrap_or_else(|e| e.into_inner());
    passed.sort_by_key(|(seed, _)| *seed);
    Ok(passed.into_iter().map(|(_, report)| report).collect())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn threads() -> usize {
    match std::env::var("WEFT_SIM_THREADS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("WEFT_SIM_THREADS must be a number, not {v:?}")),
        Err(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_seed_order() {
        let results = across_cores(3..40, |seed| Ok::<_, ()>(seed * 2)).unwrap();
        assert_eq!(results, (3..40).map(|s| s * 2).collect::<Vec<_>>());
    }

    #[test]
    fn the_lowest_failing_seed_is_reported() {
        for _ in 0..20 {
            let failure = across_cores(
                0..200,
                |seed| {
                    if seed % 17 == 16 {
                        Err(seed)
                    } else {
                        Ok(())
                    }
                },
            );
            assert_eq!(failure, Err((16, 16)));
        }
    }
}
