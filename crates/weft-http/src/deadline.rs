//! A TCP stream with one deadline for everything read from it: a client gets
//! a whole request's time, not a time per read, so that a slow client (one
//! byte every few seconds) cannot hold a server thread for long.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `stream`, whose reads fail with `TimedOut` once its deadline has passed.
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    deadline: Deadline,
}

/// A stream's read deadline, which its server may move (see
/// [`DeadlineStream::with_head_deadline`]).
#[derive(Debug, Clone)]
pub struct Deadline {
    started: Instant,
    /// Nanoseconds after `started`.
    at_ns: Arc<AtomicU64>,
}

impl Deadline {
    fn new(allowed: Duration) -> Deadline {
        Deadline {
            started: Instant::now(),
            at_ns: Arc::new(AtomicU64::new(allowed.as_nanos() as u64)),
        }
    }

    /// Reads must now finish within `allowed` of the stream's start.
    pub fn allow(&self, allowed: Duration) {
        self.at_ns
            .store(allowed.as_nanos() as u64, Ordering::Release);
    }

    fn left(&self) -> Duration {
        let at = self.started + Duration::from_nanos(self.at_ns.load(Ordering::Acquire));
        at.saturating_duration_since(Instant::now())
    }
}

impl DeadlineStream {
    /// Reads must finish within `allowed` from now; a write may take as long
    /// again (a client that stops reading its answer).
    pub fn new(stream: TcpStream, allowed: Duration) -> io::Result<DeadlineStream> {
        Self::with_head_deadline(stream, allowed, allowed).map(|(stream, _)| stream)
    }

    /// Reads must finish within `head` from now, until the returned
    /// deadline is moved (once a request's head is in: see
    /// [`crate::read_request_after_head`]), which allows `whole` from now
    /// for the rest; a write may take `whole`. An idle or slow client
    /// holds its connection for `head` only.
    pub fn with_head_deadline(
        stream: TcpStream,
        head: Duration,
        whole: Duration,
    ) -> io::Result<(DeadlineStream, Deadline)> {
        stream.set_write_timeout(Some(whole.max(Duration::from_millis(1))))?;
        let deadline = Deadline::new(head.min(whole));
        let handle = deadline.clone();
        Ok((DeadlineStream { stream, deadline }, handle))
    }

    /// Looks at the next bytes without taking them, within the deadline.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.peek(buf)
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.left();
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the request took longer than the server allows",
            ));
        }
        Ok(left)
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A client that sends a byte every 100 ms never lets a per-read timeout
    /// of 300 ms fire, but the whole-request deadline of 300 ms does.
    #[test]
    fn a_trickling_client_hits_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut stream = TcpStream::connect(address).unwrap();
            for _ in 0..20 {
                if stream.write_all(b"x").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (accepted, _) = listener.accept().unwrap();
        let mut stream = DeadlineStream::new(accepted, Duration::from_millis(300)).unwrap();
        let started = Instant::now();
        let mut byte = [0u8; 1];
        let error = loop {
            match stream.read(&mut byte) {
                Ok(1) => continue,
                Ok(other) => panic!("read {other} bytes, not one and not an error"),
                Err(error) => break error,
            }
        };
        assert!(
            matches!(
                error.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{error}"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(stream);
        client.join().unwrap();
    }

    /// The head's deadline holds until it is moved; then the whole one does.
    #[test]
    fn a_head_deadline_is_moved_once_the_head_is_in() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(address).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let (mut stream, deadline) = DeadlineStream::with_head_deadline(
            accepted,
            Duration::from_millis(200),
            Duration::from_secs(5),
        )
        .unwrap();
        client.write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).unwrap(), 1);
        deadline.allow(Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(300));
        client.write_all(b"y").unwrap();
        assert_eq!(
            stream.read(&mut byte).unwrap(),
            1,
            "past the head's deadline"
        );
        deadline.allow(Duration::from_millis(1));
        let error = stream.read(&mut byte).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }
}
