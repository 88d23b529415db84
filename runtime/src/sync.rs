//! Cross-thread synchronisation for tasks: a FIFO counting [`Semaphore`] and a [`Notify`].
//!
//! Both wake tasks through their `Waker`s, so an executor thread never blocks on them. They are
//! what the engine bounds things with: one semaphore of in-flight stored-chunk reads per dataset,
//! one of read-ahead bytes per pass.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::task::lock;

/// Why an acquire failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// The semaphore was closed (its owner is shutting down).
    #[error("semaphore `{0}` is closed")]
    Closed(String),
    /// More permits were asked for than the semaphore will ever hold.
    #[error("asked semaphore `{name}` for {wanted} permits; it only has {total}")]
    TooMany {
        /// The semaphore.
        name: String,
        /// Requested.
        wanted: u64,
        /// Capacity.
        total: u64,
    },
}

struct Waiter {
    id: u64,
    wanted: u64,
    waker: Waker,
}

struct SemState {
    available: u64,
    closed: bool,
    waiters: VecDeque<Waiter>,
}

struct SemShared {
    name: String,
    total: u64,
    state: Mutex<SemState>,
    next_id: AtomicU64,
}

/// A counting semaphore with first-in-first-out fairness: a large request at the head is not
/// starved by small ones behind it. Cloning shares it.
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<SemShared>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.shared.name)
            .field("total", &self.shared.total)
            .field("available", &self.available())
            .finish()
    }
}

impl Semaphore {
    /// A semaphore named `name` (used in errors) holding `total` permits.
    pub fn new(name: impl Into<String>, total: u64) -> Self {
        Self {
            shared: Arc::new(SemShared {
                name: name.into(),
                total,
                state: Mutex::new(SemState {
                    available: total,
                    closed: false,
                    waiters: VecDeque::new(),
                }),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Permits it was created with.
    pub fn total(&self) -> u64 {
        self.shared.total
    }

    /// Permits not held right now.
    pub fn available(&self) -> u64 {
        lock(&self.shared.state).available
    }

    /// Waits for `n` permits. They return when the [`Permit`] drops.
    pub fn acquire(&self, n: u64) -> Acquire {
        Acquire {
            sem: self.clone(),
            wanted: n,
            id: None,
        }
    }

    /// `n` permits if they are free now and nobody is queued ahead.
    pub fn try_acquire(&self, n: u64) -> Option<Permit> {
        let mut st = lock(&self.shared.state);
        if !st.closed && st.waiters.is_empty() && st.available >= n {
            st.available -= n;
            Some(Permit {
                sem: self.clone(),
                n,
            })
        } else {
            None
        }
    }

    /// Fails every waiter and every later acquire with [`AcquireError::Closed`]. Permits already
    /// held stay valid and still come back when dropped.
    pub fn close(&self) {
        let waiters = {
            let mut st = lock(&self.shared.state);
            st.closed = true;
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            w.waker.wake();
        }
    }

    fn release(&self, n: u64) {
        let mut wake = Vec::new();
        {
            let mut st = lock(&self.shared.state);
            st.available += n;
            debug_assert!(st.available <= self.shared.total, "permits over-released");
            // Wake the head requests that now fit; they take their permits when they poll.
            let mut budget = st.available;
            for w in st.waiters.iter() {
                if w.wanted > budget {
                    break;
                }
                budget -= w.wanted;
                wake.push(w.waker.clone());
            }
        }
        for w in wake {
            w.wake();
        }
    }
}

/// Held permits; dropping returns them.
#[must_use = "dropping a Permit returns it at once"]
pub struct Permit {
    sem: Semaphore,
    n: u64,
}

impl Permit {
    /// Number of permits held.
    pub fn count(&self) -> u64 {
        self.n
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Permit({} of {})", self.n, self.sem.shared.name)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.n > 0 {
            self.sem.release(self.n);
        }
    }
}

/// The future of [`Semaphore::acquire`]. Dropping it leaves the queue.
pub struct Acquire {
    sem: Semaphore,
    wanted: u64,
    id: Option<u64>,
}

impl Future for Acquire {
    type Output = Result<Permit, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let shared = Arc::clone(&self.sem.shared);
        if self.wanted > shared.total {
            return Poll::Ready(Err(AcquireError::TooMany {
                name: shared.name.clone(),
                wanted: self.wanted,
                total: shared.total,
            }));
        }
        let mut st = lock(&shared.state);
        if st.closed {
            if let Some(id) = self.id.take() {
                st.waiters.retain(|w| w.id != id);
            }
            return Poll::Ready(Err(AcquireError::Closed(shared.name.clone())));
        }
        let at_head = match self.id {
            None => st.waiters.is_empty(),
            Some(id) => st.waiters.front().is_some_and(|w| w.id == id),
        };
        if at_head && st.available >= self.wanted {
            st.available -= self.wanted;
            if self.id.take().is_some() {
                st.waiters.pop_front();
            }
            // The next waiter may fit in what is left.
            if let Some(next) = st.waiters.front()
                && next.wanted <= st.available
            {
                next.waker.wake_by_ref();
            }
            drop(st);
            return Poll::Ready(Ok(Permit {
                sem: self.sem.clone(),
                n: self.wanted,
            }));
        }
        match self.id {
            Some(id) => {
                if let Some(w) = st.waiters.iter_mut().find(|w| w.id == id) {
                    w.waker.clone_from(cx.waker());
                }
            }
            None => {
                let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
                st.waiters.push_back(Waiter {
                    id,
                    wanted: self.wanted,
                    waker: cx.waker().clone(),
                });
                self.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut st = lock(&self.sem.shared.state);
            let was_head = st.waiters.front().is_some_and(|w| w.id == id);
            st.waiters.retain(|w| w.id != id);
            // If we were blocking the head, whoever is next may now proceed.
            if was_head
                && let Some(next) = st.waiters.front()
                && next.wanted <= st.available
            {
                next.waker.wake_by_ref();
            }
        }
    }
}

/// Wakes tasks waiting for "something changed". Waiters re-check their condition after every
/// wake, so a notification is never lost: `notified()` registers before the caller re-checks.
#[derive(Default)]
pub struct Notify {
    state: Mutex<NotifyState>,
}

#[derive(Default)]
struct NotifyState {
    generation: u64,
    wakers: Vec<Waker>,
}

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notify").finish_non_exhaustive()
    }
}

impl Notify {
    /// A notifier nobody waits on yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes every current waiter.
    pub fn notify_all(&self) {
        let wakers = {
            let mut st = lock(&self.state);
            st.generation += 1;
            std::mem::take(&mut st.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// The current generation; pass it to [`Notify::changed_since`].
    pub fn generation(&self) -> u64 {
        lock(&self.state).generation
    }

    /// Completes once `notify_all` ran after `generation` was read.
    pub fn changed_since(&self, generation: u64) -> ChangedSince<'_> {
        ChangedSince {
            notify: self,
            generation,
        }
    }
}

/// Future of [`Notify::changed_since`].
pub struct ChangedSince<'a> {
    notify: &'a Notify,
    generation: u64,
}

impl Future for ChangedSince<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = lock(&self.notify.state);
        if st.generation != self.generation {
            return Poll::Ready(());
        }
        // A waiter polled twice re-registers; the list is cleared on every notify, so it
        // holds at most one entry per poll between notifications.
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn poll_once<F: Future + Unpin>(f: &mut F, flag: &Arc<Flag>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(flag));
        Pin::new(f).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn fifo_head_is_not_starved_by_small_requests() {
        let sem = Semaphore::new("t", 10);
        let flag = Arc::new(Flag(false.into()));
        let held = sem.try_acquire(6).unwrap();
        let mut big = sem.acquire(8);
        assert!(poll_once(&mut big, &flag).is_pending());
        // A small request behind the big one must wait even though 4 are free.
        assert!(sem.try_acquire(1).is_none());
        let mut small = sem.acquire(1);
        assert!(poll_once(&mut small, &flag).is_pending());
        drop(held);
        assert!(flag.0.load(Ordering::SeqCst), "release woke the head");
        let p = match poll_once(&mut big, &flag) {
            Poll::Ready(Ok(p)) => p,
            _ => panic!("head should acquire"),
        };
        assert_eq!(p.count(), 8);
        assert!(matches!(poll_once(&mut small, &flag), Poll::Ready(Ok(_))));
        // `big` still holds 8; the small permit was dropped with the `matches!` temporary.
        assert_eq!(sem.available(), 2);
        drop(p);
        assert_eq!(sem.available(), 10);
    }

