//! Decoding stored chunks straight into batch rows.
//!
//! Through the pool a stored chunk is decoded into a fresh buffer (pages the kernel zeroes),
//! adopted as a slot, and copied row by row by the gather, from memory, a block later: at one
//! sample per chunk about a tenth of a cold epoch's CPU beside the decode itself
//! (docs/benchmarks.md, "One sample per chunk, profiled"). When nothing needs the slot, the
//! chunk goes to its rows instead: a one-sample chunk is decoded straight into its row (zstd
//! frames decompress into the batch buffer itself,
//! [`insitubatch_store::ZarrArray::decode_chunk_into`]); any other chunk (several samples, a
//! cropped field, the sample axis not first) is decoded into the decoding thread's scratch
//! buffer, which stays in its cache and is never freshly mapped, and each sample's part copied
//! from there into its row ([`TileLayout::copy_into_rows`]). With a patch, a chunk that is its
//! samples byte for byte is decoded into the scratch buffer and each row's patch cut from
//! there ([`RowDest::write_sample`]; with several patches per sample, each of them, every one
//! a row of its own); a one-sample chunk of a field stored as several chunks is
//! read as the region its row's patch covers, each stored chunk under the window copying its
//! box in (with several patches per sample, the stored chunks under any of the windows, each
//! read once and copied into every row whose window it is under); any other chunk goes
//! through the pool (a patched field two labels read, loaded there with only the stored chunks
//! under the windows: `crate::region_slot`).
//!
//! [`DirectRows::plan`] decides, when a pass starts, which of its slots go this way: a chunk
//! (of one or several tiles, each a stored chunk copying its box of each sample in; a cropped
//! view of a shard decodes only the inner chunks its region touches) of an array without chunk
//! transforms, which one label
//! reads, whose samples the order draws within one shuffle block, in a pass whose pool would
//! keep little of what it reads for a later epoch ([`IntoRows`]) and writes no cache
//! directory. The planner opens a batch's [`Assembly`] when it issues the first chunk with a
//! row in it, taking the batch's buffers then; the decoder writes each row through its
//! [`RowDest`] and counts it filled; the gather, when it reaches the batch, waits until as many
//! rows are filled as it counts rows decoded in place, copies the batch's other rows (pool
//! hits, other arrays) into the same buffers and sends it.
//!
//! Memory: a chunk decoded into rows holds its read-ahead permit like the slot it replaces,
//! and its rows sit in batch buffers instead of a slot: every batch a row of an issued chunk
//! falls in is taken early, until the chunk's block drains. [`DirectRows::open_batches`]
//! counts the most the read-ahead permits let the planner open at once, and each executor
//! keeps a scratch buffer of the largest stored chunk not decoded straight into its row
//! ([`DirectRows::scratch_bytes`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use insitubatch_pool::{BufferPool, ChunkPool, PooledBuf};

use crate::error::EngineError;
use crate::gather::stream::copy_to_batch;
use crate::pass::{IntoRows, lock};
use crate::patch::{Cut, Origins, PatchDraw, reads_patch_region};
use crate::planner::{EpochOrder, ReadPlan};
use crate::tile::TileLayout;
use crate::transform::Pipeline;

/// No row: the slot is loaded through the pool, or no row reads this sample.
const NONE: u32 = u32::MAX;

/// What choosing where a pass's chunks are decoded looks at ([`DirectRows::plan`],
/// [`crate::region_slot::RegionSlots::plan`]).
pub(crate) struct PassInputs<'a> {
    /// `decode_into_batches`.
    pub mode: IntoRows,
    pub pool: &'a ChunkPool,
    /// Each array's chunk transforms, by path.
    pub transforms: &'a HashMap<String, Pipeline>,
    pub plan: &'a ReadPlan,
    pub order: &'a EpochOrder,
    /// The pass releases each block's chunks as it drains (`read_plan`).
    pub release_each_block: bool,
    /// Per plan path, the inner chunk shape of an array whose stored chunks are shards (a
    /// cropped view of one reads and decodes its chunks in parts).
    pub inner: Vec<Option<Vec<u64>>>,
}

