//! Statistics of a split (`InSituDataset::statistics`, `StatisticsAccumulator`): each batch
//! array's count, mean, standard deviation, min and max equal those of zarr-python's values at
//! the samples the split yields, whole or per index along an inner axis, for windows, stacks
//! and NaN left by bad chunks; bad requests are errors naming the argument.

use insitubatch::{InSituDataset, OnBadChunk, Statistics, StatisticsAccumulator, split_by_chunk};

mod common;
use common::{corrupt_copy, fixture};

/// zarr-python's float32 values of a fixture array, in C order.
fn values(f: &insitubatch_tests::FixtureArray) -> Vec<f64> {
    assert_eq!(f.dtype, "float32", "{}", f.array);
    f.reference
        .chunks_exact(4)
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect()
}

/// The statistics of `samples` (indices along axis 0 of an array of `shape`) per index along
/// inner axis `axis`, in two passes in f64: the reference the library is held to.
fn reference(vals: &[f64], shape: &[u64], samples: &[u64], axis: Option<usize>) -> Statistics {
    reference_with(vals, shape, samples, axis, &[])
}

/// [`reference`] with the quantiles at probabilities `quantiles`, numpy's default: linear
/// between the sorted values around `q * (n - 1)`.
fn reference_with(
    vals: &[f64],
    shape: &[u64],
    samples: &[u64],
    axis: Option<usize>,
    quantiles: &[f64],
) -> Statistics {
    let inner: Vec<usize> = shape[1..].iter().map(|&d| d as usize).collect();
    let per_sample: usize = inner.iter().product();
    let (len, after) = match axis {
        None => (1, per_sample),
        Some(k) => (inner[k], inner[k + 1..].iter().product()),
    };
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); len];
    for &s in samples {
        let sample = &vals[s as usize * per_sample..(s as usize + 1) * per_sample];
        for (i, v) in sample.iter().enumerate() {
            groups[(i / after) % len].push(*v);
        }
    }
    let mut st = Statistics {
        axis,
        count: vec![],
        nan_count: vec![],
        mean: vec![],
        std: vec![],
        min: vec![],
        max: vec![],
        quantiles: quantiles.to_vec(),
        quantile_values: vec![],
    };
    for g in groups {
        let ok: Vec<f64> = g.iter().copied().filter(|v| !v.is_nan()).collect();
        if !quantiles.is_empty() {
            let mut sorted = ok.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |q: f64| {
                let h = q * (sorted.len() - 1) as f64;
                let (lo, frac) = (h.floor() as usize, h - h.floor());
                match sorted.get(lo + 1) {
                    Some(next) if frac > 0.0 => sorted[lo] + (next - sorted[lo]) * frac,
                    _ => sorted[lo],
                }
            };
            st.quantile_values
                .push(quantiles.iter().map(|&q| at(q)).collect());
        }
        let n = ok.len() as f64;
        let mean = ok.iter().sum::<f64>() / n;
        st.count.push(ok.len() as u64);
        st.nan_count.push((g.len() - ok.len()) as u64);
        st.mean.push(mean);
        st.std
            .push((ok.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt());
        st.min
            .push(ok.iter().copied().fold(f64::INFINITY, f64::min));
        st.max
            .push(ok.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    }
    st
}

fn assert_close(got: &Statistics, want: &Statistics, what: &str) {
    assert_eq!(
        (got.axis, &got.count, &got.nan_count),
        (want.axis, &want.count, &want.nan_count),
        "{what}"
    );
    for (name, g, w) in [
        ("mean", &got.mean, &want.mean),
        ("std", &got.std, &want.std),
        ("min", &got.min, &want.min),
        ("max", &got.max, &want.max),
    ] {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                "{what} {name}: {g:?} against {w:?}"
            );
        }
    }
    // Quantiles within a bucket of the sketch: 1/256 of the value.
    assert_eq!(got.quantiles, want.quantiles, "{what}");
    assert_eq!(
        got.quantile_values.len(),
        want.quantile_values.len(),
        "{what}"
    );
    for (g, w) in got.quantile_values.iter().zip(&want.quantile_values) {
        assert_eq!(g.len(), w.len(), "{what}");
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() <= b.abs() / 256.0 + 1e-12,
                "{what} quantiles: {g:?} against {w:?}"
            );
        }
    }
}

