//! Chunk-aligned, leakage-safe splits: [`split_by_chunk`] and the [`SplitManifest`].

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
    /// Fractions of chunks given to train, val, test.
    pub fractions: Vec<f64>,
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
    let n = geom.n_samples();
    if n == 0 {
        return Err(EngineError::NoSamples {
            array: geom.label().to_string(),
            shape: geom.shape.clone(),
            axis: geom.sample_axis,
        });
    }
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
    let chunk_start = first * spc;
    let chunk_stop = ((last + 1) * spc).min(n);
    Ok(SplitManifest {
        format: MANIFEST_FORMAT,
        array: geom.path.clone(),
        shape: geom.shape.clone(),
        chunks: geom.chunks.clone(),
        sample_axis: geom.sample_axis,
        sample_range: [chunk_start, chunk_stop],
        seed,
        contiguous,
        fractions: fractions.to_vec(),
        splits,
    })
}

impl SplitManifest {
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
        for (name, chunks) in &self.splits {
            if !SPLIT_NAMES.contains(&name.as_str()) {
                return Err(bad(format!("unknown split `{name}`")));
            }
            if let Some(c) = chunks.iter().find(|c| **c >= n_chunks) {
                return Err(bad(format!(
                    "split `{name}` names chunk {c}; the array has {n_chunks}"
                )));
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
            return Err(EngineError::EmptySplit {
                split: split.to_string(),
                why: format!(
                    "the manifest gives it no chunks (fractions {:?}); give it a fraction > 0",
                    self.fractions
                ),
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
