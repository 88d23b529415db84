//! A bounded free list of byte buffers, for the encoded bytes of stored-chunk reads: a read
//! fills a recycled buffer's capacity instead of faulting in fresh pages for every chunk.

use std::sync::Mutex;

use crate::lock;

/// Keeps at most `max_buffers` buffers; extra ones are freed.
#[derive(Debug)]
pub struct Recycler {
    free: Mutex<Vec<Vec<u8>>>,
    max_buffers: usize,
}

impl Recycler {
    /// A free list holding at most `max_buffers` buffers (the number of reads in flight is the
    /// right size: more are never in use at once).
    pub fn new(max_buffers: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            max_buffers,
        }
    }

    /// An empty buffer, with capacity left from an earlier use when one is free.
    pub fn take(&self) -> Vec<u8> {
        lock(&self.free).pop().unwrap_or_default()
    }

    /// Returns a buffer for reuse.
    pub fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = lock(&self.free);
        if free.len() < self.max_buffers {
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
}
