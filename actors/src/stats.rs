//! Per-pass counters and the report a consumer reads.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A stored chunk that could not be read or decoded under `on_bad_chunk = nan`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BadChunk {
    /// Array path.
    pub array: String,
    /// Physical stored-chunk index.
    pub chunk_index: Vec<u64>,
    /// Store key.
    pub key: String,
    /// What went wrong.
    pub message: String,
}

/// Counters the actors bump while a pass runs.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub bytes_read: AtomicU64,
    pub bytes_decoded: AtomicU64,
    pub tiles_read: AtomicU64,
    pub tiles_read_waited: AtomicU64,
    pub tiles_into_batches: AtomicU64,
    pub region_slots: AtomicU64,
    pub bytes_revived: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// One pass's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PassStats {
    /// Split name.
    pub split: String,
    /// Epoch.
    pub epoch: u64,
    /// Batches delivered so far.
    pub batches: u64,
    /// Batches this pass yields: the epoch's, or from `start_batch` on when resumed.
    pub batches_total: u64,
    /// The epoch's batch this pass started at (0 unless resumed): it yields the epoch's
    /// batches `start_batch..start_batch + batches_total`.
    pub start_batch: u64,
    /// Samples delivered so far.
    pub samples: u64,
    /// Slots found resident (no fetch, no decode).
    pub cache_hits: u64,
    /// Slots fetched and decoded.
    pub cache_misses: u64,
    /// Hits revived from the cache directory's files (part of `cache_hits`).
    pub cache_revived: u64,
    /// Bytes read back from the cache directory's files for revived slots.
    pub bytes_revived: u64,
    /// Cache-directory entries consulted and rejected (file missing, damaged or of another
    /// geometry): each became a miss.
    pub cache_rejected: u64,
    /// Stored chunks read.
    pub tiles_read: u64,
    /// Of those, reads the page cache could not answer at once (they waited for the device;
    /// whichever core was free decoded them). The rest were decoded by the core that read them.
    pub tiles_read_waited: u64,
    /// Of the misses, chunks decoded into their samples' batch rows rather than into the pool
    /// (one per chunk, however many stored chunks its field is; not a chunk holding a bad
    /// stored chunk's stand-in; see `docs/architecture.md`, "Decoding into batch rows").
    pub tiles_into_batches: u64,
    /// Of the misses, chunks loaded into the pool as the regions their rows' patches read
    /// rather than whole: of a field several labels read (a window beside its array), only
    /// the stored (inner) chunks under the windows (see `docs/architecture.md`, "Region
    /// slots").
    pub region_slots: u64,
    /// Encoded bytes read from the store.
    pub bytes_read: u64,
    /// Bytes produced by decoding.
    pub bytes_decoded: u64,
    /// Bytes delivered in batches.
    pub bytes_delivered: u64,
    /// Highest pool residency while this pass admitted chunks (its own chunks plus cached
    /// ones other passes left; never above `budget_bytes`).
    pub resident_peak_bytes: u64,
    /// Most bytes this pass had pinned at once (never above `read_ahead_bytes`).
    pub pinned_peak_bytes: u64,
    /// The pass's read-ahead bound (its working set).
    pub read_ahead_bytes: u64,
    /// The pool's budget.
    pub budget_bytes: u64,
    /// Time the consumer spent waiting in `next()`.
    pub consumer_stall_us: u64,
    /// From the start of the pass to the first batch.
    pub ttfb_us: u64,
    /// Median time between batches as the consumer receives them.
    pub batch_latency_us_p50: u64,
    /// 90th percentile of the same.
    pub batch_latency_us_p90: u64,
    /// 99th percentile of the same.
    pub batch_latency_us_p99: u64,
    /// The longest interval between batches.
    pub batch_latency_us_max: u64,
    /// Wall time so far.
    pub elapsed_us: u64,
    /// Anchors skipped because a window would read off the array.
    pub dropped_anchors: u64,
    /// Rows left out at the end of this rank's epoch so that every rank of a sharded train
    /// split takes the same number of steps (`rank` / `world_size`).
    pub trimmed_rows: u64,
    /// Bad stored chunks replaced under `on_bad_chunk = nan`.
    pub bad_chunks: Vec<BadChunk>,
    /// Warnings raised by this pass (also printed to stderr once).
    pub warnings: Vec<String>,
    /// The pass was started before it was asked for, while the epoch before it was still
    /// running (`prefetch_next_epoch`); its times count from when it was asked for.
    pub started_ahead: bool,
}
