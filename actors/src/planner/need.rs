//! The memory a pass holds at its peak, counted from its plan before anything is read: the
//! figure the check at a pass's start compares with the process's limit, and the one a user
//! sizes a job's memory by (a SLURM `--mem`, a container's limit). A process has one limit
//! however many passes it runs, so the passes running at a pass's start are counted beside it
//! ([`RunningPasses`]).

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, Ordering};

use super::{MemoryLimit, ReadPlan};

/// The memory one pass holds at its peak, by what sizes each part. [`MemoryNeed::total`] is
/// what the pass is checked against when it starts; the parts say which knob moves it.
///
/// Two passes at once (train and val zipped) share the pool and the read buffers: the second
/// adds its working set, its batches and its share of the overhead, and a pass of another
/// dataset adds all it holds. [`MemoryNeed::others`] counts what the passes already running
/// hold beside this one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Decoded chunks pinned in the pool at once: the read-ahead bound, which `block_chunks`
    /// and the arrays' chunk sizes set, over the chunks the pool loads (a chunk decoded
    /// straight into batch rows is counted in `batches` instead).
    pub working_set: u64,
    /// Decoded chunks the pool may keep on the heap: the working set, or a fixed
    /// `cache_budget_bytes` above it (at most every chunk of the arrays read). Slots in cache
    /// files (`cache_dir`) live in the page cache and are not counted.
    pub pool: u64,
    /// That budget, when it is what makes `pool` larger than the working set.
    pub cache_budget: Option<u64>,
    /// One batch of every label: `batch_size` rows (at most the epoch's) of each sample.
    pub batch_bytes: u64,
    /// Batches in memory at once: `prefetch_depth` in the channel, one being filled and one
    /// the consumer holds, and `rows_batches` more, at most the epoch's.
    pub batches: u64,
    /// Of `batches`, those taken ahead of the gather by chunks decoded straight into batch
    /// rows: the one the planner has started at one sample per chunk; with more, a shuffle
    /// block's batches and the one straddling the next.
    pub rows_batches: u64,
    /// Read buffers: one per read in flight (`max_inflight`) or being decoded, each up to a
    /// stored chunk's decoded size (of a shard read in parts, what the parts touch); with a
    /// `cache_dir`, also the slot files being written (each holds its slot's bytes and an
    /// aligned copy).
    pub reads: u64,
    /// What the passes running in this process when the need was counted hold beside this
    /// one: a pass of the same dataset its batches, and whatever the working sets together
    /// need of the shared pool beyond this pass's `pool`; a pass of another dataset its pool,
    /// batches and reads.
    pub others: u64,
    /// How many passes `others` counts.
    pub other_passes: usize,
    /// What the need is checked against: the lower of the process's limit (the machine's, its
    /// cgroup's, `ulimit -v`) and the dataset's `memory_limit_bytes`.
    pub limit: Option<MemoryLimit>,
}

impl MemoryNeed {
    /// The need of a pass over `plan` yielding `n_rows` rows: `working_set` bytes pinned in
    /// the pool at once, `reads` bytes of read buffers, and the pool's heap `cache` (the fixed
    /// budget and the most it may hold) when that is above the working set.
    pub fn new(
        plan: &ReadPlan,
        batch_size: usize,
        prefetch_depth: usize,
        n_rows: usize,
        working_set: u64,
        reads: u64,
        cache: Option<(u64, u64)>,
    ) -> Self {
        let rows = batch_size.min(n_rows) as u64;
        let batch_bytes = plan.labels.iter().fold(0u64, |acc, l| {
            acc.saturating_add(l.row_bytes.saturating_mul(rows))
        });
        let batches = (prefetch_depth as u64)
            .saturating_add(2)
            .min(plan.n_batches as u64);
        let cache = cache.filter(|&(_, held)| held > working_set);
        Self {
            working_set,
            pool: cache.map_or(working_set, |(_, held)| held),
            cache_budget: cache.map(|(budget, _)| budget),
            batch_bytes,
            batches,
            rows_batches: 0,
            reads,
            others: 0,
            other_passes: 0,
            limit: None,
        }
    }

    /// The library's own memory (thread stacks, decoder contexts: 16 MiB) and its allocator's
    /// slack (an eighth of everything else, `others` included: huge-page rounding, freed
    /// memory not yet returned, which a cgroup cannot reclaim).
    pub fn overhead(&self) -> u64 {
        library_overhead(self.sized(self.pool).saturating_add(self.others))
    }

    /// Everything, the passes already running included: what the pass's start checks against
    /// the process's memory limit.
    pub fn total(&self) -> u64 {
        self.figure(self.pool, self.others)
    }

