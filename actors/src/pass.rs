//! One pass (an epoch over one split): the state its actors share, how it starts, how it ends.
//!
//! ```text
//! planner ──TileJob──► fetcher workers ──(page-cache hit: decoded on the spot)──► slot (pool)
//!    │                       └──(the read waited: DecodeJob)──► decoder[i] ──┘
//!    │ read-ahead permits (bytes)    max_inflight permit rides along, dropped after delivery
//!    └── slot table ◄──────────────────────────────── gather ──Batch──► prefetch channel
//! ```
//!
//! Failure is one path: whoever sees an error calls `PassShared::fail`, which records the
//! first error, closes the read-ahead semaphore, fails every slot still loading for this pass
//! and wakes the gather, which reports the error to the consumer. Dropping the consumer's
//! iterator fails the pass with `Cancelled` and joins every actor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use insitubatch_pool::{BufferPool, ChunkPool, Owner, OwnerId, Recycler, Slot, SlotFailure};
use insitubatch_runtime::sync::{Notify, Permit, Semaphore};
use insitubatch_runtime::{Handle, JoinHandle, TaskError};
use insitubatch_store::{ArrayGeometry, Store, ZarrArray};

use crate::assembly::{Assemblies, DirectRows, PassInputs};
use crate::batch::Batch;
use crate::error::EngineError;
use crate::planner::{
    EpochOrder, MemoryNeed, OrderSpec, PlanSlot, Reach, ReadPlan, RunningPass, RunningPasses,
    Shard, Stride, epoch_order, read_ahead_bound, read_plan,
};
use crate::region_slot::RegionSlots;
use crate::stats::{BadChunk, Counters, PassStats};
use crate::tile::TileLayout;
use crate::transform::Pipeline;
use crate::variable::Variable;
use crate::{decoder, fetcher, gather, planner};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Pass state is plain data updated in single statements; a panicking actor is reported
    // through `fail`, and the rest of the pass may still read what it left.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What to do with a stored chunk that cannot be read or decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnBadChunk {
    /// Fail the pass with an error naming the array, key and file (the default).
    #[default]
    Raise,
    /// Fill the tile with NaN (float dtypes) or the array's fill value, record it in
    /// `bad_chunks`, and go on.
    Nan,
}

impl std::str::FromStr for OnBadChunk {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "raise" => Ok(Self::Raise),
            "nan" => Ok(Self::Nan),
            other => Err(EngineError::arg(
                "on_bad_chunk",
                other,
                "use \"raise\" or \"nan\"",
            )),
        }
    }
}

/// What every pass of one dataset shares: the runtime, the store, the pool, the one
/// `max_inflight` budget and the batch buffers.
pub struct EngineContext<S: Store> {
    /// Runtime handle (the dataset owns the runtime).
    pub runtime: Handle,
    /// The store.
    pub store: Arc<S>,
    /// Opened arrays by path.
    pub arrays: HashMap<String, ZarrArray>,
    /// Each array's chunk transforms by path (an array not here has none).
    pub transforms: HashMap<String, Pipeline>,
    /// The chunk pool.
    pub pool: Arc<ChunkPool>,
    /// In-flight stored-chunk reads, across every pass.
    pub inflight: Semaphore,
    /// Batch buffers.
    pub buffers: BufferPool,
    /// Read buffers for encoded stored chunks (size it to `max_inflight`).
    pub read_buffers: Recycler,
    /// The memory a pass may count on: the lower of the process's limit and the dataset's
    /// `memory_limit_bytes`.
    pub memory_limit: Option<crate::planner::MemoryLimit>,
}

/// Overrides the default of [`IntoRows`] for datasets that do not set it: `auto`, `always` or
/// `never` (the Python shim and C programs choose it this way).
pub const DECODE_INTO_BATCHES_ENV: &str = "INSITUBATCH_DECODE_INTO_BATCHES";

/// When a chunk is decoded straight into its samples' batch rows rather than into a pool slot
/// the gather copies from (see `docs/architecture.md`, "Decoding into batch rows"). Never with a
/// cache directory or chunk transforms, whose slots are the point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IntoRows {
    /// When the pool's budget holds at most a quarter of the chunks the pass reads (the
    /// default): the few chunks such a budget keeps for a later epoch save less than decoding
    /// into rows does.
    #[default]
    Auto,
    /// Even when the budget could keep chunks for a later epoch: for a single pass (inference,
    /// scoring) no later epoch reads again.
    Always,
    /// Never: every chunk through the pool (to compare; the batches are the same).
    Never,
}

impl std::str::FromStr for IntoRows {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<Self, EngineError> {
        match s {
            "auto" => Ok(Self::Auto),
            "always" => Ok(Self::Always),
            "never" => Ok(Self::Never),
            other => Err(EngineError::arg(
                "decode_into_batches",
                other,
                "use \"auto\", \"always\" or \"never\"",
            )),
        }
    }
}