impl PassInputs<'_> {
    /// Bytes of every chunk the pass reads, and the pool's budget for them (a fixed
    /// `cache_budget_bytes`, or the pass's working set).
    pub fn pass_bytes_and_budget(&self) -> (u64, u64) {
        let pass_bytes = self.plan.slots.iter().map(|s| s.nbytes).sum();
        let budget = self
            .pool
            .fixed_budget()
            .unwrap_or(self.plan.read_ahead_bytes);
        (pass_bytes, budget)
    }
}

/// Per plan slot, the batch rows its chunk's samples are decoded into, if any.
#[derive(Debug, Default)]
pub(crate) struct DirectRows {
    /// Per plan slot: (index into `rows` of its first sample's first patch, its samples, the
    /// label), or (`NONE`, ..) for a slot loaded through the pool.
    slots: Vec<(u32, u32, u32)>,
    /// Per sample of every slot decoded into rows, in order, per patch of the sample (one
    /// without several patches per sample): the row of the order that reads it, or `NONE`.
    rows: Vec<u32>,
    /// Rows per sample: its patches.
    per_sample: u32,
    /// Per path: whether a row of its one-sample chunks is read as the region its patch covers
    /// ([`reads_patch_region`]).
    regions: Vec<bool>,
    /// The most samples per chunk of a slot decoded into rows (0: none is), and the largest
    /// stored chunk of those not decoded straight into their one row (decoded into a scratch
    /// buffer first).
    max_spc: u64,
    scratch_bytes: u64,
    /// The most batches the planner may hold open at once for rows decoded in place.
    open_batches: u64,
}

impl DirectRows {
    /// No slot decoded into rows.
    pub fn none() -> Self {
        Self::default()
    }

