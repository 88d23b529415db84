//! Chunk transforms against zarr-python fixtures: every emitted sample equals zarr-python's
//! value with the transform applied, on every slot layout (an adopted tile, an assembled
//! inner-chunked field, a sample axis that is not first), scoped by array path; `fill_nan`
//! repairs the hole `on_bad_chunk = "nan"` leaves; a persisted cache holds transformed chunks and
//! goes stale, per array, when a transform's parameters change.

use std::path::Path;

use insitubatch::DType;
use insitubatch::transform::{Affine, Cast, Clip, Coarsen, FillNan, Standardize};
use insitubatch::{InSituDataset, OnBadChunk};
use insitubatch_tests::FixtureArray;

mod common;
use common::{check_epoch, fixture, sample_axis_of};

/// The fixture with `op(index along inner axis `axis`, x)` applied to every element (inner axes
/// count after the sample axis is taken out), as the expected values of a transformed pass.
fn transformed<T: Copy>(
    f: &FixtureArray,
    axis: Option<usize>,
    read: fn(&[u8]) -> T,
    write: fn(T) -> Vec<u8>,
    op: impl Fn(usize, T) -> T,
) -> FixtureArray {
    let sample_axis = sample_axis_of(f);
    let item = std::mem::size_of::<T>();
    // The physical axis that inner axis `axis` is.
    let physical = axis.map(|a| {
        (0..f.shape.len())
            .filter(|&d| d != sample_axis)
            .nth(a)
            .unwrap()
    });
    let stride: usize = physical.map_or(1, |p| f.shape[p + 1..].iter().product::<u64>() as usize);
    let len = physical.map_or(1, |p| f.shape[p] as usize);
    let mut out = f.clone();
    out.reference = f
        .reference
        .chunks_exact(item)
        .enumerate()
        .flat_map(|(i, b)| write(op((i / stride) % len, read(b))))
        .collect();
    out
}

fn f32_of(b: &[u8]) -> f32 {
    f32::from_le_bytes(b.try_into().unwrap())
}
fn f32_bytes(x: f32) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}
fn f64_of(b: &[u8]) -> f64 {
    f64::from_le_bytes(b.try_into().unwrap())
}
fn f64_bytes(x: f64) -> Vec<u8> {
    x.to_le_bytes().to_vec()
}

fn build_err(b: insitubatch::DatasetBuilder) -> String {
    b.build().unwrap_err().to_string()
}

