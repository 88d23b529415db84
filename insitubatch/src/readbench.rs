//! The read layer's benchmark (`insitubatch bench-read`): read + decode every stored chunk of a
//! store through our runtime on each backend, against std::fs::read + zarrs decode on one plain
//! thread per core, and against the raw-bytes ceiling (read every chunk file, no decode).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use insitubatch_runtime::{IoBackendChoice, RuntimeBuilder, probe};
use insitubatch_store::{
    LocalStore, Store, StoreError, ZarrArray, open_geometries, open_hierarchy,
};

/// One measured path.
#[derive(Clone, Debug, Serialize)]
pub struct ReadResult {
    /// What was measured.
    pub engine: String,
    /// Best wall time of the repeats, seconds.
    pub seconds: f64,
    /// Stored chunks read.
    pub chunks: usize,
    /// Encoded bytes read.
    pub bytes_read: u64,
    /// Decoded bytes produced (0 for the raw ceiling).
    pub bytes_decoded: u64,
    /// Decoded MB/s (10^6) — for the raw ceiling, the decoded size of the same chunks divided
    /// by its time, so every row is in the same unit.
    pub decoded_mb_s: f64,
    /// Encoded MB/s.
    pub read_mb_s: f64,
}

type Work = Vec<(Arc<ZarrArray>, Vec<u64>)>;

fn work_list(path: &Path) -> Result<(LocalStore, Work), StoreError> {
    let store = LocalStore::new(path)?;
    let rt = RuntimeBuilder::new()
        .executor_threads(1)
        .build()
        .expect("runtime");
    let st = store.clone();
    let h = rt.block_on(move || async move { open_hierarchy(&st).await })??;
    let geoms = open_geometries(&h, None, 0)?;
    let mut work = Vec::new();
    for name in geoms.keys() {
        let a = Arc::new(h.arrays[name].clone());
        for idx in a.chunk_indices() {
            work.push((Arc::clone(&a), idx));
        }
    }
    Ok((store, work))
}

fn result(
    engine: &str,
    seconds: f64,
    work: &Work,
    read: u64,
    decoded_equiv: u64,
    decoded: u64,
) -> ReadResult {
    ReadResult {
        engine: engine.to_string(),
        seconds,
        chunks: work.len(),
        bytes_read: read,
        bytes_decoded: decoded,
        decoded_mb_s: decoded_equiv as f64 / seconds / 1e6,
        read_mb_s: read as f64 / seconds / 1e6,
    }
}

fn runtime_pass(
    store: &LocalStore,
    work: &Arc<Work>,
    choice: IoBackendChoice,
    threads: usize,
    inflight: usize,
) -> (f64, u64, u64) {
    let rt = RuntimeBuilder::new()
        .executor_threads(threads)
        .io_backend(choice)
        .build()
        .expect("runtime");
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    // `inflight` tasks per executor pull chunks from a shared counter: reads overlap decodes.
    let mut handles = Vec::new();
    for e in 0..threads {
        for _ in 0..inflight {
            let (store, work, next) = (store.clone(), Arc::clone(work), Arc::clone(&next));
            handles.push(rt.spawn_on(e, "bench", move || async move {
                let (mut read, mut decoded) = (0u64, 0u64);
                // One read buffer per task, reused (as the engine recycles its read buffers).
                let mut buf = Vec::new();
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some((a, idx)) = work.get(k) else { break };
                    let key = a.chunk_key(idx).expect("key");
                    let enc = store
                        .get_into(&key, std::mem::take(&mut buf))
                        .await
                        .expect("read");
                    read += enc.as_ref().map_or(0, |b| b.len() as u64);
                    let c = a
                        .decode_chunk_from(idx, enc.as_deref(), || store.locate(&key))
                        .expect("decode");
                    decoded += c.bytes.len() as u64;
                    buf = enc.unwrap_or_default();
                }
                (read, decoded)
            }));
        }
    }
    let (mut read, mut decoded) = (0, 0);
    for h in handles {
        let (r, d) = h.join().expect("bench task");
        read += r;
        decoded += d;
    }
    (start.elapsed().as_secs_f64(), read, decoded)
}

