//! Object stores (S3, Google Cloud Storage, Azure Blob, plain HTTP) through the `object_store`
//! crate.
//!
//! `object_store`'s clients are tokio futures, and the insitubatch executors are not a tokio
//! runtime, so every [`RemoteStore`] owns a small tokio runtime of its own: a request is spawned
//! there and the executor task that asked awaits its join handle. Dropping that await (a
//! cancelled pass) aborts the request. Credentials and endpoints come from the usual
//! environment variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`) and from `storage_options`, which
//! take the same keys.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{
    ClientConfigKey, GetOptions, GetRange, ObjectStore, ObjectStoreExt, ObjectStoreScheme,
    RetryConfig, aws, azure, gcp, http,
};
use url::Url;

use crate::error::StoreError;
use crate::store::Store;

/// A ranged read the server answered whole gets a hint saying what that means.
fn ranges_refused(e: StoreError) -> StoreError {
    match e {
        StoreError::Remote { url, message, .. }
            if message.contains("non-partial")
                || message.contains("Range request not supported") =>
        {
            StoreError::Remote {
                url,
                message,
                hint: "; reading part of a shard (a cropped view) needs a server that answers \
                       byte-range requests: serve the store from one that does (every object \
                       store does), or read the whole field"
                    .to_string(),
            }
        }
        e => e,
    }
}

/// The storage option, insitubatch's own, that sets the threads of a remote store's client
/// runtime. They only drive sockets and TLS (decoding stays on the executor threads), roughly
/// 2 GB/s of HTTPS bodies each (an estimate from AES-GCM and framing costs, not measured on
/// the 2-core machines here), so the default grows with the machine: one per 8 cores, 2 to 8.
pub const CLIENT_THREADS_OPTION: &str = "client_threads";

/// The most client threads `client_threads` may ask for.
const MAX_CLIENT_THREADS: usize = 64;

/// The client threads of a store opened without `client_threads`: one per 8 cores, 2 to 8.
pub fn default_client_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 8).clamp(2, 8)
}

/// Retries of one request (throttling, 5xx, dropped connections), with exponential backoff,
/// and the time after which a request stops being retried. A refused connection therefore
/// fails within seconds rather than after `object_store`'s default of three minutes.
const MAX_RETRIES: usize = 5;
const RETRY_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `location` names an object store (`scheme://...`) rather than a local directory.
/// `file://` URLs are local: they are read through the runtime like any directory.
pub(crate) fn is_url(location: &str) -> bool {
    location.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
    })
}

/// A Zarr store in an object store or behind an HTTP server, read-only.
#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// The location as the user gave it (without a trailing `/`), for messages.
    url: String,
    store: Arc<dyn ObjectStore>,
    /// The store root inside `store`.
    prefix: ObjectPath,
    client: ClientRuntime,
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStore")
            .field("url", &self.inner.url)
            .finish()
    }
}

/// The tokio runtime a remote store's requests run on. Shut down without waiting when the
/// last clone of the store goes, so dropping a dataset never blocks on a request in flight.
struct ClientRuntime(Option<tokio::runtime::Runtime>);

