//! Buffers that IO operations own while the kernel (or a blocking thread) writes into them.
//!
//! An operation takes its buffer by value and hands it back on completion. While the operation is
//! in flight the buffer lives inside the driver, so a caller that gives up (drops the future) can
//! never free memory the kernel is still writing to.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;

/// A buffer an IO operation may read from (`write_at`).
///
/// # Safety
/// `stable_ptr` must point to `bytes_init()` initialised bytes, and the pointer must stay valid
/// and unchanged while the value is moved around (heap storage, never inline storage).
pub unsafe trait IoBuf: Send + 'static {
    /// Pointer to the first byte; stable across moves of `self`.
    fn stable_ptr(&self) -> *const u8;
    /// Number of initialised bytes.
    fn bytes_init(&self) -> usize;
}

/// A buffer an IO operation may write into (`read_at`).
///
/// # Safety
/// `stable_mut_ptr` must point to `bytes_total()` writable bytes, valid and unchanged across moves;
/// `set_init(n)` is only called after the first `n` bytes were written.
pub unsafe trait IoBufMut: IoBuf {
    /// Pointer to the first byte; stable across moves of `self`.
    fn stable_mut_ptr(&mut self) -> *mut u8;
    /// Capacity that the operation may fill.
    fn bytes_total(&self) -> usize;
    /// Marks the first `n` bytes as initialised.
    ///
    /// # Safety
    /// The first `n` bytes must have been written.
    unsafe fn set_init(&mut self, n: usize);
}

// SAFETY: a Vec's heap pointer does not change when the Vec is moved; `len` bytes are initialised.
unsafe impl IoBuf for Vec<u8> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

// SAFETY: the spare capacity is writable heap memory that does not move with the Vec.
unsafe impl IoBufMut for Vec<u8> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.as_mut_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.capacity()
    }
    unsafe fn set_init(&mut self, n: usize) {
        if n > self.len() {
            // SAFETY: the caller guarantees the first `n` bytes were written, and n <= capacity
            // because the kernel was only given `capacity` bytes.
            unsafe { self.set_len(n) };
        }
    }
}

/// Alignment that satisfies O_DIRECT on every Linux file system we know of (4 KiB pages and
/// 4Kn drives; 512-byte devices are satisfied too).
pub const DIRECT_IO_ALIGN: usize = 4096;

/// A zero-initialised heap buffer aligned for O_DIRECT.
///
/// O_DIRECT requires the buffer address, the length and the file offset to be multiples of the
/// logical block size; `AlignedBuf` takes care of the first two.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only read.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocates `capacity` bytes rounded up to [`DIRECT_IO_ALIGN`], all zero, with length 0.
    /// Aborts the process if the allocator refuses, as `Vec` does; see
    /// [`AlignedBuf::try_with_capacity`].
    pub fn with_capacity(capacity: usize) -> Self {
        match Self::try_with_capacity(capacity) {
            Some(buf) => buf,
            None => std::alloc::handle_alloc_error(Self::layout(
                capacity.max(1).next_multiple_of(DIRECT_IO_ALIGN),
            )),
        }
    }

    /// [`AlignedBuf::with_capacity`], or `None` when the size is not representable or the
    /// allocator refuses it (for sizes that come from user input).
    pub fn try_with_capacity(capacity: usize) -> Option<Self> {
        let capacity = capacity.max(1).checked_next_multiple_of(DIRECT_IO_ALIGN)?;
        let layout = Layout::from_size_align(capacity, DIRECT_IO_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        Some(Self {
            ptr: NonNull::new(raw)?,
            capacity,
            len: 0,
        })
    }

    /// Copies `data` into a new aligned buffer whose length is `data.len()`.
    pub fn copy_from(data: &[u8]) -> Self {
        let mut buf = Self::with_capacity(data.len());
        buf.as_mut_capacity()[..data.len()].copy_from_slice(data);
        buf.len = data.len();
        buf
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, DIRECT_IO_ALIGN).expect("aligned layout")
    }

    /// The initialised bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised (the allocation is zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The whole allocation, for filling before a write.
    pub fn as_mut_capacity(&mut self) -> &mut [u8] {
        // SAFETY: the allocation is `capacity` zero-initialised bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity) }
    }

    /// Sets the initialised length; `len` must not exceed the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "AlignedBuf length {len} exceeds capacity {}",
            self.capacity
        );
        self.len = len;
    }

    /// Capacity in bytes (a multiple of [`DIRECT_IO_ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `with_capacity` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.capacity)) };
    }
}

// SAFETY: heap pointer owned by the value, stable across moves; `len` bytes initialised.
unsafe impl IoBuf for AlignedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
}

// SAFETY: `capacity` writable bytes, stable across moves.
unsafe impl IoBufMut for AlignedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn bytes_total(&self) -> usize {
        self.capacity
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.len = self.len.max(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_is_aligned_and_rounded() {
        let mut b = AlignedBuf::with_capacity(10);
        assert_eq!(b.capacity(), DIRECT_IO_ALIGN);
        assert_eq!(b.stable_ptr() as usize % DIRECT_IO_ALIGN, 0);
        assert!(b.as_slice().is_empty());
        b.as_mut_capacity()[..3].copy_from_slice(b"abc");
        b.set_len(3);
        assert_eq!(b.as_slice(), b"abc");
        let c = AlignedBuf::copy_from(&[7u8; 5000]);
        assert_eq!(c.capacity(), 2 * DIRECT_IO_ALIGN);
        assert_eq!(c.as_slice().len(), 5000);
        assert!(c.as_slice().iter().all(|&x| x == 7));
    }

    #[test]
    #[should_panic(expected = "exceeds capacity")]
    fn aligned_buf_rejects_overlong_len() {
        AlignedBuf::with_capacity(1).set_len(DIRECT_IO_ALIGN + 1);
    }
}
