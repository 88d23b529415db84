//! # insitubatch
//!
//! Read-once, sample-once shuffled batches from Zarr arrays read in place. This crate is the
//! public Rust API and the `insitubatch` command; the runtime lives in
//! [`insitubatch_runtime`] and the Zarr read layer in [`insitubatch_store`], both re-exported.

pub mod allocator;
pub mod cachebench;
pub mod check_transform;
mod coords;
mod dataset;
pub mod enginebench;
pub mod inspect;
pub mod readbench;
mod statistics;
pub mod synth;

pub use coords::{
    CoordinateBounds, CoordinateRegion, CoordinateValues, Cycle, SampleBound, cf_time,
    coordinate_region, coordinate_values, cycle_index, sample_ranges, time_index,
};
pub use dataset::{
    BatchArraySpec, DEFAULT_BATCH_SIZE, DEFAULT_BLOCK_CHUNKS, DEFAULT_INFLIGHT_PER_EXECUTOR,
    DEFAULT_PREFETCH_DEPTH, DEFAULT_REMOTE_INFLIGHT_PER_EXECUTOR, DatasetBuilder, InSituDataset,
    MAX_INFLIGHT, MountAlignment, geometries, geometries_with, geometry_json, memory_need_json,
};
pub use insitubatch_actors as actors;
pub use insitubatch_actors::transform;
pub use insitubatch_actors::{
    BadChunk, Batch, BatchArray, ChunkTransform, EngineError, EpochOrder, IntoRows, MemoryLimit,
    MemoryNeed, MemorySource, OnBadChunk, Origins, Pass, PassStats, Patch, Snap, SplitManifest,
    Stride, TimedOut, Variable, memory_limit, shuffle_quality, split_by_chunk, split_by_ranges,
};
pub use insitubatch_pool as pool;
pub use insitubatch_pool::PoolStats;
pub use insitubatch_runtime as runtime;
pub use insitubatch_runtime::{IoBackend, IoBackendChoice};
pub use insitubatch_store as store;
pub use insitubatch_store::{
    AnyStore, ArrayGeometry, DType, LocalStore, RemoteStore, StoreError, open_geometries,
    open_hierarchy,
};
pub use statistics::{Statistics, StatisticsAccumulator};
