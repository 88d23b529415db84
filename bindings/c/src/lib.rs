//! # insitubatch C ABI
//!
//! `libinsitubatch.so` / `libinsitubatch.a` and the header `include/insitubatch.h` (generated
//! by cbindgen, committed; a test fails when it drifts). Opaque handles (`IsbDataset`,
//! `IsbIter`, `IsbBatch`, `IsbError`), a `#[repr(u32)]` status on every call plus an owned error
//! object with the full message, JSON for configuration and reports, and batches exported as
//! DLPack 1.x `DLManagedTensorVersioned`. Every exported body runs inside a panic boundary and
//! checks its pointers for NULL. See `examples/c/` for a program that embeds the loader.

mod api;
mod callback;
#[cfg(test)]
mod config_fuzz;
mod dlpack;
mod status;

pub use api::*;
pub use callback::{IsbChunk, IsbReleaseFn, IsbTransformCallback, IsbTransformFn};
pub use dlpack::*;
pub use status::*;

// The allocator the CLI uses too: glibc's per-thread arenas return chunk-sized buffers to the
// kernel and fault them in again (docs/benchmarks.md, "Allocator"). It serves only Rust
// allocations inside this library, never the host's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
