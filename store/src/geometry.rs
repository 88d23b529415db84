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

    /// The per-sample payload shape: every field axis, in physical order.
    pub fn inner_shape(&self) -> Vec<u64> {
        self.field_axes().map(|a| self.shape[a]).collect()
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

    /// Stored chunks (tiles) that make up one sample-axis chunk: 1 unless field axes are chunked.
    pub fn tiles_per_sample_chunk(&self) -> u64 {
        self.field_axes()
            .map(|a| self.shape[a].div_ceil(self.chunks[a]))
            .product()
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

    fn field_axes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.shape.len()).filter(move |&a| a != self.sample_axis)
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
