//! Decoding stored chunks straight into batch rows.
//!
//! At one sample per chunk a stored chunk is one batch row. Through the pool it is decoded into
//! a fresh buffer (pages the kernel zeroes), adopted as a slot, and copied by the gather into
//! its row: about a tenth of a cold epoch's CPU beside the decode itself
//! (docs/benchmarks.md, "One sample per chunk, profiled"). Decoded straight into its row it
//! costs the decode alone, and zstd frames then decompress into the batch buffer itself
//! ([`insitubatch_store::ZarrArray::decode_chunk_into`]).
//!
//! [`DirectRows::plan`] decides, when a pass starts, which of its slots go this way: each is a
//! whole one-sample chunk of an array without chunk transforms, read by exactly one row of one
//! label in the pass, in a pass whose pool can neither keep its chunks for a later epoch nor
//! write them to a cache directory. The planner opens a batch's [`Assembly`] when it issues the
//! first such chunk of the batch, taking the batch's buffers then; the decoder writes the row
//! through its [`RowDest`] and counts it filled; the gather, when it reaches the batch, waits
//! until as many rows are filled as it counts chunks decoded into the batch, copies the other
//! rows (pool hits, other arrays) into the same buffers and sends it.
//!
//! Memory: a row decoded in place holds its read-ahead permit like the slot it replaces, and
//! the batch buffers are taken one batch early at most (the batch at the planner's front);
//! [`crate::pass`] counts that batch in the pass's memory need.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use insitubatch_pool::{BufferPool, ChunkPool, PooledBuf};

use crate::error::EngineError;
use crate::pass::lock;
use crate::planner::{EpochOrder, ReadPlan};
use crate::tile::TileLayout;
use crate::transform::Pipeline;

/// No row: the slot is loaded through the pool.
const NONE: u32 = u32::MAX;

/// Per plan slot, the batch row its chunk is decoded into, if any.
#[derive(Debug, Default)]
pub(crate) struct DirectRows {
    /// (row of the order, label), or (`NONE`, _).
    rows: Vec<(u32, u32)>,
    count: usize,
}

impl DirectRows {
    /// No slot decoded into a row.
    pub fn none() -> Self {
        Self::default()
    }

    /// The slots of a pass over `plan` and `order` that are decoded into their rows (see the
    /// module's documentation for which). `enabled` is the pass's `decode_into_batches`.
    pub fn plan(
        enabled: bool,
        pool: &ChunkPool,
        transforms: &HashMap<String, Pipeline>,
        plan: &ReadPlan,
        order: &EpochOrder,
        release_each_block: bool,
    ) -> Self {
        let n_rows = order.rows.len();
        // A budget that holds every chunk the pass reads keeps them for the next epoch, which
        // a chunk decoded into a row would not be; a cache directory writes slots to files.
        let pass_bytes: u64 = plan.slots.iter().map(|s| s.nbytes).sum();
        let pool_keeps = pool.fixed_budget().is_some_and(|b| b >= pass_bytes);
        if !enabled
            || pool_keeps
            || pool.disk().is_some()
            || release_each_block
            || u32::try_from(n_rows).is_err()
        {
            return Self::none();
        }
        let eligible: Vec<bool> = plan
            .paths
            .iter()
            .map(|p| {
                p.samples_per_chunk == 1
                    && p.tiles == 1
                    && TileLayout::new(&p.geom).can_adopt()
                    && transforms.get(&*p.path).is_none_or(Pipeline::is_empty)
            })
            .collect();
        if !eligible.contains(&true) {
            return Self::none();
        }
        let mut rows = vec![(NONE, 0u32); plan.slots.len()];
        let mut reads = vec![0u32; plan.slots.len()];
        for (l, label) in plan.labels.iter().enumerate() {
            if !eligible[label.path] {
                continue;
            }
            for i in 0..n_rows {
                let (s, _) = plan.locate(l, order.anchor(i), plan.block_of_row[i]);
                reads[s as usize] = reads[s as usize].saturating_add(1);
                rows[s as usize] = (i as u32, l as u32);
            }
        }
        // A chunk two rows read (a window sharing its array with another label) stays a slot
        // both copy from; so does every chunk of its array, which keeps the rule per array.
        let mut shared_path = vec![false; plan.paths.len()];
        for (s, &n) in reads.iter().enumerate() {
            if n > 1 {
                shared_path[plan.slots[s].path] = true;
            }
        }
        let mut count = 0;
        for (s, row) in rows.iter_mut().enumerate() {
            if row.0 != NONE && shared_path[plan.slots[s].path] {
                row.0 = NONE;
            }
            count += usize::from(row.0 != NONE);
        }
        if count == 0 {
            return Self::none();
        }
        Self { rows, count }
    }

    /// The (row of the order, label) plan slot `slot` is decoded into.
    pub fn row_of(&self, slot: usize) -> Option<(usize, usize)> {
        let &(row, label) = self.rows.get(slot)?;
        (row != NONE).then_some((row as usize, label as usize))
    }

