//! The memory a pass holds at its peak, counted from its plan before anything is read: the
//! figure the check at a pass's start compares with the process's limit, and the one a user
//! sizes a job's memory by (a SLURM `--mem`, a container's limit).

use super::{MemoryLimit, ReadPlan};

/// The memory one pass holds at its peak, by what sizes each part. [`MemoryNeed::total`] is
/// what the pass is checked against when it starts; the parts say which knob moves it.
///
/// Two passes at once (train and val zipped) share the pool and the read buffers: the second
/// adds its working set, its batches and its share of the overhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Decoded chunks pinned at once: the read-ahead bound, which `block_chunks` and the
    /// arrays' chunk sizes set.
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
    /// the consumer holds, at most the epoch's.
    pub batches: u64,
    /// Read buffers: one per read in flight (`max_inflight`) or being decoded, each up to a
    /// stored chunk's decoded size.
    pub reads: u64,
    /// The library's own memory (thread stacks, decoder contexts: 16 MiB) and its allocator's
    /// slack (an eighth of everything above: huge-page rounding, freed memory not yet
    /// returned, which a cgroup cannot reclaim).
    pub overhead: u64,
}

impl MemoryNeed {
    /// The need of a pass over `plan` yielding `n_rows` rows: `reads` bytes of read buffers,
    /// and the pool's heap `cache` (the fixed budget and the most it may hold) when that is
    /// above the working set.
    pub fn new(
        plan: &ReadPlan,
        batch_size: usize,
        prefetch_depth: usize,
        n_rows: usize,
        reads: u64,
        cache: Option<(u64, u64)>,
    ) -> Self {
        let rows = batch_size.min(n_rows) as u64;
        let batch_bytes = plan.labels.iter().fold(0u64, |acc, l| {
            acc.saturating_add(l.sample_bytes.saturating_mul(rows))
        });
        let batches = (prefetch_depth as u64)
            .saturating_add(2)
            .min(plan.n_batches as u64);
        let cache = cache.filter(|&(_, held)| held > plan.read_ahead_bytes);
        let mut need = Self {
            working_set: plan.read_ahead_bytes,
            pool: cache.map_or(plan.read_ahead_bytes, |(_, held)| held),
            cache_budget: cache.map(|(budget, _)| budget),
            batch_bytes,
            batches,
            reads,
            overhead: 0,
        };
        need.overhead = library_overhead(need.sized(need.pool));
        need
    }

    /// Everything: what the pass's start checks against the process's memory limit.
    pub fn total(&self) -> u64 {
        self.with_pool(self.pool)
    }

    /// True when the total fits in `limit` (or nothing limits it): the pass's start would not
    /// refuse it.
    pub fn fits(&self, limit: Option<MemoryLimit>) -> bool {
        limit.is_none_or(|l| self.total() <= l.bytes)
    }

    /// The total if the pool held only the working set (no budget above it).
    pub fn without_cache(&self) -> u64 {
        self.with_pool(self.working_set)
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

    fn with_pool(&self, pool: u64) -> u64 {
        let sized = self.sized(pool);
        sized.saturating_add(library_overhead(sized))
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
            "{} bytes: working set {}, pool {}, {} batches of {}, reads {}, overhead {}",
            self.total(),
            self.working_set,
            self.pool,
            self.batches,
            self.batch_bytes,
            self.reads,
            self.overhead
        )
    }
}