    /// The slots of a pass whose chunks are decoded straight into their batch rows (see the
    /// module's documentation for which).
    pub fn plan(inputs: &PassInputs) -> Self {
        let PassInputs {
            mode,
            pool,
            transforms,
            plan,
            order,
            release_each_block,
            ref inner,
        } = *inputs;
        let reads_parts = |p: usize| plan.paths[p].geom.region.is_some() && inner[p].is_some();
        let n_rows = order.rows.len();
        // A chunk decoded into rows is not kept for a later epoch. Under LRU with each epoch's
        // order shuffled, a budget holding a quarter of the pass's chunks serves ~4 % of a later
        // epoch's reads as hits, half of them ~15 %: past a quarter the pool is worth its
        // copies (docs/benchmarks.md, "Decoding into batch rows").
        let (pass_bytes, budget) = inputs.pass_bytes_and_budget();
        let pool_keeps = match mode {
            IntoRows::Never => true,
            IntoRows::Always => false,
            IntoRows::Auto => budget.saturating_mul(4) > pass_bytes,
        };
        // A patched row read as the region its patch covers reads a small part of its field,
        // which beats the hits a pool short of the whole pass serves: there the pool is worth
        // it only when it keeps everything.
        let regions_go_to_rows = plan.patch.is_some()
            && match mode {
                IntoRows::Never => false,
                IntoRows::Always => true,
                IntoRows::Auto => budget < pass_bytes,
            };
        // A cache directory writes slots to files.
        let patches = plan.patch.as_ref().map_or(1, PatchDraw::per_sample);
        if (pool_keeps && !regions_go_to_rows)
            || pool.disk().is_some()
            || release_each_block
            || u32::try_from(n_rows).is_err()
        {
            return Self::none();
        }
        let mut labels_of = vec![0usize; plan.paths.len()];
        let mut shared = vec![false; plan.paths.len()];
        for l in &plan.labels {
            labels_of[l.path] += 1;
            shared[l.path] |= l.map.shares_samples();
        }
        // A chunk read by two labels (a window beside its array) is a slot both copy from (with
        // a patch, perhaps a region slot: `crate::region_slot`); a
        // chunk read from blocks far apart (an array chunked coarser than the order's grid)
        // would open every batch between them at once.
        let mut eligible: Vec<bool> = plan
            .paths
            .iter()
            .zip(labels_of.iter().zip(&shared))
            .map(|(p, (&labels, &shared))| {
                // A static field's one slot is every row's; an indexed array's sample, or a
                // coarser store's read by every anchor its period contains, may be several
                // rows' (a day's for each of its hours).
                labels == 1
                    && !p.geom.static_field
                    && !shared
                    && transforms.get(&*p.path).is_none_or(Pipeline::is_empty)
            })
            .collect();
        // A one-sample chunk that is its row byte for byte is decoded straight into it; any
        // other (several samples, a cropped field, the sample axis not first) is decoded whole
        // into the executor's scratch buffer and its region copied from there into its rows,
        // except a cropped view of a shard, which decodes only the inner chunks its region
        // touches (`reads_parts`), into a buffer of their own.
        let straight: Vec<bool> = plan
            .paths
            .iter()
            .map(|p| {
                plan.patch.is_none()
                    && p.samples_per_chunk == 1
                    && TileLayout::new(&p.geom).can_adopt()
            })
            .collect();
        // A patch is cut from a whole sample in the scratch buffer, so a chunk that is its
        // samples byte for byte (one tile, no region, the sample axis first) goes to rows, each
        // of its samples' patches cut into its row; so does a chunk of a field stored as
        // several chunks or inner chunks (`reads_patch_region`), each row read as the region
        // its patch covers (`crate::planner`'s `patch_region`). A chunk of several rows (drawn
        // patches, or several samples) is read as the union of their regions, each stored
        // chunk under any window once (`ChunkRows::with_regions`; of a shard, each inner chunk
        // under any window of its sample, read and decoded once). A grid covers the whole
        // field, so its union would be every stored chunk: it goes through the pool, as a
        // whole field would.
        let mut regions = vec![false; plan.paths.len()];
        if let Some(draw) = &plan.patch {
            let drawn = matches!(draw.patch.origins, Origins::Random(_));
            for (i, (e, p)) in eligible.iter_mut().zip(&plan.paths).enumerate() {
                let whole = TileLayout::new(&p.geom).can_adopt() && !reads_parts(i);
                regions[i] = (patches == 1 || drawn)
                    && reads_patch_region(p, inner[i].as_deref(), &draw.patch);
                let region = regions[i];
                *e &= (whole && !pool_keeps) || region;
            }
        }
        for s in &plan.slots {
            if s.first_block != s.last_block {
                eligible[s.path] = false;
            }
        }
        if !eligible.contains(&true) {
            return Self::none();
        }
        let Ok(per_sample) = u32::try_from(patches) else {
            return Self::none();
        };
        // A shard's rows read as regions are decoded an inner chunk at a time (a single row's,
        // its window from the inner chunks under it): at most the inner chunks under one
        // window and the window, not the shard.
        let shard_regions: Vec<Option<u64>> = plan
            .paths
            .iter()
            .zip(regions.iter().zip(inner))
            .map(|(p, (&region, inner))| {
                let (inner, draw) = (inner.as_deref()?, plan.patch.as_ref()?);
                let under = crate::patch::inner_bytes_under_windows(p, inner, &draw.patch, 1);
                region.then(|| under.saturating_mul(2).min(p.geom.stored_chunk_bytes()))
            })
            .collect();
        let mut slots = vec![(NONE, 0u32, 0u32); plan.slots.len()];
        let (mut n_samples, mut max_spc, mut scratch_bytes) = (0usize, 0, 0);
        for (i, s) in plan.slots.iter().enumerate() {
            if eligible[s.path] {
                let k = plan.paths[s.path].samples_per_chunk;
                slots[i] = (n_samples as u32, k as u32, 0);
                n_samples = n_samples.saturating_add((k * patches) as usize);
                max_spc = max_spc.max(k);
                let path = &plan.paths[s.path];
                if let Some(bytes) = shard_regions[s.path] {
                    scratch_bytes = scratch_bytes.max(bytes);
                } else if reads_parts(s.path) {
                    // The inner chunks a cropped shard's region touches, decoded into a buffer
                    // of their own: at most the region's samples, the slot.
                    scratch_bytes = scratch_bytes.max(s.nbytes);
                } else if !straight[s.path] {
                    scratch_bytes = scratch_bytes.max(path.geom.stored_chunk_bytes());
                }
            }
        }
        if n_samples >= NONE as usize {
            return Self::none();
        }
        let mut rows = vec![NONE; n_samples];
        for (l, label) in plan.labels.iter().enumerate() {
            if !eligible[label.path] {
                continue;
            }
            for i in 0..n_rows {
                let (s, w) = plan.locate(l, order.anchor(i), plan.block_of_row[i]);
                slots[s as usize].2 = l as u32;
                let at = slots[s as usize].0 as usize
                    + w as usize * per_sample as usize
                    + order.patch(i) as usize;
                // One label reads the array and each (anchor, patch) is one row: each sample's
                // patch once.
                assert_eq!(rows[at], NONE, "internal error: a sample read by two rows");
                rows[at] = i as u32;
            }
        }
        let mut direct = Self {
            slots,
            rows,
            per_sample,
            regions,
            max_spc,
            scratch_bytes,
            open_batches: 0,
        };
        direct.open_batches = direct.most_open_batches(plan);
        direct
    }

