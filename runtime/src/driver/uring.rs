//! The io_uring driver: one ring per executor thread.
//!
//! Each operation lives in a slot of `ops` from submission until its completion is reaped. The
//! slot owns the operation's data (buffers, paths), so a future that is dropped early leaves its
//! buffer here — marked `Ignored` — until the kernel is done with it.

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::task::Waker;

use io_uring::{IoUring, opcode, squeue, types};

use crate::executor::ExecShared;

/// `user_data` of the eventfd read that wakes a parked executor.
const EVENTFD_TOKEN: u64 = u64::MAX;
/// `user_data` of cancellation requests (their completions carry nothing we need).
const CANCEL_TOKEN: u64 = u64::MAX - 1;
/// Operations handed to the kernel per loop tick. A buffered read of a file in the page cache
/// is copied inside `io_uring_enter`, so one enter with 32 chunk reads holds the thread for
/// milliseconds and no read completes before all of them have; small batches let the first
/// completions reach their tasks (and the decoders on other cores) early.
const SUBMIT_PER_TICK: usize = 8;

pub(crate) enum OpState {
    /// Submitted; the waker is the future's, if it has been polled.
    Waiting(Option<Waker>),
    /// The kernel answered with this result (`res` of the CQE).
    Completed(i32),
    /// The future was dropped; the slot keeps the data alive until the completion arrives.
    Ignored,
}

pub(crate) struct OpSlot {
    pub(crate) state: OpState,
    pub(crate) data: Option<Box<dyn Any>>,
    /// Completes the operation for nobody and drops what it produced (see `Drop`).
    discard: fn(Box<dyn Any>, i32),
}

impl Drop for OpSlot {
    fn drop(&mut self) {
        // A completion whose future is gone (dropped mid-flight, or before it took the result)
        // may have produced something that must be released: a descriptor an open returned is
        // closed, not leaked.
        if let (OpState::Completed(res), Some(data)) = (&self.state, self.data.take()) {
            (self.discard)(data, *res);
        }
    }
}

pub(crate) struct UringDriver {
    ring: IoUring,
    ops: Vec<Option<OpSlot>>,
    free: Vec<usize>,
    in_flight: usize,
    max_in_flight: usize,
    /// Futures waiting for a free slot when `max_in_flight` operations are in flight.
    waiters: VecDeque<Waker>,
    exec: Arc<ExecShared>,
    eventfd_buf: Box<u64>,
    eventfd_armed: bool,
    /// SQEs not yet pushed because the submission queue was full.
    backlog: VecDeque<squeue::Entry>,
}

impl UringDriver {
    pub(crate) fn new(entries: u32, exec: &Arc<ExecShared>) -> std::io::Result<Self> {
        // The completion queue is twice the submission queue (the kernel default), which leaves
        // room for the eventfd read and cancellations next to `entries` operations in flight.
        let ring = IoUring::builder().setup_clamp().build(entries)?;
        let max_in_flight = ring.params().sq_entries() as usize;
        Ok(Self {
            ring,
            ops: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            max_in_flight,
            waiters: VecDeque::new(),
            exec: Arc::clone(exec),
            eventfd_buf: Box::new(0),
            eventfd_armed: false,
            backlog: VecDeque::new(),
        })
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// True when another operation may be submitted now.
    pub(crate) fn has_capacity(&self) -> bool {
        self.in_flight < self.max_in_flight
    }

    pub(crate) fn wait_for_capacity(&mut self, waker: &Waker) {
        self.waiters.push_back(waker.clone());
    }

    /// Queues `sqe` for the operation whose data is `data`; returns the slot index. `discard`
    /// turns a result nobody takes into the operation's output and drops it.
    pub(crate) fn submit(
        &mut self,
        build: impl FnOnce(u64) -> squeue::Entry,
        data: Box<dyn Any>,
        discard: fn(Box<dyn Any>, i32),
    ) -> usize {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        self.ops[index] = Some(OpSlot {
            state: OpState::Waiting(None),
            data: Some(data),
            discard,
        });
        self.in_flight += 1;
        // Build the SQE only once the data sits in its slot (it was boxed before, so pointers
        // into it are already stable; building late keeps that obvious).
        let sqe = build(index as u64);
        self.push(sqe);
        index
    }

    fn push(&mut self, sqe: squeue::Entry) {
        // Every operation waits in the backlog; `flush_backlog` hands a bounded batch to the
        // ring per tick.
        self.backlog.push_back(sqe);
    }

    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut OpSlot {
        self.ops[index].as_mut().expect("live op slot")
    }

    /// Takes a completed slot's data and frees the slot.
    pub(crate) fn take_completed(&mut self, index: usize) -> (i32, Box<dyn Any>) {
        let mut slot = self.ops[index].take().expect("live op slot");
        self.free.push(index);
        let OpState::Completed(res) = slot.state else {
            panic!("op slot {index} not completed")
        };
        (res, slot.data.take().expect("op data present until taken"))
    }

    /// The future was dropped before completion: keep the data until the CQE, and ask the
    /// kernel to cancel.
    pub(crate) fn abandon(&mut self, index: usize) {
        let Some(slot) = self.ops[index].as_mut() else {
            return;
        };
        match slot.state {
            OpState::Completed(_) => {
                self.ops[index] = None;
                self.free.push(index);
            }
            _ => {
                slot.state = OpState::Ignored;
                let cancel = opcode::AsyncCancel::new(index as u64)
                    .build()
                    .user_data(CANCEL_TOKEN);
                self.push(cancel);
            }
        }
    }

    fn flush_backlog(&mut self) {
        for _ in 0..SUBMIT_PER_TICK {
            let Some(sqe) = self.backlog.pop_front() else {
                break;
            };
            // SAFETY: every SQE points into data owned by an `OpSlot` (or by the driver for the
            // eventfd read), which stays alive until its completion is reaped.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                self.backlog.push_front(sqe);
                break;
            }
        }
    }

