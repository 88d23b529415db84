//! # insitubatch-pool
//!
//! The [`ChunkPool`] is residency and cache in one object: a byte budget over decoded
//! sample-axis chunks ([`Slot`]s), each pinned while a pass still needs it and LRU-evictable
//! once unpinned, so a budget at the working set is the read-once buffer and a larger one is a
//! cross-epoch cache. Every concurrent iteration is an [`Owner`] with its own reservation.
//!
//! [`BufferPool`] recycles batch buffers: a buffer comes back when the consumer drops the batch
//! that holds it, so steady state allocates nothing.
//!
//! ```
//! use insitubatch_pool::{Admission, Budget, ChunkPool, SlotKey};
//! let pool = ChunkPool::new(Budget::Auto);
//! let owner = pool.register_owner("train", 64).unwrap();
//! let key = SlotKey::new("t2m", 0);
//! let Admission::Miss(slot) = owner.admit(&key, 32, 1).unwrap() else { unreachable!() };
//! slot.adopt(vec![1u8; 32]).unwrap();
//! assert_eq!(slot.bytes().unwrap().memory().unwrap()[0], 1);
//! owner.unpin(&slot);
//! // Unpinned but resident: the next pass over the same chunk is a hit.
//! assert!(matches!(owner.admit(&key, 32, 1).unwrap(), Admission::Hit(_)));
//! ```

// Unsafe code is confined to `disk` (mmap, flock, statfs), each block with its reason.
#![deny(unsafe_code)]

mod batch_buffer;
mod chunk_pool;
pub mod disk;
mod recycler;
mod slot;

/// Locks a mutex, recovering from poisoning: every critical section in this crate moves values
/// in and out or updates counters in single statements (a slot's tile copy runs under its lock,
/// and a panic there leaves the slot Loading, which its loader's drop guard then fails), so a
/// poisoned lock still guards consistent state.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub use batch_buffer::{BufferPool, NO_BUFFER_REUSE_ENV, PooledBuf};
pub use chunk_pool::{
    Admission, Budget, ChunkPool, Owner, OwnerId, PendingWrite, PoolError, PoolStats,
    PreparedRevival, Unlinks,
};
pub use disk::{ArrayMeta, CacheConfig, CacheError, CachedFile, DiskStats, DiskTier};
pub use recycler::{Issuing, Recycler};
pub use slot::{ClosedRange, FileRange, Phase, Slot, SlotBytes, SlotData, SlotFailure, SlotKey};
