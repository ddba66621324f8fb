//! A link's connection on the replicator's ring: the replica's NVMe/TCP I/O
//! queue, driven by the protocol core's `HostQueue`, its receives and sends
//! io_uring operations on the replicator's own ring (see `super::write_ring`),
//! so that a replicated write crosses no thread between the replicator and
//! the socket. A thread per link, blocked in `recv`, cost 4-5 us of CPU per
//! write and two wake-ups per batch on this machine kind.
//!
//! One receive is always armed; one send at most is in flight, carrying
//! everything the queue had to send when it was pushed, so bytes go out in
//! order. A command's data shared with the replicator (a host write's, see
//! [`CommandData::Shared`]) is sent from where it is, never copied here;
//! headers and other data are copied into the send's own buffer, and the
//! command buffers are then free.
//!
//! A link in a TLS stream (between nodes with certificates) seals each send
//! into records in the send's buffer (its shared data copied once, into
//! the plaintext gathered for sealing) and opens what it receives before
//! the queue reads it.
//!
//! What this does not do: build commands or know what they mean
//! (`super::link`), connect (the link's attach thread does, blocking), or
//! time a silent replica out (the replication core's replica timeout does,
//! and the replicator replaces the link).

use super::write_ring::WriteRing;
use std::io::Write as _;
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::os::fd::AsRawFd;
use weft_initiator::{HeapBuffers, TlsStream};
use weft_proto::host::{DataTransfer, HostCompletion, HostQueue, SubmitError};
use weft_proto::types::{Cid, SlotId};
use weft_proto::{SlotBuffers, Transmit, TxSegment};
use weft_uring::{Completion, IoBuf, Op, Returned, SendBatch, SharedBuf};

/// Bytes one receive may bring.
const RECEIVE_BYTES: usize = 256 * 1024;
/// The send buffer's usual size; a larger batch gets a buffer of its own,
/// kept after its send up to `SEND_BYTES_KEPT`.
const SEND_BYTES_MIN: usize = 256 * 1024;
const SEND_BYTES_KEPT: usize = 2 * 1024 * 1024;

/// Segments of one send read from shared buffers at most: with the runs
/// of copied bytes between them, within `sendmsg`'s 1024 iovecs (past it,
/// the rest is copied).
const SHARED_SEGMENTS_MAX: usize = 500;

/// A command's data.
#[derive(Debug)]
pub(crate) enum CommandData {
    None,
    /// Copied into the command's buffer.
    Owned(Vec<u8>),
    /// A range of a buffer the replicator and the other links share: sent
    /// from where it is (unless the queue sends data digests, which are
    /// computed over the command's buffer: then copied there).
    Shared(SharedBuf, Range<usize>),
}

impl CommandData {
    fn bytes(&self) -> &[u8] {
        match self {
            CommandData::None => &[],
            CommandData::Owned(data) => data,
            CommandData::Shared(data, range) => &data[range.clone()],
        }
    }
}

/// A socket's operations on the ring, as their tokens tell them apart.
const RECEIVE: u64 = 0;
const SEND: u64 = 1;

/// The socket a completion's token (without the ring's socket bit) belongs to.
pub(crate) fn socket_of(token: u64) -> u32 {
    (token >> 1) as u32
}

/// A connected I/O queue whose I/O runs on the replicator's ring.
#[derive(Debug)]
pub(crate) struct RingSocket {
    /// Unique among the replicator's sockets (its completions' tokens carry it).
    id: u32,
    stream: TcpStream,
    host: HostQueue,
    buffers: HeapBuffers,
    /// By CID: the shared data a command sends from where it is, and the
    /// offset of its first byte there (none: its data is in its buffer).
    in_place: Vec<Option<(SharedBuf, usize)>>,
    /// The receive buffer, while no receive is in flight.
    receive: Option<IoBuf>,
    /// The send batch (with its one buffer), while no send is in flight.
    send: Option<SendBatch>,
    /// A receive is on the ring. Set only once pushed: an operation the
    /// ring refused (and dropped, with its buffer) is not waited for.
    receiving: bool,
    /// A send is on the ring (as `receiving`).
    sending: bool,
    /// Shut down: no receive is armed again.
    closed: bool,
    /// The TLS stream's record state, and the plaintext of a send gathered
    /// for sealing (kept between sends), when the link is in one.
    tls: Option<(TlsStream, Vec<u8>)>,
}

