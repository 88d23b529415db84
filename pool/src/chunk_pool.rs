//! The chunk pool: one byte budget over resident slots, pin/unpin, LRU eviction of the unpinned.
//!
//! A pass pins a slot from the first block that reads it until the last; an unpinned slot stays
//! resident (a later hit) until a miss needs its bytes. Each concurrent iteration is an
//! [`Owner`] that reserves its working set when it starts, so a second iteration the budget
//! cannot hold fails at once instead of starving later.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use insitubatch_runtime::sync::Notify;

use crate::disk::{DiskTier, Revive};
use crate::lock;
use crate::slot::{FileRange, Phase, Slot, SlotData, SlotKey};

/// How many bytes the pool may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    /// The working set of the first iteration (grown if a later iteration needs more while no
    /// other reserves anything): read-once per epoch, no more memory than that.
    Auto,
    /// A fixed byte budget (`cache_budget_bytes`). Above the working set, drained chunks
    /// linger and later epochs hit them.
    Bytes(u64),
}

/// Pool errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// An iteration's working set does not fit next to the ones already running.
    #[error(
        "the chunk pool's budget of {budget_bytes} bytes cannot hold iteration `{owner}`: it needs \
         {needed_bytes} bytes (its working set), and {others}; set cache_budget_bytes to at least \
         {suggest_bytes}"
    )]
    BudgetTooSmall {
        /// The iteration that could not start.
        owner: String,
        /// Its working set.
        needed_bytes: u64,
        /// The pool's budget.
        budget_bytes: u64,
        /// Reserved by running iterations.
        reserved_bytes: u64,
        /// Who holds the reserved bytes, as a clause of the message.
        others: String,
        /// A budget that would hold them all.
        suggest_bytes: u64,
    },
    /// A cached chunk's file could not be opened for want of descriptors (the message names
    /// the file and what to lower or raise); its entry stays in the cache.
    #[error("{0}")]
    CacheFile(String),
    /// `readonly_cache`: the chunk is not in the cache, and a readonly reader may not fetch it.
    #[error(
        "readonly_cache: {key} is not in the cache at {dir}; warm the cache for this split and \
         these variables first (insitubatch warm ... --cache-dir {dir}), or drop readonly_cache"
    )]
    ReadonlyMiss {
        /// The chunk.
        key: String,
        /// The cache directory.
        dir: String,
    },
    /// Admitting a chunk needs the room of evicted slots whose files are still on disk, being
    /// written or unlinked (an ephemeral spill counts such a file against the budget until it
    /// is gone): retry once [`ChunkPool::room_returned`] notifies. The planner waits so; nothing
    /// else sees it.
    #[error(
        "internal error: admitting {key} ({nbytes} bytes) must wait for {writing_bytes} bytes of \
         evicted slots' cache files being written or unlinked"
    )]
    WaitForWrites {
        /// The chunk.
        key: String,
        /// Its size.
        nbytes: u64,
        /// Bytes of evicted slots whose files are being written or unlinked.
        writing_bytes: u64,
    },
    /// Admitting a chunk for an iteration started as another's successor
    /// ([`ChunkPool::register_successor`]) needs room its predecessor still pins: retry once
    /// [`ChunkPool::room_returned`] notifies (the predecessor's consumer takes its last batches,
    /// or it is dropped). The planner waits so; nothing else sees it.
    #[error(
        "internal error: admitting {key} ({nbytes} bytes) must wait for iteration \
         `{predecessor}` to release {pinned_bytes} pinned bytes"
    )]
    WaitForRoom {
        /// The chunk.
        key: String,
        /// Its size.
        nbytes: u64,
        /// The iteration whose room this one was started to take over.
        predecessor: String,
        /// Bytes it still pins.
        pinned_bytes: u64,
    },
    /// Admitting a chunk would exceed the budget with nothing left to evict. The read-ahead
    /// permits make this unreachable; seeing it is a bug in insitubatch.
    #[error(
        "internal error: admitting {key} ({nbytes} bytes) would exceed the chunk pool's budget of \
         {budget_bytes} bytes with {pinned_bytes} bytes pinned and nothing evictable"
    )]
    OverBudget {
        /// The chunk.
        key: String,
        /// Its size.
        nbytes: u64,
        /// Budget.
        budget_bytes: u64,
        /// Pinned bytes at the time.
        pinned_bytes: u64,
    },
}

/// What [`Owner::admit`] found.
#[derive(Debug)]
pub enum Admission {
    /// Resident and ready: no fetch, no decode. Now pinned for this owner.
    Hit(Arc<Slot>),
    /// This owner is already loading it; wait on it. Pinned once more.
    InFlight(Arc<Slot>),
    /// Not resident: a new loading slot, pinned; the caller must fill or fail it.
    Miss(Arc<Slot>),
}

/// Cumulative pool counters (a pass's own hit/miss counts are on its [`Owner`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Budget in bytes (0 while an automatic budget has not been sized yet).
    pub budget_bytes: u64,
    /// Bytes held by slots now.
    pub resident_bytes: u64,
    /// Highest `resident_bytes` ever.
    pub peak_resident_bytes: u64,
    /// Bytes reserved by running iterations.
    pub reserved_bytes: u64,
    /// Slots resident now.
    pub resident_slots: u64,
    /// Slots pinned by some iteration now.
    pub pinned_slots: u64,
    /// Unpinned slots dropped to admit a miss.
    pub evictions: u64,
    /// Admissions served from residency.
    pub hits: u64,
    /// Admissions that had to load.
    pub misses: u64,
    /// Hits revived from the cache directory (counted in `hits` too).
    pub revived: u64,
}

struct Entry {
    slot: Arc<Slot>,
    pins: u32,
    indexed: bool,
    lru_tick: Option<u64>,
    loader: u64,
}

struct OwnerInfo {
    name: String,
    /// Its share of the budget: the working set it registered with, until it has admitted
    /// everything ([`Owner::admitted_all`]); from then on the bytes it still pins.
    reserved: u64,
    /// It admits nothing more: each unpin returns its bytes' share.
    draining: bool,
    /// The draining iteration whose pinned room it was registered to take over
    /// ([`ChunkPool::register_successor`]); its admissions wait for that room.
    successor_of: Option<u64>,
    pins: HashMap<u64, u32>,
    hits: u64,
    misses: u64,
    peak_resident: u64,
    pinned_bytes: u64,
    peak_pinned: u64,
    revived: u64,
    rejected: u64,
}

struct Inner {
    auto: bool,
    budget: u64,
    entries: HashMap<u64, Entry>,
    index: HashMap<SlotKey, u64>,
    lru: BTreeMap<u64, u64>,
    tick: u64,
    next_slot: u64,
    next_owner: u64,
    owners: HashMap<u64, OwnerInfo>,
    stats: PoolStats,
    /// Slots whose cache file is (or may be about to be) written: id → pending writes.
    writing: HashMap<u64, u32>,
    /// Slots evicted while their file was being written. The write holds their bytes until it
    /// lands, so a chunk admitted again meanwhile is taken from here — a hit — rather than
    /// fetched and decoded a second time (it is not in the log yet). At most one per write in
    /// flight.
    evicted_writing: HashMap<SlotKey, Arc<Slot>>,
    /// Of those, by slot id, the bytes of each whose file an ephemeral spill is writing: on
    /// disk (and on the heap, held by the write) until the write ends and the file goes, so
    /// they count against the budget until then ([`Inner::writing_evicted_bytes`]). Empty
    /// unless the tier unlinks files.
    evicted_in_flight: HashMap<u64, u64>,
    writing_evicted_bytes: u64,
    /// Evicted slots whose cache file may have to go (an ephemeral spill's), recorded under the
    /// lock and handed to the tier by the thread that evicted them once it has released the
    /// lock ([`Inner::take_doomed`]): unlinking a file waits for its directory's lock, and on a
    /// file system mounted with `discard` for the device, which no holder of the pool's lock
    /// may do. The evicting admission hands them to its caller ([`Unlinks`]), which has them
    /// unlinked before it reads the chunk admitted in their room, so a new chunk's file is
    /// never written while a victim's is still there. With each key, the bytes of room held for
    /// its file until it is gone (see [`Inner::evict`]).
    doomed: Vec<(SlotKey, u64)>,
    /// The tier unlinks evicted slots' files (an ephemeral spill): only then does an eviction
    /// record its key in `doomed`, so a pool without one pays nothing per eviction.
    unlinks_files: bool,
}

