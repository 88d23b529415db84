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
        })
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
    /// cropped view, else the whole axis.
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
    /// within the earlier region.
    pub fn crop(&self, region: &[(u64, u64)]) -> Result<Self, StoreError> {
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
        for (&(lo, hi), &a) in region.iter().zip(&axes) {
            if lo >= hi || hi > self.shape[a] {
                return Err(bad(format!(
                    "axis {a} has length {}; each range must satisfy 0 <= start < end <= {}",
                    self.shape[a], self.shape[a]
                )));
            }
        }
        let whole = region
            .iter()
            .zip(&axes)
            .all(|(&(lo, hi), &a)| lo == 0 && hi == self.shape[a]);
        Ok(Self {
            region: (!whole).then(|| region.to_vec()),
            ..self.clone()
        })
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
        self.tile_ranges().map(|(lo, hi)| hi - lo).product()
    }

    /// Per field axis, the half-open range of stored-chunk indices the view reads.
    pub fn tile_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.field_axes()
            .zip(self.field_ranges())
            .map(|(a, (lo, hi))| (lo / self.chunks[a], hi.div_ceil(self.chunks[a])))
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
                let array = hierarchy.arrays.get(name.as_str()).ok_or_else(|| {
                    StoreError::UnknownVariable {
                        name: name.clone(),
                        group: hierarchy.root.clone(),
                        available: hierarchy
                            .arrays
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", "),
                    }
                })?;
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
