//! Cropped views (`ArrayGeometry::crop`, `cropped_window`) against zarr-python fixtures: every
//! sample is zarr-python's value over the region, only the stored chunks the region touches
//! are read, windows and transforms compose with a crop, a crop is part of what a persistent
//! cache holds, and every bad region is an error naming the array.

use insitubatch::{EngineError, InSituDataset, IntoRows};
use insitubatch_tests::{FixtureArray, fixture_arrays, item_size, sample_of};

mod common;
use common::{fixture, sample_axis_of, sorted};

/// The single-array fixture `case`.
fn fixture_case(case: &str) -> FixtureArray {
    fixture_arrays()
        .into_iter()
        .find(|f| f.case == case)
        .unwrap_or_else(|| panic!("fixture {case}"))
}

/// The bytes of `sample` (field axes in physical order, lengths `inner`) inside `region` (a
/// range ending past its axis wraps around to the axis's start).
fn crop_bytes(sample: &[u8], inner: &[u64], region: &[(u64, u64)], item: usize) -> Vec<u8> {
    let extent: Vec<u64> = region.iter().map(|(lo, hi)| hi - lo).collect();
    let total: u64 = extent.iter().product();
    let mut out = Vec::with_capacity(total as usize * item);
    for flat in 0..total {
        let mut rem = flat;
        let mut at = vec![0u64; inner.len()];
        for d in (0..inner.len()).rev() {
            at[d] = (region[d].0 + rem % extent[d]) % inner[d];
            rem /= extent[d];
        }
        let off = at.iter().zip(inner).fold(0u64, |acc, (i, n)| acc * n + i) as usize * item;
        out.extend_from_slice(&sample[off..off + item]);
    }
    out
}

/// Runs one epoch of `train` and checks every label's samples against zarr-python's values
/// over `region`; returns the anchors and the pass's stats.
fn check_cropped_epoch(
    ds: &InSituDataset,
    labels: &[&str],
    f: &FixtureArray,
    axis: usize,
    region: &[(u64, u64)],
) -> (Vec<u64>, insitubatch::PassStats) {
    let item = item_size(&f.dtype);
    let inner: Vec<u64> = (0..f.shape.len())
        .filter(|&a| a != axis)
        .map(|a| f.shape[a])
        .collect();
    let cropped: Vec<usize> = region.iter().map(|(lo, hi)| (hi - lo) as usize).collect();
    let sb = cropped.iter().product::<usize>() * item;
    let mut anchors = Vec::new();
    let mut pass = ds.train().unwrap();
    for batch in pass.by_ref() {
        let batch = batch.unwrap();
        for label in labels {
            let arr = batch.array(label).unwrap();
            let mut shape = vec![batch.len()];
            shape.extend(&cropped);
            assert_eq!(arr.shape(), &shape[..], "{}: {label}", f.case);
            for (r, idx) in batch.read_indices(label).unwrap().into_iter().enumerate() {
                let full = sample_of(&f.reference, &f.shape, axis, idx, item);
                let want = crop_bytes(&full, &inner, region, item);
                assert!(
                    arr.bytes()[r * sb..(r + 1) * sb] == want[..],
                    "{} label {label} sample {idx} over {region:?} differs from zarr-python",
                    f.case
                );
            }
        }
        anchors.extend_from_slice(batch.sample_indices());
    }
    (anchors, pass.stats())
}

/// Every file under `dir`.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Stored chunks along each field axis that `region` touches (each once, wrapping or not).
fn tiles_touched(f: &FixtureArray, axis: usize, chunks: &[u64], region: &[(u64, u64)]) -> u64 {
    (0..f.shape.len())
        .filter(|&a| a != axis)
        .zip(region)
        .map(|(a, &(lo, hi))| {
            let mut t: Vec<u64> = (lo..hi).map(|x| x % f.shape[a] / chunks[a]).collect();
            t.dedup();
            t.sort();
            t.dedup();
            t.len() as u64
        })
        .product()
}

