//! Chunk-aligned, leakage-safe splits: [`split_by_chunk`] (by fractions of the chunks),
//! [`split_by_ranges`] (by sample ranges, such as years) and the [`SplitManifest`].

use std::collections::BTreeMap;
use std::path::Path;

use insitubatch_store::{ArrayGeometry, array_label};
use serde::{Deserialize, Serialize};

use crate::error::EngineError;
use crate::rng::Rng;

/// Names of the splits `fractions` fill, in order.
pub const SPLIT_NAMES: [&str; 3] = ["train", "val", "test"];

/// Manifest format written by this version.
pub const MANIFEST_FORMAT: u32 = 1;

/// Stream tag for the non-contiguous chunk shuffle, so it never correlates with epoch orders.
const SPLIT_STREAM: u64 = 0x0053_504c_4954; // "SPLIT"

/// Which sample-axis chunks belong to each split, for one reference array. Whole chunks only,
/// so no sample straddles two splits. Round-trips through JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitManifest {
    /// Format version.
    pub format: u32,
    /// Reference array path: the anchor grid is this array's chunking along its sample axis.
    pub array: String,
    /// Its physical shape.
    pub shape: Vec<u64>,
    /// Its stored-chunk shape.
    pub chunks: Vec<u64>,
    /// Its sample axis.
    pub sample_axis: usize,
    /// The half-open sample range the split was drawn from (snapped out to whole chunks).
    pub sample_range: [u64; 2],
    /// Seed used when `contiguous` is false.
    pub seed: u64,
    /// True: each split is one contiguous run of chunks.
    pub contiguous: bool,
    /// Fractions of chunks given to train, val, test (empty for a manifest made from ranges).
    pub fractions: Vec<f64>,
    /// The half-open sample range each split was drawn from, as given to [`split_by_ranges`]
    /// (empty for a manifest made from fractions).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ranges: BTreeMap<String, [u64; 2]>,
    /// How those ranges met chunk boundaries ([`Snap`]); `None` for fractions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snap: Option<Snap>,
    /// Sorted chunk indices per split.
    pub splits: BTreeMap<String, Vec<u64>>,
}

/// Assigns whole sample-axis chunks of `geom` to train/val/test by `fractions` (of chunks).
///
/// `contiguous` keeps each split one run of chunks (time series: no leakage through
/// autocorrelation across a boundary); `false` shuffles chunks with `seed` first (exchangeable
/// samples). `sample_range` restricts to the chunks overlapping `[start, stop)`.
pub fn split_by_chunk(
    geom: &ArrayGeometry,
    fractions: &[f64],
    seed: u64,
    contiguous: bool,
    sample_range: Option<(u64, u64)>,
) -> Result<SplitManifest, EngineError> {
    if fractions.is_empty() || fractions.len() > 3 {
        return Err(EngineError::arg(
            "fractions",
            format!("{fractions:?}"),
            "give 1 to 3 fractions (train, val, test)",
        ));
    }
    if let Some(f) = fractions.iter().find(|f| !f.is_finite() || **f < 0.0) {
        return Err(EngineError::arg(
            "fractions",
            format!("{fractions:?}"),
            format!("{f} is negative or not a number; each fraction must be in [0, 1]"),
        ));
    }
    let total: f64 = fractions.iter().sum();
    if total > 1.0 + 1e-9 {
        return Err(EngineError::arg(
            "fractions",
            format!("{fractions:?}"),
            format!("they sum to {total}, over 1; they are fractions of the chunks"),
        ));
    }
    let n = samples_of(geom)?;
    let (start, stop) = sample_range.unwrap_or((0, n));
    if start >= stop || stop > n {
        return Err(EngineError::arg(
            "sample_range",
            format!("({start}, {stop})"),
            format!(
                "need start < stop <= {n}, the length of `{}` along axis {}",
                geom.label(),
                geom.sample_axis
            ),
        ));
    }
    let spc = geom.samples_per_chunk();
    let first = start / spc;
    let last = (stop - 1) / spc;
    let mut chunks = super::plan_chunks(first..last + 1, "the split's chunk list")?;
    if !contiguous {
        Rng::keyed(&[seed, SPLIT_STREAM]).shuffle(&mut chunks);
    }
    let n_chunks = chunks.len();
    let mut splits = BTreeMap::new();
    let mut cum = 0.0;
    let mut lo = 0usize;
    for (name, f) in SPLIT_NAMES.iter().zip(fractions) {
        cum += f;
        let hi = ((cum.min(1.0) * n_chunks as f64).round() as usize).min(n_chunks);
        let mut part = chunks[lo..hi].to_vec();
        if part.is_empty() && *f > 0.0 {
            return Err(EngineError::EmptySplit {
                split: name.to_string(),
                why: format!(
                    "fraction {f} of {n_chunks} chunks rounds to none; raise it or split a longer \
                     sample_range"
                ),
            });
        }
        part.sort_unstable();
        splits.insert(name.to_string(), part);
        lo = hi;
    }
    let sample_range = [first * spc, ((last + 1) * spc).min(n)];
    Ok(SplitManifest {
        seed,
        contiguous,
        fractions: fractions.to_vec(),
        ..SplitManifest::of(geom, sample_range, splits)
    })
}

