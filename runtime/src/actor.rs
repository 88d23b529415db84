//! Actors: a task that owns its state and drains a bounded mailbox.
//!
//! ```
//! use insitubatch_runtime::{Runtime, RuntimeBuilder};
//! let rt = RuntimeBuilder::new().executor_threads(1).build().unwrap();
//! // A summing actor: state lives in the task, messages arrive through a mailbox of 8.
//! let actor = rt.spawn_actor("sum", 8, |mut inbox| async move {
//!     let mut total = 0u64;
//!     while let Some(x) = inbox.recv().await {
//!         total += x;
//!     }
//!     total
//! });
//! for x in 1..=10u64 {
//!     actor.send_blocking(x).unwrap();
//! }
//! // Close our sender: the actor drains what is queued, sees the end, and returns.
//! assert_eq!(actor.finish().unwrap(), 55);
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::executor::{Handle, on_executor_thread};
use crate::task::{JoinHandle, TaskError, lock};

/// Why a message could not be delivered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    /// The actor has stopped, finished or panicked; its mailbox is gone.
    #[error(
        "actor `{0}` is no longer running (stopped, finished or panicked); join it for the reason"
    )]
    Gone(String),
    /// The mailbox is full (only from `try_send`).
    #[error("actor `{0}`'s mailbox is full")]
    Full(String),
    /// `send_blocking` was called on an executor thread, which would stall it.
    #[error(
        "send_blocking to actor `{0}` from an executor thread would deadlock; use `send(..).await`"
    )]
    WouldBlockExecutor(String),
}

#[derive(Default)]
struct StopSignal {
    stopped: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl StopSignal {
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }
}

/// The receiving end an actor drains. `recv` returns `None` once the actor is stopped or every
/// sender is gone.
pub struct Mailbox<M> {
    rx: flume::Receiver<M>,
    stop: Arc<StopSignal>,
}

impl<M> Mailbox<M> {
    /// Next message, or `None` when stopped or when no sender remains.
    pub async fn recv(&mut self) -> Option<M> {
        Recv {
            fut: self.rx.recv_async(),
            stop: &self.stop,
        }
        .await
    }

    /// True once `stop` was requested.
    pub fn is_stopped(&self) -> bool {
        self.stop.stopped.load(Ordering::SeqCst)
    }

    /// A message if one is queued, without waiting.
    pub fn try_recv(&mut self) -> Option<M> {
        if self.is_stopped() {
            None
        } else {
            self.rx.try_recv().ok()
        }
    }
}

struct Recv<'a, M> {
    fut: flume::r#async::RecvFut<'a, M>,
    stop: &'a StopSignal,
}