/// A chunk's cache file looked up ahead of its admission ([`ChunkPool::prepare_revival`]):
/// opened and checked, or found missing or unusable.
pub struct PreparedRevival(Revive);

/// Residency and cache in one byte budget. Share it with `Arc`.
pub struct ChunkPool {
    inner: Mutex<Inner>,
    disk: Option<Arc<DiskTier>>,
    /// Notified as each cache-file write ends, as the file of a slot evicted while it was
    /// written goes ([`PoolError::WaitForWrites`]), and as a draining iteration unpins or goes
    /// ([`PoolError::WaitForRoom`]).
    room_returned: Notify,
}

impl std::fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl ChunkPool {
    /// The budget when it is a fixed number of bytes (`cache_budget_bytes`), not the working
    /// set.
    pub fn fixed_budget(&self) -> Option<u64> {
        let inner = lock(&self.inner);
        (!inner.auto).then_some(inner.budget)
    }

    /// An empty pool on the heap.
    pub fn new(budget: Budget) -> Arc<Self> {
        Self::with_disk(budget, None)
    }

    /// An empty pool whose slots live in `disk`'s files (`cache_dir`): the budget then bounds
    /// the mapped bytes, and a persisted slot evicted from the pool is revived from its file.
    pub fn with_disk(budget: Budget, disk: Option<DiskTier>) -> Arc<Self> {
        let (auto, bytes) = match budget {
            Budget::Auto => (true, 0),
            Budget::Bytes(b) => (false, b),
        };
        Arc::new(Self {
            inner: Mutex::new(Inner {
                auto,
                budget: bytes,
                entries: HashMap::new(),
                index: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                next_slot: 0,
                next_owner: 0,
                owners: HashMap::new(),
                stats: PoolStats {
                    budget_bytes: bytes,
                    ..PoolStats::default()
                },
                writing: HashMap::new(),
                evicted_writing: HashMap::new(),
                evicted_in_flight: HashMap::new(),
                writing_evicted_bytes: 0,
                doomed: Vec::new(),
                unlinks_files: disk.as_ref().is_some_and(|d| !d.persist()),
            }),
            disk: disk.map(Arc::new),
            room_returned: Notify::new(),
        })
    }

    /// `slot`'s cache file is about to be written (call it before the slot becomes ready, so
    /// that no eviction can come first). Until the returned [`PendingWrite`] lands or is dropped
    /// (a failed or abandoned write, or a tile that did not complete the slot), evicting the
    /// slot keeps it aside so that a re-admission takes it from memory.
    pub fn begin_write(self: &Arc<Self>, slot: &Arc<Slot>) -> PendingWrite {
        *lock(&self.inner).writing.entry(slot.id).or_insert(0) += 1;
        PendingWrite {
            pool: Arc::clone(self),
            slot: Arc::clone(slot),
            ended: false,
        }
    }

    /// `slot`'s write ended, with its file `landed` or not. A landed slot moves onto the
    /// mapping now if nothing pins it (else at its last unpin). If the slot was evicted while
    /// its file was being written, an ephemeral file must go, and its room in the budget comes
    /// back only then (what this returns), so spilled files stay bounded by the budget; a
    /// persisted one is in the log now and revives from there.
    fn end_write(
        self: &Arc<Self>,
        slot: &Slot,
        landed: Option<crate::disk::MappedFile>,
    ) -> Unlinks {
        let mut g = lock(&self.inner);
        let left = match g.writing.get_mut(&slot.id) {
            Some(n) => {
                *n -= 1;
                *n
            }
            None => 0,
        };
        if left == 0 {
            g.writing.remove(&slot.id);
            if g.evicted_writing
                .get(slot.key())
                .is_some_and(|s| s.id == slot.id)
            {
                g.evicted_writing.remove(slot.key());
            }
        }
        // An evicted slot's room comes back once its file is gone: at once when the write
        // failed (the tier removed the temporary), after the unlink below when it landed.
        let freed = if left == 0 {
            g.evicted_in_flight.remove(&slot.id)
        } else {
            None
        };
        let Some(mapped) = landed else {
            if let Some(n) = freed {
                g.writing_evicted_bytes -= n;
                drop(g);
                self.room_returned.notify_all();
            }
            return Unlinks::none();
        };
        match g.entries.get(&slot.id) {
            Some(e) => {
                slot.offer_mapping(mapped);
                if e.pins == 0 {
                    slot.settle();
                }
                drop(g);
                self.room_returned.notify_all();
                Unlinks::none()
            }
            None => {
                drop(mapped);
                drop(g);
                // Its room (held while the file was written) comes back once the file is gone.
                let unlinks = self.unlinks(&[(slot.key().clone(), freed.unwrap_or(0))]);
                self.room_returned.notify_all();
                unlinks
            }
        }
    }

    /// The files of evicted slots' keys that must go; call it without the pool's lock. Room
    /// held for a key without a file comes back at once, for one with a file once it is gone.
    fn unlinks(self: &Arc<Self>, doomed: &[(SlotKey, u64)]) -> Unlinks {
        let Some(disk) = self.disk.as_ref().filter(|_| !doomed.is_empty()) else {
            return Unlinks::none();
        };
        let (mut paths, mut held, mut free_now) = (Vec::new(), 0, 0);
        for (key, hold) in doomed {
            match disk.take_spilled(key) {
                Some(path) => {
                    paths.push(path);
                    held += hold;
                }
                None => free_now += hold,
            }
        }
        if free_now > 0 {
            self.release_file_room(free_now);
        }
        Unlinks {
            paths,
            disk: Some(Arc::clone(disk)),
            then_release: (held > 0).then(|| (Arc::clone(self), held)),
        }
    }

    /// Gives back `n` bytes of room held for an evicted slot's file, now gone.
    fn release_file_room(&self, n: u64) {
        if n > 0 {
            lock(&self.inner).writing_evicted_bytes -= n;
        }
        self.room_returned.notify_all();
    }

    /// Notified as room comes back that an admission may wait for: an admission refused with
    /// [`PoolError::WaitForWrites`] (a cache file's write ending) or [`PoolError::WaitForRoom`]
    /// (a predecessor unpinning) reads its generation before trying and waits for a change.
    pub fn room_returned(&self) -> &Notify {
        &self.room_returned
    }

