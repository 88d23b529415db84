//! The `insitubatch` command.

// glibc's per-thread arenas hand freed chunk-sized buffers back to the kernel and fault them in
// again on the next allocation; mimalloc keeps them. Measured in docs/benchmarks.md ("Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use insitubatch::check_transform::{check_transform, transforms_arg};
use insitubatch::enginebench::{
    EpochReport, compare_with_ceilings, peak_rss_bytes, run_epoch_with_step,
};
use insitubatch::inspect::{human_bytes, inspect};
use insitubatch::readbench::bench_read;
use insitubatch::runtime::{Runtime, RuntimeBuilder};
use insitubatch::synth::{Codec, SynthSpec, make_dataset};
use insitubatch::{
    DatasetBuilder, EngineError, InSituDataset, MountAlignment, SampleBound, Snap, SplitManifest,
    split_by_chunk, split_by_ranges,
};

#[derive(Parser)]
#[command(
    name = "insitubatch",
    version,
    about = "Read-once, sample-once batches from Zarr arrays read in place"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Arrays read beside the sampled `--variables` other than at each anchor: static fields and
/// cycle-indexed climatologies.
#[derive(clap::Args, Debug)]
struct FieldArgs {
    /// A static field, `LABEL=ARRAY` (`orog=orography`): the array whole in every row, beside
    /// the sampled variables (it may be a label of a --stack); repeat it for several. `warm`
    /// caches the ones the readers will read (a readonly reader's miss is an error).
    #[arg(long = "static", value_name = "LABEL=ARRAY", value_parser = key_value)]
    statics: Vec<(String, String)>,
    /// A variable read at each sample's place in a calendar cycle, `LABEL=ARRAY:CYCLE`
    /// (`clim=t2m_clim:dayofyear`; cycles `dayofyear`, `month`, `hour`): a climatology beside
    /// the sampled variables, indexed by the time coordinate of the first of --variables (or of
    /// the manifest's array), read from the store it lives in (a --mount's for `NAME/...`, unless
    /// --align-mount places that store at other times); it may be a label of a --stack. Repeat
    /// it for several.
    #[arg(long = "cycle", value_name = "LABEL=ARRAY:CYCLE", value_parser = parse_cycle)]
    cycles: Vec<(String, String, insitubatch::Cycle)>,
    /// A window of a sampled variable, `LABEL=ARRAY:SHIFT` (`t2m_next=t2m:1`): the array's
    /// sample SHIFT steps after each anchor (before it, negative), cropped like --variables and
    /// cut from the same patch; anchors whose window would read off the array are dropped.
    /// Repeat it for several.
    #[arg(
        long = "window",
        value_name = "LABEL=ARRAY:SHIFT",
        value_parser = parse_window,
        allow_hyphen_values = true
    )]
    windows: Vec<(String, String, i64)>,
}

impl FieldArgs {
    /// `b` with these fields, after the sampled `variables` (which they need: without them the
    /// dataset would read every data variable, these arrays too).
    fn apply(
        &self,
        mut b: DatasetBuilder,
        (at, mounts): (&StoreAt, &MountArgs),
        variables: Option<&[String]>,
        region: &RegionArgs,
        manifest: Option<&SplitManifest>,
    ) -> Result<DatasetBuilder, Box<dyn std::error::Error>> {
        if !self.statics.is_empty() {
            if variables.is_none() {
                return Err(
                    "--static needs --variables: the sampled variables beside the static fields"
                        .into(),
                );
            }
            if region.region.is_some() || region.coords.is_some() {
                return Err(
                    "--static reads whole arrays; with --region or --coords, crop static fields \
                     through the library (cropped_static)"
                        .into(),
                );
            }
            for (label, path) in &self.statics {
                b = b.static_variable(label, path);
            }
        }
        if !self.windows.is_empty() && variables.is_none() {
            return Err(
                "--window needs --variables: the sampled variables beside their windows".into(),
            );
        }
        for (label, array, shift) in &self.windows {
            b = region.view(b, at, (label, array, *shift))?;
        }
        if self.cycles.is_empty() {
            return Ok(b);
        }
        let Some(first) = variables.and_then(|v| v.first()) else {
            return Err(
                "--cycle needs --variables: the sampled variables whose time coordinate \
                        indexes the cycle"
                    .into(),
            );
        };
        // Each cycle of the time coordinate of the anchors' array: the manifest's, else the
        // first of `variables`, from the store it lives in.
        let reference = manifest.map_or_else(|| first.clone(), |m| m.array.clone());
        let times = match mounts.locate(&reference) {
            Some((name, ..)) if mounts.aligned(name) => {
                return Err(format!(
                    "--cycle indexes each sample by the time of `{reference}`, the first of \
                     --variables, but --align-mount places store `{name}` on this store's \
                     samples at other times; put a variable of this store first in --variables"
                )
                .into());
            }
            // A mount's own options are none (`MountArgs::apply`).
            Some((_, store, path)) => {
                insitubatch::coordinate_values(Path::new(store), path, None, at.sample_axis, &[])?
            }
            None => insitubatch::coordinate_values(
                at.path,
                &reference,
                None,
                at.sample_axis,
                at.storage_options,
            )?,
        };
        for (label, array, cycle) in &self.cycles {
            let index = insitubatch::cycle_index(&times, *cycle)?;
            b = b.variable(label, array).index(label, index);
        }
        Ok(b)
    }
}

/// `LABEL=ARRAY:CYCLE` (`clim=t2m_clim:dayofyear`).
fn parse_cycle(s: &str) -> Result<(String, String, insitubatch::Cycle), String> {
    let form = "LABEL=ARRAY:CYCLE (clim=t2m_clim:dayofyear)";
    let (label, array, cycle) = label_array_and(s, form)?;
    Ok((label, array, cycle.parse()?))
}

/// `LABEL=ARRAY:REST` split in three (`form` says what was expected when it is not).
fn label_array_and<'a>(s: &'a str, form: &str) -> Result<(String, String, &'a str), String> {
    let (label, rest) = split_dim(s, form)?;
    let (array, tail) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("`{s}` is not {form}"))?;
    Ok((label, array.trim().to_string(), tail.trim()))
}

/// `LABEL=ARRAY:SHIFT` (`t2m_next=t2m:1`).
fn parse_window(s: &str) -> Result<(String, String, i64), String> {
    let form = "LABEL=ARRAY:SHIFT (t2m_next=t2m:1)";
    let (label, array, shift) = label_array_and(s, form)?;
    let shift = shift
        .parse()
        .map_err(|_| format!("the shift of `{s}` is not a whole number of samples ({form})"))?;
    Ok((label, array, shift))
}

/// `insitubatch warm`'s arguments.
#[derive(clap::Args)]
struct WarmArgs {
    /// Store directory.
    path: PathBuf,
    /// The cache directory (local NVMe; one per source and version).
    #[arg(long)]
    cache_dir: PathBuf,
    /// Split manifest (default: every chunk).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Split to warm: train, val, test or all.
    #[arg(long, default_value = "all")]
    split: String,
    /// Variables (comma-separated; default: every data variable). Warm the variables
    /// the readers will use: a readonly reader's miss is an error.
    #[arg(long, value_delimiter = ',')]
    variables: Option<Vec<String>>,
    /// The sample axis.
    #[arg(long, default_value_t = 0)]
    sample_axis: usize,
    /// Warm only a region of every variable's field, exactly what the readers will crop: the
    /// region is part of the cache fingerprint.
    #[command(flatten)]
    region: RegionArgs,
    /// Delete and rebuild arrays whose cached chunks are stale.
    #[arg(long)]
    reset_stale_cache: bool,
    /// Chunk transforms, cached with the chunks: a JSON list (or `@FILE`), exactly what the
    /// readers will pass (the cache fingerprint must match theirs).
    #[arg(long, value_name = "JSON")]
    chunk_transforms: Option<String>,
    #[command(flatten)]
    fields: FieldArgs,
    #[command(flatten)]
    mounts: MountArgs,
    #[command(flatten)]
    store: StoreOptions,
    // One rank's share of the split (each rank needs a cache directory of its own), all of
    // it: also the rows a train pass leaves out to even the ranks, which differ every epoch.
    #[command(flatten)]
    ranks: RankArgs,
}

