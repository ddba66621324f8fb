//! NVMe/TCP over TLS 1.3 in a reactor (NVMe/TCP Transport Specification
//! section 3.6): a connection whose first byte opens a TLS handshake record
//! runs weft's PSK handshake (`weft_proto::tls`) right there (an x25519 and
//! a few HMACs: well under a millisecond of the reactor's time, and only
//! once per connection), then carries the protocol's bytes in records:
//! opened in place in the receive buffer, sealed from the transmit's bytes
//! and slot data into a buffer of the connection's own (TLS costs the copy
//! the clear path avoids). A connection whose first byte is anything else
//! speaks NVMe/TCP in the clear, as on Linux nvmet's listeners whose TLS
//! is "not required": one port serves both, and a host given a TLS PSK is
//! refused in the clear at Connect.
//!
//! A peer's KeyUpdate is taken (RFC 8446 section 4.6.3), and answered
//! before the next record when it asks: weft's initiator asks on the long
//! lived replication links.
//!
//! What this does not do: decide who may connect (the configuration's keys
//! and the protocol's Connect checks do), or send a KeyUpdate or any other
//! post-handshake message unasked (the Linux host ends a queue that gets a
//! NewSessionTicket or KeyUpdate).

use weft_proto::tls::psk::Identity;
use weft_proto::tls::{
    record_len, Alert, Established, KeyUpdates, RecordKeys, ServerHandshake, APPLICATION_DATA,
    HEADER_LEN, MAX_PLAINTEXT, OVERHEAD,
};
use weft_proto::{SlotBuffers, TargetConfig, Transmit, TxSegment};
use weft_uring::IoBuf;

/// A TLS record's content type for alerts (RFC 8446 section 5.1).
const ALERT: u8 = 21;
/// A TLS record's content type for handshake messages: a connection whose
/// first byte is this one starts TLS (an ICReq PDU starts with 0).
const HANDSHAKE: u8 = 22;

/// The buffer a stream seals a transmit into, a piece at a time: four
/// full records.
pub(crate) const OUT_BYTES: usize = 4 * (HEADER_LEN + MAX_PLAINTEXT + OVERHEAD);

/// A connection's TLS, as far as it is known.
pub(crate) enum PeerTls {
    /// Nothing received yet.
    Undecided,
    /// NVMe/TCP in the clear.
    Plain,
    /// The handshake runs; what it has to send waits in the second field.
    Handshake(Box<ServerHandshake>, Vec<u8>),
    /// The protocol's bytes in records.
    Stream(Box<TlsStream>),
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PeerTls::Undecided => "undecided",
            PeerTls::Plain => "plain",
            PeerTls::Handshake(..) => "TLS handshake",
            PeerTls::Stream(_) => "TLS",
        })
    }
}

/// An established stream's record protection and buffers.
pub(crate) struct TlsStream {
    receive: RecordKeys,
    send: RecordKeys,
    /// The peer's key updates, and the answer owed.
    updates: KeyUpdates,
    /// Bytes of an incomplete record kept at the front of the receive buffer.
    pub(crate) partial: usize,
    /// Where sealing the protocol's transmit stands (segment, byte in it),
    /// while it goes out a buffer at a time.
    cursor: Option<(usize, usize)>,
    /// Sealed records; home while no send of them is in flight.
    pub(crate) out: Option<IoBuf>,
}

impl PeerTls {
    /// Decides from a connection's first byte whether it speaks TLS.
    pub(crate) fn decide(&mut self, first: u8, random: &dyn weft_proto::auth::SecureRandom) {
        if matches!(self, PeerTls::Undecided) {
            *self = if first == HANDSHAKE {
                PeerTls::Handshake(Box::new(ServerHandshake::new(random)), Vec::new())
            } else {
                PeerTls::Plain
            };
        }
    }
}

