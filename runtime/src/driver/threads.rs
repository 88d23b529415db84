//! The blocking-thread fallback: a bounded pool of IO threads running plain system calls.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::executor::ExecShared;

/// A blocking job; the flag says the runtime is shutting down and the job should complete as
/// cancelled without doing IO.
pub(crate) type BlockingJob = Box<dyn FnOnce(bool) + Send>;

/// Jobs queued per pool before submitters wait (the bound on queued fallback IO).
const POOL_QUEUE_CAPACITY: usize = 1024;

/// How long shutdown waits for IO threads still inside a system call. A file system that stopped
/// answering must not hang the host's exit: past this, such threads are left to finish on their
/// own (they own everything they touch, and exit when their call returns).
const STUCK_IO_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

pub(crate) struct IoPool {
    tx: Option<flume::Sender<BlockingJob>>,
    shutdown: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Every thread holds a sender and never sends: the channel disconnects when the last one
    /// has left its loop.
    exited: flume::Receiver<()>,
}

impl IoPool {
    pub(crate) fn start(name: &str, threads: usize) -> std::io::Result<Self> {
        let (tx, rx) = flume::bounded::<BlockingJob>(POOL_QUEUE_CAPACITY);
        let (alive, exited) = flume::bounded::<()>(1);
        let shutdown = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = rx.clone();
            let flag = Arc::clone(&shutdown);
            let thread_alive = alive.clone();
            let h = std::thread::Builder::new()
                .name(format!("{name}-io-{i}"))
                .spawn(move || {
                    let _alive = thread_alive;
                    while let Ok(job) = rx.recv() {
                        job(flag.load(Ordering::SeqCst));
                    }
                });
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    drop(alive);
                    let pool = IoPool {
                        tx: Some(tx),
                        shutdown,
                        threads: handles,
                        exited,
                    };
                    pool.shutdown();
                    return Err(e);
                }
            }
        }
        Ok(Self {
            tx: Some(tx),
            shutdown,
            threads: handles,
            exited,
        })
    }

    pub(crate) fn sender(&self) -> flume::Sender<BlockingJob> {
        self.tx.clone().expect("pool is running")
    }

    /// Queued jobs complete as cancelled; running ones finish; every thread is joined, except
    /// one still inside a system call after [`STUCK_IO_GRACE`], which is left to finish on its
    /// own (with a warning).
    pub(crate) fn shutdown(mut self) {
        self.shutdown.store(true, Ordering::SeqCst);
        self.tx = None;
        let all_left = matches!(
            self.exited.recv_timeout(STUCK_IO_GRACE),
            Err(flume::RecvTimeoutError::Disconnected)
        );
        let (done, stuck): (Vec<_>, Vec<_>) = self
            .threads
            .drain(..)
            .partition(|t| all_left || t.is_finished());
        for t in done {
            let _ = t.join();
        }
        if !stuck.is_empty() {
            let names: Vec<&str> = stuck.iter().filter_map(|t| t.thread().name()).collect();
            eprintln!(
                "insitubatch: warning: IO thread(s) {} still inside a system call {} s after \
                 shutdown began (a file system that stopped answering?); they are left to \
                 finish on their own",
                names.join(", "),
                STUCK_IO_GRACE.as_secs()
            );
        }
    }
}

pub(crate) struct ThreadsDriver {
    pub(crate) pool: flume::Sender<BlockingJob>,
    exec: Arc<ExecShared>,
    pub(crate) in_flight: Arc<AtomicUsize>,
}

impl ThreadsDriver {
    pub(crate) fn new(pool: flume::Sender<BlockingJob>, exec: &Arc<ExecShared>) -> Self {
        Self {
            pool,
            exec: Arc::clone(exec),
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Parks on the executor's eventfd until a remote wake (a completion wakes its task through
    /// the task's waker, which writes the eventfd when we are parked).
    pub(crate) fn park(&self) {
        let mut value: u64 = 0;
        loop {
            // SAFETY: reads 8 bytes into a live u64 from our own eventfd.
            let n = unsafe {
                libc::read(
                    self.exec.eventfd.as_raw_fd(),
                    (&mut value as *mut u64).cast(),
                    8,
                )
            };
            if n >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return;
            }
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}