/// Settings of one pass.
#[derive(Clone, Debug)]
pub struct PassConfig {
    /// Split name (for errors and stats).
    pub split: String,
    /// Epoch (keys the order with the seed).
    pub epoch: u64,
    /// Seed.
    pub seed: u64,
    /// Shuffle chunks and blocks.
    pub shuffle: bool,
    /// Chunks per shuffle block.
    pub block_chunks: usize,
    /// Ramp a shuffled epoch's blocks up from the chunks of one batch (see
    /// [`PassConfig::first_block_chunks`]).
    pub fast_first_batch: bool,
    /// Rows per batch.
    pub batch_size: usize,
    /// Batches the gather may run ahead of the consumer.
    pub prefetch_depth: usize,
    /// Bad-chunk policy.
    pub on_bad_chunk: OnBadChunk,
    /// Hold each chunk only over each run of adjacent blocks that reads it and re-admit it
    /// for the next (the windowed + shuffled + persist rule; see [`crate::read_plan`]).
    pub release_each_block: bool,
    /// Emit at most this many rows (the ranks of a sharded train split, evened out).
    pub row_limit: Option<u64>,
    /// Resume the epoch here: the batches before it are neither delivered nor read for (a
    /// chunk only they draw from is not read). The batches from it on are those of a whole
    /// pass.
    pub start_batch: u64,
    /// When chunks are decoded straight into batch rows.
    pub decode_into_batches: IntoRows,
    /// The samples drawn ([`Stride::ALL`]: every one).
    pub stride: Stride,
    /// Test hook: the decoder panics on this tile ordinal (`None` in real use).
    #[doc(hidden)]
    pub panic_on_tile: Option<u64>,
}

impl PassConfig {
    /// The chunks of a pass's first shuffle block. With `fast_first_batch` on a shuffled pass,
    /// the fewest that hold one batch (`⌈batch_size / samples_per_chunk⌉`, at most
    /// `block_chunks`), so the first batch waits for those alone; each next block doubles until
    /// blocks are full. Otherwise `block_chunks`: every block full.
    pub fn first_block_chunks(&self, samples_per_chunk: u64, per_anchor: u64) -> usize {
        if !(self.fast_first_batch && self.shuffle) {
            return self.block_chunks;
        }
        // A chunk yields a row per sample on the stride (per patch): at least one (chunks with
        // none are left out of the order), `samples_per_chunk / every` of them when the stride
        // is finer.
        let rows_per_chunk = (samples_per_chunk / self.stride.every)
            .max(1)
            .saturating_mul(per_anchor);
        let one_batch = (self.batch_size as u64).div_ceil(rows_per_chunk);
        usize::try_from(one_batch)
            .unwrap_or(usize::MAX)
            .clamp(1, self.block_chunks)
    }
}

pub(crate) enum SlotEntry {
    Pending,
    Admitted(Arc<Slot>, Permit),
    /// Decoded straight into its batch row (`PassShared::direct`), holding its read-ahead
    /// permit like a slot would.
    Direct(Permit),
    Released,
}

/// State shared by the actors of one pass.
pub(crate) struct PassShared {
    pub config: PassConfig,
    pub order: EpochOrder,
    pub plan: ReadPlan,
    pub layouts: Vec<TileLayout>,
    pub arrays: Vec<ZarrArray>,
    /// Each path's chunk transforms, indexed like `arrays`.
    pub pipelines: Vec<Pipeline>,
    pub owner: Owner,
    pub readahead: Semaphore,
    pub slots: Mutex<Vec<SlotEntry>>,
    pub notify: Notify,
    cancelled: AtomicBool,
    /// Notified once, when the pass stops (for tasks that wait on something else meanwhile).
    stop: Notify,
    error: Mutex<Option<EngineError>>,
    pub counters: Counters,
    /// The plan slots decoded straight into batch rows, and the batches being filled so.
    pub direct: DirectRows,
    /// The plan slots loaded with only what the pass's patches read (`crate::region_slot`).
    pub region_slots: RegionSlots,
    pub assemblies: Assemblies,
    pub bad_chunks: Mutex<Vec<BadChunk>>,
    /// Slot files being written to the cache directory (joined when the pass stops).
    pub cache_writes: Mutex<Vec<JoinHandle<()>>>,
    /// Chunk loads not finished, plus one the planner holds until it has issued its last:
    /// zero once every chunk the pass reads is loaded.
    loads_pending: AtomicU64,
    /// What runs then ([`Pass::when_loaded`]).
    after_loads: Mutex<AfterLoads>,
}

/// A hook to run once a pass has loaded every chunk it reads, or the news that it has.
enum AfterLoads {
    Nothing,
    Run(Box<dyn FnOnce() + Send>),
    Loaded,
}

impl PassShared {
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    pub fn error(&self) -> Option<EngineError> {
        lock(&self.error).clone()
    }

    /// Completes once the pass has stopped (failed or cancelled).
    pub async fn stopped(&self) {
        loop {
            let generation = self.stop.generation();
            if self.is_cancelled() {
                return;
            }
            self.stop.changed_since(generation).await;
        }
    }