/// Object-store configuration for a store given as a URL.
#[derive(clap::Args, Clone, Default)]
struct StoreOptions {
    /// An object-store option (`aws_endpoint=http://minio:9000`, `aws_region=eu-west-1`,
    /// `google_service_account=...`: the object_store crate's keys), applied after the
    /// environment's; repeat it for several. Refused for a local directory.
    #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = key_value)]
    storage_options: Vec<(String, String)>,
}

/// Parses `KEY=VALUE`.
fn key_value(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!(
            "`{arg}` is not KEY=VALUE (for example aws_region=eu-west-1)"
        )),
    }
}

/// Data-parallel ranks: which share of each split this process reads.
#[derive(clap::Args, Clone, Copy)]
struct RankArgs {
    /// This process's rank among `--world-size` data-parallel ranks: it reads the rank-th of
    /// the contiguous runs, of near-equal rows, that the split's chunks are cut into
    #[arg(long, default_value_t = 0)]
    rank: usize,
    /// The number of data-parallel ranks sharing each split.
    #[arg(long, default_value_t = 1)]
    world_size: usize,
}

/// An epoch's order as `insitubatch order` prints it: JSON, or a header and one line per block.
fn render_order(
    split: &str,
    epoch: u64,
    order: &insitubatch::EpochOrder,
    json: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let samples = order.anchors();
    let ends: Vec<usize> = order.blocks.iter().map(|b| b.end).collect();
    if json {
        let v = serde_json::json!({
            "split": split,
            "epoch": epoch,
            "samples": samples,
            "block_ends": ends,
            "dropped_anchors": order.dropped_anchors,
            "trimmed_rows": order.trimmed_rows,
        });
        return Ok(serde_json::to_string(&v)? + "\n");
    }
    let mut out = format!(
        "epoch {epoch} of split `{split}`: {} samples in {} blocks ({} anchors dropped by \
         windows, {} rows trimmed for ranks)\n",
        samples.len(),
        ends.len(),
        order.dropped_anchors,
        order.trimmed_rows
    );
    for (k, rows) in order.blocks.iter().enumerate() {
        let line: Vec<String> = samples[rows.clone()].iter().map(u64::to_string).collect();
        out += &format!(
            "block {k} (rows {}..{}): {}\n",
            rows.start,
            rows.end,
            line.join(" ")
        );
    }
    Ok(out)
}

/// A dataset and the pass over it that `bench`, `memory` and `order` run or plan.
#[derive(clap::Args)]
struct PassArgs {
    /// Store directory or URL.
    path: PathBuf,
    /// Split manifest (default: every chunk in train).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Split to iterate.
    #[arg(long, default_value = "train")]
    split: String,
    /// Variables (comma-separated; default: every data variable).
    #[arg(long, value_delimiter = ',')]
    variables: Option<Vec<String>>,
    /// The sample axis.
    #[arg(long, default_value_t = 0)]
    sample_axis: usize,
    /// Read only a region of every variable's field.
    #[command(flatten)]
    region: RegionArgs,
    /// Rows per batch.
    #[arg(long, default_value_t = insitubatch::DEFAULT_BATCH_SIZE)]
    batch_size: usize,
    /// Chunks per shuffle block.
    #[arg(long, default_value_t = insitubatch::DEFAULT_BLOCK_CHUNKS)]
    block_chunks: usize,
    /// Start each shuffled epoch with a block of one batch's chunks, doubling up to
    /// --block-chunks: the first batch waits for those alone, at the cost of mixing fewer chunks
    /// in the epoch's first batches.
    #[arg(long)]
    fast_first_batch: bool,
    /// Start the next epoch's train pass once this one has loaded every chunk it reads, so that
    /// the next epoch's first batch is ready when it is asked for (with --accelerator-ms: the
    /// model step waits for no first block).
    #[arg(long)]
    prefetch_next_epoch: bool,
    /// Draw every N-th sample along the sample axis (6 from hourly data: 6-hourly samples).
    #[arg(long, default_value_t = 1)]
    sample_stride: u64,
    /// The first sample drawn with --sample-stride (below it).
    #[arg(long, default_value_t = 0)]
    sample_phase: u64,
    /// Stored-chunk reads in flight (default: 4 per executor thread).
    #[arg(long)]
    max_inflight: Option<usize>,
    /// Batches assembled ahead of the consumer.
    #[arg(long, default_value_t = insitubatch::DEFAULT_PREFETCH_DEPTH)]
    prefetch_depth: usize,
    /// Pool budget in bytes (default: the working set); `split` = the whole split, so
    /// epochs after the first are all hits.
    #[arg(long)]
    cache_budget_bytes: Option<String>,
    /// The memory the library may hold when a pass starts (default: all this process may use).
    #[arg(long)]
    memory_limit_bytes: Option<u64>,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sequential order.
    #[arg(long)]
    no_shuffle: bool,
    /// Leave out an epoch's last batch when it would be short.
    #[arg(long)]
    drop_last: bool,
    /// Put the pool's slots in files under this directory (the NVMe tier).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Keep and log the cache_dir files (a later run revives them).
    #[arg(long, requires = "cache_dir")]
    persist: bool,
    /// Read a cache another job warmed; a miss is an error.
    #[arg(long, requires = "cache_dir")]
    readonly_cache: bool,
    /// Write cache files through the page cache instead of O_DIRECT.
    #[arg(long, requires = "cache_dir")]
    buffered_cache_writes: bool,
    /// Chunk transforms: a JSON list (or `@FILE`).
    #[arg(long, value_name = "JSON")]
    chunk_transforms: Option<String>,
    /// Stack labels as the channels of one batch array, `NAME=LABEL,LABEL,...` (`x=t2m,u10`:
    /// batches hold `x` shaped (batch, 2, *field)); repeat it for several stacks.
    #[arg(long = "stack", value_name = "NAME=LABELS", value_parser = parse_stack)]
    stacks: Vec<(String, Vec<String>)>,
    /// Cut a patch of this shape from the last axes of every sample, `64x64` (one extent per
    /// patched axis), at an origin drawn per row (new every epoch in train).
    #[arg(long, value_name = "NxM", value_parser = parse_patch)]
    patch: Option<PatchShape>,
    /// The axes of --patch that are periodic (longitude on a global grid), comma-separated
    /// from 0: a window may run across their end (`1` for the second of `64x64`).
    #[arg(long, value_name = "AXES", requires = "patch", value_delimiter = ',')]
    patch_wrap: Vec<usize>,
    /// Cut this many patches of --patch from every sample, each a row of its own: an epoch
    /// has that many times the rows from the same chunks.
    #[arg(
        long,
        value_name = "N",
        requires = "patch",
        conflicts_with = "patch_grid"
    )]
    patches_per_sample: Option<u64>,
    /// Tile every field with patches of --patch on a grid of this stride (`64x64` for the
    /// patch's own shape: no overlap), the same origins every epoch.
    #[arg(long, value_name = "NxM", requires = "patch", value_parser = parse_patch)]
    patch_grid: Option<PatchShape>,
    #[command(flatten)]
    fields: FieldArgs,
    #[command(flatten)]
    mounts: MountArgs,
    #[command(flatten)]
    ranks: RankArgs,
    #[command(flatten)]
    store: StoreOptions,
}

