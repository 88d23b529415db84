//! The public engine API: [`InSituDataset`] and its builder.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use insitubatch_actors::planner::valid_anchors;
use insitubatch_actors::{
    ChunkTransform, ChunkTransforms, DECODE_INTO_BATCHES_ENV, EngineContext, EngineError,
    EpochOrder, IntoRows, MemoryLimit, MemoryNeed, OnBadChunk, Pass, PassConfig, Pipeline,
    Predecessor, Shard, SplitManifest, StackChannel, Stride, Variable, count_order_rows,
    memory_limit, plan_order, rank_share, reaches, rows_per_anchor, split_by_chunk,
};
use insitubatch_actors::{Origins, Patch, Placement, StoreAxis};
use insitubatch_pool::{
    ArrayMeta, Budget, BufferPool, CacheConfig, ChunkPool, DiskStats, DiskTier, PoolStats, Recycler,
};
use insitubatch_runtime::sync::Semaphore;
use insitubatch_runtime::{
    IoBackend, IoBackendChoice, MAX_EXECUTOR_THREADS, Runtime, RuntimeBuilder,
};
use insitubatch_store::{
    AnyStore, ArrayGeometry, Hierarchy, MountedStore, open_geometries, open_mounted_hierarchy,
};

/// Default rows per batch.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Default chunks per shuffle block.
pub const DEFAULT_BLOCK_CHUNKS: usize = 16;
/// The most stored-chunk reads `max_inflight` may allow in flight.
pub const MAX_INFLIGHT: usize = 4096;

/// Default in-flight stored-chunk reads per executor thread (`max_inflight` unset: this many
/// times the executor count). A local store is decode-bound: a read or two queued behind each
/// decoder keeps every core busy, and each read beyond that only holds one more encoded chunk
/// in memory (docs/benchmarks.md, "Default read concurrency").
pub const DEFAULT_INFLIGHT_PER_EXECUTOR: usize = 4;
/// Default in-flight reads per executor thread from an object store or HTTP server, where a
/// read is a request of tens of milliseconds and throughput comes from having many at once.
pub const DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR: usize = 16;
/// Default batches assembled ahead of the consumer.
pub const DEFAULT_PREFETCH_DEPTH: usize = 2;

/// The splits a pass can iterate.
const SPLITS: [&str; 4] = ["train", "val", "test", "all"];
const TRAIN: &str = "train";

/// A view's field region, as the builder was given it.
enum Crop {
    /// [`ArrayGeometry::crop`].
    Plain(Vec<(u64, u64)>),
    /// [`ArrayGeometry::crop_wrapping`].
    Wrapping(Vec<(i64, i64)>),
}

enum VarSpec {
    Path {
        label: String,
        path: String,
        offset: i64,
        region: Option<Crop>,
        /// A static field ([`DatasetBuilder::static_variable`]).
        static_field: bool,
    },
    Geometry {
        label: String,
        geom: ArrayGeometry,
    },
}

/// The mode `INSITUBATCH_DECODE_INTO_BATCHES` sets ([`IntoRows::Auto`] without it), or an
/// error naming the variable.
fn into_rows_from_env() -> Result<IntoRows, EngineError> {
    match std::env::var(DECODE_INTO_BATCHES_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(IntoRows::Auto),
        Ok(v) => v.trim().parse().map_err(|_| {
            EngineError::arg(
                DECODE_INTO_BATCHES_ENV,
                &v,
                "use auto, always or never, or unset it",
            )
        }),
        Err(std::env::VarError::NotUnicode(v)) => Err(EngineError::arg(
            DECODE_INTO_BATCHES_ENV,
            v.to_string_lossy(),
            "use auto, always or never, or unset it",
        )),
    }
}

/// `variables` with the labels of `stacks` placed in their channels, or an error naming the
/// stack and what is wrong with it.
fn stacked(
    mut variables: Vec<Variable>,
    stacks: &[(String, Vec<String>)],
) -> Result<Vec<Variable>, EngineError> {
    let bad = |name: &str, why: String| EngineError::arg("stacks", name, why);
    for (name, labels) in stacks {
        if name.is_empty() {
            return Err(bad(name, "a stack needs a name".into()));
        }
        if variables.iter().any(|v| v.label == *name)
            || stacks.iter().filter(|(n, _)| n == name).count() > 1
        {
            return Err(bad(
                name,
                format!("`{name}` already names a label or another stack; choose another name"),
            ));
        }
        if labels.is_empty() {
            return Err(bad(name, "list at least one label to stack".into()));
        }
        let mut first: Option<usize> = None;
        for (channel, label) in labels.iter().enumerate() {
            let Some(i) = variables.iter().position(|v| v.label == *label) else {
                let all: Vec<&str> = variables.iter().map(|v| v.label.as_str()).collect();
                return Err(bad(
                    name,
                    format!("no label `{label}` to stack; the labels are {all:?}"),
                ));
            };
            if let Some(other) = &variables[i].stack {
                return Err(bad(
                    name,
                    format!(
                        "label `{label}` is already in stack `{}`; a label is in one stack",
                        other.name
                    ),
                ));
            }
            if let Some(f) = first {
                let (a, b) = (&variables[f], &variables[i]);
                if (&a.sample_inner, a.sample_dtype) != (&b.sample_inner, b.sample_dtype) {
                    return Err(bad(
                        name,
                        format!(
                            "channels need one sample shape and dtype: `{}` has {:?} {}, `{}` \
                             has {:?} {} (after their chunk transforms); stack labels that \
                             match, or make them match with transforms (`cast`, `regrid`)",
                            a.label,
                            a.sample_inner,
                            a.sample_dtype.name(),
                            b.label,
                            b.sample_inner,
                            b.sample_dtype.name()
                        ),
                    ));
                }
            }
            first.get_or_insert(i);
            variables[i] = variables[i].clone().stacked(StackChannel {
                name: name.clone(),
                channel,
                channels: labels.len(),
            });
        }
    }
    Ok(variables)
}

/// `variables` cut to `patch` (see [`DatasetBuilder::patch`]), or an error naming the label
/// whose samples it does not fit.
fn patched(variables: Vec<Variable>, patch: Option<&Patch>) -> Result<Vec<Variable>, EngineError> {
    let Some(patch) = patch else {
        return Ok(variables);
    };
    let shape = &patch.shape;
    let bad = |why: String| EngineError::arg("patch", format!("{shape:?}"), why);
    if shape.is_empty() || shape.contains(&0) {
        return Err(bad(
            "give the patch's extent along each of the samples' last axes, each at least 1 \
             (for example [64, 64])"
                .into(),
        ));
    }
    if patch.wrap.len() != shape.len() {
        return Err(bad(format!(
            "give one wrap flag per patched axis: {} for a patch of {} axes",
            patch.wrap.len(),
            shape.len()
        )));
    }
    let k = shape.len();
    let mut field: Option<(&Variable, &[u64])> = None;
    for v in &variables {
        let inner = &v.sample_inner;
        if inner.len() < k {
            return Err(bad(format!(
                "`{}` has samples of {} axes {inner:?} (after its chunk transforms), fewer than \
                 the patch's {k}",
                v.label,
                inner.len()
            )));
        }
        let last = &inner[inner.len() - k..];
        if let Some((first, grid)) = field {
            if grid != last {
                return Err(bad(format!(
                    "every label is cut at one origin, so their last {k} axes must have one \
                     extent: `{}` has {grid:?}, `{}` has {last:?} (after their chunk \
                     transforms); regrid one onto the other, or patch a dataset without one",
                    first.label, v.label
                )));
            }
        } else {
            if let Some(d) = (0..k).find(|&d| shape[d] > last[d]) {
                return Err(bad(format!(
                    "the patch is larger than the field along its axis {d}: {} against {} \
                     (`{}` has samples {inner:?} after its chunk transforms)",
                    shape[d], last[d], v.label
                )));
            }
            field = Some((v, last));
        }
    }
    if let Some((_, field)) = field {
        check_origins(patch, field)?;
    }
    let patch = Arc::new(patch.clone());
    Ok(variables
        .into_iter()
        .map(|v| v.patched(Arc::clone(&patch)))
        .collect())
}

/// An error naming the argument that places `patch`'s origins when they cannot be placed over
/// `field`: no patch per sample, a grid stride of another length, zero or past the patch, or
/// more patches per sample than an order counts.
fn check_origins(patch: &Patch, field: &[u64]) -> Result<(), EngineError> {
    match &patch.origins {
        Origins::Random(0) => Err(EngineError::arg(
            "patches_per_sample",
            0,
            "must be at least 1 (1 cuts one patch from every sample, the default)",
        )),
        Origins::Grid(stride) => {
            let bad = |why: String| EngineError::arg("patch_grid", format!("{stride:?}"), why);
            let shape = &patch.shape;
            if stride.len() != shape.len() {
                return Err(bad(format!(
                    "give one stride per patched axis: {} for the patch {shape:?}",
                    shape.len()
                )));
            }
            if let Some(d) = (0..shape.len()).find(|&d| stride[d] == 0 || stride[d] > shape[d]) {
                return Err(bad(format!(
                    "the stride along axis {d} must be from 1 to the patch's extent there ({}): \
                     a larger one would leave parts of the field in no patch; give the patch's \
                     shape {shape:?} to tile without overlap",
                    shape[d]
                )));
            }
            check_count(patch.per_sample(field), "patch_grid", format!("{stride:?}"))
        }
        Origins::Random(n) => check_count(*n, "patches_per_sample", n.to_string()),
    }
}

/// Patches per sample an order counts (a row's patch is a `u32`).
fn check_count(n: u64, name: &'static str, value: String) -> Result<(), EngineError> {
    if n > u64::from(u32::MAX) {
        return Err(EngineError::arg(
            name,
            value,
            format!(
                "gives {n} patches per sample, more than {}; cut fewer",
                u32::MAX
            ),
        ));
    }
    Ok(())
}

/// What a batch holds under one name: a label's own array, or a stack of labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchArraySpec {
    /// The array's name in a [`Batch`](insitubatch_actors::Batch): the label or the stack.
    pub name: String,
    /// The labels in it, by channel (one for a label's own array).
    pub labels: Vec<String>,
    /// A row's shape: `(channels, *sample_inner)` for a stack, `sample_inner` otherwise.
    pub row_shape: Vec<u64>,
    /// Element type.
    pub dtype: insitubatch_store::DType,
    /// Whether it is a stack (a stack of one label has a channel axis of 1).
    pub stacked: bool,
}

/// Builds an [`InSituDataset`]. Argument names and defaults are the spec's.
pub struct DatasetBuilder {
    root: PathBuf,
    variables: Vec<VarSpec>,
    sample_axis: usize,
    manifest: Option<SplitManifest>,
    batch_size: usize,
    block_chunks: usize,
    fast_first_batch: bool,
    prefetch_next_epoch: bool,
    /// (every, phase) as given; checked by `build`.
    sample_stride: (u64, u64),
    max_inflight: Option<usize>,
    prefetch_depth: usize,
    seed: u64,
    shuffle: bool,
    cache_budget_bytes: Option<u64>,
    memory_limit_bytes: Option<u64>,
    on_bad_chunk: OnBadChunk,
    executor_threads: Option<usize>,
    io_backend: IoBackendChoice,
    /// `None`: `INSITUBATCH_DECODE_INTO_BATCHES`, or `Auto` without it.
    decode_into_batches: Option<IntoRows>,
    panic_on_tile: Option<u64>,
    cache_dir: Option<PathBuf>,
    persist: bool,
    reset_stale_cache: bool,
    readonly_cache: bool,
    cache_direct_io: bool,
    cache_fail_writes_after: Option<u64>,
    shard: Shard,
    even_train: bool,
    /// The splits whose epochs leave out a short last batch.
    drop_last: Vec<String>,
    storage_options: Vec<(String, String)>,
    mounts: Vec<Mount>,
    /// Mounts placed on the sample axis ([`DatasetBuilder::align_mount`]), by name.
    alignments: Vec<(String, MountAlignment)>,
    /// Indexed variables ([`DatasetBuilder::index`]), by label.
    indexes: Vec<(String, Arc<[u64]>)>,
    chunk_transforms: ChunkTransforms,
    stacks: Vec<(String, Vec<String>)>,
    /// The window cut from every row ([`DatasetBuilder::patch`]).
    patch: Option<Patch>,
    /// Where a sample's patches are placed, when not one at random
    /// ([`DatasetBuilder::patches_per_sample`], [`DatasetBuilder::patch_grid`]).
    patch_origins: Option<Origins>,
    /// The first bad `chunk_transforms_json`, reported by `build`.
    chunk_transforms_error: Option<EngineError>,
}

impl DatasetBuilder {
    /// Adds the variable `label` reading array `path` (offset 0).
    pub fn variable(self, label: impl Into<String>, path: impl Into<String>) -> Self {
        self.window(label, path, 0)
    }

    /// Adds the variable `label` reading array `path` shifted `offset` samples along the sample
    /// axis (`array[anchor + offset]`): the forecasting `x`/`y = shift(h)` pattern. Labels of
    /// one path decode once.
    pub fn window(self, label: impl Into<String>, path: impl Into<String>, offset: i64) -> Self {
        self.view(label.into(), path.into(), offset, None)
    }

