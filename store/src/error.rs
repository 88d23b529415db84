//! Errors of the store layer. Every variant names the thing a user has to look at.

use std::path::PathBuf;

/// What went wrong opening or reading a Zarr hierarchy.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The path does not exist.
    #[error(
        "{path} does not exist; check the path (a local Zarr group or array directory, or an \
         s3://, gs://, az:// or http(s):// URL)"
    )]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// A directory without Zarr metadata.
    #[error(
        "{path} is not a Zarr group or array: none of zarr.json, .zgroup, .zarray found; point at the store root or an array inside it"
    )]
    NotZarr {
        /// The directory.
        path: PathBuf,
    },
    /// Metadata that does not parse or is not what Zarr allows.
    #[error("malformed Zarr metadata in {path}: {message}")]
    BadMetadata {
        /// The metadata file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A codec, data type, chunk grid or layout we cannot read.
    #[error("array `{array}` uses an unsupported {what}: {message}")]
    Unsupported {
        /// Array path.
        array: String,
        /// `codec`, `data type`, `chunk grid`, ...
        what: &'static str,
        /// Details from the metadata or the codec library.
        message: String,
    },
    /// `sample_axis` is not an axis of the array.
    #[error(
        "sample_axis {axis} is out of range for array `{array}` with {ndim} dimensions (valid: 0..{ndim})"
    )]
    SampleAxis {
        /// Array path.
        array: String,
        /// The requested axis.
        axis: usize,
        /// The array's number of dimensions.
        ndim: usize,
    },
    /// A field region (`crop`) that does not fit the array.
    #[error("the region {region:?} of array `{array}` is invalid: {message}")]
    Region {
        /// Array path.
        array: String,
        /// The region given.
        region: Vec<(i64, i64)>,
        /// What is wrong and what to do.
        message: String,
    },
    /// A requested variable is not in the group.
    #[error("variable `{name}` is not in {group}; available arrays: {available}")]
    UnknownVariable {
        /// The requested name.
        name: String,
        /// The group path.
        group: PathBuf,
        /// Comma-separated names that exist.
        available: String,
    },
    /// The group has no data variable (only coordinates or 0-D arrays).
    #[error(
        "{group} has no data variables (arrays other than coordinates and 0-D arrays); name arrays explicitly with `variables`"
    )]
    NoDataVariables {
        /// The group path.
        group: PathBuf,
    },
    /// An IO error reading a file.
    #[error("reading {path}: {source}{hint}", hint = io_hint(source))]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A store URL that cannot be opened: an unknown scheme, an unknown storage option, or a
    /// configuration the object-store client refuses (a missing bucket name, say).
    #[error("cannot open the store {url}: {message}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A store that cannot be mounted as a group of the dataset's store.
    #[error("cannot mount {location} as `{name}`: {message}")]
    BadMount {
        /// The mount's name (the group its arrays appear under).
        name: String,
        /// The mounted store's location.
        location: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// An object-store request that failed after the client's bounded retries.
    #[error("reading {url}: {message}{hint}")]
    Remote {
        /// The object's URL.
        url: String,
        /// The client's error.
        message: String,
        /// What to do about it, as a clause to append ("" when there is nothing to add).
        hint: String,
    },
    /// A stored chunk that does not decode.
    #[error(
        "array `{array}` chunk `{key}` ({path}) is corrupt or truncated: {message}; rewrite the chunk or use on_bad_chunk=\"nan\""
    )]
    CorruptChunk {
        /// Array path.
        array: String,
        /// Chunk key within the store.
        key: String,
        /// File path.
        path: PathBuf,
        /// The decoder's error.
        message: String,
    },
    /// A chunk index outside the array's chunk grid.
    #[error("chunk index {index:?} is outside array `{array}`'s chunk grid {grid:?}")]
    ChunkIndex {
        /// Array path.
        array: String,
        /// The index given.
        index: Vec<u64>,
        /// Chunks per dimension.
        grid: Vec<u64>,
    },
    /// The runtime failed to run the operation (shut down, or a panicking task).
    #[error("runtime: {0}")]
    Runtime(#[from] insitubatch_runtime::TaskError),
}

/// What to do about an IO error the user can fix, as a clause to append ("" for the rest).
fn io_hint(e: &std::io::Error) -> String {
    insitubatch_runtime::fs::out_of_descriptors_hint(e)
        .map(|hint| format!("; {hint}"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_file_limit_says_what_to_lower_or_raise() {
        let err = |code| StoreError::Io {
            path: PathBuf::from("/data/era5.zarr/t2m/c/0/0/0"),
            source: std::io::Error::from_raw_os_error(code),
        };
        let emfile = err(libc::EMFILE).to_string();
        assert!(
            emfile.starts_with("reading /data/era5.zarr/t2m/c/0/0/0: "),
            "{emfile}"
        );
        assert!(
            emfile.contains("max_inflight") && emfile.contains("ulimit -n"),
            "{emfile}"
        );
        assert!(err(libc::ENFILE).to_string().contains("fs.file-max"));
        // Other errors are left as the OS put them.
        let eio = err(libc::EIO).to_string();
        assert!(
            !eio.contains("max_inflight") && !eio.ends_with("; "),
            "{eio}"
        );
    }
}