    /// Completes when `wait` does or the pass stops, whichever comes first: a wait on something
    /// outside the pass (a file system, another iteration) never outlasts its stop.
    pub(crate) async fn until_stopped(&self, wait: impl Future<Output = ()>) {
        let (mut wait, mut stopped) = (std::pin::pin!(wait), std::pin::pin!(self.stopped()));
        std::future::poll_fn(|cx| match wait.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(()),
            std::task::Poll::Pending => stopped.as_mut().poll(cx),
        })
        .await;
    }

    /// Stops the pass with `err` (the first error wins) and wakes everyone who waits.
    pub fn fail(&self, err: EngineError) {
        {
            let mut e = lock(&self.error);
            if e.is_none() {
                *e = Some(err);
            }
        }
        self.cancelled.store(true, Ordering::SeqCst);
        self.readahead.close();
        let loading: Vec<Arc<Slot>> = lock(&self.slots)
            .iter()
            .filter_map(|e| match e {
                SlotEntry::Admitted(s, _) if s.is_loading() => Some(Arc::clone(s)),
                _ => None,
            })
            .collect();
        for s in loading {
            s.fail(self.cancel_failure());
        }
        self.notify.notify_all();
        self.stop.notify_all();
    }

    /// A load begins: the planner is about to send a chunk's job.
    pub(crate) fn load_started(&self) {
        self.loads_pending.fetch_add(1, Ordering::AcqRel);
    }

    /// A load ended (its job dropped, delivered or not), or the planner issued its last one
    /// (its own count). The last of these runs the hook a consumer installed, or records that
    /// a hook installed later runs at once. A pass that stops early never gets there: the
    /// planner keeps its count.
    pub(crate) fn load_finished(&self) {
        if self.loads_pending.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // Nothing more is admitted: the pool may hand the room back as the gather unpins.
        self.owner.admitted_all();
        let was = std::mem::replace(&mut *lock(&self.after_loads), AfterLoads::Loaded);
        if let AfterLoads::Run(hook) = was
            && !self.is_cancelled()
        {
            hook();
        }
    }

    pub fn cancel_failure(&self) -> SlotFailure {
        SlotFailure {
            cancelled: true,
            message: "the pass stopped before this chunk was loaded".into(),
        }
    }

    /// Turns a slot failure seen by the gather into the error the consumer gets.
    pub fn slot_error(&self, f: &SlotFailure) -> EngineError {
        self.error().unwrap_or_else(|| {
            if f.cancelled {
                EngineError::Cancelled
            } else {
                EngineError::Runtime(f.message.to_string())
            }
        })
    }
}

/// Marks the pass failed if the actor holding it unwinds.
pub(crate) struct PanicGuard<'a> {
    pub shared: &'a PassShared,
    pub actor: &'static str,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.shared.fail(EngineError::ActorPanicked {
                actor: self.actor.to_string(),
                message: "see the task error for the panic message".into(),
            });
        }
    }
}

type BatchResult = Result<Batch, EngineError>;

/// A pass whose room a successor takes over ([`Pass::start_after`]): its iteration in the
/// chunk pool and its entry among the running passes.
#[derive(Clone, Copy, Debug)]
pub struct Predecessor {
    owner: OwnerId,
    running: u64,
}

impl Predecessor {
    /// Its iteration in the chunk pool.
    pub fn owner(&self) -> OwnerId {
        self.owner
    }
}

/// A running pass: an iterator of batches. Dropping it stops the pass, joins its actors and
/// unpins everything it held.
pub struct Pass {
    rx: Option<flume::Receiver<BatchResult>>,
    shared: Arc<PassShared>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
    last: Instant,
    done: bool,
    stats: PassStats,
    latency: hdrhistogram::Histogram<u64>,
    // This pass among the running ones whose memory a pass's start counts; leaves with it.
    _running: RunningPass,
    // Dropped after the actors are joined: whatever must outlive them (the dataset's runtime).
    keep_alive: Option<Arc<dyn std::any::Any + Send + Sync>>,
    // Runs when the pass is dropped before its last batch ([`Pass::when_abandoned`]).
    on_abandon: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pass")
            .field("split", &self.shared.config.split)
            .field("epoch", &self.shared.config.epoch)
            .finish()
    }
}

/// What an anchor must keep inside each array's sample axis: every variable's reach but those
/// every anchor reads (a static field whole, an indexed variable through its table).
pub fn reaches(variables: &[Variable]) -> Vec<Reach> {
    variables
        .iter()
        .filter(|v| !v.reads_every_anchor())
        .map(Variable::reach)
        .collect()
}

/// The rows each anchor gives: its patches (`crate::patch::Origins`), one without a patch.
/// Every variable carries the same patch over the same field.
pub fn rows_per_anchor(variables: &[Variable]) -> u64 {
    variables.first().map_or(1, Variable::rows_per_anchor)
}

/// The order a pass would draw, without running it (for tests, `shuffle_quality` and tools).
pub fn plan_order(
    chunks: &[u64],
    samples_per_chunk: u64,
    n_samples: u64,
    variables: &[Variable],
    config: &PassConfig,
) -> Result<EpochOrder, EngineError> {
    let reaches = reaches(variables);
    let per_anchor = rows_per_anchor(variables);
    epoch_order(&OrderSpec {
        chunks,
        samples_per_chunk,
        n_samples,
        reaches: &reaches,
        stride: config.stride,
        seed: config.seed,
        epoch: config.epoch,
        shuffle: config.shuffle,
        block_chunks: config.block_chunks,
        first_block_chunks: config.first_block_chunks(samples_per_chunk, per_anchor),
        row_limit: config.row_limit,
        // The dataset's build refuses more patches per sample than a u32 counts.
        per_anchor: u32::try_from(per_anchor).unwrap_or(u32::MAX),
    })
}

/// The rows one epoch of these chunks yields and the anchors it drops, counted without building
/// the order (see [`plan_order`]).
pub fn count_order_rows(
    chunks: &[u64],
    samples_per_chunk: u64,
    n_samples: u64,
    variables: &[Variable],
    stride: Stride,
) -> (u64, u64) {
    let (anchors, dropped) = crate::planner::count_rows(
        chunks,
        samples_per_chunk,
        n_samples,
        &reaches(variables),
        stride,
    );
    (anchors.saturating_mul(rows_per_anchor(variables)), dropped)
}

/// This rank's chunks of `split` and the valid rows of the rank with the fewest (see
/// [`Shard::share`]).
pub fn rank_share(
    split: &[u64],
    shard: Shard,
    samples_per_chunk: u64,
    n_samples: u64,
    variables: &[Variable],
    stride: Stride,
) -> (Vec<u64>, u64) {
    // Every anchor gives as many rows, so the cuts are the anchors'.
    let (share, even) = shard.share(
        split,
        samples_per_chunk,
        n_samples,
        &reaches(variables),
        stride,
    );
    (share, even.saturating_mul(rows_per_anchor(variables)))
}

