//! One queue of the initiator: a blocking TCP connection driven by the
//! protocol core's [`HostQueue`]. A thread owns a queue; it submits commands,
//! flushes them, and blocks reading until completions arrive.

use crate::tls::{TlsIdentity, TlsStream};
use crate::{check, read_write, set_cdw, sqe, InitiatorError};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use weft_proto::command::io_opcode;
use weft_proto::host::{DataTransfer, HostCompletion, HostConfig, HostQueue, SubmitError};
use weft_proto::types::{Cid, SlotId};
use weft_proto::{SlotBuffers, TxSegment};

/// Command buffers on the heap, allocated on first use.
#[derive(Debug)]
pub struct HeapBuffers {
    buffers: Vec<Vec<u8>>,
    buffer_bytes: usize,
}

impl HeapBuffers {
    /// `slots` buffers of `buffer_bytes` each, allocated on first use.
    pub fn new(slots: usize, buffer_bytes: usize) -> HeapBuffers {
        HeapBuffers {
            buffers: vec![Vec::new(); slots],
            buffer_bytes,
        }
    }
}

impl HeapBuffers {
    /// The number of `block_size`-byte blocks in `len` bytes, when one
    /// command can move them: 1 to 65536 whole blocks within a buffer.
    fn blocks(&self, len: usize, block_size: u32) -> Result<u32, InitiatorError> {
        let block_bytes = block_size as usize;
        let whole = block_bytes > 0 && len.is_multiple_of(block_bytes);
        let blocks = if whole { len / block_bytes } else { 0 };
        if (1..=65536).contains(&blocks) && len <= self.buffer_bytes {
            Ok(blocks as u32)
        } else {
            Err(InitiatorError::Transfer {
                len,
                block_size,
                buffer_bytes: self.buffer_bytes,
            })
        }
    }
}

impl SlotBuffers for HeapBuffers {
    fn buffer(&mut self, slot: SlotId) -> &mut [u8] {
        let buffer = &mut self.buffers[usize::from(slot.0)];
        if buffer.is_empty() {
            buffer.resize(self.buffer_bytes, 0);
        }
        buffer
    }
}

/// A connected queue.
/// How long each step of establishing a queue (TCP connect, ICReq,
/// Fabrics Connect, authentication) may wait for the target.
pub(crate) const ESTABLISH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug)]
pub struct Queue {
    address: SocketAddr,
    stream: TcpStream,
    host: HostQueue,
    buffers: HeapBuffers,
    receive: Vec<u8>,
    send: Vec<u8>,
    /// Busy-polls the socket instead of sleeping in the kernel (see [`Queue::set_polling`]).
    polling: bool,
    /// The TLS stream's record state, when the queue is in one.
    tls: Option<TlsStream>,
}

impl Queue {
    /// Connects and exchanges ICReq/ICResp. Until the caller lifts it
    /// ([`Queue::set_io_timeout`] once the queue is connected), every step
    /// is bounded by [`ESTABLISH_TIMEOUT`]: a target that accepts the
    /// connection and never answers (hung, or behind a partition) fails
    /// the attempt instead of blocking it forever.
    /// With `tls`, the queue runs in a TLS 1.3 stream, set up first.
    pub(crate) fn open(
        address: SocketAddr,
        config: HostConfig,
        tls: Option<TlsIdentity>,
    ) -> Result<Queue, InitiatorError> {
        let stream = TcpStream::connect_timeout(&address, ESTABLISH_TIMEOUT)
            .map_err(|source| InitiatorError::Unreachable { address, source })?;
        stream
            .set_nodelay(true)
            .map_err(|source| InitiatorError::Io { address, source })?;
        let mut queue = Queue {
            address,
            stream,
            host: HostQueue::new(config),
            buffers: HeapBuffers::new(
                usize::from(config.queue_entries),
                config.buffer_bytes as usize,
            ),
            receive: vec![0u8; 256 * 1024],
            send: Vec::with_capacity(256 * 1024),
            polling: false,
            tls: None,
        };
        queue.set_io_timeout(Some(ESTABLISH_TIMEOUT))?;
        if let Some(identity) = tls {
            let session = TlsStream::handshake(&mut queue.stream, &identity)
                .map_err(|source| InitiatorError::Tls { address, source })?;
            queue.tls = Some(session);
        }
        queue.transmit()?;
        while !queue.host.is_ready() {
            queue.receive_some()?;
        }
        Ok(queue)
    }