    /// True while some thread holds the pool's lock (tests of what runs outside it).
    #[cfg(test)]
    pub(crate) fn is_locked(&self) -> bool {
        matches!(
            self.inner.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// The NVMe tier, when the pool has a cache directory.
    pub fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref()
    }

    /// Starts an iteration that will pin at most `working_set_bytes` at a time.
    pub fn register_owner(
        self: &Arc<Self>,
        name: &str,
        working_set_bytes: u64,
    ) -> Result<Owner, PoolError> {
        self.register(name, working_set_bytes, None)
    }

    /// [`ChunkPool::register_owner`] for the iteration that follows `predecessor` (train's next
    /// epoch, started while the one before gathers its last batches): if `predecessor` has
    /// admitted everything it reads ([`Owner::admitted_all`]), the room it still pins counts as
    /// this iteration's too, and an admission that needs it waits
    /// ([`PoolError::WaitForRoom`]) until the predecessor's consumer takes the batches that
    /// hold it, or the predecessor is dropped. The pool never holds more than its budget; the
    /// successor loads as fast as its predecessor hands room over. A predecessor that is gone
    /// or still admitting counts as any other iteration.
    pub fn register_successor(
        self: &Arc<Self>,
        name: &str,
        working_set_bytes: u64,
        predecessor: OwnerId,
    ) -> Result<Owner, PoolError> {
        self.register(name, working_set_bytes, Some(predecessor.0))
    }

    fn register(
        self: &Arc<Self>,
        name: &str,
        working_set_bytes: u64,
        predecessor: Option<u64>,
    ) -> Result<Owner, PoolError> {
        let mut g = lock(&self.inner);
        // The automatic budget holds one iteration: the first to reserve anything sizes it
        // (an iteration whose chunks all go to batch rows reserves nothing).
        if g.auto && g.stats.reserved_bytes == 0 && working_set_bytes > g.budget {
            g.budget = working_set_bytes;
            g.stats.budget_bytes = working_set_bytes;
        }
        let successor_of = predecessor.filter(|p| g.owners.get(p).is_some_and(|o| o.draining));
        // A successor takes its predecessor's room over as it is released.
        let handed_over = successor_of.map_or(0, |p| g.owners[&p].reserved);
        let reserved = g.stats.reserved_bytes;
        if reserved - handed_over + working_set_bytes > g.budget {
            let holders: Vec<String> = g
                .owners
                .values()
                .map(|o| format!("{} ({} bytes)", o.name, o.reserved))
                .collect();
            let others = if holders.is_empty() {
                "no other iteration is running".to_string()
            } else {
                format!(
                    "{reserved} bytes are already reserved by {}, held until it ends or is closed \
                     or dropped (an iterator a loop broke out of still holds its share)",
                    holders.join(", ")
                )
            };
            return Err(PoolError::BudgetTooSmall {
                owner: name.to_string(),
                needed_bytes: working_set_bytes,
                budget_bytes: g.budget,
                reserved_bytes: reserved,
                others,
                suggest_bytes: reserved - handed_over + working_set_bytes,
            });
        }
        let id = g.next_owner;
        g.next_owner += 1;
        g.stats.reserved_bytes += working_set_bytes;
        let resident = g.stats.resident_bytes;
        g.owners.insert(
            id,
            OwnerInfo {
                name: name.to_string(),
                reserved: working_set_bytes,
                draining: false,
                successor_of,
                pins: HashMap::new(),
                hits: 0,
                misses: 0,
                peak_resident: resident,
                pinned_bytes: 0,
                peak_pinned: 0,
                revived: 0,
                rejected: 0,
            },
        );
        Ok(Owner {
            pool: Arc::clone(self),
            id,
            name: name.to_string(),
        })
    }

    /// Bytes iteration `owner` pins now; `None` once it is gone.
    pub fn pinned_bytes(&self, owner: OwnerId) -> Option<u64> {
        lock(&self.inner)
            .owners
            .get(&owner.0)
            .map(|o| o.pinned_bytes)
    }

    /// Current counters.
    pub fn stats(&self) -> PoolStats {
        let g = lock(&self.inner);
        let mut s = g.stats;
        s.resident_slots = g.entries.len() as u64;
        s.pinned_slots = g.entries.values().filter(|e| e.pins > 0).count() as u64;
        s
    }

    /// True when the pool revives chunks from a persisted cache directory (one this run fills
    /// or an earlier run left): then looking chunks up ahead of their admission pays.
    pub fn revives_from_files(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| d.persist())
    }

    /// True when admitting `key` now would look its cache file up: the chunk is in the cache
    /// directory's log and not resident.
    pub fn would_look_up(&self, key: &SlotKey) -> bool {
        self.disk.as_ref().is_some_and(|d| d.is_logged(key))
            && !lock(&self.inner).index.contains_key(key)
    }

    /// Looks `key`'s cache file up (opens it, checks its size and header) through the runtime,
    /// so that many lookups can be in flight at once; nothing is counted or changed until the
    /// outcome is handed to [`Owner::admit_prepared`]. Call it on an executor.
    pub async fn prepare_revival(&self, key: &SlotKey, nbytes: u64) -> PreparedRevival {
        PreparedRevival(match &self.disk {
            Some(disk) => disk.probe_async(key, nbytes).await,
            None => Revive::Absent,
        })
    }

    /// Drops every unpinned slot (for tests and for a user who wants the memory back).
    pub fn clear_unpinned(self: &Arc<Self>) {
        let mut g = lock(&self.inner);
        while let Some((_, id)) = g.lru.pop_first() {
            g.evict(id, false);
        }
        let doomed = g.take_doomed();
        drop(g);
        self.unlinks(&doomed).now();
    }
}

/// Cache files of evicted slots that must go before their room is used: an ephemeral spill's
/// ([`Owner::admit_deferring_unlinks`], [`PendingWrite::landed`]). [`Unlinks::run`] unlinks
/// them through the runtime, so the executor thread runs its other tasks while the file system
/// works; what is left when it is dropped is unlinked on the dropping thread. Room the pool held
/// for them comes back when it is dropped, after the last is gone.
#[must_use = "the files must be unlinked before their room is used: `.run().await` or `.now()`"]
pub struct Unlinks {
    disk: Option<Arc<DiskTier>>,
    paths: Vec<std::path::PathBuf>,
    /// The pool and the bytes of room to give back once the files are gone.
    then_release: Option<(Arc<ChunkPool>, u64)>,
}

impl Unlinks {
    fn none() -> Self {
        Self {
            disk: None,
            paths: Vec::new(),
            then_release: None,
        }
    }

    /// Nothing to unlink and no room to give back.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && self.then_release.is_none()
    }

    /// Unlinks the files through the runtime (see [`Unlinks`]).
    pub async fn run(&mut self) {
        if let Some(disk) = self.disk.clone() {
            while let Some(path) = self.paths.last() {
                disk.unlink(path).await;
                self.paths.pop();
            }
        }
    }

    /// Unlinks the files on this thread.
    pub fn now(self) {}
}

impl Drop for Unlinks {
    fn drop(&mut self) {
        if let Some(disk) = &self.disk {
            for path in self.paths.drain(..) {
                disk.unlink_now(&path);
            }
        }
        if let Some((pool, n)) = self.then_release.take() {
            pool.release_file_room(n);
        }
    }
}

impl Inner {
    /// Evicts an unpinned entry and, where the tier unlinks files, records its key in `doomed`
    /// (its cache file may now go); returns the bytes of room held for that file. A slot whose
    /// file is still being written is kept aside until the write ends, its room held until
    /// then. Another's room is free at once, its file to be gone before anything new is
    /// written there (the admission's caller sees to that), unless `hold`: then the room is
    /// held until the file is gone, for an admission whose own file may land any moment.
    fn evict(&mut self, id: u64, hold: bool) -> u64 {
        let Some(slot) = self.take_entry(id) else {
            return 0;
        };
        let mut held = 0;
        if self.writing.contains_key(&id) {
            if self.unlinks_files {
                // Its file is being written: on disk until the write ends and it goes.
                self.evicted_in_flight.insert(id, slot.nbytes());
                self.writing_evicted_bytes += slot.nbytes();
            }
            self.evicted_writing
                .insert(slot.key().clone(), Arc::clone(&slot));
        } else if self.unlinks_files && hold {
            held = slot.nbytes();
            self.writing_evicted_bytes += held;
        }
        if self.unlinks_files {
            self.doomed.push((slot.key().clone(), held));
        }
        held
    }

    /// The keys evicted since the last call, whose files the caller hands to the tier once it
    /// has released the lock ([`ChunkPool::unlinks`]), each with the room held for it.
    fn take_doomed(&mut self) -> Vec<(SlotKey, u64)> {
        std::mem::take(&mut self.doomed)
    }

