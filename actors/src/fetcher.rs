//! The fetcher: reads stored chunks (tiles) from the store; decodes at once what the page
//! cache answered, and hands what had to wait for the device to the decoder.
//!
//! Its workers all drain one shared mailbox, `⌈max_inflight / executors⌉` of them on each
//! executor. A worker takes a job and reads the chunk. A read the page cache answers completes
//! within that first poll, and the worker decodes the bytes right away on this core, while the
//! read has left them in its cache (`decoder::decode`); a core busy decoding or gathering polls
//! its workers less and so takes fewer jobs. A read that must wait for the device parks the
//! worker while the executor's other workers take jobs, so reads overlap up to `max_inflight`;
//! its bytes then go to the decoder's shared mailbox, where whichever core is free decodes
//! them; if the pass stops first, the worker drops the read rather than wait for a store that
//! may never answer. Every job carries one `max_inflight` permit, so the number of chunks read
//! and not yet delivered across the dataset is bounded by that one dial.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use insitubatch_pool::{Slot, SlotFailure};
use insitubatch_runtime::sync::Permit;
use insitubatch_runtime::{ActorPool, ActorSender, Mailbox};
use insitubatch_store::Store;

use crate::assembly::ChunkRows;
use crate::decoder::{self, DecodeJob};
use crate::error::EngineError;
use crate::pass::{EngineContext, PanicGuard, PassShared};
use crate::stats::Counters;
use crate::tile::TileLayout;
use crate::unlink_gate::Gate;

/// Mailbox capacity of a fetcher. The `max_inflight` permits bound the jobs in the system; this
/// only bounds how many wait to be picked up.
const FETCHER_MAILBOX: usize = 64;

/// Where a decoded stored chunk goes.
pub(crate) enum Dest {
    /// Into its slot in the pool (the gather copies rows out of it).
    Slot(Arc<Slot>),
    /// Into the batch rows of its samples, shared by the chunk's tiles; see `crate::assembly`.
    Rows(Arc<ChunkRows>),
    /// Its rows were filled: the job is complete.
    Filled,
}

impl Dest {
    /// The slot, when the chunk goes into one.
    pub(crate) fn slot(&self) -> Option<&Arc<Slot>> {
        match self {
            Dest::Slot(s) => Some(s),
            Dest::Rows(_) | Dest::Filled => None,
        }
    }
}

/// One stored chunk to read, decode and deliver into its slot or batch row.
pub struct TileJob {
    pub(crate) dest: Dest,
    pub(crate) path: usize,
    pub(crate) key: String,
    pub(crate) index: Vec<u64>,
    pub(crate) tile: u64,
    /// The chunk-local part of a shard the job needs (`None`: the whole stored chunk), set
    /// when a cropped view's region covers less of the shard.
    pub(crate) part: Option<Vec<Vec<std::ops::Range<u64>>>>,
    /// `part` names inner chunks to copy into a region slot one by one
    /// ([`TileLayout::copy_parts_into_slot`]), not the view's boxes of the tile.
    pub(crate) inner_parts: bool,
    /// The tiles of this job's chunk when they are not its path's: a patched row read as a
    /// region of its own (`crate::planner`), whose tile `tile` this job copies.
    pub(crate) layout: Option<Arc<TileLayout>>,
    pub(crate) ordinal: u64,
    #[allow(
        dead_code,
        reason = "held for its Drop: returns the max_inflight permit"
    )]
    pub(crate) permit: Permit,
    /// Shut until the cache files of the slots evicted to admit this one's are gone.
    pub(crate) after: Option<Gate>,
    pub(crate) done: bool,
    pub(crate) shared: Arc<PassShared>,
}

impl TileJob {
    /// The job is accounted for (delivered, or its slot failed on purpose).
    pub(crate) fn finish(mut self) {
        self.done = true;
    }

    /// Gives up on the job because the pass is stopping.
    pub(crate) fn cancel(self) {
        if let Some(slot) = self.dest.slot() {
            slot.fail(self.shared.cancel_failure());
        }
        self.finish();
    }

