//! Sample geometry — the axis-role contract.
//!
//! Every physical axis of an array is either the *sample axis* (drawn, shuffled, split and
//! windowed along) or a *field axis* (carried whole as the per-sample payload, `inner_shape`).
//! Shapes here are in physical (zarr) order; the engine works sample-axis-first.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::array::ZarrArray;
use crate::dtype::DType;
use crate::error::StoreError;
use crate::hierarchy::Hierarchy;

/// The geometry of one variable: an array, which axis is the sample axis, and a window offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayGeometry {
    /// Array path in the store.
    pub path: String,
    /// Physical shape.
    pub shape: Vec<u64>,
    /// Physical stored-chunk shape (the shard on a sharded array).
    pub chunks: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// The physical axis samples are drawn along.
    pub sample_axis: usize,
    /// Window offset: this view reads `array[anchor + offset]` along the sample axis.
    pub offset: i64,
    /// The field region read, one half-open `(start, end)` per field axis in physical order
    /// (`None`: the whole field). Only the stored chunks it touches are read; see
    /// [`ArrayGeometry::crop`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<Vec<(u64, u64)>>,
    /// A static field ([`ArrayGeometry::new_static`]): the whole array is one sample, on a
    /// sample axis of length 1 put in front of its physical axes, and every anchor reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub static_field: bool,
}

impl ArrayGeometry {
    /// Geometry of `array` sampled along `sample_axis`.
    pub fn new(array: &ZarrArray, sample_axis: usize) -> Result<Self, StoreError> {
        if sample_axis >= array.ndim() {
            return Err(StoreError::SampleAxis {
                array: array.path().to_string(),
                axis: sample_axis,
                ndim: array.ndim(),
            });
        }
        Ok(Self {
            path: array.path().to_string(),
            shape: array.shape().to_vec(),
            chunks: array.chunk_shape().to_vec(),
            dtype: array.dtype(),
            sample_axis,
            offset: 0,
            region: None,
            static_field: false,
        })
    }

    /// A static field: `array` whole (orography, a land-sea mask), the same in every row of a
    /// batch whatever the anchor. Its geometry puts a sample axis of length 1 in front of the
    /// array's axes (so one stored-chunk slot holds the whole field); [`array_index`] maps a
    /// chunk index of the geometry back to the array's.
    ///
    /// [`array_index`]: ArrayGeometry::array_index
    pub fn new_static(array: &ZarrArray) -> Self {
        Self {
            path: array.path().to_string(),
            shape: std::iter::once(1)
                .chain(array.shape().iter().copied())
                .collect(),
            chunks: std::iter::once(1)
                .chain(array.chunk_shape().iter().copied())
                .collect(),
            dtype: array.dtype(),
            sample_axis: 0,
            offset: 0,
            region: None,
            static_field: true,
        }
    }

    /// What this geometry gives per axis (a chunk index, a box's ranges), per axis of the
    /// array: the same, but for a static field, whose leading sample axis is not the array's.
    pub fn array_index<T>(&self, mut index: Vec<T>) -> Vec<T> {
        if self.static_field {
            index.remove(0);
        }
        index
    }

    /// How messages name this array (`/` for the store's root array).
    pub fn label(&self) -> &str {
        crate::array::array_label(&self.path)
    }

    /// Samples along the sample axis.
    pub fn n_samples(&self) -> u64 {
        self.shape[self.sample_axis]
    }

    /// Samples per stored chunk along the sample axis.
    pub fn samples_per_chunk(&self) -> u64 {
        self.chunks[self.sample_axis]
    }

    /// Stored chunks along the sample axis.
    pub fn n_sample_chunks(&self) -> u64 {
        self.n_samples().div_ceil(self.samples_per_chunk())
    }

    /// The per-sample payload shape: every field axis, in physical order (the region's
    /// extent on a cropped view).
    pub fn inner_shape(&self) -> Vec<u64> {
        self.field_ranges().map(|(lo, hi)| hi - lo).collect()
    }