    /// Bounds every read and write on the connection: a peer that stops
    /// answering fails the waiting call after `timeout` instead of blocking it forever.
    pub fn set_io_timeout(
        &self,
        timeout: Option<std::time::Duration>,
    ) -> Result<(), InitiatorError> {
        let address = self.address;
        let io = |source| InitiatorError::Io { address, source };
        self.stream.set_read_timeout(timeout).map_err(io)?;
        self.stream.set_write_timeout(timeout).map_err(io)
    }

    /// Busy-polls: the socket turns non-blocking and a thread waiting for
    /// a completion spins on it instead of sleeping, as SPDK's initiator
    /// does: no wake-up on the way back (tens of microseconds in a VM), for
    /// a CPU kept busy. I/O timeouts ([`Queue::set_io_timeout`]) no longer apply.
    pub fn set_polling(&mut self, polling: bool) -> Result<(), InitiatorError> {
        let address = self.address;
        self.stream
            .set_nonblocking(polling)
            .map_err(|source| InitiatorError::Io { address, source })?;
        self.polling = polling;
        Ok(())
    }

    /// The queue's parts, for a caller that drives the connection itself
    /// (on its own io_uring ring, as a replicated volume's primary does):
    /// the socket, the protocol state and the command buffers. Nothing is
    /// lost: every byte received was fed to the protocol state already.
    /// A queue in a TLS stream hands its record state over too: every
    /// byte from then on goes through it.
    pub fn into_parts(self) -> (TcpStream, HostQueue, HeapBuffers, Option<TlsStream>) {
        (self.stream, self.host, self.buffers, self.tls)
    }

    /// The data buffer of command `cid`.
    pub fn buffer(&mut self, cid: u16) -> &mut [u8] {
        self.buffers.buffer(SlotId(cid))
    }

    /// The CID the next submission will use (write its data into [`Queue::buffer`] first).
    pub fn next_cid(&self) -> u16 {
        self.host.next_cid().map_or(0, |cid| cid.0)
    }

    /// The CID the next submission will use, if the queue has room.
    pub fn free_cid(&self) -> Option<u16> {
        self.host.next_cid().map(|cid| cid.0)
    }

    /// Commands outstanding.
    pub fn outstanding(&self) -> usize {
        self.host.outstanding()
    }

    /// Queues a command; [`Queue::transmit`] (or [`Queue::wait`]) sends it.
    pub fn submit(&mut self, sqe: [u8; 64], transfer: DataTransfer) -> Result<Cid, SubmitError> {
        self.host.submit(sqe, transfer, &mut self.buffers)
    }

    /// Sends everything queued.
    pub fn transmit(&mut self) -> Result<(), InitiatorError> {
        while let Some(transmit) = self.host.poll_transmit() {
            self.send.clear();
            for segment in transmit.segments {
                match segment {
                    TxSegment::Bytes(range) => {
                        self.send.extend_from_slice(&transmit.bytes[range.clone()])
                    }
                    TxSegment::Slot(slot, range) => self
                        .send
                        .extend_from_slice(&self.buffers.buffer(*slot)[range.clone()]),
                }
            }
            self.host.on_transmitted();
            self.send_all()?;
        }
        Ok(())
    }