/// True when `array`'s stored chunks are decoded in parts for a view of geometry `geom`: a
/// cropped view of a sharded array decodes only the inner chunks its region touches (the
/// planner sends each tile's parts, `TileLayout::tile_parts`, with its job).
pub(crate) fn decodes_in_parts(array: &ZarrArray, geom: &ArrayGeometry) -> bool {
    geom.region.is_some() && array.inner_chunk_shape().is_some()
}

/// The most bytes one read of `path` holds: a stored chunk, or for a cropped view of a sharded
/// array (which reads the shard's index and the inner chunks its region touches) twice the
/// largest such part at its decoded size (what its encoded bytes rarely exceed) and the index:
/// the inner chunks as read and the compact shard built from them coexist.
fn read_size(path: &crate::planner::PathInfo, array: Option<&ZarrArray>) -> u64 {
    let g = &path.geom;
    let whole = g.stored_chunk_bytes();
    let Some(array) = array.filter(|a| g.region.is_some() && a.reads_chunk_parts()) else {
        return whole;
    };
    let layout = crate::tile::TileLayout::new(g);
    (0..layout.tiles())
        .map(|t| {
            layout
                .tile_parts(t)
                .and_then(|parts| array.chunk_part_bytes(&parts))
                .map_or(whole, |p| p.saturating_mul(2).min(whole))
        })
        .max()
        .unwrap_or(whole)
}

/// The most bytes one read of `path` holds when a chunk's rows are read as their patches'
/// regions from a shard (`None`: they are not): its index and the inner chunks under the
/// windows of its rows (`draw`'s patches of each of its samples) twice, as read and as the
/// compact shard built from them.
fn region_read_size(
    path: &crate::planner::PathInfo,
    array: &ZarrArray,
    draw: &crate::patch::PatchDraw,
) -> Option<u64> {
    let inner = array
        .inner_chunk_shape()
        .filter(|_| array.reads_chunk_parts())?;
    let rows = path.samples_per_chunk.saturating_mul(draw.per_sample());
    let under = crate::patch::inner_bytes_under_windows(path, inner, &draw.patch, rows);
    let index = array.chunk_part_bytes(&[]).unwrap_or(0);
    Some(under.saturating_mul(2).saturating_add(index))
}

/// The pool's heap beyond the working set and the read buffers of a pass over `plan`, for its
/// [`MemoryNeed`].
fn memory_need<S: Store>(
    ctx: &EngineContext<S>,
    config: &PassConfig,
    plan: &ReadPlan,
    n_rows: usize,
    direct: &DirectRows,
) -> MemoryNeed {
    let stored_chunk = plan
        .paths
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let array = ctx.arrays.get(&*p.path);
            let size = read_size(p, array);
            match (array, &plan.patch) {
                (Some(array), Some(draw)) if direct.reads_region(i) => {
                    region_read_size(p, array, draw).map_or(size, |r| r.min(size))
                }
                _ => size,
            }
        })
        .max()
        .unwrap_or(0);
    let reads = (ctx.read_buffers.max_buffers() as u64).saturating_mul(stored_chunk);
    // A chunk decoded straight into batch rows never takes a pool slot: the pool holds only
    // the others, whose read-ahead bound is the working set.
    let pooled = |i: usize| !direct.is_direct(i);
    let working_set = if direct.is_empty() {
        plan.read_ahead_bytes
    } else {
        let slots: Vec<PlanSlot> = (0..plan.slots.len())
            .filter(|&i| pooled(i))
            .map(|i| plan.slots[i])
            .collect();
        read_ahead_bound(&slots, &plan.batch_blocks, plan.releases.len())
    };
    // Every slot of every array whose chunks the pool loads, which a budget above it can never
    // exceed.
    let mut loads = vec![false; plan.paths.len()];
    for (i, s) in plan.slots.iter().enumerate() {
        loads[s.path] |= pooled(i);
    }
    let every_chunk = plan
        .paths
        .iter()
        .zip(&loads)
        .filter(|&(_, &loads)| loads)
        .fold(0u64, |acc, (p, _)| {
            let n = p.geom.shape[p.geom.sample_axis].div_ceil(p.samples_per_chunk.max(1));
            acc.saturating_add(n.saturating_mul(p.slot_bytes))
        });
    let cache = match (ctx.pool.fixed_budget(), ctx.pool.disk()) {
        (Some(budget), None) => Some((budget, budget.min(every_chunk))),
        _ => None,
    };
    let mut need = MemoryNeed::new(
        plan,
        config.batch_size,
        config.prefetch_depth,
        n_rows,
        working_set,
        reads,
        cache,
    );
    if !direct.is_empty() {
        // Rows decoded in place take their batch's buffers when the planner issues the first
        // of them, ahead of the gather; each executor keeps a scratch buffer for chunks of
        // several samples.
        let all = need
            .batches
            .saturating_add(direct.open_batches())
            .min(plan.n_batches as u64);
        need.rows_batches = all - need.batches;
        need.batches = all;
        let executors = ctx.runtime.executor_threads() as u64;
        need.reads = need
            .reads
            .saturating_add(executors.saturating_mul(direct.scratch_bytes()));
    }
    match ctx.pool.disk() {
        // The slot files being written: their slots' bytes and O_DIRECT copies.
        Some(disk) => need.reads = need.reads.saturating_add(disk.write_bytes()),
        // What the pool holds already (chunks earlier passes left unpinned) stays on the heap
        // while this pass runs: the pool evicts only to admit.
        None => need.pool = need.pool.max(ctx.pool.stats().resident_bytes),
    }
    need.limit = ctx.memory_limit;
    need
}

