//! The engine over hundreds of random geometries and knob settings, each checked against values
//! computed from an element's own coordinates: every emitted row equals the array at its read
//! index, every valid anchor comes once per split and epoch, in the order the planner promised,
//! each slot is fetched at most once per pass (read-once), and another thread count and IO
//! backend emit the same order. Each case also drops a pass part way, zips train with val,
//! waits for batches with timeouts, revives a persisted cache in a fresh dataset (or spills into
//! an ephemeral one, which must be empty once the dataset is gone), and meets a corrupt chunk
//! under both `on_bad_chunk` policies. Cases also draw an array mounted from a second store of
//! another length at another place on the axis, a view read through an index, and an array read
//! as a region of its field, and a patch cut from every row (what a case draws: `random_case/`).
//!
//! The stores are written by the test (by hand when uncompressed, through zarrs when compressed
//! or sharded) rather than by zarr-python: this test is about the planner, fetcher, decoder and
//! gather over many geometries, and a Python process per store would take minutes. Whether our
//! decoded bytes equal zarr-python's for every codec and layout is `store_conformance.rs`'s
//! question (and `bindings/python/tests/test_random.py` reads random zarr-python stores). A
//! failure names its case number; `ISB_RANDOM_CASE=n` runs that case alone (and prints what it
//! draws with `--no-capture`), and `ISB_RANDOM_CASES=n` runs the first `n` (a longer soak than
//! CI's), `ISB_RANDOM_CASES=a..b` the cases from `a` up to `b`.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use insitubatch::{
    Batch, EngineError, InSituDataset, IntoRows, IoBackendChoice, OnBadChunk, PassStats,
    SplitManifest, TimedOut, split_by_chunk,
};
use insitubatch_tests::{panic_message, window_of};
use serde_json::json;

mod random_case;
use random_case::{ArrayCase, Case, CaseBudget, Codec, How, Rng, Times, for_each_index};

/// Number of random cases per run (each a store and two epochs over every split).
const CASES: u64 = 250;

/// The anchors a split of `chunks` on the reference grid must emit: every sample of those
/// chunks on the stride, inside the array, whose every view reads inside it too.
fn expected_anchors(case: &Case, reference_chunk: u64, chunks: &[u64]) -> Vec<u64> {
    let mut out = Vec::new();
    for c in chunks {
        for a in c * reference_chunk..((c + 1) * reference_chunk).min(case.n_samples) {
            if case.on_stride(a) && case.valid(a) {
                // One row per patch of the anchor.
                out.extend(std::iter::repeat_n(a, case.rows_per_anchor() as usize));
            }
        }
    }
    out
}

/// The manifest's splits are disjoint sets of the reference chunks overlapping its sample range
/// (each contiguous when asked; all of them when the fractions sum to 1), checked without the
/// engine.
fn check_manifest(case: &Case, m: &SplitManifest, reference: &ArrayCase) {
    let spc = reference.chunks[case.axis];
    let (start, stop) = case
        .split
        .as_ref()
        .and_then(|s| s.sample_range)
        .unwrap_or((0, case.n_samples));
    let want: BTreeSet<u64> = (start / spc..stop.div_ceil(spc)).collect();
    let mut seen = BTreeSet::new();
    for (name, chunks) in &m.splits {
        for c in chunks {
            assert!(seen.insert(*c), "chunk {c} in two splits (again in {name})");
        }
        if case.split.as_ref().is_some_and(|s| s.contiguous) && !chunks.is_empty() {
            assert_eq!(
                chunks.last().unwrap() - chunks[0] + 1,
                chunks.len() as u64,
                "contiguous split {name} is one run: {chunks:?}"
            );
        }
    }
    // Fractions summing under 1 leave the rest of the chunks out.
    let total: f64 = case
        .split
        .as_ref()
        .map_or(1.0, |s| s.fractions.iter().sum());
    let covered = (total * want.len() as f64).round() as usize;
    assert!(
        seen.is_subset(&want),
        "the splits stay inside the sample range"
    );
    assert_eq!(
        seen.len(),
        covered,
        "the splits cover their fractions of it"
    );
}

/// Checks a batch's shape per label and every row against the array at its read index.
fn check_batch(case: &Case, batch: &Batch) {
    assert!(!batch.is_empty() && batch.len() <= case.batch_size);
    for (i, v) in case.views.iter().enumerate() {
        let a = &case.arrays[v.array];
        let got = case.view_rows(batch, i);
        let inner: Vec<usize> = a
            .inner_shape(case.axis)
            .iter()
            .map(|&n| n as usize)
            .collect();
        let row_shape = case.row_shape(i);
        if let Some(own) = batch.array(&v.label) {
            let mut shape = vec![batch.len()];
            shape.extend(&row_shape);
            assert_eq!(own.shape(), &shape[..], "label {}", v.label);
        } else {
            assert_eq!(
                batch.array("s").unwrap().shape()[2..],
                row_shape[..],
                "stack"
            );
        }
        let origins = batch.patch_origins();
        assert_eq!(origins.is_some(), case.patch.is_some(), "patch origins");
        let k = case.patch.as_ref().map_or(0, |p| p.0.len());
        let sample_bytes = got.len() / batch.len();
        let reads = batch.read_indices(&v.label).unwrap();
        for (row, (anchor, read)) in batch.sample_indices().iter().zip(&reads).enumerate() {
            assert_eq!(
                Some(*read),
                case.read(i, *anchor),
                "read index of {}",
                v.label
            );
            let mut want_row = a.sample(case.axis, *read);
            if let (Some((patch, wrap)), Some(origins)) = (&case.patch, origins) {
                let origin: Vec<usize> = origins[row * k..(row + 1) * k]
                    .iter()
                    .map(|&o| o as usize)
                    .collect();
                let field = &inner[inner.len() - k..];
                for d in 0..k {
                    let end = if wrap[d] {
                        origin[d] + 1
                    } else {
                        origin[d] + patch[d] as usize
                    };
                    assert!(
                        end <= field[d],
                        "origin {origin:?} of {patch:?} in {field:?}"
                    );
                    // A grid's origins are on it, or end at the field's end.
                    if let Some(stride) = &case.patch_grid {
                        assert!(
                            origin[d].is_multiple_of(stride[d] as usize)
                                || (!wrap[d] && end == field[d]),
                            "origin {origin:?} off the grid of {stride:?}"
                        );
                    }
                }
                let patch: Vec<usize> = patch.iter().map(|&n| n as usize).collect();
                want_row = window_of(&want_row, &inner, &patch, &origin, a.dt.size());
            }
            assert!(
                got[row * sample_bytes..(row + 1) * sample_bytes] == want_row[..],
                "label {} ({}) anchor {anchor}: row differs from the array at {read}",
                v.label,
                a.name
            );
        }
    }
}

