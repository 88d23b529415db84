//! IO operations as futures, each described once for both backends.
//!
//! An [`OpKind`] knows how to build its io_uring SQE and how to make the same call blocking. The
//! [`Op`] future submits it to the current executor's driver, owns nothing while it is in flight
//! (the driver or the blocking job owns the data), and gets the data back on completion.

pub(crate) mod blocking;
pub(crate) mod fsync;
pub(crate) mod nowait;
pub(crate) mod open;
pub(crate) mod read;
pub(crate) mod rename;
pub(crate) mod statx;
pub(crate) mod unlink;
pub(crate) mod write;
pub(crate) mod writev;

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use io_uring::squeue;

use crate::driver::uring::OpState;
use crate::driver::{BlockingJob, Driver};
use crate::executor::{current, with_current};
use crate::task::lock;

/// One IO operation.
pub(crate) trait OpKind: Send + 'static {
    /// What the future resolves to.
    type Output;
    /// Builds the SQE; pointers in it refer to data inside `self`, which is boxed and owned by
    /// the driver until the completion.
    fn uring_sqe(&mut self) -> squeue::Entry;
    /// The same operation as a blocking call, returning the kernel convention (`>= 0` or
    /// `-errno`).
    fn blocking_call(&mut self) -> i32;
    /// The operation as a call that cannot wait for a device (see [`nowait`]), made on the
    /// executor thread before it goes to the ring or to an IO thread. `Some` is the result
    /// (kernel convention); `None` hands the operation over.
    fn try_nonblocking(&mut self) -> Option<i32> {
        None
    }
    /// Whether [`OpKind::try_nonblocking`] may succeed for this operation.
    fn may_complete_nonblocking(&self) -> bool {
        false
    }
    /// Turns the result into the output, handing owned buffers back.
    fn complete(self, res: i32) -> Self::Output;
    /// Output when the operation could not be started or was cancelled at shutdown.
    fn fail(self, err: std::io::Error) -> Self::Output;
}

/// The errno of the last failed libc call, negated (kernel convention).
pub(crate) fn neg_errno() -> i32 {
    -std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Makes a byte-counting system call (`pread`, `pwrite`, `pwritev`: `>= 0` or `-1` and errno)
/// until it is not interrupted; the kernel convention (`>= 0` or `-errno`). Linux moves at most
/// `MAX_RW_COUNT` (under 2 GiB) per call, so the count fits.
pub(crate) fn retrying_interrupted(mut call: impl FnMut() -> isize) -> i32 {
    loop {
        let n = call();
        if n >= 0 {
            return n.min(i32::MAX as isize) as i32;
        }
        let e = neg_errno();
        if e != -libc::EINTR {
            return e;
        }
    }
}

/// `sqe`, sent to io_uring's workers at once when `punt` (an operation that cannot complete
/// without blocking, which io_uring would otherwise first try inline).
pub(crate) fn punted(sqe: squeue::Entry, punt: bool) -> squeue::Entry {
    if punt {
        sqe.flags(squeue::Flags::ASYNC)
    } else {
        sqe
    }
}

/// Converts a kernel result to `io::Result`.
pub(crate) fn res_to_io(res: i32) -> std::io::Result<u32> {
    if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as u32)
    }
}

/// Completes an operation whose future is gone and drops its output, releasing what the
/// operation produced (an open's descriptor is closed, a read's buffer freed).
fn discard<K: OpKind>(data: Box<dyn std::any::Any>, res: i32) {
    if let Ok(kind) = data.downcast::<K>() {
        drop(kind.complete(res));
    }
}

struct BlockingSlot<K: OpKind> {
    done: Option<(i32, Box<K>)>,
    waker: Option<Waker>,
}

impl<K: OpKind> Drop for BlockingSlot<K> {
    fn drop(&mut self) {
        // The job finished after its future was dropped: nobody took the result.
        if let Some((res, kind)) = self.done.take() {
            drop(kind.complete(res));
        }
    }
}

enum State<K: OpKind> {
    Init(Box<K>),
    Uring(usize),
    Sending(
        flume::r#async::SendFut<'static, BlockingJob>,
        Arc<Mutex<BlockingSlot<K>>>,
    ),
    Blocking(Arc<Mutex<BlockingSlot<K>>>),
    Done,
}

/// Future of one IO operation. Not `Send`: it belongs to the executor thread that polls it.
pub(crate) struct Op<K: OpKind> {
    state: State<K>,
    _not_send: PhantomData<*const ()>,
}

impl<K: OpKind> Op<K> {
    pub(crate) fn new(kind: K) -> Self {
        Self {
            state: State::Init(Box::new(kind)),
            _not_send: PhantomData,
        }
    }
}

pub(crate) fn not_on_runtime() -> std::io::Error {
    std::io::Error::other(
        "insitubatch IO operations must run on a runtime executor thread (spawn the task on the runtime)",
    )
}

