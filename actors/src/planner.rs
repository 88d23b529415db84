//! The planner: splits, the per-epoch order, the read plan, and the actor that walks the plan.
//!
//! The pure half ([`split_by_chunk`], [`epoch_order`], [`read_plan`]) runs when a pass starts.
//! The actor half admits the plan's slots in order: it takes read-ahead permits (bytes, the
//! computed bound), asks the pool whether the slot is resident (a hit costs no fetch), and for a
//! miss sends one [`TileJob`] per stored chunk to the fetchers, each holding one
//! `max_inflight` permit, to be decoded into the slot or, for a chunk nothing keeps, into its
//! samples' batch rows (`crate::assembly`).

mod look_ahead;
mod memory;
mod need;
mod order;
mod read_plan;
mod split;

pub use memory::{MemoryLimit, MemorySource, address_space_limit, memory_limit};
pub use need::{MemoryNeed, RunningPass, RunningPasses};

/// An empty vector with room for `n` entries of a plan, or an error when they would not fit in
/// the memory this process may use: an array whose metadata claims an absurd sample count must
/// get an error, not a process killed for memory (an allocator that reserves address space
/// without committing it succeeds at any size, so the check is against [`memory_limit`]).
pub(crate) fn plan_vec<T>(n: u64, what: &str) -> Result<Vec<T>, crate::error::EngineError> {
    let bytes = u128::from(n) * std::mem::size_of::<T>() as u128;
    let limit = memory_limit();
    let fits = limit.is_none_or(|l| bytes <= u128::from(l.bytes));
    let mut v = Vec::new();
    usize::try_from(n)
        .ok()
        .filter(|_| fits)
        .and_then(|n| v.try_reserve_exact(n).ok())
        .ok_or_else(|| {
            let memory = limit.map_or("the memory available".to_string(), |l| l.to_string());
            crate::error::EngineError::arg(
                "sample_range",
                n,
                format!(
                    "{what} would need {n} entries ({bytes} bytes), more than {memory}; plan \
                     over a smaller sample_range"
                ),
            )
        })?;
    Ok(v)
}

/// The chunk indices `range`, in a vector reserved with [`plan_vec`].
pub(crate) fn plan_chunks(
    range: std::ops::Range<u64>,
    what: &str,
) -> Result<Vec<u64>, crate::error::EngineError> {
    let mut chunks = plan_vec(range.end.saturating_sub(range.start), what)?;
    chunks.extend(range);
    Ok(chunks)
}

use std::sync::Arc;

use insitubatch_pool::{Admission, PoolError, SlotKey};
use insitubatch_runtime::{ActorSender, JoinHandle};
use insitubatch_store::Store;

pub use order::{
    EpochOrder, OrderSpec, Reach, Row, Shard, Stride, count_rows, epoch_order, shuffle_quality,
    valid_anchors,
};
pub use read_plan::{
    LabelInfo, OutputInfo, PathInfo, PlanSlot, ReadPlan, batch_outputs, read_ahead_bound,
    read_plan, row_runs,
};
pub use split::{
    MANIFEST_FORMAT, SPLIT_NAMES, Snap, SplitManifest, split_by_chunk, split_by_ranges,
};

use crate::assembly::{ChunkRows, RowDest, RowRegion};
use crate::error::EngineError;
use crate::fetcher::{Dest, TileJob};
use crate::pass::{EngineContext, PanicGuard, PassShared, SlotEntry, decodes_in_parts, lock};
use crate::patch::{Cut, origin_key};
use crate::region_slot::SlotRow;
use crate::stats::Counters;
use crate::tile::TileLayout;
use crate::unlink_gate::Gate;

pub(crate) fn spawn<S: Store>(
    ctx: &Arc<EngineContext<S>>,
    shared: &Arc<PassShared>,
    fetcher: ActorSender<TileJob>,
) -> JoinHandle<()> {
    let shared = Arc::clone(shared);
    let ctx = Arc::clone(ctx);
    ctx.runtime.clone().spawn("planner", move || async move {
        let _guard = PanicGuard {
            shared: &shared,
            actor: "planner",
        };
        match drive(&ctx, &shared, &fetcher).await {
            Err(e) => shared.fail(e),
            Ok(()) if !shared.is_cancelled() => shared.load_finished(),
            Ok(()) => {}
        }
    })
}