    /// The pass on its own, as if no other pass ran.
    pub fn alone(&self) -> u64 {
        self.figure(self.pool, 0)
    }

    /// True when the total fits in the limit (or nothing limits it): the pass's start would
    /// not refuse it.
    pub fn fits(&self) -> bool {
        self.limit.is_none_or(|l| self.total() <= l.bytes)
    }

    /// The pass on its own if the pool held only the working set (no budget above it).
    pub fn without_cache(&self) -> u64 {
        self.figure(self.working_set, 0)
    }

    /// The batches' bytes: `batches` × `batch_bytes`.
    pub fn batches_bytes(&self) -> u64 {
        self.batch_bytes.saturating_mul(self.batches)
    }

    /// What the knobs size, with `pool` bytes of decoded chunks.
    fn sized(&self, pool: u64) -> u64 {
        pool.saturating_add(self.batches_bytes())
            .saturating_add(self.reads)
    }

    /// `pool` bytes of decoded chunks, the batches, the reads and `others`, with the overhead
    /// on all of it.
    fn figure(&self, pool: u64, others: u64) -> u64 {
        let sized = self.sized(pool).saturating_add(others);
        sized.saturating_add(library_overhead(sized))
    }

    /// This need with what the passes running now hold beside it counted in `others`. Passes
    /// of one dataset share its pool, holding the largest of their pool figures or all their
    /// working sets together (the pool admits no more owners than its budget holds), and its
    /// read buffers; each holds its own batches. A pass that takes over the pool room of the
    /// running pass `takes_over` as it is released (train's next epoch started early) holds
    /// the larger of the two working sets, not both.
    fn beside(mut self, running: &[Running], pool: usize, takes_over: Option<u64>) -> Self {
        #[derive(Default)]
        struct OnePool {
            pool: u64,
            working_sets: u64,
            reads: u64,
            batches: u64,
        }
        let mut by_pool: Vec<(usize, OnePool)> = Vec::new();
        // The predecessor's working set counts once, as this pass's when the larger.
        let predecessor = running
            .iter()
            .find(|r| Some(r.id) == takes_over && r.pool == pool);
        let own_working_set = predecessor.map_or(self.working_set, |r| {
            self.working_set.max(r.need.working_set)
        });
        let entries = running.iter().map(|r| {
            let shared = predecessor.is_some_and(|p| p.id == r.id);
            (r.pool, &r.need, if shared { 0 } else { r.need.working_set })
        });
        for (at, need, working_set) in entries.chain([(pool, &self, own_working_set)]) {
            let i = match by_pool.iter().position(|(p, _)| *p == at) {
                Some(i) => i,
                None => {
                    by_pool.push((at, OnePool::default()));
                    by_pool.len() - 1
                }
            };
            let g = &mut by_pool[i].1;
            g.pool = g.pool.max(need.pool);
            g.working_sets = g.working_sets.saturating_add(working_set);
            g.reads = g.reads.max(need.reads);
            g.batches = g.batches.saturating_add(need.batches_bytes());
        }
        let all = by_pool.iter().fold(0u64, |acc, (_, g)| {
            acc.saturating_add(g.pool.max(g.working_sets))
                .saturating_add(g.reads)
                .saturating_add(g.batches)
        });
        self.others = all.saturating_sub(self.sized(self.pool));
        self.other_passes = running.len();
        self
    }
}

/// One pass running in this process: its pool (by address, stable while the pass holds it),
/// its name for messages, and its need on its own.
struct Running {
    id: u64,
    pool: usize,
    name: String,
    need: MemoryNeed,
}

/// The passes running in a process.
struct Registry {
    /// The process they run in: a child made by `fork` inherits its parent's list, whose
    /// passes do not run in the child.
    pid: u32,
    /// The next entry's id (kept across a fork, so an inherited entry's id is never reused).
    next: u64,
    list: Vec<Running>,
}

/// The passes running in this process, so a pass's start counts what they hold beside its own
/// need: a training script that zips train and val, or runs two datasets, has one memory limit.
struct Shared(UnsafeCell<Registry>);

// SAFETY: the registry is only reached through `Locked`, which holds `HOLDER`.
unsafe impl Sync for Shared {}

static REGISTRY: Shared = Shared(UnsafeCell::new(Registry {
    pid: 0,
    next: 0,
    list: Vec::new(),
}));

/// The registry's lock: the id of the process whose thread holds it, 0 when free. A `std`
/// mutex held by another thread at a `fork` stays locked in the child for good (that thread
/// does not exist there), and the child's first pass would wait forever. Here the child sees
/// its parent's id in the word and takes the lock over.
static HOLDER: AtomicU32 = AtomicU32::new(0);