fn shut_down() -> std::io::Error {
    std::io::Error::other("insitubatch runtime is shutting down; the IO operation was cancelled")
}

impl<K: OpKind> Future for Op<K> {
    type Output = K::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<K::Output> {
        // SAFETY: Op is never structurally pinned: every field may move (State holds boxes and
        // Arcs; SendFut is Unpin).
        let this = unsafe { self.get_unchecked_mut() };
        loop {
            match std::mem::replace(&mut this.state, State::Done) {
                State::Init(kind) => {
                    let Some(exec) = current() else {
                        return Poll::Ready((*kind).fail(not_on_runtime()));
                    };
                    // On either backend, first the call that cannot wait for a device (a
                    // cached lookup, a page-cache read) on this thread; what would wait goes to
                    // the ring or to an IO thread.
                    let mut kind = kind;
                    if kind.may_complete_nonblocking() {
                        if !exec.take_inline_turn(cx) {
                            // This poll's inline budget is spent: yield, and try again when
                            // the task is polled next.
                            this.state = State::Init(kind);
                            return Poll::Pending;
                        }
                        if let Some(res) = kind.try_nonblocking() {
                            return Poll::Ready((*kind).complete(res));
                        }
                    }
                    match &exec.driver {
                        Driver::Uring(d) => {
                            let mut d = d.borrow_mut();
                            if !d.has_capacity() {
                                d.wait_for_capacity(cx.waker());
                                this.state = State::Init(kind);
                                return Poll::Pending;
                            }
                            let sqe = kind.uring_sqe();
                            let index = d.submit(|token| sqe.user_data(token), kind, discard::<K>);
                            this.state = State::Uring(index);
                        }
                        Driver::Threads(t) => {
                            let slot = Arc::new(Mutex::new(BlockingSlot::<K> {
                                done: None,
                                waker: None,
                            }));
                            let job_slot = Arc::clone(&slot);
                            let counter = Arc::clone(&t.in_flight);
                            counter.fetch_add(1, Ordering::Relaxed);
                            let job: BlockingJob = Box::new(move |cancelled| {
                                let mut kind = kind;
                                let res = if cancelled {
                                    -libc::ECANCELED
                                } else {
                                    kind.blocking_call()
                                };
                                counter.fetch_sub(1, Ordering::Relaxed);
                                let waker = {
                                    let mut s = lock(&job_slot);
                                    s.done = Some((res, kind));
                                    s.waker.take()
                                };
                                if let Some(w) = waker {
                                    w.wake();
                                }
                            });
                            this.state = State::Sending(t.pool.clone().into_send_async(job), slot);
                        }
                    }
                }
                State::Uring(index) => {
                    let done = with_current(|exec| {
                        let Driver::Uring(d) = &exec?.driver else {
                            return None;
                        };
                        let mut d = d.borrow_mut();
                        let slot = d.slot_mut(index);
                        match &mut slot.state {
                            OpState::Completed(_) => Some(d.take_completed(index)),
                            OpState::Waiting(w) => {
                                *w = Some(cx.waker().clone());
                                None
                            }
                            OpState::Ignored => None,
                        }
                    });
                    match done {
                        Some((res, data)) => {
                            let kind = data.downcast::<K>().expect("op data has the op's type");
                            return Poll::Ready(kind.complete(res));
                        }
                        None => {
                            this.state = State::Uring(index);
                            return Poll::Pending;
                        }
                    }
                }
                State::Sending(mut send, slot) => match Pin::new(&mut send).poll(cx) {
                    Poll::Pending => {
                        this.state = State::Sending(send, slot);
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(())) => this.state = State::Blocking(slot),
                    Poll::Ready(Err(flume::SendError(job))) => {
                        // The pool is gone (shutdown): run the job as cancelled so the kind
                        // comes back through the slot with ECANCELED.
                        job(true);
                        this.state = State::Blocking(slot);
                    }
                },
                State::Blocking(slot) => {
                    let mut s = lock(&slot);
                    if let Some((res, kind)) = s.done.take() {
                        drop(s);
                        if res == -libc::ECANCELED {
                            return Poll::Ready(kind.fail(shut_down()));
                        }
                        return Poll::Ready(kind.complete(res));
                    }
                    s.waker = Some(cx.waker().clone());
                    drop(s);
                    this.state = State::Blocking(slot);
                    return Poll::Pending;
                }
                State::Done => panic!("Op polled after completion"),
            }
        }
    }
}

impl<K: OpKind> Drop for Op<K> {
    fn drop(&mut self) {
        if let State::Uring(index) = self.state {
            with_current(|exec| {
                if let Some(exec) = exec
                    && let Driver::Uring(d) = &exec.driver
                    && let Ok(mut d) = d.try_borrow_mut()
                {
                    d.abandon(index);
                }
            });
        }
        // Blocking jobs own their data; dropping our end of the slot is enough.
    }
}