/// Tells the gather about admitted slots. Waking it for every hit would cost a cross-core
/// wake per slot (the gather waits per slot when it is ahead), so the planner announces a run
/// of admissions at a block boundary, at the end, and before anything that may make it wait.
struct Announcer<'a> {
    shared: &'a PassShared,
    pending: bool,
}

impl Announcer<'_> {
    fn flush(&mut self) {
        if self.pending {
            self.shared.notify.notify_all();
            self.pending = false;
        }
    }
}

impl Drop for Announcer<'_> {
    fn drop(&mut self) {
        // Every exit (end, error, cancellation) announces what was admitted.
        self.flush();
    }
}

/// What a chunk decoded into rows is read as.
enum Reads {
    /// Its path's tiles.
    Path,
    /// The tiles of the region its one row's patch covers.
    Region(Arc<TileLayout>),
    /// The stored chunks under any of its rows' patches, each row read as its own region
    /// ([`ChunkRows::with_regions`]).
    Regions(Vec<UnionTile>),
    /// The stored chunks under any window of the rows reading a region slot
    /// (`crate::region_slot`), each with its tile in the slot.
    Slot(Vec<(u64, UnionTile)>),
}

/// A stored chunk under the windows of a chunk's rows read as regions: its array chunk index
/// and, of a shard, the inner chunks under any of the windows (chunk-local ranges), each read
/// and decoded once and copied into every row whose window it is under.
struct UnionTile {
    index: Vec<u64>,
    parts: Option<Vec<Vec<std::ops::Range<u64>>>>,
}

/// The batch rows chunk `chunk`'s samples go to, label `label`'s rows `rows` of the order
/// (`None` for a sample no row reads): each row's batch is opened (its buffers taken) if it is
/// not yet. With the tiles the chunk is read as when they are not its path's: a one-sample
/// chunk whose row is a patch of a field of several stored chunks (or of a shard's inner
/// chunks) is read as the region the patch covers, so only the stored (inner) chunks under the
/// window are read; with several rows (patches of the sample, or samples of the chunk), the
/// stored chunks under any of their windows, and of a shard the inner chunks under them.
fn row_dests<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    (label, chunk): (usize, u64),
    rows: impl Iterator<Item = Option<usize>>,
) -> Result<(Dest, Reads), EngineError> {
    let plan = &shared.plan;
    let (bs, n_rows) = (plan.batch_size, shared.order.rows.len());
    let info = &plan.labels[label];
    let key = origin_key(&shared.config.split, shared.config.epoch);
    let mut dests = Vec::new();
    for row in rows {
        dests.push(match row {
            Some(r) => {
                let batch = shared.assemblies.open(&ctx.buffers, plan, r / bs, n_rows)?;
                let mut dest = batch.row(label, r % bs, info.row_bytes as usize);
                // A patch: the row's origin, as the gather would draw it.
                if let (Some(cut), Some(patch)) = (&info.cut, &plan.patch) {
                    let (order, seed) = (&shared.order, shared.config.seed);
                    let origin = patch.origin(seed, key, order.anchor(r), order.patch(r));
                    dest.cut = Some((Arc::clone(cut), origin));
                }
                Some(dest)
            }
            None => None,
        });
    }
    let path = &plan.paths[info.path];
    let per_sample = shared.direct.per_sample();
    if let [Some(row)] = &mut dests[..]
        && let Some(layout) = patch_region(shared, info.path, row)?
    {
        let rows = ChunkRows::new(dests, per_sample, layout.tiles());
        return Ok((Dest::Rows(rows), Reads::Region(Arc::new(layout))));
    }
    if dests.len() > 1 && shared.direct.reads_region(info.path) {
        let inner = shared.arrays[info.path].inner_chunk_shape();
        let mut regions = Vec::with_capacity(dests.len());
        let mut union: Vec<UnionTile> = Vec::new();
        for (i, row) in dests.iter_mut().enumerate() {
            let Some(row) = row else {
                regions.push(None);
                continue;
            };
            // The row's sample within the chunk.
            let sample = (i / per_sample) as u64;
            // Every row of a patched label has its cut, so its region; a row left without one
            // would be handed over unwritten.
            let layout = patch_region(shared, info.path, row)?.ok_or_else(|| {
                EngineError::Runtime(format!(
                    "a patched row of `{}` has no region to read (a bug: please report it)",
                    path.path
                ))
            })?;
            let tiles = add_to_union(&mut union, &layout, (chunk, sample), inner);
            let spans = (0..layout.tiles()).map(|t| layout.tile_span(t)).collect();
            regions.push(Some(RowRegion {
                layout,
                tiles,
                spans,
                sample,
            }));
        }
        finish_union(&mut union);
        let tiles = union.len() as u64;
        let rows = ChunkRows::with_regions(dests, per_sample, tiles, regions);
        return Ok((Dest::Rows(rows), Reads::Regions(union)));
    }
    let rows = ChunkRows::new(dests, per_sample, path.tiles);
    Ok((Dest::Rows(rows), Reads::Path))
}