    #[test]
    fn close_fails_waiters_and_dropping_a_waiter_unblocks_the_next() {
        let sem = Semaphore::new("t", 2);
        let flag = Arc::new(Flag(false.into()));
        let held = sem.try_acquire(2).unwrap();
        let mut a = sem.acquire(2);
        let mut b = sem.acquire(1);
        assert!(poll_once(&mut a, &flag).is_pending());
        assert!(poll_once(&mut b, &flag).is_pending());
        drop(held);
        drop(a); // the head leaves; b can go
        assert!(matches!(poll_once(&mut b, &flag), Poll::Ready(Ok(_))));
        let mut c = sem.acquire(5);
        assert!(matches!(
            poll_once(&mut c, &flag),
            Poll::Ready(Err(AcquireError::TooMany { .. }))
        ));
        let mut d = sem.acquire(2);
        let _hold = sem.try_acquire(1);
        assert!(poll_once(&mut d, &flag).is_pending());
        sem.close();
        assert!(matches!(
            poll_once(&mut d, &flag),
            Poll::Ready(Err(AcquireError::Closed(_)))
        ));
    }

    #[test]
    fn notify_is_not_lost_between_read_and_wait() {
        let n = Notify::new();
        let flag = Arc::new(Flag(false.into()));
        let g = n.generation();
        n.notify_all();
        let mut f = Box::pin(n.changed_since(g));
        let waker = Waker::from(Arc::clone(&flag));
        assert!(f.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
        let g = n.generation();
        let mut f = Box::pin(n.changed_since(g));
        assert!(
            f.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        n.notify_all();
        assert!(flag.0.load(Ordering::SeqCst));
    }
}