    /// The half-open range read on each field axis, in physical order: the region of a
    /// cropped view, else the whole axis. A range that wraps around its axis ends past the
    /// axis length.
    pub fn field_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.field_axes()
            .enumerate()
            .map(|(f, a)| match &self.region {
                Some(r) => r[f],
                None => (0, self.shape[a]),
            })
    }

    /// The field axes, in physical order.
    pub fn field_axes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.shape.len()).filter(move |&a| a != self.sample_axis)
    }

    /// The same view restricted to a region of the field: one half-open `(start, end)` per
    /// field axis, in physical order (the sample axis is not listed). Only the stored chunks
    /// the region touches are read, and a sample is the region alone, so a regional model
    /// over a global archive reads and holds its region only. A region that covers every
    /// field axis whole is no crop. Cropping a cropped view crops the array again, not
    /// within the earlier region. A region across the end of a periodic axis is
    /// [`ArrayGeometry::crop_wrapping`].
    pub fn crop(&self, region: &[(u64, u64)]) -> Result<Self, StoreError> {
        let signed: Vec<(i64, i64)> = region
            .iter()
            .map(|&(lo, hi)| (clamp_i64(lo), clamp_i64(hi)))
            .collect();
        self.cropped(&signed, false)
    }

    /// [`ArrayGeometry::crop`] for periodic axes (longitude on a global grid): a range may run
    /// across the end of its axis and on from its start. Give it as `start < 0` (counted from
    /// the axis's end: `(-100, 180)` on a 1440-long axis is its last 100 and first 180
    /// elements) or as `end` past the axis length (`(1340, 1620)`, the same range); either
    /// way no longer than the axis. The sample holds the range in that order, so the field
    /// is continuous across the seam. Ranges that do not wrap are plain crops. A cropped
    /// view's [`ArrayGeometry::region`] holds a wrapping range as `(start, end)` with `end`
    /// past the axis length.
    pub fn crop_wrapping(&self, region: &[(i64, i64)]) -> Result<Self, StoreError> {
        self.cropped(region, true)
    }

    fn cropped(&self, region: &[(i64, i64)], wrap: bool) -> Result<Self, StoreError> {
        let axes: Vec<usize> = self.field_axes().collect();
        let bad = |message: String| StoreError::Region {
            array: self.path.clone(),
            region: region.to_vec(),
            message,
        };
        if region.len() != axes.len() {
            return Err(bad(format!(
                "give one (start, end) per field axis: the array has {} dimensions, the sample \
                 axis is {}, so {} ranges for axes {axes:?}",
                self.shape.len(),
                self.sample_axis,
                axes.len()
            )));
        }
        let mut normal = Vec::with_capacity(region.len());
        for (&(lo, hi), &a) in region.iter().zip(&axes) {
            let n = clamp_i64(self.shape[a]);
            let fits = lo < hi && (0..n).contains(&lo) && hi <= n;
            if !wrap && !fits {
                let hint = if lo < 0 || hi > n {
                    "; a range across the end of a periodic axis (longitude) needs a wrapping \
                     crop (crop_wrapping in Rust, wrap=True in Python, \"wrap\": true in C)"
                } else {
                    ""
                };
                return Err(bad(format!(
                    "axis {a} has length {n}; each range must satisfy 0 <= start < end <= \
                     {n}{hint}"
                )));
            }
            if wrap && !(lo < hi && (-n..n).contains(&lo) && hi - lo <= n) {
                return Err(bad(format!(
                    "axis {a} has length {n}; a wrapping range must satisfy -{n} <= start < \
                     {n} and start < end <= start + {n}"
                )));
            }
            // Normal form: 0 <= start < n, end past n only when the range wraps.
            let start = lo.rem_euclid(n);
            normal.push((start as u64, (start + (hi - lo)) as u64));
        }
        let whole = normal
            .iter()
            .zip(&axes)
            .all(|(&(lo, hi), &a)| lo == 0 && hi == self.shape[a]);
        Ok(Self {
            region: (!whole).then_some(normal),
            ..self.clone()
        })
    }

    /// Where each field axis's range lies in stored chunks: per field axis, the stored-chunk
    /// indices the view reads along it in the order the sample holds them, each with the
    /// stretches of the chunk it reads (one, or two when a wrapping range starts and ends in
    /// the same chunk).
    pub fn axis_tiles(&self) -> Vec<Vec<AxisTile>> {
        self.field_axes()
            .zip(self.field_ranges())
            .map(|(a, (lo, hi))| {
                let (n, c) = (self.shape[a], self.chunks[a]);
                // The range as at most two pieces inside the axis: (first, end, offset in
                // the sample).
                let mut pieces = vec![(lo, hi.min(n), 0)];
                if hi > n {
                    pieces.push((0, hi - n, n - lo));
                }
                let mut tiles: Vec<AxisTile> = Vec::new();
                for (k, (first, end, at)) in pieces.into_iter().enumerate() {
                    for t in first / c..end.div_ceil(c) {
                        let origin = t * c;
                        let (from, to) = (first.max(origin), end.min(origin + c));
                        let stretch = Stretch {
                            within: from - origin..to - origin,
                            at: at + from - first,
                        };
                        // The wrapped piece can reach back into the chunk the range starts in
                        // (no further: the range is no longer than the axis).
                        match tiles.first_mut() {
                            Some(x) if k == 1 && x.index == t => x.stretches.push(stretch),
                            _ => tiles.push(AxisTile {
                                index: t,
                                stretches: vec![stretch],
                            }),
                        }
                    }
                }
                tiles
            })
            .collect()
    }

    /// Stored-chunk shape on the field axes.
    pub fn inner_chunks(&self) -> Vec<u64> {
        self.field_axes().map(|a| self.chunks[a]).collect()
    }

    /// Stored chunks per dimension (physical order).
    pub fn chunk_grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.chunks)
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    /// Stored chunks (tiles) that make up one sample-axis chunk: 1 unless field axes are chunked
    /// (on a cropped view, those the region touches).
    pub fn tiles_per_sample_chunk(&self) -> u64 {
        self.axis_tiles().iter().map(|t| t.len() as u64).product()
    }

    /// Bytes of one decoded stored chunk (the shard on a sharded array), whole.
    pub fn stored_chunk_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .fold(self.dtype.size_bytes() as u64, |a, &c| a.saturating_mul(c))
    }

    /// Bytes of one sample.
    pub fn sample_bytes(&self) -> u64 {
        self.inner_shape().iter().product::<u64>() * self.dtype.size_bytes() as u64
    }

    /// The same array read `k` samples further along the sample axis (`x`/`y = shift(h)`
    /// windows for forecasting). Views of one path decode once.
    pub fn shift(&self, k: i64) -> Self {
        Self {
            offset: self.offset + k,
            ..self.clone()
        }
    }
}

