//! Running epochs and the engine benchmark (`insitubatch demo` and `insitubatch bench`).
//!
//! The benchmark prints ratios against two baselines measured in the same run:
//! (a) the read layer's all-core decode ceiling (`std::fs::read` + zarrs decode on plain
//! threads, [`crate::readbench::decode_ceiling`]), which a cold-pool epoch is compared with;
//! (b) the in-memory gather ceiling ([`GatherCeiling`]): the same batches of the same epoch
//! order copied out of chunks already decoded in RAM, on one thread, which a fully resident
//! epoch is compared with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use insitubatch_actors::gather::stream::{copy_to_batch, stores_done};
use insitubatch_actors::planner::{read_plan, row_runs};
use insitubatch_actors::tile::TileLayout;
use insitubatch_actors::{EngineError, EpochOrder, PassStats, ReadPlan};

use crate::InSituDataset;

/// One epoch's result.
#[derive(Clone, Debug, Serialize)]
pub struct EpochReport {
    /// The pass's own report.
    pub stats: PassStats,
    /// Wall time of the epoch, seconds.
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_s: f64,
    /// Delivered batch bytes per second, MB/s (10^6).
    pub mb_per_s: f64,
    /// From the start of this process to the epoch's first batch, ms.
    pub ttfb_from_process_start_ms: f64,
    /// With a model step ([`run_epoch_with_step`]): the epoch's seconds spent in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_s: Option<f64>,
    /// With a model step: the share of the epoch spent outside it, waiting for data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_stall_fraction: Option<f64>,
}

/// When this process started (its first call here or to [`process_start`] fixes it; the CLI
/// calls it first thing in `main`).
pub fn process_start() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Runs one epoch of `split` at `epoch`, calling `on_batch(done, total)` after each batch.
pub fn run_epoch(
    ds: &InSituDataset,
    split: &str,
    epoch: u64,
    on_batch: &dyn Fn(u64, u64),
) -> Result<EpochReport, EngineError> {
    run_epoch_with_step(ds, split, epoch, Duration::ZERO, on_batch)
}

/// [`run_epoch`] with a model step that holds each batch for `step` (a sleep, as a host waits
/// for an accelerator's step with the cores left to the loader); a zero `step` is none.
pub fn run_epoch_with_step(
    ds: &InSituDataset,
    split: &str,
    epoch: u64,
    step: Duration,
    on_batch: &dyn Fn(u64, u64),
) -> Result<EpochReport, EngineError> {
    ds.set_epoch(epoch);
    let start = Instant::now();
    let mut pass = ds.iter(split)?;
    let total = pass.stats().batches_total;
    let mut done = 0;
    let mut first: Option<Instant> = None;
    let mut in_step = Duration::ZERO;
    for batch in pass.by_ref() {
        let batch = batch?;
        first.get_or_insert_with(Instant::now);
        if !step.is_zero() {
            let t = Instant::now();
            std::thread::sleep(step);
            in_step += t.elapsed();
        }
        drop(batch);
        done += 1;
        on_batch(done, total);
    }
    let seconds = start.elapsed().as_secs_f64();
    let stats = pass.stats();
    let first = first.unwrap_or_else(Instant::now);
    let step_s = (!step.is_zero()).then_some(in_step.as_secs_f64());
    Ok(EpochReport {
        samples_per_s: stats.samples as f64 / seconds,
        mb_per_s: stats.bytes_delivered as f64 / seconds / 1e6,
        ttfb_from_process_start_ms: (first - process_start()).as_secs_f64() * 1e3,
        step_s,
        data_stall_fraction: step_s.map(|s| 1.0 - s / seconds),
        seconds,
        stats,
    })
}

/// Baseline (b): the chunks of a split decoded into RAM once, then, per measured epoch, that
/// epoch's batches copied out of RAM exactly as gather copies them (same rows, same
/// coalescing, the same streaming copy, one reused buffer per label), on one thread.
///
/// The chunks are decoded when the ceiling is built and kept, not decoded again before each
/// measurement: a copy right after its chunks were decoded would read them from the cache,
/// which an engine epoch measured beside it never does (its pool filled epochs before).
pub struct GatherCeiling {
    split: String,
    /// Decoded slots by (array path, chunk index along the sample axis).
    slots: HashMap<(Arc<str>, u64), Vec<u8>>,
}