#[test]
fn a_cropped_view_is_zarr_python_over_its_region_and_reads_only_the_chunks_it_touches() {
    // (case, region per field axis, the stored chunk's shape: the shard when sharded)
    type Region = Vec<(u64, u64)>;
    let cases: [(&str, Region, Vec<u64>); 5] = [
        // 3 × 3 tiles per sample chunk; the region touches 2 × 1 of them.
        ("v3_inner", vec![(4, 7), (1, 3)], vec![2, 3, 4]),
        // Across every tile edge, ending at the partial edge tiles.
        ("v3_inner", vec![(2, 7), (3, 9)], vec![2, 3, 4]),
        // One shard per sample chunk covers the field: its index and the inner chunks the
        // region touches are read.
        ("v3_sharded", vec![(1, 3), (2, 7)], vec![4, 6, 8]),
        // The index at the start of the shard, and an inner chunk the region touches that was
        // never written (the fill value).
        ("v3_sharded_start", vec![(3, 6), (4, 8)], vec![4, 6, 8]),
        // Sampled along z (axis 2): field axes t, c, y, x; t is chunked 1.
        (
            "v3_tczyx",
            vec![(1, 2), (0, 2), (1, 4), (2, 6)],
            vec![1, 2, 2, 5, 6],
        ),
    ];
    for (case, region, chunks) in cases {
        let f = fixture_case(case);
        let axis = sample_axis_of(&f);
        let n = f.shape[axis];
        for shuffle in [true, false] {
            let ds = InSituDataset::builder(&f.store)
                .sample_axis(axis)
                .cropped_window("x", f.array.clone(), 0, &region)
                .cropped_window("y", f.array.clone(), 1, &region)
                .batch_size(3)
                .block_chunks(2)
                .shuffle(shuffle)
                .build()
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            let v = &ds.variables()[0];
            assert_eq!(v.geom.region.as_deref(), Some(&region[..]));
            assert_eq!(
                v.sample_inner,
                region.iter().map(|(lo, hi)| hi - lo).collect::<Vec<_>>()
            );
            let (anchors, stats) = check_cropped_epoch(&ds, &["x", "y"], &f, axis, &region);
            assert_eq!(sorted(anchors), (0..n - 1).collect::<Vec<_>>(), "{case}");
            // Each sample-axis chunk is read once, and of it only the tiles the region touches.
            let sample_chunks = n.div_ceil(chunks[axis]);
            let touched = tiles_touched(&f, axis, &chunks, &region);
            assert_eq!(stats.cache_misses, sample_chunks, "{case}");
            assert_eq!(
                stats.tiles_read,
                sample_chunks * touched,
                "{case} {region:?}"
            );
            // A chunk is decoded whole (the codec's unit) and its part copied out; a shard
            // decodes only the inner chunks the region touches, giving the part alone.
            let item = item_size(&f.dtype) as u64;
            let sharded = case.starts_with("v3_sharded");
            let per_tile = if sharded {
                chunks[axis] * region.iter().map(|(lo, hi)| hi - lo).product::<u64>() * item
            } else {
                chunks.iter().product::<u64>() * item
            };
            assert_eq!(stats.bytes_decoded, stats.tiles_read * per_tile, "{case}");
            if sharded {
                // Less than the shards: their indexes and the touched inner chunks.
                let on_disk: u64 = walk_files(&f.store.join("c"))
                    .iter()
                    .map(|p| p.metadata().unwrap().len())
                    .sum();
                assert!(
                    stats.bytes_read < on_disk,
                    "{case}: read {} of {on_disk}",
                    stats.bytes_read
                );
            }
        }
    }
    // Against the whole field, the first region reads 2 of every 9 tiles.
    let f = fixture_case("v3_inner");
    let whole = InSituDataset::builder(&f.store)
        .variable("x", f.array.clone())
        .build()
        .unwrap();
    let mut pass = whole.train().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    assert_eq!(pass.stats().tiles_read, 3 * 9);
}

#[test]
fn a_wrapping_region_is_zarr_python_across_the_seam_and_reads_each_chunk_once() {
    // (case, wrapping ranges, their normal form, the stored chunk's shape)
    type Case = (&'static str, Vec<(i64, i64)>, Vec<(u64, u64)>, Vec<u64>);
    let cases: [Case; 3] = [
        // Inner chunks: both field axes cross their end; tiles at both ends are read.
        (
            "v3_inner",
            vec![(-2, 2), (7, 12)],
            vec![(5, 9), (7, 12)],
            vec![2, 3, 4],
        ),
        // A shard: the x range starts and ends inside the one shard along x, so two
        // stretches of it land in the sample; its inner chunks are read by range.
        (
            "v3_sharded",
            vec![(1, 3), (-2, 3)],
            vec![(1, 3), (6, 11)],
            vec![4, 6, 8],
        ),
        // Sampled along z: y and x wrap.
        (
            "v3_tczyx",
            vec![(0, 2), (0, 2), (-1, 2), (-4, 2)],
            vec![(0, 2), (0, 2), (4, 7), (2, 8)],
            vec![1, 2, 2, 5, 6],
        ),
    ];
    for (case, region, normal, chunks) in cases {
        let f = fixture_case(case);
        let axis = sample_axis_of(&f);
        let n = f.shape[axis];
        for shuffle in [true, false] {
            let ds = InSituDataset::builder(&f.store)
                .sample_axis(axis)
                .cropped_window_wrapping("x", f.array.clone(), 0, &region)
                .cropped_window_wrapping("y", f.array.clone(), 1, &region)
                .batch_size(3)
                .block_chunks(2)
                .shuffle(shuffle)
                .build()
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(ds.variables()[0].geom.region.as_deref(), Some(&normal[..]));
            let (anchors, stats) = check_cropped_epoch(&ds, &["x", "y"], &f, axis, &normal);
            assert_eq!(sorted(anchors), (0..n - 1).collect::<Vec<_>>(), "{case}");
            let sample_chunks = n.div_ceil(chunks[axis]);
            assert_eq!(stats.cache_misses, sample_chunks, "{case}");
            assert_eq!(
                stats.tiles_read,
                sample_chunks * tiles_touched(&f, axis, &chunks, &normal),
                "{case} {normal:?}"
            );
        }
    }
    // A whole longitude axis rotated (a 0–360° grid read as −180–180°): one tile, two
    // stretches, every value in place.
    let f = fixture("era5_v3", "t2m");
    let w = f.shape[2] as i64;
    let ds = InSituDataset::builder(&f.store)
        .cropped_window_wrapping(
            "t",
            "t2m",
            0,
            &[(0, f.shape[1] as i64), (-w / 2, w - w / 2)],
        )
        .batch_size(4)
        .build()
        .unwrap();
    let normal = [
        (0, f.shape[1]),
        ((w - w / 2) as u64, (2 * w - w / 2) as u64),
    ];
    let (anchors, stats) = check_cropped_epoch(&ds, &["t"], &f, 0, &normal);
    assert_eq!(sorted(anchors), (0..f.shape[0]).collect::<Vec<_>>());
    let g = insitubatch::geometries(&f.store, None, 0).unwrap()["t2m"].clone();
    assert_eq!(g.chunks[1..], g.shape[1..], "one tile per field");
    assert_eq!(stats.tiles_read, g.n_sample_chunks());
    // Without the wrapping crop, a range past the axis is refused with the way to ask.
    let msg = InSituDataset::builder(&f.store)
        .cropped_window("t", "t2m", 0, &[(0, f.shape[1]), (1, f.shape[2] + 1)])
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`t2m`") && msg.contains("crop_wrapping"),
        "{msg}"
    );
}