/// Runs one pass of `split` and checks every row; returns the anchors in emission order and
/// the pass's stats.
fn check_pass(
    case: &Case,
    ds: &InSituDataset,
    split: &str,
    want: &[u64],
    cov: &mut Coverage,
) -> (Vec<u64>, PassStats) {
    let planned = ds.order(split).unwrap();
    let mut pass = ds.iter(split).unwrap();
    let mut anchors = Vec::new();
    let mut batches = 0usize;
    let mut timed_out = 0u64;
    loop {
        // Some cases wait in slices of a few microseconds, as a consumer that polls for Ctrl-C
        // does: a wait that times out must lose nothing.
        let next = match case.wait_us {
            Some(us) => match pass.next_timeout(std::time::Duration::from_micros(us)) {
                Ok(next) => next,
                Err(TimedOut) => {
                    timed_out += 1;
                    continue;
                }
            },
            None => pass.next(),
        };
        let Some(batch) = next else { break };
        let batch = batch.unwrap();
        batches += 1;
        check_batch(case, &batch);
        anchors.extend_from_slice(batch.sample_indices());
    }
    // The batches are the planner's order cut every batch_size rows, only the last one short.
    assert_eq!(
        anchors,
        planned.anchors(),
        "emitted order is the planned order"
    );
    assert_eq!(batches, anchors.len().div_ceil(case.batch_size));
    assert_eq!(ds.split_samples(split).unwrap(), anchors.len() as u64);
    assert_eq!(ds.split_batches(split).unwrap(), batches as u64);
    let mut sorted = anchors.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, want, "every valid anchor once");
    if split != "train" || !case.shuffle {
        assert_eq!(
            anchors, want,
            "sequential passes keep chunk and sample order"
        );
    }
    // A shuffle block draws from at most block_chunks reference chunks, and blocks are disjoint.
    let spc = planned.samples_per_chunk;
    let mut used = HashSet::new();
    for block in &planned.blocks {
        let chunks: HashSet<u64> = anchors[block.clone()].iter().map(|a| a / spc).collect();
        assert!(chunks.len() <= case.block_chunks, "block {block:?}");
        assert!(
            chunks.iter().all(|c| used.insert(*c)),
            "a chunk in two blocks"
        );
    }
    // With `fast_first_batch` a shuffled train pass starts with a block of the chunks of one
    // batch (when no window dropped a whole block's anchors, which leaves that block out).
    // (A chunk's rows: its samples on the stride, at least one since chunks with none are left
    // out.)
    let rows_per_chunk = (spc / case.stride.0).max(1) * case.rows_per_anchor();
    let one_batch = (case.batch_size as u64).div_ceil(rows_per_chunk) as usize;
    if case.fast_first_batch
        && split == "train"
        && case.shuffle
        && planned.dropped_anchors == 0
        && let Some(first) = planned.blocks.first()
    {
        let chunks: HashSet<u64> = anchors[first.clone()].iter().map(|a| a / spc).collect();
        assert!(
            chunks.len() <= one_batch.max(1),
            "first block {first:?}: {chunks:?}"
        );
        cov.ramped += (one_batch < case.block_chunks && planned.blocks.len() > 1) as u64;
    }
    // Read-once: each slot (array, sample-axis chunk) the pass needs is fetched at most once
    // and admitted once, except that a shuffled train pass over a persisted cache hands each
    // block's slots back as it drains and admits them again (from the pool or the cache file)
    // when a later block needs them.
    let mut slots = HashSet::new();
    for (i, v) in case.views.iter().enumerate() {
        let a = &case.arrays[v.array];
        for anchor in &anchors {
            let s = case.read(i, *anchor).unwrap();
            slots.insert((v.array, s / a.chunks[case.axis]));
        }
    }
    let stats = pass.stats();
    assert!(
        !stats.started_ahead || (case.prefetch_next_epoch && split == "train"),
        "only train starts early, and only when asked to"
    );
    cov.started_ahead += stats.started_ahead as u64;
    cov.into_rows += (stats.tiles_into_batches > 0) as u64;
    cov.patches_into_rows += (stats.tiles_into_batches > 0 && case.rows_per_anchor() > 1) as u64;
    if case.into_rows == IntoRows::Never {
        assert_eq!(stats.tiles_into_batches, 0);
    }
    if case.wait_us.is_none() {
        assert_eq!(timed_out, 0);
    }
    cov.passes_with_timeouts += (timed_out > 0) as u64;
    // The bad reads of the pass: corrupt stored chunks it needed, each once, and all of them
    // when it hit nothing (a stand-in kept from an earlier pass is a hit, not a read).
    let mut bad_needed = BTreeSet::new();
    for (i, v) in case.views.iter().enumerate() {
        let a = &case.arrays[v.array];
        for anchor in &anchors {
            let s = case.read(i, *anchor).unwrap();
            for c in a.chunks_of_sample(case.axis, s) {
                if a.corrupt.contains(&c) {
                    bad_needed.insert((a.path(), c));
                }
            }
        }
    }
    let bad_listed: Vec<(String, Vec<u64>)> = stats
        .bad_chunks
        .iter()
        .map(|b| {
            (
                b.array.trim_start_matches('/').to_string(),
                b.chunk_index.clone(),
            )
        })
        .collect();
    let listed: BTreeSet<_> = bad_listed.iter().cloned().collect();
    assert_eq!(
        listed.len(),
        bad_listed.len(),
        "a bad chunk listed twice: {stats:?}"
    );
    assert!(
        listed.is_subset(&bad_needed),
        "{listed:?} not all needed and corrupt"
    );
    if stats.cache_hits == 0 {
        assert_eq!(listed, bad_needed, "every bad read listed: {stats:?}");
    }
    let distinct = slots.len() as u64;
    let admitted = stats.cache_hits + stats.cache_misses;
    // A pass that releases each block's chunks and revives them from the cache directory for
    // a later block (windows, shuffle, `persist`) reads a bad chunk's slot again: its stand-in
    // is never written to a file. A slot is needed by the anchors of at most two reference
    // chunks per view, so by at most two blocks per view.
    let rereads = if case.persist && case.shuffle && split == "train" {
        slots_with_a_corrupt_chunk(case, &anchors) * 2 * case.views.len() as u64
    } else {
        0
    };
    assert!(
        stats.cache_misses <= distinct + rereads,
        "a slot fetched twice: {slots:?} {anchors:?} {stats:?}"
    );
    if case.persist && case.shuffle && split == "train" {
        assert!(admitted >= distinct, "{distinct} slots: {stats:?}");
    } else {
        assert_eq!(
            admitted, distinct,
            "every slot admitted exactly once: {stats:?}"
        );
    }
    assert!(stats.resident_peak_bytes <= stats.budget_bytes, "{stats:?}");
    assert!(
        stats.pinned_peak_bytes <= pass.read_ahead_bytes(),
        "{stats:?}"
    );
    assert_eq!(stats.samples, anchors.len() as u64);
    (anchors, stats)
}