    /// Drops an entry; returns its key (its cache file, if any, may now go).
    fn remove_entry(&mut self, id: u64) -> Option<SlotKey> {
        self.take_entry(id).map(|slot| slot.key().clone())
    }

    /// Removes an entry from the index, the LRU and the resident bytes; returns its slot.
    fn take_entry(&mut self, id: u64) -> Option<Arc<Slot>> {
        let e = self.entries.remove(&id)?;
        if e.indexed {
            self.index.remove(e.slot.key());
        }
        if let Some(t) = e.lru_tick {
            self.lru.remove(&t);
        }
        self.stats.resident_bytes -= e.slot.nbytes();
        Some(e.slot)
    }

    fn insert(&mut self, id: u64, slot: &Arc<Slot>, indexed: bool, loader: u64, nbytes: u64) {
        self.entries.insert(
            id,
            Entry {
                slot: Arc::clone(slot),
                pins: 0,
                indexed,
                lru_tick: None,
                loader,
            },
        );
        if indexed {
            self.index.insert(slot.key().clone(), id);
        }
        self.stats.resident_bytes += nbytes;
        self.stats.peak_resident_bytes = self
            .stats
            .peak_resident_bytes
            .max(self.stats.resident_bytes);
        let resident = self.stats.resident_bytes;
        let o = self.owners.get_mut(&loader).expect("registered");
        o.peak_resident = o.peak_resident.max(resident);
    }

    fn pin(&mut self, owner: u64, id: u64) -> Arc<Slot> {
        let e = self.entries.get_mut(&id).expect("pinned slot exists");
        e.pins += 1;
        let slot = Arc::clone(&e.slot);
        if let Some(t) = e.lru_tick.take() {
            self.lru.remove(&t);
        }
        let o = self.owners.get_mut(&owner).expect("owner registered");
        let n = o.pins.entry(id).or_insert(0);
        *n += 1;
        if *n == 1 {
            o.pinned_bytes += slot.nbytes();
            o.peak_pinned = o.peak_pinned.max(o.pinned_bytes);
        }
        slot
    }

    /// Releases one of `owner`'s pins on slot `id`; true when that gave a draining owner's
    /// reservation back (room a successor may be waiting for).
    fn unpin(&mut self, owner: u64, id: u64) -> bool {
        let mut returned = false;
        if let Some(o) = self.owners.get_mut(&owner)
            && let Some(n) = o.pins.get_mut(&id)
        {
            *n -= 1;
            if *n == 0 {
                o.pins.remove(&id);
                if let Some(e) = self.entries.get(&id) {
                    let nbytes = e.slot.nbytes();
                    o.pinned_bytes -= nbytes;
                    if o.draining {
                        let share = nbytes.min(o.reserved);
                        o.reserved -= share;
                        self.stats.reserved_bytes -= share;
                        returned = true;
                    }
                }
            }
        } else {
            debug_assert!(false, "unpin of a slot this owner does not hold");
            return false;
        }
        let Some(e) = self.entries.get_mut(&id) else {
            return returned;
        };
        debug_assert!(e.pins > 0);
        e.pins -= 1;
        if e.pins > 0 {
            return returned;
        }
        if e.indexed && e.slot.is_ready() {
            // Unpinned: the slot may move onto its cache file now, and a revived one closes
            // its file until its next hit.
            e.slot.settle();
            e.slot.close_file();
            self.tick += 1;
            e.lru_tick = Some(self.tick);
            self.lru.insert(self.tick, id);
        } else {
            // A failed, abandoned or private slot is not worth keeping. (A private slot's file
            // is the same file as the indexed one's: it stays.)
            self.remove_entry(id);
        }
        returned
    }
}

/// Names a registered iteration for [`ChunkPool::register_successor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerId(u64);

/// One iteration's handle on the pool. Dropping it unpins everything it still holds and
/// returns its reservation.
pub struct Owner {
    pool: Arc<ChunkPool>,
    id: u64,
    name: String,
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owner").field("name", &self.name).finish()
    }
}

/// What an admission under the pool's lock came to.
enum Locked {
    Decided(Result<Admission, PoolError>),
    /// The chunk's cache file must be looked up first (IO, so without the lock).
    NeedsProbe,
    /// A revived slot at rest must have its file mapped again first (IO, so without the lock).
    NeedsReopen,
}

impl Owner {
    /// The pool.
    pub fn pool(&self) -> &Arc<ChunkPool> {
        &self.pool
    }

    /// Pins the slot for `key` if resident, or admits a new loading slot of `nbytes` made of
    /// `tiles` stored chunks, evicting unpinned slots (least recently used first) to make room.
    pub fn admit(&self, key: &SlotKey, nbytes: u64, tiles: u64) -> Result<Admission, PoolError> {
        self.admit_prepared(key, nbytes, tiles, None)
    }

    /// [`Owner::admit`] with the chunk's cache file already looked up by
    /// [`ChunkPool::prepare_revival`] (for the same `key` and `nbytes`). What was prepared is
    /// used only if the chunk is still not resident when the admission is decided.
    pub fn admit_prepared(
        &self,
        key: &SlotKey,
        nbytes: u64,
        tiles: u64,
        prepared: Option<PreparedRevival>,
    ) -> Result<Admission, PoolError> {
        let (admission, unlinks) = self.admit_deferring_unlinks(key, nbytes, tiles, prepared);
        unlinks.now();
        admission
    }

    /// Pins the whole chunk `key` if it is resident (a hit, as [`Owner::pin_resident`] would),
    /// or else admits a loading slot for it that only this admission holds: nobody else finds
    /// it (it is not a hit for any later admission, this owner's included), it is never written
    /// to a cache directory, and it is dropped when it is unpinned. For a slot whose contents
    /// are good only for the pass that loads it (the regions its rows read of each field, not
    /// the whole chunk). Evicts unpinned slots to make room, as [`Owner::admit`] does, and
    /// fails like it.
    pub fn admit_private(
        &self,
        key: &SlotKey,
        nbytes: u64,
        tiles: u64,
    ) -> Result<Admission, PoolError> {
        let mut g = lock(&self.pool.inner);
        if let Some(id) = self.pinnable(&g, key) {
            let slot = g.pin(self.id, id);
            g.stats.hits += 1;
            g.owners.get_mut(&self.id).expect("registered").hits += 1;
            return Ok(Admission::Hit(slot));
        }
        let room = self.make_room(&mut g, key, nbytes, false);
        // The cache files of the slots evicted for it (an ephemeral spill's) go now.
        let doomed = g.take_doomed();
        let slot = room.map(|()| {
            let id = g.next_slot;
            g.next_slot += 1;
            let slot = Arc::new(Slot::new(id, key.clone(), nbytes, tiles));
            slot.mark_uncacheable();
            g.insert(id, &slot, false, self.id, nbytes);
            g.stats.misses += 1;
            g.owners.get_mut(&self.id).expect("registered").misses += 1;
            g.pin(self.id, id);
            Admission::Miss(slot)
        });
        drop(g);
        self.pool.unlinks(&doomed).now();
        slot
    }