/// Feeds the handshake: once established, the stream. On failure, why,
/// and what to send first: the alert record, protected as the host
/// expects it then.
pub(crate) fn handshake(
    handshake: &mut ServerHandshake,
    output: &mut Vec<u8>,
    received: &[u8],
    config: &TargetConfig,
) -> Result<Option<Established>, (String, Vec<u8>)> {
    let result = handshake.handle_input(received, config);
    output.extend_from_slice(&handshake.take_output());
    match result {
        Ok(()) => Ok(handshake.established()),
        Err(alert) => Err((
            format!("TLS handshake failed: {alert}"),
            std::mem::take(output),
        )),
    }
}

impl TlsStream {
    /// The stream `established` set up. Its leftover (records received
    /// with the host's Finished) is copied to the front of `buffer`, as
    /// an incomplete record would be: the caller opens it next.
    pub(crate) fn new(
        established: Established,
        buffer: &mut IoBuf,
    ) -> Result<(TlsStream, Identity), String> {
        let identity = Identity::parse(&established.identity)
            .ok_or("TLS identity not NVMe's (the PSK store gave a key for it)")?;
        let leftover = &established.leftover;
        buffer.as_mut_slice()[..leftover.len()].copy_from_slice(leftover);
        let out = IoBuf::new(OUT_BYTES).map_err(|e| format!("no memory for TLS records: {e}"))?;
        Ok((
            TlsStream {
                receive: established.receive,
                send: established.send,
                updates: KeyUpdates::answering(),
                partial: leftover.len(),
                cursor: None,
                out: Some(out),
            },
            identity,
        ))
    }

    /// Opens every whole record in `buffer[..end]` in place, handing their
    /// plaintext to `deliver` in order; an incomplete record moves to the
    /// front (`partial`), where the next receive appends to it.
    pub(crate) fn open_records(
        &mut self,
        buffer: &mut [u8],
        end: usize,
        mut deliver: impl FnMut(&[u8]),
    ) -> Result<(), Alert> {
        let mut at = 0;
        while let Some(len) = record_len(&buffer[at..end])? {
            if at + len > end {
                break;
            }
            let record = &mut buffer[at..at + len];
            let (kind, range) = self.receive.open(record)?;
            match kind {
                APPLICATION_DATA => deliver(&record[range]),
                ALERT if range.len() == 2 => return Err(Alert::Received(record[range.start + 1])),
                HANDSHAKE => self.updates.received(&record[range], &mut self.receive)?,
                _ => return Err(Alert::UnexpectedMessage),
            }
            at += len;
        }
        buffer.copy_within(at..end, 0);
        self.partial = end - at;
        Ok(())
    }

    /// Whether a transmit is being sealed a piece at a time (the next piece
    /// comes from `Connection::transmitting`, not `poll_transmit`).
    pub(crate) fn sealing(&self) -> bool {
        self.cursor.is_some()
    }

    /// Seals as much of `transmit` as the out buffer holds, from where the
    /// last piece ended: the bytes sealed, and whether that was the last
    /// piece.
    pub(crate) fn seal(
        &mut self,
        transmit: &Transmit<'_>,
        slots: &mut dyn SlotBuffers,
    ) -> Result<(usize, bool), Alert> {
        let mut out = self
            .out
            .take()
            .expect("the out buffer is home between sends");
        let result = self.seal_into(transmit, slots, out.as_mut_slice());
        self.out = Some(out);
        result
    }

