//! Executor threads: one per core by default, each polling its own tasks and driving its own
//! IO driver (an io_uring ring, or a handle to the blocking IO pool).
//!
//! Tasks never migrate: a task is created on its executor thread from a `Send` factory and stays
//! there, so IO futures (which are tied to the thread's ring) need not be `Send`. Wakers are
//! `Send`: a wake from another thread goes through the executor's remote queue and an eventfd.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};

use crate::backend::{self, FallbackReason, IoBackend, IoBackendChoice};
use crate::driver::{Driver, IoPool};
use crate::task::{JoinHandle, JoinState, TaskError, TaskFuture, lock};

/// The most executor threads a runtime may start (a bound on a user's knob: one per core is
/// the design).
pub const MAX_EXECUTOR_THREADS: usize = 1024;

/// Tasks polled per executor tick before IO is submitted and reaped again; keeps one busy task
/// set from starving completions (and completions from starving tasks).
const POLL_BUDGET_PER_TICK: usize = 256;

/// Operations a task may complete inline (page-cache hits, see `op::nowait`) in one poll; past
/// it the next one yields first, so a task reading a long run of cached data without ever
/// waiting still lets the executor's other tasks and its loop run.
const INLINE_OPS_PER_POLL: u32 = 32;

type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// A task to start on an executor: the factory runs on that executor's thread.
struct Spawn {
    make: Box<dyn FnOnce() -> LocalFuture + Send>,
    urgent: bool,
}

/// Errors building a runtime.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// io_uring was required (`INSITUBATCH_IO=uring` or the builder) but is unavailable.
    #[error(
        "io_uring was requested but is unavailable: {0}; unset INSITUBATCH_IO or use `threads`"
    )]
    UringUnavailable(FallbackReason),
    /// `INSITUBATCH_IO` holds a value we do not understand.
    #[error("{0}")]
    BadEnv(String),
    /// A builder argument is out of range.
    #[error("invalid runtime argument `{argument}`: {message}")]
    InvalidArgument {
        /// The argument name.
        argument: &'static str,
        /// What is wrong and what to use.
        message: String,
    },
    /// The OS refused a resource (thread, eventfd, ring).
    #[error("runtime start-up failed creating {what}: {source}{}", out_of(source))]
    Os {
        /// What was being created.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What to do when the OS refuses a thread or memory: EAGAIN and ENOMEM from thread creation
/// mean the process is at its thread limit or out of address space for a stack.
fn out_of(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::ENOMEM) => {
            "; this process is out of threads or address space: raise `ulimit -u` or `ulimit -v`, \
             or use fewer executor_threads"
        }
        _ => "",
    }
}

/// Configures and starts a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeBuilder {
    executor_threads: Option<usize>,
    pin_cpus: bool,
    io: IoBackendChoice,
    ring_entries: u32,
    io_threads: Option<usize>,
    name: String,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            executor_threads: None,
            pin_cpus: false,
            io: IoBackendChoice::Auto,
            ring_entries: 256,
            io_threads: None,
            name: "isb".to_string(),
        }
    }
}

impl RuntimeBuilder {
    /// A builder with defaults: one executor per available core, no pinning, automatic backend.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of executor threads (default: `std::thread::available_parallelism`).
    pub fn executor_threads(mut self, n: usize) -> Self {
        self.executor_threads = Some(n);
        self
    }

    /// Pin executor `i` to CPU `i mod n`. Off by default: we are often embedded in processes
    /// (PyTorch, MPI codes) that manage affinity themselves.
    pub fn pin_cpus(mut self, pin: bool) -> Self {
        self.pin_cpus = pin;
        self
    }

    /// Which IO backend to use. `INSITUBATCH_IO` overrides `Auto` only.
    pub fn io_backend(mut self, choice: IoBackendChoice) -> Self {
        self.io = choice;
        self
    }

    /// Submission-queue entries per ring, which is also the cap on IO operations in flight per
    /// executor (default 256).
    pub fn ring_entries(mut self, n: u32) -> Self {
        self.ring_entries = n;
        self
    }

    /// Threads of the blocking IO pool used by the fallback backend (default 4 per executor, at
    /// least 4, at most 64).
    pub fn io_threads(mut self, n: usize) -> Self {
        self.io_threads = Some(n);
        self
    }