/// Stores mounted as groups of the dataset's store, and where each sits on its sample axis.
#[derive(clap::Args, Debug)]
struct MountArgs {
    /// Mount another store as a group of this one, `NAME=STORE` (`targets=/data/targets.zarr`:
    /// its array `tp` is the variable `targets/tp`); repeat it for several.
    #[arg(long = "mount", value_name = "NAME=STORE", value_parser = key_value)]
    mounts: Vec<(String, String)>,
    /// Place a mounted store that covers other times on this store's sample axis: `NAME=time`
    /// matches the two stores' `time` coordinates, `NAME=containing:time` has every sample read
    /// the mounted store's last sample at or before its time (a day's for each hour),
    /// `NAME=nearest:time` the sample nearest its time (the later on a tie), `NAME=K`
    /// says it starts at this store's sample K (negative: before it); the anchors outside what
    /// both cover are dropped.
    #[arg(long = "align-mount", value_name = "NAME=DIM|K", value_parser = key_value)]
    aligns: Vec<(String, String)>,
}

impl MountArgs {
    /// The mount a dataset path `NAME/...` lives in: its name, its store and the path there;
    /// `None` for a path of the root store.
    fn locate<'a>(&'a self, path: &'a str) -> Option<(&'a str, &'a str, &'a str)> {
        let (name, rest) = path.split_once('/')?;
        let (name, store) = self.mounts.iter().find(|(n, _)| n == name)?;
        Some((name, store, rest))
    }

    /// Whether --align-mount places mount `name` at other times.
    fn aligned(&self, name: &str) -> bool {
        self.aligns.iter().any(|(n, _)| n == name)
    }

    fn apply(&self, mut b: DatasetBuilder) -> DatasetBuilder {
        for (name, store) in &self.mounts {
            b = b.mount(name, store);
        }
        for (name, at) in &self.aligns {
            let alignment = if let Ok(k) = at.parse::<i64>() {
                MountAlignment::Samples(k)
            } else if let Some(dim) = at.strip_prefix("containing:") {
                MountAlignment::Containing(dim.to_string())
            } else if let Some(dim) = at.strip_prefix("nearest:") {
                MountAlignment::Nearest(dim.to_string())
            } else {
                MountAlignment::Coordinate(at.clone())
            };
            b = b.align_mount(name, alignment);
        }
        b
    }
}

/// `NAME=LABEL,LABEL,...` (`x=t2m,u10`).
fn parse_stack(s: &str) -> Result<(String, Vec<String>), String> {
    let (name, labels) = split_dim(s, "NAME=LABEL,LABEL,... (x=t2m,u10)")?;
    Ok((
        name,
        labels.split(',').map(|l| l.trim().to_string()).collect(),
    ))
}

/// A patch's extents (`--patch`; a type of its own, so that clap takes it as one value).
#[derive(Clone, Debug)]
struct PatchShape(Vec<u64>);