#[test]
fn a_crop_composes_with_chunk_transforms_and_a_geometry_carries_it() {
    let f = fixture("era5_v3", "t2m");
    let g = insitubatch::geometries(&f.store, None, 0).unwrap()["t2m"].clone();
    let region = [(1, g.shape[1] - 1), (2, g.shape[2])];
    let cropped = g.crop(&region).unwrap();
    // A shift of every value: the transform sees the region and keeps its shape.
    let ds = InSituDataset::builder(&f.store)
        .geometry("t", cropped.clone())
        .chunk_transforms_json(r#"[{"type": "affine", "offset": 1.5}]"#)
        .batch_size(4)
        .build()
        .unwrap();
    let plain = InSituDataset::builder(&f.store)
        .geometry("t", cropped)
        .batch_size(4)
        .build()
        .unwrap();
    let (mut a, mut b) = (ds.all().unwrap(), plain.all().unwrap());
    let mut batches = 0;
    while let (Some(x), Some(y)) = (a.next(), b.next()) {
        let (x, y) = (x.unwrap(), y.unwrap());
        let (x, y) = (x.array("t").unwrap(), y.array("t").unwrap());
        assert_eq!(x.shape(), y.shape());
        assert_eq!(
            &x.shape()[1..],
            &[
                (region[0].1 - region[0].0) as usize,
                (region[1].1 - region[1].0) as usize
            ]
        );
        for (p, q) in x
            .values::<f32>()
            .unwrap()
            .iter()
            .zip(y.values::<f32>().unwrap())
        {
            assert_eq!(*p, q + 1.5);
        }
        batches += 1;
    }
    assert!(batches > 0);
}

#[test]
fn bad_regions_are_errors_naming_the_array_and_views_of_one_array_share_one_region() {
    let f = fixture("era5_v3", "t2m");
    let g = insitubatch::geometries(&f.store, None, 0).unwrap()["t2m"].clone();
    let (h, w) = (g.shape[1], g.shape[2]);
    for (region, says) in [
        (vec![(0, h)], "one (start, end) per field axis"),
        (
            vec![(0, h), (2, 2)],
            "each range must satisfy 0 <= start < end",
        ),
        (vec![(0, h + 1), (0, w)], &*format!("axis 1 has length {h}")),
    ] {
        let e = InSituDataset::builder(&f.store)
            .cropped_window("t", "t2m", 0, &region)
            .build()
            .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`t2m`") && msg.contains(says), "{msg}");
        assert!(
            matches!(&e, EngineError::Store(s) if matches!(**s, insitubatch::StoreError::Region { .. })),
            "{e:?}"
        );
    }
    // A geometry whose region was set by hand (as JSON may carry it) is checked too.
    let mut forged = g.clone();
    forged.region = Some(vec![(0, h), (w, w + 3)]);
    let msg = InSituDataset::builder(&f.store)
        .geometry("t", forged)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("`t2m`") && msg.contains(&format!("axis 2 has length {w}")),
        "{msg}"
    );
    // Two labels of one array decode once, so they read one region.
    let msg = InSituDataset::builder(&f.store)
        .cropped_window("x", "t2m", 0, &[(0, 2), (0, 2)])
        .window("y", "t2m", 1)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("x and y") && msg.contains("the whole field") && msg.contains("same region"),
        "{msg}"
    );
    // A region that covers the whole field is no crop.
    let whole = g.crop(&[(0, h), (0, w)]).unwrap();
    assert_eq!(whole, g);
}

#[test]
fn a_persistent_cache_holds_the_region_it_was_filled_with() {
    let f = fixture("era5_v3", "t2m");
    let axis = 0;
    let region = [(1, 3), (0, 4)];
    let dir = tempfile::tempdir().unwrap();
    let build = |region: Option<&[(u64, u64)]>, reset: bool| {
        let b = InSituDataset::builder(&f.store)
            .batch_size(4)
            .block_chunks(2);
        let b = match region {
            Some(r) => b.cropped_window("t", "t2m", 0, r),
            None => b.variable("t", "t2m"),
        };
        b.cache_dir(dir.path())
            .persist(true)
            .reset_stale_cache(reset)
            .build()
    };
    // Filled cropped, then revived cropped: nothing read, every value the region's.
    let ds = build(Some(&region), false).unwrap();
    let (_, filled) = check_cropped_epoch(&ds, &["t"], &f, axis, &region);
    assert!(filled.tiles_read > 0);
    drop(ds);
    let ds = build(Some(&region), false).unwrap();
    let (anchors, warm) = check_cropped_epoch(&ds, &["t"], &f, axis, &region);
    assert_eq!(sorted(anchors), (0..f.shape[0]).collect::<Vec<_>>());
    assert_eq!((warm.tiles_read, warm.bytes_decoded), (0, 0), "{warm:?}");
    assert_eq!(warm.cache_revived, warm.cache_hits);
    drop(ds);
    // The whole field is not what the cache holds: stale, named, until reset.
    let msg = build(None, false).unwrap_err().to_string();
    assert!(
        msg.contains("t2m") && msg.contains("reset_stale_cache"),
        "{msg}"
    );
    let ds = build(None, true).unwrap();
    let full: Vec<(u64, u64)> = vec![(0, f.shape[1]), (0, f.shape[2])];
    let (_, refilled) = check_cropped_epoch(&ds, &["t"], &f, axis, &full);
    assert_eq!(refilled.cache_revived, 0);
}

