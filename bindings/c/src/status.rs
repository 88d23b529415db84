//! Status codes, the owned error object, and the panic boundary every exported function runs in.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use insitubatch::pool::{CacheError, PoolError};
use insitubatch::{EngineError, StoreError};

/// What a call did. The numbers are stable and never reused.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IsbStatus {
    /// Success.
    IsbOk = 0,
    /// `isb_iter_next`: the epoch is over; no batch was produced.
    IsbEndOfEpoch = 1,
    /// A bad argument: a zero knob, an unknown split or keyword, invalid JSON, a manifest made for
    /// another array, unequal variables.
    IsbInvalidArgument = 2,
    /// A required pointer was NULL.
    IsbNullPointer = 3,
    /// A store, array or file does not exist.
    IsbNotFound = 4,
    /// An operating-system IO error.
    IsbIo = 5,
    /// The data is bad: a corrupt chunk, unreadable metadata, not a Zarr store.
    IsbBadData = 6,
    /// The store uses something insitubatch does not support.
    IsbUnsupported = 7,
    /// The chunk pool's budget cannot hold this iteration.
    IsbBudget = 8,
    /// The iteration was cancelled or the handle was closed.
    IsbCancelled = 9,
    /// A panic inside insitubatch (a bug); the message says where.
    IsbPanic = 10,
    /// The handle belongs to another process (used in a child after fork).
    IsbWrongProcess = 11,
    /// Anything else inside insitubatch.
    IsbInternal = 12,
    /// The cache directory is locked by another process (a second writer, or a writer beside
    /// readonly readers); the message names the holder.
    IsbCacheLocked = 13,
    /// The cache directory holds stale chunks for the arrays the message names
    /// (`reset_stale_cache` rebuilds them).
    IsbCacheStale = 14,
    /// `readonly_cache`: a chunk the pass needs is not in the cache; the message names it.
    IsbCacheMiss = 15,
    /// `isb_iter_next_timeout`: no batch came within the timeout; the iteration goes on and
    /// nothing was lost (call again).
    IsbTimedOut = 16,
    /// A chunk transform failed on a chunk (a callback returned an error) or made something
    /// other than it declared; the message names the transform, the array and the chunk.
    IsbTransform = 17,
}

/// An owned error: a status and the full message. Free it with `isb_error_free`.
pub struct IsbError {
    pub(crate) status: IsbStatus,
    pub(crate) message: CString,
}

impl IsbError {
    pub(crate) fn new(status: IsbStatus, message: impl Into<String>) -> Self {
        let mut m = message.into();
        m.retain(|c| c != '\0');
        Self {
            status,
            message: CString::new(m).expect("NULs removed"),
        }
    }
}

pub(crate) fn status_of(e: &EngineError) -> IsbStatus {
    match e {
        EngineError::InvalidArgument { .. }
        | EngineError::ManifestMismatch { .. }
        | EngineError::BadManifest { .. }
        | EngineError::UnequalSampleAxis { .. }
        | EngineError::UnknownSplit(_)
        | EngineError::EmptySplit { .. }
        | EngineError::NoSamples { .. } => IsbStatus::IsbInvalidArgument,
        EngineError::Store(s) => match &**s {
            StoreError::NotFound { .. } => IsbStatus::IsbNotFound,
            StoreError::NotZarr { .. }
            | StoreError::BadMetadata { .. }
            | StoreError::CorruptChunk { .. } => IsbStatus::IsbBadData,
            StoreError::Unsupported { .. } => IsbStatus::IsbUnsupported,
            StoreError::Io { .. } | StoreError::Remote { .. } => IsbStatus::IsbIo,
            StoreError::BadUrl { .. }
            | StoreError::BadMount { .. }
            | StoreError::SampleAxis { .. }
            | StoreError::Region { .. }
            | StoreError::UnknownVariable { .. }
            | StoreError::NoDataVariables { .. }
            | StoreError::ChunkIndex { .. } => IsbStatus::IsbInvalidArgument,
            StoreError::Runtime(_) => IsbStatus::IsbInternal,
        },
        EngineError::ManifestIo { .. } => IsbStatus::IsbIo,
        EngineError::Pool(PoolError::BudgetTooSmall { .. }) => IsbStatus::IsbBudget,
        EngineError::Pool(PoolError::ReadonlyMiss { .. }) => IsbStatus::IsbCacheMiss,
        EngineError::Pool(PoolError::CacheFile(_)) => IsbStatus::IsbIo,
        EngineError::Pool(_) => IsbStatus::IsbInternal,
        EngineError::Cache(c) => match c {
            CacheError::Locked { .. } => IsbStatus::IsbCacheLocked,
            CacheError::Stale { .. } => IsbStatus::IsbCacheStale,
            CacheError::Corrupt { .. } => IsbStatus::IsbBadData,
            CacheError::Io { .. } => IsbStatus::IsbIo,
            CacheError::Conflict(_) => IsbStatus::IsbInvalidArgument,
        },
        EngineError::ActorPanicked { .. } => IsbStatus::IsbPanic,
        EngineError::Cancelled => IsbStatus::IsbCancelled,
        EngineError::Transform(_) => IsbStatus::IsbTransform,
        EngineError::Runtime(_) => IsbStatus::IsbInternal,
    }
}

