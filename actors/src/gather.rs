//! The gather: waits for the slots each batch reads, copies every row straight from its slot
//! into a pooled batch buffer (or, when the batch's rows were decoded into its buffers, waits
//! for them and copies the rest; `crate::assembly`), releases a block once its last row is
//! consumed, and pushes the batch into the prefetch channel (bounded: `prefetch_depth`).
//!
//! Batches are cut over the whole epoch order, so only the last one is short; a batch may span
//! a block boundary, which the two monotone frontiers (wait, release) handle.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use insitubatch_pool::{PooledBuf, Slot};
use insitubatch_runtime::{JoinHandle, yield_now};
use insitubatch_store::Store;

mod copy;
pub mod stream;

use self::copy::{CopyJob, CopyRun};
use crate::assembly::batch_buffers;
use crate::batch::{Batch, BatchArray};
use crate::error::EngineError;
use crate::pass::{EngineContext, PanicGuard, PassShared, SlotEntry, lock};
use crate::patch::origin_key;
use crate::planner::row_runs;
use crate::sample_map::AnchorMap;
use crate::stats::Counters;

type Tx = flume::Sender<Result<Batch, EngineError>>;

/// A batch row's location when its chunk was decoded straight into it (no slot to copy from).
const IN_PLACE: u32 = u32::MAX;

pub(crate) fn spawn<S: Store>(
    ctx: &Arc<EngineContext<S>>,
    shared: &Arc<PassShared>,
    tx: Tx,
) -> JoinHandle<()> {
    let ctx = Arc::clone(ctx);
    let shared = Arc::clone(shared);
    // Urgent: once a slot it waits for is filled, the gather runs before the decodes queued on
    // its executor, so a batch whose slots are ready is not held back by reads it does not need
    // (a sequential pass's first batch waited behind three more 15 ms decodes without it).
    ctx.runtime
        .clone()
        .spawn_urgent_on(0, "gather", move || async move {
            let _guard = PanicGuard {
                shared: &shared,
                actor: "gather",
            };
            if let Err(e) = run(&ctx, &shared, &tx).await {
                shared.fail(e.clone());
                let _ = tx.send_async(Err(e)).await;
            }
        })
}

/// Waits until plan slot `s` is ready; `None` when its chunk is decoded straight into its
/// batch row instead (see [`wait_rows`]).
async fn wait_slot(shared: &PassShared, s: u32) -> Result<Option<Arc<Slot>>, EngineError> {
    loop {
        let generation = shared.notify.generation();
        if let Some(e) = shared.error() {
            return Err(e);
        }
        let slot = match &lock(&shared.slots)[s as usize] {
            SlotEntry::Admitted(slot, _) => Some(Arc::clone(slot)),
            SlotEntry::Direct(_) => return Ok(None),
            SlotEntry::Pending => None,
            SlotEntry::Released => {
                return Err(EngineError::Runtime(format!(
                    "internal error: slot {s} released before its last read"
                )));
            }
        };
        if let Some(slot) = slot {
            return match slot.wait().await {
                Ok(()) => Ok(Some(slot)),
                Err(f) => Err(shared.slot_error(&f)),
            };
        }
        shared.notify.changed_since(generation).await;
    }
}

/// Waits until `rows` rows of batch `j` are decoded into its buffers, and takes them.
async fn wait_rows(
    shared: &PassShared,
    j: usize,
    rows: usize,
) -> Result<Vec<PooledBuf>, EngineError> {
    let internal = |what: &str| EngineError::Runtime(format!("internal error: batch {j} {what}"));
    let batch = shared
        .assemblies
        .close(j)
        .ok_or_else(|| internal("has rows decoded in place but no buffers"))?;
    loop {
        let generation = shared.notify.generation();
        if let Some(e) = shared.error() {
            return Err(e);
        }
        if batch.filled() >= rows {
            return batch.take().ok_or_else(|| internal("was taken twice"));
        }
        shared.notify.changed_since(generation).await;
    }
}

fn release(shared: &PassShared, s: u32, held: &mut HashMap<u32, Arc<Slot>>) {
    let entry = std::mem::replace(&mut lock(&shared.slots)[s as usize], SlotEntry::Released);
    match entry {
        SlotEntry::Admitted(slot, permit) => {
            shared.owner.unpin(&slot);
            drop(permit);
        }
        SlotEntry::Direct(permit) => drop(permit),
        SlotEntry::Pending | SlotEntry::Released => {}
    }
    held.remove(&s);
}