/// One stored chunk along one field axis, as a view reads it ([`ArrayGeometry::axis_tiles`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisTile {
    /// The chunk's index along the axis.
    pub index: u64,
    /// The stretches of it the view reads, in the sample's order.
    pub stretches: Vec<Stretch>,
}

impl AxisTile {
    /// The chunk-local range holding every stretch.
    pub fn span(&self) -> std::ops::Range<u64> {
        let lo = self.stretches.iter().map(|s| s.within.start).min();
        let hi = self.stretches.iter().map(|s| s.within.end).max();
        lo.unwrap_or(0)..hi.unwrap_or(0)
    }
}

/// A stretch of one stored chunk along one axis and where it lands in the sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stretch {
    /// Chunk-local half-open range.
    pub within: std::ops::Range<u64>,
    /// Its offset along the axis in the sample (the region).
    pub at: u64,
}

/// `v` as an `i64`, saturating (lengths and indices never come near the limit).
fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// True when `array` is a coordinate: a 1-D array whose one dimension is named after itself.
pub fn is_coordinate(array: &ZarrArray) -> bool {
    array.ndim() == 1
        && array
            .dimension_names()
            .is_some_and(|d| d.len() == 1 && d[0] == array.name())
}

/// Geometries of a group's data variables, keyed by array path.
///
/// Without `variables`, every array except coordinates (self-named 1-D arrays) and 0-D arrays
/// (grid mappings such as `spatial_ref`) is a data variable. Naming arrays in `variables`
/// bypasses that rule. Every returned array must have `sample_axis`.
pub fn open_geometries(
    hierarchy: &Hierarchy,
    variables: Option<&[String]>,
    sample_axis: usize,
) -> Result<BTreeMap<String, ArrayGeometry>, StoreError> {
    let mut out = BTreeMap::new();
    match variables {
        Some(names) => {
            for name in names {
                let array = hierarchy.array(name)?;
                out.insert(name.clone(), ArrayGeometry::new(array, sample_axis)?);
            }
        }
        None => {
            for (path, array) in &hierarchy.arrays {
                if array.ndim() == 0 || is_coordinate(array) {
                    continue;
                }
                out.insert(path.clone(), ArrayGeometry::new(array, sample_axis)?);
            }
            if out.is_empty() {
                return Err(StoreError::NoDataVariables {
                    group: hierarchy.root.clone(),
                });
            }
        }
    }
    Ok(out)
}
