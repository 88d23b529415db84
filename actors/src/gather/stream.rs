//! Copies into batch buffers with streaming stores.
//!
//! A batch buffer is written once, row run by row run, and read by its consumer later, after
//! other batches have gone through the cache. With ordinary stores every destination line is
//! first read from memory (read-for-ownership) and later written back, so a copy moves three
//! bytes through memory per byte copied; streaming (non-temporal) stores write whole lines to
//! memory without reading them: two. glibc's `memcpy` switches to them only for single copies
//! larger than most of the last-level cache, which a row run (one or a few samples, ~100 KB to a
//! few MB) never is. Measured in docs/benchmarks.md ("Streaming stores into batch buffers").

/// Set to any value to copy with `memcpy` only (to compare, or on a platform where streaming
/// stores measure slower).
pub const NO_STREAMING_STORES_ENV: &str = "INSITUBATCH_NO_STREAMING_STORES";

/// Runs shorter than this are copied with `memcpy`: a small destination is cheap to own, and
/// the head and tail a streaming copy does with ordinary stores would be most of it.
pub const STREAM_MIN_BYTES: usize = 64 * 1024;

/// Copies `src` into `dst` (same length) the way the gather fills batch buffers. Call
/// [`stores_done`] after the last copy into a buffer, before it is handed on.
pub fn copy_to_batch(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_to_batch needs equal lengths");
    // SAFETY: both slices are valid for `len` bytes and cannot overlap (one is borrowed
    // mutably).
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// [`copy_to_batch`] on raw pointers.
///
/// # Safety
/// `dst` must be valid for writes and `src` for reads of `len` bytes, and the two ranges must
/// not overlap.
pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= STREAM_MIN_BYTES && streaming_stores_on() {
        // SAFETY: the caller's contract is this function's.
        unsafe { stream_x86_64(dst, src, len) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// False when [`NO_STREAMING_STORES_ENV`] is set (read once per process).
fn streaming_stores_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(NO_STREAMING_STORES_ENV).is_none())
}

/// Orders the streaming stores this thread has made before anything it does next (such as
/// handing the buffer to another thread); they are weakly ordered otherwise.
pub fn stores_done() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; SSE2 is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// Ordinary stores up to the first 16-byte boundary of `dst`, then 64 bytes at a time with
/// `movntdq` (unaligned loads, aligned streaming stores), then the tail.
///
/// # Safety
/// As [`copy_raw`].
#[cfg(target_arch = "x86_64")]
unsafe fn stream_x86_64(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = ((dst as usize).wrapping_neg() & 15).min(len);
    // SAFETY: every pointer below stays within `dst..dst + len` and `src..src + len` (the loop
    // runs while at least 64 bytes remain; head and tail are within the length), which the
    // caller guarantees valid and disjoint; `d` is 16-byte aligned after the head, as
    // `_mm_stream_si128` requires.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (mut d, mut s, mut n) = (dst.add(head), src.add(head), len - head);
        while n >= 64 {
            let a = _mm_loadu_si128(s.cast::<__m128i>());
            let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
            let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
            let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
            _mm_stream_si128(d.cast::<__m128i>(), a);
            _mm_stream_si128(d.add(16).cast::<__m128i>(), b);
            _mm_stream_si128(d.add(32).cast::<__m128i>(), c);
            _mm_stream_si128(d.add(48).cast::<__m128i>(), e);
            d = d.add(64);
            s = s.add(64);
            n -= 64;
        }
        std::ptr::copy_nonoverlapping(s, d, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_and_alignment_copies_exactly_and_touches_nothing_else() {
        let src: Vec<u8> = (0..(STREAM_MIN_BYTES * 3) as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let lens = [
            0,
            1,
            63,
            STREAM_MIN_BYTES - 1,
            STREAM_MIN_BYTES,
            STREAM_MIN_BYTES + 1,
            STREAM_MIN_BYTES + 65,
            2 * STREAM_MIN_BYTES + 17,
        ];
        for &len in &lens {
            for dst_off in [0usize, 1, 7, 15, 16, 33] {
                for src_off in [0usize, 3, 16] {
                    let mut dst = vec![0xAAu8; len + 64];
                    copy_to_batch(
                        &mut dst[dst_off..dst_off + len],
                        &src[src_off..src_off + len],
                    );
                    stores_done();
                    assert!(
                        dst[dst_off..dst_off + len] == src[src_off..src_off + len],
                        "len {len} dst+{dst_off} src+{src_off}: bytes differ"
                    );
                    assert!(
                        dst[..dst_off].iter().all(|&b| b == 0xAA),
                        "head overwritten"
                    );
                    assert!(
                        dst[dst_off + len..].iter().all(|&b| b == 0xAA),
                        "tail overwritten"
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "equal lengths")]
    fn unequal_lengths_are_refused() {
        copy_to_batch(&mut [0u8; 4], &[0u8; 5]);
    }
}