/// Overwrites one stored chunk file of a random array with bytes no codec accepts, and records
/// it; an array whose every chunk was left out (all fill) keeps none.
fn corrupt_a_chunk(case: &mut Case, root: &Path, n: u64) {
    let mut r = Rng::new(n ^ 0xc0ff_ee00);
    let (v3, sep) = (case.v3, case.sep);
    let which = r.range(0, case.arrays.len() as u64 - 1) as usize;
    let a = &mut case.arrays[which];
    let root = &a.store_root(root);
    let mut stored = Vec::new();
    for_each_index(&a.grid(), false, |c| {
        if a.chunk_file(root, v3, sep, c).exists() {
            stored.push(c.to_vec());
        }
    });
    if stored.is_empty() {
        return;
    }
    let chunk = stored.swap_remove(r.range(0, stored.len() as u64 - 1) as usize);
    // An odd length: never a whole number of elements, never a valid frame or shard index.
    std::fs::write(a.chunk_file(root, v3, sep, &chunk), b"not a chunk").unwrap();
    a.corrupt.insert(chunk);
}

/// What the cases exercised, so that a change to the generator cannot quietly narrow them.
#[derive(Debug, Default)]
struct Coverage {
    passes: u64,
    empty_splits: u64,
    windows: u64,
    stacks: u64,
    manifests: u64,
    sample_ranges: u64,
    unwritten_chunks: u64,
    f_order: u64,
    big_endian: u64,
    sample_axis_nonzero: u64,
    chunked_differently: u64,
    multi_tile_slots: u64,
    persisted: u64,
    spilled: u64,
    abandoned: u64,
    zipped: u64,
    zip_refused: u64,
    compressed: u64,
    sharded: u64,
    corrupt: u64,
    raised: u64,
    passes_with_timeouts: u64,
    budget_refused: u64,
    ranked: u64,
    into_rows: u64,
    ramped: u64,
    strided: u64,
    mounted: u64,
    mount_refused: u64,
    timed: u64,
    between: u64,
    indexed: u64,
    cropped: u64,
    wrapped: u64,
    patched: u64,
    periodic_patches: u64,
    several_patches: u64,
    /// Rare here (a chunk must be its samples byte for byte); `tests/tests/patch.rs` decodes
    /// several patches per sample into rows on every fixture case that can.
    patches_into_rows: u64,
    patch_grids: u64,
    started_ahead: u64,
}

