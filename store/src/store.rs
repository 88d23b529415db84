//! Where bytes come from: the [`Store`] trait, the local file system backend, and [`AnyStore`],
//! which opens a path or a URL.
//!
//! Keys are `/`-separated paths relative to the store root, as Zarr defines them. The local
//! backend reads through the insitubatch runtime (io_uring or the blocking pool), so its futures
//! must be awaited on an executor thread. The object-store backend ([`RemoteStore`]) implements
//! the same trait by forwarding to its own client runtime.

use std::future::Future;
use std::path::{Path, PathBuf};

use insitubatch_runtime::fs;

use crate::error::StoreError;
use crate::remote::{RemoteStore, is_url};

/// A key-value view of a Zarr store.
pub trait Store: Send + Sync + 'static {
    /// Where `key` lives, for error messages (a file path or a URL).
    fn locate(&self, key: &str) -> PathBuf;

    /// The whole value, or `None` when the key does not exist.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>>;

    /// [`Store::get`] into a recycled buffer (`buf`'s capacity is reused; it is returned with
    /// the value, or dropped when the key does not exist).
    fn get_into(
        &self,
        key: &str,
        buf: Vec<u8>,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> {
        drop(buf);
        self.get(key)
    }

    /// The last `n` bytes of a value (all of it when shorter) and the value's whole length, or
    /// `None` when the key does not exist. The default reads the whole value.
    fn get_suffix(
        &self,
        key: &str,
        n: u64,
    ) -> impl Future<Output = Result<Option<(Vec<u8>, u64)>, StoreError>> {
        let whole = self.get(key);
        async move {
            Ok(whole.await?.map(|b| {
                let len = b.len() as u64;
                let start = len.saturating_sub(n) as usize;
                (b[start..].to_vec(), len)
            }))
        }
    }

    /// The byte ranges `ranges` of a value, in order (a range past its end comes back short),
    /// or `None` when the key does not exist. The default reads the whole value.
    fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> impl Future<Output = Result<Option<Vec<Vec<u8>>>, StoreError>> {
        let whole = self.get(key);
        let ranges = ranges.to_vec();
        async move {
            Ok(whole.await?.map(|b| {
                ranges
                    .iter()
                    .map(|r| {
                        let end = (r.end as usize).min(b.len());
                        b[(r.start as usize).min(end)..end].to_vec()
                    })
                    .collect()
            }))
        }
    }

    /// Whether the key exists.
    fn exists(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>>;

    /// Names of the direct children of the `prefix` directory (for metadata discovery when a
    /// group has no consolidated metadata), sorted.
    fn list_dir(&self, prefix: &str) -> impl Future<Output = Result<Vec<String>, StoreError>>;

    /// Size in bytes of a stored value without reading it, if the backend knows it cheaply.
    fn size_of(&self, key: &str) -> Option<u64>;
}

/// A Zarr store in a local directory (local NVMe or a mounted parallel file system).
#[derive(Clone, Debug)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// A store rooted at `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> Result<Self, StoreError> {
        let root = root.as_ref().to_path_buf();
        match std::fs::metadata(&root) {
            Ok(m) if m.is_dir() => Ok(Self { root }),
            Ok(_) => Err(StoreError::NotZarr { path: root }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(StoreError::NotFound { path: root })
            }
            Err(source) => Err(StoreError::Io { path: root, source }),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl LocalStore {
    /// The file of `key` opened for reading (`None` when it does not exist), with what turns
    /// an IO error on it into one naming its path.
    async fn open_existing(
        &self,
        key: &str,
    ) -> Result<Option<(fs::File, impl Fn(std::io::Error) -> StoreError)>, StoreError> {
        let path = self.locate(key);
        match fs::File::open(&path, fs::OpenOptions::read()).await {
            Ok(file) => Ok(Some((file, move |source| StoreError::Io {
                path: path.clone(),
                source,
            }))),
            Err(e) if missing(&e) => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }
}

fn missing(e: &std::io::Error) -> bool {
    // ENOTDIR: a path component is a file, so the key cannot exist either.
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(20)
}

impl Store for LocalStore {
    fn locate(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            self.root.clone()
        } else {
            self.root.join(key)
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.locate(key);
        match fs::read(&path).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if missing(&e) => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    async fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.locate(key);
        match fs::read_into(&path, buf).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if missing(&e) => Ok(None),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    async fn get_suffix(&self, key: &str, n: u64) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
        let Some((file, io)) = self.open_existing(key).await? else {
            return Ok(None);
        };
        let len = file.stat().await.map_err(&io)?.len;
        let start = len.saturating_sub(n);
        let bytes = file
            .read_exact_at(start, (len - start) as usize)
            .await
            .map_err(&io)?;
        Ok(Some((bytes, len)))
    }

    async fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let Some((file, io)) = self.open_existing(key).await? else {
            return Ok(None);
        };
        // Issued together, so reads the device must serve overlap.
        let reads = ranges
            .iter()
            .map(|r| file.read_exact_at(r.start, (r.end - r.start) as usize));
        let parts = futures_util::future::try_join_all(reads)
            .await
            .map_err(&io)?;
        Ok(Some(parts))
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.locate(key);
        match std::fs::metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if missing(&e) => Ok(false),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    async fn list_dir(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let path = self.locate(prefix);
        let rd = std::fs::read_dir(&path).map_err(|source| StoreError::Io {
            path: path.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        std::fs::metadata(self.locate(key))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }
}

/// A store opened from a location string: a local directory (or a `file://` URL) read through
/// the runtime, or an object store ([`RemoteStore`]). The engine is generic over [`Store`];
/// this enum is what a dataset opened by location holds.
#[derive(Clone, Debug)]
pub enum AnyStore {
    /// A local directory.
    Local(LocalStore),
    /// An object store or HTTP server.
    Remote(RemoteStore),
}

impl AnyStore {
    /// Opens `location`: an `s3://`, `gs://`, `az://`, `abfs://` or `http(s)://` URL through
    /// the object-store client (configured from the environment, then `options`), anything else
    /// as a local directory (`file://` stripped; a path that is not UTF-8 can only be local).
    /// `options` given for a local directory are refused, since nothing would read them.
    pub fn open(location: &Path, options: &[(String, String)]) -> Result<Self, StoreError> {
        if let Some(text) = location.to_str() {
            if let Some(path) = text.strip_prefix("file://") {
                return Self::open(Path::new(path), options);
            }
            if is_url(text) {
                return RemoteStore::open(text, options).map(Self::Remote);
            }
        }
        if let Some((key, _)) = options.first() {
            return Err(StoreError::BadUrl {
                url: location.display().to_string(),
                message: format!(
                    "storage option `{key}` was given for a local directory; storage options \
                     configure object stores (s3://, gs://, az://, http(s)://) only"
                ),
            });
        }
        LocalStore::new(location).map(Self::Local)
    }

    /// Whether reads go over a network (object store or HTTP), where more reads in flight pay.
    pub fn is_remote(&self) -> bool {
        matches!(self, Self::Remote(_))
    }
}

impl Store for AnyStore {
    fn locate(&self, key: &str) -> PathBuf {
        match self {
            Self::Local(s) => s.locate(key),
            Self::Remote(s) => s.locate(key),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Self::Local(s) => s.get(key).await,
            Self::Remote(s) => s.get(key).await,
        }
    }

    async fn get_into(&self, key: &str, buf: Vec<u8>) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Self::Local(s) => s.get_into(key, buf).await,
            Self::Remote(s) => s.get_into(key, buf).await,
        }
    }

    async fn get_suffix(&self, key: &str, n: u64) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
        match self {
            Self::Local(s) => s.get_suffix(key, n).await,
            Self::Remote(s) => s.get_suffix(key, n).await,
        }
    }

    async fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        match self {
            Self::Local(s) => s.get_ranges(key, ranges).await,
            Self::Remote(s) => s.get_ranges(key, ranges).await,
        }
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            Self::Local(s) => s.exists(key).await,
            Self::Remote(s) => s.exists(key).await,
        }
    }

    async fn list_dir(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        match self {
            Self::Local(s) => s.list_dir(prefix).await,
            Self::Remote(s) => s.list_dir(prefix).await,
        }
    }

    fn size_of(&self, key: &str) -> Option<u64> {
        match self {
            Self::Local(s) => s.size_of(key),
            Self::Remote(s) => s.size_of(key),
        }
    }
}
