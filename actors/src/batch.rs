//! What a consumer receives: a [`Batch`] of arrays by label, each `(batch, *sample_inner)`, or
//! by stack, `(batch, channels, *sample_inner)`.

use std::sync::Arc;

use insitubatch_pool::PooledBuf;
use insitubatch_store::DType;

use crate::sample_map::AnchorMap;

/// Element types a batch array can be viewed as.
pub trait Element: Copy + sealed::Sealed + 'static {
    /// The dtype this Rust type reads.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t { const DTYPE: DType = DType::$d; }
    )*};
}
element!(f32 => Float32, f64 => Float64, i8 => Int8, i16 => Int16, i32 => Int32, i64 => Int64,
         u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64);

/// One label's array in a batch: C order, native endian, in a page-aligned pooled buffer that
/// returns to the pool when the batch is dropped.
pub struct BatchArray {
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) buf: PooledBuf,
}

impl std::fmt::Debug for BatchArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchArray")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl BatchArray {
    /// `(batch, *sample_inner)`.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The raw bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The values as `T`, or `None` when `T` is not this array's dtype.
    pub fn values<T: Element>(&self) -> Option<&[T]> {
        if T::DTYPE != self.dtype {
            return None;
        }
        let bytes = self.buf.as_slice();
        let size = std::mem::size_of::<T>();
        // Batch buffers are page aligned and hold whole elements; check rather than assume.
        assert!(
            (bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
                && bytes.len().is_multiple_of(size),
            "batch buffer is misaligned for {:?}",
            self.dtype
        );
        // SAFETY: the pointer is aligned for T and valid for `len / size` elements (checked
        // above); every bit pattern is a valid value of these plain numeric types; the slice
        // borrows `self`, so the buffer outlives it and is not written while it exists.
        Some(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) })
    }

    /// The pooled buffer's address (for DLPack export).
    pub fn as_ptr(&self) -> *const u8 {
        self.buf.as_ptr()
    }
}

/// One batch: every label at the same anchors.
#[derive(Debug)]
pub struct Batch {
    pub(crate) epoch: u64,
    pub(crate) index: usize,
    pub(crate) labels: Arc<[String]>,
    pub(crate) maps: Arc<[AnchorMap]>,
    /// The arrays' names: each label's own, a stack's name in place of its labels.
    pub(crate) names: Arc<[String]>,
    pub(crate) arrays: Vec<BatchArray>,
    pub(crate) sample_indices: Vec<u64>,
    /// Each row's patch origin, row-major (`None`: whole samples).
    pub(crate) patch_origins: Option<Vec<u64>>,
}

impl Batch {
    /// The epoch this batch was drawn in (the dataset's epoch when its pass started).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Position of this batch in its epoch, counted from the epoch's first batch also when the
    /// pass was resumed part-way: a checkpoint that saves (`epoch()`, `index() + 1`) resumes
    /// after this batch.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Rows (samples) in the batch; only the epoch's last batch is short.
    pub fn len(&self) -> usize {
        self.sample_indices.len()
    }

    /// True for a batch without rows (never produced).
    pub fn is_empty(&self) -> bool {
        self.sample_indices.is_empty()
    }

    /// Labels, in declaration order (stacked ones too; see [`Batch::names`]).
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The arrays' names, in declaration order: a label's own array is named by the label, and
    /// labels stacked as channels (`stack` on the builder) are one array named by the stack,
    /// in the place of its first label.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The array named `name`: a label that is not stacked, or a stack.
    pub fn array(&self, name: &str) -> Option<&BatchArray> {
        self.names
            .iter()
            .position(|l| l == name)
            .map(|i| &self.arrays[i])
    }

    /// (name, array) pairs in declaration order.
    pub fn arrays(&self) -> impl Iterator<Item = (&str, &BatchArray)> {
        self.names.iter().map(String::as_str).zip(&self.arrays)
    }

    /// The anchor (reference sample index) of each row.
    pub fn sample_indices(&self) -> &[u64] {
        &self.sample_indices
    }

    /// Where each row's patch was cut (a dataset with a patch): row-major, one index per
    /// patched axis (the samples' last axes) per row, the same for every label of the row.
    /// `None` when rows hold whole samples.
    pub fn patch_origins(&self) -> Option<&[u64]> {
        self.patch_origins.as_deref()
    }

    /// The window offset of `label` (0 for an indexed variable).
    pub fn offset(&self, label: &str) -> Option<i64> {
        self.map(label).map(AnchorMap::offset)
    }

    /// How `label` turns an anchor into a sample of its array.
    pub fn map(&self, label: &str) -> Option<&AnchorMap> {
        self.labels
            .iter()
            .position(|l| l == label)
            .map(|i| &self.maps[i])
    }

    /// The sample index `label` read for each row: anchor + offset (for a store mounted with
    /// an alignment, the sample of that store at the anchor's time, then the offset; for an
    /// indexed variable, its table's entry for the anchor).
    pub fn read_indices(&self, label: &str) -> Option<Vec<u64>> {
        let map = self.map(label)?;
        Some(
            self.sample_indices
                .iter()
                .map(|&a| map.sample(a).max(0) as u64)
                .collect(),
        )
    }
}