    /// The most batches rows decoded in place hold open at once: with the gather stopped at
    /// each block in turn, the planner issues slots in order while the read-ahead permits
    /// last, and each issued chunk holds its rows' batches until its block drains.
    fn most_open_batches(&self, plan: &ReadPlan) -> u64 {
        let bs = plan.batch_size.max(1);
        let mut holders = vec![0u32; plan.n_batches];
        let (mut open, mut most) = (0u64, 0u64);
        // Issuing a chunk takes its rows' batches, its block draining gives them back.
        let mut take = |slot: usize, issue: bool, open: &mut u64| {
            let Some((_, rows)) = self.rows_of(slot) else {
                return;
            };
            for r in rows.flatten() {
                let h = &mut holders[r / bs];
                if issue {
                    *open += u64::from(*h == 0);
                    *h += 1;
                } else if *h > 0 {
                    *h -= 1;
                    *open -= u64::from(*h == 0);
                }
            }
        };
        let (mut issued, mut held) = (0usize, 0u64);
        for released in &plan.releases {
            while let Some(s) = plan.slots.get(issued)
                && held + s.nbytes <= plan.read_ahead_bytes
            {
                held += s.nbytes;
                take(issued, true, &mut open);
                issued += 1;
            }
            most = most.max(open);
            for &s in released {
                let s = s as usize;
                if s < issued {
                    held -= plan.slots[s].nbytes;
                    take(s, false, &mut open);
                }
            }
        }
        most
    }

    /// The label plan slot `slot` is decoded for, and per sample of its chunk, per patch of
    /// the sample ([`DirectRows::per_sample`]), the row of the order it goes to (`None`: no
    /// row of the pass reads it); `None` for a slot loaded through the pool.
    pub fn rows_of(&self, slot: usize) -> Option<(usize, impl Iterator<Item = Option<usize>>)> {
        let &(at, k, label) = self.slots.get(slot)?;
        if at == NONE {
            return None;
        }
        let rows = self.rows[at as usize..(at + k * self.per_sample) as usize]
            .iter()
            .map(|&r| (r != NONE).then_some(r as usize));
        Some((label as usize, rows))
    }

    /// Whether a patched row of path `path`'s chunks decoded into rows is read as the region
    /// its patch covers (only the stored chunks under its window).
    pub fn reads_region(&self, path: usize) -> bool {
        self.regions.get(path).copied().unwrap_or(false)
    }

    /// Rows per sample of a chunk decoded into rows: its patches.
    pub fn per_sample(&self) -> usize {
        self.per_sample.max(1) as usize
    }