    fn seal_into(
        &mut self,
        transmit: &Transmit<'_>,
        slots: &mut dyn SlotBuffers,
        out: &mut [u8],
    ) -> Result<(usize, bool), Alert> {
        let (mut segment, mut offset) = self.cursor.unwrap_or((0, 0));
        // A KeyUpdate the peer asked for goes first (OUT_BYTES has room for it).
        let update = self.updates.send_due(&mut self.send, &self.receive, out)?;
        // The record being filled starts at `record`; `filled` plaintext bytes so far.
        let (mut record, mut filled) = (update, 0);
        while segment < transmit.segments.len() {
            let room = out.len() - record - HEADER_LEN - OVERHEAD;
            let take_max = room.min(MAX_PLAINTEXT) - filled;
            if take_max == 0 {
                break;
            }
            let piece: &[u8] = match &transmit.segments[segment] {
                TxSegment::Bytes(range) => &transmit.bytes[range.clone()],
                TxSegment::Slot(slot, range) => &slots.buffer(*slot)[range.clone()],
            };
            let take = (piece.len() - offset).min(take_max);
            let at = record + HEADER_LEN + filled;
            out[at..at + take].copy_from_slice(&piece[offset..offset + take]);
            filled += take;
            offset += take;
            if offset == piece.len() {
                (segment, offset) = (segment + 1, 0);
            }
            if filled == MAX_PLAINTEXT {
                record += self
                    .send
                    .seal_in_place(APPLICATION_DATA, filled, &mut out[record..])?;
                filled = 0;
                if out.len() - record < HEADER_LEN + 1 + OVERHEAD {
                    break;
                }
            }
        }
        if filled > 0 {
            record += self
                .send
                .seal_in_place(APPLICATION_DATA, filled, &mut out[record..])?;
        }
        let finished = segment == transmit.segments.len();
        self.cursor = (!finished).then_some((segment, offset));
        Ok((record, finished))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_proto::tls::{CipherSuite, ClientHandshake};
    use weft_proto::types::SlotId;

    #[derive(Debug, Default)]
    struct Counter(std::sync::atomic::AtomicU64);

    impl weft_proto::auth::SecureRandom for Counter {
        fn fill(&self, dest: &mut [u8]) {
            for byte in dest {
                *byte = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as u8 ^ 0x5A;
            }
        }
    }

    struct Psk;

    impl weft_proto::tls::PskStore for Psk {
        fn tls_psks(&self, _identity: &[u8]) -> Vec<Vec<u8>> {
            vec![vec![7; 32]]
        }
    }

    /// Both ends of an established stream.
    fn pair() -> (Established, Established) {
        let identity = b"NVMe0R01 nqn.h nqn.s";
        let mut client = ClientHandshake::new(identity, &[7; 32], &Counter::default());
        let mut server = ServerHandshake::new(&Counter::default());
        for _ in 0..3 {
            server.handle_input(&client.take_output(), &Psk).unwrap();
            client.handle_input(&server.take_output()).unwrap();
        }
        (client.established().unwrap(), server.established().unwrap())
    }

    struct Slots(Vec<Vec<u8>>);

    impl SlotBuffers for Slots {
        fn buffer(&mut self, slot: SlotId) -> &mut [u8] {
            &mut self.0[usize::from(slot.0)]
        }
    }

    /// A transmit larger than the out buffer goes out in pieces, each of
    /// whole records, and the host opens exactly the bytes in order.
    #[test]
    fn a_transmit_is_sealed_in_pieces_of_whole_records_and_opens_in_order() {
        let (mut host, server) = pair();
        assert_eq!(server.suite, CipherSuite::Aes128GcmSha256);
        let mut buffer = IoBuf::new(128 * 1024).unwrap();
        let (mut stream, _) = TlsStream::new(server, &mut buffer).unwrap();
        let bytes: Vec<u8> = (0..100u8).collect();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut slots = Slots(vec![Vec::new(), big.clone()]);
        let segments = vec![
            TxSegment::Bytes(0..24),
            TxSegment::Slot(SlotId(1), 0..big.len()),
            TxSegment::Bytes(24..100),
        ];
        let transmit = Transmit {
            bytes: &bytes,
            segments: &segments,
        };
        let mut expected = bytes[..24].to_vec();
        expected.extend_from_slice(&big);
        expected.extend_from_slice(&bytes[24..]);
        let mut received = Vec::new();
        let mut pieces = 0;
        loop {
            let (len, finished) = stream.seal(&transmit, &mut slots).unwrap();
            pieces += 1;
            let mut wire = stream.out.as_ref().unwrap().as_slice()[..len].to_vec();
            let mut at = 0;
            while at < wire.len() {
                let len = record_len(&wire[at..]).unwrap().unwrap();
                let (kind, range) = host.receive.open(&mut wire[at..at + len]).unwrap();
                assert_eq!(kind, APPLICATION_DATA);
                received.extend_from_slice(&wire[at + range.start..at + range.end]);
                at += len;
            }
            if finished {
                break;
            }
        }
        assert_eq!(received.len(), expected.len());
        assert!(received == expected, "the bytes in order");
        // 200 KB through a buffer of about 68 KiB (page-rounded).
        assert!(pieces >= 3, "{pieces} pieces");
        assert!(!stream.sealing());
    }

    /// Records split anywhere across receives are opened once whole.
    #[test]
    fn records_split_across_receives_are_opened_once_whole() {
        let (mut host, server) = pair();
        let mut buffer = IoBuf::new(128 * 1024).unwrap();
        let (mut stream, _) = TlsStream::new(server, &mut buffer).unwrap();
        let message: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
        let mut wire = Vec::new();
        host.send
            .seal_to(APPLICATION_DATA, &message, &mut wire)
            .unwrap();
        let mut delivered = Vec::new();
        for piece in wire.chunks(1000) {
            let at = stream.partial;
            buffer.as_mut_slice()[at..at + piece.len()].copy_from_slice(piece);
            stream
                .open_records(buffer.as_mut_slice(), at + piece.len(), |p| {
                    delivered.extend_from_slice(p)
                })
                .unwrap();
        }
        assert_eq!(stream.partial, 0);
        assert_eq!(delivered, message);
    }

    /// A host that asks for a key update: what it sends next opens under its
    /// next key, and the target's next transmit starts with its answer.
    #[test]
    fn a_key_update_the_host_asks_for_is_taken_and_answered_first() {
        use weft_proto::tls::KEY_UPDATE_RECORD;
        let (mut host, server) = pair();
        let mut buffer = IoBuf::new(128 * 1024).unwrap();
        let (mut stream, _) = TlsStream::new(server, &mut buffer).unwrap();
        let mut host_updates = KeyUpdates::asking_after(Some(0));
        let mut wire = vec![0u8; KEY_UPDATE_RECORD];
        let update = host_updates
            .send_due(&mut host.send, &host.receive, &mut wire)
            .unwrap();
        assert_eq!(update, KEY_UPDATE_RECORD);
        host.send
            .seal_to(APPLICATION_DATA, b"after the update", &mut wire)
            .unwrap();
        buffer.as_mut_slice()[..wire.len()].copy_from_slice(&wire);
        let mut delivered = Vec::new();
        stream
            .open_records(buffer.as_mut_slice(), wire.len(), |p| {
                delivered.extend_from_slice(p)
            })
            .unwrap();
        assert_eq!(delivered, b"after the update");
        let bytes = b"the answer".to_vec();
        let segments = vec![TxSegment::Bytes(0..bytes.len())];
        let transmit = Transmit {
            bytes: &bytes,
            segments: &segments,
        };
        let mut slots = Slots(Vec::new());
        let mut received = Vec::new();
        for _ in 0..2 {
            let (len, finished) = stream.seal(&transmit, &mut slots).unwrap();
            assert!(finished);
            let mut wire = stream.out.as_ref().unwrap().as_slice()[..len].to_vec();
            let mut at = 0;
            while at < wire.len() {
                let len = record_len(&wire[at..]).unwrap().unwrap();
                let (kind, range) = host.receive.open(&mut wire[at..at + len]).unwrap();
                match kind {
                    APPLICATION_DATA => {
                        received.push(wire[at + range.start..at + range.end].to_vec())
                    }
                    _ => host_updates
                        .received(&wire[at + range.start..at + range.end], &mut host.receive)
                        .unwrap(),
                }
                at += len;
            }
        }
        assert_eq!(received, [bytes.clone(), bytes]);
        // The answer once, and the target asked nothing of its own.
        assert_eq!(host_updates.counts(), (1, 1));
        assert_eq!(stream.updates.counts(), (1, 1));
    }
}
