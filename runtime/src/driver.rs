//! The per-executor IO driver: an io_uring ring, or a sender into the blocking IO pool.

mod threads;
pub(crate) mod uring;

use std::sync::Arc;

pub(crate) use threads::{BlockingJob, IoPool};
pub(crate) use uring::UringDriver;

use crate::backend::IoBackend;
use crate::executor::ExecShared;

// One driver per executor thread, created once: the size difference between variants is irrelevant.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driver {
    Uring(std::cell::RefCell<UringDriver>),
    Threads(threads::ThreadsDriver),
}

impl Driver {
    pub(crate) fn new(
        backend: IoBackend,
        ring_entries: u32,
        pool: Option<flume::Sender<BlockingJob>>,
        exec: &Arc<ExecShared>,
    ) -> std::io::Result<Self> {
        Ok(match backend {
            IoBackend::Uring => Driver::Uring(std::cell::RefCell::new(UringDriver::new(
                ring_entries,
                exec,
            )?)),
            IoBackend::Threads => Driver::Threads(threads::ThreadsDriver::new(
                pool.expect("threads backend has an IO pool"),
                exec,
            )),
        })
    }

    /// Submits queued operations and reaps completions without blocking.
    pub(crate) fn tick(&self) {
        if let Driver::Uring(d) = self {
            d.borrow_mut().tick();
        }
    }

    /// Blocks until a completion or a remote wake arrives.
    pub(crate) fn park(&self) {
        match self {
            Driver::Uring(d) => d.borrow_mut().park(),
            Driver::Threads(t) => t.park(),
        }
    }

    /// Cancels every operation in flight and waits for each completion, so that no buffer the
    /// kernel may still write into is freed.
    pub(crate) fn cancel_all_and_drain(&self) {
        match self {
            Driver::Uring(d) => d.borrow_mut().cancel_all_and_drain(),
            // Blocking jobs own their buffers; queued ones see the pool's shutdown flag and
            // complete as cancelled; the pool's threads are joined by `Runtime::shutdown`.
            Driver::Threads(_) => {}
        }
    }

    /// Operations this executor currently has in flight (uring) — for tests and stats.
    pub(crate) fn in_flight(&self) -> usize {
        match self {
            Driver::Uring(d) => d.borrow().in_flight(),
            Driver::Threads(t) => t.in_flight(),
        }
    }
}