impl From<EngineError> for IsbError {
    fn from(e: EngineError) -> Self {
        Self::new(status_of(&e), e.to_string())
    }
}

/// Runs `body` inside a panic boundary and reports its outcome: the status, and the error object
/// through `err` when the caller asked for it.
pub(crate) fn boundary(
    err: *mut *mut IsbError,
    body: impl FnOnce() -> Result<IsbStatus, IsbError>,
) -> IsbStatus {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".into());
        Err(IsbError::new(
            IsbStatus::IsbPanic,
            format!("insitubatch panicked (a bug; please report it): {msg}"),
        ))
    });
    match outcome {
        Ok(status) => status,
        Err(e) => {
            let status = e.status;
            if !err.is_null() {
                // SAFETY: the caller passed a writable `IsbError**` (documented on every function).
                unsafe { *err = Box::into_raw(Box::new(e)) };
            }
            status
        }
    }
}

pub(crate) fn null(what: &str) -> IsbError {
    IsbError::new(IsbStatus::IsbNullPointer, format!("`{what}` is NULL"))
}

/// The status of an error (`IsbInternal` for NULL).
///
/// # Safety
/// `err` is NULL or a live error from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_error_status(err: *const IsbError) -> IsbStatus {
    // SAFETY: per the contract, NULL or a live error.
    match unsafe { err.as_ref() } {
        Some(e) => e.status,
        None => IsbStatus::IsbInternal,
    }
}

/// The message of an error, valid until `isb_error_free` (an empty string for NULL).
///
/// # Safety
/// `err` is NULL or a live error from this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_error_message(err: *const IsbError) -> *const c_char {
    // SAFETY: per the contract, NULL or a live error.
    match unsafe { err.as_ref() } {
        Some(e) => e.message.as_ptr(),
        None => c"".as_ptr(),
    }
}

/// Frees an error. NULL is accepted.
///
/// # Safety
/// `err` is NULL or an error from this library not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_error_free(err: *mut IsbError) {
    if !err.is_null() {
        // SAFETY: per the contract, it came from Box::into_raw in `boundary`.
        drop(unsafe { Box::from_raw(err) });
    }
}

/// Frees a string returned by this library (JSON outputs). NULL is accepted.
///
/// # Safety
/// `s` is NULL or a string from this library not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn isb_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: per the contract, it came from CString::into_raw.
        drop(unsafe { CString::from_raw(s) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_errors_map_to_what_the_caller_can_act_on() {
        let pool = |e| status_of(&EngineError::Pool(e));
        let descriptors = PoolError::CacheFile("cache file x.npy: open-file limit".into());
        assert_eq!(pool(descriptors), IsbStatus::IsbIo);
        let miss = PoolError::ReadonlyMiss {
            key: "t2m#0".into(),
            dir: "/c".into(),
        };
        assert_eq!(pool(miss), IsbStatus::IsbCacheMiss);
        let over = PoolError::OverBudget {
            key: "t2m#0".into(),
            nbytes: 1,
            budget_bytes: 1,
            pinned_bytes: 1,
        };
        assert_eq!(pool(over), IsbStatus::IsbInternal, "a bug in insitubatch");
    }
}