    /// True when no slot is decoded into a row.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// A buffer for `rows` samples of `sample_bytes` each, or an error that names the batch size when
/// the allocator refuses it (a size from user input must not abort the host process).
fn take_batch_buffer(
    buffers: &BufferPool,
    batch_size: usize,
    rows: usize,
    sample_bytes: usize,
    label: &str,
) -> Result<PooledBuf, EngineError> {
    rows.checked_mul(sample_bytes)
        .and_then(|bytes| buffers.take(bytes))
        .ok_or_else(|| {
            EngineError::arg(
                "batch_size",
                batch_size,
                format!(
                    "a batch of label `{label}` needs {rows} × {sample_bytes} bytes, which cannot \
                     be allocated; lower batch_size"
                ),
            )
        })
}

/// Buffers for batch `j` of a pass over `plan` yielding `n_rows` rows, one per label: each the
/// size of the pass's largest batch, cut to this one's rows (the short final batch costs no
/// other buffer).
pub(crate) fn batch_buffers(
    buffers: &BufferPool,
    plan: &ReadPlan,
    j: usize,
    n_rows: usize,
) -> Result<Vec<PooledBuf>, EngineError> {
    let bs = plan.batch_size;
    let n = plan.batch_rows(j, n_rows).len();
    plan.labels
        .iter()
        .map(|l| {
            let sb = l.sample_bytes as usize;
            let mut buf = take_batch_buffer(buffers, bs, bs.min(n_rows), sb, &l.label)?;
            buf.truncate(n * sb);
            Ok(buf)
        })
        .collect()
}

/// One batch being filled by decoders: its buffers, and how many rows are in.
pub(crate) struct Assembly {
    /// Owned until the gather takes them; only written through `dst`, by row.
    bufs: Mutex<Option<Vec<PooledBuf>>>,
    /// Each label's buffer: base pointer and length.
    dst: Vec<(*mut u8, usize)>,
    /// Per label, per row: handed to a [`RowDest`] already.
    handed: Mutex<Vec<Vec<bool>>>,
    filled: AtomicUsize,
}

// SAFETY: the pointers in `dst` point into the heap buffers `bufs` owns, which do not move and
// live as long as the assembly. They are only written through `RowDest`s, each of which owns
// a distinct in-bounds row range (checked in `row`), and the buffers are only read after
// `take`, which the gather calls once every row handed out has been counted filled.
unsafe impl Send for Assembly {}
// SAFETY: as above.
unsafe impl Sync for Assembly {}

impl Assembly {
    fn new(mut bufs: Vec<PooledBuf>, rows: usize) -> Self {
        let dst = bufs
            .iter_mut()
            .map(|b| {
                let s = b.as_mut_slice();
                (s.as_mut_ptr(), s.len())
            })
            .collect();
        let handed = vec![vec![false; rows]; bufs.len()];
        Self {
            bufs: Mutex::new(Some(bufs)),
            dst,
            handed: Mutex::new(handed),
            filled: AtomicUsize::new(0),
        }
    }

    /// The destination of `label`'s row `row` (within the batch), `len` bytes: handed out once.
    pub fn row(self: &Arc<Self>, label: usize, row: usize, len: usize) -> RowDest {
        let (_, buf_len) = self.dst[label];
        let at = row * len;
        assert!(at + len <= buf_len, "batch row past its buffer");
        let first = !std::mem::replace(&mut lock(&self.handed)[label][row], true);
        assert!(first, "internal error: batch row {row} handed out twice");
        RowDest {
            batch: Arc::clone(self),
            label,
            at,
            len,
        }
    }

    /// Rows filled so far.
    pub fn filled(&self) -> usize {
        self.filled.load(Ordering::Acquire)
    }

    /// The buffers, once every row handed out is filled (the caller has checked [`filled`]
    /// against the rows it handed out).
    ///
    /// [`filled`]: Assembly::filled
    pub fn take(&self) -> Option<Vec<PooledBuf>> {
        lock(&self.bufs).take()
    }
}

/// The open assemblies of a pass, by batch.
#[derive(Default)]
pub(crate) struct Assemblies {
    open: Mutex<HashMap<usize, Arc<Assembly>>>,
}

impl Assemblies {
    /// Batch `j`'s assembly, opened (its buffers taken) if it is not yet.
    pub fn open(
        &self,
        buffers: &BufferPool,
        plan: &ReadPlan,
        j: usize,
        n_rows: usize,
    ) -> Result<Arc<Assembly>, EngineError> {
        if let Some(a) = lock(&self.open).get(&j) {
            return Ok(Arc::clone(a));
        }
        // Only the planner opens assemblies, so nobody opens this one meanwhile.
        let bufs = batch_buffers(buffers, plan, j, n_rows)?;
        let a = Arc::new(Assembly::new(bufs, plan.batch_rows(j, n_rows).len()));
        lock(&self.open).insert(j, Arc::clone(&a));
        Ok(a)
    }

    /// Batch `j`'s assembly, which the gather now owns.
    pub fn close(&self, j: usize) -> Option<Arc<Assembly>> {
        lock(&self.open).remove(&j)
    }
}

/// Where one decoder writes one row: a range of a batch buffer that is this value's alone.
pub(crate) struct RowDest {
    batch: Arc<Assembly>,
    label: usize,
    at: usize,
    len: usize,
}

impl RowDest {
    /// The row's bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let (base, _) = self.batch.dst[self.label];
        // SAFETY: `Assembly::row` checked the range is inside the buffer and handed it to this
        // value alone; the buffer lives as long as `batch`, and nobody reads it before this row
        // is counted filled (`filled`, which consumes the value).
        unsafe { std::slice::from_raw_parts_mut(base.add(self.at), self.len) }
    }

    /// Counts the row filled; the gather reads it after this.
    pub fn filled(self) {
        self.batch.filled.fetch_add(1, Ordering::Release);
    }
}
