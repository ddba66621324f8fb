//! The stripe journal: how a write smaller than a stripe reaches the
//! members without a write hole.
//!
//! Each member's shard volume begins with a journal of `slots` slots; its
//! chunks follow ([`JournalLayout::data_base`]). A stripe update (one host
//! write's part in one stripe) writes, in its stripe's own slot (`stripe mod
//! slots`, the same on every member), a [`Record`] to each member it
//! changes: a header block (magic, the primary's epoch and sequence number,
//! the stripe, the member's column range in its chunk, the members the
//! update changes, a CRC32C of header and data) and the member's new bytes.
//! Only once every member it changes that is in sync in the store's record
//! holds its record durably is the host's write acknowledged and are the
//! same bytes written in place (through the members' caches); the stripe is
//! free for the next update once those writes are done, and its slot once a
//! flush of the members made them durable.
//!
//! So after a crash, for each stripe only its newest record can be unapplied
//! or its in-place bytes lost in a member's cache ([`recovery`]): if every
//! in-sync member it changes holds it, it may have been acknowledged, and it
//! is written in place again; if one lacks it, it was neither acknowledged
//! nor applied anywhere, and it is dropped. (A record's slot is reused only
//! after its in-place bytes were flushed, so an older record of the stripe
//! is never needed again.) A
//! stripe is thus always wholly its old or its new self. A torn record fails
//! its CRC and counts as absent.
//!
//! Why one slot per stripe: an older record of a stripe that lingers on a
//! member (a later update of the stripe did not change that member) must
//! never be written in place again over what a later update of the stripe
//! wrote there. In the stripe's one slot, a later record overwrites the
//! older one on every member whose in-place bytes it changes: a record a
//! member still holds is the last its in-place bytes got, and writing it
//! again changes nothing.
//! (Records in slots of their own would let an applied newer record's slot
//! be reused while an older one stayed whole, and recovery would then put
//! the older bytes back: the simulation found exactly that.)
//!
//! What this does not do: write anything, or know which members are in
//! sync (the primary's).

use weft_replication::Epoch;

/// A record header's first bytes.
pub const RECORD_MAGIC: [u8; 8] = *b"WEFTECJ1";
/// The fixed fields of a header (the rest of its block is zero).
const HEADER_FIELDS: usize = 8 + 8 + 8 + 8 + 2 + 2 + 4 + 4 + 4;

/// Where the journal and the chunks lie in a member's shard volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalLayout {
    /// Slots per member.
    pub slots: u32,
    /// A header block's bytes (the volume's block size).
    pub block_bytes: u32,
    /// A chunk's bytes: the most a record carries.
    pub chunk_bytes: u32,
}

impl JournalLayout {
    /// A slot's bytes: a header block and a chunk.
    pub fn slot_bytes(&self) -> u64 {
        u64::from(self.block_bytes) + u64::from(self.chunk_bytes)
    }

    /// Where slot `slot` begins in the shard volume.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        debug_assert!(slot < self.slots);
        u64::from(slot) * self.slot_bytes()
    }

    /// Where the chunks begin: after the journal, on a chunk boundary.
    pub fn data_base(&self) -> u64 {
        let chunk = u64::from(self.chunk_bytes);
        (u64::from(self.slots) * self.slot_bytes()).div_ceil(chunk) * chunk
    }
}

/// One member's part of one stripe update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The epoch of the primary that wrote it.
    pub epoch: Epoch,
    /// Its sequence number in that epoch (the primary's, increasing).
    pub seq: u64,
    /// The stripe.
    pub stripe: u64,
    /// The member it is for (its position in the stripe's member list).
    pub member: u16,
    /// Every member the update changes, one bit each.
    pub changed: u16,
    /// Where its bytes go in the member's chunk.
    pub column: u32,
    /// The member's new bytes there.
    pub data: Vec<u8>,
}

impl Record {
    /// Orders records of one stripe: the newest is the greatest.
    pub fn age(&self) -> (Epoch, u64) {
        (self.epoch, self.seq)
    }

    /// Whether `member` is one the update changes.
    pub fn changes(&self, member: usize) -> bool {
        self.changed & (1 << member) != 0
    }

