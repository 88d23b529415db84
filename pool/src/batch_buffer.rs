//! Pooled batch buffers.
//!
//! Gather takes a buffer, fills it and hands it out inside a batch; when the consumer drops the
//! batch the buffer comes back here. There is no depth knob: the pool holds however many
//! buffers were genuinely in flight at once, and a retained batch simply retains its buffer.

use std::sync::{Arc, Mutex, Weak};

use insitubatch_runtime::AlignedBuf;

use crate::lock;

/// Set to any value to allocate a fresh buffer for every batch (the escape hatch when a
/// consumer wants to rule buffer reuse out).
pub const NO_BUFFER_REUSE_ENV: &str = "INSITUBATCH_NO_BUFFER_REUSE";

/// Free buffers kept per pool at most; more than this many batches alive at once means the
/// consumer retains batches, and their buffers are then simply freed on return.
const MAX_FREE: usize = 64;

struct Shared {
    free: Mutex<Vec<AlignedBuf>>,
    reuse: bool,
    allocated: std::sync::atomic::AtomicU64,
}

/// A reuse pool of page-aligned batch buffers. Cloning shares it.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<Shared>,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("allocated", &self.allocated())
            .field("free", &lock(&self.shared.free).len())
            .finish()
    }
}

impl BufferPool {
    /// A pool; reuse is off when `INSITUBATCH_NO_BUFFER_REUSE` is set.
    pub fn new() -> Self {
        Self::with_reuse(std::env::var_os(NO_BUFFER_REUSE_ENV).is_none())
    }

    /// A pool with reuse on or off.
    pub fn with_reuse(reuse: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                free: Mutex::new(Vec::new()),
                reuse,
                allocated: 0.into(),
            }),
        }
    }

    /// Buffers allocated so far (a steady-state loop stops growing this).
    pub fn allocated(&self) -> u64 {
        self.shared
            .allocated
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A buffer of exactly `len` initialised bytes (contents unspecified: the caller overwrites
    /// what it hands out), or `None` when the allocator refuses `len` bytes.
    pub fn take(&self, len: usize) -> Option<PooledBuf> {
        let reused = if self.shared.reuse {
            let mut free = lock(&self.shared.free);
            // Best fit among buffers no more than twice the size, so a small batch does not
            // pin a huge buffer.
            let most = len.max(1).saturating_mul(2).saturating_add(4096);
            free.iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len && b.capacity() <= most)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
                .map(|i| free.swap_remove(i))
        } else {
            None
        };
        let mut buf = match reused {
            Some(buf) => buf,
            None => {
                let buf = AlignedBuf::try_with_capacity(len)?;
                self.shared
                    .allocated
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                buf
            }
        };
        buf.set_len(len);
        Some(PooledBuf {
            buf: Some(buf),
            home: Arc::downgrade(&self.shared),
        })
    }
}

/// A batch buffer on loan from a [`BufferPool`]; it goes back when dropped.
pub struct PooledBuf {
    buf: Option<AlignedBuf>,
    home: Weak<Shared>,
}

impl std::fmt::Debug for PooledBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuf({} bytes)", self.len())
    }
}

impl PooledBuf {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_ref().expect("present until drop").as_slice()
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let b = self.buf.as_mut().expect("present until drop");
        let len = b.as_slice().len();
        &mut b.as_mut_capacity()[..len]
    }

    /// Shortens the buffer to `len` bytes (the short final batch is a prefix).
    pub fn truncate(&mut self, len: usize) {
        let b = self.buf.as_mut().expect("present until drop");
        if len < b.as_slice().len() {
            b.set_len(len);
        }
    }

    /// The start of the buffer (page aligned), for DLPack export.
    pub fn as_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }
}

// SAFETY: the bytes are the heap allocation of the `AlignedBuf` inside, which does not move
// with the value and stays allocated until drop; `len()` bytes are initialised.
#[allow(unsafe_code)]
unsafe impl insitubatch_runtime::IoBuf for PooledBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        if let Some(home) = self.home.upgrade()
            && home.reuse
        {
            let mut free = lock(&home.free);
            if free.len() < MAX_FREE {
                free.push(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_when_dropped_and_a_retained_one_is_not_reused() {
        let pool = BufferPool::with_reuse(true);
        let mut a = pool.take(1000).unwrap();
        a.as_mut_slice().fill(7);
        let a_ptr = a.as_ptr();
        drop(a);
        let b = pool.take(900).unwrap();
        assert_eq!(b.as_ptr(), a_ptr, "the dropped buffer is reused");
        assert_eq!(b.len(), 900);
        // `b` is retained: the next take must not alias it.
        let c = pool.take(900).unwrap();
        assert_ne!(c.as_ptr(), b.as_ptr());
        assert_eq!(pool.allocated(), 2);
        let off = BufferPool::with_reuse(false);
        drop(off.take(10).unwrap());
        drop(off.take(10).unwrap());
        assert_eq!(off.allocated(), 2);
    }

    #[test]
    fn a_size_the_allocator_refuses_is_none_not_an_abort() {
        let pool = BufferPool::with_reuse(true);
        assert!(pool.take(usize::MAX).is_none(), "not representable");
        assert!(pool.take(1 << 62).is_none(), "refused by the allocator");
        assert_eq!(pool.allocated(), 0);
        assert_eq!(pool.take(64).unwrap().len(), 64, "the pool still works");
    }
}