impl Drop for ClientRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl RemoteStore {
    /// A store rooted at `url` (`s3://bucket/prefix`, `gs://`, `az://`, `abfs://`,
    /// `http(s)://host/path`), configured from the environment and then `options` (keys as
    /// `object_store` names them, e.g. `aws_endpoint`, `aws_region`, `google_service_account`,
    /// `azure_storage_account_name`, `timeout`; and [`CLIENT_THREADS_OPTION`], the threads
    /// that drive its requests, 1 to 64, default [`default_client_threads`]). Nothing is
    /// requested yet.
    pub fn open(url: &str, options: &[(String, String)]) -> Result<Self, StoreError> {
        let url = url.trim_end_matches('/');
        let bad = |message: String| StoreError::BadUrl {
            url: url.to_string(),
            message,
        };
        let parsed = Url::parse(url).map_err(|e| bad(format!("not a URL ({e})")))?;
        let unreadable = || {
            bad(format!(
                "`{}://` is not a store insitubatch can read; use a local path or an s3://, \
                 gs://, az://, abfs://, http:// or https:// URL",
                parsed.scheme()
            ))
        };
        let (scheme, prefix) = ObjectStoreScheme::parse(&parsed).map_err(|_| unreadable())?;
        let ours = |k: &str| k.eq_ignore_ascii_case(CLIENT_THREADS_OPTION);
        let client_threads = match options.iter().rev().find(|(k, _)| ours(k)) {
            None => default_client_threads(),
            Some((_, v)) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_CLIENT_THREADS).contains(n))
                .ok_or_else(|| {
                    bad(format!(
                        "storage option `{CLIENT_THREADS_OPTION}` = {v:?} is not a number of \
                         threads from 1 to {MAX_CLIENT_THREADS}"
                    ))
                })?,
        };
        let options = options.iter().filter(|(k, _)| !ours(k));
        let retry = RetryConfig {
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
            ..RetryConfig::default()
        };
        let unknown = |key: &str| {
            bad(format!(
                "unknown storage option `{key}` for a {} store; see the object_store \
                 configuration keys for it",
                parsed.scheme()
            ))
        };
        // Each builder has its own key type; the options are parsed as that builder's keys.
        macro_rules! configured {
            ($builder:expr) => {{
                let mut b = $builder;
                for (k, v) in options.clone() {
                    b = b.with_config(k.to_ascii_lowercase().parse().map_err(|_| unknown(k))?, v);
                }
                b.with_retry(retry)
                    .build()
                    .map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }};
        }
        let built = match scheme {
            ObjectStoreScheme::AmazonS3 => {
                configured!(aws::AmazonS3Builder::from_env().with_url(url))
            }
            ObjectStoreScheme::GoogleCloudStorage => {
                configured!(gcp::GoogleCloudStorageBuilder::from_env().with_url(url))
            }
            ObjectStoreScheme::MicrosoftAzure => {
                configured!(azure::MicrosoftAzureBuilder::from_env().with_url(url))
            }
            // The user wrote `http://`, so plain HTTP is what they asked for.
            ObjectStoreScheme::Http => configured!(
                http::HttpBuilder::new()
                    .with_url(&parsed[..url::Position::BeforePath])
                    .with_config(ClientConfigKey::AllowHttp, "true")
            ),
            // `file://` is opened as a local directory before it gets here; `memory://` holds
            // nothing to read.
            _ => return Err(unreadable()),
        };
        let store = built.map_err(|e| bad(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(client_threads)
            .thread_name("isb-objstore")
            .enable_all()
            .build()
            .map_err(|e| bad(format!("cannot start its client threads: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                url: url.to_string(),
                store,
                prefix,
                client: ClientRuntime(Some(rt)),
            }),
        })
    }

    /// The store's URL (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The threads driving this store's requests (`client_threads`).
    pub fn client_threads(&self) -> usize {
        self.inner
            .client
            .0
            .as_ref()
            .map_or(0, |rt| rt.metrics().num_workers())
    }

    fn path(&self, key: &str) -> ObjectPath {
        key.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.inner.prefix.clone(), |p, part| p.join(part))
    }

    /// Runs `request` on the client runtime and awaits it from whichever executor asked. A
    /// failure names `key`'s URL, followed by `hint`.
    async fn request<T, F>(&self, key: &str, request: F, hint: &str) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = object_store::Result<T>> + Send + 'static,
    {
        let rt = self
            .inner
            .client
            .0
            .as_ref()
            .expect("the runtime lives until drop");
        let message = match Spawned(rt.spawn(request)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => first_line(&e.to_string()),
            Err(e) => format!("the request task failed: {e}"),
        };
        Err(StoreError::Remote {
            url: self.locate(key).display().to_string(),
            message,
            hint: hint.to_string(),
        })
    }
}

/// A request spawned on a remote store's runtime, awaitable from any executor. Dropping it
/// (a cancelled pass) aborts the request.
struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Future for Spawned<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The first line of a client error, without the HTML page a web server may have sent as its
/// body, and at most `MAX` characters: the status and what the client did are in it.
fn first_line(message: &str) -> String {
    const MAX: usize = 600;
    let mut line = message.lines().next().unwrap_or_default();
    if let Some(at) = line.find("<!DOCTYPE").or_else(|| line.find("<html")) {
        line = line[..at].trim_end_matches([' ', ':']);
    }
    match line.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}...", &line[..at]),
        None => line.to_string(),
    }
}

/// `Ok(None)` for a missing object, the value otherwise.
fn found<T>(r: object_store::Result<T>) -> object_store::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

impl RemoteStore {
    /// The size of every object under `prefix`, keyed relative to the store root (one listing,
    /// however many chunks: a size per chunk would be a request per chunk).
    pub async fn sizes_under(&self, prefix: &str) -> Result<HashMap<String, u64>, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(prefix));
        let root = self.inner.prefix.clone();
        let list = async move {
            let objects: Vec<_> = store.list(Some(&path)).try_collect().await?;
            Ok(objects
                .into_iter()
                .filter_map(|o| {
                    let parts: Vec<_> = o.location.prefix_match(&root)?.collect();
                    let key = parts
                        .iter()
                        .map(|p| p.as_ref())
                        .collect::<Vec<_>>()
                        .join("/");
                    Some((key, o.size))
                })
                .collect())
        };
        self.request(prefix, list, "").await
    }
}