    fn send_all(&mut self) -> Result<(), InitiatorError> {
        let address = self.address;
        let bytes = match &mut self.tls {
            None => &self.send[..],
            Some(tls) => tls.seal(&self.send).map_err(|alert| InitiatorError::Tls {
                address,
                source: alert.into(),
            })?,
        };
        let mut sent = 0;
        while sent < bytes.len() {
            match self.stream.write(&bytes[sent..]) {
                Ok(0) => {
                    let source = std::io::Error::from(std::io::ErrorKind::WriteZero);
                    return Err(InitiatorError::Io { address, source });
                }
                Ok(written) => sent += written,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if self.polling && e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop()
                }
                Err(source) => return Err(InitiatorError::Io { address, source }),
            }
        }
        Ok(())
    }

    /// A finished command, if one is ready without blocking.
    pub fn poll_completion(&mut self) -> Option<HostCompletion> {
        self.host.poll_completion()
    }

    /// Blocks until a command finishes.
    pub fn wait(&mut self) -> Result<HostCompletion, InitiatorError> {
        self.transmit()?;
        loop {
            if let Some(completion) = self.host.poll_completion() {
                return Ok(completion);
            }
            self.receive_some()?;
            // An R2T may have queued H2CData.
            self.transmit()?;
        }
    }

    /// Submits one command and waits for it (nothing else may be outstanding).
    pub fn run(
        &mut self,
        sqe: [u8; 64],
        transfer: DataTransfer,
    ) -> Result<HostCompletion, InitiatorError> {
        debug_assert_eq!(self.outstanding(), 0, "run() is for one command at a time");
        self.submit(sqe, transfer)
            .map_err(|error| InitiatorError::Io {
                address: self.address,
                source: std::io::Error::other(error),
            })?;
        self.wait()
    }

    /// [`Queue::run`], with a failed status turned into an error naming `what`.
    pub fn execute(
        &mut self,
        what: &'static str,
        sqe: [u8; 64],
        transfer: DataTransfer,
    ) -> Result<HostCompletion, InitiatorError> {
        check(what, self.run(sqe, transfer)?)
    }

    /// Writes `data` at `slba` and waits (at most the target's transfer size).
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        block_size: u32,
        data: &[u8],
    ) -> Result<(), InitiatorError> {
        let blocks = self.buffers.blocks(data.len(), block_size)?;
        let cid = self.next_cid();
        self.buffer(cid)[..data.len()].copy_from_slice(data);
        let command = read_write(io_opcode::WRITE, nsid, slba, blocks);
        let transfer = DataTransfer::ToController(data.len() as u32);
        self.execute("Write", command, transfer).map(|_| ())
    }

    /// Reads `len` bytes at `slba` and waits; returns the data.
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        block_size: u32,
        len: u32,
    ) -> Result<&[u8], InitiatorError> {
        let blocks = self.buffers.blocks(len as usize, block_size)?;
        let command = read_write(io_opcode::READ, nsid, slba, blocks);
        let done = self.execute("Read", command, DataTransfer::FromController(len))?;
        Ok(&self.buffer(done.cid.0)[..len as usize])
    }

    /// NVMe Flush: everything written to `nsid` before is durable.
    pub fn flush(&mut self, nsid: u32) -> Result<(), InitiatorError> {
        self.execute("Flush", sqe(io_opcode::FLUSH, nsid), DataTransfer::None)
            .map(|_| ())
    }

    /// Write Zeroes of `blocks` blocks at `slba`.
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
    ) -> Result<(), InitiatorError> {
        let command = read_write(io_opcode::WRITE_ZEROES, nsid, slba, blocks);
        self.execute("Write Zeroes", command, DataTransfer::None)
            .map(|_| ())
    }

    /// Drops `regions` (at most `weft_proto::intent::CLEAN_REGIONS_MAX`)
    /// from a weft replica's write intent: the vendor Clean command.
    pub fn clean(&mut self, nsid: u32, regions: &[u32]) -> Result<(), InitiatorError> {
        let len = regions.len() * 4;
        let cid = self.next_cid();
        for (slot, region) in self.buffer(cid)[..len].chunks_exact_mut(4).zip(regions) {
            slot.copy_from_slice(&region.to_le_bytes());
        }
        let mut command = sqe(weft_proto::intent::CLEAN_OPCODE, nsid);
        set_cdw(&mut command, 10, regions.len() as u32);
        let transfer = DataTransfer::ToController(len as u32);
        self.execute("Clean (write intent)", command, transfer)
            .map(|_| ())
    }

    /// A Reservation Register, Acquire or Release (`opcode`, see
    /// `weft_proto::reservation`) with `cdw10` and its keys as data: CRKEY,
    /// then NRKEY or PRKEY (Release carries CRKEY only).
    pub fn reservation(
        &mut self,
        opcode: u8,
        nsid: u32,
        cdw10: u32,
        keys: &[u64],
    ) -> Result<(), InitiatorError> {
        let len = keys.len() * 8;
        let cid = self.next_cid();
        for (slot, key) in self.buffer(cid)[..len].chunks_exact_mut(8).zip(keys) {
            slot.copy_from_slice(&key.to_le_bytes());
        }
        let mut command = sqe(opcode, nsid);
        set_cdw(&mut command, 10, cdw10);
        let transfer = DataTransfer::ToController(len as u32);
        self.execute("Reservation command", command, transfer)
            .map(|_| ())
    }

    /// Reservation Report of at most `len` bytes: the extended Reservation
    /// Status data structure.
    pub fn reservation_report(&mut self, nsid: u32, len: u32) -> Result<Vec<u8>, InitiatorError> {
        let mut command = sqe(weft_proto::reservation::REPORT_OPCODE, nsid);
        set_cdw(&mut command, 10, len / 4 - 1);
        set_cdw(&mut command, 11, 1);
        let transfer = DataTransfer::FromController(len);
        let done = self.execute("Reservation Report", command, transfer)?;
        Ok(self.buffer(done.cid.0)[..len as usize].to_vec())
    }

    /// Dataset Management with the Deallocate attribute over `(slba, blocks)` ranges.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<(), InitiatorError> {
        assert!(
            (1..=256).contains(&ranges.len()),
            "Dataset Management takes 1 to 256 ranges"
        );
        let cid = self.next_cid();
        let data = &mut self.buffer(cid)[..ranges.len() * 16];
        for (range, &(slba, blocks)) in data.chunks_exact_mut(16).zip(ranges) {
            // Figure "Dataset Management - Range Definition": attributes, length, starting LBA.
            range[..4].fill(0);
            range[4..8].copy_from_slice(&blocks.to_le_bytes());
            range[8..16].copy_from_slice(&slba.to_le_bytes());
        }
        let mut command = sqe(io_opcode::DATASET_MANAGEMENT, nsid);
        set_cdw(&mut command, 10, ranges.len() as u32 - 1);
        set_cdw(&mut command, 11, 1 << 2); // AD: deallocate
        let len = ranges.len() as u32 * 16;
        self.execute(
            "Dataset Management",
            command,
            DataTransfer::ToController(len),
        )
        .map(|_| ())
    }

    fn receive_some(&mut self) -> Result<(), InitiatorError> {
        let address = self.address;
        let received = loop {
            match self.stream.read(&mut self.receive) {
                Ok(received) => break received,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if self.polling && e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop()
                }
                Err(source) => return Err(InitiatorError::Io { address, source }),
            }
        };
        if received == 0 {
            let source = std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the target closed the connection",
            );
            return Err(match self.host.error() {
                Some(error) => InitiatorError::Protocol {
                    address,
                    source: error,
                },
                None => InitiatorError::Io { address, source },
            });
        }
        match &mut self.tls {
            None => self
                .host
                .handle_input(&self.receive[..received], &mut self.buffers),
            Some(tls) => {
                let (host, buffers) = (&mut self.host, &mut self.buffers);
                tls.open(&self.receive[..received], |plaintext| {
                    host.handle_input(plaintext, buffers)
                })
                .map_err(|alert| InitiatorError::Tls {
                    address,
                    source: alert.into(),
                })?;
            }
        }
        match self.host.error() {
            Some(source) => {
                // Send our H2CTermReq, if the failure queued one, before giving up.
                let _ = self.transmit();
                Err(InitiatorError::Protocol { address, source })
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A length below one block used to make NLB (and the CDW12 flags above
    /// it) wrap to all ones; a block size of 0 divided by zero.
    #[test]
    fn transfers_are_whole_blocks_within_a_buffer() {
        let buffers = HeapBuffers::new(4, 128 * 1024);
        assert_eq!(buffers.blocks(8192, 4096).ok(), Some(2));
        assert_eq!(buffers.blocks(128 * 1024, 512).ok(), Some(256));
        for (len, block_size) in [
            (0, 512),
            (511, 512),
            (4096, 0),
            (6000, 4096),
            (256 * 1024, 4096),
        ] {
            assert!(
                buffers.blocks(len, block_size).is_err(),
                "{len} / {block_size}"
            );
        }
        assert_eq!(
            buffers.blocks(511, 512).unwrap_err().to_string(),
            "a 511-byte transfer is not 1 to 65536 whole 512-byte blocks within the 131072-byte command buffer"
        );
    }
}
