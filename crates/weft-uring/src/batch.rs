//! Gather lists for `sendmsg`: owned buffers, and references to shared
//! ones, plus byte ranges within them.

use crate::buf::{assert_range_fits, IoBuf};
use crate::shared::SharedBuf;
use std::ops::Range;

/// Which buffer of the batch a segment reads.
#[derive(Debug, Clone, Copy)]
enum Source {
    Owned(usize),
    Shared(usize),
}

/// One byte range of one buffer of the batch.
#[derive(Debug, Clone)]
struct Segment {
    source: Source,
    start: usize,
    end: usize,
}

impl Segment {
    fn len(&self) -> usize {
        self.end - self.start
    }
}

/// A gather list for one `sendmsg`: buffers owned by the batch plus segments
/// (buffer index, byte range).
///
/// The same buffer may appear in several segments (e.g. one header staging buffer used for two
/// headers around a data buffer). After a partial send, [`consume`](SendBatch::consume) drops the
/// bytes that went out, so the same batch can be pushed again for the rest. The batch is reusable:
/// [`clear`](SendBatch::clear) and [`take_bufs`](SendBatch::take_bufs) keep the vectors' capacity.
/// Buffers others hold too ([`SendBatch::push_shared`]) are only read, and
/// let go with the segments once the send is done.
#[derive(Debug, Default)]
pub struct SendBatch {
    bufs: Vec<IoBuf>,
    shared: Vec<SharedBuf>,
    segments: Vec<Segment>,
    /// Segments before this index were fully consumed; kept (not shifted out) to avoid moving
    /// the tail on every partial send.
    first_unsent: usize,
    /// Bytes in `segments[first_unsent..]`, maintained so `total_len` is O(1).
    remaining: usize,
}

impl SendBatch {
    /// An empty batch.
    pub fn new() -> SendBatch {
        SendBatch::default()
    }

    /// Hands `buf` to the batch and returns its index for [`push_segment`](SendBatch::push_segment).
    pub fn push_buf(&mut self, buf: IoBuf) -> usize {
        self.bufs.push(buf);
        self.bufs.len() - 1
    }

    /// Appends `range` of buffer `buf_index` to the bytes to send.
    ///
    /// Panics if there is no such buffer or the range is not within its capacity.
    pub fn push_segment(&mut self, buf_index: usize, range: Range<usize>) {
        let buf = self
            .bufs
            .get(buf_index)
            .expect("SendBatch: no buffer with that index");
        self.push(Source::Owned(buf_index), buf.capacity(), range);
    }

    /// Appends `range` of `buf` (a buffer others may hold too, only read
    /// here: no copy) to the bytes to send; the batch holds a reference
    /// until its segments are forgotten.
    ///
    /// Panics if the range is not within the buffer.
    pub fn push_shared(&mut self, buf: SharedBuf, range: Range<usize>) {
        let len = buf.len();
        self.shared.push(buf);
        self.push(Source::Shared(self.shared.len() - 1), len, range);
    }

    fn push(&mut self, source: Source, capacity: usize, range: Range<usize>) {
        assert!(
            range.start <= range.end,
            "SendBatch: reversed range {range:?}"
        );
        assert_range_fits(range.start, range.len(), capacity);
        self.remaining += range.len();
        self.segments.push(Segment {
            source,
            start: range.start,
            end: range.end,
        });
    }

    /// Segments appended since the last send was forgotten, consumed or not.
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// Bytes not yet consumed.
    pub fn total_len(&self) -> usize {
        self.remaining
    }

    /// Drops the first `bytes` bytes of the remaining segments, e.g. after a partial send.
    ///
    /// Panics if `bytes` exceeds [`total_len`](SendBatch::total_len).
    pub fn consume(&mut self, bytes: usize) {
        assert!(
            bytes <= self.remaining,
            "SendBatch: consume({bytes}) > total_len {}",
            self.remaining
        );
        self.remaining -= bytes;
        let mut left = bytes;
        while left > 0 {
            let segment = &mut self.segments[self.first_unsent];
            if left < segment.len() {
                segment.start += left;
                return;
            }
            left -= segment.len();
            self.first_unsent += 1;
        }
    }

    /// True when no bytes are left to send.
    pub fn is_empty(&self) -> bool {
        self.remaining == 0
    }

