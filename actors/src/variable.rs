//! A variable is a labelled view of an array: `(label, path, offset)`. Several labels may view
//! one path at different offsets (`x` and `y = x.shift(h)`); they decode once.

use insitubatch_store::{ArrayGeometry, DType};

/// One labelled view. `geom.offset` is the window offset along the sample axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Key of the array in each batch.
    pub label: String,
    /// The array and its offset.
    pub geom: ArrayGeometry,
    /// A sample's inner shape as batches (and the pool and the cache) hold it: after the
    /// array's chunk transforms, the geometry's own without any.
    pub sample_inner: Vec<u64>,
    /// A sample's element type, likewise.
    pub sample_dtype: DType,
}

impl Variable {
    /// The view `label` of `geom`, its samples as stored.
    pub fn new(label: impl Into<String>, geom: ArrayGeometry) -> Self {
        Self {
            label: label.into(),
            sample_inner: geom.inner_shape(),
            sample_dtype: geom.dtype,
            geom,
        }
    }

    /// The same view with samples of `inner` and `dtype` (what its chunk transforms make).
    pub fn with_sample(mut self, inner: Vec<u64>, dtype: DType) -> Self {
        self.sample_inner = inner;
        self.sample_dtype = dtype;
        self
    }

    /// Bytes of one sample as batches hold it.
    pub fn sample_bytes(&self) -> u64 {
        self.sample_inner.iter().product::<u64>() * self.sample_dtype.size_bytes() as u64
    }
}
