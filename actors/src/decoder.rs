//! The decoder: runs the array's codec chain on a stored chunk's bytes and delivers the result
//! into its slot, adopting the buffer when the layout allows and copying the tile's rectangle
//! when the field is inner-chunked or the sample axis is not first. The array's chunk
//! transforms ([`crate::transform`]) run on the complete slot before it becomes ready. A chunk
//! nothing keeps goes to its samples' batch rows instead (`decode_into_rows`,
//! `crate::assembly`).
//!
//! A chunk the page cache held is decoded by the fetcher worker that read it, at once and on
//! the same core (`decode`), while the read has left its bytes in that core's cache. A chunk
//! whose read had to wait for the device comes here instead: one decoder worker per executor,
//! all draining one shared mailbox, so whichever core is free decodes it (see
//! `docs/architecture.md`, "Departures").

use std::sync::Arc;

use insitubatch_pool::{PendingWrite, Slot, SlotFailure};
use insitubatch_runtime::{ActorPool, Mailbox, yield_now};
use insitubatch_store::{DType, DecodedChunk, Store, StoreError, ZarrArray};

use crate::assembly::{ChunkRows, RowDest};
use crate::error::EngineError;
use crate::fetcher::{Dest, TileJob};
use crate::gather::stream::stores_done;
use crate::pass::{EngineContext, OnBadChunk, PanicGuard, PassShared, lock};
use crate::stats::{BadChunk, Counters};
use crate::tile::TileLayout;

/// Mailbox capacity of a decoder; `max_inflight` bounds the total anyway.
const DECODER_MAILBOX: usize = 64;

/// Bytes of a stored chunk on their way to the decoder (`None`: the key does not exist, so the
/// chunk is the fill value).
pub struct DecodeJob {
    pub(crate) job: TileJob,
    pub(crate) bytes: Option<Vec<u8>>,
}

pub(crate) fn spawn<S: Store>(
    ctx: &Arc<EngineContext<S>>,
    shared: &Arc<PassShared>,
) -> ActorPool<DecodeJob> {
    let ctx = Arc::clone(ctx);
    let shared = Arc::clone(shared);
    let rt = ctx.runtime.clone();
    let workers = rt.executor_threads();
    rt.spawn_actor_pool(
        "decoder",
        DECODER_MAILBOX,
        workers,
        move |_, mut inbox: Mailbox<DecodeJob>| {
            let (ctx, shared) = (Arc::clone(&ctx), Arc::clone(&shared));
            async move {
                let _guard = PanicGuard {
                    shared: &shared,
                    actor: "decoder",
                };
                while let Some(DecodeJob { job, bytes }) = inbox.recv().await {
                    decode(&ctx, &shared, job, bytes).await;
                }
            }
        },
    )
}

/// Decodes one stored chunk's bytes (`None`: the key does not exist, so the chunk is the fill
/// value), returns the read buffer for reuse and delivers the tile into its slot, or handles the
/// chunk as bad.
pub(crate) async fn decode<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    job: TileJob,
    bytes: Option<Vec<u8>>,
) {
    if shared.is_cancelled() {
        job.cancel();
        return;
    }
    if shared.config.panic_on_tile == Some(job.ordinal) {
        panic!("injected decoder panic on tile {}", job.ordinal);
    }
    if matches!(job.dest, Dest::Rows(_)) {
        decode_into_rows(ctx, shared, job, bytes).await;
        return yield_now().await;
    }
    let array = &shared.arrays[job.path];
    let locate = || ctx.store.locate(&job.key);
    // A part of a shard decodes only the inner chunks it touches; anything else is decoded
    // whole (the codec's unit) and its part copied out.
    let (decoded, buffer) = match &job.part {
        Some(parts) => decode_parts(array, &job.index, bytes, parts, locate),
        None => {
            let decoded = array.decode_chunk_from(&job.index, bytes.as_deref(), locate);
            (decoded, bytes)
        }
    };
    if let Some(b) = buffer {
        ctx.read_buffers.give(b);
    }
    match decoded {
        Ok(chunk) => {
            Counters::add(&shared.counters.bytes_decoded, chunk.bytes.len() as u64);
            deliver(ctx, job, chunk.bytes, true).await;
        }
        Err(e) => bad_chunk(ctx, job, e).await,
    }
    // A decode holds the core for a while; let IO completions and other tasks on this executor
    // run before the next one.
    yield_now().await;
}

