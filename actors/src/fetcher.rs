//! The fetcher: reads stored chunks (tiles) from the store and hands the bytes to the decoder
//! on the same core.
//!
//! One fetcher worker runs per executor, all draining one shared mailbox, so a core busy with
//! decode or gather takes fewer jobs. Each job becomes a read task on the worker's executor, so
//! reads overlap (io_uring, or the blocking pool) while the mailbox is drained;
//! every job carries one `max_inflight` permit, so the number of reads in flight across the
//! dataset is bounded by that one dial.

use std::sync::Arc;

use insitubatch_pool::{Slot, SlotFailure};
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
                    reads.push(
                        ctx.runtime
                            .spawn_on(index, "fetch", move || read(ctx2, job, dec)),
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

async fn read<S: Store>(ctx: Arc<EngineContext<S>>, job: TileJob, decoder: ActorSender<DecodeJob>) {
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
