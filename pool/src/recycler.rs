//! A bounded free list of byte buffers, for the encoded bytes of stored-chunk reads: a read
//! fills a recycled buffer's capacity instead of faulting in fresh pages for every chunk.
//!
//! Buffers are kept only while some pass still has reads to issue ([`Recycler::issuing`]):
//! once the last one has issued its last read, a buffer given back is freed, and the ones kept
//! are freed with it, so a pass whose later epochs are all hits does not hold a read buffer per
//! read in flight for good.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::lock;

/// Keeps at most `max_buffers` buffers, and none while no pass issues reads; extra ones are
/// freed.
#[derive(Debug)]
pub struct Recycler {
    free: Mutex<Vec<Vec<u8>>>,
    max_buffers: usize,
    /// Passes that may still issue reads (live [`Issuing`] guards).
    issuers: AtomicUsize,
}

/// A pass that may still issue reads: while one lives, buffers given back are kept for reuse.
#[derive(Debug)]
pub struct Issuing<'a>(&'a Recycler);

impl Drop for Issuing<'_> {
    fn drop(&mut self) {
        // The lock orders this against a `give` that saw the count above zero.
        let mut free = lock(&self.0.free);
        if self.0.issuers.fetch_sub(1, Ordering::AcqRel) == 1 {
            free.clear();
            free.shrink_to_fit();
        }
    }
}

impl Recycler {
    /// A free list holding at most `max_buffers` buffers (the number of reads in flight is the
    /// right size: more are never in use at once).
    pub fn new(max_buffers: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            max_buffers,
            issuers: AtomicUsize::new(0),
        }
    }

    /// Marks a pass that will issue reads until the guard is dropped.
    pub fn issuing(&self) -> Issuing<'_> {
        let _free = lock(&self.free);
        self.issuers.fetch_add(1, Ordering::AcqRel);
        Issuing(self)
    }

    /// An empty buffer, with capacity left from an earlier use when one is free.
    pub fn take(&self) -> Vec<u8> {
        lock(&self.free).pop().unwrap_or_default()
    }

    /// Returns a buffer for reuse.
    pub fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = lock(&self.free);
        if free.len() < self.max_buffers && self.issuers.load(Ordering::Acquire) > 0 {
            free.push(buf);
        }
    }

    /// The most buffers it keeps.
    pub fn max_buffers(&self) -> usize {
        self.max_buffers
    }

    /// Buffers free now.
    pub fn free_buffers(&self) -> usize {
        lock(&self.free).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_capacity_and_respects_its_bound() {
        let r = Recycler::new(1);
        let _reads = r.issuing();
        let mut a = r.take();
        a.extend_from_slice(&[1; 100]);
        let cap = a.capacity();
        r.give(a);
        r.give(vec![2; 10]); // over the bound: dropped
        assert_eq!(r.free_buffers(), 1);
        let b = r.take();
        assert!(b.is_empty() && b.capacity() == cap);
        assert!(r.take().capacity() == 0);
    }

    #[test]
    fn keeps_buffers_only_while_a_pass_issues_reads() {
        let r = Recycler::new(4);
        // No pass issuing: a buffer given back is freed.
        r.give(vec![1; 10]);
        assert_eq!(r.free_buffers(), 0);
        let (a, b) = (r.issuing(), r.issuing());
        r.give(vec![1; 10]);
        r.give(vec![2; 10]);
        assert_eq!(r.free_buffers(), 2);
        // One of two passes done issuing: the other still reuses them.
        drop(a);
        assert_eq!(r.free_buffers(), 2);
        // The last one done: the kept ones go too, and later ones are not kept.
        drop(b);
        assert_eq!(r.free_buffers(), 0);
        r.give(vec![3; 10]);
        assert_eq!(r.free_buffers(), 0);
        let _c = r.issuing();
        r.give(vec![4; 10]);
        assert_eq!(r.free_buffers(), 1);
    }
}
