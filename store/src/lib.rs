//! # insitubatch-store
//!
//! Zarr v2 and v3 (sharded or not) read in place: metadata discovery, the sample-geometry
//! contract ([`ArrayGeometry`]), and reading a stored chunk as bytes through the insitubatch
//! runtime followed by the IO-free decode of the array's `zarrs` codec chain.
//!
//! ```no_run
//! use insitubatch_runtime::Runtime;
//! use insitubatch_store::{LocalStore, open_hierarchy, open_geometries};
//! let rt = Runtime::new().unwrap();
//! let store = LocalStore::new("era5.zarr").unwrap();
//! let (geoms, first) = rt.block_on(move || async move {
//!     let h = open_hierarchy(&store).await?;
//!     let geoms = open_geometries(&h, None, 0)?;
//!     let t2m = &h.arrays["t2m"];
//!     let chunk = t2m.read_chunk(&store, &vec![0; t2m.ndim()]).await?;
//!     Ok::<_, insitubatch_store::StoreError>((geoms, chunk))
//! }).unwrap().unwrap();
//! println!("{} variables; first chunk {:?}", geoms.len(), first.shape);
//! ```

#![forbid(unsafe_code)]

mod array;
mod dtype;
mod error;
mod geometry;
mod hierarchy;
mod mount;
mod remote;
mod shard;
mod store;
mod zstd;

pub use array::{DecodedChunk, ZarrArray, array_label};
pub use dtype::DType;
pub use error::StoreError;
pub use geometry::{ArrayGeometry, AxisTile, Stretch, is_coordinate, open_geometries};
pub use hierarchy::{Hierarchy, open_hierarchy, open_hierarchy_at};
pub use mount::{MountedStore, open_mounted_hierarchy};
pub use remote::{CLIENT_THREADS_OPTION, RemoteStore, default_client_threads};
pub use store::{AnyStore, LocalStore, Store};