/// The length of `geom`'s sample axis, or an error when it has no samples to split.
fn samples_of(geom: &ArrayGeometry) -> Result<u64, EngineError> {
    match geom.n_samples() {
        0 => Err(EngineError::NoSamples {
            array: geom.label().to_string(),
            shape: geom.shape.clone(),
            axis: geom.sample_axis,
        }),
        n => Ok(n),
    }
}

/// How [`split_by_ranges`] treats a range boundary that falls inside a stored chunk. A split
/// holds whole chunks, so such a chunk either joins the split or stays out of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Snap {
    /// Every boundary must be a chunk boundary (or the array's end); anything else is an error
    /// that names the two boundaries around it. The default: nothing moves silently.
    #[default]
    Exact,
    /// A split takes the chunks wholly inside its range; a chunk a boundary cuts stays out of
    /// every split, a gap between neighbours.
    Inward,
    /// A split takes every chunk its range touches; two splits that would share a chunk are an
    /// error.
    Outward,
}

impl Snap {
    /// Parses `exact`, `inward` or `outward`.
    pub fn parse(text: &str) -> Result<Self, EngineError> {
        match text {
            "exact" => Ok(Self::Exact),
            "inward" => Ok(Self::Inward),
            "outward" => Ok(Self::Outward),
            other => Err(EngineError::arg(
                "snap",
                other,
                "use exact (boundaries on chunk boundaries), inward or outward",
            )),
        }
    }

    /// The name [`Snap::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Inward => "inward",
            Self::Outward => "outward",
        }
    }
}

