//! Immutable, page-aligned byte buffers shared by reference count: the one
//! copy of a replicated write's data that the primary's own write
//! ([`crate::Op::WriteShared`]) and every replica's send
//! ([`crate::SendBatch::push_shared`]) read at once, instead of each
//! copying it into a buffer of its own.
//!
//! What this does not do: change its bytes once made (nothing can, which
//! is what lets the kernel read them while other threads hold a reference),
//! or pool its memory (it comes from the global allocator, as a `Vec`'s
//! would).

use crate::buf::assert_range_fits;
use std::alloc::Layout;
use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of [`SharedBuf`]'s bytes: enough for `O_DIRECT` on any common device.
const ALIGN: usize = 4096;

/// An immutable byte buffer aligned to 4096 bytes; clones share the bytes.
#[derive(Clone)]
pub struct SharedBuf {
    bytes: Arc<Aligned>,
}

/// The allocation: `len` initialised bytes at `ptr`.
struct Aligned {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: `Aligned` exclusively owns its allocation (like `Box<[u8]>`) and
// never hands out a mutable reference to it after construction, so moving
// it to, or reading it from, any thread is sound.
unsafe impl Send for Aligned {}
// SAFETY: as above: only shared (read-only) access exists.
unsafe impl Sync for Aligned {}

impl SharedBuf {
    /// A buffer holding a copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> SharedBuf {
        let layout = Layout::from_size_align(bytes.len().max(1), ALIGN)
            .expect("a buffer's length is below isize::MAX");
        // SAFETY: the layout's size is at least 1.
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout);
        };
        // SAFETY: the allocation is at least `bytes.len()` bytes, fresh, so
        // it cannot overlap `bytes`; afterwards those bytes are initialised.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr.as_ptr(), bytes.len()) };
        let aligned = Aligned {
            ptr,
            len: bytes.len(),
            layout,
        };
        SharedBuf {
            bytes: Arc::new(aligned),
        }
    }

    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes at `ptr` were initialised in `copy_from`, are
        // never written again, and live as long as the `Arc` this borrows.
        unsafe { std::slice::from_raw_parts(self.bytes.ptr.as_ptr(), self.bytes.len) }
    }

    /// Address of byte `offset` for a read-only kernel access of `len` bytes
    /// (a write to a file, a send). Panics if the range does not fit.
    pub(crate) fn kernel_const_ptr(&self, offset: usize, len: usize) -> *const u8 {
        assert_range_fits(offset, len, self.bytes.len);
        // SAFETY: offset <= len was just checked.
        unsafe { self.bytes.ptr.as_ptr().add(offset) }
    }
}

impl Deref for SharedBuf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `SharedBuf::copy_from` with this layout, freed
        // once: the last reference is gone (a ring leaks the references of
        // operations still in flight instead of dropping them).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

impl fmt::Debug for SharedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedBuf")
            .field("len", &self.bytes.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_holds_a_copy_aligned_and_clones_share_it() {
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let buf = SharedBuf::copy_from(&data);
        assert_eq!(buf.as_slice(), &data[..]);
        assert_eq!(buf.as_ptr() as usize % ALIGN, 0);
        let clone = buf.clone();
        assert_eq!(clone.as_ptr(), buf.as_ptr(), "no copy");
        let elsewhere = std::thread::spawn(move || clone[9_999]).join().unwrap();
        assert_eq!(elsewhere, data[9_999]);
    }

    #[test]
    fn an_empty_buffer_is_empty() {
        let buf = SharedBuf::copy_from(&[]);
        assert!(buf.is_empty());
    }

    #[test]
    #[should_panic(expected = "exceeds buffer capacity")]
    fn kernel_ptr_rejects_out_of_bounds() {
        SharedBuf::copy_from(&[1; 4096]).kernel_const_ptr(4000, 97);
    }
}
