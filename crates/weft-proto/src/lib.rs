//! weft-proto: the sans-IO NVMe/TCP target core.
//!
//! PDU and command codecs, Identify and log page structures, and the
//! connection/controller state machines. No sockets, clocks, threads or
//! files: the data plane feeds bytes and time in and executes the block I/O
//! and transmissions that come out (see [`connection`] for the driving
//! order). Everything here is deterministic and runs in memory in tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
pub mod ana;
pub mod auth;
pub mod command;
pub mod connection;
pub mod digest;
pub mod fence;
mod framing;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod host;
pub mod identify;
pub mod intent;
pub mod io;
mod keytext;
pub mod pdu;
pub mod reservation;
pub mod status;
pub mod target;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
mod transmit;
pub mod types;
pub mod wire;

pub use connection::{Connection, RefusedHost, SlotBuffers, Termination, Transmit, TxSegment};
pub use io::{IoError, IoKind, IoRequest};
pub use target::{Limits, LimitsError, Target, TargetConfig};