/// Assigns whole sample-axis chunks of `geom` to the splits named in `ranges`, each given the
/// half-open range of sample indices `start..stop` it is drawn from: the split by periods that
/// time series are usually evaluated on (train 1979–2015, val 2016, test 2017). Each split is
/// one contiguous run of chunks, and no chunk belongs to two splits.
///
/// Names are `train`, `val` and `test`, each at most once; ranges must not overlap, and may
/// leave gaps (samples between them belong to no split). A boundary inside a chunk is handled
/// as `snap` says. The manifest's `all` covers the chunks from the first split's first to the
/// last split's last, gaps included.
pub fn split_by_ranges(
    geom: &ArrayGeometry,
    ranges: &[(&str, std::ops::Range<u64>)],
    snap: Snap,
) -> Result<SplitManifest, EngineError> {
    let n = samples_of(geom)?;
    let shown = |r: &std::ops::Range<u64>| format!("{}..{}", r.start, r.end);
    if ranges.is_empty() {
        return Err(EngineError::arg(
            "ranges",
            "{}",
            "give at least one split's sample range, such as train = 0..8760",
        ));
    }
    for (i, (name, r)) in ranges.iter().enumerate() {
        if !SPLIT_NAMES.contains(name) {
            return Err(EngineError::arg(
                "ranges",
                name,
                "name each range train, val or test",
            ));
        }
        if ranges[..i].iter().any(|(other, _)| other == name) {
            return Err(EngineError::arg(
                "ranges",
                name,
                format!("split `{name}` is given two ranges; give each split one"),
            ));
        }
        if r.start >= r.end || r.end > n {
            return Err(EngineError::arg(
                "ranges",
                format!("{name} = {}", shown(r)),
                format!(
                    "need start < stop <= {n}, the length of `{}` along axis {}",
                    geom.label(),
                    geom.sample_axis
                ),
            ));
        }
        if let Some((other, o)) = ranges[..i]
            .iter()
            .find(|(_, o)| o.start < r.end && r.start < o.end)
        {
            return Err(EngineError::arg(
                "ranges",
                format!("{name} = {}, {other} = {}", shown(r), shown(o)),
                "the ranges overlap; splits must not share samples",
            ));
        }
    }
    let spc = geom.samples_per_chunk();
    let n_chunks = n.div_ceil(spc);
    // The chunk holding sample `s` starts at `s / spc * spc`; `n` is a boundary too.
    let on_boundary = |s: u64| s.is_multiple_of(spc) || s == n;
    let mut splits = BTreeMap::new();
    let mut taken: Vec<(u64, u64, &str)> = Vec::new(); // chunk runs, to find two splits sharing one
    for (name, r) in ranges {
        let (first, stop) = match snap {
            Snap::Exact => {
                if let Some(s) = [r.start, r.end].into_iter().find(|s| !on_boundary(*s)) {
                    let below = s / spc * spc;
                    let above = (below + spc).min(n);
                    return Err(EngineError::arg(
                        "ranges",
                        format!("{name} = {}", shown(r)),
                        format!(
                            "sample {s} falls inside chunk {} (samples {below}..{above}) of `{}`, \
                             and a split holds whole chunks: move it to {below} or {above}, or \
                             pass snap inward (leave that chunk out) or outward (take it in)",
                            s / spc,
                            geom.label()
                        ),
                    ));
                }
                (r.start / spc, r.end.div_ceil(spc))
            }
            Snap::Inward => {
                let stop = if r.end == n { n_chunks } else { r.end / spc };
                (r.start.div_ceil(spc), stop)
            }
            Snap::Outward => (r.start / spc, r.end.div_ceil(spc)),
        };
        if first >= stop {
            return Err(EngineError::EmptySplit {
                split: name.to_string(),
                why: format!(
                    "its range {} holds no whole chunk of `{}` ({spc} samples each) with snap \
                     inward; widen it or snap outward",
                    shown(r),
                    geom.label()
                ),
            });
        }
        if let Some(&(a, _, other)) = taken.iter().find(|(a, b, _)| *a < stop && first < *b) {
            let c = first.max(a); // the first chunk both runs hold
            return Err(EngineError::arg(
                "ranges",
                format!("{name} = {}", shown(r)),
                format!(
                    "with snap outward, `{name}` and `{other}` would both take chunk {c} (samples \
                     {}..{}) of `{}`; end one of them on a chunk boundary or snap inward",
                    c * spc,
                    ((c + 1) * spc).min(n),
                    geom.label()
                ),
            ));
        }
        taken.push((first, stop, name));
        splits.insert(
            name.to_string(),
            super::plan_chunks(first..stop, "a split's chunk list")?,
        );
    }
    let lo = taken.iter().map(|t| t.0).min().expect("at least one range");
    let hi = taken.iter().map(|t| t.1).max().expect("at least one range");
    Ok(SplitManifest {
        ranges: ranges
            .iter()
            .map(|(name, r)| (name.to_string(), [r.start, r.end]))
            .collect(),
        snap: Some(snap),
        ..SplitManifest::of(geom, [lo * spc, (hi * spc).min(n)], splits)
    })
}