    fn submit_pending(&mut self, wait: usize) {
        self.flush_backlog();
        // Never sleep with work still queued: the next tick submits the next batch.
        let wait = if self.backlog.is_empty() { wait } else { 0 };
        let r = if wait > 0 {
            self.ring.submit_and_wait(wait)
        } else {
            self.ring.submit()
        };
        if let Err(e) = r {
            match e.raw_os_error() {
                // Interrupted, or completions must be reaped first: the loop comes back.
                Some(libc::EINTR) | Some(libc::EBUSY) | Some(libc::EAGAIN) => {}
                _ => panic!("io_uring_enter failed: {e}"),
            }
        }
    }

    fn reap(&mut self) -> usize {
        let mut n = 0;
        let mut to_wake: Vec<Waker> = Vec::new();
        {
            let cq = self.ring.completion();
            let entries: Vec<(u64, i32)> = cq.map(|c| (c.user_data(), c.result())).collect();
            for (token, res) in entries {
                n += 1;
                match token {
                    EVENTFD_TOKEN => self.eventfd_armed = false,
                    CANCEL_TOKEN => {}
                    index => {
                        let index = index as usize;
                        self.in_flight -= 1;
                        let slot = self.ops[index]
                            .as_mut()
                            .expect("completion for a live slot");
                        match std::mem::replace(&mut slot.state, OpState::Completed(res)) {
                            OpState::Waiting(w) => to_wake.extend(w),
                            OpState::Ignored => {
                                // Nobody waits: now that the kernel is done, free the buffer
                                // (and whatever the operation produced).
                                self.ops[index] = None;
                                self.free.push(index);
                            }
                            OpState::Completed(_) => unreachable!("double completion"),
                        }
                    }
                }
            }
        }
        while self.in_flight < self.max_in_flight {
            let Some(w) = self.waiters.pop_front() else {
                break;
            };
            to_wake.push(w);
        }
        for w in to_wake {
            w.wake();
        }
        n
    }

    pub(crate) fn tick(&mut self) {
        self.submit_pending(0);
        self.reap();
    }

    fn arm_eventfd(&mut self) {
        if self.eventfd_armed {
            return;
        }
        let fd = types::Fd(self.exec.eventfd.as_raw_fd());
        let buf: *mut u64 = &mut *self.eventfd_buf;
        let sqe = opcode::Read::new(fd, buf.cast(), 8)
            .build()
            .user_data(EVENTFD_TOKEN);
        // Straight into the ring, ahead of the backlog: the executor must be wakeable before
        // it sleeps, whatever else is queued. If the ring is full the next tick retries.
        // SAFETY: `eventfd_buf` is owned by the driver and outlives the operation (the driver
        // drains every operation, this one included, before it is dropped).
        if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
            self.eventfd_armed = true;
        }
    }

    pub(crate) fn park(&mut self) {
        self.arm_eventfd();
        // Unwakeable (the ring had no room for the eventfd read): poll instead of sleeping.
        let wait = usize::from(self.eventfd_armed);
        self.submit_pending(wait);
        self.reap();
    }

    pub(crate) fn cancel_all_and_drain(&mut self) {
        for index in 0..self.ops.len() {
            if let Some(slot) = self.ops[index].as_mut()
                && !matches!(slot.state, OpState::Completed(_))
            {
                slot.state = OpState::Ignored;
                let cancel = opcode::AsyncCancel::new(index as u64)
                    .build()
                    .user_data(CANCEL_TOKEN);
                self.push(cancel);
            }
        }
        if self.eventfd_armed {
            let cancel = opcode::AsyncCancel::new(EVENTFD_TOKEN)
                .build()
                .user_data(CANCEL_TOKEN);
            self.push(cancel);
        }
        // Wait for every operation's completion. Cancellation makes this quick for anything
        // that can block (pipes, sockets); regular-file IO completes on its own.
        while self.in_flight > 0 || self.eventfd_armed {
            self.submit_pending(1);
            self.reap();
        }
        self.ops.clear();
    }
}

impl Drop for UringDriver {
    fn drop(&mut self) {
        if self.in_flight > 0 || self.eventfd_armed {
            self.cancel_all_and_drain();
        }
    }
}
