//! Send-side queue shared by both ends of a connection: inline bytes (PDU
//! headers, digests, small payloads) interleaved with ranges of slot buffers,
//! handed to the driver one batch at a time so that slot data is sent in place.

use crate::types::SlotId;
use std::ops::Range;

/// One piece of a transmission, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxSegment {
    /// Bytes of [`Transmit::bytes`].
    Bytes(Range<usize>),
    /// Bytes of a slot's data buffer.
    Slot(SlotId, Range<usize>),
}

/// What to send next: `segments` in order, referring to `bytes` and slot buffers.
#[derive(Debug)]
pub struct Transmit<'a> {
    /// Inline PDU headers, digests and small payloads.
    pub bytes: &'a [u8],
    /// The order to send them and the slot data in.
    pub segments: &'a [TxSegment],
}

#[derive(Debug)]
struct Batch {
    bytes: Vec<u8>,
    segments: Vec<TxSegment>,
}

impl Batch {
    fn with_capacity(bytes: usize, segments: usize) -> Batch {
        Batch {
            bytes: Vec::with_capacity(bytes),
            segments: Vec::with_capacity(segments),
        }
    }
}

/// A batch being built and, once handed out, one being sent.
#[derive(Debug)]
pub(crate) struct Transmitter {
    pending: Batch,
    sending: Batch,
    busy: bool,
}

impl Transmitter {
    /// Capacity for `bytes` inline bytes and `segments` segments per batch, allocated once.
    pub fn with_capacity(bytes: usize, segments: usize) -> Transmitter {
        Transmitter {
            pending: Batch::with_capacity(bytes, segments),
            sending: Batch::with_capacity(bytes, segments),
            busy: false,
        }
    }

    /// Room for `bytes` inline bytes and `segments` segments in each batch
    /// (a queue's, once its size is known).
    pub fn reserve(&mut self, bytes: usize, segments: usize) {
        for batch in [&mut self.pending, &mut self.sending] {
            batch.bytes.reserve(bytes.saturating_sub(batch.bytes.len()));
            batch
                .segments
                .reserve(segments.saturating_sub(batch.segments.len()));
        }
    }

    /// Appends inline bytes, merging with a preceding inline segment.
    pub fn push_bytes(&mut self, data: &[u8]) {
        let batch = &mut self.pending;
        let start = batch.bytes.len();
        batch.bytes.extend_from_slice(data);
        if let Some(TxSegment::Bytes(range)) = batch.segments.last_mut() {
            if range.end == start {
                range.end = batch.bytes.len();
                return;
            }
        }
        batch
            .segments
            .push(TxSegment::Bytes(start..batch.bytes.len()));
    }

    /// Appends a range of a slot's buffer, sent in place.
    pub fn push_slot(&mut self, slot: SlotId, range: Range<usize>) {
        self.pending.segments.push(TxSegment::Slot(slot, range));
    }

    /// Whether [`Transmitter::poll`] hands out a batch now.
    pub fn ready(&self) -> bool {
        !self.busy && !self.pending.segments.is_empty()
    }

    /// The next batch, if none is being sent and something is pending.
    pub fn poll(&mut self) -> Option<Transmit<'_>> {
        if self.busy || self.pending.segments.is_empty() {
            return None;
        }
        std::mem::swap(&mut self.pending, &mut self.sending);
        self.busy = true;
        Some(Transmit {
            bytes: &self.sending.bytes,
            segments: &self.sending.segments,
        })
    }

    /// The batch [`Transmitter::poll`] handed out, while it is being sent
    /// (a driver that sends it in pieces, sealed into TLS records, reads
    /// it again for each).
    pub fn sending(&self) -> Option<Transmit<'_>> {
        self.busy.then(|| Transmit {
            bytes: &self.sending.bytes,
            segments: &self.sending.segments,
        })
    }

    /// The batch from [`Transmitter::poll`] was sent: calls `release` for each
    /// slot whose data it carried, then forgets it.
    pub fn finish(&mut self, mut release: impl FnMut(SlotId)) {
        assert!(
            self.busy,
            "a transmission finished that was never handed out"
        );
        for segment in &self.sending.segments {
            if let TxSegment::Slot(slot, _) = segment {
                release(*slot);
            }
        }
        self.sending.bytes.clear();
        self.sending.segments.clear();
        self.busy = false;
    }

    /// Nothing pending and nothing being sent.
    pub fn is_idle(&self) -> bool {
        !self.busy && self.pending.segments.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_being_sent_can_be_read_again_until_it_is_finished() {
        let mut tx = Transmitter::with_capacity(64, 8);
        assert!(tx.sending().is_none());
        tx.push_bytes(b"ab");
        tx.push_slot(SlotId(3), 0..8);
        let first = format!("{:?}", tx.poll().unwrap());
        tx.push_bytes(b"next");
        assert_eq!(
            format!("{:?}", tx.sending().unwrap()),
            first,
            "the same batch"
        );
        tx.finish(|_| {});
        assert!(tx.sending().is_none());
    }

    #[test]
    fn batches_alternate_and_release_slots() {
        let mut tx = Transmitter::with_capacity(64, 8);
        tx.push_bytes(b"ab");
        tx.push_bytes(b"cd");
        tx.push_slot(SlotId(3), 0..10);
        tx.push_bytes(b"e");
        let batch = tx.poll().unwrap();
        assert_eq!(batch.bytes, b"abcde");
        assert_eq!(
            batch.segments,
            &[
                TxSegment::Bytes(0..4),
                TxSegment::Slot(SlotId(3), 0..10),
                TxSegment::Bytes(4..5)
            ]
        );
        tx.push_bytes(b"later");
        assert!(tx.poll().is_none(), "one batch at a time");
        let mut released = Vec::new();
        tx.finish(|slot| released.push(slot));
        assert_eq!(released, vec![SlotId(3)]);
        assert_eq!(tx.poll().unwrap().bytes, b"later");
        tx.finish(|_| {});
        assert!(tx.is_idle());
    }
}
