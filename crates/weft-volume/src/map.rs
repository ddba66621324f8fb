//! The in-memory chunk map of a served volume, shared between the volume
//! manager (its only writer) and the data plane's reactors (readers), and
//! the write gate that lets the manager drain a volume's I/O.
//!
//! A lookup is one atomic load: no lock, no allocation. An entry is either
//! unmapped (reads return zeroes) or maps to a physical chunk, with a
//! `writable` bit set only while the chunk is referenced by this volume alone
//! — a reactor may write to it directly. Anything else (first write,
//! copy-on-write of a shared chunk, a map retired by a resize, a closed gate)
//! goes to the manager.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const MAPPED: u64 = 1 << 63;
const WRITABLE: u64 = 1 << 62;

/// What one map entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Never written or deallocated: reads as zeroes.
    Unmapped,
    /// Backed by physical chunk `chunk`.
    Mapped {
        /// Physical chunk number in the pool.
        chunk: u32,
        /// Referenced by this volume only: direct writes are safe.
        writable: bool,
    },
}

/// A volume's logical chunk -> physical chunk table.
#[derive(Debug)]
pub struct ChunkMap {
    entries: Box<[AtomicU64]>,
    retired: AtomicBool,
}

impl ChunkMap {
    /// A map of `len` unmapped entries.
    pub fn new(len: usize) -> ChunkMap {
        ChunkMap {
            entries: (0..len).map(|_| AtomicU64::new(0)).collect(),
            retired: AtomicBool::new(false),
        }
    }

    /// Number of logical chunks.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entry `index` (must be in range).
    pub fn lookup(&self, index: usize) -> Lookup {
        decode(self.entries[index].load(Ordering::Acquire))
    }

    /// Sets entry `index`. Only the volume manager calls this.
    pub fn set(&self, index: usize, lookup: Lookup) {
        self.entries[index].store(encode(lookup), Ordering::Release);
    }

    /// Marks the map as replaced (after a resize): readers must ask the
    /// manager until they hold the new map, which no longer updates this one.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Whether the map was replaced.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// A copy of this map with `len` entries (longer: the tail unmapped).
    pub fn resized(&self, len: usize) -> ChunkMap {
        let map = ChunkMap::new(len);
        for (index, entry) in self.entries.iter().enumerate().take(len) {
            map.entries[index].store(entry.load(Ordering::Acquire), Ordering::Relaxed);
        }
        map
    }

    /// Every entry, in order.
    pub fn iter(&self) -> impl Iterator<Item = Lookup> + '_ {
        self.entries
            .iter()
            .map(|entry| decode(entry.load(Ordering::Acquire)))
    }
}

fn encode(lookup: Lookup) -> u64 {
    match lookup {
        Lookup::Unmapped => 0,
        Lookup::Mapped { chunk, writable } => {
            MAPPED | u64::from(chunk) | if writable { WRITABLE } else { 0 }
        }
    }
}

fn decode(raw: u64) -> Lookup {
    if raw & MAPPED == 0 {
        Lookup::Unmapped
    } else {
        Lookup::Mapped {
            chunk: raw as u32,
            writable: raw & WRITABLE != 0,
        }
    }
}

/// Counts a volume's I/Os in flight in the data plane and lets the manager
/// stop new ones and wait for those in flight (before a snapshot, an unmap or
/// a delete changes which chunks the volume may touch).
///
/// Protocol (a Dekker-style handshake, hence SeqCst): the data plane
/// increments `in_flight` and then checks `closed`; the manager sets `closed`
/// and then waits for `in_flight` to reach zero. Either the I/O sees the gate
/// closed, or the manager sees the I/O.
#[derive(Debug, Default)]
pub struct WriteGate {
    in_flight: AtomicU64,
    closed: AtomicBool,
}

impl WriteGate {
    /// Registers an I/O about to be issued; false (and nothing registered)
    /// when the gate is closed: the I/O must go to the manager instead.
    pub fn enter(&self) -> bool {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.closed.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    /// Unregisters an I/O that `enter` admitted, once it completed.
    pub fn leave(&self) {
        let before = self.in_flight.fetch_sub(1, Ordering::SeqCst);
        debug_assert!(before > 0, "leave without enter");
    }

    /// Closes the gate and waits until no admitted I/O is in flight; the gate
    /// reopens when the guard drops.
    pub fn quiesce(&self) -> GateGuard<'_> {
        self.closed.store(true, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.in_flight.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        GateGuard { gate: self }
    }
}

/// Keeps a [`WriteGate`] closed.
#[derive(Debug)]
pub struct GateGuard<'a> {
    gate: &'a WriteGate,
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        self.gate.closed.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn entries_round_trip_and_resize_keeps_them() {
        let map = ChunkMap::new(4);
        assert_eq!(map.lookup(0), Lookup::Unmapped);
        let mapped = Lookup::Mapped {
            chunk: u32::MAX - 1,
            writable: true,
        };
        map.set(3, mapped);
        map.set(
            1,
            Lookup::Mapped {
                chunk: 0,
                writable: false,
            },
        );
        let bigger = map.resized(6);
        assert_eq!(bigger.lookup(3), mapped);
        assert_eq!(bigger.lookup(5), Lookup::Unmapped);
        assert_eq!(bigger.iter().filter(|l| *l != Lookup::Unmapped).count(), 2);
        assert!(!map.is_retired());
        map.retire();
        assert!(map.is_retired());
    }

    #[test]
    fn quiesce_waits_for_admitted_io_and_refuses_new() {
        let gate = Arc::new(WriteGate::default());
        assert!(gate.enter());
        let io = {
            let gate = Arc::clone(&gate);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                gate.leave();
            })
        };
        let guard = gate.quiesce();
        assert_eq!(gate.in_flight.load(Ordering::SeqCst), 0);
        assert!(!gate.enter(), "closed while quiesced");
        drop(guard);
        assert!(gate.enter());
        gate.leave();
        io.join().unwrap();
    }
}
