//! Work a reactor runs on its own thread beside its connections: a guest
//! with an io_uring of its own (the primary of a replicated volume: its
//! local writes and its replicas' sockets) and no thread. The guest's ring
//! signals an eventfd (its doorbell) when completions arrive; the reactor
//! reads the doorbell on its own ring and gives that guest a turn when it
//! rings, every guest that says it has work after any batch of its own
//! completions that handed a guest work (which one is not known there),
//! and a guest whose ring a spin finds busy. A write a reactor
//! hands to its own guest is taken up in the same wake-up, and the answer
//! reaches the reactor's mailbox without an eventfd write (the reactor
//! reads its mailbox after every turn of its guests): no thread is put to
//! sleep or woken in between. With a thread of its own, a replicated write
//! took two such hand-overs each way.
//!
//! What this does not do: decide which reactor hosts a guest
//! ([`crate::DataPlane::host`] does), or bound a guest's turn: a guest
//! must never block, since every connection of its reactor waits for it.

/// A guest of a reactor. Its ring signals an eventfd, its doorbell,
/// whenever completions arrive there (given with it to
/// [`crate::DataPlane::host`]); a guest that needs a timer keeps one on
/// its ring.
pub trait Guest: Send {
    /// Whether a turn would find work now, without a system call (a
    /// spinning reactor asks, and a reactor that handed some guest work
    /// without ringing its doorbell): work handed over that way included.
    fn has_work(&mut self) -> bool;

    /// Does what it can now without blocking. False once it has finished
    /// (the reactor drops it then).
    fn turn(&mut self) -> bool;
}