/// `64x64` (one extent per patched axis, `x`-separated).
fn parse_patch(s: &str) -> Result<PatchShape, String> {
    s.split('x')
        .map(|d| d.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map(PatchShape)
        .map_err(|_| format!("`{s}` is not a patch shape such as 64x64"))
}

impl PassArgs {
    /// The dataset with pool budget `budget` (default: the working set).
    fn dataset(&self, budget: Option<u64>) -> Result<InSituDataset, Box<dyn std::error::Error>> {
        let mut b = InSituDataset::builder(&self.path)
            .sample_axis(self.sample_axis)
            .batch_size(self.batch_size)
            .block_chunks(self.block_chunks)
            .fast_first_batch(self.fast_first_batch)
            .prefetch_next_epoch(self.prefetch_next_epoch)
            .sample_stride(self.sample_stride, self.sample_phase)
            .prefetch_depth(self.prefetch_depth)
            .seed(self.seed)
            .shuffle(!self.no_shuffle)
            .drop_last(self.drop_last)
            .shard(self.ranks.rank, self.ranks.world_size)
            .storage_options(&self.store.storage_options);
        b = self.mounts.apply(b);
        if let Some(n) = self.max_inflight {
            b = b.max_inflight(n);
        }
        let at = StoreAt {
            path: &self.path,
            sample_axis: self.sample_axis,
            storage_options: &self.store.storage_options,
        };
        for v in self.variables.iter().flatten() {
            b = self.region.view(b, &at, (v, v, 0))?;
        }
        let manifest = self
            .manifest
            .as_ref()
            .map(|m| SplitManifest::load(m))
            .transpose()?;
        b = self.fields.apply(
            b,
            (&at, &self.mounts),
            self.variables.as_deref(),
            &self.region,
            manifest.as_ref(),
        )?;
        if let Some(m) = manifest {
            b = b.manifest(m);
        }
        if let Some(bytes) = budget {
            b = b.cache_budget_bytes(bytes);
        }
        if let Some(bytes) = self.memory_limit_bytes {
            b = b.memory_limit_bytes(bytes);
        }
        if let Some(t) = &self.chunk_transforms {
            b = b.chunk_transforms_json(transforms_arg(t)?);
        }
        for (name, labels) in &self.stacks {
            b = b.stack(name, labels);
        }
        if let Some(PatchShape(shape)) = &self.patch {
            let mut wrap = vec![false; shape.len()];
            for &a in &self.patch_wrap {
                *wrap.get_mut(a).ok_or_else(|| {
                    format!(
                        "--patch-wrap {a}: the patch has axes 0 to {}",
                        shape.len() - 1
                    )
                })? = true;
            }
            b = b.patch_wrapping(shape.clone(), wrap);
            if let Some(n) = self.patches_per_sample {
                b = b.patches_per_sample(n);
            }
            if let Some(PatchShape(stride)) = &self.patch_grid {
                b = b.patch_grid(stride.clone());
            }
        }
        if let Some(dir) = &self.cache_dir {
            b = b
                .cache_dir(dir)
                .persist(self.persist)
                .readonly_cache(self.readonly_cache)
                .cache_direct_io(!self.buffered_cache_writes);
        }
        Ok(b.build()?)
    }

    /// `--cache-budget-bytes` in bytes (`split` sized on a dataset opened to ask).
    fn budget(&self) -> Result<Option<u64>, Box<dyn std::error::Error>> {
        let Some(s) = &self.cache_budget_bytes else {
            return Ok(None);
        };
        if s == "split" {
            return Ok(Some(self.dataset(None)?.split_bytes(&self.split)?));
        }
        Ok(Some(s.parse::<u64>().map_err(|_| {
            format!("--cache-budget-bytes {s:?} is not a byte count or `split`")
        })?))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Build a small ERA5-like store (in a temporary directory unless --dir), then run two
    /// shuffled epochs over it and print throughput, latency, cache hits and memory.
    Demo {
        /// Where to build the store (kept); default: a temporary directory (removed).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Samples along time.
        #[arg(long, default_value_t = 1024)]
        samples: u64,
        /// Grid as LATxLON (default: the 1.5 degree WeatherBench2 grid).
        #[arg(long, default_value = "121x240", value_parser = parse_pair)]
        grid: (u64, u64),
        /// Samples per chunk (default: one day of 6-hourly fields).
        #[arg(long, default_value_t = 4)]
        sample_chunk: u64,
        /// Epochs to run.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        epochs: u64,
    },
    /// Split a store's sample-axis chunks into train/val/test and write the manifest.
    Split {
        /// Store directory.
        path: PathBuf,
        /// The reference array (default: the first data variable).
        #[arg(long)]
        array: Option<String>,
        /// The sample axis (physical axis index).
        #[arg(long, default_value_t = 0)]
        sample_axis: usize,
        /// Fractions of chunks for train,val,test.
        #[arg(long, value_delimiter = ',', default_value = "0.8,0.1,0.1")]
        fractions: Vec<f64>,
        /// Seed (used when --shuffled).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Shuffle chunks before splitting (exchangeable samples only; time series leak).
        #[arg(long)]
        shuffled: bool,
        /// Restrict to the chunks overlapping START:STOP (sample indices, half open).
        #[arg(long, value_parser = parse_range)]
        sample_range: Option<(u64, u64)>,
        /// Give each split its own range instead of fractions: NAME=START..STOP (half open),
        /// comma-separated, NAME train, val or test. A bound is a sample index, or a date
        /// (anything with a `-`: 2016-01-01, 2016-01-01T06:00) looked up on the array's time
        /// coordinate: train=1979-01-01..2016-01-01,val=2016-01-01..2017-01-01.
        #[arg(long, value_delimiter = ',', value_parser = parse_split_range,
              conflicts_with_all = ["fractions", "shuffled", "sample_range"])]
        ranges: Vec<(String, SampleBound, SampleBound)>,
        /// With --ranges, a bound inside a chunk: exact (an error), inward (the chunk stays out
        /// of the split) or outward (the chunk joins it).
        #[arg(long, default_value = "exact", value_parser = parse_snap, requires = "ranges")]
        snap: Snap,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        store: StoreOptions,
    },
    /// Run epochs through the engine and report; --ceilings adds the two baselines.
    Bench {
        #[command(flatten)]
        pass: PassArgs,
        /// Epochs.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        epochs: u64,
        /// Also measure the decode ceiling (a) and the in-memory gather ceiling (b).
        #[arg(long, conflicts_with_all = ["cache_dir", "chunk_transforms"])]
        ceilings: bool,
        /// Repeats of each ceiling (best kept).
        #[arg(long, default_value_t = 3, value_parser = at_least_one())]
        repeat: usize,
        /// Hold each batch this many milliseconds, as a model step on an accelerator would
        /// (a sleep: the cores stay the loader's), and report the share of each epoch spent
        /// waiting for data.
        #[arg(long, default_value_t = 0.0, conflicts_with = "ceilings", value_parser = non_negative_ms)]
        accelerator_ms: f64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The memory a pass with these knobs holds at its peak, counted from its plan without
    /// reading a chunk: the figure to size a job by (a SLURM --mem, a container's limit).
    /// Exits 1 when it exceeds this process's limit, as the pass would be refused.
    Memory {
        #[command(flatten)]
        pass: PassArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mean, standard deviation, min and max of each batch array over one epoch of a split (the
    /// training split by default), per index along an inner axis with --axis: the statistics
    /// a `standardize` chunk transform takes, fitted where no evaluation data leaks in.
    Stats {
        #[command(flatten)]
        pass: PassArgs,
        /// One entry per index along this inner axis (0: the first after the sample axis, the
        /// level of a (time, level, lat, lon) array); default one over whole samples.
        #[arg(long)]
        axis: Option<usize>,
        /// The values at these probabilities too, comma-separated (0.01,0.99: robust bounds to
        /// clip to), within 1/256 of numpy's `quantile`.
        #[arg(long, value_delimiter = ',')]
        quantiles: Vec<f64>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The order an epoch of a split draws, planned without reading a chunk: its samples in the
    /// order the batches emit them, block by block. The same arguments give the same order on
    /// any machine, thread count and IO backend (a log of what a run saw, or a check of it).
    Order {
        #[command(flatten)]
        pass: PassArgs,
        /// The epoch.
        #[arg(long, default_value_t = 0)]
        epoch: u64,
        /// Print JSON: `samples`, `block_ends` (where each block ends in `samples`),
        /// `dropped_anchors`, `trimmed_rows`.
        #[arg(long)]
        json: bool,
    },
    /// Fill a persistent decoded-chunk cache (cache_dir, persist) for a split, so that any
    /// number of readonly_cache jobs can read it without fetching or decoding.
    Warm(WarmArgs),
    /// Run chunk transforms on one chunk of a store while you write them: the slot the cache
    /// will hold, values before and after, time per chunk, and the cache fingerprint. Exits
    /// non-zero when a transform cannot apply to the array.
    CheckTransform {
        /// Store directory or URL.
        path: PathBuf,
        /// The array to check (its path).
        #[arg(long)]
        var: String,
        /// The transforms: a JSON list or one object (`{"type": "affine", "offset":
        /// -273.15}`), or `@FILE`.
        #[arg(long, value_name = "JSON")]
        transform: String,
        /// The chunk, by its index along the sample axis.
        #[arg(long, default_value_t = 0)]
        chunk: u64,
        /// The sample axis.
        #[arg(long, default_value_t = 0)]
        sample_axis: usize,
        /// Timed runs of the transforms (the median is reported).
        #[arg(long, default_value_t = 20, value_parser = at_least_one())]
        repeat: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreOptions,
    },
    /// Benchmark the NVMe tier: warm epochs from RAM and revived from cache files (page cache
    /// warm and dropped) against the in-memory gather ceiling, the cache-filling epoch against a
    /// plain cold one, and slot-file writes on io_uring against the thread fallback.
    BenchCache {
        /// Store directory.
        path: PathBuf,
        /// Split to iterate (shuffled when train).
        #[arg(long, default_value = "train")]
        split: String,
        /// Repeats (best kept).
        #[arg(long, default_value_t = 3, value_parser = at_least_one())]
        repeat: usize,
        /// Where the cache directories go (default: a temporary directory beside the store,
        /// on the same file system); removed afterwards.
        #[arg(long)]
        work: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Describe a store: per variable shape, chunks, dtype, codecs, bytes, regime; IO backend.
    Inspect {
        /// Store directory (a Zarr group or array).
        path: PathBuf,
        /// The sample axis (physical axis index).
        #[arg(long, default_value_t = 0)]
        sample_axis: usize,
        /// Only these arrays (comma-separated); bypasses the coordinate rule.
        #[arg(long, value_delimiter = ',')]
        variables: Option<Vec<String>>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreOptions,
    },
    /// Write a synthetic ERA5-like store: smooth float32 (time, latitude, longitude) fields.
    MakeDataset {
        /// Output directory.
        dir: PathBuf,
        /// Samples along time.
        #[arg(long, default_value_t = 256)]
        samples: u64,
        /// Grid as LATxLON.
        #[arg(long, default_value = "181x360", value_parser = parse_pair)]
        grid: (u64, u64),
        /// Samples per chunk along time.
        #[arg(long, default_value_t = 8)]
        sample_chunk: u64,
        /// Spatial (inner) chunks as LATxLON; default: the whole grid.
        #[arg(long, value_parser = parse_pair)]
        inner_chunks: Option<(u64, u64)>,
        /// Zarr format, 2 or 3.
        #[arg(long, default_value_t = 3)]
        format: u8,
        /// zstd, blosc (lz4 + shuffle) or none.
        #[arg(long, default_value = "zstd")]
        codec: String,
        /// Compression level.
        #[arg(long, default_value_t = 3)]
        level: i32,
        /// Shard along time with this many samples per shard (v3); chunks become inner chunks.
        #[arg(long)]
        shard_samples: Option<u64>,
        /// Data variables (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "t2m,u10")]
        variables: Vec<String>,
        /// Replace an existing store at DIR.
        #[arg(long)]
        force: bool,
    },
    /// Benchmark the read layer: read + decode every stored chunk on each IO backend, against
    /// std::fs::read + zarrs decode on plain threads and the raw read ceiling.
    BenchRead {
        /// Store directory.
        path: PathBuf,
        /// Repeats per path (best kept).
        #[arg(long, default_value_t = 3, value_parser = at_least_one())]
        repeat: usize,
        /// Executor / plain threads (default: one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// Concurrent chunk reads per executor; a comma-separated list measures each.
        #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16])]
        inflight: Vec<usize>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
}

/// A field region for `--variables` (`bench`, `memory`, `warm`).
#[derive(clap::Args, Debug)]
struct RegionArgs {
    /// Read only this region of every variable's field: START:STOP per field axis, in
    /// physical order, comma-separated (e.g. 40:100,120:280); only the stored chunks it
    /// touches are read.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_signed_range,
        allow_hyphen_values = true,
        requires = "variables"
    )]
    region: Option<Vec<(i64, i64)>>,
    /// Let --region's ranges run across the end of a periodic axis (longitude): a negative
    /// START counts from the axis's end (-100:180 on a 1440-long axis is its last 100 and
    /// first 180 elements).
    #[arg(long, requires = "region")]
    wrap: bool,
    /// The region in coordinate values instead: DIM=START:STOP per dimension, comma-separated
    /// (e.g. latitude=72:35,longitude=-25:45). The coordinate array named DIM is read and the
    /// indices whose values lie between START and STOP, both included, are the range; axes
    /// not named stay whole.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_coord_range,
        allow_hyphen_values = true,
        requires = "variables",
        conflicts_with = "region"
    )]
    coords: Option<Vec<(String, f64, f64)>>,
    /// Periodic dimensions of --coords and their periods, comma-separated (longitude=360): the
    /// range runs upward from START to STOP, across the end of the axis if it must.
    #[arg(long, value_delimiter = ',', value_parser = parse_period, requires = "coords")]
    periodic: Option<Vec<(String, f64)>>,
}

impl RegionArgs {
    /// Adds `path` of the store at `store` as the variable `label`, `shift` samples from each
    /// anchor, cropped to the region if there is one (`--coords` read from the store's
    /// coordinate arrays).
    fn view(
        &self,
        b: DatasetBuilder,
        store: &StoreAt,
        (label, path, shift): (&str, &str, i64),
    ) -> Result<DatasetBuilder, Box<dyn std::error::Error>> {
        if let Some(coords) = &self.coords {
            let periods = self.periodic.as_deref().unwrap_or_default();
            if let Some((dim, _)) = periods
                .iter()
                .find(|(d, _)| !coords.iter().any(|c| c.0 == *d))
            {
                return Err(
                    format!("--periodic names `{dim}`, which --coords gives no range").into(),
                );
            }
            let bounds: Vec<insitubatch::CoordinateBounds> = coords
                .iter()
                .map(|(dim, start, stop)| insitubatch::CoordinateBounds {
                    dim: dim.clone(),
                    start: *start,
                    stop: *stop,
                    period: periods.iter().find(|p| p.0 == *dim).map(|p| p.1),
                })
                .collect();
            let r = insitubatch::coordinate_region(
                store.path,
                path,
                store.sample_axis,
                &bounds,
                store.storage_options,
            )?;
            // A wrapping crop whose ranges do not wrap is a plain crop.
            return Ok(b.cropped_window_wrapping(label, path, shift, &r.region));
        }
        let Some(r) = &self.region else {
            return Ok(b.window(label, path, shift));
        };
        if self.wrap {
            return Ok(b.cropped_window_wrapping(label, path, shift, r));
        }
        let plain: Option<Vec<(u64, u64)>> = r
            .iter()
            .map(|&(lo, hi)| Some((u64::try_from(lo).ok()?, u64::try_from(hi).ok()?)))
            .collect();
        match plain {
            Some(plain) => Ok(b.cropped_window(label, path, shift, &plain)),
            None => Err(format!(
                "--region {r:?} has a negative bound; a range across the end of a periodic axis \
                 (longitude) needs --wrap"
            )
            .into()),
        }
    }
}

/// Where the variables of a `RegionArgs` come from: the store and how it is opened.
struct StoreAt<'a> {
    path: &'a Path,
    sample_axis: usize,
    storage_options: &'a [(String, String)],
}

/// `DIM=VALUE` split at its `=`, the name trimmed; `form` is what to write instead.
fn split_dim<'a>(s: &'a str, form: &str) -> Result<(String, &'a str), String> {
    let (dim, value) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not of the form {form}"))?;
    Ok((dim.trim().to_string(), value))
}