/// What choosing the destinations of a pass's chunks over `order` and `plan` looks at.
fn pass_inputs<'a, S: Store>(
    ctx: &'a EngineContext<S>,
    config: &PassConfig,
    order: &'a EpochOrder,
    plan: &'a ReadPlan,
) -> PassInputs<'a> {
    let inner = plan
        .paths
        .iter()
        .map(|p| {
            ctx.arrays
                .get(&*p.path)
                .and_then(|a| a.inner_chunk_shape())
                .map(<[u64]>::to_vec)
        })
        .collect();
    PassInputs {
        mode: config.decode_into_batches,
        pool: &ctx.pool,
        transforms: &ctx.transforms,
        plan,
        order,
        release_each_block: config.release_each_block,
        inner,
    }
}

/// `need` against the limit it carries: an error naming the knob to lower, which stands for a
/// process the kernel would otherwise kill halfway through an epoch. `others` names the passes
/// already running, which `need` counts.
fn check_memory(
    config: &PassConfig,
    plan: &ReadPlan,
    need: &MemoryNeed,
    others: &[&str],
) -> Result<(), EngineError> {
    let Some(limit) = need.limit else {
        return Ok(());
    };
    if need.working_set > limit.bytes {
        let largest = plan.paths.iter().max_by_key(|p| p.slot_bytes);
        let fix = match largest {
            Some(p) if p.slot_bytes > limit.bytes => format!(
                "one decoded chunk of {} alone is {} bytes: re-chunk that array smaller",
                if p.path.is_empty() {
                    "the store's root array".to_string()
                } else {
                    format!("`{}`", p.path)
                },
                p.slot_bytes
            ),
            _ => "lower block_chunks or read fewer variables".into(),
        };
        return Err(EngineError::arg(
            "block_chunks",
            config.block_chunks,
            format!(
                "this pass must hold {} bytes of decoded chunks at once (its working set), \
                 more than {limit}; {fix}",
                need.working_set
            ),
        ));
    }
    if need.without_cache() > limit.bytes {
        let rows = match need.rows_batches {
            0 => String::new(),
            n => format!(
                ", and {n} filled ahead of the gather by chunks decoded straight into batch \
                 rows, as far as the read-ahead reaches"
            ),
        };
        // A shorter block lets the planner fill fewer batches ahead.
        let fix = if need.rows_batches > 1 && config.block_chunks > 1 {
            ", block_chunks"
        } else {
            ""
        };
        return Err(EngineError::arg(
            "prefetch_depth",
            config.prefetch_depth,
            format!(
                "up to {} batches of {} bytes may be in memory at once (prefetch_depth + 2{rows}), \
                 which with the working set of {} bytes, {} bytes of reads in flight \
                 (max_inflight, plus one per executor being decoded, each up to a stored chunk) \
                 and the library's own and its allocator's slack comes to {} bytes, more than \
                 {limit}; lower prefetch_depth, batch_size{fix} or max_inflight",
                need.batches,
                need.batch_bytes,
                need.working_set,
                need.reads,
                need.without_cache()
            ),
        ));
    }
    if let Some(budget) = need.cache_budget
        && need.alone() > limit.bytes
    {
        return Err(EngineError::arg(
            "cache_budget_bytes",
            budget,
            format!(
                "the pool may keep up to {} bytes of decoded chunks on the heap (the budget, or \
                 every chunk of the arrays if fewer), which with the batches, the reads in \
                 flight, the library's own and its allocator's slack comes to {} bytes, more \
                 than {limit}; lower cache_budget_bytes, or give cache_dir to keep slots in \
                 files",
                need.pool,
                need.alone()
            ),
        ));
    }
    if need.total() > limit.bytes {
        let running = match others.len() {
            1 => "the iteration".to_string(),
            n => format!("the {n} iterations"),
        };
        return Err(EngineError::arg(
            "split",
            &config.split,
            format!(
                "this pass needs {} bytes on its own, and {} bytes more are held beside it by \
                 {running} already running in this process ({}): {} bytes in all with the \
                 library's slack, more than {limit}; finish or drop those first (an iterator a \
                 loop broke out of holds its batches until it is dropped), or lower their \
                 batch_size, prefetch_depth or cache_budget_bytes",
                need.alone(),
                need.others,
                others.join(", "),
                need.total()
            ),
        ));
    }
    Ok(())
}

/// The pool's address: which passes share it (and the read buffers beside it).
fn pool_address<S: Store>(ctx: &EngineContext<S>) -> usize {
    Arc::as_ptr(&ctx.pool) as usize
}

/// The order and the read plan of a pass over `chunks`, refusing an empty one.
fn plan_pass(
    chunks: &[u64],
    samples_per_chunk: u64,
    n_samples: u64,
    variables: &[Variable],
    config: &PassConfig,
) -> Result<(EpochOrder, ReadPlan), EngineError> {
    let mut order = plan_order(chunks, samples_per_chunk, n_samples, variables, config)?;
    order.check_nonempty(&config.split)?;
    if config.start_batch > 0 {
        let n_batches = order.rows.len().div_ceil(config.batch_size) as u64;
        if config.start_batch > n_batches {
            return Err(EngineError::arg(
                "start_batch",
                config.start_batch,
                format!(
                    "an epoch of `{}` has {n_batches} batches of {} (0 to {}); resume at one \
                     of them, or at {n_batches} for none",
                    config.split,
                    config.batch_size,
                    n_batches - 1
                ),
            ));
        }
        // Whole batches: the rest are cut where a whole pass cuts them.
        let rows = (config.start_batch as usize).saturating_mul(config.batch_size);
        order.skip_front(rows);
    }
    let plan = read_plan(
        &order,
        variables,
        config.batch_size,
        config.release_each_block,
    )?;
    Ok((order, plan))
}

