//! # insitubatch
//!
//! Read-once, sample-once shuffled batches from Zarr arrays read in place. This crate is the
//! public Rust API and the `insitubatch` command; the runtime lives in
//! [`insitubatch_runtime`] and the Zarr read layer in [`insitubatch_store`], both re-exported.

pub mod inspect;
pub mod readbench;
pub mod synth;

pub use insitubatch_runtime as runtime;
pub use insitubatch_store as store;
pub use insitubatch_store::{
    ArrayGeometry, DType, LocalStore, StoreError, open_geometries, open_hierarchy,
};
