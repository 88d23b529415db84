//! A composite blocking job for the thread fallback: several system calls in one trip to an IO
//! thread. Each trip costs two wake-ups (the IO thread's and the executor's); a whole-file read
//! done op by op (open, statx, read) would pay three, serial with the task that waits for them.

use std::sync::atomic::Ordering;

use crate::driver::{BlockingJob, Driver};
use crate::executor::current;

/// Whether the current executor thread's IO goes through the blocking pool (`None` off the
/// runtime).
pub(crate) fn on_threads_backend() -> Option<bool> {
    current().map(|exec| matches!(exec.driver, Driver::Threads(_)))
}

/// Runs `f` on the current executor's IO pool and waits for its result. Only for the threads
/// backend (an io_uring executor has no pool and gets an error).
pub(crate) async fn run<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let (pool, counter) = {
        let Some(exec) = current() else {
            return Err(super::not_on_runtime());
        };
        let Driver::Threads(t) = &exec.driver else {
            return Err(std::io::Error::other(
                "internal error: a blocking IO job was submitted on an io_uring executor",
            ));
        };
        (t.pool.clone(), std::sync::Arc::clone(&t.in_flight))
    };
    let (tx, rx) = flume::bounded(1);
    counter.fetch_add(1, Ordering::Relaxed);
    let job: BlockingJob = Box::new(move |cancelled| {
        // Cancelled at shutdown: drop `f` without doing IO; the receiver sees the channel close.
        if !cancelled {
            let _ = tx.send(f());
        }
        counter.fetch_sub(1, Ordering::Relaxed);
    });
    if let Err(flume::SendError(job)) = pool.send_async(job).await {
        job(true);
    }
    rx.recv_async()
        .await
        .unwrap_or_else(|_| Err(super::shut_down()))
}