/// The registry, locked.
struct Locked(PhantomData<*mut Registry>);

impl Locked {
    fn new() -> Self {
        let me = std::process::id();
        loop {
            match HOLDER.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                // Held by a thread of the process this one was forked from: nobody will free it.
                Err(held) if held != 0 && held != me => {
                    if HOLDER
                        .compare_exchange(held, me, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
                // Held by another thread here, for a few list operations.
                Err(_) => std::thread::yield_now(),
            }
        }
        let mut locked = Self(PhantomData);
        if locked.pid != me {
            // First use in this process, or in a child of a fork: start an empty list. An
            // inherited one may be half-updated (a parent thread held the lock), so it is
            // leaked, not dropped.
            let inherited = std::mem::replace(
                &mut *locked,
                Registry {
                    pid: me,
                    next: 0,
                    list: Vec::new(),
                },
            );
            locked.next = inherited.next;
            std::mem::forget(inherited);
        }
        locked
    }
}

impl std::ops::Deref for Locked {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        // SAFETY: this thread holds `HOLDER`, so no other reference to the registry exists.
        unsafe { &*REGISTRY.0.get() }
    }
}

impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Registry {
        // SAFETY: as in `deref`.
        unsafe { &mut *REGISTRY.0.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        HOLDER.store(0, Ordering::Release);
    }
}

/// The passes running in this process, and a pass's place among them.
pub struct RunningPasses;

impl RunningPasses {
    /// `need` of a pass on the pool at address `pool`, with the passes running now counted in
    /// [`MemoryNeed::others`].
    pub fn count_beside(need: MemoryNeed, pool: usize) -> MemoryNeed {
        need.beside(&Locked::new().list, pool, None)
    }

    /// Counts the running passes into `need` and, when `admit` accepts the result (given the
    /// running passes' names), enters the pass among them: one step under one lock, so two
    /// passes that start at once each count the other. A pass that takes over the pool room of
    /// the running pass `takes_over` ([`RunningPass::id`]) as it is released counts the larger
    /// of their working sets, not both. The pass leaves when the returned entry drops.
    pub fn enter<E>(
        need: MemoryNeed,
        pool: usize,
        name: &str,
        takes_over: Option<u64>,
        admit: impl FnOnce(&MemoryNeed, &[&str]) -> Result<(), E>,
    ) -> Result<RunningPass, E> {
        let mut registry = Locked::new();
        let counted = need.beside(&registry.list, pool, takes_over);
        let names: Vec<&str> = registry.list.iter().map(|r| r.name.as_str()).collect();
        admit(&counted, &names)?;
        let id = registry.next;
        registry.next += 1;
        registry.list.push(Running {
            id,
            pool,
            name: name.to_string(),
            need,
        });
        Ok(RunningPass { id })
    }

    /// Test hook: runs `f` with the list locked (to fork while another thread holds it).
    #[doc(hidden)]
    pub fn while_locked<T>(f: impl FnOnce() -> T) -> T {
        let _locked = Locked::new();
        f()
    }
}

/// A pass's entry among the running ones: dropped with the pass, when it no longer holds
/// anything.
#[derive(Debug)]
pub struct RunningPass {
    id: u64,
}

impl RunningPass {
    /// Its entry's number, for [`RunningPasses::enter`]'s `takes_over`.
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for RunningPass {
    fn drop(&mut self) {
        Locked::new().list.retain(|r| r.id != self.id);
    }
}

/// Memory a pass needs that no knob sizes: the library's thread stacks and decoder contexts (a
/// pass over a tiny store peaks at ~22 MiB of RSS in the CLI, the binary's pages included),
/// plus an eighth of what the knobs size, for the allocator's slack. Under a cgroup limit 16 MiB
/// alone left a pass that peaked ~10 % above its sized memory killed in one run of three.
fn library_overhead(sized: u64) -> u64 {
    (16u64 << 20).saturating_add(sized / 8)
}

impl std::fmt::Display for MemoryNeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes: working set {}, pool {}, {} batches of {} ({} for rows decoded in place), \
             reads {}, ",
            self.total(),
            self.working_set,
            self.pool,
            self.batches,
            self.batch_bytes,
            self.rows_batches,
            self.reads,
        )?;
        if self.other_passes > 0 {
            write!(
                f,
                "{} other passes running {}, ",
                self.other_passes, self.others
            )?;
        }
        write!(f, "overhead {}", self.overhead())
    }
}