/// How a region slot was admitted.
enum RegionAdmission {
    /// A slot to load, and what to read into it.
    Load(Dest, Reads),
    /// The whole chunk was resident (a hit): nothing to load.
    Resident,
    /// The pass stopped while the admission waited for room.
    Stopped,
}

/// Admits plan slot `i` (`key`, holding its read-ahead `permit`) as a region slot read by
/// `rows`: the whole chunk if it is resident (a hit), else a slot of this pass's own loading
/// the stored (inner) chunks under the rows' windows (`crate::region_slot`).
async fn admit_region_slot<S: Store>(
    ctx: &EngineContext<S>,
    shared: &PassShared,
    (i, key, permit): (usize, &SlotKey, insitubatch_runtime::sync::Permit),
    rows: &[SlotRow],
    announce: &mut Announcer<'_>,
) -> Result<RegionAdmission, EngineError> {
    let ps = &shared.plan.slots[i];
    let tiles = region_slot_tiles(shared, ps, rows)?;
    let slot = loop {
        // Read before trying, so that room returned in between is not missed.
        let seen = ctx.pool.room_returned().generation();
        match shared
            .owner
            .admit_private(key, ps.nbytes, tiles.len() as u64)
        {
            Ok(Admission::Miss(slot)) => break slot,
            Ok(Admission::Hit(slot) | Admission::InFlight(slot)) => {
                lock(&shared.slots)[i] = SlotEntry::Admitted(slot, permit);
                return Ok(RegionAdmission::Resident);
            }
            Err(PoolError::WaitForWrites { .. } | PoolError::WaitForRoom { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        announce.flush();
        shared
            .until_stopped(ctx.pool.room_returned().changed_since(seen))
            .await;
        if shared.is_cancelled() {
            return Ok(RegionAdmission::Stopped);
        }
    };
    lock(&shared.slots)[i] = SlotEntry::Admitted(Arc::clone(&slot), permit);
    if shared.is_cancelled() {
        // `fail` may have swept the table before this entry was in it.
        slot.fail(shared.cancel_failure());
    }
    Counters::add(&shared.counters.region_slots, 1);
    Ok(RegionAdmission::Load(Dest::Slot(slot), Reads::Slot(tiles)))
}

/// The tiles of the region a chunk's patched `row` covers (of all of the chunk's samples; the
/// caller picks the row's), when reading that region reads less than the whole field (several
/// stored chunks per field, or a shard's inner chunks); the row then takes the region's tiles'
/// boxes as a cropped view's would, and its cut is dropped. `None` leaves the row to be cut
/// from the whole decoded sample.
fn patch_region(
    shared: &PassShared,
    p: usize,
    row: &mut RowDest,
) -> Result<Option<TileLayout>, EngineError> {
    let Some((cut, origin)) = &row.cut else {
        return Ok(None);
    };
    if !shared.direct.reads_region(p) {
        return Ok(None);
    }
    let layout = window_layout(&shared.plan.paths[p].geom, cut, origin)?;
    row.cut = None;
    Ok(Some(layout))
}

/// The tiles of the window a patch `cut` at `origin` covers of a field of `g` (of all of a
/// chunk's samples).
fn window_layout(
    g: &insitubatch_store::ArrayGeometry,
    cut: &Cut,
    origin: &[u64],
) -> Result<TileLayout, EngineError> {
    // The window in the array's own coordinates: the view's range along each leading axis,
    // and along each patched axis the patch's, from the view's start (taken modulo the axis,
    // so a view or a window across a periodic axis's end is a wrapping range).
    let ranges: Vec<(u64, u64)> = g.field_ranges().collect();
    let lengths: Vec<u64> = g.field_axes().map(|a| g.shape[a]).collect();
    let lead = ranges.len() - origin.len();
    let row_shape = cut.row_shape();
    let region: Vec<(i64, i64)> = (0..ranges.len())
        .map(|d| {
            let (start, end) = if d < lead {
                ranges[d]
            } else {
                let start = (ranges[d].0 + origin[d - lead]) % lengths[d];
                (start, start + row_shape[d] as u64)
            };
            (start as i64, end as i64)
        })
        .collect();
    Ok(TileLayout::new(&g.crop_wrapping(&region)?))
}

/// Adds the stored chunks of `layout`, a window over chunk `chunk`, to `union`, each once, with
/// (of a shard holding `inner` chunks) the inner chunks of the chunk's sample `sample` under
/// the window; returns the array chunk index of each of the window's tiles.
fn add_to_union(
    union: &mut Vec<UnionTile>,
    layout: &TileLayout,
    (chunk, sample): (u64, u64),
    inner: Option<&[u64]>,
) -> Vec<Vec<u64>> {
    let geom = layout.geom();
    let tiles: Vec<Vec<u64>> = (0..layout.tiles())
        .map(|t| geom.array_index(layout.chunk_index(chunk, t)))
        .collect();
    for (t, index) in tiles.iter().enumerate() {
        let at = match union.iter().position(|u| &u.index == index) {
            Some(at) => at,
            None => {
                let parts = inner.map(|_| Vec::new());
                union.push(UnionTile {
                    index: index.clone(),
                    parts,
                });
                union.len() - 1
            }
        };
        if let (Some(parts), Some(inner)) = (&mut union[at].parts, inner) {
            parts.extend(layout.inner_parts(t as u64, inner, sample));
        }
    }
    tiles
}

/// Each union tile's inner chunks in order, each once.
fn finish_union(union: &mut [UnionTile]) {
    for u in union {
        if let Some(parts) = &mut u.parts {
            parts.sort_by_key(|p| p.iter().map(|r| r.start).collect::<Vec<_>>());
            parts.dedup();
        }
    }
}

/// What a region slot (`crate::region_slot`) of plan slot `ps` loads: the stored (inner)
/// chunks under the window of any of `rows`, the rows of the pass reading it, each once, with
/// its tile in the slot.
fn region_slot_tiles(
    shared: &PassShared,
    ps: &PlanSlot,
    rows: &[SlotRow],
) -> Result<Vec<(u64, UnionTile)>, EngineError> {
    let (plan, order) = (&shared.plan, &shared.order);
    let path = &plan.paths[ps.path];
    let internal = |what: &str| {
        EngineError::Runtime(format!(
            "a region slot of `{}` chunk {}: {what} (a bug: please report it)",
            path.path, ps.chunk
        ))
    };
    let draw = plan.patch.as_ref().ok_or_else(|| internal("no patch"))?;
    let key = origin_key(&shared.config.split, shared.config.epoch);
    let inner = shared.arrays[ps.path].inner_chunk_shape();
    let mut union = Vec::new();
    for r in rows {
        let cut = plan.labels[r.label as usize]
            .cut
            .as_ref()
            .ok_or_else(|| internal("a row without a patch"))?;
        let row = r.row as usize;
        let origin = draw.origin(shared.config.seed, key, order.anchor(row), order.patch(row));
        let layout = window_layout(&path.geom, cut, &origin)?;
        add_to_union(&mut union, &layout, (ps.chunk, u64::from(r.sample)), inner);
    }
    finish_union(&mut union);
    if union.is_empty() {
        return Err(internal("no window"));
    }
    // Each stored chunk's tile among the slot's.
    let layout = &shared.layouts[ps.path];
    let geom = layout.geom();
    let tile_of: std::collections::HashMap<Vec<u64>, u64> = (0..layout.tiles())
        .map(|t| (geom.array_index(layout.chunk_index(ps.chunk, t)), t))
        .collect();
    union
        .into_iter()
        .map(|u| match tile_of.get(&u.index) {
            Some(&t) => Ok((t, u)),
            None => Err(internal("a window outside the view")),
        })
        .collect()
}

async fn drive<S: Store>(
    ctx: &EngineContext<S>,
    shared: &Arc<PassShared>,
    fetcher: &ActorSender<TileJob>,
) -> Result<(), EngineError> {
    let plan = &shared.plan;
    // Read buffers are recycled while this pass issues reads (and freed after its last).
    let _reads = ctx.read_buffers.issuing();
    let mut tile_ordinal = 0u64;
    let mut announce = Announcer {
        shared,
        pending: false,
    };
    let mut look_ahead = look_ahead::LookAhead::new(&ctx.pool, ctx.inflight.total());
    for (i, ps) in plan.slots.iter().enumerate() {
        if shared.is_cancelled() {
            return Ok(());
        }
        look_ahead.start(shared, i).await;
        let path = &plan.paths[ps.path];
        // The read-ahead permit: back when gather releases the slot's last block.
        let permit = match shared.readahead.try_acquire(ps.nbytes) {
            Some(p) => p,
            None => {
                announce.flush();
                let Ok(p) = shared.readahead.acquire(ps.nbytes).await else {
                    return Ok(()); // closed: the pass failed or was cancelled
                };
                p
            }
        };
        let key = SlotKey {
            path: Arc::clone(&path.path),
            chunk: ps.chunk,
        };
        // Shut until the cache files of the slots evicted for this one are gone (an ephemeral
        // spill's; see `crate::unlink_gate`).
        let mut after: Option<Gate> = None;
        // Where a miss is decoded: its slot, or (a chunk nothing keeps; see `crate::assembly`)
        // its samples' batch rows.
        let dest = match (shared.direct.rows_of(i), shared.region_slots.rows_of(i)) {
            (None, Some(rows)) => {
                let at = (i, &key, permit);
                match admit_region_slot(ctx, shared, at, rows, &mut announce).await? {
                    RegionAdmission::Load(dest, reads) => Some((dest, reads)),
                    RegionAdmission::Resident => None,
                    RegionAdmission::Stopped => return Ok(()),
                }
            }
            (Some((label, rows)), _) => match shared.owner.pin_resident(&key) {
                Some(slot) => {
                    lock(&shared.slots)[i] = SlotEntry::Admitted(slot, permit);
                    None
                }
                None => {
                    let (dest, reads) = row_dests(ctx, shared, (label, ps.chunk), rows)?;
                    lock(&shared.slots)[i] = SlotEntry::Direct(permit);
                    Some((dest, reads))
                }
            },
            (None, None) => {
                let mut prepared = look_ahead.take(i, || announce.flush()).await;
                let admitted = loop {
                    // Read before trying, so that a write ending in between is not missed.
                    let seen = ctx.pool.room_returned().generation();
                    let (admitted, unlinks) = shared.owner.admit_deferring_unlinks(
                        &key,
                        ps.nbytes,
                        path.tiles,
                        prepared.take(),
                    );
                    // The files of the slots an ephemeral spill evicted for this one go on a
                    // task of their own; this chunk's reads wait for them, nothing else does.
                    if !unlinks.is_empty() {
                        after
                            .get_or_insert_with(Gate::default)
                            .unlink(&ctx.runtime, unlinks);
                    }
                    // An ephemeral spill's room is held by evicted slots' files still being
                    // written: each write ends on its own, then the room is back. A successor's
                    // (train's next epoch started early) is pinned by its predecessor until
                    // the predecessor's consumer takes the batches that hold it; dropping this
                    // pass meanwhile must not wait for that.
                    if !matches!(
                        admitted,
                        Err(PoolError::WaitForWrites { .. } | PoolError::WaitForRoom { .. })
                    ) {
                        break admitted?;
                    }
                    announce.flush();
                    shared
                        .until_stopped(ctx.pool.room_returned().changed_since(seen))
                        .await;
                    if shared.is_cancelled() {
                        return Ok(());
                    }
                };
                let (slot, miss) = match admitted {
                    Admission::Hit(s) | Admission::InFlight(s) => (s, false),
                    Admission::Miss(s) => (s, true),
                };
                lock(&shared.slots)[i] = SlotEntry::Admitted(Arc::clone(&slot), permit);
                if shared.is_cancelled() {
                    // `fail` may have swept the table before this entry was in it.
                    slot.fail(shared.cancel_failure());
                }
                miss.then_some((Dest::Slot(slot), Reads::Path))
            }
        };
        announce.pending = true;
        if plan
            .slots
            .get(i + 1)
            .is_none_or(|next| next.first_block != ps.first_block)
        {
            announce.flush();
        }
        let Some((dest, reads)) = dest else {
            continue;
        };
        let own_layout = match &reads {
            Reads::Region(layout) => Some(Arc::clone(layout)),
            Reads::Path | Reads::Regions(_) | Reads::Slot(_) => None,
        };
        let layout = own_layout.as_deref().unwrap_or(&shared.layouts[ps.path]);
        let geom = layout.geom();
        let array = &shared.arrays[ps.path];
        let n_tiles = match &reads {
            Reads::Regions(union) => union.len() as u64,
            Reads::Slot(tiles) => tiles.len() as u64,
            Reads::Path | Reads::Region(_) => layout.tiles(),
        };
        for t in 0..n_tiles {
            let inflight = match ctx.inflight.try_acquire(1) {
                Some(p) => p,
                None => {
                    announce.flush();
                    ctx.inflight.acquire(1).await.map_err(|_| {
                        EngineError::Runtime("the max_inflight budget was closed".into())
                    })?
                }
            };
            if shared.is_cancelled() {
                if let Some(slot) = dest.slot() {
                    slot.fail(shared.cancel_failure());
                }
                return Ok(());
            }
            // A cropped view of a sharded array reads and decodes only the inner chunks its
            // region touches in this tile, and several rows' regions of a shard the inner
            // chunks under any of them; anything else is a whole stored chunk.
            let (tile, index, part) = match &reads {
                Reads::Regions(union) => {
                    let u = &union[t as usize];
                    (t, u.index.clone(), u.parts.clone())
                }
                Reads::Slot(tiles) => {
                    let (tile, u) = &tiles[t as usize];
                    (*tile, u.index.clone(), u.parts.clone())
                }
                Reads::Path | Reads::Region(_) => (
                    t,
                    geom.array_index(layout.chunk_index(ps.chunk, t)),
                    decodes_in_parts(array, geom)
                        .then(|| layout.tile_parts(t))
                        .flatten()
                        .map(|boxes| boxes.into_iter().map(|b| geom.array_index(b)).collect()),
                ),
            };
            // Each tile delivers into the slot, or copies its box of each sample into the rows.
            let dest = match &dest {
                Dest::Slot(slot) => Dest::Slot(Arc::clone(slot)),
                Dest::Rows(rows) => Dest::Rows(Arc::clone(rows)),
                Dest::Filled => unreachable!("a chunk's destination is filled by its tiles"),
            };
            shared.load_started();
            let job = TileJob {
                dest,
                path: ps.path,
                key: array.chunk_key(&index)?,
                index,
                tile,
                part,
                inner_parts: matches!(reads, Reads::Slot(_)),
                layout: own_layout.clone(),
                ordinal: tile_ordinal,
                permit: inflight,
                after: after.clone(),
                done: false,
                shared: Arc::clone(shared),
            };
            tile_ordinal += 1;
            // A miss costs a read and a decode; one wake of the gather per miss is noise, and
            // the send may wait for room.
            announce.flush();
            let sent = fetcher.send(job).await;
            if let Err(e) = sent {
                return Err(EngineError::ActorPanicked {
                    actor: "fetcher".into(),
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(())
}
