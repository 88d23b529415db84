//! A variable is a labelled view of an array: `(label, path, offset)`. Several labels may view
//! one path at different offsets (`x` and `y = x.shift(h)`); they decode once.

use std::sync::Arc;

use insitubatch_store::{ArrayGeometry, DType};

use crate::patch::Patch;
use crate::planner::Reach;
use crate::sample_map::{AnchorMap, Placement, SampleMap};

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
    /// The channel of a stacked batch array this label is written into, instead of an array
    /// of its own (`None`: its own array, named by the label).
    pub stack: Option<StackChannel>,
    /// Where the store the array is read from sits against the anchors: the same for the
    /// anchors' own store, another start (and rate) for a store mounted with an alignment.
    pub placement: Placement,
    /// For an indexed variable, the sample of its array each anchor reads (`index[anchor]`,
    /// one per anchor), in place of the placement and offset.
    pub index: Option<Arc<[u64]>>,
    /// The window cut from each sample over its last axes (a patch; `None`: the whole
    /// sample). Rows hold [`Variable::row_inner`].
    pub patch: Option<Arc<Patch>>,
}

/// Where a stacked label goes: channel `channel` of the `channels` of the batch array `name`,
/// shaped `(batch, channels, *sample_inner)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackChannel {
    /// The stacked array's name.
    pub name: String,
    /// This label's channel.
    pub channel: usize,
    /// Channels of the stacked array.
    pub channels: usize,
}

impl Variable {
    /// The view `label` of `geom`, its samples as stored.
    pub fn new(label: impl Into<String>, geom: ArrayGeometry) -> Self {
        Self {
            label: label.into(),
            sample_inner: geom.inner_shape(),
            sample_dtype: geom.dtype,
            geom,
            stack: None,
            placement: Placement::SAME,
            index: None,
            patch: None,
        }
    }

    /// How an anchor becomes a sample of its array: its store's placement, then its window
    /// offset.
    pub fn map(&self) -> SampleMap {
        SampleMap {
            placement: self.placement,
            offset: self.geom.offset,
        }
    }

    /// How an anchor becomes a sample of its array: its table when indexed, else [`map`].
    ///
    /// [`map`]: Self::map
    pub fn anchor_map(&self) -> AnchorMap {
        match &self.index {
            Some(t) => AnchorMap::Table(Arc::clone(t)),
            None => AnchorMap::Affine(self.map()),
        }
    }

    /// Whether every anchor reads it (a static field, or an indexed variable whose table has
    /// a sample for every anchor): it takes no part in which anchors are valid.
    pub fn reads_every_anchor(&self) -> bool {
        self.geom.static_field || self.index.is_some()
    }

    /// What it reads along its sample axis, as an anchor sees it.
    pub fn reach(&self) -> Reach {
        Reach {
            map: self.map(),
            len: self.geom.n_samples(),
        }
    }

    /// The same view with samples of `inner` and `dtype` (what its chunk transforms make).
    pub fn with_sample(mut self, inner: Vec<u64>, dtype: DType) -> Self {
        self.sample_inner = inner;
        self.sample_dtype = dtype;
        self
    }

    /// The same view written into a channel of a stacked batch array.
    pub fn stacked(mut self, stack: StackChannel) -> Self {
        self.stack = Some(stack);
        self
    }

    /// The same view cut to a `patch` over its samples' last axes.
    pub fn patched(mut self, patch: Arc<Patch>) -> Self {
        self.patch = Some(patch);
        self
    }

    /// Bytes of one sample as the pool and the cache hold it (whole, after the transforms).
    pub fn sample_bytes(&self) -> u64 {
        self.sample_inner.iter().product::<u64>() * self.sample_dtype.size_bytes() as u64
    }

    /// A row's shape in its batch array: the sample's, with the patched axes cut to the patch.
    pub fn row_inner(&self) -> Vec<u64> {
        let Some(patch) = &self.patch else {
            return self.sample_inner.clone();
        };
        let lead = self.sample_inner.len() - patch.shape.len();
        self.sample_inner[..lead]
            .iter()
            .chain(&patch.shape)
            .copied()
            .collect()
    }

    /// The extents of the axes its patch covers, the samples' last ones (`None`: no patch).
    pub fn patch_field(&self) -> Option<&[u64]> {
        let patch = self.patch.as_ref()?;
        Some(&self.sample_inner[self.sample_inner.len() - patch.shape.len()..])
    }

    /// The rows each anchor gives: one per patch of its sample ([`Patch::per_sample`]).
    pub fn rows_per_anchor(&self) -> u64 {
        match (&self.patch, self.patch_field()) {
            (Some(patch), Some(field)) => patch.per_sample(field),
            _ => 1,
        }
    }

    /// Bytes of one row of this label in its batch array.
    pub fn row_bytes(&self) -> u64 {
        self.row_inner().iter().product::<u64>() * self.sample_dtype.size_bytes() as u64
    }
}