/// `DIM=START:STOP` with numbers (`latitude=72:35`, `longitude=-25:45`).
fn parse_coord_range(s: &str) -> Result<(String, f64, f64), String> {
    let (dim, range) = split_dim(s, "DIM=START:STOP (latitude=72:35)")?;
    let (a, b) = range
        .split_once(':')
        .ok_or_else(|| format!("`{range}` in `{s}` is not of the form START:STOP"))?;
    let p = |v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("`{v}` in `{s}` is not a number"))
    };
    Ok((dim, p(a)?, p(b)?))
}

/// `DIM=PERIOD` (`longitude=360`).
fn parse_period(s: &str) -> Result<(String, f64), String> {
    let (dim, period) = split_dim(s, "DIM=PERIOD (longitude=360)")?;
    let p = period
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("`{period}` in `{s}` is not a positive number"))?;
    Ok((dim, p))
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = parse_signed_range(s)?;
    let p = |v: i64| u64::try_from(v).map_err(|_| format!("`{v}` in `{s}` is negative"));
    Ok((p(a)?, p(b)?))
}

/// `NAME=START..STOP` (or `NAME=START:STOP` with indices): one split's range for `split --ranges`.
fn parse_split_range(s: &str) -> Result<(String, SampleBound, SampleBound), String> {
    let form = "NAME=START..STOP, such as train=0..8760 or val=2016-01-01..2017-01-01";
    let (name, range) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not of the form {form}"))?;
    let (a, b) = range
        .split_once("..")
        .or_else(|| range.split_once(':').filter(|(_, b)| !b.contains(':')))
        .ok_or_else(|| format!("`{s}` is not of the form {form}"))?;
    let bound = |v: &str| {
        let v = v.trim();
        if v.contains('-') {
            Ok(SampleBound::Time(v.to_string()))
        } else {
            v.parse::<u64>().map(SampleBound::Index).map_err(|_| {
                format!("`{v}` in `{s}` is neither a sample index nor a date (2016-01-01)")
            })
        }
    };
    Ok((name.trim().to_string(), bound(a)?, bound(b)?))
}

/// `stats` as a table: a line per array, or per index along the axis.
fn render_statistics(
    split: &str,
    stats: &std::collections::BTreeMap<String, insitubatch::Statistics>,
) -> String {
    use std::fmt::Write;
    let mut out = format!("split {split}\n");
    let _ = writeln!(
        out,
        "{:<16} {:>6} {:>12} {:>5} {:>14} {:>14} {:>14} {:>14}",
        "array", "index", "count", "NaN", "mean", "std", "min", "max"
    );
    for (name, s) in stats {
        for i in 0..s.count.len() {
            let index = s.axis.map_or("all".to_string(), |_| i.to_string());
            let _ = writeln!(
                out,
                "{name:<16} {index:>6} {:>12} {:>5} {:>14.6} {:>14.6} {:>14.6} {:>14.6}",
                s.count[i], s.nan_count[i], s.mean[i], s.std[i], s.min[i], s.max[i]
            );
        }
    }
    // The quantiles, one column per probability.
    let Some(first) = stats.values().find(|s| !s.quantiles.is_empty()) else {
        return out;
    };
    let _ = write!(out, "{:<16} {:>6}", "quantiles", "index");
    for q in &first.quantiles {
        let _ = write!(out, " {:>14}", format!("q{q}"));
    }
    out.push('\n');
    for (name, s) in stats {
        for (i, values) in s.quantile_values.iter().enumerate() {
            let index = s.axis.map_or("all".to_string(), |_| i.to_string());
            let _ = write!(out, "{name:<16} {index:>6}");
            for v in values {
                let _ = write!(out, " {v:>14.6}");
            }
            out.push('\n');
        }
    }
    out
}

fn parse_snap(s: &str) -> Result<Snap, String> {
    Snap::parse(s).map_err(|e| e.to_string())
}

fn parse_signed_range(s: &str) -> Result<(i64, i64), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}` is not of the form START:STOP"))?;
    let p = |v: &str| {
        v.trim()
            .parse::<i64>()
            .map_err(|_| format!("`{v}` in `{s}` is not a whole number"))
    };
    Ok((p(a)?, p(b)?))
}

fn parse_pair(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("`{s}` is not of the form AxB (e.g. 181x360)"))?;
    let p = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{v}` in `{s}` is not a whole number"))
    };
    Ok((p(a)?, p(b)?))
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