    /// Adds the variable `label` reading a region of array `path`'s field, shifted `offset`
    /// samples: one half-open `(start, end)` per field axis in physical order (see
    /// [`ArrayGeometry::crop`]). Only the stored chunks the region touches are read, decoded
    /// and held; a sample is the region. Views of one array must read the same region.
    pub fn cropped_window(
        self,
        label: impl Into<String>,
        path: impl Into<String>,
        offset: i64,
        region: &[(u64, u64)],
    ) -> Self {
        let region = Crop::Plain(region.to_vec());
        self.view(label.into(), path.into(), offset, Some(region))
    }

    /// [`DatasetBuilder::cropped_window`] with ranges that may wrap around the end of a
    /// periodic axis (a longitude), as [`ArrayGeometry::crop_wrapping`] takes them: `(-100,
    /// 180)` on a 1440-long axis is its last 100 and first 180 elements, in that order.
    pub fn cropped_window_wrapping(
        self,
        label: impl Into<String>,
        path: impl Into<String>,
        offset: i64,
        region: &[(i64, i64)],
    ) -> Self {
        let region = Crop::Wrapping(region.to_vec());
        self.view(label.into(), path.into(), offset, Some(region))
    }

    /// Adds the static field `label`: array `path` whole (orography, a land-sea mask, a
    /// climatology), the same in every row of every batch. It has no sample axis: it is read
    /// and decoded once per pass (kept by the pool like any chunk, revived from a cache
    /// directory), its chunk transforms run on it, and it may be a channel of a stack beside
    /// sampled variables of its shape. Its rows' read indices are their anchors.
    pub fn static_variable(self, label: impl Into<String>, path: impl Into<String>) -> Self {
        self.static_view(label.into(), path.into(), None)
    }

    /// [`DatasetBuilder::static_variable`] of a region of the array, as
    /// [`DatasetBuilder::cropped_window_wrapping`] takes it (one range per axis of the array):
    /// the region the dataset's sampled variables are cropped to, so that it can stack with
    /// them.
    pub fn cropped_static(
        self,
        label: impl Into<String>,
        path: impl Into<String>,
        region: &[(i64, i64)],
    ) -> Self {
        let region = Crop::Wrapping(region.to_vec());
        self.static_view(label.into(), path.into(), Some(region))
    }

    fn static_view(mut self, label: String, path: String, region: Option<Crop>) -> Self {
        self.variables.push(VarSpec::Path {
            label,
            path,
            offset: 0,
            region,
            static_field: true,
        });
        self
    }

    fn view(mut self, label: String, path: String, offset: i64, region: Option<Crop>) -> Self {
        self.variables.push(VarSpec::Path {
            label,
            path,
            offset,
            region,
            static_field: false,
        });
        self
    }

    /// Adds a variable from a geometry (as `open_geometries` returns it, possibly shifted).
    pub fn geometry(mut self, label: impl Into<String>, geom: ArrayGeometry) -> Self {
        self.variables.push(VarSpec::Geometry {
            label: label.into(),
            geom,
        });
        self
    }

    /// The physical axis samples are drawn along (default 0).
    pub fn sample_axis(mut self, axis: usize) -> Self {
        self.sample_axis = axis;
        self
    }

    /// The split manifest (default: every chunk in `train`).
    pub fn manifest(mut self, manifest: SplitManifest) -> Self {
        self.manifest = Some(manifest);
        self
    }

    /// Rows per batch (default 32).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Chunks per shuffle block (default 16): shuffle quality against resident memory.
    pub fn block_chunks(mut self, n: usize) -> Self {
        self.block_chunks = n;
        self
    }

    /// Start each shuffled epoch with a small block that holds one batch (default false). The
    /// first block then has `⌈batch_size / samples_per_chunk⌉` chunks and each next one twice
    /// as many, up to `block_chunks`. So the first batch waits for the chunks of one batch, not
    /// a whole block. The cost is mixing: each epoch's first batches draw from fewer chunks.
    /// Sequential passes are unchanged.
    pub fn fast_first_batch(mut self, yes: bool) -> Self {
        self.fast_first_batch = yes;
        self
    }

    /// Start the next epoch's `train` pass while this one's last batches are being gathered
    /// and consumed (default false). Once a train pass has loaded every chunk it reads, the
    /// pass for `epoch + 1` starts in the background, and [`InSituDataset::iter`] hands it over
    /// when train is next asked for at that epoch: a loop that spends time on each batch (a
    /// model step) and then calls `set_epoch(epoch + 1)` and iterates again gets its first
    /// batch without waiting for a first block to decode. The order is the same as without it.
    /// A loop that takes no time per batch gains nothing: it asks for the next epoch the moment
    /// the last chunk is in.
    ///
    /// The cost: for a while two passes run, and the early one's batch buffers and reads count
    /// against `memory_limit_bytes` like any second iteration's. In the chunk pool it takes over
    /// the epoch before's room as that epoch's last batches are taken (its loads wait for it),
    /// so a budget that holds one iteration, the automatic one included, holds both, and the
    /// memory check counts one working set for the two; beside an iteration of another split
    /// running at the same time it needs room of its own. When it would not fit, the early pass
    /// does not start (nothing fails); when a pass the caller asks for would not fit beside it,
    /// the early pass is dropped first. If
    /// train is asked for at another epoch, or resumed mid-epoch, or while the epoch before has
    /// batches not yet taken, or the epoch that started it is dropped before its last batch,
    /// the early pass is dropped, and the work it did (at most its first read-ahead and
    /// `prefetch_depth` batches) is lost. Iterations of other splits (validation between
    /// epochs) leave it waiting.
    ///
    /// It follows the loop: when an iteration of another split (validation between epochs)
    /// had to drop the early pass to start, from then on that split's iterations start train's
    /// next epoch once they have loaded their last chunk, taking over their room, rather than
    /// train's own (which would have it dropped every epoch). If another split then drops it
    /// (a loop running val and then test between epochs), it follows that one, the last before
    /// train; if a split it already followed drops it again (val twice between epochs), or a
    /// train pass does, no early pass starts any more. Each change is said once in the warnings.
    pub fn prefetch_next_epoch(mut self, yes: bool) -> Self {
        self.prefetch_next_epoch = yes;
        self
    }

    /// Draw every `every`-th sample along the sample axis, starting at sample `phase` (default
    /// `(1, 0)`: every sample): 6-hourly samples from hourly data, or only 00 and 12 UTC
    /// (`(12, 0)` when sample 0 is at 00 UTC). It applies to every split, windows included
    /// (a `shift(h)` label reads `h` samples after each drawn one). Chunks are still read and
    /// decoded whole, once; a chunk with no sample on the stride is not read. `every` must be
    /// at least 1 and `phase` below it.
    pub fn sample_stride(mut self, every: u64, phase: u64) -> Self {
        self.sample_stride = (every, phase);
        self
    }

    /// Stored-chunk reads in flight across the dataset (default
    /// [`DEFAULT_INFLIGHT_PER_EXECUTOR`] per executor thread).
    pub fn max_inflight(mut self, n: usize) -> Self {
        self.max_inflight = Some(n);
        self
    }

    /// Batches assembled ahead of the consumer (default 2).
    pub fn prefetch_depth(mut self, n: usize) -> Self {
        self.prefetch_depth = n;
        self
    }

    /// Seed of the epoch orders (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Shuffle the train split (default true; val, test and all are always sequential).
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// The chunk pool's byte budget (default: the working set of one iteration). Above the
    /// working set, drained chunks stay resident and later epochs hit them.
    pub fn cache_budget_bytes(mut self, bytes: u64) -> Self {
        self.cache_budget_bytes = Some(bytes);
        self
    }

    /// The memory the library may hold in this process when an iteration of this dataset
    /// starts, its need and what the iterations already running hold (default: all this
    /// process may use, the least of the machine's memory, its cgroup's limit and `ulimit -v`).
    /// Set below that, it leaves the rest to the host: a training script's model, a
    /// simulation's own arrays. Starting an iteration that does not fit is an error naming
    /// what to lower, rather than a process the kernel kills mid-epoch.
    pub fn memory_limit_bytes(mut self, bytes: u64) -> Self {
        self.memory_limit_bytes = Some(bytes);
        self
    }

    /// What to do with a chunk that cannot be read or decoded (default `Raise`).
    pub fn on_bad_chunk(mut self, policy: OnBadChunk) -> Self {
        self.on_bad_chunk = policy;
        self
    }

    /// Executor threads (default: one per core).
    pub fn executor_threads(mut self, n: usize) -> Self {
        self.executor_threads = Some(n);
        self
    }

    /// IO backend (default: io_uring when available, or `INSITUBATCH_IO`).
    pub fn io_backend(mut self, choice: IoBackendChoice) -> Self {
        self.io_backend = choice;
        self
    }

    /// When a chunk is decoded straight into its samples' batch rows instead of a pool slot the
    /// gather copies from (default [`IntoRows::Auto`], or what `INSITUBATCH_DECODE_INTO_BATCHES`
    /// says): it saves the slot's fresh pages and the later copy out of it, and keeps nothing
    /// for a later epoch. `Always` suits a single pass (inference); `Never` is for comparing
    /// (the batches are the same). See `docs/architecture.md`, "Decoding into batch rows".
    pub fn decode_into_batches(mut self, mode: IntoRows) -> Self {
        self.decode_into_batches = Some(mode);
        self
    }

    /// Puts the pool's slots in `.npy` files under `dir` (local NVMe), mapped into memory: the
    /// budget then bounds bytes on disk and the resident footprint is reclaimable page cache.
    /// Without [`persist`](Self::persist) the files go on eviction and on close. One writing
    /// dataset per directory at a time (an advisory lock; a second writer fails naming the
    /// first). The directory is the dataset's identity: use one per source and version.
    pub fn cache_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cache_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Keeps the `cache_dir` files and logs each the moment it lands, so a later dataset over
    /// the same directory revives them with no fetch and no decode, and a killed run keeps
    /// everything it finished (default false).
    pub fn persist(mut self, yes: bool) -> Self {
        self.persist = yes;
        self
    }

    /// When arrays' cached chunks are stale (their chunk-transform fingerprint changed),
    /// delete just those arrays' files and rebuild them instead of failing (default false).
    pub fn reset_stale_cache(mut self, yes: bool) -> Self {
        self.reset_stale_cache = yes;
        self
    }

    /// Reads a cache another job warmed: the lock is shared with other readers, nothing is
    /// written, and a chunk missing from the cache is an error naming it (default false).
    pub fn readonly_cache(mut self, yes: bool) -> Self {
        self.readonly_cache = yes;
        self
    }

    /// Writes slot files with O_DIRECT where the file system allows it (default true; a file
    /// system that refuses it gets buffered writes).
    pub fn cache_direct_io(mut self, yes: bool) -> Self {
        self.cache_direct_io = yes;
        self
    }

    #[doc(hidden)]
    /// Test hook: every cache write after this many fails with ENOSPC.
    pub fn cache_fail_writes_after(mut self, n: u64) -> Self {
        self.cache_fail_writes_after = Some(n);
        self
    }

    #[doc(hidden)]
    /// Test hook: a decoder panics on this tile ordinal.
    pub fn panic_on_tile(mut self, ordinal: u64) -> Self {
        self.panic_on_tile = Some(ordinal);
        self
    }

    /// Where each aligned mount's first sample sits on the root's sample axis, by mount name
    /// (reading both stores' coordinates for an alignment on one).
    fn mount_starts(
        &self,
        runtime: &Runtime,
        store: &MountedStore,
        hierarchy: &Hierarchy,
        sampled: &[&Variable],
    ) -> Result<HashMap<String, (StoreAxis, Between)>, EngineError> {
        let mount_of = |v: &Variable| -> Option<String> {
            let (m, _) = v.geom.path.split_once('/')?;
            self.mounts
                .iter()
                .any(|mount| mount.name == m)
                .then(|| m.to_string())
        };
        let mut starts = HashMap::new();
        for (name, alignment) in &self.alignments {
            if !self.mounts.iter().any(|m| &m.name == name) {
                let mounted: Vec<&str> = self.mounts.iter().map(|m| m.name.as_str()).collect();
                return Err(EngineError::arg(
                    "mounts",
                    name,
                    format!(
                        "an alignment names no mount; the mounts are {mounted:?} (mount the \
                         store first)"
                    ),
                ));
            }
            if starts.contains_key(name) {
                return Err(EngineError::arg(
                    "mounts",
                    name,
                    "this mount is aligned twice; give it one alignment",
                ));
            }
            let between = Between::of(alignment);
            let start = match alignment {
                MountAlignment::Samples(k) => StoreAxis::starting_at(*k),
                MountAlignment::Coordinate(dim)
                | MountAlignment::Containing(dim)
                | MountAlignment::Nearest(dim) => {
                    // Its first variable's coordinate against the root's first variable's.
                    let Some(mounted) = sampled.iter().find(|v| mount_of(v).as_ref() == Some(name))
                    else {
                        // Nothing is read from it.
                        starts.insert(name.clone(), (StoreAxis::ROOT, Between::Skipped));
                        continue;
                    };
                    let root = sampled
                        .iter()
                        .find(|v| mount_of(v).is_none())
                        .map(|v| (v.geom.path.as_str(), v.geom.n_samples()));
                    crate::coords::mount_start(
                        runtime,
                        store,
                        hierarchy,
                        (name, dim),
                        root,
                        (&mounted.geom.path, mounted.geom.n_samples()),
                        between != Between::Skipped,
                    )?
                }
            };
            starts.insert(name.clone(), (start, between));
        }
        Ok(starts)
    }