    /// [`Owner::admit_prepared`], leaving the files of the slots it evicted (an ephemeral
    /// spill's) to the caller, who must have them unlinked ([`Unlinks::run`]) before a new
    /// file can land in their room: before it starts the reads of a chunk it admitted.
    pub fn admit_deferring_unlinks(
        &self,
        key: &SlotKey,
        nbytes: u64,
        tiles: u64,
        prepared: Option<PreparedRevival>,
    ) -> (Result<Admission, PoolError>, Unlinks) {
        // File IO must not happen under the pool's lock: a chunk that is not resident may be in
        // the cache directory (looking it up opens and reads its file), and a revived slot at
        // rest maps its file again on a hit. Both are prepared with the lock released (the
        // lookup perhaps long before, by the caller); then the lock is taken again and the
        // admission decided afresh (another admission may have changed the slot meanwhile, in
        // which case what was prepared is simply dropped).
        let mut probe: Option<Revive> = prepared.map(|p| p.0);
        let mut reopened: Option<(u64, Option<SlotData>)> = None;
        let mut doomed = Vec::new();
        loop {
            let g = lock(&self.pool.inner);
            match g.index.get(key).map(|id| (*id, &g.entries[id])) {
                Some((id, e)) if reopened.is_none() && e.pins == 0 && e.slot.is_ready() => {
                    if let Some(closed) = e.slot.closed_range() {
                        drop(g);
                        reopened = Some((id, SlotData::reopen(&closed)));
                        continue;
                    }
                }
                None if probe.is_none() => {
                    if let Some(disk) = &self.pool.disk {
                        drop(g);
                        probe = Some(disk.probe(key, nbytes));
                        continue;
                    }
                }
                _ => {}
            }
            let mut g = g;
            let decided =
                self.admit_locked(&mut g, key, nbytes, tiles, probe.take(), reopened.take());
            doomed.append(&mut g.take_doomed());
            drop(g);
            match decided {
                Locked::Decided(admission) => return (admission, self.pool.unlinks(&doomed)),
                // The slot turned out to be another iteration's load, a failed one, or revived
                // with its file gone since: look the chunk's cache file up with the lock
                // released, then decide afresh.
                Locked::NeedsProbe => {
                    if let Some(disk) = &self.pool.disk {
                        probe = Some(disk.probe(key, nbytes));
                    }
                }
                // The loop's first look prepares it.
                Locked::NeedsReopen => {}
            }
        }
    }

    fn admit_locked(
        &self,
        g: &mut Inner,
        key: &SlotKey,
        nbytes: u64,
        tiles: u64,
        probe: Option<Revive>,
        reopened: Option<(u64, Option<SlotData>)>,
    ) -> Locked {
        let mut shadowed = false;
        if let Some(&id) = g.index.get(key) {
            let e = &g.entries[&id];
            let (phase, pins, loader) = (e.slot.phase(), e.pins, e.loader);
            if phase == Phase::Ready {
                // A revived slot at rest reopens its file (a pinned one has it open), with what
                // `admit` prepared for this very slot; if it prepared nothing for it (the slot
                // came to rest since), that is done first, without the lock.
                let opened = reopened.and_then(|(rid, data)| (rid == id).then_some(data));
                if pins == 0 && opened.is_none() && e.slot.is_closed() {
                    return Locked::NeedsReopen;
                }
                if pins > 0 || e.slot.reopen_file(opened.flatten()) {
                    let slot = g.pin(self.id, id);
                    g.stats.hits += 1;
                    g.owners.get_mut(&self.id).expect("registered").hits += 1;
                    return Locked::Decided(Ok(Admission::Hit(slot)));
                }
                // Its file went: forget the slot and admit the chunk afresh below.
                g.remove_entry(id);
                g.owners.get_mut(&self.id).expect("registered").rejected += 1;
            } else if phase == Phase::Loading {
                if loader == self.id {
                    return Locked::Decided(Ok(Admission::InFlight(g.pin(self.id, id))));
                }
                // Another iteration's in-flight load: its tasks may be cancelled with it, so we
                // load our own private copy rather than wait on a delivery that may not come.
                shadowed = true;
            } else {
                // Failed: forget it so this admission (and later ones) load afresh.
                let e = g.entries.get_mut(&id).expect("indexed entry exists");
                e.indexed = false;
                g.index.remove(key);
                if pins == 0 {
                    g.remove_entry(id);
                }
            }
        }
        // Nothing is changed past this point before the chunk's cache file has been looked up.
        let cached = match (&self.pool.disk, probe) {
            (Some(_), None) => return Locked::NeedsProbe,
            (Some(_), Some(Revive::Failed(message))) => {
                return Locked::Decided(Err(PoolError::CacheFile(message)));
            }
            (Some(disk), Some(probe)) => Some((disk, probe)),
            (None, _) => None,
        };
        if !shadowed && let Some(slot) = g.evicted_writing.remove(key) {
            // Evicted while its file was being written, needed again before it landed: its
            // bytes count as resident again instead of as a file in flight.
            let in_flight = g.evicted_in_flight.remove(&slot.id);
            if let Some(n) = in_flight {
                g.writing_evicted_bytes -= n;
            }
            // Its file may land any moment, so the room of slots evicted for it is taken only
            // once their files are gone.
            if let Err(e) = self.make_room(g, key, nbytes, true) {
                if let Some(n) = in_flight {
                    g.evicted_in_flight.insert(slot.id, n);
                    g.writing_evicted_bytes += n;
                }
                g.evicted_writing.insert(key.clone(), slot);
                return Locked::Decided(Err(e));
            }
            g.insert(slot.id, &slot, true, self.id, nbytes);
            g.stats.hits += 1;
            g.owners.get_mut(&self.id).expect("registered").hits += 1;
            let slot = g.pin(self.id, slot.id);
            return Locked::Decided(Ok(Admission::Hit(slot)));
        }
        if let Err(e) = self.make_room(g, key, nbytes, false) {
            return Locked::Decided(Err(e));
        }
        let id = g.next_slot;
        g.next_slot += 1;
        if let Some((disk, probe)) = cached {
            disk.settle_revival(key, &probe);
            match probe {
                Revive::File(cached) => {
                    let range = FileRange {
                        file: cached.file,
                        offset: cached.offset,
                        len: cached.len,
                    };
                    let slot = Arc::new(Slot::new_ready(id, key.clone(), SlotData::File(range)));
                    g.insert(id, &slot, !shadowed, self.id, nbytes);
                    g.stats.hits += 1;
                    g.stats.revived += 1;
                    let o = g.owners.get_mut(&self.id).expect("registered");
                    o.hits += 1;
                    o.revived += 1;
                    g.pin(self.id, id);
                    return Locked::Decided(Ok(Admission::Hit(slot)));
                }
                Revive::Rejected => {
                    g.owners.get_mut(&self.id).expect("registered").rejected += 1;
                }
                Revive::Absent | Revive::Failed(_) => {}
            }
            if disk.readonly() {
                return Locked::Decided(Err(PoolError::ReadonlyMiss {
                    key: key.to_string(),
                    dir: disk.dir().display().to_string(),
                }));
            }
        }
        let slot = Arc::new(Slot::new(id, key.clone(), nbytes, tiles));
        g.insert(id, &slot, !shadowed, self.id, nbytes);
        g.stats.misses += 1;
        g.owners.get_mut(&self.id).expect("registered").misses += 1;
        g.pin(self.id, id);
        Locked::Decided(Ok(Admission::Miss(slot)))
    }

    /// Evicts unpinned slots, least recently used first, until `nbytes` more fit the budget
    /// beside the files being written for slots evicted before. With `hold`, the victims' room
    /// is held until their files are gone ([`Inner::evict`]): it stops evicting once that room
    /// would do, and the admission waits for it.
    fn make_room(
        &self,
        g: &mut Inner,
        key: &SlotKey,
        nbytes: u64,
        hold: bool,
    ) -> Result<(), PoolError> {
        let mut coming = 0;
        while g.stats.resident_bytes + g.writing_evicted_bytes + nbytes > g.budget {
            // Room this call holds for its victims' files will do once they are gone.
            let enough_coming =
                g.stats.resident_bytes + g.writing_evicted_bytes - coming + nbytes <= g.budget;
            let next = if enough_coming {
                None
            } else {
                g.lru.pop_first()
            };
            let Some((_, victim)) = next else {
                if let Some((predecessor, pinned_bytes)) = self.predecessor_pins(g) {
                    return Err(PoolError::WaitForRoom {
                        key: key.to_string(),
                        nbytes,
                        predecessor,
                        pinned_bytes,
                    });
                }
                if g.writing_evicted_bytes > 0 {
                    return Err(PoolError::WaitForWrites {
                        key: key.to_string(),
                        nbytes,
                        writing_bytes: g.writing_evicted_bytes,
                    });
                }
                let pinned = g
                    .entries
                    .values()
                    .filter(|e| e.pins > 0)
                    .map(|e| e.slot.nbytes())
                    .sum();
                return Err(PoolError::OverBudget {
                    key: key.to_string(),
                    nbytes,
                    budget_bytes: g.budget,
                    pinned_bytes: pinned,
                });
            };
            if let Some(e) = g.entries.get_mut(&victim) {
                e.lru_tick = None;
            }
            coming += g.evict(victim, hold);
            g.stats.evictions += 1;
        }
        Ok(())
    }