    /// Dropped unfinished: fails its slot, and the pass unless it is stopping.
    fn fail_unfinished(&mut self) {
        // Dropped unfinished: an actor unwound or a mailbox closed under it. The slot will
        // never fill, so fail it, and fail the pass so the consumer hears why.
        let why = if std::thread::panicking() {
            EngineError::ActorPanicked {
                actor: "fetcher".into(),
                message: format!("while reading or decoding chunk `{}`", self.key),
            }
        } else if self.shared.is_cancelled() {
            EngineError::Cancelled
        } else {
            EngineError::ActorPanicked {
                actor: "fetcher".into(),
                message: format!("its mailbox closed with chunk `{}` undelivered", self.key),
            }
        };
        // A row is never counted filled; the pass's failure tells the gather waiting for it.
        if let Some(slot) = self.dest.slot() {
            slot.fail(SlotFailure {
                cancelled: matches!(why, EngineError::Cancelled),
                message: why.to_string().into(),
            });
        }
        if !matches!(why, EngineError::Cancelled) {
            self.shared.fail(why);
        }
    }
}

impl Drop for TileJob {
    fn drop(&mut self) {
        if !self.done {
            self.fail_unfinished();
        }
        self.shared.load_finished();
    }
}

pub(crate) fn spawn<S: Store>(
    ctx: &Arc<EngineContext<S>>,
    shared: &Arc<PassShared>,
    decoder: ActorSender<DecodeJob>,
) -> ActorPool<TileJob> {
    let ctx = Arc::clone(ctx);
    let shared = Arc::clone(shared);
    let rt = ctx.runtime.clone();
    let executors = rt.executor_threads().max(1);
    let per_executor = ctx.inflight.total().div_ceil(executors as u64).max(1) as usize;
    rt.spawn_actor_pool(
        "fetcher",
        FETCHER_MAILBOX,
        executors * per_executor,
        move |_, mut inbox: Mailbox<TileJob>| {
            let (ctx, shared, decoder) = (Arc::clone(&ctx), Arc::clone(&shared), decoder.clone());
            async move {
                let _guard = PanicGuard {
                    shared: &shared,
                    actor: "fetcher",
                };
                while let Some(job) = inbox.recv().await {
                    if let Some(gate) = &job.after {
                        // Never waits past the pass's stop (an unlink on a hung file system).
                        shared.until_stopped(gate.passed()).await;
                    }
                    if shared.is_cancelled() {
                        job.cancel();
                        continue;
                    }
                    fetch(&ctx, &shared, &decoder, job).await;
                }
            }
        },
    )
}

/// Reads one stored chunk, then decodes it here if the read did not wait, or hands it to the
/// decoder if it did.
async fn fetch<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    decoder: &ActorSender<DecodeJob>,
    job: TileJob,
) {
    // Part of a shard: its index and the inner chunks the part touches, where the store's
    // sharding layout allows; anything else is read whole, into a recycled buffer (its pages
    // are already faulted in, and the last one returned is the likeliest to be in the cache).
    let array = &shared.arrays[job.path];
    // Either way: the bytes to decode, and how many were fetched from the store.
    let whole_or_part = async {
        match &job.part {
            Some(part) if array.reads_chunk_parts() => {
                array.read_chunk_part(&*ctx.store, &job.key, part).await
            }
            _ => {
                let whole = ctx
                    .store
                    .get_into(&job.key, ctx.read_buffers.take())
                    .await?;
                let n = whole.as_ref().map_or(0, |b| b.len() as u64);
                Ok((whole, n))
            }
        }
    };
    let read = {
        let mut read = std::pin::pin!(whole_or_part);
        match std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
            Poll::Ready(r) => Some((r, false)),
            Poll::Pending => {
                // A read stuck in the kernel (a hung file system) must not hold up a pass that
                // stops: it is dropped then, which abandons it to the runtime (the runtime keeps
                // the buffer until the kernel lets go of it).
                let mut stopped = std::pin::pin!(shared.stopped());
                std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
                    Poll::Ready(r) => Poll::Ready(Some((r, true))),
                    Poll::Pending => stopped.as_mut().poll(cx).map(|()| None),
                })
                .await
            }
        }
    };
    let Some((result, waited)) = read else {
        return job.cancel();
    };
    match result {
        Ok((bytes, fetched)) => {
            Counters::add(&shared.counters.tiles_read, 1);
            Counters::add(&shared.counters.bytes_read, fetched);
            if waited {
                Counters::add(&shared.counters.tiles_read_waited, 1);
                // If the decoder is gone the job is dropped unfinished, which fails the pass.
                let _ = decoder.send(DecodeJob { job, bytes }).await;
            } else {
                decoder::decode(ctx, shared, job, bytes).await;
            }
        }
        Err(e) => decoder::bad_chunk(ctx, job, e).await,
    }
}
