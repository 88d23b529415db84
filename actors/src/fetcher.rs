//! The fetcher: reads stored chunks (tiles) from the store and hands the bytes to the decoder
//! on the same core.
//!
//! One fetcher worker runs per executor, all draining one shared mailbox, so a core busy with
//! decode or gather takes fewer jobs. Each job becomes a read task on the worker's executor, so
//! reads overlap (io_uring, or the blocking pool) while the mailbox is drained;
//! every job carries one `max_inflight` permit, so the number of reads in flight across the
//! dataset is bounded by that one dial.

use std::sync::Arc;

use insitubatch_pool::{CachedFile, Slot, SlotData, SlotFailure};
use insitubatch_runtime::fs::File as RtFile;
use insitubatch_runtime::sync::Permit;
use insitubatch_runtime::{ActorPool, ActorSender, JoinHandle, Mailbox};
use insitubatch_store::Store;

use crate::decoder::{self, DecodeJob};
use crate::error::EngineError;
use crate::pass::{EngineContext, PanicGuard, PassShared};
use crate::stats::Counters;

/// Mailbox capacity of a fetcher. The `max_inflight` permits bound the jobs in the system; this
/// only bounds how many wait to be picked up.
const FETCHER_MAILBOX: usize = 64;

/// One stored chunk to read, decode and deliver into its slot.
pub struct TileJob {
    pub(crate) slot: Arc<Slot>,
    pub(crate) path: usize,
    pub(crate) key: String,
    pub(crate) index: Vec<u64>,
    pub(crate) tile: u64,
    pub(crate) ordinal: u64,
    #[allow(
        dead_code,
        reason = "held for its Drop: returns the max_inflight permit"
    )]
    pub(crate) permit: Permit,
    pub(crate) done: bool,
    pub(crate) shared: Arc<PassShared>,
    /// A slot revived from the cache directory: read this file's data into it (no decode).
    pub(crate) revive: Option<CachedFile>,
}

impl TileJob {
    /// The job is accounted for (delivered, or its slot failed on purpose).
    pub(crate) fn finish(mut self) {
        self.done = true;
    }

    /// Gives up on the job because the pass is stopping.
    pub(crate) fn cancel(self) {
        self.slot.fail(self.shared.cancel_failure());
        self.finish();
    }
}

impl Drop for TileJob {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped unfinished: an actor unwound or a mailbox closed under it. The slot will
        // never fill, so fail it, and fail the pass so the consumer hears why.
        let why = if std::thread::panicking() {
            EngineError::ActorPanicked {
                actor: "decoder".into(),
                message: format!("while handling chunk `{}`", self.key),
            }
        } else if self.shared.is_cancelled() {
            EngineError::Cancelled
        } else {
            EngineError::ActorPanicked {
                actor: "decoder".into(),
                message: format!("its mailbox closed with chunk `{}` undelivered", self.key),
            }
        };
        self.slot.fail(SlotFailure {
            cancelled: matches!(why, EngineError::Cancelled),
            message: why.to_string().into(),
        });
        if !matches!(why, EngineError::Cancelled) {
            self.shared.fail(why);
        }
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
    let workers = rt.executor_threads();
    rt.spawn_actor_pool(
        "fetcher",
        FETCHER_MAILBOX,
        workers,
        move |index, mut inbox: Mailbox<TileJob>| {
            let (ctx, shared, decoder) = (Arc::clone(&ctx), Arc::clone(&shared), decoder.clone());
            async move {
                let _guard = PanicGuard {
                    shared: &shared,
                    actor: "fetcher",
                };
                let mut reads: Vec<JoinHandle<()>> = Vec::new();
                while let Some(job) = inbox.recv().await {
                    if shared.is_cancelled() {
                        job.cancel();
                        continue;
                    }
                    let ctx2 = Arc::clone(&ctx);
                    let dec = decoder.clone();
                    reads.retain(|h| !h.is_finished());
                    // A revival's read is a copy out of the page cache: keep it off the
                    // gather's executor (0), which is busy copying batches meanwhile.
                    let n = ctx.runtime.executor_threads();
                    let on = if job.revive.is_some() && n > 1 {
                        1 + index % (n - 1)
                    } else {
                        index
                    };
                    reads.push(
                        ctx.runtime
                            .spawn_on(on, "fetch", move || read(ctx2, job, dec)),
                    );
                }
                // Every read ends (its job is delivered or failed); wait so the pass can join us.
                for h in reads {
                    let _ = h.await;
                }
            }
        },
    )
}

/// Reads a cached slot's data straight into the slot: the revival of a persisted chunk costs
/// one read through the runtime (io_uring where available), no decode. A read error fails the
/// pass naming the file (the file was there and checked when the slot was admitted).
async fn revive(mut job: TileJob) {
    let Some(cached) = job.revive.take() else {
        return;
    };
    let loaded = RtFile::from_std(cached.file, &cached.path)
        .read_exact_into(cached.offset, cached.len, Vec::new())
        .await
        .map(SlotData::Heap);
    match loaded {
        Ok(data) => {
            Counters::add(
                &job.shared.counters.bytes_revived,
                data.as_slice().len() as u64,
            );
            // An error means the slot is no longer loading (the pass stopped).
            let _ = job.slot.complete(data);
        }
        Err(e) => {
            let err = EngineError::Runtime(format!(
                "cannot read the cached chunk {} from {}: {e}; check the device, or delete the \
                 file (a missing file is re-fetched from the store)",
                job.slot.key(),
                cached.path.display()
            ));
            job.shared.fail(err.clone());
            job.slot.fail(SlotFailure {
                cancelled: false,
                message: err.to_string().into(),
            });
        }
    }
    job.finish();
}

async fn read<S: Store>(ctx: Arc<EngineContext<S>>, job: TileJob, decoder: ActorSender<DecodeJob>) {
    if job.revive.is_some() {
        return revive(job).await;
    }
    // A recycled buffer: its pages are already faulted in.
    let r = ctx.store.get_into(&job.key, ctx.read_buffers.take()).await;
    match r {
        Ok(bytes) => {
            let shared = Arc::clone(&job.shared);
            Counters::add(&shared.counters.tiles_read, 1);
            Counters::add(
                &shared.counters.bytes_read,
                bytes.as_ref().map_or(0, |b| b.len() as u64),
            );
            // If the decoder is gone the job is dropped unfinished, which fails the pass.
            let _ = decoder.send(DecodeJob { job, bytes }).await;
        }
        Err(e) => decoder::bad_chunk(&ctx, job, e).await,
    }
}
