//! The NVMe tier's benchmark (`insitubatch bench-cache`), every figure against a baseline
//! measured in the same run:
//!
//! - warm epochs from RAM (a budget holding the split) and revived from the cache directory's
//!   files, with the page cache holding them and with their pages dropped first
//!   (`posix_fadvise(DONTNEED)`), and the third epoch of a run over the cache whose budget holds
//!   the split (revived slots resting mapped onto their files), each against the in-memory
//!   gather ceiling
//!   ([`crate::enginebench::GatherCeiling`]) of the same epoch order;
//! - the cache-filling epoch against a plain cold epoch;
//! - slot-file write MB/s through the tier on io_uring and on the thread fallback, with
//!   O_DIRECT and buffered.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use insitubatch_actors::EngineError;
use insitubatch_pool::disk::{ArrayMeta, CacheConfig, DiskTier, fingerprint};
use insitubatch_pool::{SlotBytes, SlotKey};
use insitubatch_runtime::{IoBackendChoice, RuntimeBuilder};

use crate::InSituDataset;
use crate::enginebench::{GatherCeiling, run_epoch};

/// One warm-epoch measurement.
#[derive(Clone, Debug, Serialize)]
pub struct WarmEpoch {
    /// `ram`, `files (page cache warm)`, `files (pages dropped)` or `files, 3rd epoch of a run`.
    pub source: String,
    /// Delivered MB/s, best of the repeats.
    pub mb_s: f64,
    /// `mb_s` / the gather ceiling.
    pub ratio: f64,
    /// Chunks decoded in the best epoch (must be 0).
    pub decoded_chunks: u64,
    /// Slots revived from files in that epoch.
    pub revived: u64,
    /// Time to first batch of that epoch, ms.
    pub ttfb_ms: f64,
}

/// Slot-file writes through the tier.
#[derive(Clone, Debug, Serialize)]
pub struct WriteRate {
    /// `io_uring` or `threads`.
    pub backend: String,
    /// O_DIRECT or buffered.
    pub direct: bool,
    /// Files written per repeat.
    pub files: usize,
    /// MB/s (file bytes), best of the repeats.
    pub mb_s: f64,
}

/// Everything `bench-cache` measures.
#[derive(Clone, Debug, Serialize)]
pub struct CacheBenchReport {
    /// The split measured.
    pub split: String,
    /// Decoded bytes of the split.
    pub split_bytes: u64,
    /// In-memory gather ceiling, MB/s (best of the repeats).
    pub gather_ceiling_mb_s: f64,
    /// Warm epochs.
    pub warm: Vec<WarmEpoch>,
    /// A plain cold epoch (no cache directory), delivered MB/s.
    pub cold_mb_s: f64,
    /// The epoch that fills a persistent cache, delivered MB/s, O_DIRECT and buffered.
    pub fill_mb_s: Vec<(bool, f64)>,
    /// Write rates.
    pub writes: Vec<WriteRate>,
}

/// Drops the page-cache pages of every slot file in `dir` (after `sync`, so dirty pages are
/// written first and can be dropped).
pub fn drop_file_pages(dir: &Path) -> std::io::Result<usize> {
    drop_pages_where(dir, &|p| p.extension().is_some_and(|e| e == "npy"))
}

/// Drops the page-cache pages of every file under `dir` (recursively) that `keep` selects, after
/// `sync`; returns how many files the kernel took the advice for. A page it still holds (one
/// referenced from a per-CPU batch, say) may stay.
pub fn drop_pages_where(dir: &Path, keep: &dyn Fn(&Path) -> bool) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    let mut n = 0;
    for e in std::fs::read_dir(dir)?.flatten() {
        let path = e.path();
        if e.file_type()?.is_dir() {
            n += drop_pages_where(&path, keep)?;
            continue;
        }
        if !keep(&path) {
            continue;
        }
        let f = std::fs::File::open(&path)?;
        // SAFETY: advice on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc == 0 {
            n += 1;
        }
    }
    Ok(n)
}