#[test]
fn a_region_of_a_sharded_array_reads_only_the_inner_chunks_it_touches() {
    // v3_sharded: (9, 6, 8) in shards of (4, 6, 8), inner chunks (2, 3, 4): 2 x 2 x 2 inner
    // chunks per shard. Garbage over inner chunk (0, 0, 0) of the first shard: the region
    // rows 3..6, columns 4..8 never touches it (neither reads nor decodes it); the whole field
    // does.
    let f = fixture_case("v3_sharded");
    let dir = tempfile::tempdir().unwrap();
    insitubatch_tests::copy_dir(&f.store, dir.path());
    let shard_path = dir.path().join("c/0/0/0");
    let mut shard = std::fs::read(&shard_path).unwrap();
    let bad = common::inner_chunk_bytes(&shard, 8, 0);
    assert!(!bad.is_empty());
    shard[bad].fill(0xa5);
    std::fs::write(&shard_path, &shard).unwrap();
    let corrupt = FixtureArray {
        store: dir.path().to_path_buf(),
        ..f
    };
    let region = [(3, 6), (4, 8)];
    let ds = InSituDataset::builder(&corrupt.store)
        .cropped_window("x", "", 0, &region)
        .batch_size(2)
        .build()
        .unwrap();
    let (anchors, stats) = check_cropped_epoch(&ds, &["x"], &corrupt, 0, &region);
    assert_eq!(sorted(anchors), (0..9).collect::<Vec<_>>());
    assert!(stats.bad_chunks.is_empty(), "{:?}", stats.bad_chunks);
    // The whole field decodes every inner chunk, the damaged one included.
    let whole = InSituDataset::builder(&corrupt.store)
        .variable("x", "")
        .batch_size(2)
        .build()
        .unwrap();
    let err = whole
        .train()
        .unwrap()
        .find_map(Result::err)
        .expect("the damaged inner chunk is decoded for the whole field");
    assert!(err.to_string().contains("corrupt"), "{err}");
    // A region over the damaged inner chunk meets it: with on_bad_chunk "nan" the shard's
    // samples read as the fill value (0 for uint8) and the chunk is listed.
    let over = InSituDataset::builder(&corrupt.store)
        .cropped_window("x", "", 0, &[(0, 3), (0, 4)])
        .on_bad_chunk(insitubatch::OnBadChunk::Nan)
        .batch_size(2)
        .shuffle(false)
        .build()
        .unwrap();
    let mut pass = over.train().unwrap();
    let mut zero_rows = Vec::new();
    for b in pass.by_ref() {
        let b = b.unwrap();
        let a = b.array("x").unwrap().bytes();
        for (r, &i) in b.sample_indices().iter().enumerate() {
            if a[r * 12..(r + 1) * 12].iter().all(|&v| v == 0) {
                zero_rows.push(i);
            }
        }
    }
    assert_eq!(
        zero_rows,
        vec![0, 1, 2, 3],
        "the first shard's samples are the fill value"
    );
    let bad = pass.stats().bad_chunks;
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(format!("{bad:?}").contains("c/0/0/0"), "{bad:?}");
    // A shard cut short of its index is a corrupt chunk naming its key, not a panic or a hang.
    std::fs::write(&shard_path, &shard[..10]).unwrap();
    let fresh = InSituDataset::builder(&corrupt.store)
        .cropped_window("x", "", 0, &region)
        .build()
        .unwrap();
    let err = fresh
        .train()
        .unwrap()
        .find_map(Result::err)
        .expect("a truncated shard fails")
        .to_string();
    assert!(
        err.contains("chunk `c/0/0/0`") && err.contains("shorter than its"),
        "{err}"
    );
}

/// 16 samples of 40 x 64 float32 (variable `t`) in shards of 4 samples holding inner chunks of
/// 1 x 10 x 16, so 4 x 4 inner chunks per field. The directory lives as long as the guard.
fn sharded_16_samples() -> (tempfile::TempDir, std::path::PathBuf) {
    common::synth_store(&insitubatch::synth::SynthSpec {
        samples: 16,
        grid: (40, 64),
        sample_chunk: 1,
        inner_chunks: Some((10, 16)),
        shard_samples: Some(4),
        variables: vec!["t".into()],
        ..Default::default()
    })
}