    fn check_knobs(&self) -> Result<(), EngineError> {
        // (name, value, most allowed with the reason): a bound on what one knob can make the
        // engine spawn or allocate.
        let knobs = [
            ("batch_size", Some(self.batch_size), None),
            ("block_chunks", Some(self.block_chunks), None),
            (
                "max_inflight",
                self.max_inflight,
                Some((
                    MAX_INFLIGHT,
                    "every read in flight has a fetcher task and a buffer of its own, and local \
                     storage gains nothing past a few dozen per core",
                )),
            ),
            ("prefetch_depth", Some(self.prefetch_depth), None),
            (
                "executor_threads",
                self.executor_threads,
                Some((
                    MAX_EXECUTOR_THREADS,
                    "an executor is a thread with an IO ring of its own, meant one per core",
                )),
            ),
        ];
        for (name, v, most) in knobs {
            let Some(v) = v else { continue };
            let hint = match most {
                _ if v == 0 => "must be at least 1".to_string(),
                Some((most, why)) if v > most => format!("at most {most}: {why}"),
                _ => continue,
            };
            return Err(EngineError::InvalidArgument {
                name,
                value: v.to_string(),
                hint,
            });
        }
        if let Some(bad) = self
            .drop_last
            .iter()
            .find(|s| !SPLITS.contains(&s.as_str()))
        {
            return Err(EngineError::arg(
                "drop_last",
                bad,
                "is not a split; name some of train, val, test and all",
            ));
        }
        let Shard { rank, world_size } = self.shard;
        if world_size == 0 {
            return Err(EngineError::arg(
                "world_size",
                0,
                "must be at least 1 (the number of ranks training together; 1 for one process)",
            ));
        }
        if rank >= world_size {
            return Err(EngineError::arg(
                "rank",
                rank,
                format!("must be below world_size = {world_size} (ranks count from 0)"),
            ));
        }
        if self
            .cache_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            // An empty path would put the cache in the working directory, where nobody meant it.
            return Err(EngineError::arg(
                "cache_dir",
                "\"\"",
                "is empty; give a directory on local NVMe (or no cache_dir for none)",
            ));
        }
        if self.cache_dir.is_none() {
            let needs_dir = [
                ("persist", self.persist),
                ("reset_stale_cache", self.reset_stale_cache),
                ("readonly_cache", self.readonly_cache),
            ];
            if let Some((name, _)) = needs_dir.iter().find(|(_, on)| *on) {
                return Err(EngineError::InvalidArgument {
                    name,
                    value: "true".into(),
                    hint: "it needs a cache_dir; set cache_dir to a directory on local NVMe".into(),
                });
            }
        }
        if self.memory_limit_bytes == Some(0) {
            return Err(EngineError::InvalidArgument {
                name: "memory_limit_bytes",
                value: "0".into(),
                hint: "leave it unset for all this process may use, or give a positive byte \
                       count"
                    .into(),
            });
        }
        if self.cache_budget_bytes == Some(0) {
            return Err(EngineError::InvalidArgument {
                name: "cache_budget_bytes",
                value: "0".into(),
                hint: "leave it unset for the working set, or give a positive byte count".into(),
            });
        }
        Ok(())
    }

    /// This process's share of every split when `world_size` processes train together
    /// (data-parallel ranks, as in torch DDP): each split's chunk list is cut into `world_size`
    /// contiguous runs of near-equal rows and rank `rank` takes the `rank`-th, the same every
    /// epoch, so that each rank reads and caches only its part (a window reaches into the next
    /// rank's chunks only at the end of a run) and the ranks together cover the split. Every rank must be given the
    /// same store, variables, manifest and seed. `train` is cut to the length of the shortest
    /// rank's share, so that every rank takes the same number of steps (the rows left out, within
    /// two chunks' worth per rank, are in the pass's `trimmed_rows` and differ every epoch);
    /// `val`, `test` and `all` yield every sample once across the ranks, and their lengths may
    /// differ by as much between ranks. Default `(0, 1)`: the whole split.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Self {
        self.shard = Shard { rank, world_size };
        self
    }

    /// Whether a sharded `train` stops at the shortest rank's share (default true: ranks that
    /// all-reduce every step must take the same number of steps). `false` yields a rank's whole
    /// share, as `insitubatch warm` does so that a readonly cache holds every chunk a rank's
    /// shuffled epochs may draw.
    pub fn even_train(mut self, yes: bool) -> Self {
        self.even_train = yes;
        self
    }

    /// Whether every split's epoch leaves out its last batch when it would be short (default
    /// false): every batch then has `batch_size` rows, as a compiled model with static shapes
    /// (`torch.compile`, JAX `jit`, XLA) wants, and an epoch is ⌊samples / batch_size⌋
    /// batches. The rows left out are the last of the epoch's order, so which they are
    /// changes every shuffled epoch; chunks that only they draw from are not read. A split
    /// with fewer samples than `batch_size` is then an error when iterated. For some splits
    /// only (static shapes for training, every sample for validation), see
    /// [`DatasetBuilder::drop_last_splits`].
    pub fn drop_last(mut self, yes: bool) -> Self {
        self.drop_last = match yes {
            true => SPLITS.iter().map(|s| s.to_string()).collect(),
            false => Vec::new(),
        };
        self
    }

    /// [`DatasetBuilder::drop_last`] for the named splits only (`"train"`, `"val"`, `"test"`,
    /// `"all"`), the others keeping their short last batch: train a compiled model on full
    /// batches and still validate on every sample. An unknown name is an error at `build`.
    pub fn drop_last_splits<S: AsRef<str>>(mut self, splits: &[S]) -> Self {
        self.drop_last = splits.iter().map(|s| s.as_ref().to_string()).collect();
        self
    }

    /// Sets an object-store option (`aws_endpoint`, `aws_region`, `google_service_account`,
    /// `azure_storage_account_name`, `timeout`, ...: the `object_store` crate's configuration
    /// keys), applied after the environment's; and insitubatch's own `client_threads`, the
    /// threads that drive the store's requests (1 to 64; default one per 8 cores, 2 to 8).
    /// Only for URL roots; given for a local directory it is refused when the dataset is built.
    pub fn storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage_options.push((key.into(), value.into()));
        self
    }

    /// Sets several object-store options (see [`storage_option`](Self::storage_option)).
    pub fn storage_options(mut self, options: &[(String, String)]) -> Self {
        self.storage_options.extend(options.iter().cloned());
        self
    }

    /// Mounts the store at `location` (a directory or a URL, as for the dataset's root) as the
    /// group `name` of the dataset's store: its array `tp` is then the array `"{name}/tp"`
    /// (`.variable("y", "targets/tp")`), read from that store. For variables that live in two
    /// stores on the same sample axis (inputs from one archive, targets from another); their
    /// lengths along it must be equal, as for any two variables, unless the mount is placed on
    /// the root's sample axis with [`align_mount`](Self::align_mount). A name the root store
    /// already uses is refused when the dataset is built.
    pub fn mount(self, name: impl Into<String>, location: impl AsRef<Path>) -> Self {
        self.mount_with(name, location, &[])
    }

    /// [`mount`](Self::mount) with object-store options for that store alone (the root's
    /// [`storage_option`](Self::storage_option)s are not applied to it).
    pub fn mount_with(
        mut self,
        name: impl Into<String>,
        location: impl AsRef<Path>,
        storage_options: &[(String, String)],
    ) -> Self {
        self.mounts.push(Mount {
            name: name.into(),
            location: location.as_ref().to_path_buf(),
            storage_options: storage_options.to_vec(),
        });
        self
    }

    /// Places the samples of the store mounted as `name` on the sample axis of the dataset's
    /// store, for stores that cover different times (inputs from 1979 on, targets from 2000
    /// on): with [`MountAlignment::Coordinate`]`("time")` the two stores' `time` coordinates are
    /// matched value for value; with [`MountAlignment::Samples`]`(k)` the mounted store's first
    /// sample is the root's sample `k`. An anchor then reads the sample of each store at the
    /// same place on the axis (each batch's `read_indices` give every label's own index), the
    /// mounted arrays may be shorter or longer than the root's, and the anchors at which some
    /// variable would read outside its array are dropped (counted in the stats' dropped
    /// anchors): an epoch covers the samples the stores share, [`InSituDataset::anchor_range`].
    /// To leave the rest out of the splits, give `split_by_chunk` that range as its
    /// `sample_range`. On a coordinate, the mounted store may step at another rate (both CF
    /// times stepping evenly): daily targets beside 6-hourly inputs are read at every fourth
    /// anchor, and the [`sample_stride`](Self::sample_stride) must draw just those; with
    /// [`MountAlignment::Containing`] every anchor reads the day holding its time instead.
    /// Refused
    /// when the dataset is built: a name that is not mounted, a coordinate missing or not
    /// rising in either store, stores that share no value, part somewhere or step unevenly at
    /// different rates, a stride that draws anchors between two samples of a store, and an
    /// alignment under which no anchor reads inside every array.
    pub fn align_mount(mut self, name: impl Into<String>, alignment: MountAlignment) -> Self {
        self.alignments.push((name.into(), alignment));
        self
    }

    /// Makes the variable `label` (added before, by any method) read sample `index[anchor]` of
    /// its array's sample axis at each anchor, instead of the anchor's own: a climatology of
    /// 366 days read at each sample's day of year (`index[a]` = day of year of anchor `a`,
    /// from 0), a monthly mean at its month, a diurnal cycle at its hour
    /// ([`cycle_index`](crate::cycle_index) makes such an index from a CF time coordinate,
    /// [`coordinate_values`](crate::coordinate_values)). One entry per anchor
    /// (each sample of the manifest's array), each below the array's length. It takes no part
    /// in which anchors are valid or in the equal-length rule; each of its chunks is read once a
    /// pass and kept from its first use to its last (the pool counts it in the working set).
    /// Refused when the dataset is built: an index of another length, an entry past the
    /// array, a label that is not a variable, a static field, a window offset.
    pub fn index(mut self, label: impl Into<String>, index: impl Into<Arc<[u64]>>) -> Self {
        self.indexes.push((label.into(), index.into()));
        self
    }

    /// Appends a chunk transform for every array: it runs on each decoded chunk before the pool
    /// holds it, so it is paid once per chunk and cached with it (see
    /// [`insitubatch_actors::transform`]). Transforms run in the order they were added.
    pub fn chunk_transform(mut self, transform: impl ChunkTransform + 'static) -> Self {
        self.chunk_transforms.push(None, Arc::new(transform));
        self
    }

    /// Appends a chunk transform for the arrays at `paths` only (array paths, not labels: two
    /// labels of one array share its chunks and so its transforms).
    pub fn chunk_transform_for<P: Into<String>>(
        mut self,
        paths: impl IntoIterator<Item = P>,
        transform: impl ChunkTransform + 'static,
    ) -> Self {
        let paths = paths.into_iter().map(Into::into).collect();
        self.chunk_transforms.push(Some(paths), Arc::new(transform));
        self
    }

    /// Appends the built-in chunk transforms of a JSON list (`[{"type": "affine", "offset":
    /// -273.15, "applies": ["t2m"]}, ...]`; see [`insitubatch_actors::transform`]), after those
    /// added so far. Checked when the dataset is built.
    pub fn chunk_transforms_json(mut self, json: impl Into<String>) -> Self {
        // Parsed now, so the list keeps the order the builder's calls gave; an error waits for
        // `build`.
        if let Err(e) = self.chunk_transforms.extend_from_json(&json.into()) {
            self.chunk_transforms_error.get_or_insert(e);
        }
        self
    }

    /// Appends a list of chunk transforms with their scopes.
    pub fn chunk_transforms(mut self, transforms: &ChunkTransforms) -> Self {
        self.chunk_transforms.extend(transforms);
        self
    }

    /// Stacks `labels` as the channels of one batch array `name`, shaped `(batch,
    /// labels.len(), *sample_inner)`, in the order given, in place of their own arrays: the
    /// gather writes each label's samples straight into its channel, so a model that takes
    /// variables as channels gets them without a copy. The labels must have the same sample
    /// shape and dtype as batches hold them (after their chunk transforms); a label may be in
    /// one stack only, and `name` may not be another label or stack. Checked when the dataset
    /// is built.
    ///
    /// ```
    /// use insitubatch::synth::{SynthSpec, field_value, make_dataset};
    /// use insitubatch::{InSituDataset, coordinate_values};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("isb-stack-doc-{}", std::process::id()));
    /// # let store = dir.join("era5.zarr");
    /// # make_dataset(&store, &SynthSpec { samples: 24, grid: (9, 16), sample_chunk: 4,
    /// #     ..Default::default() }, true, &|_, _| {})?;
    /// // The field at t - 6 h and at t, and the wind at t, as the three channels of `x`.
    /// let ds = InSituDataset::builder(&store)
    ///     .window("t2m_prev", "t2m", -1)
    ///     .variable("t2m", "t2m")
    ///     .variable("u10", "u10")
    ///     .window("target", "t2m", 1)
    ///     .stack("x", ["t2m_prev", "t2m", "u10"])
    ///     .batch_size(8)
    ///     .build()?;
    /// // The sample axis's coordinate: each sample's time, in hours since 1979-01-01.
    /// let hours = coordinate_values(&store, "t2m", None, 0, &[])?;
    /// for batch in ds.train()? {
    ///     let batch = batch?;
    ///     assert_eq!(batch.names(), ["x", "target"]);
    ///     let x = batch.array("x").unwrap();
    ///     assert_eq!(x.shape(), [batch.len(), 3, 9, 16]);
    ///     // Channel 1 of the first row is t2m at that row's sample, as stored.
    ///     let s = batch.sample_indices()[0];
    ///     let t2m: Vec<f32> = (0..9)
    ///         .flat_map(|i| (0..16).map(move |j| field_value(0, s, i, j, (9, 16))))
    ///         .collect();
    ///     let values: &[f32] = x.values().unwrap();
    ///     assert_eq!(values[9 * 16..2 * 9 * 16], t2m[..]);
    ///     // The first target is valid 6 h after its row's sample.
    ///     let t = batch.read_indices("target").unwrap()[0] as usize;
    ///     let valid_at = i64::from_ne_bytes(hours.bytes[8 * t..8 * t + 8].try_into()?);
    ///     assert_eq!(valid_at, 6 * s as i64 + 6);
    /// }
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn stack<L: Into<String>>(
        mut self,
        name: impl Into<String>,
        labels: impl IntoIterator<Item = L>,
    ) -> Self {
        self.stacks
            .push((name.into(), labels.into_iter().map(Into::into).collect()));
        self
    }

    /// Cut a patch of `shape` from every sample instead of carrying it whole: a window over
    /// the samples' last `shape.len()` axes (the axes before them stay whole), at an origin
    /// drawn per row, the same for every label of the row (inputs, targets, windows, static
    /// fields and stacks stay co-registered). Rows are shaped `(*leading axes, *shape)`, and
    /// [`Batch::patch_origins`](insitubatch_actors::Batch::patch_origins) says where each was
    /// cut. Origins are uniform over every place the window fits, drawn from (seed, epoch,
    /// anchor) for the train split (so they move every epoch) and from (seed, anchor) for the
    /// others (a validation patch is the same every epoch). With one sample per chunk and a
    /// field stored as several chunks (or a shard of inner chunks), a row reads only the
    /// stored chunks under its window (several patches of a sample, the chunks under any of
    /// them, each once); otherwise whole samples are read and cached, and the patch is cut
    /// when a row is copied into its batch. One patch per sample by default:
    /// [`patches_per_sample`](Self::patches_per_sample) draws several, and
    /// [`patch_grid`](Self::patch_grid) tiles the field. Checked when the dataset is built:
    /// every label's last `shape.len()` axes (after their chunk transforms) must have one
    /// extent, at least the patch's.
    ///
    /// ```
    /// use insitubatch::synth::{SynthSpec, field_value, make_dataset};
    /// use insitubatch::InSituDataset;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("isb-patch-doc-{}", std::process::id()));
    /// # let store = dir.join("era5.zarr");
    /// # make_dataset(&store, &SynthSpec { samples: 24, grid: (18, 36), sample_chunk: 4,
    /// #     ..Default::default() }, true, &|_, _| {})?;
    /// // 8 × 8 patches of the 18 × 36 field, the target cut where its input was.
    /// let ds = InSituDataset::builder(&store)
    ///     .variable("t2m", "t2m")
    ///     .window("target", "t2m", 1)
    ///     .patch([8, 8])
    ///     .batch_size(4)
    ///     .build()?;
    /// for batch in ds.train()? {
    ///     let batch = batch?;
    ///     let x = batch.array("t2m").unwrap();
    ///     assert_eq!(x.shape(), [batch.len(), 8, 8]);
    ///     // Row 0's patch starts at (i0, j0) of its sample's field.
    ///     let (s, origin) = (batch.sample_indices()[0], &batch.patch_origins().unwrap()[..2]);
    ///     let (i0, j0) = (origin[0], origin[1]);
    ///     let values: &[f32] = x.values().unwrap();
    ///     assert_eq!(values[8 + 3], field_value(0, s, i0 + 1, j0 + 3, (18, 36)));
    ///     let target: &[f32] = batch.array("target").unwrap().values().unwrap();
    ///     assert_eq!(target[8 + 3], field_value(0, s + 1, i0 + 1, j0 + 3, (18, 36)));
    /// }
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn patch(self, shape: impl Into<Vec<u64>>) -> Self {
        let shape = shape.into();
        let wrap = vec![false; shape.len()];
        self.patch_wrapping(shape, wrap)
    }

    /// [`patch`](Self::patch) with periodic axes: where `wrap` (one flag per patched axis)
    /// says an axis is periodic (longitude on a global grid), a window may start anywhere
    /// along it and run across its end, continuing from its start. Checked when the dataset
    /// is built (`wrap` has the patch's length).
    pub fn patch_wrapping(
        mut self,
        shape: impl Into<Vec<u64>>,
        wrap: impl Into<Vec<bool>>,
    ) -> Self {
        self.patch = Some(Patch {
            shape: shape.into(),
            wrap: wrap.into(),
            origins: Origins::Random(1),
        });
        self
    }

    /// Cut `n` patches from every sample, each a row of its own at an origin drawn apart
    /// (from (seed, epoch, anchor, k) in train): a chunk read and decoded once gives `n` times
    /// the rows. Each (sample, patch) is drawn once per epoch and an epoch has `n` times the
    /// rows; an anchor's patches are shuffled within its block like any rows. Needs a
    /// [`patch`](Self::patch); `n` is at least 1 (the default). A chunk decoded into rows is
    /// cut into all of its samples' patches from one decoded copy. With one sample per chunk
    /// and a field stored as several chunks, a sample reads the stored chunks under any of its
    /// `n` windows, each once, and copies each into every patch it is under (a shard of inner
    /// chunks is read whole for them; one patch per sample reads only the inner chunks under
    /// it).
    pub fn patches_per_sample(mut self, n: u64) -> Self {
        self.patch_origins = Some(Origins::Random(n));
        self
    }

    /// Tile every sample's field with patches on a grid, each a row of its own: origins every
    /// `stride` (one per patched axis, from 1 to the patch's extent; the patch's shape tiles
    /// without overlap, a smaller stride overlaps) from 0, the last along an axis moved back
    /// so that its window ends at the field's end, or along a periodic axis starting before
    /// the end and running across it. Every element of the field is in some patch, and the
    /// origins are the same in every epoch and split: what inference over a large field
    /// needs, stitching each prediction back at its row's
    /// [`patch_origins`](insitubatch_actors::Batch::patch_origins). Patch `k` of a sample is
    /// the grid's `k`-th in C order (the last axis fastest). Needs a [`patch`](Self::patch).
    ///
    /// ```
    /// use insitubatch::synth::{SynthSpec, field_value, make_dataset};
    /// use insitubatch::InSituDataset;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("isb-grid-doc-{}", std::process::id()));
    /// # let store = dir.join("era5.zarr");
    /// # make_dataset(&store, &SynthSpec { samples: 8, grid: (18, 36), sample_chunk: 4,
    /// #     ..Default::default() }, true, &|_, _| {})?;
    /// // 8 × 16 tiles of the 18 × 36 field: 3 × 3 of them per sample, the last row and column
    /// // moved back to end at the field's edge; stitched back, they give every field whole.
    /// let ds = InSituDataset::builder(&store)
    ///     .variable("t2m", "t2m")
    ///     .patch([8, 16])
    ///     .patch_grid([8, 16])
    ///     .shuffle(false)
    ///     .batch_size(6)
    ///     .build()?;
    /// let mut fields = vec![vec![f32::NAN; 18 * 36]; 8];
    /// for batch in ds.train()? {
    ///     let batch = batch?;
    ///     let values: &[f32] = batch.array("t2m").unwrap().values().unwrap();
    ///     let origins = batch.patch_origins().unwrap();
    ///     for (r, &s) in batch.sample_indices().iter().enumerate() {
    ///         let (i0, j0) = (origins[2 * r] as usize, origins[2 * r + 1] as usize);
    ///         for i in 0..8 {
    ///             for j in 0..16 {
    ///                 fields[s as usize][(i0 + i) * 36 + j0 + j] = values[(r * 8 + i) * 16 + j];
    ///             }
    ///         }
    ///     }
    /// }
    /// for (s, field) in fields.iter().enumerate() {
    ///     for (at, &v) in field.iter().enumerate() {
    ///         assert_eq!(v, field_value(0, s as u64, (at / 36) as u64, (at % 36) as u64, (18, 36)));
    ///     }
    /// }
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub fn patch_grid(mut self, stride: impl Into<Vec<u64>>) -> Self {
        self.patch_origins = Some(Origins::Grid(stride.into()));
        self
    }

    /// Opens the store, resolves the variables and validates everything.
    pub fn build(self) -> Result<InSituDataset, EngineError> {
        self.check_knobs()?;
        let stride = Stride::new(self.sample_stride.0, self.sample_stride.1)?;
        let decode_into_batches = match self.decode_into_batches {
            Some(mode) => mode,
            None => into_rows_from_env()?,
        };
        crate::allocator::fit_to_address_space();
        let store = open_mounted(&self.root, &self.storage_options, &self.mounts)?;
        let mut rb = RuntimeBuilder::new().io_backend(self.io_backend);
        if let Some(n) = self.executor_threads {
            rb = rb.executor_threads(n);
        }
        let runtime = rb
            .build()
            .map_err(|e| EngineError::Runtime(e.to_string()))?;
        let hierarchy = load_hierarchy(&runtime, &store)?;
        let axis = self.sample_axis;
        let mut variables: Vec<Variable> = Vec::new();
        if self.variables.is_empty() {
            for (path, g) in open_geometries(&hierarchy, None, axis)? {
                variables.push(Variable::new(path, g));
            }
        }
        for spec in &self.variables {
            match spec {
                VarSpec::Path {
                    label,
                    path,
                    offset,
                    region,
                    static_field,
                } => {
                    let mut g = geometry_of(&hierarchy, path, axis, *static_field)?.shift(*offset);
                    match region {
                        Some(Crop::Plain(r)) => g = g.crop(r)?,
                        Some(Crop::Wrapping(r)) => g = g.crop_wrapping(r)?,
                        None => {}
                    }
                    variables.push(Variable::new(label.clone(), g));
                }
                VarSpec::Geometry { label, geom } => {
                    let g =
                        geometry_of(&hierarchy, &geom.path, geom.sample_axis, geom.static_field)?;
                    if g.shape != geom.shape || g.chunks != geom.chunks || g.dtype != geom.dtype {
                        return Err(EngineError::arg(
                            "variables",
                            format!("{label} = {}", geom.path),
                            format!(
                                "the geometry given (shape {:?}, chunks {:?}) is not the array's \
                                 (shape {:?}, chunks {:?}); take it from open_geometries on this store",
                                geom.shape, geom.chunks, g.shape, g.chunks
                            ),
                        ));
                    }
                    // A region that came as JSON is checked against the array here (in its
                    // normal form, a range that wraps ends past its axis).
                    let g = match &geom.region {
                        Some(r) => {
                            let signed: Vec<(i64, i64)> = r
                                .iter()
                                .map(|&(lo, hi)| {
                                    (
                                        lo.min(i64::MAX as u64) as i64,
                                        hi.min(i64::MAX as u64) as i64,
                                    )
                                })
                                .collect();
                            geom.crop_wrapping(&signed)?
                        }
                        None => geom.clone(),
                    };
                    variables.push(Variable::new(label.clone(), g));
                }
            }
        }
        for (i, v) in variables.iter().enumerate() {
            if variables[..i].iter().any(|w| w.label == v.label) {
                return Err(EngineError::arg(
                    "variables",
                    &v.label,
                    "labels must be unique; give each view its own label",
                ));
            }
            if let Some(w) = variables[..i]
                .iter()
                .find(|w| w.geom.path == v.geom.path && w.geom.static_field != v.geom.static_field)
            {
                return Err(EngineError::arg(
                    "variables",
                    format!("{} and {}", w.label, v.label),
                    format!(
                        "both read array `{}`, one as a static field and one sampled along its \
                         sample axis; an array is one or the other in a dataset",
                        v.geom.path
                    ),
                ));
            }
            let other_region = variables[..i]
                .iter()
                .find(|w| w.geom.path == v.geom.path && w.geom.region != v.geom.region);
            if let Some(w) = other_region {
                let show = |r: &Option<Vec<(u64, u64)>>| match r {
                    Some(r) => format!("{r:?}"),
                    None => "the whole field".to_string(),
                };
                return Err(EngineError::arg(
                    "variables",
                    format!("{} and {}", w.label, v.label),
                    format!(
                        "both read array `{}`, one {} and one {}; views of one array share its \
                         decoded chunks, so they must read the same region (crop both alike, or \
                         read the other region through a second dataset)",
                        v.geom.path,
                        show(&w.geom.region),
                        show(&v.geom.region)
                    ),
                ));
            }
        }
        for (label, index) in &self.indexes {
            let Some(v) = variables.iter_mut().find(|v| &v.label == label) else {
                return Err(EngineError::arg(
                    "indexes",
                    label,
                    "an index names no variable; add the variable first, then its index",
                ));
            };
            if v.index.is_some() || v.geom.static_field || v.geom.offset != 0 {
                return Err(EngineError::arg(
                    "indexes",
                    label,
                    "an indexed variable reads its index's sample at each anchor: it cannot \
                     also be a static field, be shifted by a window offset, or be indexed twice",
                ));
            }
            v.index = Some(Arc::clone(index));
        }
        // A sample of an array with an empty field axis holds nothing (and has no stored chunk
        // to wait for, so a pass would never fill a batch).
        if let Some(v) = variables.iter().find(|v| v.geom.inner_shape().contains(&0)) {
            return Err(EngineError::arg(
                "variables",
                &v.label,
                format!(
                    "array `{}` has shape {:?}: an axis other than the sample axis is empty, so \
                     a sample holds nothing; leave it out of the variables",
                    v.geom.path, v.geom.shape
                ),
            ));
        }
        // Static fields have no sample axis, and indexed variables read their own: the other
        // sampled variables set its length.
        let sampled: Vec<&Variable> = variables
            .iter()
            .filter(|v| !v.reads_every_anchor())
            .collect();
        let Some(&first) = sampled.first() else {
            return Err(EngineError::arg(
                "variables",
                variables
                    .iter()
                    .map(|v| v.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                "every variable is a static field or indexed; a dataset needs one sampled along \
                 its sample axis, which sets the samples its batches draw",
            ));
        };
        // Where each aligned mount sits on the root's sample axis (and what an anchor between
        // two of its samples reads); the arrays of one store (of the root and the mounts
        // without an alignment together) share a length.
        let starts = self.mount_starts(&runtime, &store, &hierarchy, &sampled)?;
        let start_of = |path: &str| -> Option<(StoreAxis, Between)> {
            let (mount, _) = path.split_once('/')?;
            starts.get(mount).copied()
        };
        let group = |v: &Variable| -> Option<String> {
            start_of(&v.geom.path)?;
            v.geom.path.split_once('/').map(|(m, _)| m.to_string())
        };
        for (i, v) in sampled.iter().enumerate() {
            let same = sampled[..i].iter().find(|w| group(w) == group(v));
            if let Some(w) = same
                && w.geom.n_samples() != v.geom.n_samples()
            {
                return Err(EngineError::UnequalSampleAxis {
                    a: w.label.clone(),
                    a_len: w.geom.n_samples(),
                    b: v.label.clone(),
                    b_len: v.geom.n_samples(),
                });
            }
        }
        let manifest = match self.manifest {
            Some(mut m) => {
                // A manifest made from a geometry opened on a mounted store names the array by
                // its path in that store: it is the mounted array when no array of the root
                // has that path and one mount has (validated against it as any manifest is).
                if !variables.iter().any(|v| v.geom.path == m.array) {
                    let mounted: Vec<String> = self
                        .mounts
                        .iter()
                        .map(|mount| format!("{}/{}", mount.name, m.array))
                        .filter(|p| variables.iter().any(|v| &v.geom.path == p))
                        .collect();
                    if let [path] = &mounted[..] {
                        m.array = path.clone();
                    }
                }
                let reference = sampled.iter().find(|v| v.geom.path == m.array);
                match reference {
                    Some(v) => m.validate(&v.geom)?,
                    None => {
                        return Err(EngineError::ManifestMismatch {
                            manifest_array: m.array.clone(),
                            manifest_shape: m.shape.clone(),
                            manifest_chunks: m.chunks.clone(),
                            manifest_axis: m.sample_axis,
                            found: format!(
                                "variables over [{}]",
                                variables
                                    .iter()
                                    .map(|v| v.geom.path.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        });
                    }
                }
                m
            }
            None => split_by_chunk(&first.geom, &[1.0], self.seed, true, None)?,
        };
        // An index has one entry per anchor, each a sample of its array.
        for v in variables.iter().filter(|v| v.index.is_some()) {
            check_index(v, manifest.n_samples())?;
        }
        // Anchors are samples of the manifest's array: every other store is read where it sits
        // against that array's store.
        if !starts.is_empty() {
            let aligned: Vec<&str> = self.alignments.iter().map(|(n, _)| n.as_str()).collect();
            place_on_anchors(
                &mut variables,
                &manifest,
                stride,
                &start_of,
                &aligned.join(", "),
            )?;
        }
        let arrays: HashMap<String, _> = variables
            .iter()
            .map(|v| (v.geom.path.clone(), hierarchy.arrays[&v.geom.path].clone()))
            .collect();
        if let Some(e) = self.chunk_transforms_error {
            return Err(e);
        }
        let transforms = self.chunk_transforms.pipelines(
            &variables
                .iter()
                .map(|v| (v.geom.path.clone(), (v.geom.inner_shape(), v.geom.dtype)))
                .collect(),
        )?;
        // Batches, the pool and the cache hold what the transforms make of each sample.
        let variables: Vec<Variable> = variables
            .into_iter()
            .map(|v| {
                let p = &transforms[&v.geom.path];
                let (inner, dtype) = (p.output_inner().to_vec(), p.output_dtype());
                v.with_sample(inner, dtype)
            })
            .collect();
        let patch = match (self.patch, self.patch_origins) {
            (Some(patch), Some(origins)) => Some(Patch { origins, ..patch }),
            (None, Some(origins)) => {
                let (name, value) = match origins {
                    Origins::Random(n) => ("patches_per_sample", n.to_string()),
                    Origins::Grid(stride) => ("patch_grid", format!("{stride:?}")),
                };
                return Err(EngineError::arg(
                    name,
                    value,
                    "places the patches of each sample, and no patch is set: give one (for \
                     example patch [64, 64])",
                ));
            }
            (patch, None) => patch,
        };
        let variables = patched(variables, patch.as_ref())?;
        let variables = stacked(variables, &self.stacks)?;
        let per_executor = if store.is_remote() {
            DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR
        } else {
            DEFAULT_INFLIGHT_PER_EXECUTOR
        };
        let max_inflight = self
            .max_inflight
            .unwrap_or(per_executor * runtime.executor_threads());
        let budget = match self.cache_budget_bytes {
            Some(b) => Budget::Bytes(b),
            None => Budget::Auto,
        };
        let disk = match &self.cache_dir {
            Some(dir) => Some(DiskTier::open(
                CacheConfig {
                    dir: dir.clone(),
                    persist: self.persist,
                    readonly: self.readonly_cache,
                    reset_stale: self.reset_stale_cache,
                    direct_io: self.cache_direct_io,
                    fail_writes_after: self.cache_fail_writes_after,
                },
                cache_arrays(&variables, &transforms),
            )?),
            None => None,
        };
        let ctx = Arc::new(EngineContext {
            runtime: runtime.handle(),
            store: Arc::new(store),
            arrays,
            transforms,
            pool: ChunkPool::with_disk(budget, disk),
            inflight: Semaphore::new("max_inflight", max_inflight as u64),
            buffers: BufferPool::new(),
            // One per read in flight, plus one per executor for reads being decoded.
            read_buffers: Recycler::new(max_inflight + runtime.executor_threads()),
            memory_limit: MemoryLimit::with_given(memory_limit(), self.memory_limit_bytes),
        });
        let ds = InSituDataset {
            root: self.root,
            storage_options: self.storage_options,
            mounts: self.mounts,
            runtime: Arc::new(runtime),
            ctx,
            variables,
            manifest,
            batch_size: self.batch_size,
            block_chunks: self.block_chunks,
            fast_first_batch: self.fast_first_batch,
            prefetch_next_epoch: self.prefetch_next_epoch,
            stride,
            prefetch_depth: self.prefetch_depth,
            seed: self.seed,
            shuffle: self.shuffle,
            on_bad_chunk: self.on_bad_chunk,
            decode_into_batches,
            panic_on_tile: self.panic_on_tile,
            shard: self.shard,
            even_train: self.even_train,
            drop_last: self.drop_last,
            epoch: AtomicU64::new(0),
            warnings: Mutex::new(Vec::new()),
            ahead: Arc::new(Mutex::new(AheadSlot::default())),
            ahead_warned: AtomicBool::new(false),
            ahead_after: Mutex::new(AheadTrigger::default()),
            last_train_epoch: Mutex::new(None),
        };
        ds.collect_warnings();
        Ok(ds)
    }
}

/// The fingerprint of what an array's cached chunks hold: the log format, the field region
/// read (when cropped), and every chunk-transform step's full identity (its kind and
/// parameters, never a hash of its source), so that any change to it makes them stale.
fn array_fingerprint(pipeline: Option<&Pipeline>, region: Option<&[(u64, u64)]>) -> String {
    let mut ids: Vec<String> = region
        .map(|r| vec![format!("region {r:?}")])
        .unwrap_or_default();
    ids.extend(pipeline.map(Pipeline::identities).unwrap_or_default());
    insitubatch_pool::disk::fingerprint(&ids.iter().map(String::as_str).collect::<Vec<_>>())
}

/// What the cache directory needs to know about every array the dataset reads.
fn cache_arrays(variables: &[Variable], transforms: &HashMap<String, Pipeline>) -> Vec<ArrayMeta> {
    let mut out: Vec<ArrayMeta> = Vec::new();
    for v in variables {
        if out.iter().any(|a| a.path == v.geom.path) {
            continue;
        }
        let mut slot_shape = vec![v.geom.samples_per_chunk()];
        slot_shape.extend(&v.sample_inner);
        out.push(ArrayMeta {
            path: v.geom.path.clone(),
            slot_shape,
            descr: v.sample_dtype.npy_descr(),
            fingerprint: array_fingerprint(transforms.get(&v.geom.path), v.geom.region.as_deref()),
        });
    }
    out
}

/// Shuffled, split-aware batches from a Zarr store read in place: each stored chunk read and
/// decoded once per epoch, memory bounded by the pool budget, `prefetch_depth` batches and
/// `max_inflight` reads.
///
/// ```no_run
/// use insitubatch::{InSituDataset, split_by_chunk};
/// # fn main() -> Result<(), insitubatch::EngineError> {
/// // Every data variable of the group, all chunks in `train`:
/// let ds = InSituDataset::builder("era5.zarr").batch_size(64).build()?;
/// // Or a forecasting pair with an 80/10/10 split:
/// let probe = InSituDataset::builder("era5.zarr").variable("t2m", "t2m").build()?;
/// let manifest = split_by_chunk(&probe.variables()[0].geom, &[0.8, 0.1, 0.1], 0, true, None)?;
/// let ds = InSituDataset::builder("era5.zarr")
///     .variable("x", "t2m")
///     .window("y", "t2m", 6)
///     .manifest(manifest)
///     .build()?;
/// for epoch in 0..2 {
///     ds.set_epoch(epoch);
///     for batch in ds.train()? {
///         let batch = batch?;
///         let x: &[f32] = batch.array("x").unwrap().values().unwrap();
///         assert_eq!(x.len(), batch.len() * 181 * 360);
///     }
/// }
/// # Ok(()) }
/// ```
pub struct InSituDataset {
    root: PathBuf,
    storage_options: Vec<(String, String)>,
    mounts: Vec<Mount>,
    runtime: Arc<Runtime>,
    ctx: Arc<EngineContext<MountedStore>>,
    variables: Vec<Variable>,
    manifest: SplitManifest,
    batch_size: usize,
    block_chunks: usize,
    fast_first_batch: bool,
    prefetch_next_epoch: bool,
    stride: Stride,
    prefetch_depth: usize,
    seed: u64,
    shuffle: bool,
    on_bad_chunk: OnBadChunk,
    decode_into_batches: IntoRows,
    panic_on_tile: Option<u64>,
    shard: Shard,
    even_train: bool,
    drop_last: Vec<String>,
    epoch: AtomicU64,
    warnings: Mutex<Vec<String>>,
    /// The next epoch's train pass, started early (`prefetch_next_epoch`).
    ahead: Arc<Mutex<AheadSlot>>,
    /// A warning said that an early pass could not start.
    ahead_warned: AtomicBool,
    /// Which split's passes start train's next epoch early.
    ahead_after: Mutex<AheadTrigger>,
    /// The epoch train was last asked for: the early pass a pass of another split starts is
    /// the one after it.
    last_train_epoch: Mutex<Option<u64>>,
}

/// The split whose passes start train's next epoch early once they have loaded their last
/// chunk: train's own until a pass of another split has to drop an early pass to start
/// (validation between epochs that does not fit beside it), then that split's, so that the
/// early pass follows it instead of being dropped for it every epoch. A loop running several
/// splits between epochs (val, then test) has it followed to the last of them; a split that
/// drops it again after being followed (val twice between epochs), or a train pass that does,
/// turns it off: no split starts it any more.
struct AheadTrigger {
    /// `None` once turned off.
    split: Option<String>,
    /// The splits followed so far, in order.
    followed: Vec<String>,
}

impl Default for AheadTrigger {
    fn default() -> Self {
        Self {
            split: Some(TRAIN.to_string()),
            followed: Vec::new(),
        }
    }
}

/// Where an early train pass waits to be asked for. `closed` once the dataset is being
/// dropped, so that a hook firing late leaves nothing behind (an executor thread must never
/// drop a pass: it would wait for tasks that may be queued on itself).
#[derive(Default)]
struct AheadSlot {
    closed: bool,
    next: Option<Ahead>,
}

/// A train pass started before it was asked for: on a thread of its own, since starting a
/// pass waits, and the hook that starts it runs on an executor thread.
struct Ahead {
    /// The pass that started it, whose room in the chunk pool this one takes over as it is
    /// released (its pool iteration also says whose successor this is).
    predecessor: Predecessor,
    epoch: u64,
    /// The thread starting it, until it has been joined.
    thread: Option<std::thread::JoinHandle<Result<Pass, EngineError>>>,
    /// What the start gave, once joined.
    started: Option<Result<Pass, EngineError>>,
}

impl Ahead {
    fn join(
        thread: std::thread::JoinHandle<Result<Pass, EngineError>>,
    ) -> Result<Pass, EngineError> {
        thread.join().unwrap_or_else(|_| {
            Err(EngineError::Runtime(
                "the thread starting train's next epoch panicked".into(),
            ))
        })
    }

    /// Collects what the start gave if its thread has finished (without waiting).
    fn settle(&mut self) {
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            self.started = self.thread.take().map(Self::join);
        }
    }

    /// The pass, once started (or why it did not start).
    fn take(mut self) -> Result<Pass, EngineError> {
        if let Some(t) = self.thread.take() {
            self.started = Some(Self::join(t));
        }
        self.started
            .take()
            .expect("a start's outcome is kept until taken")
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        // Wait for a start in progress, so that nothing outlives the dataset; the pass it
        // gives stops here.
        if let Some(t) = self.thread.take() {
            drop(Self::join(t));
        }
    }
}

impl Drop for InSituDataset {
    fn drop(&mut self) {
        // The early pass holds the runtime; it goes first.
        let ahead = {
            let mut slot = lock(&self.ahead);
            slot.closed = true;
            slot.next.take()
        };
        drop(ahead);
    }
}

impl std::fmt::Debug for InSituDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InSituDataset")
            .field("variables", &self.variables)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl InSituDataset {
    /// A builder over the store at `root`: a local directory (NVMe or a parallel file system)
    /// or a URL (`s3://`, `gs://`, `az://`, `abfs://`, `http(s)://`) read through the
    /// object-store client, with credentials from the environment or
    /// [`DatasetBuilder::storage_option`].
    pub fn builder(root: impl AsRef<Path>) -> DatasetBuilder {
        DatasetBuilder {
            root: root.as_ref().to_path_buf(),
            variables: Vec::new(),
            sample_axis: 0,
            manifest: None,
            batch_size: DEFAULT_BATCH_SIZE,
            block_chunks: DEFAULT_BLOCK_CHUNKS,
            fast_first_batch: false,
            prefetch_next_epoch: false,
            sample_stride: (1, 0),
            max_inflight: None,
            prefetch_depth: DEFAULT_PREFETCH_DEPTH,
            seed: 0,
            shuffle: true,
            cache_budget_bytes: None,
            memory_limit_bytes: None,
            on_bad_chunk: OnBadChunk::Raise,
            executor_threads: None,
            io_backend: IoBackendChoice::Auto,
            decode_into_batches: None,
            panic_on_tile: None,
            cache_dir: None,
            persist: false,
            reset_stale_cache: false,
            readonly_cache: false,
            cache_direct_io: true,
            cache_fail_writes_after: None,
            shard: Shard::WHOLE,
            even_train: true,
            drop_last: Vec::new(),
            storage_options: Vec::new(),
            mounts: Vec::new(),
            alignments: Vec::new(),
            indexes: Vec::new(),
            chunk_transforms: ChunkTransforms::default(),
            stacks: Vec::new(),
            patch: None,
            patch_origins: None,
            chunk_transforms_error: None,
        }
    }

    /// Prints new cache-directory warnings to stderr (once each) and keeps them.
    fn collect_warnings(&self) {
        let Some(disk) = self.ctx.pool.disk() else {
            return;
        };
        let new = disk.take_warnings();
        for w in &new {
            eprintln!("insitubatch: warning: {w}");
        }
        lock(&self.warnings).extend(new);
    }

    /// Every warning the dataset raised so far (a network `cache_dir`, a failed cache write),
    /// each also printed to stderr once. Pass-level warnings are in [`PassStats::warnings`].
    ///
    /// [`PassStats::warnings`]: insitubatch_actors::PassStats::warnings
    pub fn warnings(&self) -> Vec<String> {
        self.collect_warnings();
        self.settle_ahead();
        lock(&self.warnings).clone()
    }

    /// The arrays every batch holds, in order: each label's own, and each stack (builder
    /// [`DatasetBuilder::stack`]) in the place of its first label.
    pub fn batch_arrays(&self) -> Vec<BatchArraySpec> {
        let vars = &self.variables;
        insitubatch_actors::batch_outputs(vars)
            .into_iter()
            .map(|o| {
                let first = &vars[o.labels[0]];
                BatchArraySpec {
                    labels: o.labels.iter().map(|&l| vars[l].label.clone()).collect(),
                    row_shape: o.row_shape.iter().map(|&d| d as u64).collect(),
                    dtype: first.sample_dtype,
                    stacked: first.stack.is_some(),
                    name: o.name,
                }
            })
            .collect()
    }

    /// The patch cut from every row ([`DatasetBuilder::patch`]); `None`: rows hold whole
    /// samples.
    pub fn patch(&self) -> Option<&Patch> {
        self.variables.first().and_then(|v| v.patch.as_deref())
    }

    /// The rows each sample gives: its patches ([`DatasetBuilder::patches_per_sample`], or a
    /// [`DatasetBuilder::patch_grid`]'s count), 1 without a patch.
    pub fn patches_per_sample(&self) -> u64 {
        rows_per_anchor(&self.variables)
    }

    /// Counters of the cache directory (`None` without `cache_dir`).
    pub fn cache_stats(&self) -> Option<DiskStats> {
        self.ctx.pool.disk().map(|d| d.stats())
    }

    /// The cache directory's tier (`None` without `cache_dir`).
    pub fn cache_tier(&self) -> Option<&Arc<DiskTier>> {
        self.ctx.pool.disk()
    }

    /// The store's directory or URL.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The object-store options it was opened with.
    pub fn storage_options(&self) -> &[(String, String)] {
        &self.storage_options
    }

    /// The mounts as given to the builder (for tools that open the stores again).
    pub(crate) fn mount_specs(&self) -> &[Mount] {
        &self.mounts
    }

    /// The anchors at which every sampled variable reads inside its array: samples of the
    /// manifest's array. All of them unless windows reach past an end, or aligned mounts
    /// ([`DatasetBuilder::align_mount`]) cover other times; an epoch's anchors outside are
    /// dropped (and counted). A `sample_range` for `split_by_chunk` that leaves them out of
    /// the splits.
    pub fn anchor_range(&self) -> std::ops::Range<u64> {
        valid_anchors(self.manifest.n_samples(), &reaches(&self.variables))
    }

    /// The stores mounted in the dataset's store: (name, location), in the order mounted.
    pub fn mounts(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.mounts
            .iter()
            .map(|m| (m.name.as_str(), m.location.as_path()))
    }

    /// Decoded bytes of every slot `split` reads at the current epoch: a `cache_budget_bytes`
    /// at least this large keeps the whole split resident, so later epochs are all hits.
    pub fn split_bytes(&self, split: &str) -> Result<u64, EngineError> {
        let order = self.order(split)?;
        let plan = insitubatch_actors::read_plan(
            &order,
            &self.variables,
            self.batch_size,
            self.release_each_block(split),
        )?;
        Ok(plan.slots.iter().map(|s| s.nbytes).sum())
    }

    /// The memory an iteration over `split` would hold at its peak, counted from its plan
    /// without reading anything: the working set, the pool's heap, the batches, the read
    /// buffers and the library's overhead, and beside them what the iterations running in this
    /// process now hold ([`MemoryNeed::others`]). Its [`MemoryNeed::total`] is what starting
    /// the iteration checks against this process's memory limit (the machine's, its cgroup's,
    /// `ulimit -v`), so it is the figure to size a job's memory by. Errors as starting an
    /// iteration would for an unknown or empty split.
    pub fn memory_need(&self, split: &str) -> Result<MemoryNeed, EngineError> {
        let (chunks, config) = self.plan_split(split)?;
        Pass::memory_need(
            &self.ctx,
            &self.variables,
            &chunks,
            self.manifest.samples_per_chunk(),
            self.manifest.n_samples(),
            &config,
        )
    }

    /// The variables (label and geometry with its offset), in declaration order.
    pub fn variables(&self) -> &[Variable] {
        &self.variables
    }

    /// The split manifest.
    pub fn manifest(&self) -> &SplitManifest {
        &self.manifest
    }

    /// Rows per batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The samples drawn along the sample axis ([`DatasetBuilder::sample_stride`]).
    pub fn sample_stride(&self) -> Stride {
        self.stride
    }

    /// Sets the epoch the next iteration draws (the order is keyed on (seed, epoch) only).
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::SeqCst);
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The IO backend in use.
    pub fn io_backend(&self) -> IoBackend {
        self.runtime.io_backend()
    }

    /// Stored-chunk reads allowed in flight (the `max_inflight` given, or the default for this
    /// many executor threads).
    pub fn max_inflight(&self) -> usize {
        self.ctx.inflight.total() as usize
    }

    /// Pool counters (residency, evictions, hits across passes).
    pub fn pool_stats(&self) -> PoolStats {
        self.ctx.pool.stats()
    }

    /// Batch buffers allocated so far: the most batches this dataset's iterations held at
    /// once, since buffers are reused (unless `INSITUBATCH_NO_BUFFER_REUSE` is set).
    pub fn batch_buffers_allocated(&self) -> u64 {
        self.ctx.buffers.allocated()
    }

    /// Drops every unpinned chunk from the pool (the next epoch starts cold).
    pub fn clear_cache(&self) {
        self.ctx.pool.clear_unpinned();
    }

    /// This rank's chunks of `split` and the configuration of a pass over them this epoch.
    fn plan_split(&self, split: &str) -> Result<(Vec<u64>, PassConfig), EngineError> {
        self.plan_split_at(split, self.epoch())
    }

    /// [`InSituDataset::plan_split`] at `epoch`.
    fn plan_split_at(
        &self,
        split: &str,
        epoch: u64,
    ) -> Result<(Vec<u64>, PassConfig), EngineError> {
        let (chunks, mut config) = self.plan_share(split, epoch)?;
        if !self.drop_last.iter().any(|s| s == split) {
            return Ok((chunks, config));
        }
        // Whole batches only: the order stops at the last multiple of batch_size it reaches.
        let (rows, _) = count_order_rows(
            &chunks,
            self.manifest.samples_per_chunk(),
            self.manifest.n_samples(),
            &self.variables,
            self.stride,
        );
        let rows = config.row_limit.map_or(rows, |limit| rows.min(limit));
        let bs = self.batch_size as u64;
        if rows > 0 && rows < bs {
            return Err(EngineError::arg(
                "drop_last",
                true,
                format!(
                    "an epoch of `{split}` has {rows} samples, fewer than batch_size {bs}, so \
                     dropping the short last batch leaves none; lower batch_size or set \
                     drop_last false"
                ),
            ));
        }
        config.row_limit = Some(rows / bs * bs);
        Ok((chunks, config))
    }

    /// The chunks of `split` this rank reads and its pass settings (ranks evened out).
    fn plan_share(&self, split: &str, epoch: u64) -> Result<(Vec<u64>, PassConfig), EngineError> {
        let all = self.manifest.split_chunks(split)?;
        let world_size = self.shard.world_size;
        if world_size == 1 {
            return Ok((all, self.pass_config(split, epoch, None)));
        }
        if all.len() < world_size {
            return Err(EngineError::arg(
                "world_size",
                world_size,
                format!(
                    "split `{split}` has {} chunks along the sample axis, fewer than the ranks, so \
                     rank {} would get none; use at most {} ranks for it, or split off more chunks",
                    all.len(),
                    world_size - 1,
                    all.len()
                ),
            ));
        }
        let (share, even) = rank_share(
            &all,
            self.shard,
            self.manifest.samples_per_chunk(),
            self.manifest.n_samples(),
            &self.variables,
            self.stride,
        );
        if even == 0 {
            // Refused on every rank alike, so that no rank waits for one that stopped.
            return Err(EngineError::arg(
                "world_size",
                world_size,
                format!(
                    "a rank's share of split `{split}` holds no sample once the windows drop the \
                     anchors that would read off the array; use fewer ranks"
                ),
            ));
        }
        let limit = (split == "train" && self.even_train).then_some(even);
        Ok((share, self.pass_config(split, epoch, limit)))
    }

    fn pass_config(&self, split: &str, epoch: u64, row_limit: Option<u64>) -> PassConfig {
        PassConfig {
            split: split.to_string(),
            epoch,
            seed: self.seed,
            shuffle: self.shuffle && split == "train",
            block_chunks: self.block_chunks,
            fast_first_batch: self.fast_first_batch,
            batch_size: self.batch_size,
            prefetch_depth: self.prefetch_depth,
            on_bad_chunk: self.on_bad_chunk,
            release_each_block: self.release_each_block(split),
            row_limit,
            start_batch: 0,
            decode_into_batches: self.decode_into_batches,
            stride: self.stride,
            panic_on_tile: self.panic_on_tile,
        }
    }

    /// The spec's rule: a shuffled pass over a persisted cache hands each block's chunks back
    /// as it drains and re-admits them from disk (only windowed views and variables chunked
    /// coarser than the reference grid read a chunk from blocks far apart, so only they change).
    fn release_each_block(&self, split: &str) -> bool {
        let persisted = self.ctx.pool.disk().is_some_and(|d| d.persist());
        persisted && self.shuffle && split == "train"
    }

    /// The order `split` would draw this epoch, without reading anything.
    pub fn order(&self, split: &str) -> Result<EpochOrder, EngineError> {
        let (chunks, config) = self.plan_split(split)?;
        plan_order(
            &chunks,
            self.manifest.samples_per_chunk(),
            self.manifest.n_samples(),
            &self.variables,
            &config,
        )
    }

    /// Samples one epoch of `split` yields: every valid anchor once (a windowed view drops the
    /// anchors that would read off the array). The same for every epoch; counted from the
    /// manifest's chunks without planning an order. Errors as starting an iteration would for an
    /// unknown or empty split.
    pub fn split_samples(&self, split: &str) -> Result<u64, EngineError> {
        let (chunks, config) = self.plan_split(split)?;
        let (rows, dropped) = count_order_rows(
            &chunks,
            self.manifest.samples_per_chunk(),
            self.manifest.n_samples(),
            &self.variables,
            self.stride,
        );
        if rows == 0 {
            return Err(EngineError::every_anchor_dropped(split, dropped));
        }
        Ok(config.row_limit.map_or(rows, |limit| rows.min(limit)))
    }

    /// Batches one epoch of `split` yields: ⌈samples / batch_size⌉, every batch full but the
    /// last (what `len()` of a loader means); with `drop_last`, ⌊samples / batch_size⌋ (and
    /// [`InSituDataset::split_samples`] counts only the rows they hold).
    pub fn split_batches(&self, split: &str) -> Result<u64, EngineError> {
        Ok(self.split_samples(split)?.div_ceil(self.batch_size as u64))
    }

    /// Starts an iteration over `split` (`train`, `val`, `test` or `all`) at the current
    /// epoch. Several may run at once (train and val zipped), sharing the pool.
    pub fn iter(&self, split: &str) -> Result<Pass, EngineError> {
        self.iter_from(split, 0)
    }

    /// Resumes the current epoch of `split` at batch `start_batch`: the batches it yields are
    /// batches `start_batch..` of a whole pass (the same samples in the same order; the order
    /// depends on the seed and epoch only), and the chunks that only earlier batches draw
    /// from are not read. For a job restarted mid-epoch from a checkpoint that saved
    /// (epoch, batches done). `start_batch` may be the epoch's batch count, which yields
    /// nothing; beyond it is an error naming `start_batch`.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), insitubatch::EngineError> {
    /// let ds = insitubatch::InSituDataset::builder("/data/era5.zarr").build()?;
    /// let (epoch, done) = (3, 120); // from the checkpoint
    /// ds.set_epoch(epoch);
    /// for batch in ds.iter_from("train", done)? {
    ///     let batch = batch?;
    ///     # let _ = batch;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn iter_from(&self, split: &str, start_batch: u64) -> Result<Pass, EngineError> {
        let epoch = self.epoch();
        let ahead = self.take_ahead(split, epoch, start_batch);
        let mut pass = match ahead {
            Some(mut pass) => {
                pass.handed_over();
                pass
            }
            None => self.start_pass(split, epoch, start_batch)?,
        };
        if split == TRAIN {
            *lock(&self.last_train_epoch) = Some(epoch);
        }
        if self.prefetch_next_epoch
            && let Some(next) = self.train_epoch_after(split, epoch)
        {
            self.start_train_early(&mut pass, next);
        }
        Ok(pass)
    }

    fn start_pass(&self, split: &str, epoch: u64, start_batch: u64) -> Result<Pass, EngineError> {
        let (chunks, mut config) = self.plan_split_at(split, epoch)?;
        config.start_batch = start_batch;
        let start = |config: PassConfig| {
            Pass::start(
                &self.ctx,
                &self.variables,
                &chunks,
                self.manifest.samples_per_chunk(),
                self.manifest.n_samples(),
                config,
            )
        };
        let pass = match start(config.clone()) {
            Ok(pass) => pass,
            Err(e) => {
                // An early train pass holds memory and pool budget it has no claim to beside
                // a pass the caller asks for: drop it and try once more.
                let Some(ahead) = lock(&self.ahead).next.take() else {
                    return Err(e);
                };
                let early = ahead.epoch;
                drop(ahead);
                let pass = start(config)?;
                self.ahead_was_displaced(early, split, &e);
                pass
            }
        };
        Ok(pass.keep_alive(Arc::clone(&self.runtime) as Arc<dyn std::any::Any + Send + Sync>))
    }

    /// The epoch of the train pass [`DatasetBuilder::prefetch_next_epoch`] started early that
    /// waits to be asked for: `None` while there is none, while it is still starting, and once
    /// it could not start (a warning in [`InSituDataset::warnings`] then says why).
    pub fn prefetched_epoch(&self) -> Option<u64> {
        self.settle_ahead();
        let slot = lock(&self.ahead);
        let next = slot.next.as_ref()?;
        matches!(next.started, Some(Ok(_))).then_some(next.epoch)
    }

    /// Collects the early pass's start if it has finished; one that failed is dropped and a
    /// warning says why.
    fn settle_ahead(&self) {
        let failed = {
            let mut slot = lock(&self.ahead);
            let Some(next) = slot.next.as_mut() else {
                return;
            };
            next.settle();
            if !matches!(next.started, Some(Err(_))) {
                return;
            }
            slot.next.take()
        };
        if let Some(ahead) = failed {
            let epoch = ahead.epoch;
            if let Err(e) = ahead.take() {
                self.warn_ahead_failed(epoch, &e);
            }
        }
    }

    /// The early train pass if it is the one asked for; an early pass of train that is not
    /// (another epoch, a resumed one) is dropped, one of nothing else is left waiting.
    fn take_ahead(&self, split: &str, epoch: u64, start_batch: u64) -> Option<Pass> {
        if split != TRAIN {
            return None;
        }
        let ahead = lock(&self.ahead).next.take()?;
        if ahead.epoch != epoch || start_batch != 0 {
            return None; // dropped here, stopping it
        }
        // Its loads wait for the room the epoch before still pins, which comes back only as
        // that epoch's batches are taken: handed over while they are not all taken (the
        // caller still holds that iterator), its consumer could wait on a consumer that never
        // comes. Then it is started as asked instead, as without `prefetch_next_epoch`.
        if self
            .ctx
            .pool
            .pinned_bytes(ahead.predecessor.owner())
            .is_some_and(|b| b > 0)
        {
            return None;
        }
        // A pass that could not start (memory, budget) is started again as asked, and fails
        // there with its own error if it still cannot.
        match ahead.take() {
            Ok(pass) => Some(pass),
            Err(e) => {
                self.warn_ahead_failed(epoch, &e);
                None
            }
        }
    }

    /// The train epoch a pass of `split` at `epoch` starts early once it has loaded its last
    /// chunk, if passes of `split` start one (`ahead_after`): train's next epoch after train's,
    /// and after another split's the epoch after the last one train was asked for (this epoch
    /// when none was), which is right both for validation after each epoch and before it.
    fn train_epoch_after(&self, split: &str, epoch: u64) -> Option<u64> {
        if lock(&self.ahead_after).split.as_deref() != Some(split) {
            return None;
        }
        if split == TRAIN {
            return epoch.checked_add(1);
        }
        match *lock(&self.last_train_epoch) {
            Some(e) => e.checked_add(1),
            None => Some(epoch),
        }
    }

    /// An early train pass (of epoch `early`) was dropped so that `split`'s pass could start
    /// (`e` says why they did not fit together). A loop that runs `split` between train's
    /// epochs would have it dropped every epoch, its first read-ahead loaded for nothing: from
    /// now on `split`'s passes start it, once they have loaded their last chunk, taking over
    /// their room. A split followed before (run twice between epochs), or train, turns it off
    /// instead ([`AheadTrigger`]). Each change is said once.
    fn ahead_was_displaced(&self, early: u64, split: &str, e: &EngineError) {
        let mut after = lock(&self.ahead_after);
        let follow =
            after.split.is_some() && split != TRAIN && !after.followed.iter().any(|f| f == split);
        let then = if follow {
            after.split = Some(split.to_string());
            after.followed.push(split.to_string());
            format!(
                "from now on train's next epoch starts once `{split}`'s iteration has loaded its \
                 last chunk, taking over its room, rather than being dropped for it every epoch"
            )
        } else {
            after.split = None;
            "from now on train's next epoch starts when asked, as without \
             prefetch_next_epoch, rather than being dropped every epoch"
                .to_string()
        };
        drop(after);
        let msg = format!(
            "prefetch_next_epoch: train's epoch {early} was started early and then dropped to \
             make room for `{split}`, which did not fit beside it ({e}); {then}. To have both at \
             once, raise cache_budget_bytes (or memory_limit_bytes)"
        );
        eprintln!("insitubatch: warning: {msg}");
        lock(&self.warnings).push(msg);
    }

    /// Says once per dataset why an early train pass did not start (the epoch then starts
    /// when asked, as without `prefetch_next_epoch`).
    fn warn_ahead_failed(&self, epoch: u64, e: &EngineError) {
        if self.ahead_warned.swap(true, Ordering::SeqCst) {
            return;
        }
        let msg = format!(
            "prefetch_next_epoch: train's epoch {epoch} could not start while the epoch before \
             it was running, so it started when asked (this is said once): {e}. It starts \
             beside every iteration running then: in the chunk pool it takes over the epoch \
             before's room, but needs its own beside another split's iteration, and it counts \
             against memory_limit_bytes beside them all; raise cache_budget_bytes or \
             memory_limit_bytes, or lower block_chunks"
        );
        eprintln!("insitubatch: warning: {msg}");
        lock(&self.warnings).push(msg);
    }

    /// Installs the hook that starts train's pass at epoch `next` once `pass` (train's, or that
    /// of the split a loop runs before train; `ahead_after`) has loaded every chunk it reads.
    /// The hook runs on an executor thread: it only spawns the thread that starts the pass, and
    /// it holds the runtime weakly (an executor must never drop it). A pass dropped before its
    /// last batch (a loop that broke out, an error) takes its successor with it, so that
    /// abandoning an iteration still frees everything.
    fn start_train_early(&self, pass: &mut Pass, next: u64) {
        let Ok((chunks, config)) = self.plan_split_at(TRAIN, next) else {
            return;
        };
        let ctx = Arc::clone(&self.ctx);
        let variables = self.variables.clone();
        let (spc, n) = (self.manifest.samples_per_chunk(), self.manifest.n_samples());
        let runtime = Arc::downgrade(&self.runtime);
        let slot = Arc::downgrade(&self.ahead);
        let predecessor = pass.as_predecessor();
        let ours = Weak::clone(&slot);
        pass.when_abandoned(Box::new(move || {
            let Some(slot) = ours.upgrade() else {
                return;
            };
            let mut held = lock(&slot);
            let successor = held
                .next
                .take_if(|a| a.predecessor.owner() == predecessor.owner());
            drop(held);
            drop(successor);
        }));
        pass.when_loaded(Box::new(move || {
            let Some(slot) = slot.upgrade() else {
                return;
            };
            let mut held = lock(&slot);
            if held.closed || held.next.is_some() {
                // The dataset is going, or another train pass's successor came first.
                return;
            }
            let start = move || {
                let runtime = runtime.upgrade().ok_or_else(|| {
                    EngineError::Runtime("the dataset was dropped before its next epoch".into())
                })?;
                Pass::start_after(&ctx, &variables, &chunks, spc, n, config, Some(predecessor))
                    .map(|p| p.keep_alive(runtime as Arc<dyn std::any::Any + Send + Sync>))
            };
            let thread = std::thread::Builder::new()
                .name("isb-next-epoch".into())
                .spawn(start);
            if let Ok(thread) = thread {
                held.next = Some(Ahead {
                    predecessor,
                    epoch: next,
                    thread: Some(thread),
                    started: None,
                });
            }
        }));
    }

    /// `iter("train")`: shuffled when `shuffle` is on.
    pub fn train(&self) -> Result<Pass, EngineError> {
        self.iter("train")
    }

    /// `iter("val")`: sequential.
    pub fn val(&self) -> Result<Pass, EngineError> {
        self.iter("val")
    }

    /// `iter("test")`: sequential.
    pub fn test(&self) -> Result<Pass, EngineError> {
        self.iter("test")
    }

    /// `iter("all")`: every chunk of the manifest's sample range, sequential.
    pub fn all(&self) -> Result<Pass, EngineError> {
        self.iter("all")
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Warnings and the early pass's slot: replaced whole, never left half-updated by a panic.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The geometry of array `path`: sampled along `sample_axis`, or a static field; an error
/// names an array the store does not have and lists those it has.
fn geometry_of(
    hierarchy: &Hierarchy,
    path: &str,
    sample_axis: usize,
    static_field: bool,
) -> Result<ArrayGeometry, EngineError> {
    let array = hierarchy.array(path)?;
    Ok(if static_field {
        ArrayGeometry::new_static(array)
    } else {
        ArrayGeometry::new(array, sample_axis)?
    })
}

/// Refuses the index of variable `v` unless it has one entry per anchor (`anchors`), each a
/// sample of its array.
fn check_index(v: &Variable, anchors: u64) -> Result<(), EngineError> {
    let Some(index) = &v.index else { return Ok(()) };
    let n = v.geom.n_samples();
    let why = if index.len() as u64 != anchors {
        format!(
            "the index has {} entries, but the dataset draws {anchors} anchors (samples of the \
             manifest's array): give one entry per anchor",
            index.len()
        )
    } else if let Some((a, s)) = index.iter().enumerate().find(|(_, s)| **s >= n) {
        format!(
            "the index reads sample {s} at anchor {a}, but `{}` has {n} samples along its \
             sample axis",
            v.geom.path
        )
    } else {
        return Ok(());
    };
    Err(EngineError::arg("indexes", &v.label, why))
}

/// Places each sampled variable's store against the anchors (samples of the manifest's
/// array), given where each aligned store sits on the root's axis and whether its anchors read
/// the sample whose period holds them (`place_of`, by array path); refuses placements under
/// which no anchor reads inside every array, or the anchors the sample stride draws fall
/// between two samples of a store at another rate.
fn place_on_anchors(
    variables: &mut [Variable],
    manifest: &SplitManifest,
    stride: Stride,
    place_of: &dyn Fn(&str) -> Option<(StoreAxis, Between)>,
    aligned: &str,
) -> Result<(), EngineError> {
    let (reference, _) = place_of(&manifest.array).unwrap_or((StoreAxis::ROOT, Between::Skipped));
    for v in variables.iter_mut().filter(|v| !v.reads_every_anchor()) {
        let (axis, between) = place_of(&v.geom.path).unwrap_or((StoreAxis::ROOT, Between::Skipped));
        let too_large = || {
            EngineError::arg(
                "mounts",
                aligned,
                format!(
                    "the place of `{}` on the anchors does not fit in 64 bits",
                    v.label
                ),
            )
        };
        let axis = match between {
            Between::Nearest => axis.nearest_as_before().ok_or_else(too_large)?,
            _ => axis,
        };
        let placement = Placement::between(reference, axis).ok_or_else(too_large)?;
        let placement = match between {
            Between::Skipped => placement,
            Between::Before | Between::Nearest => placement.rounding_down(),
        };
        v.placement = placement;
        if placement.containing {
            continue; // every anchor reads a sample
        }
        let every = stride.every;
        match v.placement.congruence() {
            None => {
                return Err(EngineError::arg(
                    "mounts",
                    aligned,
                    format!(
                        "no anchor (sample of `{}`) falls on a sample of `{}`: their times \
                         never meet",
                        manifest.array, v.label
                    ),
                ));
            }
            Some((m, r)) if !every.is_multiple_of(m) || stride.phase % m != r => {
                return Err(EngineError::arg(
                    "sample_stride",
                    format!("{every} (phase {})", stride.phase),
                    format!(
                        "`{}` has a sample at one anchor in {m} only (where its store's \
                         times meet the anchors'), those with anchor % {m} == {r}; draw only \
                         those: sample_stride a multiple of {m} with sample_phase % {m} == {r} \
                         (sample_stride {m}, sample_phase {r})",
                        v.label
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let valid = valid_anchors(manifest.n_samples(), &reaches(variables));
    if valid.is_empty() {
        let spans: Vec<String> = variables
            .iter()
            .filter(|v| !v.reads_every_anchor())
            .map(|v| {
                let r = v.reach().map.within(v.geom.n_samples());
                format!("`{}` {}..{}", v.label, r.start, r.end)
            })
            .collect();
        return Err(EngineError::arg(
            "mounts",
            aligned,
            format!(
                "aligned so, the variables share no anchor: on the sample axis of `{}` they \
                 cover {}; check the alignment",
                manifest.array,
                spans.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Where a mounted store's samples sit on the sample axis of the dataset's store
/// ([`DatasetBuilder::align_mount`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountAlignment {
    /// The mounted store's sample 0 is sample `k` of the dataset's store (negative: it starts
    /// `-k` samples before it).
    Samples(i64),
    /// Found by matching the coordinate arrays of this dimension (`"time"`) beside the first
    /// variable of each store, value for value: CF times as instants (so that `hours since
    /// 1979-01-01` meets `days since 1900-01-01`), other coordinates as numbers in the same
    /// `units`. Both must rise strictly, meet at a shared value and agree wherever both have
    /// one; CF times that each step evenly may step at different rates.
    Coordinate(String),
    /// As [`Coordinate`](Self::Coordinate), but every anchor reads the mounted store's last
    /// sample at or before its time (the day holding each hour, for days labelled at their
    /// start), not only the anchors whose time it has: no sample stride is needed. Both must be
    /// CF times stepping evenly; the times need not meet.
    Containing(String),
    /// As [`Containing`](Self::Containing), but every anchor reads the mounted store's sample
    /// nearest its time, the later of two equally near: for periods labelled at their middle
    /// (a daily mean stamped at noon is read at each hour from midnight to midnight). Both
    /// must be CF times stepping evenly; the times need not meet.
    Nearest(String),
}

/// What an anchor between two samples of an aligned mount reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Between {
    /// Nothing: only the anchors on a sample read it (the stride must draw just those).
    Skipped,
    /// The sample before it ([`MountAlignment::Containing`]).
    Before,
    /// The nearest sample, the later on a tie ([`MountAlignment::Nearest`]).
    Nearest,
}

impl Between {
    fn of(alignment: &MountAlignment) -> Self {
        match alignment {
            MountAlignment::Containing(_) => Self::Before,
            MountAlignment::Nearest(_) => Self::Nearest,
            MountAlignment::Samples(_) | MountAlignment::Coordinate(_) => Self::Skipped,
        }
    }
}

/// A store mounted as a group of the dataset's store ([`DatasetBuilder::mount`]).
#[derive(Clone, Debug)]
pub(crate) struct Mount {
    name: String,
    location: PathBuf,
    storage_options: Vec<(String, String)>,
}

/// The store at `root` with `mounts` mounted in it (nothing is read yet).
fn open_mounted(
    root: &Path,
    storage_options: &[(String, String)],
    mounts: &[Mount],
) -> Result<MountedStore, EngineError> {
    let mut store = MountedStore::new(AnyStore::open(root, storage_options)?);
    for m in mounts {
        // A store that does not open says so naming its own path or URL.
        let opened = AnyStore::open(&m.location, &m.storage_options)?;
        store.mount(&m.name, opened, &m.location.display().to_string())?;
    }
    Ok(store)
}

/// Reads the metadata of the store and of the stores mounted in it through `runtime`.
fn load_hierarchy(runtime: &Runtime, store: &MountedStore) -> Result<Hierarchy, EngineError> {
    let store = store.clone();
    runtime
        .block_on(move || async move { open_mounted_hierarchy(&store).await })
        .map_err(|e| EngineError::Runtime(e.to_string()))?
        .map_err(EngineError::from)
}

/// The store at `root` (with `mounts`), its metadata, and a one-thread runtime to read it with
/// (for tools that read outside a dataset: `geometries`, coordinates, the benchmark's ceilings).
pub(crate) fn open_store(
    root: &Path,
    storage_options: &[(String, String)],
    mounts: &[Mount],
) -> Result<(MountedStore, Hierarchy, Runtime), EngineError> {
    crate::allocator::fit_to_address_space();
    let store = open_mounted(root, storage_options, mounts)?;
    let runtime = RuntimeBuilder::new()
        .executor_threads(1)
        .build()
        .map_err(|e| EngineError::Runtime(e.to_string()))?;
    let hierarchy = load_hierarchy(&runtime, &store)?;
    Ok((store, hierarchy, runtime))
}

/// Geometries of the store at `root`: the data variables (coordinates and 0-D arrays skipped)
/// or exactly `variables`, keyed by array path, sampled along `sample_axis`.
pub fn geometries(
    root: impl AsRef<Path>,
    variables: Option<&[String]>,
    sample_axis: usize,
) -> Result<std::collections::BTreeMap<String, ArrayGeometry>, EngineError> {
    geometries_with(root, variables, sample_axis, &[])
}

/// [`geometries`] of a store opened with object-store options (see
/// [`DatasetBuilder::storage_option`]; refused for a local directory).
pub fn geometries_with(
    root: impl AsRef<Path>,
    variables: Option<&[String]>,
    sample_axis: usize,
    storage_options: &[(String, String)],
) -> Result<std::collections::BTreeMap<String, ArrayGeometry>, EngineError> {
    let (_, hierarchy, _) = open_store(root.as_ref(), storage_options, &[])?;
    Ok(open_geometries(&hierarchy, variables, sample_axis)?)
}

/// A geometry as JSON: `path`, `shape`, `chunks`, `dtype`, `sample_axis`, `offset`,
/// `region` (`null` for the whole field), `n_samples`, `samples_per_chunk`, `inner_shape`
/// (what the C ABI and the Python shim show).
pub fn geometry_json(g: &ArrayGeometry) -> serde_json::Value {
    // A static field reports the array's own axes: the sample axis in front of them is the
    // geometry's alone, and it has no samples.
    let axes = usize::from(g.static_field);
    let mut v = serde_json::json!({
        "region": g.region,
        "path": g.path,
        "shape": g.shape[axes..],
        "chunks": g.chunks[axes..],
        "dtype": g.dtype.name(),
        "sample_axis": g.sample_axis,
        "offset": g.offset,
        "n_samples": g.n_samples(),
        "samples_per_chunk": g.samples_per_chunk(),
        "inner_shape": g.inner_shape(),
    });
    if g.static_field {
        v["static"] = true.into();
        for key in ["sample_axis", "n_samples", "samples_per_chunk"] {
            v[key] = serde_json::Value::Null;
        }
    }
    v
}

/// A pass's memory need as JSON, beside the limit it is checked against (what `insitubatch
/// memory --json`, the C ABI and the Python shim show): `total_bytes`, `working_set_bytes`,
/// `pool_bytes`, `cache_budget_bytes` (`null` unless a budget above the working set sizes the
/// pool), `batch_bytes`, `batches`, `rows_batches` (of `batches`, those chunks decoded straight
/// into batch rows fill ahead of the gather), `read_bytes` (read buffers, and with a `cache_dir`
/// the slot files being written), `others_bytes` (what the `other_passes`
/// iterations running in this process as it asks hold beside this one; `total_bytes` and
/// `fits` count it), `overhead_bytes`, `limit_bytes` and `limit_source` (`machine`, `cgroup`,
/// `ulimit -v`, `memory_limit_bytes`; `null` when nothing says), `fits`, and
/// `process_rss_bytes`: this process's resident memory as it asks. Asked before any pass, that
/// is the host (an interpreter, a framework, a model) which a job's memory must hold beside the
/// need; after passes it also holds what the allocator kept of theirs.
pub fn memory_need_json(need: &MemoryNeed) -> serde_json::Value {
    let limit = need.limit;
    serde_json::json!({
        "total_bytes": need.total(),
        "working_set_bytes": need.working_set,
        "pool_bytes": need.pool,
        "cache_budget_bytes": need.cache_budget,
        "batch_bytes": need.batch_bytes,
        "batches": need.batches,
        "rows_batches": need.rows_batches,
        "read_bytes": need.reads,
        "others_bytes": need.others,
        "other_passes": need.other_passes,
        "overhead_bytes": need.overhead(),
        "limit_bytes": limit.map(|l| l.bytes),
        "limit_source": limit.map(|l| l.source.name()),
        "fits": need.fits(),
        "process_rss_bytes": crate::enginebench::rss_bytes(),
    })
}