fn runtime() -> Result<Runtime, Box<dyn std::error::Error>> {
    Ok(RuntimeBuilder::new().build()?)
}

/// `insitubatch warm`: one sequential pass with `persist`, every chunk written and logged as it
/// lands (a killed warm keeps what it finished; running it again completes the rest).
fn warm(args: &WarmArgs) -> CliResult {
    let WarmArgs {
        path,
        cache_dir,
        manifest,
        split,
        variables,
        sample_axis,
        region,
        reset_stale_cache,
        chunk_transforms,
        fields,
        mounts,
        store,
        ranks,
    } = args;
    let mut b = InSituDataset::builder(path)
        .sample_axis(*sample_axis)
        .shuffle(false)
        .shard(ranks.rank, ranks.world_size)
        .even_train(false)
        .cache_dir(cache_dir)
        .persist(true)
        .reset_stale_cache(*reset_stale_cache)
        .storage_options(&store.storage_options);
    b = mounts.apply(b);
    if let Some(t) = chunk_transforms {
        b = b.chunk_transforms_json(transforms_arg(t)?);
    }
    let at = StoreAt {
        path,
        sample_axis: *sample_axis,
        storage_options: &store.storage_options,
    };
    for v in variables.iter().flatten() {
        b = region.view(b, &at, (v, v, 0))?;
    }
    let manifest = manifest
        .as_ref()
        .map(|m| SplitManifest::load(m))
        .transpose()?;
    b = fields.apply(
        b,
        (&at, mounts),
        variables.as_deref(),
        region,
        manifest.as_ref(),
    )?;
    if let Some(m) = manifest {
        b = b.manifest(m);
    }
    let ds = b.build()?;
    let start = Instant::now();
    let mut pass = ds.iter(split)?;
    let pb = progress_bar(pass.stats().batches_total, "warming");
    for batch in pass.by_ref() {
        batch?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let s = pass.stats();
    let disk = ds.cache_stats().unwrap_or_default();
    let labels: Vec<&str> = ds.variables().iter().map(|v| v.label.as_str()).collect();
    println!(
        "warmed {} ({split}, [{}]) into {}: {} chunks written ({}), {} already cached, {:.1} s",
        path.display(),
        labels.join(", "),
        cache_dir.display(),
        disk.writes,
        human_bytes(disk.write_bytes),
        s.cache_revived,
        start.elapsed().as_secs_f64()
    );
    if disk.write_errors > 0 {
        return Err(format!(
            "{} chunks could not be written (see the warning above); readonly readers would miss \
             them: free space and run warm again",
            disk.write_errors
        )
        .into());
    }
    Ok(())
}

fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn codec_from(name: &str, level: i32) -> Result<Codec, String> {
    match name {
        "zstd" => Ok(Codec::Zstd(level)),
        "blosc" => Ok(Codec::BloscLz4(level.clamp(0, 9) as u8)),
        "none" => Ok(Codec::None),
        other => Err(format!("--codec {other:?} is not one of zstd, blosc, none")),
    }
}

fn build_store(dir: &Path, spec: &SynthSpec, force: bool) -> CliResult {
    let pb = progress_bar(0, "writing");
    let pb2 = pb.clone();
    make_dataset(dir, spec, force, &move |done, total| {
        if pb2.length() != Some(total) {
            pb2.set_length(total);
        }
        pb2.set_position(done);
    })?;
    pb.finish_and_clear();
    Ok(())
}

fn print_epoch(r: &EpochReport) {
    let s = &r.stats;
    println!(
        "epoch {}: {} samples in {} batches, {:.2} s = {:.0} samples/s, {:.0} MB/s; first batch {:.1} ms{}; \
         batch latency p50 {:.2} ms p99 {:.2} ms; chunks: {} misses, {} hits{}{}; read {}, decoded {}{}",
        s.epoch,
        s.samples,
        s.batches,
        r.seconds,
        r.samples_per_s,
        r.mb_per_s,
        s.ttfb_us as f64 / 1e3,
        if s.started_ahead {
            " (started while the epoch before ran)"
        } else {
            ""
        },
        s.batch_latency_us_p50 as f64 / 1e3,
        s.batch_latency_us_p99 as f64 / 1e3,
        s.cache_misses,
        s.cache_hits,
        match (s.cache_revived, s.cache_rejected) {
            (0, 0) => String::new(),
            (n, 0) => format!(" ({n} revived from cache_dir)"),
            (n, r) => format!(" ({n} revived from cache_dir, {r} cache_dir entries rejected)"),
        },
        match (s.tiles_into_batches, s.region_slots) {
            (0, 0) => String::new(),
            (n, 0) => format!(", {n} decoded into batch rows"),
            (0, r) => format!(", {r} loaded as their patches' regions"),
            (n, r) =>
                format!(", {n} decoded into batch rows, {r} loaded as their patches' regions"),
        },
        human_bytes(s.bytes_read),
        human_bytes(s.bytes_decoded),
        match s.tiles_read_waited {
            0 => String::new(),
            n => format!(
                "; {n} of {} chunk reads waited for the device",
                s.tiles_read
            ),
        },
    );
    if let Some(stall) = r.data_stall_fraction {
        println!(
            "  with the model step: {:.2} s in it, {:.1} % of the epoch waiting for data",
            r.step_s.unwrap_or(0.0),
            100.0 * stall
        );
    }
}

/// A clap parser for milliseconds that must be finite and not negative.
fn non_negative_ms(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a number of milliseconds (0 or more)")),
    }
}

/// A clap parser for counts that must be at least 1.
fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

fn run_epochs_with_bar(
    ds: &InSituDataset,
    split: &str,
    epochs: u64,
    step: Duration,
) -> Result<Vec<EpochReport>, EngineError> {
    let mut out = Vec::new();
    for epoch in 0..epochs {
        let pb = progress_bar(0, &format!("epoch {epoch}"));
        let pb2 = pb.clone();
        let r = run_epoch_with_step(ds, split, epoch, step, &move |done, total| {
            if pb2.length() != Some(total) {
                pb2.set_length(total);
            }
            pb2.set_position(done);
        });
        pb.finish_and_clear();
        let r = r?;
        print_epoch(&r);
        out.push(r);
    }
    Ok(out)
}