impl Store for RemoteStore {
    fn locate(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            PathBuf::from(&self.inner.url)
        } else {
            PathBuf::from(format!("{}/{key}", self.inner.url))
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(key));
        let get = async move {
            match found(store.get(&path).await)? {
                Some(got) => Ok(Some(Vec::from(got.bytes().await?))),
                None => Ok(None),
            }
        };
        self.request(key, get, "").await
    }

    async fn get_suffix(&self, key: &str, n: u64) -> Result<Option<(Vec<u8>, u64)>, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(key));
        let get = async move {
            let options = GetOptions::default().with_range(Some(GetRange::Suffix(n)));
            match found(store.get_opts(&path, options).await)? {
                Some(got) => {
                    let len = got.meta.size;
                    Ok(Some((Vec::from(got.bytes().await?), len)))
                }
                None => Ok(None),
            }
        };
        self.request(key, get, "").await.map_err(ranges_refused)
    }

    async fn get_ranges(
        &self,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(key));
        let ranges = ranges.to_vec();
        let get = async move {
            // The client merges nearby ranges into fewer requests.
            match found(store.get_ranges(&path, &ranges).await)? {
                Some(parts) => Ok(Some(parts.into_iter().map(Vec::from).collect())),
                None => Ok(None),
            }
        };
        self.request(key, get, "").await.map_err(ranges_refused)
    }

    async fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(key));
        let head = async move { found(store.head(&path).await).map(|m| m.is_some()) };
        self.request(key, head, "").await
    }

    async fn list_dir(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let (store, path) = (self.inner.store.clone(), self.path(prefix));
        let list = async move { store.list_with_delimiter(Some(&path)).await };
        let hint = "; a store that cannot be listed (a plain HTTP server) needs consolidated \
                    metadata: run zarr.consolidate_metadata on it";
        let listed = self.request(prefix, list, hint).await?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .chain(listed.objects.iter().map(|o| &o.location))
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn size_of(&self, _key: &str) -> Option<u64> {
        // A size is a request away; callers treat None as "unknown".
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_told_from_paths() {
        assert!(is_url("s3://bucket/era5.zarr"));
        assert!(is_url("https://example.org/era5.zarr"));
        assert!(!is_url("/data/era5.zarr"));
        assert!(!is_url("era5.zarr"));
        assert!(!is_url("://odd"));
        assert!(!is_url("dir with :// inside/x"));
    }

    #[test]
    fn an_unknown_scheme_or_option_is_refused_by_name() {
        let err = RemoteStore::open("ftp://host/era5.zarr", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("ftp://") && err.contains("s3://"), "{err}");
        let opts = [("no_such_key".to_string(), "1".to_string())];
        let err = RemoteStore::open("http://127.0.0.1:9/era5.zarr", &opts)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no_such_key") && err.contains("http://127.0.0.1:9/era5.zarr"),
            "{err}"
        );
    }

    #[test]
    fn a_client_error_is_cut_to_its_first_line_without_the_web_page() {
        let m = "Error performing PROPFIND http://h/s.zarr - Server returned non-2xx status code: \
                 501 Not Implemented: <!DOCTYPE HTML>\n<html>\n<p>Unsupported</p></html>";
        assert_eq!(
            first_line(m),
            "Error performing PROPFIND http://h/s.zarr - Server returned non-2xx status code: \
             501 Not Implemented"
        );
        let long = "x".repeat(2000);
        assert_eq!(first_line(&long).len(), 603);
    }

    #[test]
    fn client_threads_default_with_the_cores_and_are_set_by_their_option() {
        let default = RemoteStore::open("http://127.0.0.1:9/era5.zarr", &[]).unwrap();
        assert_eq!(default.client_threads(), default_client_threads());
        assert!((2..=8).contains(&default_client_threads()));
        for n in [1, 3, 64] {
            // Case as any storage option's, and beside object_store's own keys.
            let opts = [
                ("Client_Threads".to_string(), n.to_string()),
                ("timeout".to_string(), "5s".to_string()),
            ];
            let s = RemoteStore::open("http://127.0.0.1:9/era5.zarr", &opts).unwrap();
            assert_eq!(s.client_threads(), n);
        }
        for bad in ["0", "65", "two", "-1"] {
            let opts = [(CLIENT_THREADS_OPTION.to_string(), bad.to_string())];
            let err = RemoteStore::open("http://127.0.0.1:9/era5.zarr", &opts)
                .expect_err("refused")
                .to_string();
            assert!(
                err.contains("client_threads") && err.contains(bad) && err.contains("1 to 64"),
                "{err}"
            );
        }
    }

    #[test]
    fn keys_map_under_the_prefix() {
        let s = RemoteStore::open("http://127.0.0.1:9/data/era5.zarr/", &[]).unwrap();
        assert_eq!(s.url(), "http://127.0.0.1:9/data/era5.zarr");
        assert_eq!(s.path("t2m/c/0/0").as_ref(), "data/era5.zarr/t2m/c/0/0");
        assert_eq!(s.path("").as_ref(), "data/era5.zarr");
        assert_eq!(
            s.locate("t2m/zarr.json"),
            PathBuf::from("http://127.0.0.1:9/data/era5.zarr/t2m/zarr.json")
        );
    }
}