#[test]
fn transformed_batches_equal_zarr_python_with_the_transform_applied() {
    // Adopted tiles, two arrays, a transform scoped to one of them, and a window over it: both
    // labels of t2m see the transformed chunk, u10 stays as stored.
    let t = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let t_want = transformed(&t, None, f32_of, f32_bytes, |_, x| {
        x * 1.0f32 + (-273.15f64) as f32
    });
    for shuffle in [true, false] {
        let ds = InSituDataset::builder(&t.store)
            .variable("x", "t2m")
            .window("y", "t2m", 2)
            .variable("u", "u10")
            .batch_size(5)
            .block_chunks(2)
            .shuffle(shuffle)
            .chunk_transform_for(["t2m"], Affine::new(1.0, -273.15).unwrap())
            .build()
            .unwrap();
        check_epoch(
            &ds,
            "train",
            &[("x", &t_want, 0), ("y", &t_want, 0), ("u", &u, 0)],
        );
    }

    // An inner-chunked field, assembled from six tiles per slot; per-level statistics along
    // the first inner axis (7 indices), declared in JSON.
    let f = fixture("v3_inner", "");
    let mean: Vec<f64> = (0..7).map(|i| 270.0 + f64::from(i)).collect();
    let std: Vec<f64> = (0..7).map(|i| 1.5 + 0.25 * f64::from(i)).collect();
    let want = transformed(&f, Some(0), f32_of, f32_bytes, |i, x| {
        (x - mean[i] as f32) / std[i] as f32
    });
    let json = serde_json::json!([{"type": "standardize", "mean": mean, "std": std, "axis": 0}]);
    let ds = InSituDataset::builder(&f.store)
        .variable("v", "")
        .batch_size(4)
        .chunk_transforms_json(json.to_string())
        .build()
        .unwrap();
    check_epoch(&ds, "train", &[("v", &want, 0)]);

    // Sampled along Z (axis 2): the slot is [z, t, c, y, x] and inner axis 1 is the channel.
    let f = fixture("v3_tczyx", "");
    let want = transformed(&f, Some(1), f32_of, f32_bytes, |c, x| {
        x * [2.0f32, -0.5][c] + [1.0f32, 3.0][c]
    });
    let ds = InSituDataset::builder(&f.store)
        .variable("v", "")
        .sample_axis(2)
        .batch_size(4)
        .chunk_transform(Affine {
            scale: vec![2.0, -0.5].into(),
            offset: vec![1.0, 3.0].into(),
            axis: Some(1),
        })
        .build()
        .unwrap();
    check_epoch(&ds, "train", &[("v", &want, 2)]);

    // float64, two steps in order: clip, then standardise (the reverse gives other numbers).
    let f = fixture("v3_zstd", "");
    let want = transformed(&f, None, f64_of, f64_bytes, |_, x| {
        (x.clamp(280.0, 290.0) - 285.0) / 2.0
    });
    let ds = InSituDataset::builder(&f.store)
        .variable("v", "")
        .batch_size(3)
        .chunk_transform(Clip::new(280.0, 290.0).unwrap())
        .chunk_transform(Standardize::new(285.0, 2.0).unwrap())
        .build()
        .unwrap();
    check_epoch(&ds, "all", &[("v", &want, 0)]);
    // The fixture's values (280 ± 60) straddle the clip bounds, so the clip did something.
    let raw: Vec<f64> = f.reference.chunks_exact(8).map(f64_of).collect();
    assert!(raw.iter().any(|x| *x < 280.0) && raw.iter().any(|x| *x > 290.0));
}

#[test]
fn fill_nan_repairs_the_hole_a_bad_tile_leaves() {
    // One of the six tiles of sample chunk 1 is corrupt: the slot assembles with a NaN
    // rectangle, and fill_nan turns it into -1 before the slot is ready.
    let f = fixture("v3_inner", "");
    let dir = common::corrupt_copy(&f, "c/1/0/0");
    let ds = InSituDataset::builder(dir.path())
        .variable("v", "")
        .batch_size(6)
        .on_bad_chunk(OnBadChunk::Nan)
        .chunk_transform(FillNan::new(-1.0))
        .build()
        .unwrap();
    let mut pass = ds.all().unwrap();
    let batch = pass.next().unwrap().unwrap();
    assert!(pass.next().is_none());
    let got: &[f32] = batch.array("v").unwrap().values().unwrap();
    let (ny, nx) = (7usize, 9usize);
    for s in 0..6usize {
        for y in 0..ny {
            for x in 0..nx {
                let i = (s * ny + y) * nx + x;
                // Tile c/1/0/0: samples 2..4, y 0..3, x 0..4.
                let want = if (2..4).contains(&s) && y < 3 && x < 4 {
                    -1.0
                } else {
                    f32_of(&f.reference[i * 4..i * 4 + 4])
                };
                assert_eq!(got[i], want, "sample {s} y {y} x {x}");
            }
        }
    }
    let bad = pass.stats().bad_chunks;
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].key, "c/1/0/0");
}

fn era5(store: &Path, cache: &Path, t_offset: f64) -> insitubatch::DatasetBuilder {
    InSituDataset::builder(store)
        .variable("t", "t2m")
        .variable("u", "u10")
        .batch_size(5)
        .block_chunks(2)
        .cache_dir(cache)
        .persist(true)
        .chunk_transform_for(["t2m"], Affine::new(1.0, t_offset).unwrap())
        .chunk_transform(Clip::new(-1e9, 1e9).unwrap())
}