/// `insitubatch memory`'s table: each part of the need, what sizes it, and the limit;
/// `cache_writes` when the reads count a cache directory's slot files being written.
fn render_need(split: &str, need: &insitubatch::MemoryNeed, cache_writes: bool) -> String {
    let row = |what: &str, bytes: u64, why: String| {
        let line = format!("  {what:<12} {:>10}  {why}", human_bytes(bytes));
        line.trim_end().to_string() + "\n"
    };
    let mut out = format!("a `{split}` pass holds at its peak:\n");
    let pinned = if need.working_set == 0 && need.rows_batches > 0 {
        "decoded chunks pinned in the pool at once: none, all go straight into batch rows"
    } else {
        "decoded chunks pinned in the pool at once (block_chunks)"
    };
    out += &row("working set", need.working_set, pinned.into());
    if need.pool > need.working_set {
        out += &row(
            "pool",
            need.pool,
            format!(
                "kept on the heap, the working set included (cache_budget_bytes {})",
                need.cache_budget.unwrap_or(0)
            ),
        );
    }
    out += &row(
        "batches",
        need.batches_bytes(),
        match need.rows_batches {
            0 => format!(
                "{} of {} (prefetch_depth + 2, batch_size)",
                need.batches,
                human_bytes(need.batch_bytes)
            ),
            n => format!(
                "{} of {} (prefetch_depth + 2, batch_size, and {n} filled ahead by chunks \
                 decoded into batch rows: block_chunks)",
                need.batches,
                human_bytes(need.batch_bytes)
            ),
        },
    );
    out += &row(
        "reads",
        need.reads,
        if cache_writes {
            "read buffers (max_inflight + one per decoder), cache_dir files being written"
        } else {
            "read buffers (max_inflight + one per decoder)"
        }
        .into(),
    );
    if need.other_passes > 0 {
        out += &row(
            "other passes",
            need.others,
            format!(
                "held beside it by the {} iterations running in this process",
                need.other_passes
            ),
        );
    }
    out += &row(
        "overhead",
        need.overhead(),
        "the library's threads and its allocator's slack".into(),
    );
    out += &row("total", need.total(), String::new());
    out += &row(
        "this process",
        insitubatch::enginebench::rss_bytes(),
        "resident now, before any pass: the host a job's memory holds beside the total".into(),
    );
    match need.limit {
        Some(l) if need.fits() => out += &format!("fits in {l}\n"),
        Some(l) => out += &format!("does NOT fit in {l}\n"),
        None => out += "no memory limit known\n",
    }
    out
}

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Demo {
            dir,
            samples,
            grid,
            sample_chunk,
            epochs,
        } => {
            let tmp;
            let path = match dir {
                Some(d) => d,
                None => {
                    tmp = tempfile::Builder::new()
                        .prefix("insitubatch-demo")
                        .tempdir()?;
                    tmp.path().join("era5.zarr")
                }
            };
            let spec = SynthSpec {
                samples,
                grid,
                sample_chunk,
                ..SynthSpec::default()
            };
            println!(
                "building a synthetic ERA5-like store at {} ({} decoded)",
                path.display(),
                human_bytes(spec.decoded_bytes())
            );
            let t = Instant::now();
            build_store(&path, &spec, true)?;
            // Let the kernel finish writing the new store back before timing reads: on a small
            // node, writeback of a just-written store competes with the decoders for the cores.
            // SAFETY: sync(2) takes no arguments and cannot fail.
            unsafe { libc::sync() };
            println!("built (and synced) in {:.2} s\n", t.elapsed().as_secs_f64());
            let rt = runtime()?;
            print!("{}", inspect(&rt.handle(), &path, None, 0, &[])?.render());
            drop(rt);
            let ds = InSituDataset::builder(&path).build()?;
            println!(
                "\n{} shuffled epochs: batch_size {}, block_chunks {}, max_inflight {}, prefetch_depth {}, {} IO",
                epochs,
                insitubatch::DEFAULT_BATCH_SIZE,
                insitubatch::DEFAULT_BLOCK_CHUNKS,
                ds.max_inflight(),
                insitubatch::DEFAULT_PREFETCH_DEPTH,
                ds.io_backend()
            );
            run_epochs_with_bar(&ds, "train", epochs, Duration::ZERO)?;
            let pool = ds.pool_stats();
            // Chunks decoded straight into batch rows take no pool slot, so nothing sizes it.
            let why = if pool.budget_bytes == 0 {
                "no chunk went through the pool"
            } else {
                "the working set"
            };
            println!(
                "pool budget {} ({why}), peak resident {}; peak RSS {}",
                human_bytes(pool.budget_bytes),
                human_bytes(pool.peak_resident_bytes),
                human_bytes(peak_rss_bytes())
            );
            Ok(())
        }
        Command::Split {
            path,
            array,
            sample_axis,
            fractions,
            seed,
            shuffled,
            sample_range,
            ranges,
            snap,
            output,
            store,
        } => {
            let mut b = InSituDataset::builder(&path)
                .sample_axis(sample_axis)
                .storage_options(&store.storage_options);
            if let Some(a) = &array {
                b = b.variable(a.clone(), a.clone());
            }
            let ds = b.build()?;
            let geom = &ds.variables()[0].geom;
            let m = if ranges.is_empty() {
                split_by_chunk(geom, &fractions, seed, !shuffled, sample_range)?
            } else {
                let options = &store.storage_options;
                let ranges = insitubatch::sample_ranges(&path, geom, &ranges, options)?;
                let ranges: Vec<(&str, std::ops::Range<u64>)> = ranges
                    .iter()
                    .map(|(n, r)| (n.as_str(), r.clone()))
                    .collect();
                split_by_ranges(geom, &ranges, snap)?
            };
            m.save(&output)?;
            let spc = m.samples_per_chunk();
            // A contiguous split's samples, and their first and last times when the sample
            // axis has a CF time coordinate.
            let options = &store.storage_options;
            let times =
                insitubatch::coordinate_values(&path, &m.array, None, m.sample_axis, options).ok();
            let when = |a: u64, b: u64| -> String {
                let at = |i: u64| times.as_ref().and_then(|t| t.time_at(i as usize));
                match (at(a), at(b)) {
                    (Some(a), Some(b)) => format!(", {a} .. {b}"),
                    _ => String::new(),
                }
            };
            let in_order = insitubatch::actors::planner::SPLIT_NAMES
                .iter()
                .filter_map(|k| Some((k, m.splits.get(*k)?)));
            let counts: Vec<String> = in_order
                .map(|(k, v)| match (v.first(), v.last()) {
                    (Some(&a), Some(&b)) if b - a + 1 == v.len() as u64 => {
                        let (lo, hi) = (a * spc, ((b + 1) * spc).min(m.n_samples()));
                        let span = when(lo, hi - 1);
                        format!("{k} {} chunks (samples {lo}..{hi}{span})", v.len())
                    }
                    _ => format!("{k} {} chunks", v.len()),
                })
                .collect();
            println!(
                "wrote {} for `{}` ({} samples, {} per chunk):\n  {}",
                output.display(),
                m.array,
                m.n_samples(),
                m.samples_per_chunk(),
                counts.join("\n  ")
            );
            Ok(())
        }
        Command::Bench {
            pass,
            epochs,
            ceilings,
            repeat,
            accelerator_ms,
            json,
        } => {
            let step = Duration::from_secs_f64(accelerator_ms / 1e3);
            let split = &pass.split;
            if ceilings {
                let make = |b: Option<u64>| {
                    pass.dataset(b)
                        .map_err(|e| match e.downcast::<EngineError>() {
                            Ok(e) => *e,
                            Err(e) => EngineError::Runtime(e.to_string()),
                        })
                };
                let r = compare_with_ceilings(split, repeat, &make)?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&r)?);
                    return Ok(());
                }
                println!(
                    "samples/chunk {}: (a) decode ceiling {:.0} MB/s, cold-pool epoch {:.0} MB/s decoded ({:.0} samples/s) = {:.1}%; \
                     (b) gather ceiling {:.0} MB/s, resident epoch {:.0} MB/s ({:.0} samples/s) = {:.1}%; cold TTFB median {:.1} ms",
                    r.samples_per_chunk,
                    r.decode_ceiling_mb_s,
                    r.cold_decoded_mb_s,
                    r.cold_samples_per_s,
                    100.0 * r.cold_ratio,
                    r.gather_ceiling_mb_s,
                    r.resident_mb_s,
                    r.resident_samples_per_s,
                    100.0 * r.resident_ratio,
                    r.ttfb_ms_median
                );
                println!("peak RSS {}", human_bytes(peak_rss_bytes()));
                return Ok(());
            }
            let ds = pass.dataset(pass.budget()?)?;
            let need = ds.memory_need(split)?;
            let reports = if json {
                let mut v = Vec::new();
                for e in 0..epochs {
                    v.push(run_epoch_with_step(&ds, split, e, step, &|_, _| {})?);
                }
                v
            } else {
                run_epochs_with_bar(&ds, split, epochs, step)?
            };
            let cache = ds.cache_stats();
            if json {
                let out = serde_json::json!({
                    "epochs": reports,
                    "memory_need_bytes": need.total(),
                    "peak_rss_bytes": peak_rss_bytes(),
                    "cache": cache.map(|c| serde_json::json!({
                        "writes": c.writes,
                        "write_bytes": c.write_bytes,
                        "write_errors": c.write_errors,
                        "writes_skipped": c.writes_skipped,
                        "revived": c.revived,
                        "rejected": c.rejected,
                    })),
                });
                println!("{}", serde_json::to_string_pretty(&out)?);
                return Ok(());
            }
            println!(
                "peak RSS {}; memory need {}",
                human_bytes(peak_rss_bytes()),
                human_bytes(need.total())
            );
            if let Some(c) = cache {
                println!(
                    "cache directory: {} files written ({}), {} writes skipped (evicted first), \
                     {} failed; {} chunks revived",
                    c.writes,
                    human_bytes(c.write_bytes),
                    c.writes_skipped,
                    c.write_errors,
                    c.revived
                );
            }
            Ok(())
        }
        Command::Memory { pass, json } => {
            let ds = pass.dataset(pass.budget()?)?;
            let need = ds.memory_need(&pass.split)?;
            let fits = need.fits();
            if json {
                let mut v = insitubatch::memory_need_json(&need);
                v["split"] = pass.split.clone().into();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let writes = pass.cache_dir.is_some() && !pass.readonly_cache;
                print!("{}", render_need(&pass.split, &need, writes));
            }
            if fits {
                Ok(())
            } else {
                // The refusal the pass itself would give, naming the knob.
                Err(ds.iter(&pass.split).err().map_or_else(
                    || "the pass needs more memory than this process may use".into(),
                    |e| e.into(),
                ))
            }
        }
        Command::Stats {
            pass,
            axis,
            quantiles,
            json,
        } => {
            let ds = pass.dataset(pass.budget()?)?;
            let stats = ds.statistics_with_quantiles(&pass.split, axis, &quantiles)?;
            if json {
                let v: serde_json::Map<String, serde_json::Value> = stats
                    .iter()
                    .map(|(name, s)| (name.clone(), s.to_json()))
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", render_statistics(&pass.split, &stats));
            }
            Ok(())
        }
        Command::Order { pass, epoch, json } => {
            let ds = pass.dataset(None)?;
            ds.set_epoch(epoch);
            let order = ds.order(&pass.split)?;
            order.check_nonempty(&pass.split)?;
            print!("{}", render_order(&pass.split, epoch, &order, json)?);
            Ok(())
        }
        Command::Inspect {
            path,
            sample_axis,
            variables,
            json,
            store,
        } => {
            let rt = runtime()?;
            let report = inspect(
                &rt.handle(),
                &path,
                variables,
                sample_axis,
                &store.storage_options,
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(())
        }
        Command::MakeDataset {
            dir,
            samples,
            grid,
            sample_chunk,
            inner_chunks,
            format,
            codec,
            level,
            shard_samples,
            variables,
            force,
        } => {
            let spec = SynthSpec {
                samples,
                grid,
                sample_chunk,
                inner_chunks,
                zarr_format: format,
                codec: codec_from(&codec, level)?,
                shard_samples,
                variables,
            };
            let t = Instant::now();
            build_store(&dir, &spec, force)?;
            println!(
                "wrote {} ({} decoded, stored chunk {:?}) in {:.2} s",
                dir.display(),
                human_bytes(spec.decoded_bytes()),
                spec.stored_chunk(),
                t.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::Warm(args) => warm(&args),
        Command::CheckTransform {
            path,
            var,
            transform,
            chunk,
            sample_axis,
            repeat,
            json,
            store,
        } => {
            let t = transforms_arg(&transform)?;
            let options = &store.storage_options;
            let r = check_transform(&path, &var, sample_axis, &t, chunk, repeat, options)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", r.render());
            }
            Ok(())
        }
        Command::BenchCache {
            path,
            split,
            repeat,
            work,
            json,
        } => {
            let tmp;
            let work = match work {
                Some(w) => w,
                None => {
                    let parent = path
                        .canonicalize()?
                        .parent()
                        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
                    tmp = tempfile::Builder::new()
                        .prefix("insitubatch-cache-bench")
                        .tempdir_in(parent)?;
                    tmp.path().join("work")
                }
            };
            let r = insitubatch::cachebench::bench_cache(&path, &work, &split, repeat)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            println!(
                "{split}: {} decoded; in-memory gather ceiling {:.0} MB/s; best of {repeat}",
                human_bytes(r.split_bytes),
                r.gather_ceiling_mb_s
            );
            for w in &r.warm {
                println!(
                    "  warm epoch from {:<24} {:>6.0} MB/s = {:>5.1}% of the ceiling; {} chunks decoded, {} revived; first batch {:.1} ms",
                    w.source,
                    w.mb_s,
                    100.0 * w.ratio,
                    w.decoded_chunks,
                    w.revived,
                    w.ttfb_ms
                );
            }
            for (direct, mb_s) in &r.fill_mb_s {
                println!(
                    "  cache-filling epoch ({}) {mb_s:.0} MB/s = {:.1}% of a plain cold epoch ({:.0} MB/s)",
                    if *direct { "O_DIRECT" } else { "buffered" },
                    100.0 * mb_s / r.cold_mb_s,
                    r.cold_mb_s
                );
            }
            for w in &r.writes {
                let base = r
                    .writes
                    .iter()
                    .find(|b| b.backend == "threads" && b.direct == w.direct)
                    .map_or(1.0, |b| b.mb_s);
                println!(
                    "  slot-file writes, {:<8} {:<8}: {:>6.0} MB/s ({} files) = {:.2}x the thread fallback",
                    w.backend,
                    if w.direct { "O_DIRECT" } else { "buffered" },
                    w.mb_s,
                    w.files,
                    w.mb_s / base
                );
            }
            Ok(())
        }
        Command::BenchRead {
            path,
            repeat,
            threads,
            inflight,
            json,
        } => {
            let threads = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            if threads == 0 || inflight.contains(&0) {
                return Err("--threads and --inflight must be at least 1".into());
            }
            let results = bench_read(&path, repeat, threads, &inflight)?;
            let baseline = results
                .iter()
                .find(|r| r.engine.starts_with("std::fs"))
                .map_or(1.0, |r| r.decoded_mb_s);
            if json {
                for r in &results {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                println!(
                    "{} stored chunks, {} read, {} decoded; {threads} threads; best of {repeat}; warm page cache",
                    results[0].chunks,
                    human_bytes(results[0].bytes_read),
                    human_bytes(results[0].bytes_decoded)
                );
                println!(
                    "{:<76} {:>9} {:>12} {:>10} {:>9}",
                    "path", "seconds", "decoded MB/s", "read MB/s", "vs plain"
                );
                for r in &results {
                    println!(
                        "{:<76} {:>9.3} {:>12.0} {:>10.0} {:>8.1}%",
                        r.engine,
                        r.seconds,
                        r.decoded_mb_s,
                        r.read_mb_s,
                        100.0 * r.decoded_mb_s / baseline
                    );
                }
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    insitubatch::enginebench::process_start();
    // A CLI piped into `head` should stop quietly when the pipe closes, as other Unix tools do,
    // rather than panic on the next print.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread is started.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Rust allocations go to mimalloc; glibc's malloc serves only C code (zstd, libc itself).
    // Left alone, it gives every thread that calls it an arena reserving 128 MiB of address
    // space, and under `ulimit -v` (HPC login and batch nodes) a dozen such threads left no room
    // for a thread stack: the first dataset open failed spawning one instead of refusing the
    // working set by name (`tests/cli.rs`, 20 of 20 runs on the thread fallback; 0 of 20 with
    // two arenas). Two arenas are plenty for what C code allocates here.
    // SAFETY: mallopt before any thread is started; M_ARENA_MAX only caps future arenas.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("insitubatch: error: {e}");
            ExitCode::FAILURE
        }
    }
}