    /// True when plan slot `slot` is decoded into rows rather than loaded through the pool.
    pub fn is_direct(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(|&(at, ..)| at != NONE)
    }

    /// True when no slot is decoded into rows.
    pub fn is_empty(&self) -> bool {
        self.max_spc == 0
    }

    /// The most batches whose buffers rows decoded in place hold at once, beyond the ones the
    /// gather and the consumer hold: the batches of the rows the read-ahead permits let the
    /// planner issue ahead of the gather (at one sample per chunk a run of rows; with more, a
    /// chunk's rows spread over its shuffle block's batches, so a block's and the next's).
    pub fn open_batches(&self) -> u64 {
        self.open_batches
    }

    /// Bytes of the scratch buffer each executor thread keeps for chunks not decoded straight
    /// into their row (several samples, a cropped field, the sample axis not first: decoded
    /// there, then copied into their rows); 0 when there are none.
    pub fn scratch_bytes(&self) -> u64 {
        self.scratch_bytes
    }
}

/// A buffer for `rows` rows of `row_bytes` each, or an error that names the batch size when
/// the allocator refuses it (a size from user input must not abort the host process).
fn take_batch_buffer(
    buffers: &BufferPool,
    batch_size: usize,
    rows: usize,
    row_bytes: usize,
    name: &str,
) -> Result<PooledBuf, EngineError> {
    rows.checked_mul(row_bytes)
        .and_then(|bytes| buffers.take(bytes))
        .ok_or_else(|| {
            EngineError::arg(
                "batch_size",
                batch_size,
                format!(
                    "a batch of `{name}` needs {rows} × {row_bytes} bytes, which cannot be \
                     allocated; lower batch_size"
                ),
            )
        })
}

/// Buffers for batch `j` of a pass over `plan` yielding `n_rows` rows, one per batch array
/// ([`ReadPlan::outputs`]): each the size of the pass's largest batch, cut to this one's rows
/// (the short final batch costs no other buffer).
pub(crate) fn batch_buffers(
    buffers: &BufferPool,
    plan: &ReadPlan,
    j: usize,
    n_rows: usize,
) -> Result<Vec<PooledBuf>, EngineError> {
    let bs = plan.batch_size;
    let n = plan.batch_rows(j, n_rows).len();
    plan.outputs
        .iter()
        .map(|o| {
            let rb = o.row_bytes as usize;
            let mut buf = take_batch_buffer(buffers, bs, bs.min(n_rows), rb, &o.name)?;
            buf.truncate(n * rb);
            Ok(buf)
        })
        .collect()
}

/// One batch being filled by decoders: its buffers, and how many rows are in.
pub(crate) struct Assembly {
    /// Owned until the gather takes them; only written through `dst`, by row.
    bufs: Mutex<Option<Vec<PooledBuf>>>,
    /// Each batch array's buffer: base pointer and length.
    dst: Vec<(*mut u8, usize)>,
    /// Per label: its buffer, its row's bytes and where its sample starts in a row.
    layout: Vec<(usize, usize, usize)>,
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
    fn new(mut bufs: Vec<PooledBuf>, plan: &ReadPlan, rows: usize) -> Self {
        let layout: Vec<(usize, usize, usize)> = plan
            .labels
            .iter()
            .map(|l| {
                let row_bytes = plan.outputs[l.output].row_bytes as usize;
                (l.output, row_bytes, l.output_at as usize)
            })
            .collect();
        let dst = bufs
            .iter_mut()
            .map(|b| {
                let s = b.as_mut_slice();
                (s.as_mut_ptr(), s.len())
            })
            .collect();
        let handed = vec![vec![false; rows]; layout.len()];
        Self {
            bufs: Mutex::new(Some(bufs)),
            dst,
            layout,
            handed: Mutex::new(handed),
            filled: AtomicUsize::new(0),
        }
    }