impl RingSocket {
    /// Takes over an initiator queue's parts.
    pub(crate) fn new(
        id: u32,
        (stream, host, buffers, tls): (TcpStream, HostQueue, HeapBuffers, Option<TlsStream>),
    ) -> std::io::Result<RingSocket> {
        let mut send = SendBatch::new();
        send.push_buf(IoBuf::new(SEND_BYTES_MIN)?);
        Ok(RingSocket {
            id,
            stream,
            host,
            buffers,
            in_place: Vec::new(),
            receive: Some(IoBuf::new(RECEIVE_BYTES)?),
            send: Some(send),
            receiving: false,
            sending: false,
            closed: false,
            tls: tls.map(|stream| (stream, Vec::new())),
        })
    }

    /// Its id, as completions' tokens carry it.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Queues a command with its data (see [`CommandData`]); sent at the
    /// next [`RingSocket::start`].
    pub(crate) fn submit(
        &mut self,
        command: [u8; 64],
        transfer: DataTransfer,
        data: &CommandData,
    ) -> Result<Cid, SubmitError> {
        let Some(cid) = self.host.next_cid() else {
            return Err(SubmitError::QueueFull);
        };
        let in_place = match data {
            CommandData::Shared(buf, range) if !self.host.data_digest() => {
                Some((buf.clone(), range.start))
            }
            _ => None,
        };
        let bytes = data.bytes();
        if in_place.is_none() && !bytes.is_empty() {
            let buffer = self.buffers.buffer(SlotId(cid.0));
            let Some(room) = buffer.get_mut(..bytes.len()) else {
                return Err(SubmitError::TooLarge);
            };
            room.copy_from_slice(bytes);
        }
        let submitted = self.host.submit(command, transfer, &mut self.buffers)?;
        debug_assert_eq!(submitted, cid, "the CID announced");
        let at = usize::from(cid.0);
        if at >= self.in_place.len() {
            self.in_place.resize(at + 1, None);
        }
        self.in_place[at] = in_place;
        Ok(cid)
    }

