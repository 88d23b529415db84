//! Engine errors: bad arguments, manifests that do not fit, and what a pass can die of.

use std::sync::Arc;

use insitubatch_store::StoreError;

/// Everything the engine reports. Messages name the argument, array, chunk or split, and say
/// what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// A knob or argument is out of range.
    #[error("invalid argument `{name}` = {value}: {hint}")]
    InvalidArgument {
        /// The argument's name, as users type it.
        name: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        hint: String,
    },
    /// The manifest was made for a different array (or array shape).
    #[error(
        "split manifest was made for array `{manifest_array}` (shape {manifest_shape:?}, chunks \
         {manifest_chunks:?}, sample_axis {manifest_axis}) but is used with {found}; make a new \
         manifest with split_by_chunk for this array"
    )]
    ManifestMismatch {
        /// What the manifest says.
        manifest_array: String,
        /// Its shape.
        manifest_shape: Vec<u64>,
        /// Its chunks.
        manifest_chunks: Vec<u64>,
        /// Its sample axis.
        manifest_axis: usize,
        /// What it was used with.
        found: String,
    },
    /// A manifest file could not be read or written.
    #[error("cannot {action} the split manifest {path}: {message}")]
    ManifestIo {
        /// "read" or "write".
        action: &'static str,
        /// The file.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// A manifest file could not be parsed.
    #[error("split manifest {source_name} is not valid: {message}")]
    BadManifest {
        /// Path or "JSON".
        source_name: String,
        /// Why.
        message: String,
    },
    /// Variables disagree on the sample-axis length.
    #[error(
        "variables must share the sample-axis length: `{a}` has {a_len} samples along its sample \
         axis but `{b}` has {b_len}; pick variables over the same sample range (when they come \
         from two stores that cover different times, mount one with an alignment: \
         `align_mount`, or `\"align\": \"time\"` in the mount's entry)"
    )]
    UnequalSampleAxis {
        /// First variable label.
        a: String,
        /// Its length.
        a_len: u64,
        /// Second variable label.
        b: String,
        /// Its length.
        b_len: u64,
    },
    /// The array has no samples to draw (length 0 along its sample axis).
    #[error(
        "array `{array}` has no samples: its shape is {shape:?}, length 0 along sample_axis \
         {axis}; there is nothing to split or load, so pick another array or sample_axis"
    )]
    NoSamples {
        /// The array.
        array: String,
        /// Its shape.
        shape: Vec<u64>,
        /// The sample axis.
        axis: usize,
    },
    /// A split name that is not train, val, test or all.
    #[error("unknown split `{0}`: use train, val, test or all")]
    UnknownSplit(String),
    /// A split with no chunks (or no valid samples).
    #[error("split `{split}` is empty: {why}")]
    EmptySplit {
        /// The split.
        split: String,
        /// Why it is empty and what to change.
        why: String,
    },
    /// The read layer failed (missing store, bad metadata, IO, corrupt chunk under raise).
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// The pool could not hold this iteration.
    #[error(transparent)]
    Pool(#[from] insitubatch_pool::PoolError),
    /// The cache directory: locked, stale, damaged, unwritable.
    #[error(transparent)]
    Cache(#[from] insitubatch_pool::CacheError),
    /// An actor of the pass panicked; the pass is poisoned.
    #[error("the {actor} actor panicked: {message}; the pass was stopped")]
    ActorPanicked {
        /// Which actor.
        actor: String,
        /// The panic message.
        message: String,
    },
    /// A chunk transform failed on a chunk, or made something other than it promised; the
    /// message names the transform, the array and the chunk.
    #[error("{0}")]
    Transform(String),
    /// The runtime could not start or was shut down.
    #[error("runtime: {0}")]
    Runtime(String),
    /// The pass was cancelled (the consumer stopped it).
    #[error("the pass was cancelled")]
    Cancelled,
}

impl EngineError {
    /// `split` yields nothing: each of its `dropped` anchors reads off the array through a
    /// window.
    pub fn every_anchor_dropped(split: &str, dropped: u64) -> Self {
        let why = if dropped == 0 {
            // Its chunks have samples, so none of them is on the stride.
            "none of its samples is on the sample_stride and sample_phase asked for; use a \
             shorter stride, another phase or a longer split"
                .to_string()
        } else {
            format!(
                "every one of its {dropped} anchors reads off the array through a window offset; \
                 use smaller shifts or a longer split"
            )
        };
        Self::EmptySplit {
            split: split.to_string(),
            why,
        }
    }

    /// An [`EngineError::InvalidArgument`].
    pub fn arg(name: &'static str, value: impl ToString, hint: impl Into<String>) -> Self {
        Self::InvalidArgument {
            name,
            value: value.to_string(),
            hint: hint.into(),
        }
    }
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        Self::Store(Arc::new(e))
    }
}