    /// The destination of `label`'s row `row` (within the batch), `len` bytes: handed out once.
    pub fn row(self: &Arc<Self>, label: usize, row: usize, len: usize) -> RowDest {
        let (buf, row_bytes, within) = self.layout[label];
        let (_, buf_len) = self.dst[buf];
        let at = row * row_bytes + within;
        // Labels stacked in one array write disjoint ranges of each row: their channels.
        assert!(within + len <= row_bytes, "sample past its row");
        assert!(at + len <= buf_len, "batch row past its buffer");
        let first = !std::mem::replace(&mut lock(&self.handed)[label][row], true);
        assert!(first, "internal error: batch row {row} handed out twice");
        RowDest {
            batch: Arc::clone(self),
            buf,
            at,
            len,
            cut: None,
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
        let a = Arc::new(Assembly::new(bufs, plan, plan.batch_rows(j, n_rows).len()));
        lock(&self.open).insert(j, Arc::clone(&a));
        Ok(a)
    }

    /// Batch `j`'s assembly, which the gather now owns.
    pub fn close(&self, j: usize) -> Option<Arc<Assembly>> {
        lock(&self.open).remove(&j)
    }
}

/// The batch rows of one chunk's samples (`None`: no row reads the sample), shared by the
/// chunk's tiles: each stored chunk decoded copies its box of every sample in, one tile at a
/// time, and the last one counts the rows filled.
pub(crate) struct ChunkRows {
    /// Per sample of the chunk, per patch of the sample: its row.
    rows: Mutex<Vec<Option<RowDest>>>,
    /// Rows per sample (its patches).
    per_sample: usize,
    tiles_left: AtomicUsize,
    /// A tile's stand-in (a bad stored chunk under `on_bad_chunk = "nan"`) went in.
    stand_in: AtomicBool,
    /// Per row, the region its patch covers, when a one-sample chunk's several patches are
    /// each read as their own region (empty otherwise): every stored chunk under any of the
    /// windows is read once, and copies its box into each row whose window it is under.
    regions: Vec<Option<RowRegion>>,
}

/// The region a patched row covers, read as stored chunks of its field: the region's tile
/// layout, the array chunk index each of its tiles is and the chunk-local span the region
/// reads of each (`TileLayout::tile_span`), and the row's sample within the chunk.
pub(crate) struct RowRegion {
    pub layout: TileLayout,
    pub tiles: Vec<Vec<u64>>,
    pub spans: Vec<Vec<std::ops::Range<u64>>>,
    pub sample: u64,
}

impl ChunkRows {
    /// The rows of a chunk whose field is `tiles` stored chunks, `per_sample` for each of its
    /// samples.
    pub fn new(rows: Vec<Option<RowDest>>, per_sample: usize, tiles: u64) -> Arc<Self> {
        Self::with_regions(rows, per_sample, tiles, Vec::new())
    }

    /// [`ChunkRows::new`] for rows each read as its own region (`regions`, one per row),
    /// `tiles` being the stored chunks under any of them.
    pub fn with_regions(
        rows: Vec<Option<RowDest>>,
        per_sample: usize,
        tiles: u64,
        regions: Vec<Option<RowRegion>>,
    ) -> Arc<Self> {
        debug_assert!(regions.is_empty() || regions.len() == rows.len());
        Arc::new(Self {
            rows: Mutex::new(rows),
            per_sample: per_sample.max(1),
            tiles_left: AtomicUsize::new(tiles.max(1) as usize),
            stand_in: AtomicBool::new(false),
            regions,
        })
    }

    /// True when the rows are read as regions of their own ([`ChunkRows::with_regions`]).
    pub fn has_regions(&self) -> bool {
        !self.regions.is_empty()
    }

    /// Copies stored chunk `index` (decoded, or a bad one's stand-in) into every row whose
    /// region it is under: its box of that region, at each tile of the region it is (a
    /// window across a periodic axis may meet one stored chunk twice).
    pub fn copy_into_regions(&self, index: &[u64], chunk: &[u8]) {
        self.at_each_region_tile(index, |region, tile, row| {
            // The row is its sample's, among the chunk's samples.
            let mut rows: Vec<Option<&mut [u8]>> = (0..region.sample).map(|_| None).collect();
            rows.push(Some(row));
            region.layout.copy_into_rows(tile, chunk, &mut rows);
        });
    }

