//! # insitubatch-runtime
//!
//! A thread-per-core runtime of our own: executor threads (one per core by default), each with
//! its own io_uring ring, or a blocking-thread IO pool where io_uring is unavailable; actors with
//! bounded [flume] mailboxes; file IO whose buffers are owned by the operation until the kernel
//! is done with them; and an orderly shutdown that cancels and drains in-flight IO and joins
//! every thread.
//!
//! ```
//! use insitubatch_runtime::{RuntimeBuilder, fs};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("x.bin");
//! std::fs::write(&path, b"hello").unwrap();
//! let rt = RuntimeBuilder::new().executor_threads(2).build().unwrap();
//! let bytes = rt.block_on(move || async move { fs::read(&path).await }).unwrap().unwrap();
//! assert_eq!(bytes, b"hello");
//! println!("backend: {}", rt.io_backend());
//! ```

mod actor;
mod backend;
mod buf;
mod driver;
mod executor;
pub mod fs;
mod op;
pub mod sync;
mod task;

pub use actor::{ActorHandle, ActorPool, ActorSender, Mailbox, SendError};
pub use backend::{FallbackReason, IO_ENV, IoBackend, IoBackendChoice, ProbeReport, probe};
pub use buf::{AlignedBuf, DIRECT_IO_ALIGN, IoBuf, IoBufMut};
pub use executor::{
    Handle, MAX_EXECUTOR_THREADS, Runtime, RuntimeBuilder, RuntimeError, on_executor_thread,
};
pub use task::{JoinHandle, TaskError};

/// Operations currently in flight on the calling executor thread (`None` off the runtime).
/// Exposed for tests and diagnostics.
pub fn in_flight_ops() -> Option<usize> {
    executor::with_current(|e| e.map(|e| e.driver.in_flight()))
}

/// Yields once to the executor, letting other tasks and IO completions run.
pub async fn yield_now() {
    struct Yield(bool);
    impl std::future::Future for Yield {
        type Output = ();
        fn poll(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<()> {
            if self.0 {
                return std::task::Poll::Ready(());
            }
            self.0 = true;
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    }
    Yield(false).await
}

/// Runs `futures` concurrently on the current task and returns their outputs in order. Every
/// wake polls the ones not finished yet, so keep the set small (it is meant for a handful of IO
/// operations issued together, such as the reads of one batch).
pub async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    struct JoinAll<F: std::future::Future> {
        futures: Vec<Option<std::pin::Pin<Box<F>>>>,
        outputs: Vec<Option<F::Output>>,
    }
    // Children are boxed and outputs are moved only once finished: never structurally pinned.
    impl<F: std::future::Future> Unpin for JoinAll<F> {}
    impl<F: std::future::Future> std::future::Future for JoinAll<F> {
        type Output = Vec<F::Output>;
        fn poll(
            self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Self::Output> {
            let this = std::pin::Pin::into_inner(self);
            let mut pending = false;
            for (slot, out) in this.futures.iter_mut().zip(this.outputs.iter_mut()) {
                if let Some(f) = slot {
                    match f.as_mut().poll(cx) {
                        std::task::Poll::Ready(v) => {
                            *out = Some(v);
                            *slot = None;
                        }
                        std::task::Poll::Pending => pending = true,
                    }
                }
            }
            if pending {
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(
                this.outputs
                    .iter_mut()
                    .map(|o| o.take().expect("every future finished"))
                    .collect(),
            )
        }
    }
    let n = futures.len();
    JoinAll {
        futures: futures.into_iter().map(|f| Some(Box::pin(f))).collect(),
        outputs: (0..n).map(|_| None).collect(),
    }
    .await
}