#[test]
fn quantiles_of_a_split_are_numpys_of_zarr_pythons_values_within_a_bucket() {
    let t2m = fixture("era5_v3", "t2m");
    let u10 = fixture("era5_v3", "u10");
    let ds = InSituDataset::builder(&t2m.store)
        .variable("x", "t2m")
        .variable("u", "u10")
        .batch_size(3)
        .build()
        .unwrap();
    let qs = [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0];
    let anchors = ds.order("train").unwrap().anchors();
    for axis in [None, Some(0)] {
        let got = ds.statistics_with_quantiles("train", axis, &qs).unwrap();
        let what = format!("axis {axis:?}");
        for (label, f) in [("x", &t2m), ("u", &u10)] {
            let want = reference_with(&values(f), &f.shape, &anchors, axis, &qs);
            assert_close(&got[label], &want, &what);
            // The least and greatest are exact.
            for (v, (min, max)) in got[label]
                .quantile_values
                .iter()
                .zip(want.min.iter().zip(&want.max))
            {
                assert_eq!((v[0], v[qs.len() - 1]), (*min, *max), "{what}");
            }
        }
        let json = StatisticsAccumulator::new(&ds, axis)
            .unwrap()
            .with_quantiles(&qs)
            .unwrap()
            .to_json();
        assert_eq!(json["x"]["quantiles"].as_array().unwrap().len(), qs.len());
    }
    // Without quantiles nothing is kept, and the JSON has no such keys.
    let plain = ds.statistics("train", None).unwrap();
    assert!(plain["x"].quantiles.is_empty() && plain["x"].quantile_values.is_empty());
    let json = StatisticsAccumulator::new(&ds, None).unwrap().to_json();
    assert!(json["x"].get("quantiles").is_none(), "{json}");
    // A probability out of range, or too many, is refused by name.
    for bad in [vec![1.5], vec![-0.1], vec![f64::NAN], vec![0.5; 65]] {
        let e = ds
            .statistics_with_quantiles("train", None, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`quantiles`"), "{bad:?}: {e}");
    }
}

#[test]
fn statistics_of_a_split_are_those_of_zarr_pythons_values_at_its_samples() {
    let t2m = fixture("era5_v3", "t2m");
    let u10 = fixture("era5_v3", "u10");
    let probe = InSituDataset::builder(&t2m.store)
        .variable("x", "t2m")
        .build()
        .unwrap();
    let halves = split_by_chunk(&probe.variables()[0].geom, &[0.5, 0.5], 0, true, None).unwrap();
    let ds = InSituDataset::builder(&t2m.store)
        .variable("x", "t2m")
        .window("y", "t2m", 2)
        .variable("u", "u10")
        .manifest(halves)
        .batch_size(3)
        .build()
        .unwrap();
    for split in ["train", "val"] {
        let anchors = ds.order(split).unwrap().anchors();
        let later: Vec<u64> = anchors.iter().map(|a| a + 2).collect();
        for axis in [None, Some(0), Some(1)] {
            let got = ds.statistics(split, axis).unwrap();
            let what = format!("{split} axis {axis:?}");
            let (tv, uv) = (values(&t2m), values(&u10));
            assert_close(
                &got["x"],
                &reference(&tv, &t2m.shape, &anchors, axis),
                &what,
            );
            assert_close(&got["y"], &reference(&tv, &t2m.shape, &later, axis), &what);
            assert_close(
                &got["u"],
                &reference(&uv, &u10.shape, &anchors, axis),
                &what,
            );
        }
    }
    // An array whose samples lack the axis (a station series beside fields) is taken whole.
    let mixed = InSituDataset::builder(&t2m.store)
        .variable("x", "t2m")
        .variable("station", "station")
        .build()
        .unwrap();
    let got = mixed.statistics("all", Some(1)).unwrap();
    assert_eq!((got["x"].axis, got["x"].count.len()), (Some(1), 16));
    let station = fixture("era5_v3", "station");
    let all: Vec<u64> = (0..12).collect();
    let want = reference(&values(&station), &station.shape, &all, None);
    assert_close(&got["station"], &want, "a scalar series");
    // An axis no array's samples have is refused by name.
    let e = ds.statistics("train", Some(2)).unwrap_err().to_string();
    assert!(e.contains("`axis`") && e.contains("2 axes"), "{e}");
}

#[test]
fn a_stacks_channels_have_its_labels_statistics_and_nan_is_counted_apart() {
    let t2m = fixture("era5_v3", "t2m");
    let stacked = InSituDataset::builder(&t2m.store)
        .variable("t2m", "t2m")
        .variable("u10", "u10")
        .stack("s", ["u10", "t2m"])
        .build()
        .unwrap();
    let own = InSituDataset::builder(&t2m.store)
        .variable("t2m", "t2m")
        .variable("u10", "u10")
        .build()
        .unwrap();
    let per_channel = &stacked.statistics("train", Some(0)).unwrap()["s"];
    let whole = own.statistics("train", None).unwrap();
    for (channel, label) in ["u10", "t2m"].into_iter().enumerate() {
        let w = &whole[label];
        assert_eq!(per_channel.count[channel], w.count[0], "{label}");
        assert!((per_channel.mean[channel] - w.mean[0]).abs() < 1e-9 * w.mean[0].abs());
        assert!((per_channel.std[channel] - w.std[0]).abs() < 1e-9 * w.std[0]);
    }
    // A corrupt chunk (samples 4..8) under on_bad_chunk = nan: its values are NaN, counted
    // apart, and the rest are the other samples' statistics.
    let dir = corrupt_copy(&t2m, "t2m/c/1/0/0");
    let ds = InSituDataset::builder(dir.path())
        .variable("t2m", "t2m")
        .on_bad_chunk(OnBadChunk::Nan)
        .build()
        .unwrap();
    let got = &ds.statistics("all", None).unwrap()["t2m"];
    let rest: Vec<u64> = (0..4).chain(8..12).collect();
    let mut want = reference(&values(&t2m), &t2m.shape, &rest, None);
    want.nan_count = vec![4 * 9 * 16];
    assert_close(got, &want, "with a NaN chunk");
    // Per longitude (runs of one value, summed per index over each batch) and per latitude
    // (runs of 16), NaN counted apart the same way.
    let mut holes = values(&t2m);
    holes[4 * 144..8 * 144].fill(f64::NAN);
    let all: Vec<u64> = (0..12).collect();
    for axis in [Some(1), Some(0)] {
        let got = &ds.statistics("all", axis).unwrap()["t2m"];
        let want = reference(&holes, &t2m.shape, &all, axis);
        assert_close(got, &want, &format!("NaN chunk, axis {axis:?}"));
    }
}

#[test]
fn an_accumulator_takes_only_batches_of_its_dataset() {
    let t2m = fixture("era5_v3", "t2m");
    let ds = InSituDataset::builder(&t2m.store)
        .variable("t2m", "t2m")
        .build()
        .unwrap();
    let other = InSituDataset::builder(&t2m.store)
        .variable("x", "t2m")
        .build()
        .unwrap();
    let mut acc = StatisticsAccumulator::new(&ds, None).unwrap();
    let foreign = other.iter("train").unwrap().next().unwrap().unwrap();
    let e = acc.add(&foreign).unwrap_err().to_string();
    assert!(e.contains("`batch`") && e.contains("x"), "{e}");
    assert_eq!(acc.finish()["t2m"].count, vec![0], "nothing added");
    for batch in ds.iter("train").unwrap() {
        acc.add(&batch.unwrap()).unwrap();
    }
    assert_eq!(acc.finish(), ds.statistics("train", None).unwrap());
    let json = acc.to_json();
    assert_eq!(json["t2m"]["count"][0], 12 * 9 * 16);
    assert!(json["t2m"]["axis"].is_null());
}