    /// The predecessor this iteration was registered to succeed and the bytes it still pins,
    /// while it pins any: the room this iteration's admissions may wait for.
    fn predecessor_pins(&self, g: &Inner) -> Option<(String, u64)> {
        let p = g.owners[&self.id].successor_of?;
        let o = g.owners.get(&p)?;
        (o.pinned_bytes > 0).then(|| (o.name.clone(), o.pinned_bytes))
    }

    /// This iteration's handle for [`ChunkPool::register_successor`].
    pub fn id(&self) -> OwnerId {
        OwnerId(self.id)
    }

    /// This iteration admits nothing more (it has loaded every chunk it reads, and only
    /// gathers from what it pins): its reservation shrinks to the bytes it pins, and each
    /// unpin from now on gives its share back, to a successor waiting for it
    /// ([`ChunkPool::register_successor`]) or to any iteration registered later. Admitting
    /// after this is a bug in the caller.
    pub fn admitted_all(&self) {
        let mut g = lock(&self.pool.inner);
        let o = g.owners.get_mut(&self.id).expect("registered");
        let returned = o.reserved.saturating_sub(o.pinned_bytes);
        o.draining = true;
        o.reserved -= returned;
        g.stats.reserved_bytes -= returned;
        drop(g);
        self.pool.room_returned.notify_all();
    }

    /// Pins the slot for `key` if it is ready in memory (a hit); otherwise counts a miss and
    /// admits nothing. For a chunk its caller decodes somewhere the pool never sees (straight
    /// into a batch row): a slot loading for another iteration is not waited on, and a chunk
    /// decoded that way is never resident for a later admission. A slot this iteration's
    /// reservation has no room left for is a miss too: pinning it would take evictable bytes
    /// the other iterations' admissions count on.
    pub fn pin_resident(&self, key: &SlotKey) -> Option<Arc<Slot>> {
        let mut g = lock(&self.pool.inner);
        let Some(id) = self.pinnable(&g, key) else {
            g.stats.misses += 1;
            g.owners.get_mut(&self.id).expect("registered").misses += 1;
            return None;
        };
        let slot = g.pin(self.id, id);
        g.stats.hits += 1;
        g.owners.get_mut(&self.id).expect("registered").hits += 1;
        Some(slot)
    }

    /// The resident slot of `key` this iteration may pin without a load: ready, its file (if
    /// revived) open, and within this iteration's reservation unless it pins it already.
    fn pinnable(&self, g: &Inner, key: &SlotKey) -> Option<u64> {
        let owner = &g.owners[&self.id];
        g.index.get(key).copied().filter(|id| {
            let slot = &g.entries[id].slot;
            slot.phase() == Phase::Ready
                && !slot.is_closed()
                && (owner.pins.contains_key(id)
                    || owner.pinned_bytes + slot.nbytes() <= owner.reserved)
        })
    }

    /// Releases one pin on `slot`. At zero pins a ready slot becomes evictable; anything else
    /// (failed, abandoned mid-load) is dropped.
    pub fn unpin(&self, slot: &Slot) {
        let returned = lock(&self.pool.inner).unpin(self.id, slot.id);
        if returned {
            self.pool.room_returned.notify_all();
        }
    }

    /// Hits this iteration revived from the cache directory, and log entries it consulted and
    /// rejected (file missing or damaged).
    pub fn revived_rejected(&self) -> (u64, u64) {
        let g = lock(&self.pool.inner);
        let o = &g.owners[&self.id];
        (o.revived, o.rejected)
    }

    /// (hits, misses) this iteration has seen.
    pub fn hits_misses(&self) -> (u64, u64) {
        let g = lock(&self.pool.inner);
        let o = &g.owners[&self.id];
        (o.hits, o.misses)
    }

    /// Highest pool residency seen while this iteration admitted chunks.
    pub fn peak_resident_bytes(&self) -> u64 {
        lock(&self.pool.inner).owners[&self.id].peak_resident
    }

    /// Most bytes this iteration had pinned at once (bounded by its read-ahead permits).
    pub fn peak_pinned_bytes(&self) -> u64 {
        lock(&self.pool.inner).owners[&self.id].peak_pinned
    }

    /// Slots this iteration has pinned now.
    pub fn pinned_slots(&self) -> usize {
        lock(&self.pool.inner).owners[&self.id].pins.len()
    }
}

/// A slot's cache file being written ([`ChunkPool::begin_write`]). [`PendingWrite::landed`]
/// hands the pool the written file; dropping it instead says the write failed or never ran.
pub struct PendingWrite {
    pool: Arc<ChunkPool>,
    slot: Arc<Slot>,
    ended: bool,
}

impl PendingWrite {
    /// The slot being written.
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// The file landed: the slot may move onto its mapping. If the slot was evicted meanwhile,
    /// an ephemeral file must go, and the room it holds comes back once it has: what this
    /// returns.
    pub fn landed(mut self, mapped: crate::disk::MappedFile) -> Unlinks {
        self.ended = true;
        self.pool.end_write(&self.slot, Some(mapped))
    }

