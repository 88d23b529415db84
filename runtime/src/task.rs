//! Join handles: how the result of a task (or the panic that ended it) reaches whoever waits.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};

/// Why a task produced no value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The task panicked; the panic message is kept.
    #[error("task `{name}` panicked: {message}")]
    Panicked {
        /// Task (or actor) name.
        name: String,
        /// The panic payload when it was a string.
        message: String,
    },
    /// The task was aborted or the runtime shut down before it finished.
    #[error("task `{name}` was cancelled before it finished (aborted or runtime shut down)")]
    Cancelled {
        /// Task (or actor) name.
        name: String,
    },
    /// The runtime was already shut down when the task was spawned.
    #[error("cannot spawn `{name}`: the runtime has shut down")]
    RuntimeShutDown {
        /// Task (or actor) name.
        name: String,
    },
    /// A blocking wait was attempted on an executor thread, which would stall every task there.
    #[error(
        "blocking wait on `{name}` from an executor thread would deadlock the runtime; `.await` it instead"
    )]
    WouldBlockExecutor {
        /// Task (or actor) name.
        name: String,
    },
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

struct JoinInner<T> {
    result: Option<Result<T, TaskError>>,
    waiter: Option<Waker>,
}

/// State shared between a task and its [`JoinHandle`].
pub(crate) struct JoinState<T> {
    name: Arc<str>,
    inner: Mutex<JoinInner<T>>,
    done: Condvar,
    abort: AtomicBool,
    task_waker: Mutex<Option<Waker>>,
}

impl<T> JoinState<T> {
    pub(crate) fn new(name: Arc<str>) -> Arc<Self> {
        Arc::new(Self {
            name,
            inner: Mutex::new(JoinInner {
                result: None,
                waiter: None,
            }),
            done: Condvar::new(),
            abort: AtomicBool::new(false),
            task_waker: Mutex::new(None),
        })
    }

    /// Records the outcome once; later calls are ignored (the first outcome wins).
    pub(crate) fn complete(&self, result: Result<T, TaskError>) {
        let waiter = {
            let mut inner = lock(&self.inner);
            if inner.result.is_some() {
                return;
            }
            inner.result = Some(result);
            inner.waiter.take()
        };
        self.done.notify_all();
        if let Some(w) = waiter {
            w.wake();
        }
    }

    pub(crate) fn cancelled(&self) -> TaskError {
        TaskError::Cancelled {
            name: self.name.to_string(),
        }
    }

    pub(crate) fn set_task_waker(&self, waker: Waker) {
        *lock(&self.task_waker) = Some(waker);
    }
}

/// Locks a mutex, recovering from poisoning: our critical sections never leave state half-written.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits for a task spawned on the runtime. Await it from a task, or call [`JoinHandle::join`]
/// from a thread that is not an executor thread. Dropping the handle detaches the task.
pub struct JoinHandle<T> {
    state: Arc<JoinState<T>>,
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("name", &self.state.name)
            .finish()
    }
}

impl<T> JoinHandle<T> {
    pub(crate) fn new(state: Arc<JoinState<T>>) -> Self {
        Self { state }
    }

    /// The name given at spawn time.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// Asks the task to stop: it is dropped at its next scheduling point (its in-flight IO
    /// operations are abandoned safely) and the handle resolves to [`TaskError::Cancelled`].
    pub fn abort(&self) {
        self.state.abort.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.state.task_waker).as_ref() {
            w.wake_by_ref();
        }
    }

    /// True once the task has finished, panicked or been cancelled.
    pub fn is_finished(&self) -> bool {
        lock(&self.state.inner).result.is_some()
    }

    /// Blocks the calling thread until the task ends. From an executor thread this returns
    /// [`TaskError::WouldBlockExecutor`] instead of deadlocking.
    pub fn join(self) -> Result<T, TaskError> {
        if crate::executor::on_executor_thread() {
            return Err(TaskError::WouldBlockExecutor {
                name: self.state.name.to_string(),
            });
        }
        let mut inner = lock(&self.state.inner);
        loop {
            if let Some(r) = inner.result.take() {
                return r;
            }
            inner = self
                .state
                .done
                .wait(inner)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, TaskError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut inner = lock(&self.state.inner);
        if let Some(r) = inner.result.take() {
            return Poll::Ready(r);
        }
        inner.waiter = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The future the executor actually polls: runs the user's future, turns a panic into
/// [`TaskError::Panicked`], honours `abort`, and reports `Cancelled` if dropped unfinished.
pub(crate) struct TaskFuture<F: Future> {
    fut: Option<Pin<Box<F>>>,
    state: Arc<JoinState<F::Output>>,
}

impl<F: Future> TaskFuture<F> {
    pub(crate) fn new(fut: F, state: Arc<JoinState<F::Output>>) -> Self {
        Self {
            fut: Some(Box::pin(fut)),
            state,
        }
    }
}

impl<F: Future> Future for TaskFuture<F> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.abort.load(Ordering::SeqCst) {
            // Drop the user future first: its Drop abandons in-flight IO to the driver.
            self.fut = None;
            let e = self.state.cancelled();
            self.state.complete(Err(e));
            return Poll::Ready(());
        }
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Ready(());
        };
        match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => {
                self.fut = None;
                self.state.complete(Ok(v));
                Poll::Ready(())
            }
            Err(payload) => {
                self.fut = None;
                let e = TaskError::Panicked {
                    name: self.state.name.to_string(),
                    message: panic_message(payload.as_ref()),
                };
                self.state.complete(Err(e));
                Poll::Ready(())
            }
        }
    }
}

impl<F: Future> Drop for TaskFuture<F> {
    fn drop(&mut self) {
        // A panic while dropping the user's future must not unwind through the executor.
        let fut = self.fut.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(fut)));
        let e = self.state.cancelled();
        self.state.complete(Err(e));
    }
}