#[test]
fn a_persisted_cache_holds_transformed_chunks_and_goes_stale_per_array() {
    let t = fixture("era5_v3", "t2m");
    let u = fixture("era5_v3", "u10");
    let cache = tempfile::tempdir().unwrap();
    let shifted = |off: f64| transformed(&t, None, f32_of, f32_bytes, move |_, x| x + off as f32);
    {
        let ds = era5(&t.store, cache.path(), -273.15).build().unwrap();
        check_epoch(&ds, "all", &[("t", &shifted(-273.15), 0), ("u", &u, 0)]);
    }
    // The same transforms: every chunk revives, transformed, and nothing is decoded.
    {
        let ds = era5(&t.store, cache.path(), -273.15).build().unwrap();
        let mut pass = ds.all().unwrap();
        for b in pass.by_ref() {
            b.unwrap();
        }
        let s = pass.stats();
        drop(pass);
        assert_eq!((s.cache_misses, s.bytes_decoded), (0, 0), "{s:?}");
        check_epoch(&ds, "all", &[("t", &shifted(-273.15), 0), ("u", &u, 0)]);
    }
    // Another offset for t2m: t2m is stale (named), u10 is not.
    let msg = build_err(era5(&t.store, cache.path(), -273.0));
    assert!(
        msg.contains("[t2m]") && !msg.contains("u10") && msg.contains("reset_stale_cache"),
        "{msg}"
    );
    // Reset rebuilds t2m with the new offset and revives u10 as it was.
    let ds = era5(&t.store, cache.path(), -273.0)
        .reset_stale_cache(true)
        .build()
        .unwrap();
    let mut pass = ds.all().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    let s = pass.stats();
    drop(pass);
    assert_eq!((s.cache_revived, s.cache_misses), (3, 3), "{s:?}");
    check_epoch(&ds, "all", &[("t", &shifted(-273.0), 0), ("u", &u, 0)]);
}

