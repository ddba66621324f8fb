//! What a network peer may hold, over real sockets: a connection beyond the
//! listener's limit per peer address is closed at once, before it gets a
//! reactor, and a closed connection gives its place back.

mod support;

use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;
use weft_target::PeerLimits;

#[test]
fn connections_over_the_limit_per_address_are_closed_at_once() {
    let limits = PeerLimits {
        connections_per_listener: 16,
        connections_per_address: 2,
    };
    let plane = support::start_plane_with("limits", limits);
    let address = plane.listening[0];
    // Two from 127.0.0.1 are served (an ICReq gets its ICResp)...
    let first = support::Client::connect(address, false, false);
    let _second = support::Client::connect(address, false, false);
    // ...a third is closed without a word.
    let mut third = TcpStream::connect(address).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        matches!(third.read(&mut [0u8; 1]), Ok(0)),
        "the third connection is closed"
    );
    // Closing one gives its place back (once its reactor has released it).
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut again = TcpStream::connect(address).unwrap();
        again
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        match again.read(&mut [0u8; 1]) {
            // Still open (the target waits for ICReq): admitted.
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
            _ => assert!(
                std::time::Instant::now() < deadline,
                "the closed connection's place never came back"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