fn run_case(n: u64, cov: &mut Coverage) {
    let mut case = Case::draw(n);
    cov.windows += case.views.iter().any(|v| v.offset != 0) as u64;
    cov.strided += (case.stride.0 > 1) as u64;
    cov.mounted += case.mounted().is_some() as u64;
    cov.timed += case.times.is_some() as u64;
    cov.between += case.times.as_ref().is_some_and(|t| t.how != How::Exact) as u64;
    cov.indexed += case.views.iter().any(|v| v.index.is_some()) as u64;
    cov.cropped += case.arrays.iter().any(|a| a.region.is_some()) as u64;
    cov.wrapped += case
        .arrays
        .iter()
        .flat_map(|a| a.region.iter().flatten())
        .any(|(start, _)| *start < 0) as u64;
    cov.patched += case.patch.is_some() as u64;
    cov.periodic_patches += case.patch.as_ref().is_some_and(|p| p.1.contains(&true)) as u64;
    cov.several_patches += (case.patches_per_sample > 1) as u64;
    cov.patch_grids += case.patch_grid.is_some() as u64;
    cov.stacks += case.stack.as_ref().is_some_and(|s| s.len() > 1) as u64;
    cov.sample_ranges += case
        .split
        .as_ref()
        .is_some_and(|s| s.sample_range.is_some()) as u64;
    cov.unwritten_chunks += case.arrays.iter().any(|a| !a.unwritten.is_empty()) as u64;
    cov.f_order += case.arrays.iter().any(|a| a.f_order) as u64;
    cov.compressed += case.arrays.iter().any(|a| !matches!(a.codec, Codec::None)) as u64;
    cov.sharded += case.arrays.iter().any(|a| a.inner.is_some()) as u64;
    cov.big_endian += case.arrays.iter().any(|a| a.big_endian) as u64;
    cov.sample_axis_nonzero += (case.axis > 0) as u64;
    let axis_chunks: HashSet<u64> = case.arrays.iter().map(|a| a.chunks[case.axis]).collect();
    cov.chunked_differently += (axis_chunks.len() > 1) as u64;
    cov.multi_tile_slots += case.arrays.iter().any(|a| {
        a.grid()
            .iter()
            .enumerate()
            .any(|(x, g)| x != case.axis && *g > 1)
    }) as u64;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store.zarr");
    std::fs::create_dir_all(&root).unwrap();
    let group = if case.v3 {
        ("zarr.json", json!({"zarr_format": 3, "node_type": "group"}))
    } else {
        (".zgroup", json!({"zarr_format": 2}))
    };
    std::fs::write(root.join(group.0), group.1.to_string()).unwrap();
    if let Some(m) = case.mounted() {
        let mount = m.store_root(&root);
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::write(mount.join(group.0), group.1.to_string()).unwrap();
    }
    for a in &case.arrays {
        a.write(&a.store_root(&root), case.v3, case.sep);
    }
    if let (Some(t), Some(m)) = (&case.times, case.mounted()) {
        Times::write_coordinate(&root, case.v3, case.n_samples, 0, t.root_step);
        let n = m.shape[case.axis];
        Times::write_coordinate(
            &m.store_root(&root),
            case.v3,
            n,
            t.mount_start,
            t.mount_step,
        );
    }
    if case.corrupt {
        corrupt_a_chunk(&mut case, &root, n);
        cov.corrupt += case.arrays.iter().any(|a| !a.corrupt.is_empty()) as u64;
    }
    let case = case;
    let reference = &case.arrays[case.views[0].array];

    let mut builder = case.builder(&root);
    if let Some(split) = &case.split {
        let probe = InSituDataset::builder(&root)
            .sample_axis(case.axis)
            .variable("r", reference.name.clone())
            .build()
            .unwrap();
        match split_by_chunk(
            &probe.variables()[0].geom,
            &split.fractions,
            case.seed,
            split.contiguous,
            split.sample_range,
        ) {
            Ok(m) => {
                check_manifest(&case, &m, reference);
                cov.manifests += 1;
                builder = builder.manifest(m);
            }
            // Too few chunks for every fraction to get one: the error says which split.
            Err(EngineError::EmptySplit { split, why }) => {
                assert!(why.contains("rounds to none"), "{split}: {why}");
            }
            Err(e) => panic!("split_by_chunk: {e}"),
        }
    }
    let cache = tmp.path().join("cache");
    let spill = case.spill && !case.persist;
    if case.persist {
        builder = builder.cache_dir(&cache).persist(true);
        cov.persisted += 1;
    } else if spill {
        builder = builder.cache_dir(&cache);
        cov.spilled += 1;
    }
    // The anchors at which every view reads inside its array (all of them unless windows or a
    // mount reach past an end), and those of them the stride draws.
    let valid: Vec<u64> = (0..case.n_samples).filter(|&a| case.valid(a)).collect();
    let drawn = valid.iter().any(|&a| case.on_stride(a));
    // Where times meet at another rate, anchors between two of the mount's samples read
    // nothing, and the anchor range may hold only such anchors: then it is not refused.
    let between = case
        .times
        .as_ref()
        .is_some_and(|t| t.how == How::Exact && t.every() > 1);
    let built = builder.executor_threads(case.executor_threads).build();
    let ds = match built {
        Err(e) if case.one_time() => {
            // A period needs a step: a store of one time is refused, naming the mount.
            assert!(
                e.to_string().contains("`mounts` = m") && e.to_string().contains("one time"),
                "{e}"
            );
            cov.mount_refused += 1;
            return;
        }
        Err(e) if case.mounted().is_some() && !drawn && (valid.is_empty() || between) => {
            // A mount placed where no anchor reads inside every array is refused when built,
            // naming the mount.
            assert!(e.to_string().contains("`mounts` = m"), "{e}");
            cov.mount_refused += 1;
            return;
        }
        Err(e) => panic!("refused: {e}"),
        Ok(ds) => ds,
    };
    assert!(!case.one_time(), "a store of one time gave a period");
    if case.mounted().is_some() && !between {
        assert!(
            !valid.is_empty(),
            "a mount that leaves no valid anchor is refused"
        );
    }
    // Every anchor the stride draws is in the anchor range exactly when every view reads
    // inside its array there.
    let range = ds.anchor_range();
    assert!(range.is_empty() || range.end <= case.n_samples, "{range:?}");
    for a in (0..case.n_samples).filter(|&a| case.on_stride(a)) {
        assert_eq!(
            range.contains(&a),
            case.valid(a),
            "anchor {a}, anchor_range {range:?}"
        );
    }
    let m = ds.manifest().clone();
    assert_eq!(m.samples_per_chunk(), reference.chunks[case.axis]);
    let train_orders = run_epochs(&case, &ds, 0..2, Reads::Some, cov);
    abandon_and_zip(&case, &ds, n, cov);
    if !case.persist {
        rows_equal_pool(&case, &root, &m, cov);
    }
    if !case.persist && !case.corrupt && !matches!(case.budget, CaseBudget::Bytes(_)) {
        check_ranks(&case, &root, &m, n, cov);
    }
    if case.arrays.iter().any(|a| !a.corrupt.is_empty()) {
        raise_on_the_corrupt_chunk(&case, &root, &m, cov);
    }
    let backend = ds.io_backend();
    drop(ds);
    if spill {
        // An ephemeral spill's files (and their unlinks in flight) are gone with the dataset.
        let left: Vec<_> = std::fs::read_dir(&cache)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(".npy"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "spill files left after close: {left:?}");
    }

    // The same (seed, epoch) gives the same order with another thread count and IO backend.
    if !train_orders.is_empty() {
        let uring = insitubatch::runtime::probe().unavailable.is_none();
        let other_backend = match backend {
            insitubatch::IoBackend::Threads if uring => IoBackendChoice::Uring,
            _ => IoBackendChoice::Threads,
        };
        let ds2 = case
            .builder(&root)
            .manifest(m.clone())
            .executor_threads(3 - case.executor_threads)
            .io_backend(other_backend)
            .build()
            .unwrap();
        for (epoch, want) in &train_orders {
            ds2.set_epoch(*epoch);
            let got: Vec<u64> = ds2
                .train()
                .unwrap()
                .flat_map(|b| b.unwrap().sample_indices().to_vec())
                .collect();
            assert_eq!(&got, want, "epoch {epoch} order on another runtime");
        }
    }

    // A fresh dataset over the persisted cache revives every slot the first one finished:
    // the same values, nothing read from the store.
    if case.persist {
        let ds3 = case
            .builder(&root)
            .manifest(m)
            .cache_dir(&cache)
            .persist(true)
            // A readonly job would refuse the stand-ins' slots: they were never cached.
            .readonly_cache(case.seed.is_multiple_of(2) && !case.corrupt)
            .build()
            .unwrap();
        run_epochs(&case, &ds3, 2..3, Reads::None, cov);
    }
}

