//! Listeners: one accepting thread per address, handing each connection to a
//! reactor in turn.

use crate::exports::Exports;
use crate::reactor::{Message, ReactorHandle};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};
use thiserror::Error;

/// The running data plane.
#[derive(Debug)]
pub struct DataPlane {
    /// Addresses actually bound (port 0 resolved), in the order given.
    pub listening: Vec<SocketAddr>,
    exports: Arc<Exports>,
}

/// Why the data plane could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A reactor thread or its io_uring could not be created.
    #[error("cannot start reactor: {0}")]
    Reactor(#[source] io::Error),
}

impl DataPlane {
    /// Binds every address, starts `reactors` reactor threads and the accepting threads.
    /// After any activity a reactor polls for `poll_window` before it sleeps
    /// (zero: purely interrupt driven).
    pub fn start(
        exports: Arc<Exports>,
        addresses: &[SocketAddr],
        reactors: usize,
        poll_window: Duration,
    ) -> Result<DataPlane, StartError> {
        assert!(reactors > 0, "at least one reactor");
        let listeners = addresses
            .iter()
            .map(|&address| {
                TcpListener::bind(address).map_err(|source| StartError::Bind { address, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let listening = listeners
            .iter()
            .map(|l| l.local_addr().expect("bound sockets have an address"))
            .collect();
        let epoch = Instant::now();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let handles = (0..reactors)
            .map(|index| {
                ReactorHandle::spawn(
                    index,
                    index % cpus,
                    Arc::clone(&exports),
                    epoch,
                    poll_window,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(StartError::Reactor)?;
        let handles = Arc::new(handles);
        for listener in listeners {
            let handles = Arc::clone(&handles);
            std::thread::Builder::new()
                .name("weft-accept".into())
                .spawn(move || accept_loop(listener, &handles))
                .map_err(StartError::Reactor)?;
        }
        Ok(DataPlane { listening, exports })
    }

    /// Makes every acknowledged write durable (fdatasync on every device), e.g. before exiting.
    pub fn flush_all(&self) {
        for device in self.exports.all_devices() {
            if let Err(error) = weft_uring::fdatasync(device.fd()) {
                log::error!("flush of {} failed: {error}", device.describe());
            }
        }
    }
}

fn accept_loop(listener: TcpListener, reactors: &[ReactorHandle]) {
    let mut next = 0;
    loop {
        match listener.accept() {
            Ok((stream, address)) => {
                reactors[next % reactors.len()].send(Message::Connection(stream, address));
                next += 1;
            }
            Err(error) => {
                // EMFILE and friends: back off instead of spinning.
                log::warn!("accept on {:?} failed: {error}", listener.local_addr());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
