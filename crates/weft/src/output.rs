//! Standard output for the command line, without `println!`'s panic when the
//! reader goes away.
//!
//! `weft volume show v | grep -q ...` closes the pipe as soon as grep has its
//! match; `println!` then panics ("failed printing to stdout") and the command
//! aborts with a backtrace hint. A command whose reader has left has nothing
//! more to do: it ends quietly with success, as `ls | head -1` does. Any other
//! write error (a full disk behind a redirection) is reported and fails.

use std::fmt;
use std::io::{self, Write};

/// Writes `args` to standard output, ending the process as described above
/// when that fails.
pub fn write(args: fmt::Arguments<'_>) {
    let result = io::stdout().lock().write_fmt(args);
    if let Err(error) = result {
        if error.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("weft: cannot write the output: {error}");
        std::process::exit(1);
    }
}

/// `print!` through [`write`].
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::write(format_args!($($arg)*)) };
}

/// `println!` through [`write`].
macro_rules! outln {
    () => { $crate::output::write(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::output::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