/// The ranks' shares of `chunks` (when there are at least as many chunks as ranks): contiguous
/// runs, each cut at the boundary whose valid rows before it come closest to k / world_size of
/// the total (the lower one on a tie), leaving every rank at least one chunk. Written here by
/// scanning every candidate, independently of the planner's search.
fn contiguous_shares(case: &Case, spc: u64, chunks: &[u64], world_size: usize) -> Vec<Vec<u64>> {
    if chunks.len() < world_size {
        return vec![Vec::new(); world_size];
    }
    let mut prefix = vec![0u64];
    for c in chunks {
        let rows = expected_anchors(case, spc, std::slice::from_ref(c)).len() as u64;
        prefix.push(prefix.last().unwrap() + rows);
    }
    let total = *prefix.last().unwrap() as i128;
    let w = world_size as i128;
    let mut cuts = vec![0usize];
    for k in 1..world_size {
        let lo = cuts[k - 1] + 1;
        let hi = chunks.len() - (world_size - k);
        let best = (lo..=hi)
            .min_by_key(|&b| ((prefix[b] as i128 * w - total * k as i128).abs(), b))
            .unwrap();
        cuts.push(best);
    }
    cuts.push(chunks.len());
    cuts.windows(2)
        .map(|c| chunks[c[0]..c[1]].to_vec())
        .collect()
}

/// Two or three data-parallel ranks, each its own dataset over the same manifest: `all` is each
/// rank's share of the chunks in order, and together every valid anchor once; `train` is the
/// same length on every rank (the shortest share's), drawn from the rank's share only.
fn check_ranks(case: &Case, root: &Path, m: &SplitManifest, n: u64, cov: &mut Coverage) {
    let world_size = 2 + (n % 2) as usize;
    let spc = m.samples_per_chunk();
    for split in ["train", "all"] {
        let chunks = split_chunks(m, split);
        let shares: Vec<Vec<u64>> = contiguous_shares(case, spc, &chunks, world_size)
            .iter()
            .map(|share| expected_anchors(case, spc, share))
            .collect();
        let even = shares.iter().map(Vec::len).min().unwrap_or(0);
        let (mut seen, mut claimed) = (Vec::new(), HashSet::new());
        for (rank, share) in shares.iter().enumerate() {
            let ds = case
                .builder(root)
                .manifest(m.clone())
                .shard(rank, world_size)
                .build()
                .unwrap();
            ds.set_epoch(n % 3);
            if chunks.len() < world_size || even == 0 {
                // An empty split is its own error; otherwise `world_size` is named.
                let e = ds.iter(split).unwrap_err();
                assert!(
                    matches!(e, EngineError::EmptySplit { .. })
                        || e.to_string().contains("`world_size`"),
                    "{split}, rank {rank} of {world_size}: {e}"
                );
                continue;
            }
            let mut pass = ds.iter(split).unwrap();
            let mut got = Vec::new();
            for b in pass.by_ref() {
                let b = b.unwrap();
                check_batch(case, &b);
                got.extend_from_slice(b.sample_indices());
            }
            let what = format!("{split}, rank {rank} of {world_size}");
            if split == "all" {
                assert_eq!(&got, share, "{what}");
            } else {
                assert_eq!(got.len(), even, "{what}");
                assert_eq!(
                    pass.stats().trimmed_rows,
                    (share.len() - even) as u64,
                    "{what}"
                );
                let share: HashSet<u64> = share.iter().copied().collect();
                assert!(
                    got.iter().all(|a| share.contains(a)),
                    "{what}: outside its share"
                );
            }
            assert_eq!(ds.split_samples(split).unwrap(), got.len() as u64, "{what}");
            // Each anchor's patches are rows of one rank.
            let mut own: Vec<u64> = got.clone();
            own.sort_unstable();
            own.dedup();
            for a in own {
                assert!(claimed.insert(a), "{split}: sample {a} on two ranks");
            }
            seen.extend(got);
        }
        if split == "all" && even > 0 {
            assert_eq!(seen.len(), shares.iter().map(Vec::len).sum::<usize>());
            cov.ranked += 1;
        }
    }
}