    /// Arms the receive if none is in flight and pushes a send of what the
    /// queue has to send if none is in flight (submitted with the ring's
    /// next wait). A failure ends the connection.
    pub(crate) fn start(&mut self, ring: &mut WriteRing) -> Result<(), String> {
        let fd = self.stream.as_raw_fd();
        if !self.closed && !self.receiving {
            let buf = self.receive.take().ok_or("no receive buffer")?;
            let len = buf.capacity();
            let op = Op::Recv {
                fd,
                buf,
                offset: 0,
                len,
            };
            ring.push_socket(op, self.token(RECEIVE))
                .map_err(|e| format!("cannot receive: {e}"))?;
            self.receiving = true;
        }
        if self.sending {
            return Ok(());
        }
        if self.tls.is_some() {
            return self.start_sealed(ring);
        }
        let Some(transmit) = self.host.poll_transmit() else {
            return Ok(());
        };
        let copied: usize = placed(&transmit, &self.in_place)
            .filter(|(_, place)| place.is_none())
            .map(|(segment, _)| segment_len(segment))
            .sum();
        // A larger buffer first: a failure leaves the batch and its buffer in place.
        let small = self
            .send
            .as_ref()
            .is_some_and(|b| b.buf(0).capacity() < copied);
        let larger = if small {
            Some(IoBuf::new(copied).map_err(|e| format!("no send buffer: {e}"))?)
        } else {
            None
        };
        let mut batch = self.send.take().ok_or("no send buffer")?;
        let kept = batch
            .take_bufs()
            .next()
            .expect("the batch keeps its buffer");
        let mut buf = larger.unwrap_or(kept);
        let mut at = 0;
        for (segment, place) in placed(&transmit, &self.in_place) {
            if place.is_none() {
                let bytes = segment_bytes(&transmit, segment, &mut self.buffers, &self.in_place);
                buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
        }
        let index = batch.push_buf(buf);
        // The copied runs between the shared segments, in order.
        let (mut run_start, mut run_end) = (0, 0);
        for (segment, place) in placed(&transmit, &self.in_place) {
            match place {
                None => run_end += segment_len(segment),
                Some((shared, range)) => {
                    if run_end > run_start {
                        batch.push_segment(index, run_start..run_end);
                    }
                    run_start = run_end;
                    batch.push_shared(shared.clone(), range);
                }
            }
        }
        if run_end > run_start {
            batch.push_segment(index, run_start..run_end);
        }
        // Copied or held by the batch: the command buffers are free to complete.
        self.host.on_transmitted();
        ring.push_socket(Op::Send { fd, batch }, self.token(SEND))
            .map_err(|e| format!("cannot send: {e}"))?;
        self.sending = true;
        Ok(())
    }

    /// [`RingSocket::start`]'s send in a TLS stream: everything the queue
    /// has to send, gathered and sealed into the send's buffer.
    fn start_sealed(&mut self, ring: &mut WriteRing) -> Result<(), String> {
        let fd = self.stream.as_raw_fd();
        let Some(transmit) = self.host.poll_transmit() else {
            return Ok(());
        };
        let (tls, plain) = self.tls.as_mut().expect("a TLS link");
        plain.clear();
        for segment in transmit.segments {
            plain.extend_from_slice(segment_bytes(
                &transmit,
                segment,
                &mut self.buffers,
                &self.in_place,
            ));
        }
        let sealed_len = TlsStream::sealed_len(plain.len());
        let mut batch = self.send.take().ok_or("no send buffer")?;
        let kept = batch
            .take_bufs()
            .next()
            .expect("the batch keeps its buffer");
        let mut buf = if kept.capacity() < sealed_len {
            match IoBuf::new(sealed_len) {
                Ok(larger) => larger,
                Err(error) => {
                    batch.push_buf(kept);
                    self.send = Some(batch);
                    return Err(format!("no send buffer: {error}"));
                }
            }
        } else {
            kept
        };
        let len = tls
            .seal_into(plain, buf.as_mut_slice())
            .map_err(|alert| format!("cannot seal: {alert}"))?;
        let index = batch.push_buf(buf);
        batch.push_segment(index, 0..len);
        // Sealed: the command buffers and shared data are free to complete.
        self.host.on_transmitted();
        ring.push_socket(Op::Send { fd, batch }, self.token(SEND))
            .map_err(|e| format!("cannot send: {e}"))?;
        self.sending = true;
        Ok(())
    }

    /// Feeds received bytes to the queue: as they are, or opened from
    /// their records in a TLS stream.
    fn feed(&mut self, received: &[u8]) -> Result<(), String> {
        let (host, buffers) = (&mut self.host, &mut self.buffers);
        match &mut self.tls {
            None => host.handle_input(received, buffers),
            Some((tls, _)) => tls
                .open(received, |plaintext| host.handle_input(plaintext, buffers))
                .map_err(|alert| format!("TLS: {alert}"))?,
        }
        Ok(())
    }

    /// One of its operations completed: what it received is fed to the
    /// queue (its completions are then ready to poll), a short send is
    /// pushed again for the rest. An error ends the connection.
    pub(crate) fn completed(
        &mut self,
        completion: Completion,
        ring: &mut WriteRing,
    ) -> Result<(), String> {
        match (completion.user_data & 1, completion.returned) {
            (RECEIVE, Returned::Buf(buf)) => {
                self.receiving = false;
                let result = match completion.result {
                    Ok(0) => Err(match self.host.error() {
                        Some(error) => format!("the replica ended the connection: {error}"),
                        None => "the replica closed the connection".to_string(),
                    }),
                    Ok(len) => match self.feed(&buf.as_slice()[..len]) {
                        Err(error) => Err(error),
                        Ok(()) => match self.host.error() {
                            Some(error) => {
                                self.terminate_now();
                                Err(format!("protocol error: {error}"))
                            }
                            None => Ok(()),
                        },
                    },
                    Err(error) => Err(format!("cannot receive: {error}")),
                };
                self.receive = Some(buf);
                result
            }
            (SEND, Returned::Batch(mut batch)) => {
                self.sending = false;
                let sent = completion.result.map_err(|e| format!("cannot send: {e}"));
                let result = match sent {
                    Ok(0) => Err("cannot send: the connection is closed".to_string()),
                    Ok(len) if len < batch.total_len() => {
                        batch.consume(len);
                        let fd = self.stream.as_raw_fd();
                        ring.push_socket(Op::Send { fd, batch }, self.token(SEND))
                            .map_err(|e| format!("cannot send: {e}"))?;
                        self.sending = true;
                        return Ok(());
                    }
                    Ok(_) => Ok(()),
                    Err(error) => Err(error),
                };
                let mut buf = batch.take_bufs().next().expect("a send carries its buffer");
                if buf.capacity() > SEND_BYTES_KEPT {
                    // A rare large batch (copies of a rebuild): not kept.
                    buf = IoBuf::new(SEND_BYTES_MIN).unwrap_or(buf);
                }
                batch.push_buf(buf);
                self.send = Some(batch);
                result
            }
            (op, returned) => unreachable!("socket op {op} came back with {returned:?}"),
        }
    }

    /// Writes the H2CTermReq a protocol error queued, without waiting (the
    /// session ends right after: the ring would send it only after the
    /// close). None while a send is in flight: the bytes would interleave.
    fn terminate_now(&mut self) {
        if self.sending {
            return;
        }
        let Some(transmit) = self.host.poll_transmit() else {
            return;
        };
        let mut bytes = Vec::new();
        for segment in transmit.segments {
            let segment = segment_bytes(&transmit, segment, &mut self.buffers, &self.in_place);
            bytes.extend_from_slice(segment);
        }
        self.host.on_transmitted();
        if let Some((tls, _)) = &mut self.tls {
            let mut sealed = vec![0u8; TlsStream::sealed_len(bytes.len())];
            match tls.seal_into(&bytes, &mut sealed) {
                Ok(len) => bytes = sealed[..len].to_vec(),
                Err(_) => return,
            }
        }
        // No operation is on the ring (none sends, the receive completed).
        if self.stream.set_nonblocking(true).is_ok() {
            let _ = (&self.stream).write_all(&bytes);
        }
    }

    /// A command the replica finished.
    pub(crate) fn poll_completion(&mut self) -> Option<HostCompletion> {
        let completion = self.host.poll_completion()?;
        if let Some(in_place) = self.in_place.get_mut(usize::from(completion.cid.0)) {
            // Sent (the queue completes a command only once its data went out).
            *in_place = None;
        }
        Some(completion)
    }

    /// Ends the connection: operations in flight complete (a receive with
    /// nothing), none is armed again. The socket stays open until
    /// [`RingSocket::is_idle`], so no operation can reach another file.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// No operation of it is in flight.
    pub(crate) fn is_idle(&self) -> bool {
        !self.receiving && !self.sending
    }

    fn token(&self, op: u64) -> u64 {
        (u64::from(self.id) << 1) | op
    }
}

/// `transmit`'s segments in order, each with the shared buffer and range
/// it is sent from in place, if it is (a command's data, up to
/// `SHARED_SEGMENTS_MAX` of them); the others are copied. The same for
/// every call on the same transmission.
fn placed<'a>(
    transmit: &'a Transmit<'a>,
    in_place: &'a [Option<(SharedBuf, usize)>],
) -> impl Iterator<Item = (&'a TxSegment, Option<(&'a SharedBuf, Range<usize>)>)> {
    let mut shared = 0;
    transmit.segments.iter().map(move |segment| {
        let place = match segment {
            TxSegment::Slot(slot, range) if shared < SHARED_SEGMENTS_MAX => in_place
                .get(usize::from(slot.0))
                .and_then(Option::as_ref)
                .map(|(buf, base)| (buf, base + range.start..base + range.end)),
            _ => None,
        };
        shared += usize::from(place.is_some());
        (segment, place)
    })
}