#[test]
fn the_memory_need_of_a_cropped_sharded_view_counts_its_part_reads_not_whole_shards() {
    // Rows 10..20 and columns 16..32 touch one inner chunk per sample.
    let (_dir, store) = sharded_16_samples();
    let need = |region: Option<&[(u64, u64)]>| {
        let b = InSituDataset::builder(&store).max_inflight(2);
        let b = match region {
            Some(r) => b.cropped_window("t", "t", 0, r),
            // Through the pool: decoded into batch rows, the whole shard would also count a
            // scratch chunk per executor.
            None => b.variable("t", "t").decode_into_batches(IntoRows::Never),
        };
        b.build().unwrap().memory_need("train").unwrap()
    };
    let whole = need(None);
    let cropped = need(Some(&[(10, 20), (16, 32)]));
    // Per read: twice (the parts as read and the compact shard) the touched inner chunks
    // along the shard's 4 samples, plus the 4 x 4 x 4-entry index and its checksum.
    let whole_read = 4 * 40 * 64 * 4;
    let per_read = 2 * (4 * 10 * 16 * 4 + 64 * 16 + 4);
    assert_eq!(whole.reads % whole_read, 0, "{whole:?}");
    let buffers = whole.reads / whole_read;
    assert!(buffers > 0);
    assert_eq!(cropped.reads, buffers * per_read, "{cropped:?}");
    // And a pass stays within it: the reads it makes are the parts.
    let ds = InSituDataset::builder(&store)
        .cropped_window("t", "t", 0, &[(10, 20), (16, 32)])
        .build()
        .unwrap();
    let mut pass = ds.train().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    let s = pass.stats();
    assert!(s.bytes_read <= s.tiles_read * per_read / 2, "{s:?}");
}