/// The reference chunks a split names in the manifest (`all`: every chunk of its range).
fn split_chunks(m: &SplitManifest, split: &str) -> Vec<u64> {
    let spc = m.samples_per_chunk();
    match split {
        "all" => (m.sample_range[0] / spc..m.sample_range[1].div_ceil(spc)).collect(),
        s => m.splits.get(s).cloned().unwrap_or_default(),
    }
}

/// A train pass dropped after a few batches leaves nothing pinned or reserved, and the dataset
/// goes on; two iterations at once (train and val zipped) each emit exactly their split when
/// the budget holds both, and otherwise the second one fails at its start saying what budget it
/// needs.
fn abandon_and_zip(case: &Case, ds: &InSituDataset, n: u64, cov: &mut Coverage) {
    let m = ds.manifest();
    let spc = m.samples_per_chunk();
    let want_train = expected_anchors(case, spc, &split_chunks(m, "train"));
    let want_val = expected_anchors(case, spc, &split_chunks(m, "val"));
    if want_train.is_empty() || refused_for_its_budget(case, ds, "train", cov) {
        return;
    }
    let batches = want_train.len().div_ceil(case.batch_size) as u64;
    let keep = Rng::new(n ^ 0xab4d_0e5d).range(0, batches - 1) as usize;
    let mut pass = ds.train().unwrap();
    for batch in pass.by_ref().take(keep) {
        check_batch(case, &batch.unwrap());
    }
    drop(pass);
    let st = ds.pool_stats();
    assert_eq!(
        (st.pinned_slots, st.reserved_bytes),
        (0, 0),
        "after a pass dropped at batch {keep} of {batches}: {st:?}"
    );
    cov.abandoned += 1;

    if want_val.is_empty() {
        return;
    }
    let train = ds.train().unwrap();
    let val = match ds.val() {
        Ok(val) => val,
        Err(e) => {
            assert!(
                case.budget != CaseBudget::Everything,
                "val next to train: {e}"
            );
            assert!(
                e.to_string().contains("set cache_budget_bytes to at least"),
                "{e}"
            );
            cov.zip_refused += 1;
            return;
        }
    };
    let mut got = [Vec::new(), Vec::new()];
    let mut passes = [Some(train), Some(val)];
    while passes.iter().any(Option::is_some) {
        for (i, slot) in passes.iter_mut().enumerate() {
            let Some(pass) = slot else { continue };
            match pass.next() {
                Some(batch) => {
                    let batch = batch.unwrap();
                    check_batch(case, &batch);
                    got[i].extend_from_slice(batch.sample_indices());
                }
                None => *slot = None,
            }
        }
    }
    for (g, want) in got.iter_mut().zip([&want_train, &want_val]) {
        g.sort_unstable();
        assert_eq!(g, want, "zipped passes each emit their own split");
    }
    cov.zipped += 1;
}

/// The batches of `all` and of a train epoch are the same whether chunks are decoded straight
/// into batch rows or through the pool.
fn rows_equal_pool(case: &Case, root: &Path, m: &SplitManifest, cov: &mut Coverage) {
    type Batches = Vec<(Vec<u64>, Vec<Vec<u8>>)>;
    let epoch = |split: &str, mode: IntoRows| -> Option<(Batches, PassStats)> {
        let ds = case
            .builder(root)
            .manifest(m.clone())
            .decode_into_batches(mode)
            .build()
            .unwrap();
        // An empty split, or a budget too small for the pass: refused alike in either mode.
        let mut pass = ds.iter(split).ok()?;
        let batches = pass
            .by_ref()
            .map(|b| {
                let b = b.unwrap();
                let arrays = (0..case.views.len()).map(|v| case.view_rows(&b, v));
                (b.sample_indices().to_vec(), arrays.collect())
            })
            .collect();
        Some((batches, pass.stats()))
    };
    for split in ["all", "train"] {
        let Some((rows, stats)) = epoch(split, IntoRows::Always) else {
            assert!(epoch(split, IntoRows::Never).is_none(), "{split}");
            continue;
        };
        let Some((pooled, pooled_stats)) = epoch(split, IntoRows::Never) else {
            // Refused through the pool for its budget: decoded into rows, a pass reserves
            // nothing from the pool, so it ran under that budget, pinning nothing.
            assert_eq!(stats.pinned_peak_bytes, 0, "{split}: {stats:?}");
            cov.into_rows += 1;
            continue;
        };
        assert!(
            rows == pooled,
            "{split}: rows decoded in place differ from the pool's"
        );
        assert_eq!(pooled_stats.tiles_into_batches, 0);
        // The same bad chunks, found in whatever order the decoders met them; but a patched
        // row read as its region reads only the stored chunks under its window, where the
        // pool reads the whole sample, so there a bad chunk beside every window is met only
        // through the pool.
        let keys = |s: &PassStats| {
            let mut k: Vec<String> = s.bad_chunks.iter().map(|b| b.key.clone()).collect();
            k.sort_unstable();
            k
        };
        if case.patch.is_none() {
            assert_eq!(keys(&stats), keys(&pooled_stats), "{split}");
        } else {
            let pooled_keys = keys(&pooled_stats);
            let missing: Vec<String> = keys(&stats)
                .into_iter()
                .filter(|k| !pooled_keys.contains(k))
                .collect();
            assert!(missing.is_empty(), "{split}: met only in rows: {missing:?}");
        }
        cov.into_rows += (stats.tiles_into_batches > 0) as u64;
    }
}

