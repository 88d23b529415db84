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
pub use executor::{Handle, Runtime, RuntimeBuilder, RuntimeError, on_executor_thread};
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
