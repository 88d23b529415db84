//! A composite blocking job for the thread fallback: several system calls in one trip to an IO
//! thread. Each trip costs two wake-ups (the IO thread's and the executor's); a whole-file read
//! done op by op (open, statx, read) would pay three, serial with the task that waits for them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::driver::{BlockingJob, Driver};
use crate::executor::current;

/// The current executor's pool of IO threads.
pub(crate) struct BlockingPool {
    jobs: flume::Sender<BlockingJob>,
    in_flight: Arc<AtomicUsize>,
}

impl BlockingPool {
    /// The pool of this executor thread, if it runs the threads backend (`None` on an io_uring
    /// executor and off the runtime).
    pub(crate) fn current() -> Option<Self> {
        let exec = current()?;
        match &exec.driver {
            Driver::Threads(t) => Some(Self {
                jobs: t.pool.clone(),
                in_flight: Arc::clone(&t.in_flight),
            }),
            Driver::Uring(_) => None,
        }
    }

    /// Runs `f` on an IO thread and waits for its result.
    pub(crate) async fn run<T: Send + 'static>(
        self,
        f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
    ) -> std::io::Result<T> {
        let (tx, rx) = flume::bounded(1);
        let in_flight = self.in_flight;
        in_flight.fetch_add(1, Ordering::Relaxed);
        let job: BlockingJob = Box::new(move |cancelled| {
            // Cancelled at shutdown: drop `f` without doing IO; the receiver sees the channel
            // close.
            if !cancelled {
                let _ = tx.send(f());
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
        if let Err(flume::SendError(job)) = self.jobs.send_async(job).await {
            job(true);
        }
        rx.recv_async()
            .await
            .unwrap_or_else(|_| Err(super::shut_down()))
    }
}