/// A segment's bytes: the transmission's own, or a command's data (from
/// where it is, in place, or its buffer).
fn segment_bytes<'a>(
    transmit: &'a Transmit<'_>,
    segment: &TxSegment,
    buffers: &'a mut HeapBuffers,
    in_place: &'a [Option<(SharedBuf, usize)>],
) -> &'a [u8] {
    match segment {
        TxSegment::Bytes(range) => &transmit.bytes[range.clone()],
        TxSegment::Slot(slot, range) => match in_place.get(usize::from(slot.0)) {
            Some(Some((buf, base))) => &buf[base + range.start..base + range.end],
            _ => &buffers.buffer(*slot)[range.clone()],
        },
    }
}

fn segment_len(segment: &TxSegment) -> usize {
    match segment {
        TxSegment::Bytes(range) | TxSegment::Slot(_, range) => range.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::write_ring::tests::ring_for_sockets;
    use crate::replication::write_ring::Woken;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::time::Duration;
    use weft_proto::host::HostConfig;

    /// A socket on `ring`, its ICReq sent, and the peer's end of its connection.
    fn connected(ring: &mut WriteRing) -> (RingSocket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let host = HostQueue::new(HostConfig {
            header_digest: false,
            data_digest: false,
            queue_entries: 4,
            in_capsule_bytes_max: 8192,
            buffer_bytes: 65536,
        });
        let mut socket =
            RingSocket::new(7, (stream, host, HeapBuffers::new(4, 65536), None)).unwrap();
        socket.start(ring).unwrap();
        assert!(turn(ring, &mut socket).iter().all(Result::is_ok));
        let mut icreq = [0u8; 128];
        peer.read_exact(&mut icreq).unwrap();
        assert_eq!(icreq[0], 0x00, "ICReq");
        (socket, peer)
    }

    /// One wait of the ring (submitting what was pushed); the results of
    /// the socket's operations that completed.
    fn turn(ring: &mut WriteRing, socket: &mut RingSocket) -> Vec<Result<(), String>> {
        let mut woken = Woken::default();
        ring.wait(true, Duration::from_millis(10), &mut woken)
            .unwrap();
        let mut results = Vec::new();
        for completion in woken.sockets {
            assert_eq!(socket_of(completion.user_data), 7);
            results.push(socket.completed(completion, ring));
        }
        results
    }

    /// Turns the ring until an operation fails (two seconds at most).
    fn failure(ring: &mut WriteRing, socket: &mut RingSocket) -> String {
        for _ in 0..200 {
            if let Some(Err(error)) = turn(ring, socket).into_iter().find(Result::is_err) {
                return error;
            }
        }
        panic!("no failure");
    }

    /// The next PDU the peer receives, whole.
    fn pdu(peer: &mut TcpStream) -> Vec<u8> {
        let mut pdu = vec![0u8; 8];
        peer.read_exact(&mut pdu).unwrap();
        let plen = u32::from_le_bytes(pdu[4..8].try_into().unwrap()) as usize;
        pdu.resize(plen, 0);
        peer.read_exact(&mut pdu[8..]).unwrap();
        pdu
    }

    /// The peer of `shared_data_goes_out_...`: answers the ICReq, reads two
    /// write capsules, asks for the second's data with an R2T, reads it,
    /// answers both; returns the PDUs it read.
    fn replica(mut peer: TcpStream) -> Vec<Vec<u8>> {
        let mut icresp = [0u8; 128];
        let ready = weft_proto::pdu::IcResp {
            pfv: 0,
            cpda: 0,
            digest: 0,
            maxh2cdata: 65536,
        };
        ready.encode(&mut icresp);
        peer.write_all(&icresp).unwrap();
        let capsules = [pdu(&mut peer), pdu(&mut peer)];
        let cid = |capsule: &[u8]| u16::from_le_bytes([capsule[10], capsule[11]]);
        let header = weft_proto::pdu::DataHeader {
            cccid: cid(&capsules[1]),
            ttag: 3,
            offset: 0,
            length: 16384,
        };
        let mut r2t = [0u8; 28];
        let len = weft_proto::pdu::encode_r2t(false, header, &mut r2t);
        peer.write_all(&r2t[..len]).unwrap();
        let h2c = pdu(&mut peer);
        for capsule in &capsules {
            let mut cqe = [0u8; 16];
            cqe[12..14].copy_from_slice(&cid(capsule).to_le_bytes());
            let mut resp = [0u8; 28];
            let len = weft_proto::pdu::encode_capsule_resp(false, &cqe, &mut resp);
            peer.write_all(&resp[..len]).unwrap();
        }
        let [small, large] = capsules;
        vec![small, large, h2c]
    }

    #[test]
    fn shared_data_goes_out_in_capsule_and_after_an_r2t_and_is_let_go_once_answered() {
        let mut ring = ring_for_sockets();
        let (mut socket, peer) = connected(&mut ring);
        let replica = std::thread::spawn(move || replica(peer));
        for _ in 0..200 {
            if socket.host.is_ready() {
                break;
            }
            assert!(turn(&mut ring, &mut socket).iter().all(Result::is_ok));
        }
        let data: Vec<u8> = (0..24576u32).map(|i| (i * 7 + i / 4096) as u8).collect();
        let shared = SharedBuf::copy_from(&data);
        let write = |blocks: u32| {
            weft_initiator::read_write(weft_proto::command::io_opcode::WRITE, 1, 0, blocks)
        };
        // 4 KiB: within the capsule; 16 KiB: past it, sent on the R2T.
        let small = CommandData::Shared(shared.clone(), 4096..8192);
        let small = socket
            .submit(write(1), DataTransfer::ToController(4096), &small)
            .unwrap();
        let large = CommandData::Shared(shared.clone(), 8192..24576);
        socket
            .submit(write(4), DataTransfer::ToController(16384), &large)
            .unwrap();
        assert!(
            socket
                .buffers
                .buffer(SlotId(small.0))
                .iter()
                .all(|&b| b == 0),
            "not copied into the command's buffer"
        );
        let mut answered = 0;
        for _ in 0..200 {
            socket.start(&mut ring).unwrap();
            assert!(turn(&mut ring, &mut socket).iter().all(Result::is_ok));
            while socket.poll_completion().is_some() {
                answered += 1;
            }
            if answered == 2 {
                break;
            }
        }
        assert_eq!(answered, 2, "both answered");
        assert!(
            socket.in_place.iter().all(Option::is_none),
            "the shared data let go once answered"
        );
        let [small, large, h2c] = <[Vec<u8>; 3]>::try_from(replica.join().unwrap()).unwrap();
        assert_eq!((small[0], small[3]), (0x04, 72), "CapsuleCmd, data at 72");
        assert!(small[72..] == data[4096..8192], "the small write's data");
        assert_eq!(large.len(), 72, "the large write's capsule, no data");
        assert_eq!(h2c[0], 0x06, "H2CData");
        assert!(
            h2c[24..] == data[8192..],
            "the large write's data, after the R2T"
        );
    }

    #[test]
    fn a_malformed_pdu_ends_the_connection_after_an_h2c_term_req() {
        let mut ring = ring_for_sockets();
        let (mut socket, mut peer) = connected(&mut ring);
        // A PDU of a type that does not exist (common header: type, flags, hlen, pdo, plen).
        peer.write_all(&[0x7f, 0x00, 0x08, 0x00, 0x08, 0x00, 0x00, 0x00])
            .unwrap();
        let error = failure(&mut ring, &mut socket);
        assert!(error.starts_with("protocol error"), "{error}");
        // As the link does: closed at once.
        socket.close();
        let mut term = [0u8; 8];
        peer.read_exact(&mut term).unwrap();
        assert_eq!(term[0], 0x02, "H2CTermReq");
        for _ in 0..200 {
            if socket.is_idle() {
                return;
            }
            turn(&mut ring, &mut socket);
        }
        panic!("operations still in flight after the close");
    }

    #[test]
    fn a_closed_connection_is_an_error_and_a_close_ends_the_receive() {
        let mut ring = ring_for_sockets();
        let (mut socket, peer) = connected(&mut ring);
        drop(peer);
        let error = failure(&mut ring, &mut socket);
        assert_eq!(error, "the replica closed the connection");
        assert!(socket.is_idle(), "the receive is not armed again by itself");

        // A close while a receive waits: it completes, nothing is armed again.
        let (mut socket, _peer) = connected(&mut ring);
        assert!(!socket.is_idle(), "a receive is armed");
        socket.close();
        for _ in 0..200 {
            turn(&mut ring, &mut socket);
            if socket.is_idle() {
                socket.start(&mut ring).unwrap();
                assert!(socket.is_idle(), "closed: no receive armed again");
                return;
            }
        }
        panic!("the receive did not complete after the close");
    }
}