impl Pass {
    /// The memory a pass [`Pass::start`] would start with these arguments holds at its peak,
    /// counted from its plan without reading anything: the figure its start checks against
    /// the process's memory limit.
    pub fn memory_need<S: Store>(
        ctx: &Arc<EngineContext<S>>,
        variables: &[Variable],
        chunks: &[u64],
        samples_per_chunk: u64,
        n_samples: u64,
        config: &PassConfig,
    ) -> Result<MemoryNeed, EngineError> {
        let (order, plan) = plan_pass(chunks, samples_per_chunk, n_samples, variables, config)?;
        let direct = DirectRows::plan(&pass_inputs(ctx, config, &order, &plan));
        let need = memory_need(ctx, config, &plan, order.rows.len(), &direct);
        Ok(RunningPasses::count_beside(need, pool_address(ctx)))
    }

    /// Plans the pass over `chunks` of the reference grid (`samples_per_chunk`, `n_samples`)
    /// and starts its actors.
    pub fn start<S: Store>(
        ctx: &Arc<EngineContext<S>>,
        variables: &[Variable],
        chunks: &[u64],
        samples_per_chunk: u64,
        n_samples: u64,
        config: PassConfig,
    ) -> Result<Self, EngineError> {
        Self::start_after(
            ctx,
            variables,
            chunks,
            samples_per_chunk,
            n_samples,
            config,
            None,
        )
    }

    /// [`Pass::start`] for the pass that follows `predecessor` ([`Pass::as_predecessor`];
    /// train's next epoch, started early): once the predecessor has loaded every chunk it
    /// reads, its room in the chunk pool is this pass's as the predecessor's consumer takes the
    /// batches that pin it ([`ChunkPool::register_successor`]), so the two fit a budget that
    /// holds one iteration, and the memory check counts the larger of their working sets, not
    /// both. Until then this pass's loads wait for that room.
    ///
    /// [`ChunkPool::register_successor`]: insitubatch_pool::ChunkPool::register_successor
    pub fn start_after<S: Store>(
        ctx: &Arc<EngineContext<S>>,
        variables: &[Variable],
        chunks: &[u64],
        samples_per_chunk: u64,
        n_samples: u64,
        config: PassConfig,
        predecessor: Option<Predecessor>,
    ) -> Result<Self, EngineError> {
        if insitubatch_runtime::on_executor_thread() {
            // A chunk transform (a callback) iterating a dataset from inside the decoder: its
            // consumer would wait on the very threads it holds, and a pass of the same dataset
            // never ends.
            let thread = std::thread::current();
            return Err(EngineError::arg(
                "split",
                &config.split,
                format!(
                    "an iteration was started on the library's own thread `{}` (from inside a \
                     chunk transform?), where waiting for its batches could hang the pass that \
                     runs the transform; a transform must not iterate a dataset",
                    thread.name().unwrap_or("unnamed")
                ),
            ));
        }
        let started = Instant::now();
        let (order, plan) = plan_pass(chunks, samples_per_chunk, n_samples, variables, &config)?;
        // What must be resident at once, with what the passes already running hold, cannot
        // exceed the memory this process may use (the machine's, its cgroup's, `ulimit -v`):
        // fail now, naming the knob, rather than be killed for memory halfway through the
        // first block.
        let name = format!("{}#{}", config.split, config.epoch);
        let inputs = pass_inputs(ctx, &config, &order, &plan);
        let direct = DirectRows::plan(&inputs);
        let region_slots = RegionSlots::plan(&inputs, &direct);
        let need = memory_need(ctx, &config, &plan, order.rows.len(), &direct);
        let takes_over = predecessor.map(|p| p.running);
        let running = RunningPasses::enter(
            need,
            pool_address(ctx),
            &name,
            takes_over,
            |need, others| check_memory(&config, &plan, need, others),
        )?;
        // The pool reserves what this pass may pin: nothing when every chunk is decoded into
        // batch rows. A pass that also loads chunks through the pool reserves its whole
        // read-ahead bound, which covers a resident chunk it pins for a row as well.
        let all_rows = (0..plan.slots.len()).all(|i| direct.is_direct(i));
        let reserve = if all_rows { 0 } else { plan.read_ahead_bytes };
        let owner = match predecessor {
            Some(p) => ctx.pool.register_successor(&name, reserve, p.owner)?,
            None => ctx.pool.register_owner(&name, reserve)?,
        };
        let mut arrays = Vec::new();
        let mut layouts = Vec::new();
        let mut pipelines = Vec::new();
        for p in &plan.paths {
            let a = ctx.arrays.get(&*p.path).ok_or_else(|| {
                EngineError::Runtime(format!("array `{}` was not opened", p.path))
            })?;
            arrays.push(a.clone());
            layouts.push(TileLayout::new(&p.geom));
            let pipeline = ctx.transforms.get(&*p.path).cloned();
            pipelines.push(
                pipeline.unwrap_or_else(|| Pipeline::none(p.geom.inner_shape(), p.geom.dtype)),
            );
        }
        let n_slots = plan.slots.len();
        let stats = PassStats {
            split: config.split.clone(),
            epoch: config.epoch,
            batches_total: plan.n_batches as u64,
            start_batch: config.start_batch,
            read_ahead_bytes: plan.read_ahead_bytes,
            dropped_anchors: order.dropped_anchors,
            trimmed_rows: order.trimmed_rows,
            ..PassStats::default()
        };
        // The channel never holds more than the epoch's batches (the memory need counts no
        // more), and a depth of `usize::MAX` would overflow its capacity.
        let prefetch_depth = config.prefetch_depth.min(plan.n_batches.max(1));
        let shared = Arc::new(PassShared {
            readahead: Semaphore::new(
                format!("read-ahead of {}", config.split),
                plan.read_ahead_bytes,
            ),
            config,
            order,
            plan,
            layouts,
            arrays,
            pipelines,
            owner,
            slots: Mutex::new((0..n_slots).map(|_| SlotEntry::Pending).collect()),
            notify: Notify::new(),
            cancelled: AtomicBool::new(false),
            stop: Notify::new(),
            error: Mutex::new(None),
            counters: Counters::default(),
            direct,
            region_slots,
            assemblies: Assemblies::default(),
            bad_chunks: Mutex::new(Vec::new()),
            cache_writes: Mutex::new(Vec::new()),
            loads_pending: AtomicU64::new(1),
            after_loads: Mutex::new(AfterLoads::Nothing),
        });

        // Fetcher workers on every executor and one decoder worker per executor, each kind
        // sharing one mailbox.
        let decoders = decoder::spawn(ctx, &shared);
        let fetchers = fetcher::spawn(ctx, &shared, decoders.sender());
        let mut tasks = Vec::new();
        tasks.push(planner::spawn(ctx, &shared, fetchers.sender()));
        tasks.extend(fetchers.into_join_handles());
        tasks.extend(decoders.into_join_handles());
        let (tx, rx) = flume::bounded(prefetch_depth);
        tasks.push(gather::spawn(ctx, &shared, tx));
        Ok(Self {
            rx: Some(rx),
            shared,
            tasks,
            started,
            last: started,
            done: false,
            stats,
            latency: hdrhistogram::Histogram::new(3).expect("3 significant figures is valid"),
            _running: running,
            keep_alive: None,
            on_abandon: None,
        })
    }