impl SplitManifest {
    /// `splits` of `geom`'s chunks drawn from `sample_range`, as one contiguous run each; the
    /// fields saying how they were drawn (fractions, seed, ranges) are the caller's to set.
    fn of(
        geom: &ArrayGeometry,
        sample_range: [u64; 2],
        splits: BTreeMap<String, Vec<u64>>,
    ) -> Self {
        Self {
            format: MANIFEST_FORMAT,
            array: geom.path.clone(),
            shape: geom.shape.clone(),
            chunks: geom.chunks.clone(),
            sample_axis: geom.sample_axis,
            sample_range,
            seed: 0,
            contiguous: true,
            fractions: Vec::new(),
            ranges: BTreeMap::new(),
            snap: None,
            splits,
        }
    }

    /// Samples per chunk along the sample axis of the reference array.
    pub fn samples_per_chunk(&self) -> u64 {
        self.chunks[self.sample_axis]
    }

    /// Length of the reference array along its sample axis.
    pub fn n_samples(&self) -> u64 {
        self.shape[self.sample_axis]
    }

    /// Checks that this manifest was made for `geom` (same path, shape, chunks, sample axis).
    pub fn validate(&self, geom: &ArrayGeometry) -> Result<(), EngineError> {
        if self.array != geom.path
            || self.shape != geom.shape
            || self.chunks != geom.chunks
            || self.sample_axis != geom.sample_axis
        {
            return Err(EngineError::ManifestMismatch {
                manifest_array: array_label(&self.array).to_string(),
                manifest_shape: self.shape.clone(),
                manifest_chunks: self.chunks.clone(),
                manifest_axis: self.sample_axis,
                found: format!(
                    "array `{}` (shape {:?}, chunks {:?}, sample_axis {})",
                    geom.label(),
                    geom.shape,
                    geom.chunks,
                    geom.sample_axis
                ),
            });
        }
        Ok(())
    }