    /// The record as its slot holds it: a header block, then the data.
    pub fn encode(&self, layout: &JournalLayout) -> Vec<u8> {
        let block = layout.block_bytes as usize;
        assert!(self.data.len() <= layout.chunk_bytes as usize);
        assert!(self.data.len().is_multiple_of(block), "whole blocks");
        let mut bytes = vec![0; block + self.data.len()];
        let header = &mut bytes[..HEADER_FIELDS];
        header[0..8].copy_from_slice(&RECORD_MAGIC);
        header[8..16].copy_from_slice(&self.epoch.0.to_le_bytes());
        header[16..24].copy_from_slice(&self.seq.to_le_bytes());
        header[24..32].copy_from_slice(&self.stripe.to_le_bytes());
        header[32..34].copy_from_slice(&self.member.to_le_bytes());
        header[34..36].copy_from_slice(&self.changed.to_le_bytes());
        header[36..40].copy_from_slice(&self.column.to_le_bytes());
        header[40..44].copy_from_slice(&(self.data.len() as u32).to_le_bytes());
        bytes[block..].copy_from_slice(&self.data);
        let crc =
            crc32c::crc32c_append(crc32c::crc32c(&bytes[..HEADER_FIELDS - 4]), &bytes[block..]);
        bytes[HEADER_FIELDS - 4..HEADER_FIELDS].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// The record a slot holds, if it holds a whole one (a torn or empty
    /// slot holds none).
    pub fn decode(slot: &[u8], layout: &JournalLayout) -> Option<Record> {
        let block = layout.block_bytes as usize;
        if slot.len() < block || slot[0..8] != RECORD_MAGIC {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(slot[at..at + 4].try_into().expect("4"));
        let u16_at = |at: usize| u16::from_le_bytes(slot[at..at + 2].try_into().expect("2"));
        let len = u32_at(40) as usize;
        if len > layout.chunk_bytes as usize || slot.len() < block + len {
            return None;
        }
        let data = &slot[block..block + len];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&slot[..HEADER_FIELDS - 4]), data);
        if crc != u32_at(HEADER_FIELDS - 4) {
            return None;
        }
        Some(Record {
            epoch: Epoch(u64_at(8)),
            seq: u64_at(16),
            stripe: u64_at(24),
            member: u16_at(32),
            changed: u16_at(34),
            column: u32_at(36),
            data: data.to_vec(),
        })
    }
}

/// What recovery does with the records found in the in-sync members'
/// journals.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Records to write in place again, each on its own member.
    pub redo: Vec<Record>,
    /// Slots that hold a record, per member: cleared once the redo is
    /// durable, so that no later recovery finds them.
    pub clear: Vec<(usize, u32)>,
}

