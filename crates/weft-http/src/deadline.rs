//! A TCP stream with one deadline for everything read from it: a client gets
//! a whole request's time, not a time per read, so that a slow client (one
//! byte every few seconds) cannot hold a server thread for long.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `stream`, whose reads fail with `TimedOut` once `deadline` has passed.
#[derive(Debug)]
pub struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl DeadlineStream {
    /// Reads must finish within `allowed` from now; a write may take as long
    /// again (a client that stops reading its answer).
    pub fn new(stream: TcpStream, allowed: Duration) -> io::Result<DeadlineStream> {
        stream.set_write_timeout(Some(allowed.max(Duration::from_millis(1))))?;
        Ok(DeadlineStream {
            stream,
            deadline: Instant::now() + allowed,
        })
    }

    /// Looks at the next bytes without taking them, within the deadline.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.peek(buf)
    }

    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
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
}