/// Runs the benchmark on the store at `root` (every data variable, the default knobs) with cache
/// directories under `work` (created; removed at the end).
pub fn bench_cache(
    root: &Path,
    work: &Path,
    split: &str,
    repeat: usize,
) -> Result<CacheBenchReport, EngineError> {
    let repeat = repeat.max(1);
    let io_err = |e: std::io::Error| EngineError::Runtime(format!("{}: {e}", work.display()));
    std::fs::create_dir_all(work).map_err(io_err)?;
    let builder = || InSituDataset::builder(root);
    let probe = builder().build()?;
    let split_bytes = probe.split_bytes(split)?;
    let g = &probe.variables()[0].geom;
    let slot_bytes = (g.samples_per_chunk() * g.sample_bytes()) as usize;
    drop(probe);

    // The plain cold epoch and the cache-filling epochs (interleaved, best of the repeats).
    let mut cold = 0.0f64;
    let mut fill = [(true, 0.0f64), (false, 0.0f64)];
    for r in 0..repeat {
        let ds = builder().build()?;
        cold = cold.max(run_epoch(&ds, split, r as u64, &|_, _| {})?.mb_per_s);
        drop(ds);
        for (direct, best) in &mut fill {
            let dir = work.join(format!("fill-{direct}"));
            let _ = std::fs::remove_dir_all(&dir);
            let ds = builder()
                .cache_dir(&dir)
                .persist(true)
                .cache_direct_io(*direct)
                .build()?;
            *best = best.max(run_epoch(&ds, split, r as u64, &|_, _| {})?.mb_per_s);
        }
    }

    // Warm epochs: RAM, and files revived by a fresh dataset each time.
    let resident = builder().cache_budget_bytes(split_bytes).build()?;
    let mut gather = GatherCeiling::preload(&resident, split)?;
    run_epoch(&resident, split, 0, &|_, _| {})?;
    let cache = work.join("fill-false");
    let mut ceiling = 0.0f64;
    let mut warm: Vec<WarmEpoch> = [
        "ram",
        "files (page cache warm)",
        "files (pages dropped)",
        "files, 3rd epoch of a run",
    ]
    .iter()
    .map(|s| WarmEpoch {
        source: s.to_string(),
        mb_s: 0.0,
        ratio: 0.0,
        decoded_chunks: 0,
        revived: 0,
        ttfb_ms: 0.0,
    })
    .collect();
    for r in 0..repeat {
        let epoch = 1 + r as u64;
        let (secs, bytes) = gather.measure(&resident, epoch, 1)?;
        ceiling = ceiling.max(bytes as f64 / secs / 1e6);
        for w in warm.iter_mut() {
            let rep = if w.source == "ram" {
                run_epoch(&resident, split, epoch, &|_, _| {})?
            } else if w.source.contains("3rd epoch") {
                // A budget holding the split: the run's first epoch revives every slot, and the
                // slots then rest in the pool mapped onto their files.
                let ds = builder()
                    .cache_dir(&cache)
                    .persist(true)
                    .cache_budget_bytes(split_bytes)
                    .build()?;
                run_epoch(&ds, split, epoch, &|_, _| {})?;
                run_epoch(&ds, split, epoch + 1, &|_, _| {})?;
                run_epoch(&ds, split, epoch + 2, &|_, _| {})?
            } else {
                if w.source.contains("dropped") {
                    drop_file_pages(&cache).map_err(io_err)?;
                }
                let ds = builder().cache_dir(&cache).persist(true).build()?;
                run_epoch(&ds, split, epoch, &|_, _| {})?
            };
            if rep.mb_per_s > w.mb_s {
                w.mb_s = rep.mb_per_s;
                w.decoded_chunks = rep.stats.tiles_read;
                w.revived = rep.stats.cache_revived;
                w.ttfb_ms = rep.stats.ttfb_us as f64 / 1e3;
            }
        }
    }
    for w in &mut warm {
        w.ratio = w.mb_s / ceiling;
    }
    drop(resident);

    let writes = write_rates(work, repeat, slot_bytes, 256)?;
    let _ = std::fs::remove_dir_all(work);
    Ok(CacheBenchReport {
        split: split.to_string(),
        split_bytes,
        gather_ceiling_mb_s: ceiling,
        warm,
        cold_mb_s: cold,
        fill_mb_s: fill.to_vec(),
        writes,
    })
}

/// Writes `files` slot files of `slot_bytes` through the tier (as the decoders do: every
/// write a task, the tier bounding how many are in flight) on each backend, O_DIRECT and
/// buffered; best of `repeat`.
pub fn write_rates(
    work: &Path,
    repeat: usize,
    slot_bytes: usize,
    files: usize,
) -> Result<Vec<WriteRate>, EngineError> {
    let rt_err = |e: insitubatch_runtime::RuntimeError| EngineError::Runtime(e.to_string());
    let data: Vec<u8> = (0..slot_bytes).map(|i| (i * 31 % 251) as u8).collect();
    let bytes = SlotBytes::heap(data);
    let runtimes = [
        ("io_uring", IoBackendChoice::Uring),
        ("threads", IoBackendChoice::Threads),
    ]
    .into_iter()
    .map(|(name, choice)| {
        RuntimeBuilder::new()
            .io_backend(choice)
            .build()
            .map(|rt| (name, rt))
            .map_err(rt_err)
    })
    .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::new();
    for direct in [true, false] {
        let mut best = vec![0.0f64; runtimes.len()];
        // The backends take turns within each repeat, so drift of the device (and of the
        // machine) hits both alike; a `sync` first, so one run's writeback is not the next's.
        for r in 0..repeat {
            for ((name, rt), best) in runtimes.iter().zip(best.iter_mut()) {
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let dir: PathBuf = work.join(format!("writes-{name}-{direct}-{r}"));
                let mut config = CacheConfig::new(&dir);
                config.direct_io = direct;
                let tier = Arc::new(DiskTier::open(
                    config,
                    vec![ArrayMeta {
                        path: "bench".into(),
                        slot_shape: vec![slot_bytes as u64],
                        descr: "|u1".into(),
                        fingerprint: fingerprint(&[]),
                    }],
                )?);
                let start = Instant::now();
                let tasks: Vec<_> = (0..files)
                    .map(|i| {
                        let (tier, bytes) = (Arc::clone(&tier), bytes.clone());
                        rt.handle().spawn("bench-write", move || async move {
                            {
                                let permit = tier
                                    .reserve_write()
                                    .await
                                    .ok_or_else(|| "the cache tier closed".to_string())?;
                                tier.write(&SlotKey::new("bench", i as u64), bytes, permit)
                                    .await
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.join()
                        .map_err(|e| EngineError::Runtime(e.to_string()))?
                        .map_err(EngineError::Runtime)?;
                }
                let secs = start.elapsed().as_secs_f64();
                *best = best.max((files * (slot_bytes + 4096)) as f64 / secs / 1e6);
                drop(tier); // ephemeral: unlinks its files
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        for ((name, _), mb_s) in runtimes.iter().zip(best) {
            out.push(WriteRate {
                backend: name.to_string(),
                direct,
                files,
                mb_s,
            });
        }
    }
    Ok(out)
}
