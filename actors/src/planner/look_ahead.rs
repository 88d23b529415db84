//! Cache-file lookups started ahead of the planner's admissions.
//!
//! A chunk that a persisted cache directory holds is revived when it is admitted: its file is
//! opened and its size and header checked. Done at each admission, those are small IOs one after
//! another on the planner's thread, each waiting for the device when the pages are not cached.
//! Instead the planner starts the lookups of the slots ahead of it and hands each outcome to its
//! slot's admission, so that many are in flight at once (`docs/benchmarks.md`, "NVMe tier":
//! a fresh run's revival epoch with the pages dropped went from 760 to 907 MB/s, median of five
//! alternated pairs).
//!
//! The lookups run inside the planner's own task, polled whenever the planner starts more or
//! takes one: from the page cache a lookup completes in its first poll, with no task spawned
//! and no thread woken. At most `max_inflight` lookups (and never more than [`MAX_AHEAD`]) are
//! started and not yet taken, each holding a descriptor until its slot is admitted. They take
//! no `max_inflight` permits: those count stored-chunk reads, and the gather reads a free budget
//! as "no decode running" and only then shares a batch copy with the other cores
//! (`crate::gather`), which a permit held by a lookup would stop.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use insitubatch_pool::{ChunkPool, PreparedRevival, SlotKey};

use crate::pass::PassShared;

/// Lookups ahead at most, whatever `max_inflight` is: each holds a descriptor until its slot is
/// admitted, and with the pages dropped 32 ahead measured no faster than 8.
const MAX_AHEAD: usize = 32;

/// A lookup's IO, owning what it needs.
type LookupIo = Pin<Box<dyn Future<Output = PreparedRevival>>>;

enum State {
    Running(LookupIo),
    Done(PreparedRevival),
}

/// One plan slot's lookup.
struct Lookup {
    slot: usize,
    key: SlotKey,
    state: State,
}

/// The lookups started ahead of the planner, in plan order.
pub(super) struct LookAhead {
    pool: Arc<ChunkPool>,
    started: VecDeque<Lookup>,
    /// The first plan slot not considered yet.
    next: usize,
    /// Lookups started and not yet taken, at most (0 without a persisted cache).
    depth: usize,
}

impl LookAhead {
    /// Looks up to `max_inflight` slots ahead (at most [`MAX_AHEAD`]) when the pool revives
    /// chunks from files.
    pub(super) fn new(pool: &Arc<ChunkPool>, max_inflight: u64) -> Self {
        let depth = usize::try_from(max_inflight).map_or(MAX_AHEAD, |n| n.min(MAX_AHEAD));
        Self {
            pool: Arc::clone(pool),
            started: VecDeque::new(),
            next: 0,
            depth: if pool.revives_from_files() { depth } else { 0 },
        }
    }

    /// Starts the lookups of slots `at ..= at + depth` that the cache directory holds and the
    /// pool does not, and moves every lookup in flight on.
    pub(super) async fn start(&mut self, shared: &PassShared, at: usize) {
        if self.depth == 0 {
            return;
        }
        let plan = &shared.plan;
        let end = at
            .saturating_add(self.depth)
            .saturating_add(1)
            .min(plan.slots.len());
        self.next = self.next.max(at);
        while self.next < end && self.started.len() < self.depth {
            let i = self.next;
            let ps = &plan.slots[i];
            let key = SlotKey {
                path: Arc::clone(&plan.paths[ps.path].path),
                chunk: ps.chunk,
            };
            // A chunk decoded into batch rows is never revived; a key met twice in the window is
            // looked up for its first slot only (the second finds it resident or looks it up at
            // its admission).
            let wanted = !shared.direct.is_direct(i)
                && !self.started.iter().any(|l| l.key == key)
                && self.pool.would_look_up(&key);
            if wanted {
                let (pool, k, nbytes) = (Arc::clone(&self.pool), key.clone(), ps.nbytes);
                let io: LookupIo = Box::pin(async move { pool.prepare_revival(&k, nbytes).await });
                self.started.push_back(Lookup {
                    slot: i,
                    key,
                    state: State::Running(io),
                });
            }
            self.next += 1;
        }
        std::future::poll_fn(|cx| {
            self.advance(cx);
            Poll::Ready(())
        })
        .await;
    }

    /// Polls every lookup in flight once.
    fn advance(&mut self, cx: &mut Context<'_>) {
        for lookup in &mut self.started {
            if let State::Running(io) = &mut lookup.state
                && let Poll::Ready(prepared) = io.as_mut().poll(cx)
            {
                lookup.state = State::Done(prepared);
            }
        }
    }

    /// Slot `i`'s lookup, if one was started for it. `before_waiting` runs first if the lookup
    /// is not done.
    pub(super) async fn take(
        &mut self,
        i: usize,
        before_waiting: impl FnOnce(),
    ) -> Option<PreparedRevival> {
        // Slots are admitted in plan order, so anything before `i` is stale.
        while self.started.front().is_some_and(|l| l.slot < i) {
            self.started.pop_front();
        }
        if self.started.front().is_none_or(|l| l.slot != i) {
            return None;
        }
        let mut before_waiting = Some(before_waiting);
        std::future::poll_fn(|cx| {
            self.advance(cx);
            match self.started.pop_front() {
                Some(Lookup {
                    state: State::Done(prepared),
                    ..
                }) => return Poll::Ready(Some(prepared)),
                Some(running) => self.started.push_front(running),
                None => return Poll::Ready(None),
            }
            if let Some(f) = before_waiting.take() {
                f();
            }
            Poll::Pending
        })
        .await
    }
}