fn plain_pass(store: &LocalStore, work: &Work, threads: usize, decode: bool) -> (f64, u64, u64) {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let totals: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let (mut read, mut decoded) = (0u64, 0u64);
                    let mut buf = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some((a, idx)) = work.get(k) else { break };
                        let key = a.chunk_key(idx).expect("key");
                        let path = store.locate(&key);
                        // A reused buffer, like the runtime paths.
                        buf.clear();
                        let found = std::fs::File::open(&path)
                            .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut buf))
                            .is_ok();
                        let enc = found.then_some(buf.as_slice());
                        read += enc.map_or(0, |b| b.len() as u64);
                        if decode {
                            decoded += a
                                .decode_chunk_from(idx, enc, || path.clone())
                                .expect("decode")
                                .bytes
                                .len() as u64;
                        }
                    }
                    (read, decoded)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let (read, decoded) = totals
        .into_iter()
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    (start.elapsed().as_secs_f64(), read, decoded)
}

/// Runs every path `repeat` times (after one warm-up pass that fills the page cache) and
/// keeps each path's best time. `threads` is the executor / plain-thread count; the runtime runs
/// on each backend with each count of `inflight` reads per executor.
pub fn bench_read(
    path: &Path,
    repeat: usize,
    threads: usize,
    inflight: &[usize],
) -> Result<Vec<ReadResult>, StoreError> {
    let (store, work) = work_list(path)?;
    let work = Arc::new(work);
    let decoded_total: u64 = work.iter().map(|(a, _)| a.chunk_bytes_decoded()).sum();
    // Warm the page cache.
    let _ = plain_pass(&store, &work, threads, false);
    let mut backends = vec![("threads", IoBackendChoice::Threads)];
    if probe().unavailable.is_none() {
        backends.insert(0, ("io_uring", IoBackendChoice::Uring));
    }
    let runtime_paths: Vec<(String, IoBackendChoice, usize)> = backends
        .iter()
        .flat_map(|&(name, choice)| {
            inflight.iter().map(move |&n| {
                let reads = if n == 1 { "read" } else { "reads" };
                (
                    format!(
                        "insitubatch runtime, {name} backend, {n} {reads} in flight per executor"
                    ),
                    choice,
                    n,
                )
            })
        })
        .collect();
    let n = runtime_paths.len();
    let mut best: Vec<Option<(f64, u64, u64)>> = vec![None; n + 2];
    let mut keep = |i: usize, r: (f64, u64, u64)| {
        if best[i].is_none_or(|b| r.0 < b.0) {
            best[i] = Some(r);
        }
    };
    for _ in 0..repeat.max(1) {
        // Interleave the paths so drift on a shared machine hits all of them alike.
        for (i, (_, choice, n)) in runtime_paths.iter().enumerate() {
            keep(i, runtime_pass(&store, &work, *choice, threads, *n));
        }
        keep(n, plain_pass(&store, &work, threads, true));
        keep(n + 1, plain_pass(&store, &work, threads, false));
    }
    let mut names: Vec<String> = runtime_paths.into_iter().map(|(name, ..)| name).collect();
    names.push("std::fs::read + zarrs decode, one plain thread per core".into());
    names.push("raw read ceiling (std::fs::read, no decode)".into());
    Ok(names
        .iter()
        .zip(best)
        .map(|(name, b)| {
            let (secs, read, decoded) = b.expect("measured");
            result(name, secs, &work, read, decoded_total, decoded)
        })
        .collect())
}

/// The read layer's all-core decode ceiling: `std::fs::read` + zarrs decode of every stored
/// chunk of the store's data variables on `threads` plain threads, best of `repeat` after a
/// warm-up pass. The engine benchmark's baseline (a).
pub fn decode_ceiling(
    path: &Path,
    threads: usize,
    repeat: usize,
) -> Result<ReadResult, StoreError> {
    let (store, work) = work_list(path)?;
    let decoded_total: u64 = work.iter().map(|(a, _)| a.chunk_bytes_decoded()).sum();
    let _ = plain_pass(&store, &work, threads, false);
    let mut best: Option<(f64, u64, u64)> = None;
    for _ in 0..repeat.max(1) {
        let r = plain_pass(&store, &work, threads, true);
        if best.is_none_or(|b| r.0 < b.0) {
            best = Some(r);
        }
    }
    let (secs, read, decoded) = best.expect("measured at least once");
    Ok(result(
        "std::fs::read + zarrs decode, one plain thread per core",
        secs,
        &work,
        read,
        decoded_total,
        decoded,
    ))
}