    fn check_consistent(&self, source_name: &str) -> Result<(), EngineError> {
        let bad = |message: String| EngineError::BadManifest {
            source_name: source_name.to_string(),
            message,
        };
        if self.format != MANIFEST_FORMAT {
            return Err(bad(format!(
                "format {} is not {MANIFEST_FORMAT}; re-create it with this version",
                self.format
            )));
        }
        if self.shape.len() != self.chunks.len()
            || self.sample_axis >= self.shape.len()
            || self.chunks.contains(&0)
        {
            return Err(bad("shape, chunks and sample_axis disagree".into()));
        }
        let n_chunks = self.n_samples().div_ceil(self.samples_per_chunk());
        let mut owner: BTreeMap<u64, &str> = BTreeMap::new();
        for (name, chunks) in &self.splits {
            if !SPLIT_NAMES.contains(&name.as_str()) {
                return Err(bad(format!("unknown split `{name}`")));
            }
            if let Some(c) = chunks.iter().find(|c| **c >= n_chunks) {
                return Err(bad(format!(
                    "split `{name}` names chunk {c}; the array has {n_chunks}"
                )));
            }
            // A chunk in two splits would put the same samples in training and evaluation.
            for &c in chunks {
                if let Some(other) = owner.insert(c, name) {
                    return Err(bad(format!(
                        "chunk {c} is in split `{other}` and in split `{name}` (or twice in \
                         one); a chunk belongs to one split"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The chunk indices of `split`: `train`, `val`, `test`, or `all` (every chunk of the
    /// sample range). An unknown name or an empty split is an error.
    pub fn split_chunks(&self, split: &str) -> Result<Vec<u64>, EngineError> {
        let chunks = match split {
            "all" => {
                let spc = self.samples_per_chunk();
                let range = self.sample_range[0] / spc..self.sample_range[1].div_ceil(spc);
                super::plan_chunks(range, "the chunk list of `all`")?
            }
            "train" | "val" | "test" => self.splits.get(split).cloned().unwrap_or_default(),
            other => return Err(EngineError::UnknownSplit(other.to_string())),
        };
        if chunks.is_empty() {
            let why = if self.ranges.is_empty() {
                format!(
                    "the manifest gives it no chunks (fractions {:?}); give it a fraction > 0",
                    self.fractions
                )
            } else {
                let given: Vec<&str> = self.ranges.keys().map(String::as_str).collect();
                format!(
                    "the manifest was made from ranges for {} only; give `{split}` a range too",
                    given.join(", ")
                )
            };
            return Err(EngineError::EmptySplit {
                split: split.to_string(),
                why,
            });
        }
        Ok(chunks)
    }

    /// JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serialises")
    }

    /// Parses JSON text.
    pub fn from_json(text: &str) -> Result<Self, EngineError> {
        let m: Self = serde_json::from_str(text).map_err(|e| EngineError::BadManifest {
            source_name: "JSON".into(),
            message: e.to_string(),
        })?;
        m.check_consistent("JSON")?;
        Ok(m)
    }

    /// Writes the manifest to `path`.
    pub fn save(&self, path: &Path) -> Result<(), EngineError> {
        std::fs::write(path, self.to_json()).map_err(|e| EngineError::ManifestIo {
            action: "write",
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// Reads a manifest from `path`.
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| EngineError::ManifestIo {
            action: "read",
            path: name.clone(),
            message: e.to_string(),
        })?;
        let m: Self = serde_json::from_str(&text).map_err(|e| EngineError::BadManifest {
            source_name: name.clone(),
            message: e.to_string(),
        })?;
        m.check_consistent(&name)?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitubatch_store::DType;

    fn geom(n: u64, spc: u64) -> ArrayGeometry {
        ArrayGeometry {
            path: "t2m".into(),
            shape: vec![n, 3],
            chunks: vec![spc, 3],
            dtype: DType::Float32,
            sample_axis: 0,
            offset: 0,
            region: None,
            static_field: false,
        }
    }

    /// What each split should hold, chunk by chunk from the samples each chunk covers, or
    /// `None` where `split_by_ranges` must refuse.
    fn expected(
        n: u64,
        spc: u64,
        ranges: &[(&str, std::ops::Range<u64>)],
        snap: Snap,
    ) -> Option<BTreeMap<String, Vec<u64>>> {
        let overlap =
            |a: &std::ops::Range<u64>, b: &std::ops::Range<u64>| a.start < b.end && b.start < a.end;
        if ranges.is_empty() {
            return None;
        }
        for (i, (_, r)) in ranges.iter().enumerate() {
            if r.start >= r.end || r.end > n || ranges[..i].iter().any(|(_, o)| overlap(o, r)) {
                return None;
            }
        }
        let bound = |s: u64| s.is_multiple_of(spc) || s == n;
        if snap == Snap::Exact && ranges.iter().any(|(_, r)| !bound(r.start) || !bound(r.end)) {
            return None;
        }
        let mut out: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut owners = vec![0; n.div_ceil(spc) as usize];
        for c in 0..n.div_ceil(spc) {
            let samples = c * spc..((c + 1) * spc).min(n);
            for (name, r) in ranges {
                let inside = r.start <= samples.start && samples.end <= r.end;
                if inside || (snap == Snap::Outward && overlap(&samples, r)) {
                    out.entry(name.to_string()).or_default().push(c);
                    owners[c as usize] += 1;
                }
            }
        }
        let every_split_has_chunks = ranges.iter().all(|(name, _)| out.contains_key(*name));
        (every_split_has_chunks && owners.iter().all(|o| *o <= 1)).then_some(out)
    }

    #[test]
    fn ranges_take_the_chunks_each_snap_says_or_are_refused() {
        let mut rng = Rng::keyed(&[7, 7]);
        let (mut made, mut refused) = (0, 0);
        for case in 0..4000 {
            let spc = 1 + rng.below(6);
            let n = 1 + rng.below(40);
            // Mostly ordered, disjoint ranges (half of them on chunk boundaries), sometimes
            // anything at all.
            let mut points: Vec<u64> = (0..6).map(|_| rng.below(n + 1)).collect();
            if rng.below(2) == 0 {
                points.iter_mut().for_each(|p| *p = (*p / spc * spc).min(n));
            }
            points.sort_unstable();
            let wild = rng.below(5) == 0;
            let mut ranges = Vec::new();
            for (i, name) in SPLIT_NAMES.into_iter().enumerate() {
                if rng.below(4) > 0 {
                    let r = if wild {
                        rng.below(n + 1)..rng.below(n + 2)
                    } else {
                        points[2 * i]..points[2 * i + 1]
                    };
                    ranges.push((name, r));
                }
            }
            if rng.below(2) == 0 {
                ranges.reverse(); // the order given does not matter
            }
            let snap = [Snap::Exact, Snap::Inward, Snap::Outward][case % 3];
            let got = split_by_ranges(&geom(n, spc), &ranges, snap);
            match expected(n, spc, &ranges, snap) {
                Some(want) => {
                    let m =
                        got.unwrap_or_else(|e| panic!("{ranges:?} {snap:?} n {n} spc {spc}: {e}"));
                    assert_eq!(m.splits, want, "{ranges:?} {snap:?} n {n} spc {spc}");
                    let back = SplitManifest::from_json(&m.to_json()).unwrap();
                    assert_eq!(back, m);
                    // `all` runs from the first split's first chunk to the last one's last.
                    let every: Vec<u64> = m.splits.values().flatten().copied().collect();
                    let (lo, hi) = (every.iter().min().unwrap(), every.iter().max().unwrap());
                    assert_eq!(
                        m.split_chunks("all").unwrap(),
                        (*lo..hi + 1).collect::<Vec<_>>()
                    );
                    for name in SPLIT_NAMES {
                        let given = ranges.iter().any(|(n, _)| *n == name);
                        assert_eq!(m.split_chunks(name).is_ok(), given, "{name}");
                    }
                    made += 1;
                }
                None => {
                    assert!(got.is_err(), "{ranges:?} {snap:?} n {n} spc {spc}: {got:?}");
                    refused += 1;
                }
            }
        }
        assert!(
            made > 800 && refused > 800,
            "{made} made, {refused} refused"
        );
    }

    #[test]
    fn refusals_name_the_chunk_and_its_boundaries() {
        let g = geom(100, 8);
        let e = split_by_ranges(&g, &[("train", 0..60)], Snap::Exact).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("`ranges`") && e.contains("chunk 7 (samples 56..64)"),
            "{e}"
        );
        let e = split_by_ranges(&g, &[("train", 0..60), ("val", 60..70)], Snap::Outward)
            .unwrap_err()
            .to_string();
        assert!(e.contains("both take chunk 7"), "{e}");
        let e = split_by_ranges(&g, &[("train", 0..20), ("train", 40..60)], Snap::Exact)
            .unwrap_err()
            .to_string();
        assert!(e.contains("two ranges"), "{e}");
        let e = split_by_ranges(&g, &[("holdout", 0..8)], Snap::Exact)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("holdout") && e.contains("train, val or test"),
            "{e}"
        );
        // The array's end is a boundary even when its last chunk is short.
        let m = split_by_ranges(&g, &[("test", 96..100)], Snap::Exact).unwrap();
        assert_eq!(m.splits["test"], vec![12]);
        let e = m.split_chunks("train").unwrap_err().to_string();
        assert!(e.contains("ranges for test only"), "{e}");
        assert!(
            Snap::parse("sideways")
                .unwrap_err()
                .to_string()
                .contains("`snap`")
        );
    }

    #[test]
    fn a_manifest_with_a_chunk_in_two_splits_is_refused() {
        let m = split_by_chunk(&geom(40, 4), &[0.5, 0.5], 0, true, None).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&m.to_json()).unwrap();
        json["splits"]["val"].as_array_mut().unwrap().push(0.into());
        let e = SplitManifest::from_json(&json.to_string())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("chunk 0 is in split `train` and in split `val`"),
            "{e}"
        );
    }
}
