//! A minimal stderr logger: `[  12.345s WARN ] message`, level from `--log-level` or `WEFT_LOG`.

use std::io::Write;
use std::time::Instant;

struct StderrLogger {
    start: Instant,
    level: log::LevelFilter,
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let elapsed = self.start.elapsed().as_secs_f64();
            let _ = writeln!(
                std::io::stderr().lock(),
                "[{elapsed:9.3}s {:<5}] {}",
                record.level(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

/// Installs the logger; `level` is e.g. "info" or "debug".
pub fn init(level: &str) -> Result<(), String> {
    let level: log::LevelFilter = level.parse().map_err(|_| {
        format!("log level \"{level}\" is not one of error, warn, info, debug, trace, off")
    })?;
    log::set_boxed_logger(Box::new(StderrLogger {
        start: Instant::now(),
        level,
    }))
    .map_err(|error| error.to_string())?;
    log::set_max_level(level);
    Ok(())
}