    /// Keeps `value` alive until the pass has stopped and joined its actors (the dataset hands
    /// its runtime here, so a pass may outlive the dataset value).
    pub fn keep_alive(mut self, value: Arc<dyn std::any::Any + Send + Sync>) -> Self {
        self.keep_alive = Some(value);
        self
    }

    /// Runs `hook` once this pass has loaded every chunk it reads (at once if it has): from
    /// then on it only gathers batches, so another pass started now competes with none of its
    /// reads or decodes, and finds every chunk the pool keeps resident rather than loading
    /// (iterations do not wait on each other's loads: it would load its own copy). The hook
    /// runs on one of the runtime's threads (or the caller's), so it must not block: start a
    /// thread for anything that waits. It does not run if the pass stops first.
    pub fn when_loaded(&self, hook: Box<dyn FnOnce() + Send>) {
        let mut state = lock(&self.shared.after_loads);
        match *state {
            AfterLoads::Loaded => {
                drop(state);
                hook();
            }
            _ => *state = AfterLoads::Run(hook),
        }
    }

    /// Runs `hook` on the dropping thread, after the actors are joined, if the pass is dropped
    /// before its consumer received its last batch (abandoned, or failed). A consumer that
    /// takes every batch and drops the iterator without asking for more (`zip` with a step
    /// count, `take(n)`) has not abandoned it.
    pub fn when_abandoned(&mut self, hook: Box<dyn FnOnce() + Send>) {
        self.on_abandon = Some(hook);
    }

    /// Marks a pass started before its consumer asked for it as handed over now: its time to
    /// first batch, wall time and batch intervals count from here, and its stats say
    /// `started_ahead`.
    pub fn handed_over(&mut self) {
        let now = Instant::now();
        self.started = now;
        self.last = now;
        self.stats.started_ahead = true;
    }

    /// The report so far (complete once the iterator returned `None`).
    pub fn stats(&self) -> PassStats {
        let mut s = self.stats.clone();
        let c = &self.shared.counters;
        let (hits, misses) = self.shared.owner.hits_misses();
        s.cache_hits = hits;
        s.cache_misses = misses;
        (s.cache_revived, s.cache_rejected) = self.shared.owner.revived_rejected();
        s.tiles_read = Counters::get(&c.tiles_read);
        s.tiles_read_waited = Counters::get(&c.tiles_read_waited);
        s.tiles_into_batches = Counters::get(&c.tiles_into_batches);
        s.region_slots = Counters::get(&c.region_slots);
        s.bytes_read = Counters::get(&c.bytes_read);
        s.bytes_decoded = Counters::get(&c.bytes_decoded);
        s.bytes_revived = Counters::get(&c.bytes_revived);
        s.resident_peak_bytes = self.shared.owner.peak_resident_bytes();
        s.pinned_peak_bytes = self.shared.owner.peak_pinned_bytes();
        s.budget_bytes = self.shared.owner.pool().stats().budget_bytes;
        s.bad_chunks = lock(&self.shared.bad_chunks).clone();
        s.batch_latency_us_p50 = self.latency.value_at_quantile(0.5);
        s.batch_latency_us_p90 = self.latency.value_at_quantile(0.90);
        s.batch_latency_us_p99 = self.latency.value_at_quantile(0.99);
        s.batch_latency_us_max = self.latency.max();
        s
    }

    /// The draw order of this pass.
    pub fn order(&self) -> &EpochOrder {
        &self.shared.order
    }

    /// The read-ahead bound of this pass, in bytes.
    pub fn read_ahead_bytes(&self) -> u64 {
        self.shared.plan.read_ahead_bytes
    }