impl<M> Future for Recv<'_, M> {
    type Output = Option<M>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<M>> {
        if self.stop.stopped.load(Ordering::SeqCst) {
            return Poll::Ready(None);
        }
        *lock(&self.stop.waker) = Some(cx.waker().clone());
        // Re-check after registering so a concurrent stop is not missed.
        if self.stop.stopped.load(Ordering::SeqCst) {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.fut).poll(cx) {
            Poll::Ready(Ok(m)) => Poll::Ready(Some(m)),
            Poll::Ready(Err(_)) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The sending side and the join handle of an actor.
pub struct ActorHandle<M, R> {
    name: Arc<str>,
    tx: flume::Sender<M>,
    stop: Arc<StopSignal>,
    join: JoinHandle<R>,
}

/// A cloneable sender to an actor's mailbox.
pub struct ActorSender<M> {
    name: Arc<str>,
    tx: flume::Sender<M>,
}

impl<M> Clone for ActorSender<M> {
    fn clone(&self) -> Self {
        Self {
            name: Arc::clone(&self.name),
            tx: self.tx.clone(),
        }
    }
}

impl<M> ActorSender<M> {
    /// Waits for room in the mailbox, then enqueues. Fails if the actor is gone.
    pub async fn send(&self, msg: M) -> Result<(), SendError> {
        self.tx
            .send_async(msg)
            .await
            .map_err(|_| SendError::Gone(self.name.to_string()))
    }

    /// Enqueues if there is room now.
    pub fn try_send(&self, msg: M) -> Result<(), SendError> {
        self.tx.try_send(msg).map_err(|e| match e {
            flume::TrySendError::Full(_) => SendError::Full(self.name.to_string()),
            flume::TrySendError::Disconnected(_) => SendError::Gone(self.name.to_string()),
        })
    }

    /// Blocks a non-executor thread until there is room. Refused on executor threads.
    pub fn send_blocking(&self, msg: M) -> Result<(), SendError> {
        if on_executor_thread() {
            return Err(SendError::WouldBlockExecutor(self.name.to_string()));
        }
        self.tx
            .send(msg)
            .map_err(|_| SendError::Gone(self.name.to_string()))
    }
}

impl<M, R> ActorHandle<M, R> {
    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A sender that can be cloned and moved to other tasks or threads.
    pub fn sender(&self) -> ActorSender<M> {
        ActorSender {
            name: Arc::clone(&self.name),
            tx: self.tx.clone(),
        }
    }

    /// See [`ActorSender::send`].
    pub async fn send(&self, msg: M) -> Result<(), SendError> {
        self.sender().send(msg).await
    }

    /// See [`ActorSender::try_send`].
    pub fn try_send(&self, msg: M) -> Result<(), SendError> {
        self.sender().try_send(msg)
    }

    /// See [`ActorSender::send_blocking`].
    pub fn send_blocking(&self, msg: M) -> Result<(), SendError> {
        self.sender().send_blocking(msg)
    }

    /// Asks the actor to stop: its next `recv` returns `None` (queued messages are dropped).
    pub fn stop(&self) {
        self.stop.stop();
    }

    /// Aborts the actor task at its next scheduling point.
    pub fn abort(&self) {
        self.stop.stop();
        self.join.abort();
    }

    /// Closes this handle's sender and waits for the actor's result: the actor drains what is
    /// queued and its `recv` returns `None` once every other [`ActorSender`] is dropped too.
    pub fn finish(self) -> Result<R, TaskError> {
        let ActorHandle { tx, join, .. } = self;
        drop(tx);
        join.join()
    }

    /// Gives up this handle's own sender and returns the join handle: the actor then ends
    /// once every [`ActorSender`] is gone, and no handle keeps its mailbox open.
    pub fn into_join_handle(self) -> JoinHandle<R> {
        let ActorHandle { tx, join, .. } = self;
        drop(tx);
        join
    }

    /// Waits (blocking, off the executor) for the actor's result, or the panic that ended it.
    pub fn join(self) -> Result<R, TaskError> {
        self.join.join()
    }

    /// Waits asynchronously for the actor's result.
    pub async fn join_async(self) -> Result<R, TaskError> {
        self.join.await
    }

    /// True once the actor has finished.
    pub fn is_finished(&self) -> bool {
        self.join.is_finished()
    }
}

impl Handle {
    /// Spawns an actor with a mailbox of `capacity` messages (at least 1). `body` receives the
    /// mailbox and runs on one executor thread; its return value (or its panic, as
    /// [`TaskError::Panicked`]) reaches [`ActorHandle::join`]. When the actor ends for any reason
    /// its mailbox closes, so senders get [`SendError::Gone`] instead of waiting forever.
    pub fn spawn_actor<M, R, G, F>(&self, name: &str, capacity: usize, body: G) -> ActorHandle<M, R>
    where
        M: Send + 'static,
        R: Send + 'static,
        G: FnOnce(Mailbox<M>) -> F + Send + 'static,
        F: Future<Output = R> + 'static,
    {
        let (tx, rx) = flume::bounded(capacity.max(1));
        let stop = Arc::new(StopSignal::default());
        let mailbox = Mailbox {
            rx,
            stop: Arc::clone(&stop),
        };
        let join = self.spawn(name, move || body(mailbox));
        ActorHandle {
            name: Arc::from(name),
            tx,
            stop,
            join,
        }
    }
}

/// Several workers draining one shared bounded mailbox: whichever worker is free takes the
/// next message, so a core that is busy with other work (the gather, say) simply takes fewer.
/// Worker `i` runs on executor `i mod executor_threads()`.
pub struct ActorPool<M> {
    name: Arc<str>,
    tx: flume::Sender<M>,
    stops: Vec<Arc<StopSignal>>,
    joins: Vec<JoinHandle<()>>,
}

impl<M> ActorPool<M> {
    /// A sender to the shared mailbox.
    pub fn sender(&self) -> ActorSender<M> {
        ActorSender {
            name: Arc::clone(&self.name),
            tx: self.tx.clone(),
        }
    }

    /// Asks every worker to stop at its next `recv`.
    pub fn stop(&self) {
        for s in &self.stops {
            s.stop();
        }
    }

    /// Gives up this pool's own sender and returns the workers' join handles: the workers end
    /// once every [`ActorSender`] is gone and the mailbox is drained.
    pub fn into_join_handles(self) -> Vec<JoinHandle<()>> {
        let ActorPool { tx, joins, .. } = self;
        drop(tx);
        joins
    }
}

impl Handle {
    /// Spawns `workers` actors (at least 1) that share one mailbox of `capacity` messages.
    /// `body(i, mailbox)` is worker `i`'s loop; a panic in one worker reaches its join handle,
    /// and the others keep draining.
    pub fn spawn_actor_pool<M, G, F>(
        &self,
        name: &str,
        capacity: usize,
        workers: usize,
        body: G,
    ) -> ActorPool<M>
    where
        M: Send + 'static,
        G: Fn(usize, Mailbox<M>) -> F + Send + Clone + 'static,
        F: Future<Output = ()> + 'static,
    {
        let (tx, rx) = flume::bounded(capacity.max(1));
        let mut stops = Vec::new();
        let mut joins = Vec::new();
        for i in 0..workers.max(1) {
            let stop = Arc::new(StopSignal::default());
            let mailbox = Mailbox {
                rx: rx.clone(),
                stop: Arc::clone(&stop),
            };
            let body = body.clone();
            joins.push(self.spawn_on(i, name, move || body(i, mailbox)));
            stops.push(stop);
        }
        ActorPool {
            name: Arc::from(name),
            tx,
            stops,
            joins,
        }
    }
}