thread_local! {
    /// This thread's buffer for a chunk whose samples go to several batch rows: decoded here,
    /// while it is in this core's cache, then copied row by row. Kept (at the largest chunk's
    /// size) so no decode lands in freshly mapped pages.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes a stored chunk into its samples' batch rows (see `crate::assembly`): a one-sample
/// chunk that is its row byte for byte straight into it, any other into this thread's scratch
/// buffer and from there into each row (its box of the view's region, sample-first; a chunk
/// whose field is several stored chunks gets each one's box from its own job). A cropped view
/// of a shard decodes only the inner chunks its region touches, into a buffer of their own.
async fn decode_into_rows<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    job: TileJob,
    bytes: Option<Vec<u8>>,
) {
    let Dest::Rows(rows) = &job.dest else {
        unreachable!("called for a job with rows")
    };
    let array = &shared.arrays[job.path];
    let layout = job.layout.as_deref().unwrap_or(&shared.layouts[job.path]);
    let (index, key, tile) = (&job.index, &job.key, job.tile);
    let locate = || ctx.store.locate(key);
    // Bytes decoded, and the read buffer to recycle.
    let (decoded, buffer) = match &job.part {
        // Several rows' windows of a shard: each inner chunk under any of them decoded and
        // copied into the rows it is under before the next, so nothing holds them all.
        Some(parts) if rows.has_regions() => {
            array.decode_chunk_subsets(index, bytes, parts, locate, |part, decoded| {
                rows.copy_part_into_regions(index, part, &decoded);
            })
        }
        Some(parts) => {
            let (decoded, buffer) = decode_parts(array, index, bytes, parts, locate);
            let copied = decoded.map(|chunk| {
                copy_tile(rows, (layout, index, tile), &chunk.bytes);
                chunk.bytes.len() as u64
            });
            (copied, buffer)
        }
        None => {
            let at = (layout, index.as_slice(), tile);
            let decoded = decode_whole_into_rows(array, at, rows, bytes.as_deref(), locate);
            (decoded.map(|()| array.chunk_bytes_decoded()), bytes)
        }
    };
    if let Some(b) = buffer {
        ctx.read_buffers.give(b);
    }
    match decoded {
        Ok(n) => {
            Counters::add(&shared.counters.bytes_decoded, n);
            rows_filled(job, true);
        }
        // A `nan` stand-in is copied into the rows by `deliver`.
        Err(e) => bad_chunk(ctx, job, e).await,
    }
}

/// Decodes a whole stored chunk (`index`, tile `tile` of `layout`) into `rows`: straight into
/// the row when it is one sample that is its row byte for byte, else into this thread's scratch
/// buffer and each sample's box from there.
fn decode_whole_into_rows(
    array: &ZarrArray,
    (layout, index, tile): (&TileLayout, &[u64], u64),
    rows: &ChunkRows,
    bytes: Option<&[u8]>,
    locate: impl Fn() -> std::path::PathBuf,
) -> Result<(), StoreError> {
    // A one-tile chunk's rows are this job's alone, so decoding into them under their lock
    // holds nobody up.
    let straight = rows.write(|r| match r {
        [Some(row)] if layout.can_adopt() && row.cut.is_none() => {
            Some(array.decode_chunk_into(index, bytes, row.bytes_mut(), &locate))
        }
        _ => None,
    });
    if let Some(decoded) = straight {
        return decoded;
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let n = array.chunk_bytes_decoded() as usize;
        if scratch.len() < n {
            scratch.resize(n, 0);
        }
        let chunk = &mut scratch[..n];
        // Decoded without the rows' lock, so a chunk's tiles decode at once on several
        // executors; only their copies take turns.
        array
            .decode_chunk_into(index, bytes, chunk, &locate)
            .map(|()| copy_tile(rows, (layout, index, tile), chunk))
    })
}

/// Copies decoded stored chunk `index` (tile `tile` of `layout`), or a bad one's stand-in,
/// into `rows`: each sample's box (`copy_rows`), or for rows read as regions of their own,
/// its box of each region it is under.
fn copy_tile(rows: &ChunkRows, (layout, index, tile): (&TileLayout, &[u64], u64), chunk: &[u8]) {
    if rows.has_regions() {
        rows.copy_into_regions(index, chunk);
    } else {
        rows.write(|r| copy_rows(layout, tile, chunk, r, rows.per_sample()));
    }
}

/// Copies each sample of a decoded stored chunk (tile `tile` of `layout`) into its batch row
/// (samples that no row of the pass reads are skipped): whole samples when the chunk is the
/// slot byte for byte (or each row's patch of it, `per_sample` rows per sample), else each
/// sample's part of the view's region.
fn copy_rows(
    layout: &TileLayout,
    tile: u64,
    chunk: &[u8],
    rows: &mut [Option<RowDest>],
    per_sample: usize,
) {
    if !layout.can_adopt() {
        debug_assert_eq!(
            per_sample, 1,
            "several rows of a sample are patches of a whole one"
        );
        let mut dsts: Vec<Option<&mut [u8]>> = rows
            .iter_mut()
            .map(|r| r.as_mut().map(RowDest::bytes_mut))
            .collect();
        return layout.copy_into_rows(tile, chunk, &mut dsts);
    }
    let sample = chunk.len() / (rows.len() / per_sample).max(1);
    for (i, row) in rows.iter_mut().enumerate() {
        if let Some(row) = row {
            let w = i / per_sample;
            row.write_sample(&chunk[w * sample..(w + 1) * sample]);
        }
    }
    stores_done();
}