impl GatherCeiling {
    /// Decodes every slot that epoch 0 of `split` reads (not timed).
    pub fn preload(ds: &InSituDataset, split: &str) -> Result<Self, EngineError> {
        // The ceiling copies decoded chunks; a transform that reshapes them has no ceiling
        // here.
        if let Some(v) = ds
            .variables()
            .iter()
            .find(|v| v.sample_inner != v.geom.inner_shape() || v.sample_dtype != v.geom.dtype)
        {
            return Err(EngineError::arg(
                "chunk_transforms",
                &v.geom.path,
                "the gather ceiling copies chunks as decoded, and this array's transforms change \
                 their shape or dtype; measure the ceilings without transforms",
            ));
        }
        if let Some(patch) = ds.patch() {
            return Err(EngineError::arg(
                "patch",
                format!("{:?}", patch.shape),
                "the gather ceiling copies whole samples; measure the ceilings without a patch",
            ));
        }
        let mut ceiling = GatherCeiling {
            split: split.to_string(),
            slots: HashMap::new(),
        };
        let (_, plan) = ceiling.plan(ds, 0)?;
        ceiling.load_missing(ds, &plan)?;
        Ok(ceiling)
    }

    /// The order and read plan of `epoch` of the split.
    fn plan(&self, ds: &InSituDataset, epoch: u64) -> Result<(EpochOrder, ReadPlan), EngineError> {
        ds.set_epoch(epoch);
        let order = ds.order(&self.split)?;
        let plan = read_plan(&order, ds.variables(), ds.batch_size(), false)?;
        Ok((order, plan))
    }

