//! A link's connection on the replicator's ring: the replica's NVMe/TCP I/O
//! queue, driven by the protocol core's `HostQueue`, its receives and sends
//! io_uring operations on the replicator's own ring (see `super::write_ring`),
//! so that a replicated write crosses no thread between the replicator and
//! the socket. A thread per link, blocked in `recv`, cost 4-5 us of CPU per
//! write and two wake-ups per batch on this machine kind.
//!
//! One receive is always armed; one send at most is in flight, carrying
//! everything the queue had to send when it was pushed (copied out of the
//! command buffers, which are then free), so bytes go out in order.
//!
//! What this does not do: build commands or know what they mean
//! (`super::link`), connect (the link's attach thread does, blocking), or
//! time a silent replica out (the replication core's replica timeout does,
//! and the replicator replaces the link).

use super::write_ring::WriteRing;
use std::io::Write as _;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use weft_initiator::HeapBuffers;
use weft_proto::host::{DataTransfer, HostCompletion, HostQueue, SubmitError};
use weft_proto::types::{Cid, SlotId};
use weft_proto::{SlotBuffers, Transmit, TxSegment};
use weft_uring::{Completion, IoBuf, Op, Returned, SendBatch};

/// Bytes one receive may bring.
const RECEIVE_BYTES: usize = 256 * 1024;
/// The send buffer's usual size; a larger batch gets a buffer of its own,
/// kept after its send up to `SEND_BYTES_KEPT`.
const SEND_BYTES_MIN: usize = 256 * 1024;
const SEND_BYTES_KEPT: usize = 2 * 1024 * 1024;

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
}

impl RingSocket {
    /// Takes over an initiator queue's parts.
    pub(crate) fn new(
        id: u32,
        (stream, host, buffers): (TcpStream, HostQueue, HeapBuffers),
    ) -> std::io::Result<RingSocket> {
        let mut send = SendBatch::new();
        send.push_buf(IoBuf::new(SEND_BYTES_MIN)?);
        Ok(RingSocket {
            id,
            stream,
            host,
            buffers,
            receive: Some(IoBuf::new(RECEIVE_BYTES)?),
            send: Some(send),
            receiving: false,
            sending: false,
            closed: false,
        })
    }

    /// Its id, as completions' tokens carry it.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Queues a command, with `data` copied into its buffer; sent at the
    /// next [`RingSocket::start`].
    pub(crate) fn submit(
        &mut self,
        command: [u8; 64],
        transfer: DataTransfer,
        data: &[u8],
    ) -> Result<Cid, SubmitError> {
        let Some(cid) = self.host.next_cid() else {
            return Err(SubmitError::QueueFull);
        };
        if !data.is_empty() {
            let buffer = self.buffers.buffer(SlotId(cid.0));
            let Some(room) = buffer.get_mut(..data.len()) else {
                return Err(SubmitError::TooLarge);
            };
            room.copy_from_slice(data);
        }
        self.host.submit(command, transfer, &mut self.buffers)
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
        let Some(transmit) = self.host.poll_transmit() else {
            return Ok(());
        };
        let len: usize = transmit.segments.iter().map(segment_len).sum();
        // A larger buffer first: a failure leaves the batch and its buffer in place.
        let small = self
            .send
            .as_ref()
            .is_some_and(|b| b.buf(0).capacity() < len);
        let larger = if small {
            Some(IoBuf::new(len).map_err(|e| format!("no send buffer: {e}"))?)
        } else {
            None
        };
        let mut batch = self.send.take().ok_or("no send buffer")?;
        let kept = batch
            .take_bufs()
            .next()
            .expect("the batch keeps its buffer");
        let mut buf = larger.unwrap_or(kept);
        gather(&transmit, &mut self.buffers, &mut buf.as_mut_slice()[..len]);
        // Copied: the command buffers are free to complete.
        self.host.on_transmitted();
        let index = batch.push_buf(buf);
        batch.push_segment(index, 0..len);
        ring.push_socket(Op::Send { fd, batch }, self.token(SEND))
            .map_err(|e| format!("cannot send: {e}"))?;
        self.sending = true;
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
                    Ok(len) => {
                        self.host
                            .handle_input(&buf.as_slice()[..len], &mut self.buffers);
                        match self.host.error() {
                            Some(error) => {
                                self.terminate_now();
                                Err(format!("protocol error: {error}"))
                            }
                            None => Ok(()),
                        }
                    }
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
        let mut bytes = vec![0; transmit.segments.iter().map(segment_len).sum()];
        gather(&transmit, &mut self.buffers, &mut bytes);
        self.host.on_transmitted();
        // No operation is on the ring (none sends, the receive completed).
        if self.stream.set_nonblocking(true).is_ok() {
            let _ = (&self.stream).write_all(&bytes);
        }
    }

    /// A command the replica finished.
    pub(crate) fn poll_completion(&mut self) -> Option<HostCompletion> {
        self.host.poll_completion()
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

/// Copies `transmit`'s bytes, in order, into `out` (exactly as long).
fn gather(transmit: &Transmit<'_>, buffers: &mut HeapBuffers, out: &mut [u8]) {
    let mut at = 0;
    for segment in transmit.segments {
        let bytes = match segment {
            TxSegment::Bytes(range) => &transmit.bytes[range.clone()],
            TxSegment::Slot(slot, range) => &buffers.buffer(*slot)[range.clone()],
        };
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    }
    debug_assert_eq!(at, out.len(), "a transmission gathered whole");
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
            buffer_bytes: 8192,
        });
        let mut socket = RingSocket::new(7, (stream, host, HeapBuffers::new(4, 8192))).unwrap();
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