/// Counts a job's tile, `decoded` or a bad one's stand-in, into its chunk's rows (the last
/// tile counts the rows filled, and the chunk as decoded into rows if every tile was), wakes
/// the gather and completes the job.
fn rows_filled(mut job: TileJob, decoded: bool) {
    if let Dest::Rows(rows) = std::mem::replace(&mut job.dest, Dest::Filled)
        && rows.tile_done(decoded)
    {
        Counters::add(&job.shared.counters.tiles_into_batches, 1);
    }
    job.shared.notify.notify_all();
    job.finish();
}

/// Decodes `parts` of a shard one after another into one buffer (what
/// [`TileLayout::copy_into_slot`](crate::tile::TileLayout::copy_into_slot) takes).
fn decode_parts(
    array: &ZarrArray,
    index: &[u64],
    bytes: Option<Vec<u8>>,
    parts: &[Vec<std::ops::Range<u64>>],
    locate: impl FnOnce() -> std::path::PathBuf,
) -> (Result<DecodedChunk, StoreError>, Option<Vec<u8>>) {
    if let [part] = parts {
        return array.decode_chunk_subset(index, bytes, part, locate);
    }
    let total: u64 = parts
        .iter()
        .map(|p| p.iter().map(|r| r.end - r.start).product::<u64>())
        .sum();
    let mut out = Vec::with_capacity(total as usize * array.dtype().size_bytes());
    let (decoded, bytes) = array.decode_chunk_subsets(index, bytes, parts, locate, |_, d| {
        out.extend_from_slice(&d);
    });
    let chunk = decoded.map(|_| DecodedChunk {
        shape: vec![total],
        dtype: array.dtype(),
        bytes: out,
        is_fill: false,
    });
    (chunk, bytes)
}

/// Puts a decoded tile into its slot and completes the job. With a cache directory the
/// finished slot is also written to its file, in the background: the slot is ready (on the heap)
/// at once, and moves onto the mapped file when it lands and nothing pins the slot. A slot
/// holding a substituted tile (`cacheable` false) is never written, so a stand-in for a bad
/// chunk is never cached as data.
pub(crate) async fn deliver<S: Store>(
    ctx: &EngineContext<S>,
    mut job: TileJob,
    bytes: Vec<u8>,
    cacheable: bool,
) {
    let slot = match &mut job.dest {
        Dest::Slot(slot) => Arc::clone(slot),
        Dest::Rows(rows) => {
            // A stand-in for a bad chunk (a decoded chunk goes `decode_into_rows`).
            let layout = job
                .layout
                .as_deref()
                .unwrap_or(&job.shared.layouts[job.path]);
            copy_tile(rows, (layout, &job.index, job.tile), &bytes);
            return rows_filled(job, false);
        }
        Dest::Filled => unreachable!("a filled row's job is complete"),
    };
    let layout = &job.shared.layouts[job.path];
    let pipeline = &job.shared.pipelines[job.path];
    let dtype = job.shared.arrays[job.path].dtype();
    if !cacheable {
        slot.mark_uncacheable();
    }
    // The pool must know the slot's file is coming before the slot is ready: from that moment
    // the gather may drain and unpin it and the budget evict it, and a re-admission before the
    // file lands must take it from memory rather than fetch and decode it again (it is not in
    // the log yet). Dropped unwritten if this tile does not complete the slot.
    let writable = ctx.pool.disk().is_some_and(|d| !d.readonly());
    let pending = (writable && slot.is_cacheable()).then(|| ctx.pool.begin_write(&slot));
    // The chunk transforms run on the whole chunk, before its slot is ready: on the decoded
    // tile that is the whole chunk, or on the chunk assembled from its tiles once the last is
    // in. What they return (of the slot's size: the plan sized it by their output) is the slot.
    // An error below means the slot is no longer loading (the pass failed); nothing to deliver
    // to.
    let transform = |chunk: Vec<u8>| {
        let key = slot.key();
        pipeline
            .apply(&key.path, key.chunk, layout.chunk_shape(), dtype, chunk)
            .map_err(|e| format!("array `{}` chunk {}: {e}", key.path, job.key))
    };
    let mut broken: Option<String> = None;
    // A region slot's inner chunks go in one by one (a bad chunk's stand-in is the whole
    // stored chunk, copied like one).
    let parts = job.part.as_deref().filter(|_| job.inner_parts && cacheable);
    let completed = if layout.can_adopt() && parts.is_none() {
        match transform(bytes) {
            Ok(bytes) => slot.adopt(bytes).is_ok(),
            Err(e) => {
                broken = Some(e);
                false
            }
        }
    } else {
        let fill = |buf: &mut [u8]| match parts {
            Some(parts) => layout.copy_parts_into_slot(job.tile, parts, &bytes, buf),
            None => layout.copy_into_slot(job.tile, &bytes, buf),
        };
        let finish = |chunk| transform(chunk).inspect_err(|e| broken = Some(e.clone()));
        slot.deliver_tile(layout.chunk_bytes(), fill, finish)
            .unwrap_or(false)
    };
    if let Some(message) = broken {
        // A transform that failed, or whose output broke its promise, ends the pass, naming
        // it: a slot of the wrong size must never reach the pool, the gather or the cache.
        job.shared.fail(EngineError::Transform(message.clone()));
        slot.fail(SlotFailure {
            cancelled: false,
            message: message.into(),
        });
        job.finish();
        return;
    }
    if let Some(pending) = pending
        && completed
        && slot.is_cacheable()
    {
        persist_in_background(ctx, &job, &slot, pending).await;
    }
    job.finish();
}