/// Below this many bytes a batch is copied by the gather alone: a helper task costs a
/// cross-core wake, which is worth it only for a copy of a millisecond or more.
const PARALLEL_COPY_MIN_BYTES: usize = 4 << 20;

/// The same threshold for a batch read from cache files: a kernel copy out of the page cache
/// costs more per byte than a `memcpy`, so sharing it pays off sooner.
const PARALLEL_READ_MIN_BYTES: usize = 1 << 20;

/// Parts a shared batch copy is cut into per executor, and part-takers per executor. Measured
/// on revived slots (kernel copies out of the page cache): with one part per executor the
/// gather waited 30–40 ms per epoch of 128 batches for the other core's part, with four 5–8 ms;
/// four takers per executor keep every part's reads in flight when they wait for the device
/// (`docs/benchmarks.md`, "NVMe tier").
const PARTS_PER_EXECUTOR: usize = 4;

/// Copies the parts of `job` not yet taken, one at a time, until none is left.
async fn copy_parts(
    job: &Arc<CopyJob>,
    parts: &[std::ops::Range<usize>],
    next: &AtomicUsize,
) -> Result<(), String> {
    let mut outcome = Ok(());
    loop {
        let Some(part) = parts.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return outcome;
        };
        outcome = outcome.and(job.copy_part(part.clone()).await);
    }
}

/// Copies a batch — on every executor when it is large and nothing is being decoded — and hands
/// back the filled buffers.
async fn copy_batch<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    job: CopyJob,
) -> Result<Vec<insitubatch_pool::PooledBuf>, EngineError> {
    let n_exec = ctx.runtime.executor_threads();
    let job = Arc::new(job);
    let file_bytes = job.file_bytes();
    Counters::add(&shared.counters.bytes_revived, file_bytes as u64);
    let min_bytes = if file_bytes > 0 {
        PARALLEL_READ_MIN_BYTES
    } else {
        PARALLEL_COPY_MIN_BYTES
    };
    // Helpers only when the other cores are free: with stored chunks in flight they are
    // decoding, a helper would queue behind a decode, and the gather would wait for it while
    // the copy it could have done itself sits idle.
    let decoders_idle = ctx.inflight.available() == ctx.inflight.total();
    let copied = if n_exec == 1 || job.bytes() < min_bytes || !decoders_idle {
        job.copy_part(job.parts(1).remove(0)).await
    } else {
        // More parts than cores, taken in turn: a core that is slower for a while (other work
        // on it, such as the planner's admissions) takes fewer of them. The gather runs
        // on executor 0 (see `spawn`), helpers on the others. Each helper drops its handle on
        // the job before it finishes, so once all are joined the job is ours alone again; if
        // this future is dropped first, the helpers (and reads in flight) keep the buffers alive
        // until they are done writing.
        let parts = Arc::new(job.parts(n_exec * PARTS_PER_EXECUTOR));
        let next = Arc::new(AtomicUsize::new(0));
        // As many takers as parts per executor, on every executor: from the page cache a part
        // completes within its first poll, so an executor's takers run one after another; when
        // reads wait for the device, every part's reads are in flight at once.
        let helpers: Vec<_> = (1..(n_exec * PARTS_PER_EXECUTOR).min(parts.len()))
            .map(|t| {
                let k = t % n_exec;
                let (job, parts, next) = (Arc::clone(&job), Arc::clone(&parts), Arc::clone(&next));
                ctx.runtime.spawn_on(k, "gather-copy", move || async move {
                    let r = copy_parts(&job, &parts, &next).await;
                    drop(job);
                    r
                })
            })
            .collect();
        let mut outcome = copy_parts(&job, &parts, &next).await;
        for h in helpers {
            let r = h.await.map_err(|e| EngineError::ActorPanicked {
                actor: "gather".into(),
                message: e.to_string(),
            })?;
            outcome = outcome.and(r);
        }
        outcome
    };
    copied.map_err(EngineError::Runtime)?;
    job.into_buffers().map_err(|_| {
        EngineError::Runtime("internal error: a batch copy is still shared after its join".into())
    })
}

