//! Page-aligned, zero-initialised byte buffers backed by anonymous mmap.

use std::fmt;
use std::io;
use std::ptr::NonNull;

/// Alignment and capacity granularity of [`IoBuf`]; enough for `O_DIRECT` on any common device.
const PAGE: usize = 4096;

/// Owned, zero-initialised byte buffer aligned to 4096 bytes (usable for `O_DIRECT`).
///
/// The capacity is rounded up to a multiple of 4096 (at least one page). The memory comes from
/// `mmap(MAP_PRIVATE | MAP_ANONYMOUS)`, so pages that are never touched cost no memory, and the
/// data never moves when the `IoBuf` itself is moved — which is what lets the ring hand its
/// address to the kernel.
pub struct IoBuf {
    ptr: NonNull<u8>,
    capacity: usize,
}

// SAFETY: IoBuf exclusively owns its mapping (like Box<[u8]>); nothing is tied to the creating
// thread, so moving it to another thread is sound.
unsafe impl Send for IoBuf {}

impl IoBuf {
    /// Maps a new zeroed buffer of at least `capacity` bytes (rounded up to a page multiple).
    pub fn new(capacity: usize) -> io::Result<IoBuf> {
        let capacity = round_up_to_page(capacity)?;
        // SAFETY: anonymous private mapping with a null hint: no existing memory is affected,
        // and the result is checked against MAP_FAILED before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(addr.cast::<u8>()).expect("mmap returned null without MAP_FIXED");
        Ok(IoBuf { ptr, capacity })
    }

    /// Usable size in bytes (a multiple of 4096).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `capacity` bytes, readable, initialised (zero-filled by the
        // kernel) and lives as long as `self`; `&self` rules out concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.capacity) }
    }

    /// The whole buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    /// Zeroes `range`, giving back to the kernel the memory of the whole
    /// pages in it (they read as zeroes and cost nothing until written):
    /// a large reply of zeroes, sent from here, holds no memory.
    pub fn zero(&mut self, range: std::ops::Range<usize>) {
        assert_range_fits(range.start, range.len(), self.capacity);
        let first_page = range.start.next_multiple_of(PAGE).min(range.end);
        let last_page = (range.end / PAGE * PAGE).max(first_page);
        self.as_mut_slice()[range.start..first_page].fill(0);
        self.as_mut_slice()[last_page..range.end].fill(0);
        if last_page > first_page {
            // SAFETY: [first_page, last_page) is page-aligned and lies within this mapping,
            // which `&mut self` owns exclusively; MADV_DONTNEED on a private anonymous mapping
            // only replaces those pages with zero-fill-on-demand ones, so every reference to
            // the buffer stays valid and reads zeroes there.
            let rc = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(first_page).cast(),
                    last_page - first_page,
                    libc::MADV_DONTNEED,
                )
            };
            if rc != 0 {
                // Not expected on a mapping of our own; zeroes all the same.
                self.as_mut_slice()[first_page..last_page].fill(0);
            }
        }
    }

    /// Raw pointer to byte `offset`, for handing `[offset, offset + len)` to the kernel.
    /// Panics if the range does not fit, so the kernel can never be pointed outside the mapping.
    pub(crate) fn kernel_ptr(&mut self, offset: usize, len: usize) -> *mut u8 {
        assert_range_fits(offset, len, self.capacity);
        // SAFETY: offset <= capacity was just checked, so the result stays within (or one past
        // the end of) the mapping.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// Address of byte `offset` for a read-only kernel access of `len` bytes (e.g. sendmsg).
    pub(crate) fn kernel_const_ptr(&self, offset: usize, len: usize) -> *const u8 {
        assert_range_fits(offset, len, self.capacity);
        // SAFETY: offset <= capacity was just checked.
        unsafe { self.ptr.as_ptr().add(offset) }
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        // SAFETY: ptr/capacity describe exactly the mapping created in `new`, which no one else
        // references: the ring never drops an IoBuf the kernel may still be using.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

impl fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoBuf")
            .field("capacity", &self.capacity)
            .finish()
    }
}

/// Panics unless `[offset, offset + len)` lies within `capacity` bytes.
pub(crate) fn assert_range_fits(offset: usize, len: usize, capacity: usize) {
    let fits = offset.checked_add(len).is_some_and(|end| end <= capacity);
    assert!(
        fits,
        "range {offset}+{len} exceeds buffer capacity {capacity}"
    );
}

fn round_up_to_page(capacity: usize) -> io::Result<usize> {
    capacity
        .max(1)
        .checked_next_multiple_of(PAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "IoBuf capacity overflows"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_rounded_up_to_pages() {
        assert_eq!(IoBuf::new(0).unwrap().capacity(), 4096);
        assert_eq!(IoBuf::new(1).unwrap().capacity(), 4096);
        assert_eq!(IoBuf::new(4096).unwrap().capacity(), 4096);
        assert_eq!(IoBuf::new(4097).unwrap().capacity(), 8192);
    }

    #[test]
    fn memory_is_aligned_and_zeroed() {
        let buf = IoBuf::new(3 * 4096 + 5).unwrap();
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
    }

    /// Resident pages of `buf` (mincore).
    fn resident_pages(buf: &IoBuf) -> usize {
        let pages = buf.capacity() / PAGE;
        let mut map = vec![0u8; pages];
        // SAFETY: the mapping is page-aligned and `capacity` bytes; `map` has a byte per page.
        let rc =
            unsafe { libc::mincore(buf.ptr.as_ptr().cast(), buf.capacity(), map.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", io::Error::last_os_error());
        map.iter().filter(|&&page| page & 1 != 0).count()
    }

    #[test]
    fn zeroing_gives_whole_pages_back_and_zeroes_the_edges() {
        let mut buf = IoBuf::new(16 * PAGE).unwrap();
        buf.as_mut_slice().fill(0xAB);
        assert_eq!(resident_pages(&buf), 16);
        buf.zero(100..10 * PAGE + 7);
        // Pages 1 to 9 were whole in the range: given back (counted before
        // they are read, which maps the zero page there).
        assert_eq!(resident_pages(&buf), 7);
        let bytes = buf.as_slice();
        assert!(bytes[..100].iter().all(|&b| b == 0xAB));
        assert!(bytes[100..10 * PAGE + 7].iter().all(|&b| b == 0));
        assert!(bytes[10 * PAGE + 7..].iter().all(|&b| b == 0xAB));
        buf.zero(5..9);
        assert!(buf.as_slice()[5..9].iter().all(|&b| b == 0));
        buf.zero(0..0);
    }

    #[test]
    fn writes_are_visible_and_survive_moves() {
        let mut buf = IoBuf::new(100).unwrap();
        buf.as_mut_slice()[..3].copy_from_slice(b"abc");
        let addr = buf.as_slice().as_ptr();
        let moved = std::thread::spawn(move || buf).join().unwrap();
        assert_eq!(moved.as_slice().as_ptr(), addr);
        assert_eq!(&moved.as_slice()[..3], b"abc");
    }

    #[test]
    fn absurd_capacity_is_an_error() {
        assert!(IoBuf::new(usize::MAX).is_err());
    }

    #[test]
    #[should_panic(expected = "exceeds buffer capacity")]
    fn kernel_ptr_rejects_out_of_bounds() {
        let mut buf = IoBuf::new(4096).unwrap();
        buf.kernel_ptr(4000, 97);
    }
}
