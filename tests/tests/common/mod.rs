//! Helpers shared by the engine and cache tests.
#![allow(dead_code, reason = "each test binary uses its own subset")]

use insitubatch::InSituDataset;
use insitubatch_tests::{FixtureArray, fixture_arrays, item_size, sample_of};

/// A copy of `f`'s store in a new directory with its stored chunk `chunk_file` (a key under
/// the store) overwritten with bytes no codec decodes; the directory lives as long as the guard.
pub fn corrupt_copy(f: &FixtureArray, chunk_file: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    insitubatch_tests::copy_dir(&f.store, dir.path());
    std::fs::write(dir.path().join(chunk_file), b"this is not zstd").unwrap();
    dir
}

pub fn fixture(case: &str, array: &str) -> FixtureArray {
    fixture_arrays()
        .into_iter()
        .find(|f| f.case == case && f.array == array)
        .unwrap_or_else(|| panic!("fixture {case}/{array}"))
}

pub fn sample_axis_of(f: &FixtureArray) -> usize {
    if f.case == "v3_tczyx" { 2 } else { 0 }
}

/// Runs one epoch of `split`, checks every sample of every label against zarr-python, and
/// returns the anchors in emission order.
pub fn check_epoch(
    ds: &InSituDataset,
    split: &str,
    refs: &[(&str, &FixtureArray, usize)],
) -> Vec<u64> {
    check_pass(ds, ds.iter(split).unwrap(), split, refs).0
}

/// [`check_epoch`] of a pass already started; the anchors and the pass's stats.
pub fn check_pass(
    ds: &InSituDataset,
    pass: insitubatch::Pass,
    split: &str,
    refs: &[(&str, &FixtureArray, usize)],
) -> (Vec<u64>, insitubatch::PassStats) {
    let mut anchors = Vec::new();
    let mut n_batches = 0;
    let bound = pass.read_ahead_bytes();
    let mut pass = pass;
    for batch in pass.by_ref() {
        let batch = batch.unwrap();
        assert!(batch.len() <= ds.batch_size());
        for (label, f, axis) in refs {
            let arr = batch.array(label).unwrap();
            let item = item_size(&f.dtype);
            let inner: Vec<usize> = (0..f.shape.len())
                .filter(|a| a != axis)
                .map(|a| f.shape[a] as usize)
                .collect();
            let mut shape = vec![batch.len()];
            shape.extend(&inner);
            assert_eq!(arr.shape(), &shape[..], "{label}");
            let sb: usize = inner.iter().product::<usize>() * item;
            for (r, idx) in batch.read_indices(label).unwrap().into_iter().enumerate() {
                let want = sample_of(&f.reference, &f.shape, *axis, idx, item);
                assert!(
                    arr.bytes()[r * sb..(r + 1) * sb] == want[..],
                    "{}/{} label {label} sample {idx} differs from zarr-python",
                    f.case,
                    f.array
                );
            }
        }
        anchors.extend_from_slice(batch.sample_indices());
        n_batches += 1;
    }
    let stats = pass.stats();
    assert_eq!(stats.batches, n_batches);
    assert_eq!(n_batches as usize, anchors.len().div_ceil(ds.batch_size()));
    // What `len()` of a loader promises, known before the epoch runs.
    assert_eq!(ds.split_samples(split).unwrap(), anchors.len() as u64);
    assert_eq!(ds.split_batches(split).unwrap(), n_batches);
    // Chunks decoded straight into batch rows pin nothing; anything else pins its slots.
    assert!(
        stats.pinned_peak_bytes <= bound
            && (stats.pinned_peak_bytes > 0 || stats.tiles_into_batches == stats.tiles_read),
        "pinned peak {} over the computed bound {bound}: {stats:?}",
        stats.pinned_peak_bytes
    );
    assert!(stats.resident_peak_bytes <= stats.budget_bytes, "{stats:?}");
    (anchors, stats)
}

/// Runs one epoch of `split` to its end (every batch must arrive) and returns its stats.
pub fn run(ds: &InSituDataset, split: &str) -> insitubatch::PassStats {
    let mut pass = ds.iter(split).unwrap();
    for b in pass.by_ref() {
        b.unwrap();
    }
    pass.stats()
}

pub fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

/// A synthetic ERA5-like store made by `insitubatch::synth` from `spec`, in a temporary directory
/// that lives as long as the returned guard.
pub fn synth_store(
    spec: &insitubatch::synth::SynthSpec,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.zarr");
    insitubatch::synth::make_dataset(&store, spec, false, &|_, _| {}).unwrap();
    (dir, store)
}

/// The byte range of inner chunk `i` (C order over the shard's inner grid) in a shard file whose
/// index (`n` entries of little-endian offset and length, then a crc32c) is at its end.
pub fn inner_chunk_bytes(shard: &[u8], n: usize, i: usize) -> std::ops::Range<usize> {
    let index = &shard[shard.len() - (n * 16 + 4)..shard.len() - 4];
    let word = |k: usize| u64::from_le_bytes(index[k * 8..k * 8 + 8].try_into().unwrap()) as usize;
    let (offset, len) = (word(2 * i), word(2 * i + 1));
    offset..offset + len
}