async fn run<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    tx: &Tx,
) -> Result<(), EngineError> {
    let plan = &shared.plan;
    let order = &shared.order;
    let labels: Arc<[String]> = plan.labels.iter().map(|l| l.label.clone()).collect();
    let maps: Arc<[AnchorMap]> = plan.labels.iter().map(|l| l.map.clone()).collect();
    let names: Arc<[String]> = plan.outputs.iter().map(|o| o.name.clone()).collect();
    let n_rows = order.rows.len();
    let mut held: HashMap<u32, Arc<Slot>> = HashMap::new();
    let mut next_release = 0usize;
    let mut locs: Vec<(u32, u64)> = Vec::new();
    for j in 0..plan.n_batches {
        let rows = plan.batch_rows(j, n_rows);
        let n = rows.len();
        plan.locate_rows(order, rows.clone(), &mut locs);
        // Rows decoded in place are in the batch's buffers already: counted, and left out of
        // the copy (their location becomes `IN_PLACE`).
        let mut in_place = 0;
        for loc in locs.iter_mut() {
            let s = loc.0;
            if let Entry::Vacant(v) = held.entry(s) {
                match wait_slot(shared, s).await? {
                    Some(slot) => {
                        v.insert(slot);
                    }
                    None => {
                        in_place += 1;
                        *loc = (IN_PLACE, 0);
                    }
                }
            }
        }
        let bufs = if in_place > 0 {
            wait_rows(shared, j, in_place).await?
        } else {
            batch_buffers(&ctx.buffers, plan, j, n_rows)?
        };
        // A patch's origin per row, the same for every label of the row.
        let origins: Option<Vec<u64>> = plan.patch.as_ref().map(|p| {
            let key = origin_key(&shared.config.split, shared.config.epoch);
            rows.clone()
                .flat_map(|i| p.origin(shared.config.seed, key, order.anchor(i), order.patch(i)))
                .collect()
        });
        // The copy plan: one run per stretch of consecutive rows of one slot (sequential passes
        // coalesce whole slots; a stacked label's rows are apart, one run each; a patch is a run
        // per line of it), then the copy itself, split across cores when it is large.
        let mut slot_ids: Vec<u32> = Vec::new();
        let mut runs = Vec::new();
        for (l, info) in plan.labels.iter().enumerate() {
            let sb = info.sample_bytes as usize;
            let contiguous = plan.outputs[info.output].row_bytes == info.sample_bytes;
            for (r, s, w, run) in row_runs(&locs[l * n..(l + 1) * n]) {
                if s == IN_PLACE {
                    continue;
                }
                let slot = match slot_ids.iter().position(|&x| x == s) {
                    Some(i) => i,
                    None => {
                        slot_ids.push(s);
                        slot_ids.len() - 1
                    }
                };
                let (buf, dst) = plan.row_at(l, r);
                let src = w as usize * sb;
                if let (Some(cut), Some(origins)) = (&info.cut, &origins) {
                    let k = origins.len() / n;
                    for i in 0..run {
                        let (at, row) = (src + i * sb, plan.row_at(l, r + i).1);
                        cut.runs(&origins[(r + i) * k..(r + i + 1) * k], |s, d, len| {
                            runs.push(CopyRun {
                                buf,
                                dst: row + d,
                                slot,
                                src: at + s,
                                len,
                            });
                        });
                    }
                } else if contiguous {
                    runs.push(CopyRun {
                        buf,
                        dst,
                        slot,
                        src,
                        len: run * sb,
                    });
                } else {
                    runs.extend((0..run).map(|k| CopyRun {
                        buf,
                        dst: plan.row_at(l, r + k).1,
                        slot,
                        src: src + k * sb,
                        len: sb,
                    }));
                }
            }
        }
        let slots: Vec<Arc<Slot>> = slot_ids.iter().map(|s| Arc::clone(&held[s])).collect();
        let bufs = copy_batch(ctx, shared, CopyJob::new(bufs, slots, runs)).await?;
        let arrays = plan
            .outputs
            .iter()
            .zip(bufs)
            .map(|(o, buf)| BatchArray {
                shape: std::iter::once(n)
                    .chain(o.row_shape.iter().copied())
                    .collect(),
                dtype: plan.paths[plan.labels[o.labels[0]].path].sample_dtype,
                buf,
            })
            .collect();
        while next_release < order.blocks.len() && order.blocks[next_release].end <= rows.end {
            for &s in &plan.releases[next_release] {
                release(shared, s, &mut held);
            }
            next_release += 1;
        }
        let batch = Batch {
            epoch: shared.config.epoch,
            index: shared.config.start_batch as usize + j,
            labels: Arc::clone(&labels),
            maps: Arc::clone(&maps),
            names: Arc::clone(&names),
            arrays,
            sample_indices: rows.clone().map(|i| order.anchor(i)).collect(),
            patch_origins: origins,
        };
        if tx.send_async(Ok(batch)).await.is_err() {
            return Ok(()); // the consumer is gone
        }
        yield_now().await;
    }
    Ok(())
}