    /// Thread-name prefix (default `isb`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Starts the executor threads.
    pub fn build(self) -> Result<Runtime, RuntimeError> {
        let n = match self.executor_threads {
            Some(0) => {
                return Err(RuntimeError::InvalidArgument {
                    argument: "executor_threads",
                    message: "must be at least 1".into(),
                });
            }
            Some(n) if n > MAX_EXECUTOR_THREADS => {
                return Err(RuntimeError::InvalidArgument {
                    argument: "executor_threads",
                    message: format!(
                        "{n} is over the limit of {MAX_EXECUTOR_THREADS}: an executor is a thread \
                         with an IO ring of its own, meant one per core ({} here)",
                        std::thread::available_parallelism().map_or(1, |n| n.get())
                    ),
                });
            }
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if !(2..=32768).contains(&self.ring_entries) {
            return Err(RuntimeError::InvalidArgument {
                argument: "ring_entries",
                message: format!("{} is outside 2..=32768", self.ring_entries),
            });
        }
        let choice = match self.io {
            IoBackendChoice::Auto => backend::env_choice()
                .map_err(RuntimeError::BadEnv)?
                .unwrap_or_default(),
            explicit => explicit,
        };
        let probe = backend::probe();
        let (io_backend, fallback) = match (choice, &probe.unavailable) {
            (IoBackendChoice::Threads, _) => (IoBackend::Threads, Some(FallbackReason::Forced)),
            (IoBackendChoice::Uring, Some(reason)) => {
                return Err(RuntimeError::UringUnavailable(reason.clone()));
            }
            (_, None) => (IoBackend::Uring, None),
            (IoBackendChoice::Auto, Some(reason)) => (IoBackend::Threads, Some(reason.clone())),
        };

        let io_pool = match io_backend {
            IoBackend::Threads => {
                let threads = self.io_threads.unwrap_or((4 * n).clamp(4, 64));
                if threads == 0 {
                    return Err(RuntimeError::InvalidArgument {
                        argument: "io_threads",
                        message: "must be at least 1".into(),
                    });
                }
                Some(
                    IoPool::start(&self.name, threads).map_err(|source| RuntimeError::Os {
                        what: "IO pool thread",
                        source,
                    })?,
                )
            }
            IoBackend::Uring => None,
        };

        let mut execs = Vec::with_capacity(n);
        for _ in 0..n {
            execs.push(Arc::new(ExecShared::new()?));
        }
        let shared = Arc::new(RuntimeShared {
            execs,
            next: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            backend: io_backend,
            fallback,
        });

        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut threads = Vec::with_capacity(n);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), std::io::Error>>();
        for index in 0..n {
            let rt = Arc::clone(&shared);
            let pool_tx = io_pool.as_ref().map(|p| p.sender());
            let ring_entries = self.ring_entries;
            let pin = self.pin_cpus.then_some(index % ncpu);
            let ready_tx = ready_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-exec-{index}", self.name))
                .spawn(move || {
                    if let Some(cpu) = pin {
                        pin_to_cpu(cpu);
                    }
                    let driver =
                        match Driver::new(io_backend, ring_entries, pool_tx, &rt.execs[index]) {
                            Ok(d) => {
                                let _ = ready_tx.send(Ok(()));
                                d
                            }
                            Err(e) => {
                                let _ = ready_tx.send(Err(e));
                                rt.execs[index].close_and_drop_pending();
                                return;
                            }
                        };
                    run_executor(rt, index, driver);
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(source) => {
                    let rt = Runtime::assemble(shared, threads, io_pool);
                    drop(rt);
                    return Err(RuntimeError::Os {
                        what: "executor thread",
                        source,
                    });
                }
            }
        }
        drop(ready_tx);
        let mut first_err = None;
        for _ in 0..n {
            if let Ok(Err(e)) = ready_rx.recv() {
                first_err.get_or_insert(e);
            }
        }
        let rt = Runtime::assemble(shared, threads, io_pool);
        if let Some(source) = first_err {
            drop(rt);
            return Err(RuntimeError::Os {
                what: "io_uring ring",
                source,
            });
        }
        Ok(rt)
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; sched_setaffinity(0) affects only
    // the calling thread. Failure leaves the thread unpinned, which is harmless.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

pub(crate) struct RuntimeShared {
    pub(crate) execs: Vec<Arc<ExecShared>>,
    next: AtomicUsize,
    shutdown: AtomicBool,
    backend: IoBackend,
    fallback: Option<FallbackReason>,
}

/// Per-executor state reachable from other threads.
pub(crate) struct ExecShared {
    remote: Mutex<Remote>,
    /// True while `remote.urgent_wakes` is not empty (written under the `remote` lock): the
    /// executor checks it between polls, so an urgent task woken from another thread does not
    /// wait for the end of a tick.
    urgent: AtomicBool,
    parked: AtomicBool,
    /// Written to wake a parked executor (armed as a ring read in uring mode, read blocking in
    /// threads mode).
    pub(crate) eventfd: OwnedFd,
}

#[derive(Default)]
struct Remote {
    closed: bool,
    wakes: Vec<TaskKey>,
    urgent_wakes: Vec<TaskKey>,
    spawns: VecDeque<Spawn>,
}

impl Remote {
    fn is_empty(&self) -> bool {
        self.wakes.is_empty() && self.urgent_wakes.is_empty() && self.spawns.is_empty()
    }
}

impl ExecShared {
    fn new() -> Result<Self, RuntimeError> {
        // SAFETY: plain syscall; we check the result before wrapping it.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(RuntimeError::Os {
                what: "eventfd",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        let eventfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self {
            remote: Mutex::new(Remote::default()),
            urgent: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            eventfd,
        })
    }

    fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd; an error (counter overflow) only
        // means a wake is already pending.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn push_remote(&self, f: impl FnOnce(&mut Remote)) -> bool {
        {
            let mut r = lock(&self.remote);
            if r.closed {
                return false;
            }
            f(&mut r);
        }
        if self.parked.load(Ordering::SeqCst) {
            self.notify();
        }
        true
    }

    fn close_and_drop_pending(&self) {
        let spawns = {
            let mut r = lock(&self.remote);
            r.closed = true;
            r.wakes.clear();
            r.urgent_wakes.clear();
            std::mem::take(&mut r.spawns)
        };
        // Dropping a never-started spawn drops its TaskFuture factory, whose JoinState then
        // reports Cancelled (see `spawn_on`).
        drop(spawns);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct TaskKey {
    index: u32,
    generation: u32,
}

/// A task's waker: wakes are deduplicated by `scheduled`, so the ready queues stay bounded by
/// the number of live tasks.
struct TaskWake {
    exec: Weak<ExecShared>,
    key: TaskKey,
    scheduled: AtomicBool,
    /// Woken by another task or by IO, the task goes to the front of its executor's ready queue
    /// (see [`Handle::spawn_urgent_on`]).
    urgent: bool,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(exec) = self.exec.upgrade() else {
            return;
        };
        // A wake from the task's own executor thread (the common case: an IO completion reaped
        // there) goes straight to the local ready queue, without a lock or a syscall.
        let queued_locally = CURRENT.with(|c| match c.borrow().as_ref() {
            Some(l) if Arc::ptr_eq(&l.shared, &exec) => {
                l.schedule(self.key, self.urgent);
                true
            }
            _ => false,
        });
        if !queued_locally {
            exec.push_remote(|r| {
                if self.urgent {
                    r.urgent_wakes.push(self.key);
                    exec.urgent.store(true, Ordering::Release);
                } else {
                    r.wakes.push(self.key);
                }
            });
        }
    }
}

struct TaskSlot {
    generation: u32,
    entry: Option<TaskEntry>,
}

struct TaskEntry {
    future: Option<LocalFuture>,
    wake: Arc<TaskWake>,
}

/// Executor state owned by its thread.
pub(crate) struct LocalExec {
    pub(crate) shared: Arc<ExecShared>,
    tasks: RefCell<Vec<TaskSlot>>,
    free: RefCell<Vec<u32>>,
    ready: RefCell<VecDeque<TaskKey>>,
    /// The task being polled, if any: its own wakes (a yield) are never urgent.
    polling: Cell<Option<TaskKey>>,
    pub(crate) driver: Driver,
    /// Operations the task being polled may still complete inline (`op::nowait`).
    inline_left: Cell<u32>,
}

impl LocalExec {
    /// Queues a woken task: an urgent one at the front, unless it woke itself (it yielded, and
    /// a yield lets the others run first); every other one at the back.
    fn schedule(&self, key: TaskKey, urgent: bool) {
        let mut ready = self.ready.borrow_mut();
        if urgent && self.polling.get() != Some(key) {
            ready.push_front(key);
        } else {
            ready.push_back(key);
        }
    }

    /// Takes a turn to complete an operation inline. `false` when the polled task has used its
    /// budget: the task is then scheduled again, and the caller returns `Pending` (yields) and
    /// tries on its next poll.
    pub(crate) fn take_inline_turn(&self, cx: &Context<'_>) -> bool {
        let left = self.inline_left.get();
        self.inline_left.set(left.saturating_sub(1));
        if left == 0 {
            cx.waker().wake_by_ref();
        }
        left > 0
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<LocalExec>>> = const { RefCell::new(None) };
}

/// Runs `f` with the current thread's executor, if this is an executor thread.
pub(crate) fn with_current<R>(f: impl FnOnce(Option<&LocalExec>) -> R) -> R {
    let local = CURRENT.with(|c| c.borrow().clone());
    f(local.as_deref())
}

/// The current thread's executor, if this is an executor thread.
pub(crate) fn current() -> Option<Rc<LocalExec>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// True on an executor thread of any runtime.
pub fn on_executor_thread() -> bool {
    CURRENT.with(|c| c.borrow().is_some())
}

impl LocalExec {
    fn insert(&self, future: LocalFuture, urgent: bool) -> Arc<TaskWake> {
        let mut tasks = self.tasks.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(i) => i,
            None => {
                tasks.push(TaskSlot {
                    generation: 0,
                    entry: None,
                });
                u32::try_from(tasks.len() - 1).expect("fewer than 2^32 live tasks per executor")
            }
        };
        let slot = &mut tasks[index as usize];
        slot.generation = slot.generation.wrapping_add(1);
        let key = TaskKey {
            index,
            generation: slot.generation,
        };
        let wake = Arc::new(TaskWake {
            exec: Arc::downgrade(&self.shared),
            key,
            scheduled: AtomicBool::new(true),
            urgent,
        });
        slot.entry = Some(TaskEntry {
            future: Some(future),
            wake: Arc::clone(&wake),
        });
        drop(tasks);
        self.schedule(key, urgent);
        wake
    }

    fn poll_task(&self, key: TaskKey) {
        let (mut future, wake) = {
            let mut tasks = self.tasks.borrow_mut();
            let Some(slot) = tasks.get_mut(key.index as usize) else {
                return;
            };
            if slot.generation != key.generation {
                return;
            }
            let Some(entry) = slot.entry.as_mut() else {
                return;
            };
            let Some(future) = entry.future.take() else {
                return;
            };
            (future, Arc::clone(&entry.wake))
        };
        wake.scheduled.store(false, Ordering::Release);
        let waker = Waker::from(Arc::clone(&wake));
        let mut cx = Context::from_waker(&waker);
        self.inline_left.set(INLINE_OPS_PER_POLL);
        self.polling.set(Some(key));
        // TaskFuture catches panics of user code, so this poll does not unwind.
        let done = future.as_mut().poll(&mut cx).is_ready();
        self.polling.set(None);
        let mut tasks = self.tasks.borrow_mut();
        let slot = &mut tasks[key.index as usize];
        if done {
            slot.entry = None;
            self.free.borrow_mut().push(key.index);
            drop(tasks);
            drop(future);
        } else if let Some(entry) = slot.entry.as_mut() {
            entry.future = Some(future);
        }
    }

    fn take_remote(&self) -> bool {
        let (wakes, urgent, spawns) = {
            let mut r = lock(&self.shared.remote);
            if r.is_empty() {
                return false;
            }
            self.shared.urgent.store(false, Ordering::Relaxed);
            (
                std::mem::take(&mut r.wakes),
                std::mem::take(&mut r.urgent_wakes),
                std::mem::take(&mut r.spawns),
            )
        };
        self.ready.borrow_mut().extend(wakes);
        self.queue_urgent(urgent);
        for spawn in spawns {
            let fut = (spawn.make)();
            self.insert(fut, spawn.urgent);
        }
        true
    }

    /// Moves urgent wakes from other threads to the front of the ready queue; one atomic load
    /// when there are none.
    fn take_urgent(&self) {
        if !self.shared.urgent.load(Ordering::Acquire) {
            return;
        }
        let urgent = {
            let mut r = lock(&self.shared.remote);
            self.shared.urgent.store(false, Ordering::Relaxed);
            std::mem::take(&mut r.urgent_wakes)
        };
        self.queue_urgent(urgent);
    }

    /// Urgent wakes taken from other threads, to the front of the ready queue.
    fn queue_urgent(&self, keys: Vec<TaskKey>) {
        let mut ready = self.ready.borrow_mut();
        for key in keys {
            ready.push_front(key);
        }
    }

    fn drop_all_tasks(&self) {
        // Take the futures out before dropping them: a future's Drop may touch the driver or wake
        // other tasks, and must not find the slab borrowed.
        let futures: Vec<LocalFuture> = self
            .tasks
            .borrow_mut()
            .iter_mut()
            .filter_map(|s| s.entry.take().and_then(|e| e.future))
            .collect();
        drop(futures);
        self.ready.borrow_mut().clear();
    }
}

fn run_executor(rt: Arc<RuntimeShared>, index: usize, driver: Driver) {
    let shared = Arc::clone(&rt.execs[index]);
    let local = Rc::new(LocalExec {
        shared: Arc::clone(&shared),
        tasks: RefCell::new(Vec::new()),
        free: RefCell::new(Vec::new()),
        ready: RefCell::new(VecDeque::new()),
        polling: Cell::new(None),
        driver,
        inline_left: Cell::new(INLINE_OPS_PER_POLL),
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(Rc::clone(&local)));

    loop {
        local.take_remote();
        for _ in 0..POLL_BUDGET_PER_TICK {
            local.take_urgent();
            let next = local.ready.borrow_mut().pop_front();
            let Some(key) = next else { break };
            local.poll_task(key);
        }
        local.driver.tick();
        if rt.shutdown.load(Ordering::SeqCst) {
            break;
        }
        if local.ready.borrow().is_empty() {
            shared.parked.store(true, Ordering::SeqCst);
            let pending = !lock(&shared.remote).is_empty();
            if !pending && !rt.shutdown.load(Ordering::SeqCst) {
                local.driver.park();
            }
            shared.parked.store(false, Ordering::SeqCst);
        }
    }

    // Orderly shutdown: no new work, drop every task (abandoning its IO), then cancel and drain
    // every operation still in flight so no buffer is freed under the kernel.
    shared.close_and_drop_pending();
    local.drop_all_tasks();
    local.driver.cancel_all_and_drain();
    CURRENT.with(|c| *c.borrow_mut() = None);
}

/// A running runtime. Dropping it (or calling [`Runtime::shutdown`]) stops every executor,
/// cancels in-flight IO, and joins every thread it started (but a fallback IO thread still
/// inside a system call after a grace period, which is left to finish on its own).
pub struct Runtime {
    handle: Handle,
    shared: Arc<RuntimeShared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    io_pool: Option<IoPool>,
}

/// A cloneable handle for spawning onto a [`Runtime`]. It does not keep the runtime alive.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<RuntimeShared>,
}

impl Runtime {
    fn assemble(
        shared: Arc<RuntimeShared>,
        threads: Vec<std::thread::JoinHandle<()>>,
        io_pool: Option<IoPool>,
    ) -> Self {
        let handle = Handle {
            shared: Arc::clone(&shared),
        };
        Self {
            handle,
            shared,
            threads,
            io_pool,
        }
    }

    /// Starts a runtime with default settings.
    pub fn new() -> Result<Self, RuntimeError> {
        RuntimeBuilder::new().build()
    }

    /// A handle for spawning.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Stops and joins everything. Idempotent; also run by `Drop`.
    pub fn shutdown(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for e in &self.shared.execs {
            e.notify();
        }
        let me = std::thread::current().id();
        for t in self.threads.drain(..) {
            // Dropping the runtime from one of its own tasks cannot join that thread; it exits
            // right after the current task returns.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        if let Some(pool) = self.io_pool.take() {
            pool.shutdown();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::ops::Deref for Runtime {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.handle
    }
}

impl Handle {
    /// The IO backend every executor of this runtime uses.
    pub fn io_backend(&self) -> IoBackend {
        self.shared.backend
    }

    /// Why io_uring is not in use (`None` when it is).
    pub fn fallback_reason(&self) -> Option<&FallbackReason> {
        self.shared.fallback.as_ref()
    }

    /// Number of executor threads.
    pub fn executor_threads(&self) -> usize {
        self.shared.execs.len()
    }

    /// True once shutdown has begun.
    pub fn is_shut_down(&self) -> bool {
        self.shared.shutdown.load(Ordering::SeqCst)
    }

    /// Spawns a task on the next executor (round robin). The factory runs on that executor's
    /// thread, so the future it returns need not be `Send` (IO futures are not).
    pub fn spawn<G, F>(&self, name: &str, factory: G) -> JoinHandle<F::Output>
    where
        G: FnOnce() -> F + Send + 'static,
        F: Future + 'static,
        F::Output: Send + 'static,
    {
        let n = self.shared.execs.len();
        let index = self.shared.next.fetch_add(1, Ordering::Relaxed) % n;
        self.spawn_on(index, name, factory)
    }

    /// Spawns a task on executor `index mod executor_threads()`.
    pub fn spawn_on<G, F>(&self, index: usize, name: &str, factory: G) -> JoinHandle<F::Output>
    where
        G: FnOnce() -> F + Send + 'static,
        F: Future + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_with(index, name, false, factory)
    }

    /// Spawns an urgent task on executor `index mod executor_threads()`: when another task or
    /// an IO completion wakes it, it goes to the front of the executor's ready queue, and a wake
    /// from another thread is noticed between two polls rather than at the end of a tick. It
    /// still waits for the poll under way (a decode holds its core), but not for the tasks queued
    /// behind it. A task that yields goes to the back like any other, so an urgent task that
    /// keeps busy does not starve its executor. Meant for the few tasks on a pipeline's latency
    /// path, such as a gather whose slot has just been filled.
    pub fn spawn_urgent_on<G, F>(
        &self,
        index: usize,
        name: &str,
        factory: G,
    ) -> JoinHandle<F::Output>
    where
        G: FnOnce() -> F + Send + 'static,
        F: Future + 'static,
        F::Output: Send + 'static,
    {
        self.spawn_with(index, name, true, factory)
    }

    fn spawn_with<G, F>(
        &self,
        index: usize,
        name: &str,
        urgent: bool,
        factory: G,
    ) -> JoinHandle<F::Output>
    where
        G: FnOnce() -> F + Send + 'static,
        F: Future + 'static,
        F::Output: Send + 'static,
    {
        let name: Arc<str> = Arc::from(name);
        let state = JoinState::new(Arc::clone(&name));
        let exec = &self.shared.execs[index % self.shared.execs.len()];
        // If the spawn is dropped before it runs (shutdown), the guard reports Cancelled.
        let guard = CancelOnDrop(Some(Arc::clone(&state)));
        let task_state = Arc::clone(&state);
        let make = Box::new(move || {
            let mut guard = guard;
            guard.0 = None;
            let state = task_state;
            let fut = TaskFuture::new(factory(), Arc::clone(&state));
            Box::pin(RegisterWaker {
                state: Some(state),
                inner: fut,
            }) as LocalFuture
        });
        let spawn = Spawn { make, urgent };
        let accepted = !self.is_shut_down() && exec.push_remote(|r| r.spawns.push_back(spawn));
        if !accepted {
            // `spawn` was dropped (or never queued); make the outcome explicit.
            state.complete(Err(TaskError::RuntimeShutDown {
                name: name.to_string(),
            }));
        }
        JoinHandle::new(state)
    }

    /// Runs a future on the runtime and blocks the calling (non-executor) thread until it ends.
    pub fn block_on<G, F>(&self, factory: G) -> Result<F::Output, TaskError>
    where
        G: FnOnce() -> F + Send + 'static,
        F: Future + 'static,
        F::Output: Send + 'static,
    {
        self.spawn("block_on", factory).join()
    }
}

struct CancelOnDrop<T>(Option<Arc<JoinState<T>>>);

impl<T> Drop for CancelOnDrop<T> {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            let e = state.cancelled();
            state.complete(Err(e));
        }
    }
}

/// Records the task's own waker in its JoinState on first poll, so `JoinHandle::abort` can
/// wake it.
struct RegisterWaker<F: Future, T> {
    state: Option<Arc<JoinState<T>>>,
    inner: TaskFuture<F>,
}

impl<F: Future<Output = T>, T> Future for RegisterWaker<F, T> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: we never move `inner` out of the pinned struct; `state` is Unpin.
        let this = unsafe { self.get_unchecked_mut() };
        if let Some(state) = this.state.take() {
            state.set_task_waker(cx.waker().clone());
        }
        // SAFETY: `inner` is structurally pinned: it is never moved while `this` is pinned.
        unsafe { Pin::new_unchecked(&mut this.inner) }.poll(cx)
    }
}