    /// This pass as the predecessor of one [`Pass::start_after`] starts.
    pub fn as_predecessor(&self) -> Predecessor {
        Predecessor {
            owner: self.shared.owner.id(),
            running: self._running.id(),
        }
    }

    /// Slots this pass has pinned right now.
    pub fn pinned_slots(&self) -> usize {
        self.shared.owner.pinned_slots()
    }

    /// The spec's loud failure of a configured cache: a persisted cache that served no hit
    /// this epoch while it was consulted and rejected gets one warning per epoch.
    fn warn_if_cache_rejected(&mut self) {
        let owner = &self.shared.owner;
        let Some(disk) = owner.pool().disk() else {
            return;
        };
        let (hits, _) = owner.hits_misses();
        let (_, rejected) = owner.revived_rejected();
        if disk.persist() && hits == 0 && rejected > 0 {
            let msg = format!(
                "the persistent cache at {} served 0 hits in {} epoch {}: {rejected} entries were \
                 consulted and rejected (files missing or damaged, or written for another \
                 geometry); they are being rewritten",
                disk.dir().display(),
                self.shared.config.split,
                self.shared.config.epoch
            );
            eprintln!("insitubatch: warning: {msg}");
            self.stats.warnings.push(msg);
        }
    }

    /// Stops the pass and waits for every actor; returns the first panic seen, if any.
    fn stop_and_join(&mut self) -> Option<EngineError> {
        if !self.done {
            self.shared.fail(EngineError::Cancelled);
        }
        self.done = true;
        // Dropping the receiver unblocks a gather parked on a full channel.
        self.rx.take();
        let mut panic = None;
        // The actors first (until they are joined a decoder may start a cache write), then the
        // writes.
        let actors: Vec<JoinHandle<()>> = self.tasks.drain(..).collect();
        let mut joined = Vec::with_capacity(actors.len());
        for t in actors {
            joined.push(t.join());
        }
        let writes = std::mem::take(&mut *lock(&self.shared.cache_writes));
        for t in writes {
            joined.push(t.join());
        }
        for outcome in joined {
            if let Err(TaskError::Panicked { name, message }) = outcome {
                panic.get_or_insert(EngineError::ActorPanicked {
                    actor: name,
                    message,
                });
            }
        }
        panic
    }
}

/// [`Pass::next_timeout`] returned before a batch was ready; nothing was lost, ask again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut;

impl Pass {
    /// The next batch, waiting at most `timeout` for it: `Err(TimedOut)` when none came in time
    /// (the pass goes on; call again), otherwise what [`Iterator::next`] would return. A host
    /// that must react to something while it waits (the Python shim checks for Ctrl-C) calls
    /// this in a loop.
    pub fn next_timeout(
        &mut self,
        timeout: std::time::Duration,
    ) -> Result<Option<BatchResult>, TimedOut> {
        if self.done {
            return Ok(None);
        }
        let Some(rx) = self.rx.as_ref() else {
            return Ok(None);
        };
        let t0 = Instant::now();
        let got = match rx.recv_timeout(timeout) {
            Ok(item) => Ok(item),
            Err(flume::RecvTimeoutError::Disconnected) => Err(flume::RecvError::Disconnected),
            Err(flume::RecvTimeoutError::Timeout) => {
                self.stats.consumer_stall_us += t0.elapsed().as_micros() as u64;
                return Err(TimedOut);
            }
        };
        Ok(self.received(t0, got))
    }

    /// Accounts for what the prefetch channel gave after a wait that began at `t0`.
    fn received(
        &mut self,
        t0: Instant,
        got: Result<BatchResult, flume::RecvError>,
    ) -> Option<BatchResult> {
        let now = Instant::now();
        self.stats.consumer_stall_us += (now - t0).as_micros() as u64;
        self.stats.elapsed_us = (now - self.started).as_micros() as u64;
        match got {
            Ok(Ok(batch)) => {
                if self.stats.batches == 0 {
                    self.stats.ttfb_us = (now - self.started).as_micros() as u64;
                }
                let _ = self
                    .latency
                    .record((now - self.last).as_micros().max(1) as u64);
                self.last = now;
                self.stats.batches += 1;
                self.stats.samples += batch.len() as u64;
                self.stats.bytes_delivered += batch
                    .arrays
                    .iter()
                    .map(|a| a.bytes().len() as u64)
                    .sum::<u64>();
                Some(Ok(batch))
            }
            Ok(Err(e)) => {
                let panic = self.stop_and_join();
                Some(Err(match e {
                    EngineError::ActorPanicked { .. } => panic.unwrap_or(e),
                    other => other,
                }))
            }
            Err(flume::RecvError::Disconnected) => {
                let complete = self.stats.batches == self.stats.batches_total;
                self.done = complete;
                let panic = self.stop_and_join();
                if complete && panic.is_none() {
                    self.warn_if_cache_rejected();
                    None
                } else {
                    Some(Err(panic.or_else(|| self.shared.error()).unwrap_or(
                        EngineError::Runtime("the gather actor ended before the epoch did".into()),
                    )))
                }
            }
        }
    }
}

impl Iterator for Pass {
    type Item = BatchResult;

    fn next(&mut self) -> Option<BatchResult> {
        if self.done {
            return None;
        }
        let rx = self.rx.as_ref()?;
        let t0 = Instant::now();
        let got = rx.recv();
        self.received(t0, got)
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.stop_and_join();
        // (An iterator that said the end delivered every batch first.)
        if let Some(hook) = self.on_abandon.take()
            && self.stats.batches < self.stats.batches_total
        {
            hook();
        }
        // Joined above; only now may the runtime go.
        self.keep_alive.take();
    }
}