#[test]
fn a_wrapping_region_of_a_shard_reads_only_the_inner_chunks_at_its_two_ends() {
    // Rows 10..20 and columns 56..64 then 0..8 (across the seam) touch inner chunks (1, 3) and
    // (1, 0) of each sample: the two in between are not read.
    let (_dir, store) = sharded_16_samples();
    let region = [(10, 20), (-8, 8)];
    let build = |b: insitubatch::DatasetBuilder| {
        b.batch_size(4)
            .shuffle(false)
            .max_inflight(2)
            .build()
            .unwrap()
    };
    let cropped =
        build(InSituDataset::builder(&store).cropped_window_wrapping("t", "t", 0, &region));
    let whole = build(InSituDataset::builder(&store).variable("t", "t"));
    // Every sample is the whole field's rows 10..20, columns 56..64 then 0..8.
    let (mut a, mut b) = (cropped.train().unwrap(), whole.train().unwrap());
    let mut rows = 0;
    while let (Some(x), Some(y)) = (a.next(), b.next()) {
        let (x, y) = (x.unwrap(), y.unwrap());
        assert_eq!(x.sample_indices(), y.sample_indices());
        let (x, y) = (x.array("t").unwrap(), y.array("t").unwrap());
        assert_eq!(&x.shape()[1..], &[10, 16]);
        let (x, y) = (x.values::<f32>().unwrap(), y.values::<f32>().unwrap());
        for r in 0..x.len() / 160 {
            for i in 0..10 {
                for j in 0..16 {
                    let col = (56 + j) % 64;
                    assert_eq!(x[r * 160 + i * 16 + j], y[r * 2560 + (10 + i) * 64 + col]);
                }
            }
            rows += 1;
        }
    }
    assert_eq!(rows, 16);
    // Bytes read: each shard's index and the two touched inner chunks of its 4 samples.
    let index_len = 64 * 16 + 4;
    let mut expect = 0;
    for s in 0..4 {
        let shard = std::fs::read(store.join(format!("t/c/{s}/0/0"))).unwrap();
        expect += index_len;
        for k in 0..4 {
            for c in [0, 3] {
                expect += common::inner_chunk_bytes(&shard, 64, k * 16 + 4 + c).len();
            }
        }
    }
    assert_eq!(a.stats().bytes_read, expect as u64, "{:?}", a.stats());
    drop((a, b));
    // The next pass that reads them again (the pool emptied) has the shards' indexes already:
    // it fetches the inner chunks alone, one request per shard, and delivers the same values.
    let first: Vec<Vec<f32>> = cropped
        .train()
        .unwrap()
        .map(|b| {
            b.unwrap()
                .array("t")
                .unwrap()
                .values::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect();
    cropped.clear_cache();
    let mut again = cropped.train().unwrap();
    let second: Vec<Vec<f32>> = again
        .by_ref()
        .map(|b| {
            b.unwrap()
                .array("t")
                .unwrap()
                .values::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect();
    assert_eq!(first, second);
    let s = again.stats();
    assert_eq!(s.tiles_read, 4, "{s:?}");
    assert_eq!(s.bytes_read, (expect - 4 * index_len) as u64, "{s:?}");
    // The memory need counts those two inner chunks per sample, not the four between the ends.
    let need = cropped.memory_need("train").unwrap();
    // Through the pool (decoded into batch rows, the whole view would also count a scratch
    // chunk per executor).
    let pooled = build(
        InSituDataset::builder(&store)
            .variable("t", "t")
            .decode_into_batches(IntoRows::Never),
    );
    let whole_need = pooled.memory_need("train").unwrap();
    let buffers = whole_need.reads / (4 * 40 * 64 * 4);
    assert_eq!(
        need.reads,
        buffers * 2 * (2 * 4 * 10 * 16 * 4 + index_len as u64)
    );
}

#[test]
fn views_decoded_into_batch_rows_are_zarr_python_and_the_pool_paths_batches() {
    // (case, array, sample axis, region: plain or wrapping; the whole field is no crop).
    type Case = (&'static str, &'static str, usize, Vec<(i64, i64)>);
    let cases: [Case; 17] = [
        // Four samples per chunk, an interior region.
        ("era5_v3", "t2m", 0, vec![(2, 7), (3, 11)]),
        // Longitude across its seam: two stretches of the tile in each row.
        ("era5_v3", "t2m", 0, vec![(0, 9), (-3, 4)]),
        // Sampled along latitude: each row is a strided (time, longitude) box of the chunk.
        ("era5_v3", "t2m", 1, vec![(4, 8), (3, 11)]),
        // One sample per chunk, decoded whole into scratch and cropped into its row.
        ("paired", "raw", 0, vec![(1, 4), (2, 5)]),
        // A partial final chunk (10 = 3 + 3 + 3 + 1), blosc.
        ("v2_blosc_lz4", "", 0, vec![(1, 5), (0, 7)]),
        // Fortran order on disk.
        ("v2_forder", "", 0, vec![(1, 4), (1, 2)]),
        // Sampled along z (axis 2), with t chunked 1 cropped to one chunk.
        ("v3_tczyx", "", 2, vec![(1, 2), (0, 2), (1, 4), (2, 6)]),
        // A field of 3 x 3 stored chunks (partial at the edges), each copying its box into
        // every row: whole, cropped across tile edges, and wrapping on both axes.
        ("v3_inner", "", 0, vec![(0, 7), (0, 9)]),
        ("v3_inner", "", 0, vec![(2, 7), (3, 9)]),
        ("v3_inner", "", 0, vec![(-2, 2), (7, 12)]),
        // Sampled along z, t chunked 1: two stored chunks per field.
        ("v3_tczyx", "", 2, vec![(0, 2), (0, 2), (0, 5), (0, 6)]),
        // Sampled along longitude, the chunk's fastest axis: each point's 16 samples are
        // scattered to 16 rows in one pass; one time tile, three, and cropped across two.
        ("era5_v3", "t2m", 2, vec![(0, 4), (0, 9)]),
        ("era5_v3", "t2m", 2, vec![(0, 12), (0, 9)]),
        ("era5_v3", "t2m", 2, vec![(2, 7), (1, 8)]),
        // Cropped shards: only the inner chunks the region touches are read and decoded, into
        // a buffer of their own; the index at the end or the start (with an inner chunk never
        // written), and x starting and ending inside the one shard (wrapping).
        ("v3_sharded", "", 0, vec![(1, 3), (2, 7)]),
        ("v3_sharded_start", "", 0, vec![(3, 6), (4, 8)]),
        ("v3_sharded", "", 0, vec![(1, 3), (-2, 3)]),
    ];
    for (case, array, axis, region) in cases {
        let f = common::fixture(case, array);
        let n = f.shape[axis];
        let field_axes = || (0..f.shape.len()).filter(|&a| a != axis);
        let normal: Vec<(u64, u64)> = region
            .iter()
            .zip(field_axes())
            .map(|(&(lo, hi), a)| {
                // A negative start counts from the axis's end; the length stays.
                let start = lo.rem_euclid(f.shape[a] as i64);
                (start as u64, (start + hi - lo) as u64)
            })
            .collect();
        let whole = normal
            .iter()
            .zip(field_axes())
            .all(|(&(lo, hi), a)| lo == 0 && hi == f.shape[a]);
        // The stored chunk: the shard on a sharded array.
        let sharded = f.entry.get("shards").is_some();
        let chunks: Vec<u64> = f.entry[if sharded { "shards" } else { "chunks" }]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        let item = item_size(&f.dtype) as u64;
        // Each executor decodes a whole stored chunk into its scratch, larger than its part of
        // a row; a cropped shard only the inner chunks the region touches: at most the slot.
        let scratch = if sharded && !whole {
            chunks[axis] * normal.iter().map(|(lo, hi)| hi - lo).product::<u64>() * item
        } else {
            chunks.iter().product::<u64>() * item
        };
        let tiles = n.div_ceil(chunks[axis]) * tiles_touched(&f, axis, &chunks, &normal);
        for (shuffle, bs) in [(true, 3), (false, 4)] {
            let build = |mode: IntoRows| {
                InSituDataset::builder(&f.store)
                    .sample_axis(axis)
                    .cropped_window_wrapping("v", array, 0, &region)
                    .batch_size(bs)
                    .block_chunks(2)
                    .shuffle(shuffle)
                    .executor_threads(2)
                    .decode_into_batches(mode)
                    .build()
                    .unwrap_or_else(|e| panic!("{case}: {e}"))
            };
            let (rows, pooled) = (build(IntoRows::Always), build(IntoRows::Never));
            assert_eq!(
                rows.variables()[0].geom.region.as_deref(),
                (!whole).then_some(&normal[..]),
                "{case}"
            );
            let (need, pooled_need) = (
                rows.memory_need("train").unwrap(),
                pooled.memory_need("train").unwrap(),
            );
            assert_eq!(
                need.reads,
                pooled_need.reads + 2 * scratch,
                "{case}: {need:?}"
            );
            let (anchors, stats) = check_cropped_epoch(&rows, &["v"], &f, axis, &normal);
            assert_eq!(sorted(anchors), (0..n).collect::<Vec<_>>(), "{case}");
            // Every stored chunk read once, every chunk decoded into its rows: no slot pinned.
            let sample_chunks = n.div_ceil(chunks[axis]);
            assert_eq!(
                (stats.tiles_read, stats.tiles_into_batches),
                (tiles, sample_chunks),
                "{case} {region:?}: {stats:?}"
            );
            assert_eq!(
                (stats.cache_misses, stats.pinned_peak_bytes),
                (sample_chunks, 0)
            );
            // The same batches, in the same order, as through the pool, from the same reads and
            // decodes (a cropped shard's index and inner chunks only, either way): first passes
            // of fresh datasets, whose pools and shard indexes hold nothing yet.
            let batches = |mode: IntoRows| {
                let ds = build(mode);
                ds.set_epoch(1);
                let mut pass = ds.train().unwrap();
                let got: Vec<Vec<u8>> = pass
                    .by_ref()
                    .map(|b| b.unwrap().array("v").unwrap().bytes().to_vec())
                    .collect();
                (got, pass.stats())
            };
            let ((got, s), (want, p)) = (batches(IntoRows::Always), batches(IntoRows::Never));
            assert!(
                got == want,
                "{case} {region:?}: batches differ from the pool path's"
            );
            assert_eq!(s.tiles_into_batches, sample_chunks);
            assert_eq!(
                (s.bytes_read, s.bytes_decoded),
                (p.bytes_read, p.bytes_decoded),
                "{case} {region:?}"
            );
        }
    }
    // A bad chunk's stand-in goes into the rows cropped like the data: with on_bad_chunk
    // "nan", samples 4..8 of t2m (its second stored chunk) are NaN over the region.
    let f = common::fixture("era5_v3", "t2m");
    let dir = common::corrupt_copy(&f, "t2m/c/1/0/0");
    let ds = InSituDataset::builder(dir.path())
        .cropped_window("v", "t2m", 0, &[(2, 7), (3, 11)])
        .on_bad_chunk(insitubatch::OnBadChunk::Nan)
        .decode_into_batches(IntoRows::Always)
        .batch_size(5)
        .build()
        .unwrap();
    let mut pass = ds.train().unwrap();
    let mut nan_rows = Vec::new();
    for b in pass.by_ref() {
        let b = b.unwrap();
        let v = b.array("v").unwrap().values::<f32>().unwrap().to_vec();
        for (r, &i) in b.sample_indices().iter().enumerate() {
            let row = &v[r * 40..(r + 1) * 40];
            if row.iter().all(|x| x.is_nan()) {
                nan_rows.push(i);
            } else {
                assert!(row.iter().all(|x| x.is_finite()), "sample {i} half NaN");
            }
        }
    }
    assert_eq!(sorted(nan_rows), vec![4, 5, 6, 7]);
    // The two good chunks decoded into rows, the bad one listed.
    let s = pass.stats();
    assert_eq!((s.bad_chunks.len(), s.tiles_into_batches), (1, 2), "{s:?}");

    // A field of several stored chunks with one of them bad: only its box of its samples is
    // NaN. v3_inner is 6 x 7 x 9 in chunks of 2 x 3 x 4; chunk (0, 1, 1) holds rows 3..6 and
    // columns 4..8 of samples 0 and 1.
    let f = common::fixture("v3_inner", "");
    let dir = common::corrupt_copy(&f, "c/0/1/1");
    let ds = InSituDataset::builder(dir.path())
        .variable("v", "")
        .on_bad_chunk(insitubatch::OnBadChunk::Nan)
        .decode_into_batches(IntoRows::Always)
        .batch_size(4)
        .build()
        .unwrap();
    let mut pass = ds.train().unwrap();
    for b in pass.by_ref() {
        let b = b.unwrap();
        let v = b.array("v").unwrap().values::<f32>().unwrap().to_vec();
        for (r, &i) in b.sample_indices().iter().enumerate() {
            let want = sample_of(&f.reference, &f.shape, 0, i, 4);
            for (k, got) in v[r * 63..(r + 1) * 63].iter().enumerate() {
                let (y, x) = (k / 9, k % 9);
                if i < 2 && (3..6).contains(&y) && (4..8).contains(&x) {
                    assert!(got.is_nan(), "sample {i} ({y}, {x}) is in the bad chunk");
                } else {
                    let w = f32::from_ne_bytes(want[k * 4..k * 4 + 4].try_into().unwrap());
                    assert_eq!(*got, w, "sample {i} ({y}, {x})");
                }
            }
        }
    }
    let s = pass.stats();
    // 3 sample chunks of 9 stored chunks each, one of them bad: the other two chunks decoded.
    assert_eq!((s.bad_chunks.len(), s.tiles_read), (1, 27), "{s:?}");
    assert_eq!(s.tiles_into_batches, 2, "{s:?}");
}

#[test]
fn coordinate_values_are_the_coordinate_arrays_elements_and_attributes() {
    use insitubatch::coordinate_values;
    use insitubatch::store::DType;
    // The time coordinate is stored in chunks of 5 (the last one partial) without units.
    for case in ["era5_v3", "era5_v2"] {
        let f = fixture(case, "t2m");
        let time = coordinate_values(&f.store, "t2m", None, 0, &[]).unwrap();
        assert_eq!(
            (time.dim.as_str(), time.dtype),
            ("time", DType::Int64),
            "{case}"
        );
        let values: Vec<i64> = time
            .bytes
            .chunks_exact(8)
            .map(|b| i64::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(values, (0..12).map(|t| t * 6).collect::<Vec<_>>(), "{case}");
        assert!(time.attributes.get("units").is_none());
        let j = time.to_json();
        assert_eq!(j["values"][11], 66, "{j}");
        let lat = coordinate_values(&f.store, "u10", Some("latitude"), 0, &[]).unwrap();
        assert_eq!((lat.dtype, lat.bytes.len()), (DType::Float32, 9 * 4));
        assert_eq!(lat.to_json()["values"][0], 90.0);
        let e = coordinate_values(&f.store, "t2m", Some("level"), 0, &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`dimension`") && e.contains("`level` is not a dimension"),
            "{e}"
        );
    }
    // No dimension names: no coordinates to read.
    let e = coordinate_values(&fixture_case("v3_zstd").store, "", None, 0, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("no dimension names"), "{e}");
}

#[test]
fn a_region_in_coordinate_values_is_the_index_region_of_the_values_in_it() {
    use insitubatch::{CoordinateBounds, CoordinateRegion, coordinate_region};
    let bounds = |dim: &str, start: f64, stop: f64, period: Option<f64>| CoordinateBounds {
        dim: dim.into(),
        start,
        stop,
        period,
    };
    // v3 `dimension_names`, and v2 `_ARRAY_DIMENSIONS` without consolidated metadata. Latitude
    // falls from 90 by 22.5° (9), longitude rises from 0 by 22.5° (16).
    for case in ["era5_v3", "era5_v2"] {
        let f = fixture_arrays()
            .into_iter()
            .find(|f| f.case == case && f.array == "t2m")
            .unwrap();
        let europe = [
            bounds("latitude", 67.5, 0.0, None),
            bounds("longitude", -25.0, 45.0, Some(360.0)),
        ];
        let r = coordinate_region(&f.store, "t2m", 0, &europe, &[]).unwrap();
        assert_eq!(
            r,
            CoordinateRegion {
                region: vec![(1, 5), (15, 19)],
                wrap: true
            },
            "{case}"
        );
        // Cropped to it, an epoch is zarr-python's values over those indices.
        let whole = InSituDataset::builder(&f.store)
            .variable("x", "t2m")
            .build()
            .unwrap();
        let cropped = r.crop(&whole.variables()[0].geom).unwrap();
        assert_eq!(cropped.region, Some(vec![(1, 5), (15, 19)]));
        let ds = InSituDataset::builder(&f.store)
            .cropped_window_wrapping("x", "t2m", 0, &r.region)
            .batch_size(5)
            .build()
            .unwrap();
        let (anchors, _) = check_cropped_epoch(&ds, &["x"], &f, 0, &[(1, 5), (15, 19)]);
        assert!(!anchors.is_empty());
        // One axis given, the other whole; no period, no wrap.
        let r = coordinate_region(
            &f.store,
            "t2m",
            0,
            &[bounds("longitude", 50.0, 100.0, None)],
            &[],
        )
        .unwrap();
        assert_eq!(r.region, vec![(0, 9), (3, 5)]);
        assert!(!r.wrap);

        // What it refuses, naming the dimension.
        let err = |b: &[CoordinateBounds], array: &str| {
            coordinate_region(&f.store, array, 0, b, &[])
                .unwrap_err()
                .to_string()
        };
        let e = err(&[bounds("level", 0.0, 1.0, None)], "t2m");
        assert!(
            e.contains("`level` is not a dimension") && e.contains("latitude"),
            "{e}"
        );
        let e = err(&[bounds("time", 0.0, 6.0, None)], "t2m");
        assert!(e.contains("`time` is the sample axis"), "{e}");
        let e = err(&[bounds("latitude", 10.0, 20.0, None)], "t2m");
        assert!(e.contains("no coordinate lies between 10 and 20"), "{e}");
        let e = err(&[bounds("latitude", 0.0, 9.0, None)], "nope");
        assert!(e.contains("`array` = nope") && e.contains("t2m"), "{e}");
        let twice = [
            bounds("latitude", 0.0, 9.0, None),
            bounds("latitude", 0.0, 1.0, None),
        ];
        assert!(err(&twice, "t2m").contains("given twice"));
    }
    // An array whose dimensions have names but no coordinate arrays, and one without names.
    let tczyx = fixture_case("v3_tczyx");
    let e = coordinate_region(
        &tczyx.store,
        &tczyx.array,
        2,
        &[bounds("y", 0.0, 1.0, None)],
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no coordinate array `y`"), "{e}");
    let plain = fixture_case("v2_fill");
    let e = coordinate_region(
        &plain.store,
        &plain.array,
        0,
        &[bounds("y", 0.0, 1.0, None)],
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no dimension names"), "{e}");
}

#[test]
fn inspect_names_each_axis_with_the_ends_of_its_coordinate() {
    let runtime = insitubatch::runtime::RuntimeBuilder::new()
        .executor_threads(1)
        .build()
        .unwrap();
    for case in ["era5_v3", "era5_v2"] {
        let f = fixture_arrays()
            .into_iter()
            .find(|f| f.case == case && f.array == "t2m")
            .unwrap();
        let report =
            insitubatch::inspect::inspect(&runtime.handle(), &f.store, None, 0, &[]).unwrap();
        let t2m = report.variables.iter().find(|v| v.path == "t2m").unwrap();
        let dims: Vec<_> = t2m
            .dimensions
            .as_ref()
            .unwrap()
            .iter()
            .map(|d| (d.name.as_str(), d.length, d.coordinate))
            .collect();
        // Time is stored in chunks of 5: its last value comes from the third, partial one.
        assert_eq!(
            dims,
            [
                ("time", 12, Some((0.0, 66.0))),
                ("latitude", 9, Some((90.0, -90.0))),
                ("longitude", 16, Some((0.0, 337.5))),
            ],
            "{case}"
        );
    }
}