/// Decides, from the records found at `(member, slot)` in the journals of
/// the members `in_sync` says are in sync, what to apply again: per
/// stripe, the newest record, if every in-sync member it changes holds it.
pub fn recovery(found: Vec<(usize, u32, Record)>, in_sync: impl Fn(usize) -> bool) -> Recovery {
    use std::collections::BTreeMap;
    let mut newest: BTreeMap<u64, (Epoch, u64)> = BTreeMap::new();
    for (_, _, record) in &found {
        let age = newest.entry(record.stripe).or_insert(record.age());
        *age = (*age).max(record.age());
    }
    // Per newest update, the members found holding it.
    let mut holders: BTreeMap<u64, u16> = BTreeMap::new();
    for (member, _, record) in &found {
        if newest[&record.stripe] == record.age() && usize::from(record.member) == *member {
            *holders.entry(record.stripe).or_default() |= 1 << member;
        }
    }
    let mut plan = Recovery::default();
    for (member, slot, record) in found {
        plan.clear.push((member, slot));
        let own = usize::from(record.member) == member && in_sync(member);
        if newest[&record.stripe] != record.age() || !own {
            continue;
        }
        let held = holders[&record.stripe];
        let complete = (0..16)
            .filter(|&m| record.changes(m) && in_sync(m))
            .all(|m| held & (1 << m) != 0);
        if complete {
            plan.redo.push(record);
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> JournalLayout {
        JournalLayout {
            slots: 4,
            block_bytes: 512,
            chunk_bytes: 4096,
        }
    }

    fn record(epoch: u64, seq: u64, stripe: u64, member: u16, changed: u16) -> Record {
        Record {
            epoch: Epoch(epoch),
            seq,
            stripe,
            member,
            changed,
            column: 1024,
            data: vec![member as u8 + 1; 1024],
        }
    }

    #[test]
    fn a_record_reads_back_and_a_torn_one_reads_as_none() {
        let layout = layout();
        let r = record(3, 7, 2, 1, 0b110011);
        let bytes = r.encode(&layout);
        assert_eq!(bytes.len(), 512 + 1024);
        assert_eq!(&bytes[..8], b"WEFTECJ1");
        assert_eq!(Record::decode(&bytes, &layout), Some(r.clone()));
        // Trailing bytes of a slot do not matter.
        let mut slot = bytes.clone();
        slot.extend_from_slice(&[0xAA; 512]);
        assert_eq!(Record::decode(&slot, &layout), Some(r));
        // A header that landed without its data, or the reverse.
        let mut torn = bytes.clone();
        torn[600] ^= 1;
        assert_eq!(Record::decode(&torn, &layout), None);
        let mut torn = bytes.clone();
        torn[20] ^= 1;
        assert_eq!(Record::decode(&torn, &layout), None);
        assert_eq!(Record::decode(&[0; 1536], &layout), None);
        // A length past the slot.
        assert_eq!(Record::decode(&bytes[..1000], &layout), None);
    }

    #[test]
    fn the_chunks_follow_the_journal_on_a_chunk_boundary() {
        let layout = layout();
        assert_eq!(layout.slot_bytes(), 4608);
        assert_eq!(layout.slot_offset(3), 3 * 4608);
        assert_eq!(layout.data_base(), 5 * 4096);
    }

    #[test]
    fn the_newest_update_of_a_stripe_is_redone_only_if_every_in_sync_member_holds_it() {
        // Stripe 0: seq 5 on members 0, 4, 5 (complete); stripe 1: seq 6 on
        // 1 and 4 but not 5 (torn); stripe 2: seq 2 on 2, 4, 5, and the
        // newer seq 9 on 2 and 5 only while 4 is out of sync.
        let changed_0 = 0b110001;
        let changed_1 = 0b110010;
        let changed_2 = 0b110100;
        let found = vec![
            (0, 0, record(1, 5, 0, 0, changed_0)),
            (4, 0, record(1, 5, 0, 4, changed_0)),
            (5, 0, record(1, 5, 0, 5, changed_0)),
            (1, 1, record(1, 6, 1, 1, changed_1)),
            (4, 1, record(1, 6, 1, 4, changed_1)),
            (2, 2, record(1, 2, 2, 2, changed_2)),
            (4, 2, record(1, 2, 2, 4, changed_2)),
            (5, 2, record(1, 2, 2, 5, changed_2)),
            (2, 3, record(2, 1, 2, 2, changed_2)),
            (5, 3, record(2, 1, 2, 5, changed_2)),
        ];
        let all = recovery(found.clone(), |_| true);
        let redone: Vec<(u64, u16)> = all.redo.iter().map(|r| (r.stripe, r.member)).collect();
        // Stripe 2's newest (epoch 2) lacks member 4: dropped, and the
        // older seq 2 is not redone either (it was applied before).
        assert_eq!(redone, vec![(0, 0), (0, 4), (0, 5)]);
        assert_eq!(all.clear.len(), found.len());
        let without_4 = recovery(found, |m| m != 4);
        let redone: Vec<(u64, u16)> = without_4
            .redo
            .iter()
            .map(|r| (r.stripe, r.member))
            .collect();
        assert_eq!(redone, vec![(0, 0), (0, 5), (2, 2), (2, 5)]);
    }

    #[test]
    fn a_record_found_in_another_members_slot_is_not_that_members() {
        // A slot holding member 1's record on member 0 (a mislaid write)
        // counts for nobody.
        let found = vec![
            (0, 0, record(1, 1, 0, 1, 0b11)),
            (1, 0, record(1, 1, 0, 1, 0b11)),
        ];
        assert!(recovery(found, |_| true).redo.is_empty());
    }
}
