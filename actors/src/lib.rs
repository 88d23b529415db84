//! # insitubatch-actors
//!
//! The engine: a [`Pass`] turns a split of a Zarr store into shuffled batches with four kinds
//! of actor on the insitubatch runtime.
//!
//! - [`planner`]: splits ([`split_by_chunk`], [`SplitManifest`]), the per-epoch order keyed on
//!   (seed, epoch), the deduplicated read plan, and the actor that admits slots under the
//!   computed read-ahead bound;
//! - [`fetcher`]: stored-chunk reads under one `max_inflight` budget (a page-cache hit is
//!   decoded at once by the worker that read it);
//! - [`decoder`]: codec decode and delivery into the pool's slots, or straight into batch rows
//!   for chunks nothing keeps (`assembly`);
//! - [`gather`]: rows into pooled batch buffers, block release, the prefetch channel.
//!
//! The public API users call is in the `insitubatch` crate; this crate is its machinery.

pub(crate) mod assembly;
pub mod batch;
pub mod decoder;
pub mod error;
pub mod fetcher;
pub mod gather;
pub mod pass;
pub mod patch;
pub mod planner;
pub(crate) mod region_slot;
pub mod rng;
pub mod sample_map;
pub mod stats;
pub mod tile;
pub mod transform;
pub(crate) mod unlink_gate;
pub mod variable;

pub use batch::{Batch, BatchArray, Element};
pub use error::EngineError;
pub use pass::{
    DECODE_INTO_BATCHES_ENV, EngineContext, IntoRows, OnBadChunk, Pass, PassConfig, Predecessor,
    TimedOut, count_order_rows, plan_order, rank_share, reaches, rows_per_anchor,
};
pub use patch::{Origins, Patch, PatchDraw};
pub use planner::{
    EpochOrder, MemoryLimit, MemoryNeed, MemorySource, Reach, ReadPlan, Shard, Snap, SplitManifest,
    Stride, batch_outputs, epoch_order, memory_limit, read_plan, shuffle_quality, split_by_chunk,
    split_by_ranges,
};
pub use sample_map::{AnchorMap, Placement, SampleMap, StoreAxis};
pub use stats::{BadChunk, PassStats};
pub use transform::{ChunkTransform, ChunkTransforms, Pipeline};
pub use variable::{StackChannel, Variable};