/// Writes a just-completed slot to the cache directory on a task; the pass joins it before it
/// ends. Waits first for room among the tier's writes in flight (holding this job's
/// `max_inflight` permit meanwhile), so a device slower than decoding slows decoding down
/// instead of piling up slots' bytes in pending writes.
async fn persist_in_background<S: Store>(
    ctx: &EngineContext<S>,
    job: &TileJob,
    slot: &Slot,
    pending: PendingWrite,
) {
    let Some(disk) = ctx.pool.disk() else {
        return;
    };
    let Some(bytes) = slot.bytes() else {
        return;
    };
    let Some(permit) = disk.reserve_write().await else {
        return;
    };
    let disk = Arc::clone(disk);
    let handle = ctx.runtime.spawn("cache-write", move || async move {
        // The turn may have come after the slot was evicted: an ephemeral file is not wanted.
        let Some(pending) = pending.unless_evicted() else {
            return;
        };
        // A failure is warned about by the tier; the slot stays on the heap. A slot evicted
        // while its file was written has that file unlinked here, off this thread.
        if let Ok(mapped) = disk.write(pending.slot().key(), bytes, permit).await {
            pending.landed(mapped).run().await;
        }
    });
    let mut writes = lock(&job.shared.cache_writes);
    writes.retain(|h| !h.is_finished());
    writes.push(handle);
}

/// A stored chunk that could not be read or decoded: fail the pass, or fill and record it.
pub(crate) async fn bad_chunk<S: Store>(ctx: &EngineContext<S>, job: TileJob, err: StoreError) {
    let shared = Arc::clone(&job.shared);
    match shared.config.on_bad_chunk {
        OnBadChunk::Raise => {
            // The pass's error first, so a gather woken by the slot's failure reports it.
            let message = err.to_string();
            shared.fail(err.into());
            if let Some(slot) = job.dest.slot() {
                slot.fail(SlotFailure {
                    cancelled: false,
                    message: message.into(),
                });
            }
            job.finish();
        }
        OnBadChunk::Nan => {
            let array = &shared.arrays[job.path];
            // Listed once: a stand-in is never written to a cache file, so a pass that
            // releases each block's chunks and revives them from the cache directory (windows,
            // shuffle and `persist`) reads a bad chunk again for a later block.
            {
                let mut listed = lock(&shared.bad_chunks);
                if !listed.iter().any(|b| b.key == job.key) {
                    listed.push(BadChunk {
                        array: array.path().to_string(),
                        chunk_index: job.index.clone(),
                        key: job.key.clone(),
                        message: err.to_string(),
                    });
                }
            }
            deliver(ctx, job, nan_chunk(array), false).await;
        }
    }
}

/// A whole stored chunk of NaN (float and complex dtypes) or the array's fill value.
pub(crate) fn nan_chunk(array: &ZarrArray) -> Vec<u8> {
    let mut bytes = array.fill_chunk().bytes;
    let pattern: Vec<u8> = match array.dtype() {
        DType::Float16 => 0x7e00u16.to_ne_bytes().to_vec(),
        DType::Float32 | DType::Complex64 => f32::NAN.to_ne_bytes().to_vec(),
        DType::Float64 | DType::Complex128 => f64::NAN.to_ne_bytes().to_vec(),
        _ => return bytes,
    };
    for c in bytes.chunks_exact_mut(pattern.len()) {
        c.copy_from_slice(&pattern);
    }
    bytes
}