/// The fewest and most stored chunks a sample-axis chunk's field is cut into, over the case's
/// arrays.
fn stored_chunks_per_field(case: &Case) -> (u64, u64) {
    let per_field = case.arrays.iter().map(|a| a.chunks_per_sample(case.axis));
    (
        per_field.clone().min().unwrap_or(1),
        per_field.max().unwrap_or(1),
    )
}

/// How many slots (array, sample-axis chunk) the rows of `anchors` read hold a corrupt stored
/// chunk.
fn slots_with_a_corrupt_chunk(case: &Case, anchors: &[u64]) -> u64 {
    let mut slots = HashSet::new();
    for (i, v) in case.views.iter().enumerate() {
        let a = &case.arrays[v.array];
        for anchor in anchors {
            let s = case.read(i, *anchor).unwrap();
            if a.chunks_of_sample(case.axis, s)
                .iter()
                .any(|c| a.corrupt.contains(c))
            {
                slots.insert((v.array, s / a.chunks[case.axis]));
            }
        }
    }
    slots.len() as u64
}

/// With `on_bad_chunk = raise`, a pass over `all` that needs the corrupt chunk ends with an
/// error naming it (and nothing after it); one that does not need it is not disturbed. (A
/// sample "needs" every stored chunk of its field here; a patch read as its region needs
/// fewer.)
fn raise_on_the_corrupt_chunk(case: &Case, root: &Path, m: &SplitManifest, cov: &mut Coverage) {
    let spc = m.samples_per_chunk();
    let want = expected_anchors(case, spc, &split_chunks(m, "all"));
    if want.is_empty() {
        return;
    }
    let ds = case
        .builder(root)
        .manifest(m.clone())
        .on_bad_chunk(OnBadChunk::Raise)
        .build()
        .unwrap();
    let needed = slots_with_a_corrupt_chunk(case, &want) > 0;
    if refused_for_its_budget(case, &ds, "all", cov) {
        return;
    }
    let mut pass = ds.all().unwrap();
    let mut error = None;
    for batch in pass.by_ref() {
        match batch {
            Ok(b) => check_batch(case, &b),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    match error {
        Some(e) => {
            assert!(
                needed,
                "an error from a pass that needs no corrupt chunk: {e}"
            );
            let bad = case.arrays.iter().find(|a| !a.corrupt.is_empty()).unwrap();
            assert!(e.contains(&bad.name), "the error names the array: {e}");
            assert!(pass.next().is_none(), "nothing after the error");
            cov.raised += 1;
        }
        // A patched row decoded into rows may be read as its region, only the stored chunks
        // under its window: a corrupt chunk beside every window is never read, and every row
        // delivered was checked against the array's values.
        None => assert!(
            !needed || (case.patch.is_some() && case.into_rows != IntoRows::Never),
            "the pass read a corrupt chunk and raised nothing"
        ),
    }
}

/// With a budget of a few KiB, a pass whose working set does not fit must refuse to start,
/// saying what budget it needs (true then); one that fits runs within it, and one that decodes
/// every chunk into batch rows needs none of it.
fn refused_for_its_budget(
    case: &Case,
    ds: &InSituDataset,
    split: &str,
    cov: &mut Coverage,
) -> bool {
    let CaseBudget::Bytes(budget) = case.budget else {
        return false;
    };
    match ds.iter(split) {
        Ok(pass) => {
            // It fits, or it decodes every chunk into batch rows and so reserves nothing from
            // the pool (its working set is none of the pool's).
            let need = ds.memory_need(split).unwrap();
            assert!(
                pass.read_ahead_bytes() <= budget || need.working_set == 0,
                "a pass started over its budget of {budget} bytes: {need:?}"
            );
            false
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.contains("set cache_budget_bytes to at least"),
                "{split}: {message}"
            );
            cov.budget_refused += 1;
            true
        }
    }
}

/// Whether the passes of [`run_epochs`] may read the store.
#[derive(Clone, Copy, PartialEq)]
enum Reads {
    Some,
    /// Every slot is already in the pool or the persisted cache.
    None,
}

/// Runs `epochs` over every split, checking each pass (an empty split must refuse to start);
/// returns the train orders, each with its epoch (an epoch whose train pass was refused for
/// its budget has none).
fn run_epochs(
    case: &Case,
    ds: &InSituDataset,
    epochs: std::ops::Range<u64>,
    reads: Reads,
    cov: &mut Coverage,
) -> Vec<(u64, Vec<u64>)> {
    let m = ds.manifest();
    let spc = m.samples_per_chunk();
    let mut train_orders = Vec::new();
    for epoch in epochs.clone() {
        ds.set_epoch(epoch);
        for split in ["train", "val", "test", "all"] {
            let want = expected_anchors(case, spc, &split_chunks(m, split));
            if want.is_empty() {
                match ds.iter(split) {
                    Err(EngineError::EmptySplit { split: s, .. }) => {
                        assert_eq!(s, split);
                        cov.empty_splits += 1;
                    }
                    Err(e) => panic!("{split}: wrong error for an empty split: {e}"),
                    Ok(_) => panic!("{split}: a split with no valid anchor started a pass"),
                }
                continue;
            }
            if refused_for_its_budget(case, ds, split, cov) {
                continue;
            }
            let (anchors, stats) = check_pass(case, ds, split, &want, cov);
            cov.passes += 1;
            // After a first epoch over every split into a pool that keeps everything, nothing
            // is read or decoded; from a persisted cache, at most the slots holding a corrupt
            // chunk's stand-in, which is never written to the cache (an earlier pass of the
            // same dataset may have left them resident). A chunk decoded straight into its
            // batch rows, or loaded as a region slot, is never kept (`IntoRows::Always` does so
            // even where the budget could keep it), so it is read again: every other one hits.
            let warm = epoch > epochs.start && case.budget == CaseBudget::Everything;
            // A corrupt chunk's stand-in decoded into rows (`IntoRows::Always`) is read
            // again every epoch, like any chunk decoded into rows, and not counted decoded.
            let uncached = match reads {
                Reads::Some if case.into_rows != IntoRows::Always => 0,
                _ => slots_with_a_corrupt_chunk(case, &anchors),
            };
            if warm || reads == Reads::None {
                // A region slot (a patched field several labels read, loaded with only the
                // stored chunks under the pass's windows) is never kept either, and where the
                // pool keeps everything or a cache directory serves it, only `Always` loads
                // one.
                if case.into_rows != IntoRows::Always || reads == Reads::None {
                    assert_eq!(stats.region_slots, 0, "epoch {epoch} {split}: {stats:?}");
                }
                let fresh = stats.tiles_into_batches + stats.region_slots;
                assert!(
                    stats.cache_misses >= fresh,
                    "a chunk decoded into rows or loaded as a region slot is a miss: {stats:?}"
                );
                assert!(
                    stats.cache_misses - fresh <= uncached,
                    "epoch {epoch} {split}: {stats:?}"
                );
                if stats.cache_misses == 0 {
                    assert_eq!(
                        (stats.tiles_read, stats.bytes_decoded),
                        (0, 0),
                        "epoch {epoch} {split}: {stats:?}"
                    );
                } else if stats.cache_misses == stats.tiles_into_batches {
                    // Only the chunks decoded into rows are read: each its field's stored
                    // chunks (the same number for every chunk of an array).
                    let (fewest, most) = stored_chunks_per_field(case);
                    let chunks = stats.tiles_into_batches;
                    assert!(
                        (chunks * fewest..=chunks * most).contains(&stats.tiles_read),
                        "epoch {epoch} {split}: only the chunks decoded into rows are read \
                         ({fewest} to {most} stored chunks each): {stats:?}"
                    );
                }
            }
            if split == "train" {
                train_orders.push((epoch, anchors));
            }
        }
    }
    train_orders
}

/// `ISB_RANDOM_CASES`: a count `n` (cases `0..n`) or a range `a..b` (a soak past the cases
/// run before).
fn case_range(text: &str) -> std::ops::Range<u64> {
    let number = |t: &str| -> u64 {
        t.trim()
            .parse()
            .expect("ISB_RANDOM_CASES is a count `n` or a range `a..b`")
    };
    match text.split_once("..") {
        Some((a, b)) => number(a)..number(b),
        None => 0..number(text),
    }
}

#[test]
fn random_geometries_and_knobs_deliver_every_anchor_once_with_the_arrays_values() {
    let cases: Vec<u64> = match std::env::var("ISB_RANDOM_CASE") {
        Ok(n) => vec![n.parse().expect("ISB_RANDOM_CASE is a case number")],
        Err(_) => match std::env::var("ISB_RANDOM_CASES") {
            Ok(n) => case_range(&n).collect(),
            Err(_) => (0..CASES).collect(),
        },
    };
    let single = cases.len() == 1;
    if single {
        // What the case draws, for whoever is debugging it (`--no-capture`).
        eprintln!("{:#?}", Case::draw(cases[0]));
    }
    let mut cov = Coverage::default();
    for n in cases {
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(n, &mut cov)));
        if let Err(e) = result {
            let msg = panic_message(&*e);
            panic!(
                "case {n} failed (rerun alone with ISB_RANDOM_CASE={n}): {msg}\n{:#?}",
                Case::draw(n)
            );
        }
    }
    if !single {
        eprintln!("{cov:#?}");
        let c = &cov;
        for (what, count) in [
            ("passes", c.passes / 20),
            ("empty splits", c.empty_splits),
            ("windows", c.windows),
            ("stacks of two labels or more", c.stacks),
            ("patches", c.patched),
            ("periodic patches", c.periodic_patches),
            ("several patches per sample", c.several_patches),
            ("patch grids", c.patch_grids),
            ("manifests", c.manifests),
            ("sample ranges", c.sample_ranges),
            ("unwritten chunks", c.unwritten_chunks),
            ("F order", c.f_order),
            ("big-endian", c.big_endian),
            ("sample axis > 0", c.sample_axis_nonzero),
            ("chunked differently", c.chunked_differently),
            ("multi-tile slots", c.multi_tile_slots),
            ("a persisted cache", c.persisted),
            ("an ephemeral spill", c.spilled),
            ("a pass abandoned", c.abandoned),
            ("train and val zipped", c.zipped),
            ("val refused next to train", c.zip_refused),
            ("a compressor", c.compressed),
            ("sharding", c.sharded),
            ("a corrupt chunk", c.corrupt),
            ("a corrupt chunk raised", c.raised),
            ("passes whose waits timed out", c.passes_with_timeouts),
            ("passes refused for their budget", c.budget_refused),
            ("data-parallel ranks", c.ranked),
            ("passes with chunks decoded into batch rows", c.into_rows),
            ("blocks ramped up from one batch", c.ramped),
            ("train passes started early", c.started_ahead),
            ("a sample stride", c.strided),
            ("a mounted store", c.mounted),
            ("a mount aligned on time", c.timed),
            ("a containing or nearest mount", c.between),
            ("an indexed view", c.indexed),
            ("a cropped array", c.cropped),
            ("a crop wrapping an axis", c.wrapped),
        ] {
            assert!(count >= 10, "only {count} cases with {what}: {cov:?}");
        }
    }
}