    /// The write, unless it is no longer worth starting: in an ephemeral spill, a slot evicted
    /// while its write waited for its turn would land a file only for it to be unlinked. Then
    /// the write is given up (counted in [`crate::DiskStats::writes_skipped`]) and the room the
    /// slot kept in the budget comes back at once. A persisted slot is always written: its file
    /// is the cache.
    pub fn unless_evicted(self) -> Option<Self> {
        let evicted = {
            let g = lock(&self.pool.inner);
            g.unlinks_files && !g.entries.contains_key(&self.slot.id)
        };
        if !evicted {
            return Some(self);
        }
        if let Some(d) = &self.pool.disk {
            d.write_skipped();
        }
        None
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.ended {
            self.pool.end_write(&self.slot, None).now();
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let mut g = lock(&self.pool.inner);
        let pins: Vec<(u64, u32)> = g.owners[&self.id]
            .pins
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        for (id, n) in pins {
            for _ in 0..n {
                g.unpin(self.id, id);
            }
        }
        if let Some(o) = g.owners.remove(&self.id) {
            g.stats.reserved_bytes -= o.reserved;
        }
        drop(g);
        // A successor may be waiting for this iteration's room.
        self.pool.room_returned.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: u64) -> SlotKey {
        SlotKey::new("v", c)
    }

    fn fill(a: Admission) -> Arc<Slot> {
        match a {
            Admission::Miss(s) => {
                s.adopt(vec![0; s.nbytes() as usize]).unwrap();
                s
            }
            other => panic!("expected a miss, got {other:?}"),
        }
    }

    #[test]
    fn a_slot_completing_during_its_readmission_is_never_taken_for_failed() {
        // The planner may admit a chunk again (a later block's span) while a decoder completes
        // it on another thread. Whatever the interleaving, that admission is in flight or a
        // hit, never a second load. A filler thread completes each slot after a varying spin,
        // released together with the admission, to land in every part of its window.
        use std::sync::atomic::{AtomicU64, Ordering};
        const ROUNDS: u64 = 10_000;
        let pool = ChunkPool::new(Budget::Bytes(1 << 30));
        let o = pool.register_owner("a", 1 << 30).unwrap();
        let go = Arc::new(AtomicU64::new(u64::MAX));
        let (tx, rx) = std::sync::mpsc::sync_channel::<Arc<Slot>>(1);
        let filler = {
            let go = Arc::clone(&go);
            std::thread::spawn(move || {
                for (round, s) in rx.into_iter().enumerate() {
                    while go.load(Ordering::Acquire) != round as u64 {
                        std::thread::yield_now();
                    }
                    for _ in 0..(round * 7919) % 400 {
                        std::hint::spin_loop();
                    }
                    s.adopt(vec![1; 8]).unwrap();
                }
            })
        };
        for c in 0..ROUNDS {
            let Admission::Miss(s) = o.admit(&key(c), 8, 1).unwrap() else {
                panic!("chunk {c} is new")
            };
            tx.send(Arc::clone(&s)).unwrap();
            go.store(c, Ordering::Release);
            match o.admit(&key(c), 8, 1).unwrap() {
                Admission::Hit(a) | Admission::InFlight(a) => {
                    assert!(Arc::ptr_eq(&a, &s));
                    o.unpin(&a);
                }
                Admission::Miss(_) => panic!("chunk {c} loaded twice: taken for failed"),
            }
            while !s.is_ready() {
                std::thread::yield_now();
            }
            o.unpin(&s);
        }
        drop(tx);
        filler.join().unwrap();
        assert_eq!(pool.stats().misses, ROUNDS);
    }

    #[test]
    fn a_private_slot_is_nobody_elses_hit_and_goes_when_unpinned() {
        let pool = ChunkPool::new(Budget::Bytes(20));
        let o = pool.register_owner("a", 20).unwrap();
        // A whole chunk at rest, then a private slot of another chunk.
        let whole = fill(o.admit(&key(0), 10, 1).unwrap());
        o.unpin(&whole);
        let Admission::Miss(private) = o.admit_private(&key(1), 10, 1).unwrap() else {
            panic!("chunk 1 is not resident")
        };
        assert!(
            !private.is_cacheable(),
            "never written to a cache directory"
        );
        // The same key admitted again is a load of its own, not the private slot: the budget
        // has room for it only by evicting the whole chunk 0 at rest.
        let again = o.admit(&key(1), 10, 1).unwrap();
        let Admission::Miss(again) = again else {
            panic!("a private slot must not be a hit: {again:?}")
        };
        assert!(!Arc::ptr_eq(&again, &private));
        assert_eq!(pool.stats().evictions, 1, "chunk 0 made room");
        assert_eq!(pool.stats().misses, 3);
        // A private slot over the budget with nothing to evict is refused, naming the chunk.
        let over = o.admit_private(&key(2), 10, 1).unwrap_err();
        assert!(over.to_string().contains("v[chunk 2]"), "{over}");
        private.adopt(vec![7; 10]).unwrap();
        o.unpin(&private);
        assert_eq!(pool.stats().resident_bytes, 10, "dropped when unpinned");
        again.adopt(vec![1; 10]).unwrap();
        o.unpin(&again);
        // The indexed load stays at rest, a hit, for a private admission too.
        let Admission::Hit(hit) = o.admit_private(&key(1), 10, 1).unwrap() else {
            panic!("the whole chunk 1 is resident")
        };
        assert!(Arc::ptr_eq(&hit, &again));
        assert_eq!((pool.stats().hits, pool.stats().misses), (1, 3));
    }

    #[test]
    fn a_slot_evicted_while_its_file_is_written_is_readmitted_from_memory() {
        let pool = ChunkPool::new(Budget::Bytes(10));
        let o = pool.register_owner("a", 10).unwrap();
        let s0 = o.admit(&key(0), 10, 1).unwrap();
        let Admission::Miss(s0) = s0 else {
            panic!("a cold pool misses")
        };
        s0.adopt((0..10).collect()).unwrap();
        let write = pool.begin_write(&s0);
        o.unpin(&s0);
        let s1 = fill(o.admit(&key(1), 10, 1).unwrap());
        assert_eq!(pool.stats().evictions, 1, "chunk 0 made room for chunk 1");
        o.unpin(&s1);
        // Needed again before its file landed: the same bytes, no second fetch.
        match o.admit(&key(0), 10, 1).unwrap() {
            Admission::Hit(s) => {
                assert!(Arc::ptr_eq(&s, &s0));
                assert_eq!(
                    s.bytes().unwrap().memory().unwrap(),
                    &(0..10).collect::<Vec<u8>>()[..]
                );
                o.unpin(&s);
            }
            other => panic!("expected a hit from the pending write, got {other:?}"),
        }
        assert_eq!(pool.stats().resident_bytes, 10);
        // Evicted again, and this time the write fails: the bytes are gone, so a miss.
        let s1 = fill(o.admit(&key(1), 10, 1).unwrap());
        o.unpin(&s1);
        drop(write);
        assert!(matches!(
            o.admit(&key(0), 10, 1).unwrap(),
            Admission::Miss(_)
        ));
        let st = pool.stats();
        assert_eq!((st.hits, st.misses), (1, 4));
    }

    #[test]
    fn pin_resident_pins_no_more_than_the_iteration_reserved() {
        let pool = ChunkPool::new(Budget::Bytes(30));
        let a = pool.register_owner("a", 20).unwrap();
        let s0 = fill(a.admit(&key(0), 10, 1).unwrap());
        let s1 = fill(a.admit(&key(1), 10, 1).unwrap());
        a.unpin(&s0);
        a.unpin(&s1);
        drop(a);
        // An iteration that reserved 10 bytes may pin one resident chunk, not two: the second
        // would hold bytes `c`'s admissions need.
        let b = pool.register_owner("b", 10).unwrap();
        let _c = pool.register_owner("c", 20).unwrap();
        let hit = b.pin_resident(&key(0)).expect("within the reservation");
        assert!(b.pin_resident(&key(1)).is_none(), "beyond it: a miss");
        assert!(
            b.pin_resident(&key(0)).is_some(),
            "a slot it holds already costs nothing"
        );
        assert_eq!(b.hits_misses(), (2, 1));
        assert!(
            pool.register_owner("d", 1).is_err(),
            "the budget is reserved in full"
        );
        assert!(
            pool.register_owner("rows only", 0).is_ok(),
            "an iteration that pins nothing starts beside them"
        );
        b.unpin(&hit);
        b.unpin(&hit);
        // Beside an iteration that reserves nothing, the automatic budget is sized by the next.
        let auto = ChunkPool::new(Budget::Auto);
        let _rows = auto.register_owner("rows", 0).unwrap();
        let _pooled = auto.register_owner("pooled", 20).unwrap();
        assert_eq!(auto.stats().budget_bytes, 20);
        assert!(
            auto.register_owner("third", 1).is_err(),
            "one iteration's worth"
        );
    }

    #[test]
    fn pin_resident_pins_a_ready_slot_and_counts_anything_else_a_miss_admitting_nothing() {
        let pool = ChunkPool::new(Budget::Bytes(30));
        let o = pool.register_owner("a", 30).unwrap();
        let ready = fill(o.admit(&key(0), 10, 1).unwrap());
        let Admission::Miss(loading) = o.admit(&key(1), 10, 1).unwrap() else {
            panic!("fresh chunk")
        };
        o.unpin(&ready);
        let hit = o.pin_resident(&key(0)).expect("ready in memory");
        assert!(Arc::ptr_eq(&hit, &ready));
        assert!(o.pin_resident(&key(1)).is_none(), "still loading");
        assert!(o.pin_resident(&key(2)).is_none(), "never admitted");
        assert_eq!(o.hits_misses(), (1, 4));
        let st = pool.stats();
        assert_eq!((st.resident_bytes, st.pinned_slots), (20, 2));
        o.unpin(&hit);
        o.unpin(&loading);
    }

    #[test]
    fn lru_evicts_oldest_unpinned_and_never_a_pinned_slot() {
        let pool = ChunkPool::new(Budget::Bytes(30));
        let o = pool.register_owner("a", 30).unwrap();
        let s0 = fill(o.admit(&key(0), 10, 1).unwrap());
        let s1 = fill(o.admit(&key(1), 10, 1).unwrap());
        let s2 = fill(o.admit(&key(2), 10, 1).unwrap());
        o.unpin(&s1);
        o.unpin(&s0);
        // s1 was unpinned first, so it is the LRU victim.
        let s3 = fill(o.admit(&key(3), 10, 1).unwrap());
        assert!(matches!(
            o.admit(&key(0), 10, 1).unwrap(),
            Admission::Hit(_)
        ));
        let st = pool.stats();
        assert_eq!((st.evictions, st.resident_bytes), (1, 30));
        // Everything is pinned now (s0 re-pinned by the hit): no room, an internal error.
        assert!(matches!(
            o.admit(&key(9), 10, 1),
            Err(PoolError::OverBudget { .. })
        ));
        drop((s2, s3));
        drop(o);
        assert_eq!(pool.stats().pinned_slots, 0);
        assert_eq!(pool.stats().reserved_bytes, 0);
        assert!(pool.stats().peak_resident_bytes <= 30);
    }

    #[test]
    fn second_owner_that_does_not_fit_fails_at_start_with_the_budget_it_needs() {
        let pool = ChunkPool::new(Budget::Auto);
        let a = pool.register_owner("train", 100).unwrap();
        assert_eq!(pool.stats().budget_bytes, 100);
        let err = pool.register_owner("val", 40).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("`val`") && msg.contains("at least 140"),
            "{msg}"
        );
        // It names the holder and says how its share comes back.
        assert!(
            msg.contains("reserved by train") && msg.contains("closed or dropped"),
            "{msg}"
        );
        drop(a);
        // Alone, a bigger pass grows an automatic budget.
        let _b = pool.register_owner("val", 120).unwrap();
        assert_eq!(pool.stats().budget_bytes, 120);
        let fixed = ChunkPool::new(Budget::Bytes(50));
        assert!(fixed.register_owner("train", 60).is_err());
    }

