//! Thin, safe, ownership-based wrapper over Linux `io_uring` for weft.
//!
//! What it does:
//! - [`Ring`] queues a small, fixed set of operations ([`Op`]): socket `recv`/`sendmsg`,
//!   file `pread`/`pwrite` (optionally `RWF_DSYNC`), `fsync`/`fdatasync`, `fallocate`,
//!   eventfd reads and timeouts.
//! - While the kernel may touch an operation's memory, the ring owns it: buffers
//!   ([`IoBuf`], [`SendBatch`], a reference to a [`SharedBuf`]) are moved into the ring on [`Ring::push`] and handed back in the
//!   [`Completion`] from [`Ring::pop`]. Safe code therefore cannot free, move or alias memory the
//!   kernel is using, so misuse is impossible from safe code.
//! - In steady state it does not allocate per operation: in-flight state lives in a preallocated
//!   slab whose entries are reused.
//! - A few `libc` helpers the storage layer needs ([`memfd_create`], [`eventfd`], block device
//!   ioctls, CPU pinning) live here so that this is the only weft crate containing `unsafe`.
//!
//! - With the `fio` feature, [`fio`]: fio's external I/O engine interface over weft's
//!   user-space initiator (fio hands an engine raw pointers; `crates/weft-fio` builds the
//!   plugin).
//!
//! What it does not do: it knows nothing about NVMe or NVMe/TCP, owns no file descriptors of
//! operations (callers keep their sockets and files open while ops are in flight), and offers no
//! cancellation, linked ops, registered buffers/files or multishot operations.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod batch;
mod buf;
#[cfg(feature = "fio")]
pub mod fio;
mod ring;
mod shared;
mod sys;

pub use batch::SendBatch;
pub use buf::IoBuf;
pub use ring::{Completion, Op, Returned, Ring};
pub use shared::SharedBuf;
pub use sys::{
    allowed_cpus, block_device_logical_block_size, block_device_size_bytes,
    block_termination_signals, eventfd, fallocate, fdatasync, memfd_create,
    pin_current_thread_to_cpu, wait_for_termination_signal,
};