    /// Decodes the slots `plan` reads that are not loaded yet (a split reads the same chunks
    /// every epoch, so after [`GatherCeiling::preload`] this finds none).
    fn load_missing(&mut self, ds: &InSituDataset, plan: &ReadPlan) -> Result<(), EngineError> {
        let missing: Vec<_> = plan
            .slots
            .iter()
            .filter(|s| {
                !self
                    .slots
                    .contains_key(&(plan.paths[s.path].path.clone(), s.chunk))
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let (store, h, rt) =
            crate::dataset::open_store(ds.root(), ds.storage_options(), ds.mount_specs())?;
        for s in missing {
            let p = &plan.paths[s.path];
            let array = h.arrays[&*p.path].clone();
            let layout = TileLayout::new(&p.geom);
            let mut buf = vec![0u8; s.nbytes as usize];
            for t in 0..layout.tiles() {
                let idx = layout.chunk_index(s.chunk, t);
                let (a, st) = (array.clone(), store.clone());
                let chunk = rt
                    .block_on(move || async move { a.read_chunk(&st, &idx).await })
                    .map_err(|e| EngineError::Runtime(e.to_string()))??;
                layout.copy_into_slot(t, &chunk.bytes, &mut buf);
            }
            self.slots.insert((p.path.clone(), s.chunk), buf);
        }
        Ok(())
    }

    /// Slots decoded so far (one per array and chunk the split reads).
    pub fn loaded_slots(&self) -> usize {
        self.slots.len()
    }

    /// Copies the batches of `epoch`'s order out of the loaded slots; returns (seconds, bytes
    /// copied), best of `repeat`.
    pub fn measure(
        &mut self,
        ds: &InSituDataset,
        epoch: u64,
        repeat: usize,
    ) -> Result<(f64, u64), EngineError> {
        let (order, plan) = self.plan(ds, epoch)?;
        self.load_missing(ds, &plan)?;
        let slots: Vec<&[u8]> = plan
            .slots
            .iter()
            .map(|s| self.slots[&(plan.paths[s.path].path.clone(), s.chunk)].as_slice())
            .collect();
        let bs = plan.batch_size;
        let n_rows = order.rows.len();
        let mut out: Vec<Vec<u8>> = plan
            .labels
            .iter()
            .map(|info| vec![0u8; bs * info.sample_bytes as usize])
            .collect();
        let mut best = f64::INFINITY;
        let mut copied = 0u64;
        let mut locs = Vec::new();
        for _ in 0..repeat.max(1) {
            copied = 0;
            let start = Instant::now();
            for j in 0..plan.n_batches {
                let rows = plan.batch_rows(j, n_rows);
                let n = rows.len();
                plan.locate_rows(&order, rows, &mut locs);
                for (l, info) in plan.labels.iter().enumerate() {
                    let sb = info.sample_bytes as usize;
                    let dst = &mut out[l];
                    for (r, s, w, run) in row_runs(&locs[l * n..(l + 1) * n]) {
                        let src = slots[s as usize];
                        let at = w as usize * sb;
                        copy_to_batch(&mut dst[r * sb..(r + run) * sb], &src[at..at + run * sb]);
                    }
                    copied += (n * sb) as u64;
                }
                stores_done();
                std::hint::black_box(&out);
            }
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok((best, copied))
    }
}

/// Peak resident set size of this process (VmHWM), bytes; 0 where /proc is unavailable.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:").map_or(0, |kb| kb * 1024)
}

/// This process's resident memory now (`VmRSS`), in bytes; 0 where /proc cannot say.
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:").map_or(0, |kb| kb * 1024)
}

/// A `kB` field of `/proc/self/status`.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The engine against both ceilings, measured in one process (see the module docs).
#[derive(Clone, Debug, Serialize)]
pub struct CeilingReport {
    /// Samples per stored chunk along the sample axis (of the first variable).
    pub samples_per_chunk: u64,
    /// (a) decode ceiling, decoded MB/s.
    pub decode_ceiling_mb_s: f64,
    /// Best cold-pool epoch (pool cleared first), decoded MB/s.
    pub cold_decoded_mb_s: f64,
    /// `cold_decoded_mb_s / decode_ceiling_mb_s`.
    pub cold_ratio: f64,
    /// Best cold-pool epoch, samples/s.
    pub cold_samples_per_s: f64,
    /// (b) in-memory gather ceiling, MB/s copied.
    pub gather_ceiling_mb_s: f64,
    /// Best fully resident epoch (every slot a hit), delivered MB/s.
    pub resident_mb_s: f64,
    /// `resident_mb_s / gather_ceiling_mb_s`.
    pub resident_ratio: f64,
    /// Best fully resident epoch, samples/s.
    pub resident_samples_per_s: f64,
    /// Time to first batch of the cold-pool epochs, median, ms.
    pub ttfb_ms_median: f64,
    /// Cold-pool epochs: every (decoded MB/s, ttfb ms).
    pub cold_runs: Vec<(f64, f64)>,
}

/// Measures [`CeilingReport`]: `make(budget)` builds the dataset (the same knobs twice: the
/// automatic budget for cold-pool epochs, and a budget holding the whole split for resident
/// epochs). Every engine figure is the best of `repeat` after one warm-up epoch.
pub fn compare_with_ceilings(
    split: &str,
    repeat: usize,
    make: &dyn Fn(Option<u64>) -> Result<InSituDataset, EngineError>,
) -> Result<CeilingReport, EngineError> {
    let repeat = repeat.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ds = make(None)?;
    if let Some((name, _)) = ds.mounts().next() {
        return Err(EngineError::arg(
            "mounts",
            name,
            "the decode ceiling reads the dataset's own store alone; measure the ceilings on a \
             dataset without mounts",
        ));
    }
    let spc = ds.variables()[0].geom.samples_per_chunk();
    run_epoch(&ds, split, 0, &|_, _| {})?; // warm-up: process, allocator, page cache
    // Interleave the baseline and the engine so drift on a shared machine hits both alike.
    let mut decode_best = 0.0f64;
    let mut cold_runs = Vec::new();
    for r in 0..repeat {
        let d = crate::readbench::decode_ceiling(ds.root(), threads, 1)?;
        decode_best = decode_best.max(d.decoded_mb_s);
        ds.clear_cache();
        let rep = run_epoch(&ds, split, 1 + r as u64, &|_, _| {})?;
        debug_assert_eq!(rep.stats.cache_hits, 0);
        cold_runs.push((
            rep.stats.bytes_decoded as f64 / rep.seconds / 1e6,
            rep.stats.ttfb_us as f64 / 1e3,
            rep.samples_per_s,
        ));
    }
    drop(ds);
    let best_cold = cold_runs
        .iter()
        .copied()
        .fold((0.0, 0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
    let mut ttfbs: Vec<f64> = cold_runs.iter().map(|r| r.1).collect();
    ttfbs.sort_by(f64::total_cmp);

    let split_bytes = make(None)?.split_bytes(split)?;
    let ds = make(Some(split_bytes))?;
    let mut ceiling = GatherCeiling::preload(&ds, split)?;
    run_epoch(&ds, split, 0, &|_, _| {})?; // fills the pool
    let mut resident = (0.0f64, 0.0f64);
    let mut gather_mb_s = 0.0f64;
    for r in 0..repeat {
        let epoch = 1 + r as u64;
        let (secs, bytes) = ceiling.measure(&ds, epoch, 1)?;
        gather_mb_s = gather_mb_s.max(bytes as f64 / secs / 1e6);
        let rep = run_epoch(&ds, split, epoch, &|_, _| {})?;
        if rep.stats.cache_misses != 0 {
            return Err(EngineError::Runtime(format!(
                "resident epoch had {} misses; the budget should hold the split",
                rep.stats.cache_misses
            )));
        }
        if rep.mb_per_s > resident.0 {
            resident = (rep.mb_per_s, rep.samples_per_s);
        }
    }
    Ok(CeilingReport {
        samples_per_chunk: spc,
        decode_ceiling_mb_s: decode_best,
        cold_decoded_mb_s: best_cold.0,
        cold_ratio: best_cold.0 / decode_best,
        cold_samples_per_s: best_cold.2,
        gather_ceiling_mb_s: gather_mb_s,
        resident_mb_s: resident.0,
        resident_ratio: resident.0 / gather_mb_s,
        resident_samples_per_s: resident.1,
        ttfb_ms_median: ttfbs[ttfbs.len() / 2],
        cold_runs: cold_runs.iter().map(|r| (r.0, r.1)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{SynthSpec, field_value, make_dataset};

    #[test]
    fn the_gather_ceiling_decodes_each_slot_once_and_copies_what_an_epoch_delivers() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("s.zarr");
        let spec = SynthSpec {
            samples: 40,
            grid: (9, 16),
            sample_chunk: 4,
            ..Default::default()
        };
        make_dataset(&store, &spec, false, &|_, _| {}).unwrap();
        let ds = InSituDataset::builder(&store)
            .variable("t2m", "t2m")
            .variable("u10", "u10")
            .batch_size(6)
            .block_chunks(2)
            .build()
            .unwrap();
        let mut ceiling = GatherCeiling::preload(&ds, "all").unwrap();
        // Two arrays of ten chunks, each decoded once.
        assert_eq!(ceiling.loaded_slots(), 20);
        let t2m: Arc<str> = Arc::from("t2m");
        let slot = &ceiling.slots[&(t2m, 3)];
        let values: Vec<f32> = slot
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(values.len(), 4 * 9 * 16);
        for (k, v) in values.iter().enumerate() {
            let (t, rest) = (12 + k as u64 / (9 * 16), k as u64 % (9 * 16));
            assert_eq!(
                *v,
                field_value(0, t, rest / 16, rest % 16, (9, 16)),
                "element {k}"
            );
        }
        for epoch in [1, 2] {
            let (secs, copied) = ceiling.measure(&ds, epoch, 2).unwrap();
            assert!(secs > 0.0);
            // Later epochs read the same chunks in another order: nothing decoded again.
            assert_eq!(ceiling.loaded_slots(), 20);
            let rep = run_epoch(&ds, "all", epoch, &|_, _| {}).unwrap();
            assert_eq!(copied, rep.stats.bytes_delivered);
            assert_eq!(copied, 2 * 40 * 9 * 16 * 4);
        }
    }
}