    #[test]
    fn a_successor_takes_its_draining_predecessors_room_over_as_it_is_unpinned() {
        // The automatic budget holds one working set (30 bytes): the predecessor pins all of
        // it, has admitted everything, and its consumer has not taken the batches that hold it.
        let pool = ChunkPool::new(Budget::Auto);
        let a = pool.register_owner("train#0", 30).unwrap();
        let held: Vec<_> = (0..3)
            .map(|c| fill(a.admit(&key(c), 10, 1).unwrap()))
            .collect();
        // Still admitting: a successor is any other iteration, and does not fit.
        assert!(matches!(
            pool.register_successor("train#1", 30, a.id()),
            Err(PoolError::BudgetTooSmall { .. })
        ));
        a.admitted_all();
        assert_eq!(pool.stats().reserved_bytes, 30, "shrunk to what it pins");
        let b = pool.register_successor("train#1", 30, a.id()).unwrap();
        // A chunk the predecessor pins is a hit, and costs no room.
        let Admission::Hit(shared) = b.admit(&key(2), 10, 1).unwrap() else {
            panic!("pinned by the predecessor: resident")
        };
        // A new chunk waits for the predecessor's room, naming it.
        let seen = pool.room_returned().generation();
        match b.admit(&key(7), 10, 1) {
            Err(PoolError::WaitForRoom {
                predecessor,
                pinned_bytes,
                ..
            }) => assert_eq!((predecessor.as_str(), pinned_bytes), ("train#0", 30)),
            other => panic!("expected to wait for room, got {other:?}"),
        }
        // Its consumer takes the batch that held chunk 0: the room comes back, announced.
        a.unpin(&held[0]);
        assert_ne!(pool.room_returned().generation(), seen);
        assert_eq!(pool.pinned_bytes(a.id()), Some(20));
        let s7 = fill(b.admit(&key(7), 10, 1).unwrap());
        assert!(matches!(
            b.admit(&key(8), 10, 1),
            Err(PoolError::WaitForRoom { .. })
        ));
        // Unpinning a chunk the successor also pins gives back a share, not room.
        a.unpin(&held[2]);
        assert!(matches!(
            b.admit(&key(8), 10, 1),
            Err(PoolError::WaitForRoom { .. })
        ));
        // The predecessor goes: the rest of its room is the successor's.
        drop(a);
        let s8 = fill(b.admit(&key(8), 10, 1).unwrap());
        let st = pool.stats();
        assert_eq!((st.budget_bytes, st.reserved_bytes), (30, 30), "{st:?}");
        assert!(
            st.peak_resident_bytes <= 30,
            "never above the budget: {st:?}"
        );
        // With nothing left to wait for, no room is an internal error again.
        assert!(matches!(
            b.admit(&key(9), 10, 1),
            Err(PoolError::OverBudget { .. })
        ));
        for s in [&shared, &s7, &s8] {
            b.unpin(s);
        }
    }

    #[test]
    fn a_draining_iterations_returned_room_serves_any_iteration_registered_later() {
        let pool = ChunkPool::new(Budget::Bytes(40));
        let a = pool.register_owner("train", 40).unwrap();
        let s0 = fill(a.admit(&key(0), 10, 1).unwrap());
        let s1 = fill(a.admit(&key(1), 10, 1).unwrap());
        assert!(pool.register_owner("val", 20).is_err());
        // Done admitting with 20 bytes pinned: the other 20 are free for anyone.
        a.admitted_all();
        assert_eq!(pool.stats().reserved_bytes, 20);
        let v = pool.register_owner("val", 20).unwrap();
        assert!(pool.register_owner("test", 10).is_err());
        a.unpin(&s0);
        let t = pool.register_owner("test", 10).unwrap();
        // Not a successor: it never waits on train's room, it was counted in full.
        let _t0 = fill(t.admit(&key(5), 10, 1).unwrap());
        let _v0 = fill(v.admit(&key(6), 10, 1).unwrap());
        let _v1 = fill(v.admit(&key(7), 10, 1).unwrap());
        assert!(pool.stats().resident_bytes <= 40);
        a.unpin(&s1);
        assert_eq!(pool.stats().reserved_bytes, 30, "train holds nothing");
        drop(a);
        assert_eq!(pool.stats().reserved_bytes, 30);
    }

    #[test]
    fn another_owners_in_flight_slot_is_loaded_privately_and_failed_slots_reload() {
        let pool = ChunkPool::new(Budget::Bytes(100));
        let a = pool.register_owner("a", 50).unwrap();
        let b = pool.register_owner("b", 50).unwrap();
        let Admission::Miss(sa) = a.admit(&key(0), 10, 1).unwrap() else {
            panic!()
        };
        assert!(matches!(
            a.admit(&key(0), 10, 1).unwrap(),
            Admission::InFlight(_)
        ));
        let Admission::Miss(sb) = b.admit(&key(0), 10, 1).unwrap() else {
            panic!("b must not wait on a's load")
        };
        assert!(!Arc::ptr_eq(&sa, &sb));
        sa.fail(crate::SlotFailure {
            cancelled: true,
            message: "gone".into(),
        });
        drop(a); // unpins both of a's pins; the failed slot is dropped
        sb.adopt(vec![1; 10]).unwrap();
        b.unpin(&sb);
        // b's private copy is not indexed, so key 0 is a miss again, loaded afresh.
        assert!(matches!(
            b.admit(&key(0), 10, 1).unwrap(),
            Admission::Miss(_)
        ));
        drop(b);
        let st = pool.stats();
        assert_eq!(
            (st.pinned_slots, st.resident_slots, st.resident_bytes),
            (0, 0, 0)
        );
    }
}