    /// Copies inner chunk `part` of shard `index` (chunk-local ranges, `decoded` its bytes)
    /// into every row whose region the shard is under: its overlap with the row's window, at
    /// each tile of the region the shard is.
    pub fn copy_part_into_regions(
        &self,
        index: &[u64],
        part: &[std::ops::Range<u64>],
        decoded: &[u8],
    ) {
        self.at_each_region_tile(index, |region, tile, row| {
            // Only where the part meets what the row reads of the tile, of its sample (a shard
            // of several samples has each sample's rows under every one of its tiles).
            let sa = region.layout.geom().sample_axis;
            let span = &region.spans[tile as usize];
            let meets = (0..part.len()).all(|d| {
                let (lo, hi) = match d == sa {
                    true => (region.sample, region.sample + 1),
                    false => (span[d].start, span[d].end),
                };
                part[d].start < hi && lo < part[d].end
            });
            if meets {
                let at = (tile, region.sample);
                region.layout.copy_part_into_row(at, part, decoded, row);
            }
        });
    }

    /// Calls `copy` with the row's region, the tile and the row's bytes wherever stored chunk
    /// `index` is a tile of the row's region.
    fn at_each_region_tile(&self, index: &[u64], mut copy: impl FnMut(&RowRegion, u64, &mut [u8])) {
        self.write(|rows| {
            for (row, region) in rows.iter_mut().zip(&self.regions) {
                let (Some(row), Some(region)) = (row, region) else {
                    continue;
                };
                for (t, at) in region.tiles.iter().enumerate() {
                    if at.as_slice() == index {
                        copy(region, t as u64, row.bytes_mut());
                    }
                }
            }
        });
    }

    /// Runs `write` on the rows; tiles write one at a time (a tile decodes before it calls this).
    pub fn write<R>(&self, write: impl FnOnce(&mut [Option<RowDest>]) -> R) -> R {
        write(&mut lock(&self.rows))
    }

    /// Rows per sample of the chunk.
    pub fn per_sample(&self) -> usize {
        self.per_sample
    }

    /// Counts one tile in, `decoded` or a bad one's stand-in; after the last, counts every row
    /// filled (the gather may read them). True when this was the last tile and every tile of
    /// the chunk was decoded: the chunk was decoded into rows.
    pub fn tile_done(&self, decoded: bool) -> bool {
        if !decoded {
            self.stand_in.store(true, Ordering::Release);
        }
        if self.tiles_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return false;
        }
        for row in std::mem::take(&mut *lock(&self.rows)).into_iter().flatten() {
            row.filled();
        }
        !self.stand_in.load(Ordering::Acquire)
    }
}

/// Where one decoder writes one row: a range of a batch buffer that is this value's alone.
pub(crate) struct RowDest {
    batch: Arc<Assembly>,
    /// The batch array's buffer.
    buf: usize,
    at: usize,
    len: usize,
    /// The patch this row holds of its sample, and the row's origin (`None`: the whole sample).
    pub cut: Option<(Arc<Cut>, Vec<u64>)>,
}

impl RowDest {
    /// Writes this row from `sample`, its whole sample: the patch at the row's origin, or all
    /// of it.
    pub fn write_sample(&mut self, sample: &[u8]) {
        match self.cut.take() {
            Some((cut, origin)) => {
                let dst = self.bytes_mut();
                cut.runs(&origin, |s, d, len| {
                    copy_to_batch(&mut dst[d..d + len], &sample[s..s + len]);
                });
                self.cut = Some((cut, origin));
            }
            None => copy_to_batch(self.bytes_mut(), sample),
        }
    }

    /// The row's bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let (base, _) = self.batch.dst[self.buf];
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