#[test]
fn transforms_that_cannot_apply_are_refused_naming_the_array() {
    let t = fixture("era5_v3", "t2m");
    let b = || {
        InSituDataset::builder(&t.store)
            .variable("x", "t2m")
            .variable("y", "u10")
    };
    let msg = build_err(b().chunk_transform_for(["x"], FillNan::new(0.0)));
    assert!(msg.contains("`x`") && msg.contains("not labels"), "{msg}");
    let msg = build_err(b().chunk_transforms_json(r#"[{"type": "log"}]"#));
    assert!(msg.contains("unknown transform type `log`"), "{msg}");
    // Inner shape (9, 16): a list along axis 1 needs 16 values.
    let msg = build_err(
        b().chunk_transform(Standardize::per_index(Some(1), vec![0.0; 9], vec![1.0; 9]).unwrap()),
    );
    assert!(msg.contains("inner axis 1 has 16"), "{msg}");
    // An int16 array.
    let f = fixture("v3_v2keys", "");
    let msg = build_err(
        InSituDataset::builder(&f.store)
            .variable("v", "")
            .chunk_transform(Affine::new(2.0, 0.0).unwrap()),
    );
    assert!(
        msg.contains("int16") && msg.contains("chunk_transforms"),
        "{msg}"
    );
}

#[test]
fn reshaping_transforms_size_batches_slots_and_cache_files_by_their_output() {
    // int16 (9, 5, 7) in (4, 3, 7) chunks: each slot assembles two tiles; cast to float32, then
    // 2 x 3 block means over (5, 7) -> (2, 2), then a scale. Batches are (n, 2, 2) float32.
    let f = fixture("v2_zstd_slash", "");
    let raw: Vec<i16> = f
        .reference
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mean = |s: usize, oy: usize, ox: usize| -> f32 {
        let mut sum = 0f64;
        for y in oy * 2..oy * 2 + 2 {
            for x in ox * 3..ox * 3 + 3 {
                sum += f64::from(raw[(s * 5 + y) * 7 + x] as f32);
            }
        }
        (sum / 6.0) as f32 * 0.5
    };
    let mut want = f.clone();
    want.shape = vec![9, 2, 2];
    want.dtype = "float32".into();
    want.reference = (0..9)
        .flat_map(|s| (0..4).map(move |o| (s, o / 2, o % 2)))
        .flat_map(|(s, oy, ox)| mean(s, oy, ox).to_le_bytes())
        .collect();
    let cache = tempfile::tempdir().unwrap();
    let build = || {
        InSituDataset::builder(&f.store)
            .variable("v", "")
            .window("w", "", 1)
            .batch_size(4)
            .cache_dir(cache.path())
            .persist(true)
            .chunk_transform(Cast::new(DType::Float32).unwrap())
            .chunk_transform(Coarsen::new(vec![2, 3]).unwrap())
            .chunk_transform(Affine::new(0.5, 0.0).unwrap())
            .build()
            .unwrap()
    };
    {
        let ds = build();
        let v = &ds.variables()[0];
        assert_eq!(
            (&v.sample_inner[..], v.sample_dtype),
            (&[2u64, 2][..], DType::Float32)
        );
        check_epoch(&ds, "train", &[("v", &want, 0), ("w", &want, 0)]);
    }
    // The cache files hold the output: [4, 2, 2] float32, and revive with nothing decoded.
    let log = std::fs::read_to_string(cache.path().join("insitu_cache.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = log
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(entries.len(), 3, "{log}");
    for e in &entries {
        assert_eq!(e["shape"], serde_json::json!([4, 2, 2]), "{e}");
        assert_eq!(e["dtype"], "<f4", "{e}");
    }
    let ds = build();
    let mut pass = ds.all().unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    let s = pass.stats();
    drop(pass);
    assert_eq!((s.cache_misses, s.bytes_decoded), (0, 0), "{s:?}");
    check_epoch(&ds, "all", &[("v", &want, 0)]);
}

/// Declares that it keeps the chunk as it is, then doubles it: a user's transform with a bug.
#[derive(Debug)]
struct BrokenPromise;

impl insitubatch::ChunkTransform for BrokenPromise {
    fn kind(&self) -> &'static str {
        "broken_promise"
    }
    fn identity(&self) -> String {
        "broken_promise".into()
    }
    fn output(&self, inner: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        Ok((inner.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut insitubatch::transform::Chunk) -> Result<(), String> {
        let copy = chunk.bytes.clone();
        chunk.bytes.extend(copy);
        Ok(())
    }
}

#[test]
fn a_transform_that_breaks_its_promise_ends_the_pass_naming_it() {
    // Both delivery paths: an adopted tile (era5) and a chunk assembled from tiles (v3_inner).
    for (case, array) in [("era5_v3", "t2m"), ("v3_inner", "")] {
        let f = fixture(case, array);
        let ds = InSituDataset::builder(&f.store)
            .variable("v", array)
            .batch_size(2)
            .chunk_transform(BrokenPromise)
            .build()
            .unwrap();
        let err = ds
            .all()
            .unwrap()
            .find_map(|b| b.err())
            .expect("the broken transform must surface as an error");
        let msg = err.to_string();
        assert!(
            msg.contains("broken_promise") && msg.contains("promised") && msg.contains("chunk"),
            "{case}: {msg}"
        );
        // The dataset stays usable: nothing is left pinned or half-loaded.
        let p = ds.pool_stats();
        assert_eq!((p.pinned_slots, p.reserved_bytes), (0, 0), "{case}: {p:?}");
    }
}

#[test]
fn json_and_typed_transforms_run_in_the_order_the_builder_was_given_them() {
    // JSON first, then a typed clip: clip(x - 273.15). The other order would clip the kelvins
    // to 10 first and give -263.15 everywhere.
    let t = fixture("era5_v3", "t2m");
    let want = transformed(&t, None, f32_of, f32_bytes, |_, x| {
        (x + (-273.15f64) as f32).clamp(-10.0, 10.0)
    });
    let ds = InSituDataset::builder(&t.store)
        .variable("t", "t2m")
        .batch_size(4)
        .chunk_transforms_json(r#"[{"type": "affine", "offset": -273.15}]"#)
        .chunk_transform(Clip::new(-10.0, 10.0).unwrap())
        .build()
        .unwrap();
    check_epoch(&ds, "all", &[("t", &want, 0)]);
    // The clip bites on both sides for these values, so the order is visible.
    let raw: Vec<f32> = t.reference.chunks_exact(4).map(f32_of).collect();
    assert!(raw.iter().any(|x| x - 273.15 < -10.0) && raw.iter().any(|x| x - 273.15 > 10.0));
}

/// Records which chunks of which arrays it is shown, and refuses chunk 2 of `u10`.
#[derive(Debug, Default)]
struct Recorder {
    seen: std::sync::Mutex<Vec<(String, u64, Vec<u64>)>>,
}

impl insitubatch::ChunkTransform for Recorder {
    fn kind(&self) -> &'static str {
        "recorder"
    }
    fn identity(&self) -> String {
        "recorder".into()
    }
    fn output(&self, inner: &[u64], dtype: DType) -> Result<(Vec<u64>, DType), String> {
        Ok((inner.to_vec(), dtype))
    }
    fn apply(&self, chunk: &mut insitubatch::transform::Chunk) -> Result<(), String> {
        let entry = (chunk.array.clone(), chunk.index, chunk.shape.clone());
        self.seen.lock().unwrap().push(entry);
        if chunk.array == "u10" && chunk.index == 2 {
            return Err("u10 chunk 2 is not wanted".into());
        }
        Ok(())
    }
}

#[test]
fn a_transform_is_shown_each_chunks_array_and_index_and_its_error_ends_the_pass() {
    let f = fixture("era5_v3", "t2m");
    let recorder = std::sync::Arc::new(Recorder::default());
    // One read at a time, so chunks are decoded in plan order: t2m's chunk 0 is transformed
    // before u10's chunk 2 fails the pass. (With reads in parallel a loaded machine could decode
    // u10's chunk 2 first, and the pass would end before t2m's chunk 0 was seen.)
    let ds = InSituDataset::builder(&f.store)
        .variable("t", "t2m")
        .variable("u", "u10")
        .batch_size(4)
        .shuffle(false)
        .max_inflight(1)
        .chunk_transforms(&{
            let mut list = insitubatch::transform::ChunkTransforms::default();
            list.push(None, recorder.clone());
            list
        })
        .build()
        .unwrap();
    let mut pass = ds.all().unwrap();
    let err = pass
        .by_ref()
        .find_map(|b| b.err())
        .expect("the refused chunk must end the pass");
    assert!(
        matches!(err, insitubatch::EngineError::Transform(_)),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("u10 chunk 2 is not wanted")
            && msg.contains("array `u10`")
            && msg.contains("recorder failed"),
        "{msg}"
    );
    assert!(pass.next().is_none(), "the pass ends after its error");
    drop(pass);
    let mut seen = recorder.seen.lock().unwrap().clone();
    seen.sort();
    seen.dedup();
    // Every chunk the pass got to, with its own array and index and the chunk's full shape.
    for (array, index, shape) in &seen {
        assert!(array == "t2m" || array == "u10", "{array}");
        assert!(*index < 3, "{array} chunk {index}");
        assert_eq!(shape, &vec![4, 9, 16], "{array} chunk {index}");
    }
    assert!(seen.iter().any(|(a, i, _)| a == "u10" && *i == 2));
    assert!(seen.iter().any(|(a, i, _)| a == "t2m" && *i == 0));
    let p = ds.pool_stats();
    assert_eq!((p.pinned_slots, p.reserved_bytes), (0, 0), "{p:?}");
}