    /// Gives the owned buffers back and forgets all segments (and the shared
    /// buffers), leaving an empty, reusable batch.
    pub fn take_bufs(&mut self) -> std::vec::Drain<'_, IoBuf> {
        self.forget_segments();
        self.bufs.drain(..)
    }

    /// Drops all buffers and segments, keeping capacity.
    pub fn clear(&mut self) {
        self.forget_segments();
        self.bufs.clear();
    }

    /// Buffer `index`. Panics if there is no such buffer.
    pub fn buf(&self, index: usize) -> &IoBuf {
        &self.bufs[index]
    }

    fn forget_segments(&mut self) {
        self.segments.clear();
        self.shared.clear();
        self.first_unsent = 0;
        self.remaining = 0;
    }

    /// Fills `out` with one iovec per non-empty remaining segment.
    ///
    /// The iovecs point into the batch's mmap buffers, which never move; they stay valid as long
    /// as the batch is neither mutated nor dropped (the ring guarantees that while in flight).
    pub(crate) fn fill_iovecs(&self, out: &mut Vec<libc::iovec>) {
        out.clear();
        for segment in &self.segments[self.first_unsent..] {
            if segment.len() == 0 {
                continue;
            }
            let base = match segment.source {
                Source::Owned(index) => {
                    self.bufs[index].kernel_const_ptr(segment.start, segment.len())
                }
                Source::Shared(index) => {
                    self.shared[index].kernel_const_ptr(segment.start, segment.len())
                }
            };
            out.push(libc::iovec {
                iov_base: base.cast_mut().cast(),
                iov_len: segment.len(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Concatenates what the iovecs describe, the way the kernel would read them.
    fn gathered(batch: &SendBatch) -> Vec<u8> {
        let mut iovecs = Vec::new();
        batch.fill_iovecs(&mut iovecs);
        let mut out = Vec::new();
        for iov in &iovecs {
            // SAFETY: fill_iovecs only produces in-bounds ranges of live buffers owned by
            // `batch`, which is borrowed (unmodified) for this whole function.
            out.extend_from_slice(unsafe {
                std::slice::from_raw_parts(iov.iov_base as *const u8, iov.iov_len)
            });
        }
        out
    }

    fn buf_with(bytes: &[u8]) -> IoBuf {
        let mut buf = IoBuf::new(bytes.len()).unwrap();
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        buf
    }

    fn header_data_header() -> SendBatch {
        let mut batch = SendBatch::new();
        let headers = batch.push_buf(buf_with(b"HHHHtttt"));
        let data = batch.push_buf(buf_with(b"0123456789"));
        batch.push_segment(headers, 0..4);
        batch.push_segment(data, 0..10);
        batch.push_segment(headers, 4..8);
        batch
    }

    #[test]
    fn segments_gather_in_order_with_shared_buffer() {
        let batch = header_data_header();
        assert_eq!(batch.total_len(), 18);
        assert_eq!(gathered(&batch), b"HHHH0123456789tttt");
    }

    #[test]
    fn consume_drops_prefix_across_segments() {
        let mut batch = header_data_header();
        batch.consume(2);
        assert_eq!(gathered(&batch), b"HH0123456789tttt");
        batch.consume(2);
        assert_eq!(gathered(&batch), b"0123456789tttt");
        batch.consume(11);
        assert_eq!(gathered(&batch), b"ttt");
        assert_eq!(batch.total_len(), 3);
        batch.consume(3);
        assert!(batch.is_empty());
        assert!(gathered(&batch).is_empty());
    }

    #[test]
    fn shared_buffers_are_sent_from_in_place_and_let_go_after() {
        let mut batch = header_data_header();
        let data = SharedBuf::copy_from(b"shared!");
        batch.push_shared(data.clone(), 1..7);
        assert_eq!(batch.segments(), 4);
        assert_eq!(gathered(&batch), b"HHHH0123456789tttthared!");
        let mut iovecs = Vec::new();
        batch.fill_iovecs(&mut iovecs);
        assert_eq!(
            iovecs[3].iov_base as usize,
            data.as_ptr() as usize + 1,
            "no copy"
        );
        batch.consume(20);
        assert_eq!(gathered(&batch), b"red!");
        assert_eq!(batch.take_bufs().count(), 2, "the owned buffers");
        assert_eq!(batch.segments(), 0);
        assert!(batch.shared.is_empty(), "the shared buffer let go");
    }

    #[test]
    fn empty_segments_are_skipped() {
        let mut batch = SendBatch::new();
        let b = batch.push_buf(buf_with(b"xy"));
        batch.push_segment(b, 1..1);
        batch.push_segment(b, 0..2);
        batch.consume(1);
        assert_eq!(gathered(&batch), b"y");
    }

    #[test]
    fn take_bufs_returns_buffers_and_resets() {
        let mut batch = header_data_header();
        batch.consume(5);
        let bufs: Vec<IoBuf> = batch.take_bufs().collect();
        assert_eq!(bufs.len(), 2);
        assert!(batch.is_empty());
        assert_eq!(&bufs[1].as_slice()[..2], b"01");
        let again = batch.push_buf(buf_with(b"z"));
        assert_eq!(again, 0);
        batch.push_segment(again, 0..1);
        assert_eq!(gathered(&batch), b"z");
        assert_eq!(batch.buf(0).as_slice()[0], b'z');
        batch.clear();
        assert_eq!(batch.total_len(), 0);
    }

    #[test]
    #[should_panic(expected = "exceeds buffer capacity")]
    fn segment_beyond_capacity_panics() {
        let mut batch = SendBatch::new();
        let b = batch.push_buf(IoBuf::new(4096).unwrap());
        batch.push_segment(b, 4000..5000);
    }

    #[test]
    #[should_panic(expected = "no buffer")]
    fn segment_of_unknown_buffer_panics() {
        SendBatch::new().push_segment(0, 0..1);
    }

    #[test]
    #[should_panic(expected = "consume")]
    fn over_consume_panics() {
        header_data_header().consume(19);
    }
}
