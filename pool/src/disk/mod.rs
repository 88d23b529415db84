//! The NVMe tier: slots as `.npy` files in `cache_dir`, mapped read-only, written with the
//! runtime's file IO (io_uring or the thread fallback) under a temporary name and renamed into
//! place; with `persist` an append-only log makes them survive the process.
//!
//! Guarantees and guards (the spec's "Cross-run persistence"):
//! - the cache key is (array path, absolute chunk index along the sample axis);
//! - a file is logged only after it is complete and renamed, one line per chunk, so a killed
//!   writer leaves only complete, logged files (and perhaps unlogged ones, overwritten later);
//! - every entry carries its array's fingerprint (the chunk-transform pipeline scoped to the
//!   array, and the log format); a stale array raises at open unless `reset_stale`, which
//!   deletes just that array's files;
//! - an entry whose shape or dtype no longer matches, or whose file is missing or damaged, is a
//!   miss; an unreadable header, a malformed interior line or a file name that is not a bare
//!   basename raises;
//! - one writer per directory (`flock`), any number of `readonly` readers, and a readonly miss
//!   is an error naming the array and chunk.
#![allow(unsafe_code)]

mod lock;
mod log;
mod npy;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use insitubatch_runtime::fs::{File, OpenOptions, out_of_descriptors_hint};
use insitubatch_runtime::sync::Semaphore;
use insitubatch_runtime::{DIRECT_IO_ALIGN, IoBuf};

pub use self::lock::LOCK_NAME;
pub use self::log::{FORMAT_VERSION, LOG_NAME, LogEntry};
pub use self::npy::HEADER_LEN;
use crate::batch_buffer::BufferPool;
use crate::lock as lock_mutex;
use crate::slot::{SlotBytes, SlotKey};

/// Slot bytes a cache directory keeps being written at once: enough files in flight that each
/// one's creation and rename (the file system's work, serial per directory) hide behind the
/// others' writes. With 464 KiB slots a cache-filling epoch was faster with 16 files in flight
/// than with 4 in each of three rounds, by 14 to 103 % (docs/benchmarks.md, "NVMe tier").
pub const WRITE_BYTES_IN_FLIGHT: u64 = 16 << 20;
/// Fewest slot files written at once, however large the slots. (An ephemeral spill writes as
/// many as a persisted cache: a slot evicted while its file is written keeps its room in the
/// budget until the file is gone, so the files on disk never exceed the budget.)
pub const MIN_WRITES_IN_FLIGHT: u64 = 4;
/// Most slot files written at once, however small the slots.
pub const MAX_WRITES_IN_FLIGHT: u64 = 16;

/// Slot files a cache directory writes at once for slots of at most `slot_bytes`:
/// [`WRITE_BYTES_IN_FLIGHT`] of them, within [`MIN_WRITES_IN_FLIGHT`] and
/// [`MAX_WRITES_IN_FLIGHT`].
pub fn writes_in_flight(slot_bytes: u64) -> u64 {
    (WRITE_BYTES_IN_FLIGHT / slot_bytes.max(1)).clamp(MIN_WRITES_IN_FLIGHT, MAX_WRITES_IN_FLIGHT)
}

/// Room for one slot-file write ([`DiskTier::reserve_write`]); released when the write ends.
#[derive(Debug)]
pub struct WritePermit(
    #[allow(dead_code, reason = "held for its Drop")] insitubatch_runtime::sync::Permit,
);

// SAFETY: the bytes live in an `Arc` (a heap buffer or a mapping) that moves with the value
// and is immutable; `memory().len()` bytes are initialised (none for a file range, which is
// never handed to a write: `DiskTier::write` refuses it).
unsafe impl IoBuf for SlotBytes {
    fn stable_ptr(&self) -> *const u8 {
        self.memory()
            .map_or(std::ptr::NonNull::dangling().as_ptr(), <[u8]>::as_ptr)
    }
    fn bytes_init(&self) -> usize {
        self.memory().map_or(0, <[u8]>::len)
    }
}

/// How the pool uses a cache directory.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// The directory (created if missing). It is the dataset's identity: one per source.
    pub dir: PathBuf,
    /// Keep slot files and log them, so later runs revive them.
    pub persist: bool,
    /// Take the lock shared, write nothing, and make a miss an error (implies reading the
    /// persisted log).
    pub readonly: bool,
    /// Delete the files of arrays whose fingerprint changed instead of raising.
    pub reset_stale: bool,
    /// Write slot files with O_DIRECT where the file system accepts it.
    pub direct_io: bool,
    /// Test hook: every write after this many fails with ENOSPC.
    #[doc(hidden)]
    pub fail_writes_after: Option<u64>,
}

impl CacheConfig {
    /// Ephemeral spill into `dir` (files unlinked on eviction and on close).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            persist: false,
            readonly: false,
            reset_stale: false,
            direct_io: true,
            fail_writes_after: None,
        }
    }
}

/// What the tier needs to know about one array.
#[derive(Clone, Debug)]
pub struct ArrayMeta {
    /// Array path.
    pub path: String,
    /// Shape of one slot: `[samples_per_chunk, *inner_shape]`.
    pub slot_shape: Vec<u64>,
    /// Numpy type string of the decoded data.
    pub descr: String,
    /// The array's fingerprint ([`fingerprint`]).
    pub fingerprint: String,
}

/// The 16-hex fingerprint of an array's chunk-transform pipeline: the log format version and
/// each transform's full identity (its parameters, never a hash of its source), in order.
/// With no transforms it still changes with the log format.
pub fn fingerprint(transforms: &[&str]) -> String {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + transforms.len());
    let format = format!("{} v{FORMAT_VERSION}", log::FORMAT_NAME);
    parts.push(format.as_bytes());
    parts.extend(transforms.iter().map(|t| t.as_bytes()));
    format!("{:016x}", fnv1a(&parts))
}

/// FNV-1a 64 over length-prefixed parts (so ["ab", "c"] and ["a", "bc"] differ): stable across
/// builds and platforms, unlike std's hasher.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Cache-directory errors. Each names the directory or file and says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// A file-system call failed.
    #[error("cannot {action} {path}: {message}{hint}")]
    Io {
        /// What we tried.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        message: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// Another process, or another dataset of this one, holds the directory's lock.
    #[error(
        "cache_dir {dir} is locked by {holder}; the {wanted} lock cannot be \
         taken. One writer per cache_dir: wait for it to finish, give this job its own cache_dir, \
         or pass readonly_cache=True to read a finished cache beside other readers. Do not delete \
         {LOCK_NAME}: that releases nothing"
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// The lock we wanted.
        wanted: &'static str,
        /// Who holds it, as words ("another process (pid 7 on host n1)").
        holder: String,
    },
    /// Arrays whose cached chunks were made by a different pipeline or log format.
    #[error(
        "cache_dir {dir} holds stale chunks for [{arrays}] ({why}); pass \
         reset_stale_cache=True to delete just those arrays' files and rebuild them, or delete \
         the directory"
    )]
    Stale {
        /// The directory.
        dir: PathBuf,
        /// The stale arrays.
        arrays: String,
        /// Why they are stale.
        why: String,
    },
    /// The log is damaged.
    #[error(
        "the cache log {path} is damaged at line {line}: {why}. It was not written by a \
         complete insitubatch append; delete the cache directory to rebuild it"
    )]
    Corrupt {
        /// The log.
        path: PathBuf,
        /// 1-based line (0: the whole file).
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// Options that contradict each other.
    #[error("{0}")]
    Conflict(String),
}

impl CacheError {
    fn io(action: &'static str, path: &Path, e: std::io::Error) -> Self {
        let hint = match e.raw_os_error() {
            Some(libc::EROFS) => {
                "; the file system is mounted read-only: choose a writable cache_dir, or pass \
                 readonly_cache=True to read a cache another job warmed"
            }
            Some(libc::EACCES | libc::EPERM) => {
                "; permission denied: choose a cache_dir this user may write"
            }
            Some(libc::ENOSPC) => "; the device is full: free space or lower the budget",
            Some(libc::EEXIST | libc::ENOTDIR) => {
                "; a file is in the way: cache_dir must be a directory (or a path to create one)"
            }
            _ => "",
        };
        CacheError::Io {
            action,
            path: path.to_path_buf(),
            message: e.to_string(),
            hint,
        }
    }
}

/// The data section of a slot file, mapped read-only.
pub struct MappedFile {
    map: memmap2::Mmap,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("len", &self.len)
            .finish()
    }
}

impl MappedFile {
    /// Maps `len` bytes at `offset` of an open slot file read-only (no page is touched yet).
    pub fn map_range(
        file: &impl std::os::fd::AsRawFd,
        offset: u64,
        len: usize,
    ) -> std::io::Result<MappedFile> {
        // SAFETY: slot files are only ever replaced by rename, never modified in place, so the
        // mapped inode does not change under us (a process truncating one by hand breaks that, as
        // for any mapped file; the cache documents that its files are ours).
        let map = unsafe { memmap2::Mmap::map(file.as_raw_fd()) }?;
        if map.len() < offset as usize + len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the slot file is shorter than its header says",
            ));
        }
        Ok(MappedFile {
            map,
            offset: offset as usize,
            len,
        })
    }

    /// The array's bytes.
    pub fn data(&self) -> &[u8] {
        &self.map[self.offset..self.offset + self.len]
    }
}

/// Counters of the tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Slot files written and renamed into place.
    pub writes: u64,
    /// Bytes of those files.
    pub write_bytes: u64,
    /// Writes that failed (the slot stayed on the heap).
    pub write_errors: u64,
    /// Ephemeral spill writes not started because their slot had been evicted while the write
    /// waited for its turn (the file would have been unlinked as it landed).
    pub writes_skipped: u64,
    /// Slots revived from files.
    pub revived: u64,
    /// Log entries consulted and rejected (file missing, damaged or of another geometry).
    pub rejected: u64,
}

/// Outcome of looking a key up in the tier.
pub(crate) enum Revive {
    /// Not in the cache.
    Absent,
    /// In the log but unusable (counted in `rejected`).
    Rejected,
    /// The file is there and its header and size match: read its data.
    File(CachedFile),
    /// The file could not be opened for a reason that is not the file's (the process or the
    /// system is out of descriptors): the entry stays, and the admission fails with this message.
    Failed(String),
}

/// A slot file whose header and size were checked: its data is `len` bytes at `offset`.
#[derive(Debug)]
pub struct CachedFile {
    /// The open file (it knows its path, for errors).
    pub file: File,
    /// Where the data starts.
    pub offset: u64,
    /// Data bytes.
    pub len: usize,
}

/// A log entry to check a file against: the file and the geometry its header must have.
struct Logged {
    path: PathBuf,
    dtype: String,
    shape: Vec<u64>,
}

/// A probe's outcome once the logged file at `path` is opened and checked (`Ok(None)`: missing
/// or unusable).
fn revived(path: &Path, file: std::io::Result<Option<File>>, nbytes: u64) -> Revive {
    match file {
        Ok(Some(file)) => Revive::File(CachedFile {
            file,
            offset: HEADER_LEN as u64,
            len: nbytes as usize,
        }),
        Ok(None) => Revive::Rejected,
        Err(e) => Revive::Failed(format!(
            "cache file {}: {e}; {}",
            path.display(),
            out_of_descriptors_hint(&e).unwrap_or_default()
        )),
    }
}

struct TierState {
    index: HashMap<SlotKey, LogEntry>,
    /// Entries the load dropped (file missing, other geometry): the first touch of each is a
    /// rejected consultation, not a plain miss.
    dropped: HashSet<SlotKey>,
    log: Option<std::fs::File>,
    spilled: HashSet<PathBuf>,
    stats: DiskStats,
    warnings: Vec<String>,
    warned_write: bool,
}

/// An open cache directory.
pub struct DiskTier {
    config: CacheConfig,
    arrays: HashMap<String, ArrayMeta>,
    state: Mutex<TierState>,
    direct_ok: AtomicBool,
    tmp_counter: AtomicU64,
    write_attempts: AtomicU64,
    writes_in_flight: Semaphore,
    /// See [`DiskTier::write_bytes`].
    write_bytes: u64,
    /// Called as an ephemeral file is about to be unlinked (tests of who unlinks, and when).
    #[cfg(test)]
    unlink_hook: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
    /// Aligned buffers for O_DIRECT writes, reused (as many as were ever in flight at once,
    /// which the write permits bound), so a write neither allocates nor faults in fresh pages.
    write_buffers: BufferPool,
    _lock: lock::DirLock,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier")
            .field("dir", &self.config.dir)
            .field("persist", &self.persist())
            .finish()
    }
}

impl DiskTier {
    /// Opens (creating if needed) the cache directory for `arrays`: takes the lock, loads and
    /// checks the log, raises on stale arrays (or resets them) and on damage.
    pub fn open(config: CacheConfig, arrays: Vec<ArrayMeta>) -> Result<Self, CacheError> {
        if config.readonly && config.reset_stale {
            return Err(CacheError::Conflict(format!(
                "readonly_cache=True writes nothing, so it cannot reset_stale_cache in {}; run one \
                 writing job with reset_stale_cache=True first",
                config.dir.display()
            )));
        }
        let dir = &config.dir;
        if config.readonly {
            if !dir.is_dir() {
                return Err(CacheError::io(
                    "open the readonly cache directory",
                    dir,
                    std::io::Error::from_raw_os_error(libc::ENOENT),
                ));
            }
        } else {
            std::fs::create_dir_all(dir)
                .map_err(|e| CacheError::io("create the cache directory", dir, e))?;
        }
        let mut warnings = Vec::new();
        if let Some(fs) = lock::network_fs(dir) {
            warnings.push(format!(
                "cache_dir {} is on {fs}, a network file system where flock may not be \
                 arbitrated between nodes: two writers could corrupt each other's files; use \
                 node-local storage, or one writer at a time",
                dir.display()
            ));
        }
        let dir_lock = lock::acquire(dir, config.readonly, &mut warnings)?;
        let arrays: HashMap<String, ArrayMeta> =
            arrays.into_iter().map(|a| (a.path.clone(), a)).collect();
        let mut state = TierState {
            index: HashMap::new(),
            dropped: HashSet::new(),
            log: None,
            spilled: HashSet::new(),
            stats: DiskStats::default(),
            warnings,
            warned_write: false,
        };
        if config.persist || config.readonly {
            load_log(&config, &arrays, &mut state)?;
        }
        if !config.readonly {
            remove_temporaries(dir);
        }
        let largest_slot = arrays
            .values()
            .filter_map(|a| data_bytes(&a.descr, &a.slot_shape))
            .max()
            .unwrap_or(0);
        let writes = writes_in_flight(largest_slot);
        let write_bytes = if config.readonly {
            0
        } else {
            // Each write holds its slot's bytes (an evicted slot stays on the heap until its
            // file lands) and, with O_DIRECT, an aligned copy of header and slot.
            let file = (HEADER_LEN as u64 + largest_slot)
                .next_multiple_of(insitubatch_runtime::DIRECT_IO_ALIGN as u64);
            writes.saturating_mul(largest_slot.saturating_add(file))
        };
        Ok(Self {
            direct_ok: AtomicBool::new(config.direct_io),
            config,
            arrays,
            state: Mutex::new(state),
            tmp_counter: AtomicU64::new(0),
            write_attempts: AtomicU64::new(0),
            writes_in_flight: Semaphore::new("cache writes in flight", writes),
            write_bytes,
            #[cfg(test)]
            unlink_hook: Mutex::new(None),
            write_buffers: BufferPool::new(),
            _lock: dir_lock,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// True when files and log survive the process.
    pub fn persist(&self) -> bool {
        self.config.persist || self.config.readonly
    }

    /// True for `readonly_cache`.
    pub fn readonly(&self) -> bool {
        self.config.readonly
    }

    /// Counters so far.
    pub fn stats(&self) -> DiskStats {
        lock_mutex(&self.state).stats
    }

    /// Warnings not yet taken (construction and write failures), each once.
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut lock_mutex(&self.state).warnings)
    }

    /// Logged chunks this tier can revive.
    pub fn cached_chunks(&self) -> usize {
        lock_mutex(&self.state).index.len()
    }

    /// The slot file name of `key`: readable, unique per path, a bare basename.
    pub fn file_name(key: &SlotKey) -> String {
        let readable: String = key
            .path
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let tag = format!("{:08x}", fnv1a(&[key.path.as_bytes()]) >> 32);
        format!("{readable}.{tag}.{}.npy", key.chunk)
    }

    /// Looks `key` up in the log and, if it is there, opens its file and checks the header and
    /// size — the IO happens with no lock held (the tier's state lock only for the lookup), and
    /// nothing is counted: the caller commits the outcome with [`DiskTier::settle_revival`]
    /// once it knows it will use it.
    pub(crate) fn probe(&self, key: &SlotKey, nbytes: u64) -> Revive {
        let entry = match self.logged(key, nbytes) {
            Ok(entry) => entry,
            Err(outcome) => return outcome,
        };
        let file = open_checked(&entry.path, &entry.dtype, &entry.shape, nbytes);
        let file = file.map(|f| f.map(|f| File::from_std(f, &entry.path)));
        revived(&entry.path, file, nbytes)
    }

    /// [`DiskTier::probe`] with its IO (open, size, header) through the runtime, so that many
    /// lookups can be in flight at once. Call it on an executor.
    pub(crate) async fn probe_async(&self, key: &SlotKey, nbytes: u64) -> Revive {
        let entry = match self.logged(key, nbytes) {
            Ok(entry) => entry,
            Err(outcome) => return outcome,
        };
        let file = open_checked_async(&entry.path, &entry.dtype, &entry.shape, nbytes).await;
        revived(&entry.path, file, nbytes)
    }

    /// True when the log holds `key` (its file may still turn out unusable).
    pub(crate) fn is_logged(&self, key: &SlotKey) -> bool {
        lock_mutex(&self.state).index.contains_key(key)
    }

    /// The log's entry for `key`, or the outcome when there is no usable one: absent, dropped at
    /// load, or of a size other than `nbytes`.
    fn logged(&self, key: &SlotKey, nbytes: u64) -> Result<Logged, Revive> {
        let st = lock_mutex(&self.state);
        match st.index.get(key) {
            Some(entry) if data_bytes(&entry.dtype, &entry.shape) == Some(nbytes) => Ok(Logged {
                path: self.config.dir.join(&entry.file),
                dtype: entry.dtype.clone(),
                shape: entry.shape.clone(),
            }),
            Some(_) => Err(Revive::Rejected),
            None if st.dropped.contains(key) => Err(Revive::Rejected),
            None => Err(Revive::Absent),
        }
    }

    /// Counts a probe's outcome that the pool acted on: a revival, or a rejection (the entry is
    /// forgotten; a re-fetched chunk's new line supersedes it at the next load).
    pub(crate) fn settle_revival(&self, key: &SlotKey, outcome: &Revive) {
        let mut st = lock_mutex(&self.state);
        match outcome {
            Revive::File(_) => st.stats.revived += 1,
            Revive::Rejected => {
                st.index.remove(key);
                st.dropped.remove(key);
                st.stats.rejected += 1;
            }
            Revive::Absent | Revive::Failed(_) => {}
        }
    }

    /// Writes a finished slot to its file (temporary name, then rename), logs it when
    /// persisting, and returns the file mapped. The slot keeps serving its heap buffer
    /// meanwhile. On failure nothing is logged, the error (naming the file) is warned about once,
    /// and the slot simply stays on the heap.
    ///
    /// `reserved` comes from [`DiskTier::reserve_write`]: a writer waits for it *before* it
    /// hands the bytes over, so pending writes (each holding a slot's bytes) stay bounded even
    /// when the device is slower than decoding.
    pub async fn write(
        &self,
        key: &SlotKey,
        bytes: SlotBytes,
        reserved: WritePermit,
    ) -> Result<MappedFile, String> {
        let _reserved = reserved;
        if bytes.memory().is_none() {
            return Err(format!("internal error: slot {key} is not in memory"));
        }
        let Some(meta) = self.arrays.get(&*key.path) else {
            return Err(format!(
                "internal error: array `{}` has no cache metadata",
                key.path
            ));
        };
        let name = Self::file_name(key);
        let path = self.config.dir.join(&name);
        let tmp = self.config.dir.join(format!(
            "{name}.tmp.{}.{}",
            std::process::id(),
            self.tmp_counter.fetch_add(1, Ordering::Relaxed)
        ));
        let header = npy::header(&meta.descr, &meta.slot_shape);
        let nbytes = bytes.len();
        let written = match self.injected_failure() {
            Some(e) => Err(e),
            None => self.write_file(&tmp, header, bytes).await,
        };
        let file = match written {
            Ok(file) => file,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(self.write_failed(&tmp, e));
            }
        };
        if let Err(e) = insitubatch_runtime::fs::rename(&tmp, &path).await {
            let _ = std::fs::remove_file(&tmp);
            return Err(self.write_failed(&tmp, e));
        }
        // The file was just written from `meta`: map it through the descriptor that wrote it
        // (the renamed file), without opening it again or reading its header back.
        let mapped = match MappedFile::map_range(&file, HEADER_LEN as u64, nbytes) {
            Ok(m) => m,
            Err(e) => return Err(self.write_failed(&path, e)),
        };
        drop(file);
        let mut st = lock_mutex(&self.state);
        st.stats.writes += 1;
        st.stats.write_bytes += (HEADER_LEN + nbytes) as u64;
        if self.config.persist {
            let entry = LogEntry {
                array: key.path.to_string(),
                chunk: key.chunk,
                file: name,
                shape: meta.slot_shape.clone(),
                dtype: meta.descr.clone(),
                fingerprint: meta.fingerprint.clone(),
            };
            // Self-deduplicating: a chunk already logged as exactly this is not re-appended.
            if st.index.get(key) != Some(&entry) {
                let appended = match st.log.as_mut() {
                    Some(f) => log::append(f, &entry),
                    None => Err(std::io::Error::other("the log is not open")),
                };
                match appended {
                    Ok(()) => {
                        st.index.insert(key.clone(), entry);
                    }
                    Err(e) => {
                        let msg = format!(
                            "cannot append {key} to {}: {e}; the chunk is cached for this run \
                             only",
                            self.config.dir.join(LOG_NAME).display()
                        );
                        warn_once(&mut st, msg);
                    }
                }
            }
        } else {
            st.spilled.insert(path);
        }
        Ok(mapped)
    }

    /// Writes the slot file `tmp` (header, then the slot's bytes) and returns it open for
    /// reading and writing.
    async fn write_file(
        &self,
        tmp: &Path,
        header: Vec<u8>,
        bytes: SlotBytes,
    ) -> std::io::Result<File> {
        let total = HEADER_LEN + bytes.len();
        if self.direct_ok.load(Ordering::Relaxed) {
            let opts = OpenOptions::write_create().truncate(true).direct(true);
            match File::open(tmp, opts).await {
                Ok(file) => {
                    // Header and data in one aligned buffer. The file keeps a zero tail up to
                    // the next page (numpy reads by shape; revival accepts it), which spares a
                    // truncate per file.
                    let padded = total.next_multiple_of(DIRECT_IO_ALIGN);
                    let mut buf = self.write_buffers.take(padded).ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::OutOfMemory,
                            format!("no memory for a {padded}-byte aligned write buffer"),
                        )
                    })?;
                    let dst = buf.as_mut_slice();
                    dst[..HEADER_LEN].copy_from_slice(&header);
                    dst[HEADER_LEN..total].copy_from_slice(bytes.memory().unwrap_or_default());
                    dst[total..].fill(0);
                    drop(bytes);
                    // The buffer goes back to the pool when the write hands it back.
                    return file.write_all_at(buf, 0).await.0.map(|()| file);
                }
                // The file system refuses O_DIRECT (tmpfs, some FUSE): buffered from now on.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        // Header and data in one call: each write of a new file is a trip to a worker.
        let file = File::open(tmp, OpenOptions::write_create().truncate(true)).await?;
        debug_assert_eq!(header.len(), HEADER_LEN);
        file.write_all_vectored_at(header, bytes, 0)
            .await
            .0
            .map(|()| file)
    }

    /// The most memory the slot files being written hold at once: what a pass's memory need
    /// counts for the tier beside its read buffers (0 for a readonly cache).
    pub fn write_bytes(&self) -> u64 {
        self.write_bytes
    }

    /// Waits for room among the writes in flight ([`writes_in_flight`]); `None` once the tier
    /// is closing.
    pub async fn reserve_write(&self) -> Option<WritePermit> {
        self.writes_in_flight.acquire(1).await.ok().map(WritePermit)
    }

    /// True when slot files are written with O_DIRECT (until the file system refuses it).
    pub fn direct_io(&self) -> bool {
        self.direct_ok.load(Ordering::Relaxed)
    }

    fn injected_failure(&self) -> Option<std::io::Error> {
        let limit = self.config.fail_writes_after?;
        let attempt = self.write_attempts.fetch_add(1, Ordering::Relaxed);
        (attempt >= limit).then(|| std::io::Error::from_raw_os_error(libc::ENOSPC))
    }

    fn write_failed(&self, path: &Path, e: std::io::Error) -> String {
        let mut st = lock_mutex(&self.state);
        st.stats.write_errors += 1;
        let message = format!(
            "cannot write the slot file {}: {e}{}; this chunk stays in memory and is not cached \
             (further write failures are counted in write_errors, not warned again)",
            path.display(),
            if e.raw_os_error() == Some(libc::ENOSPC) {
                " (the device is full: free space or lower cache_budget_bytes)"
            } else {
                ""
            }
        );
        warn_once(&mut st, message.clone());
        message
    }

    /// A spill write given up before it started ([`crate::PendingWrite::unless_evicted`]).
    pub(crate) fn write_skipped(&self) {
        lock_mutex(&self.state).stats.writes_skipped += 1;
    }

    /// An evicted slot's ephemeral file, which must now go (`None`: persisted, or no file
    /// landed for it). From here the caller unlinks it ([`DiskTier::unlink`]).
    pub(crate) fn take_spilled(&self, key: &SlotKey) -> Option<PathBuf> {
        if self.config.persist {
            return None;
        }
        let path = self.config.dir.join(Self::file_name(key));
        lock_mutex(&self.state)
            .spilled
            .remove(&path)
            .then_some(path)
    }

    /// Unlinks an evicted slot's file (a mapping still held keeps its inode): through the
    /// runtime on an executor thread, which goes on running its other tasks meanwhile (an
    /// unlink waits for its directory's lock and, under `discard`, for the device), else here.
    pub(crate) async fn unlink(&self, path: &Path) {
        self.unlink_hook();
        if insitubatch_runtime::on_executor_thread() {
            match insitubatch_runtime::fs::remove_file(path).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {}
                _ => return,
            }
        }
        let _ = std::fs::remove_file(path);
    }

    /// [`DiskTier::unlink`] on this thread.
    pub(crate) fn unlink_now(&self, path: &Path) {
        self.unlink_hook();
        let _ = std::fs::remove_file(path);
    }

    fn unlink_hook(&self) {
        #[cfg(test)]
        if let Some(hook) = lock_mutex(&self.unlink_hook).as_ref() {
            hook();
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        let st = lock_mutex(&self.state);
        for p in &st.spilled {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn warn_once(st: &mut TierState, message: String) {
    if !st.warned_write {
        st.warned_write = true;
        st.warnings.push(message);
    }
}

/// Opens the slot file at `path` and checks its size (`nbytes` of data) and `.npy` header
/// (`descr`, `shape`): `Ok(None)` when it is missing or does not match (a miss), an error only
/// when out of descriptors ([`out_of_descriptors_hint`]): not the file's fault, so not a
/// reason to forget its entry.
fn open_checked(
    path: &Path,
    descr: &str,
    shape: &[u64],
    nbytes: u64,
) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::FileExt;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if out_of_descriptors_hint(&e).is_some() => return Err(e),
        Err(_) => return Ok(None),
    };
    let matches = file.metadata().is_ok_and(|m| size_fits(m.len(), nbytes)) && {
        let mut header = vec![0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0).is_ok() && header_matches(&header, descr, shape)
    };
    Ok(matches.then_some(file))
}

/// [`open_checked`] through the runtime.
async fn open_checked_async(
    path: &Path,
    descr: &str,
    shape: &[u64],
    nbytes: u64,
) -> std::io::Result<Option<File>> {
    let file = match File::open(path, OpenOptions::read()).await {
        Ok(file) => file,
        Err(e) if out_of_descriptors_hint(&e).is_some() => return Err(e),
        Err(_) => return Ok(None),
    };
    let matches = file.stat().await.is_ok_and(|st| size_fits(st.len, nbytes))
        && file
            .read_exact_at(0, HEADER_LEN)
            .await
            .is_ok_and(|h| header_matches(&h, descr, shape));
    Ok(matches.then_some(file))
}

/// True when `header` is a slot file's: numpy type `descr`, `shape`, data right after it.
fn header_matches(header: &[u8], descr: &str, shape: &[u64]) -> bool {
    npy::parse(header)
        .is_some_and(|h| h.descr == descr && h.shape == shape && h.data_offset == HEADER_LEN)
}

/// Bytes of a C-order array of numpy type `descr` (`<f4`, `|u1`) and `shape`.
fn data_bytes(descr: &str, shape: &[u64]) -> Option<u64> {
    let item: u64 = descr.get(2..)?.parse().ok()?;
    shape.iter().try_fold(item, |acc, &d| acc.checked_mul(d))
}

/// A slot file's size: exactly header + data, or padded to the next page by an O_DIRECT write.
fn size_fits(len: u64, nbytes: u64) -> bool {
    let want = HEADER_LEN as u64 + nbytes;
    len == want || len == want.next_multiple_of(insitubatch_runtime::DIRECT_IO_ALIGN as u64)
}

/// Deletes temporaries a killed writer left (we hold the lock, so nobody is writing them).
fn remove_temporaries(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.contains(".npy.tmp.") || name.contains(".jsonl.tmp") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Loads the log into `state.index`: checks fingerprints, drops what no longer matches,
/// resets or refuses stale arrays, and compacts when anything was dropped.
fn load_log(
    config: &CacheConfig,
    arrays: &HashMap<String, ArrayMeta>,
    state: &mut TierState,
) -> Result<(), CacheError> {
    let dir = &config.dir;
    let log_path = dir.join(LOG_NAME);
    let writer = !config.readonly;
    let (entries, mut dirty) = match log::load(&log_path)? {
        log::Loaded::Missing => {
            if writer {
                log::rewrite(&log_path, &[])?;
                state.log = Some(log::open_append(&log_path)?);
            }
            return Ok(());
        }
        log::Loaded::OtherFormat { found } => {
            if !config.reset_stale {
                let mut names: Vec<&str> = arrays.keys().map(String::as_str).collect();
                names.sort_unstable();
                return Err(CacheError::Stale {
                    dir: dir.clone(),
                    arrays: format!("every array: {}", names.join(", ")),
                    why: format!(
                        "the log is in format {found}; this build reads {} v{FORMAT_VERSION}",
                        log::FORMAT_NAME
                    ),
                });
            }
            // A log we cannot parse says nothing about any one array: the whole cache goes.
            remove_slot_files(dir);
            log::rewrite(&log_path, &[])?;
            state.log = Some(log::open_append(&log_path)?);
            return Ok(());
        }
        log::Loaded::Entries { entries, torn_tail } => (entries, torn_tail),
    };
    // Last line wins for a key; earlier duplicates are dropped.
    let mut last: HashMap<(String, u64), usize> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        if last.insert((e.array.clone(), e.chunk), i).is_some() {
            dirty = true;
        }
    }
    let mut stale: Vec<String> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if last[&(e.array.clone(), e.chunk)] != i {
            continue;
        }
        if let Some(meta) = arrays.get(&e.array)
            && e.fingerprint != meta.fingerprint
            && !stale.contains(&e.array)
        {
            stale.push(e.array.clone());
        }
    }
    stale.sort();
    if !stale.is_empty() && !config.reset_stale {
        return Err(CacheError::Stale {
            dir: dir.clone(),
            arrays: stale.join(", "),
            why: "their chunk-transform fingerprint changed since the files were written".into(),
        });
    }
    let mut kept = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        if last[&(e.array.clone(), e.chunk)] != i {
            continue;
        }
        if stale.contains(&e.array) {
            let _ = std::fs::remove_file(dir.join(&e.file));
            dirty = true;
            continue;
        }
        let Some(meta) = arrays.get(&e.array) else {
            // Another dataset's array over the same directory: not ours to judge; kept.
            kept.push(e);
            continue;
        };
        let present = dir.join(&e.file).is_file();
        if !present || e.shape != meta.slot_shape || e.dtype != meta.descr {
            // A miss: re-fetched and rewritten when first touched.
            state
                .dropped
                .insert(SlotKey::new(e.array.as_str(), e.chunk));
            dirty = true;
            continue;
        }
        state
            .index
            .insert(SlotKey::new(e.array.as_str(), e.chunk), e.clone());
        kept.push(e);
    }
    if writer {
        if dirty {
            log::rewrite(&log_path, &kept)?;
        }
        state.log = Some(log::open_append(&log_path)?);
    }
    Ok(())
}

fn remove_slot_files(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".npy") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(fp: &str) -> Vec<ArrayMeta> {
        vec![ArrayMeta {
            path: "g/t2m".into(),
            slot_shape: vec![2, 3],
            descr: "<f4".into(),
            fingerprint: fp.into(),
        }]
    }

    fn block_on<F>(f: impl FnOnce() -> F + Send + 'static) -> F::Output
    where
        F: std::future::Future + 'static,
        F::Output: Send + 'static,
    {
        let rt = insitubatch_runtime::RuntimeBuilder::new()
            .executor_threads(1)
            .build()
            .unwrap();
        rt.handle().spawn("test", f).join().unwrap()
    }

    /// Writes `bytes` as `key`'s slot file through `tier` and returns it mapped.
    fn write_slot(tier: &std::sync::Arc<DiskTier>, key: &SlotKey, bytes: Vec<u8>) -> MappedFile {
        let (t, k) = (std::sync::Arc::clone(tier), key.clone());
        block_on(move || async move {
            let permit = t.reserve_write().await.unwrap();
            t.write(&k, SlotBytes::heap(bytes), permit).await.unwrap()
        })
    }

    /// A pool of two 24-byte slots of `g/t2m` over a cache directory in `dir`, and its owner.
    fn two_slot_pool(
        dir: &Path,
        persist: bool,
    ) -> (std::sync::Arc<crate::ChunkPool>, crate::Owner) {
        let mut cfg = CacheConfig::new(dir);
        cfg.persist = persist;
        let tier = DiskTier::open(cfg, meta(&fingerprint(&[]))).unwrap();
        let pool = crate::ChunkPool::with_disk(crate::Budget::Bytes(48), Some(tier));
        let owner = pool.register_owner("a", 24).unwrap();
        (pool, owner)
    }

    /// Admits chunk `c` of `g/t2m`, which must be a miss, and fills it.
    fn ready(o: &crate::Owner, c: u64) -> std::sync::Arc<crate::Slot> {
        match o.admit(&SlotKey::new("g/t2m", c), 24, 1).unwrap() {
            crate::Admission::Miss(slot) => {
                slot.adopt((0..24).collect()).unwrap();
                slot
            }
            other => panic!("chunk {c}: expected a miss, got {other:?}"),
        }
    }

    /// A persisted cache in `dir`.
    fn persisted(dir: &Path) -> CacheConfig {
        let mut cfg = CacheConfig::new(dir);
        cfg.persist = true;
        cfg
    }

    #[test]
    fn file_names_are_bare_and_distinct_per_path() {
        let a = DiskTier::file_name(&SlotKey::new("g/t2m", 5));
        let b = DiskTier::file_name(&SlotKey::new("g_t2m", 5));
        assert!(log::is_bare_basename(&a) && a.ends_with(".5.npy"), "{a}");
        assert_ne!(a, b);
        assert_ne!(fingerprint(&[]), fingerprint(&["scale(2)"]));
        assert_ne!(fingerprint(&["ab", "c"]), fingerprint(&["a", "bc"]));
    }

    #[test]
    fn slot_files_in_flight_follow_the_largest_slot_and_are_counted_as_memory() {
        // 16 MiB of slots in flight, between 4 and 16 files.
        assert_eq!(writes_in_flight(0), MAX_WRITES_IN_FLIGHT);
        assert_eq!(writes_in_flight(464 << 10), 16);
        assert_eq!(writes_in_flight(2 << 20), 8);
        assert_eq!(writes_in_flight(3 << 20), 5);
        assert_eq!(writes_in_flight(8 << 20), MIN_WRITES_IN_FLIGHT);
        let dir = tempfile::tempdir().unwrap();
        let arrays = vec![
            ArrayMeta {
                path: "small".into(),
                slot_shape: vec![4, 1000],
                descr: "<f4".into(),
                fingerprint: fingerprint(&[]),
            },
            ArrayMeta {
                path: "large".into(),
                slot_shape: vec![2, 1 << 19],
                descr: "<f4".into(),
                fingerprint: fingerprint(&[]),
            },
        ];
        let persist = |dir: &Path| {
            let mut c = CacheConfig::new(dir);
            c.persist = true;
            c
        };
        let tier = DiskTier::open(persist(dir.path()), arrays.clone()).unwrap();
        // The larger array's 4 MiB slots: 4 at once, each its slot and a page-aligned copy
        // of header and slot.
        let slot = 4u64 << 20;
        assert_eq!(tier.write_bytes(), 4 * (slot + HEADER_LEN as u64 + slot));
        let permits: Vec<WritePermit> = block_on({
            let tier = std::sync::Arc::new(tier);
            move || async move {
                let mut held = Vec::new();
                for _ in 0..4 {
                    held.push(tier.reserve_write().await.unwrap());
                }
                assert!(
                    tier.writes_in_flight.try_acquire(1).is_none(),
                    "a fifth write waits"
                );
                held
            }
        });
        assert_eq!(permits.len(), 4);
        drop(permits);
        // Small slots only: 16 files, for an ephemeral spill as well (its evicted slots keep
        // their room until their files are gone); none for a readonly cache, which writes
        // nothing.
        let each = 16_000 + (4096 + 16_000u64).next_multiple_of(4096);
        let dir = tempfile::tempdir().unwrap();
        let tier = DiskTier::open(persist(dir.path()), arrays[..1].to_vec()).unwrap();
        assert_eq!(tier.write_bytes(), 16 * each);
        drop(tier);
        let spill = DiskTier::open(CacheConfig::new(dir.path()), arrays[..1].to_vec()).unwrap();
        assert_eq!(spill.write_bytes(), 16 * each);
        drop(spill);
        let mut readonly = CacheConfig::new(dir.path());
        readonly.readonly = true;
        let tier = DiskTier::open(readonly, arrays[..1].to_vec()).unwrap();
        assert_eq!(tier.write_bytes(), 0);
    }

    #[test]
    fn an_evicted_slots_file_goes_before_its_admission_returns_and_never_under_the_pools_lock() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let tier = DiskTier::open(CacheConfig::new(dir.path()), meta(&fingerprint(&[]))).unwrap();
        let pool = crate::ChunkPool::with_disk(crate::Budget::Bytes(48), Some(tier));
        let o = pool.register_owner("a", 24).unwrap();
        let file = |c: u64| {
            dir.path()
                .join(DiskTier::file_name(&SlotKey::new("g/t2m", c)))
        };
        let admit = |c: u64| match o.admit(&SlotKey::new("g/t2m", c), 24, 1).unwrap() {
            crate::Admission::Miss(slot) => slot,
            other => panic!("chunk {c}: expected a miss, got {other:?}"),
        };
        // Chunks 0 and 1 resident, their files landed.
        for c in 0..2 {
            let slot = admit(c);
            let write = pool.begin_write(&slot);
            slot.adopt((0..24).collect()).unwrap();
            let mapped = write_slot(pool.disk().unwrap(), slot.key(), (0..24).collect());
            write.landed(mapped).now();
            o.unpin(&slot);
        }
        assert!(file(0).exists() && file(1).exists());
        // Every unlink checks that the pool's lock is free as it happens.
        let unlinks = Arc::new(AtomicUsize::new(0));
        let (weak, n) = (Arc::downgrade(&pool), Arc::clone(&unlinks));
        *lock_mutex(&pool.disk().unwrap().unlink_hook) = Some(Box::new(move || {
            let pool = weak
                .upgrade()
                .expect("the pool outlives its tier's unlinks");
            assert!(!pool.is_locked(), "a file unlinked under the pool's lock");
            n.fetch_add(1, Ordering::SeqCst);
        }));
        // Chunk 2 evicts chunk 0 (least recently used): its file is gone when the admission
        // returns, chunk 1's stays.
        let s2 = admit(2);
        assert_eq!(unlinks.load(Ordering::SeqCst), 1);
        assert!(!file(0).exists() && file(1).exists());
        s2.adopt((0..24).collect()).unwrap();
        o.unpin(&s2);
        // Clearing the pool unlinks the rest (chunk 2 never had a file).
        pool.clear_unpinned();
        assert_eq!(unlinks.load(Ordering::SeqCst), 2);
        assert!(!file(1).exists());
    }

    #[test]
    fn evicted_spill_files_can_be_left_to_the_runtime_and_their_room_waits_for_them() {
        use std::sync::{Arc, Mutex};
        let dir = tempfile::tempdir().unwrap();
        let (pool, o) = two_slot_pool(dir.path(), false);
        let key = |c: u64| SlotKey::new("g/t2m", c);
        let file = |c: u64| dir.path().join(DiskTier::file_name(&key(c)));
        let miss = |a: crate::Admission| match a {
            crate::Admission::Miss(slot) => slot,
            other => panic!("expected a miss, got {other:?}"),
        };
        // Every unlink records whether it ran on an executor thread and checks that the pool's
        // lock is free.
        let on_executor = Arc::new(Mutex::new(Vec::new()));
        let (weak, seen) = (Arc::downgrade(&pool), Arc::clone(&on_executor));
        *lock_mutex(&pool.disk().unwrap().unlink_hook) = Some(Box::new(move || {
            let pool = weak
                .upgrade()
                .expect("the pool outlives its tier's unlinks");
            assert!(!pool.is_locked(), "a file unlinked under the pool's lock");
            seen.lock()
                .unwrap()
                .push(insitubatch_runtime::on_executor_thread());
        }));
        let landed = |c: u64| {
            let slot = miss(o.admit(&key(c), 24, 1).unwrap());
            let write = pool.begin_write(&slot);
            slot.adopt((0..24).collect()).unwrap();
            let mapped = write_slot(pool.disk().unwrap(), slot.key(), (0..24).collect());
            assert!(
                write.landed(mapped).is_empty(),
                "a resident slot's file stays"
            );
            o.unpin(&slot);
        };
        landed(0);
        landed(1);
        // Chunk 2 evicts chunk 0 and leaves its file to the caller: still there until run.
        let (admitted, unlinks) = o.admit_deferring_unlinks(&key(2), 24, 1, None);
        let s2 = miss(admitted.unwrap());
        assert!(!unlinks.is_empty() && file(0).exists() && file(1).exists());
        block_on(move || async move {
            let mut u = unlinks;
            u.run().await
        });
        assert!(!file(0).exists() && file(1).exists());
        assert_eq!(
            *on_executor.lock().unwrap(),
            [true],
            "unlinked on the runtime"
        );
        s2.adopt((0..24).collect()).unwrap();
        o.unpin(&s2);
        // Dropped unrun, they are unlinked on the dropping thread.
        let (admitted, unlinks) = o.admit_deferring_unlinks(&key(3), 24, 1, None);
        let s3 = miss(admitted.unwrap());
        assert!(file(1).exists());
        drop(unlinks);
        assert!(!file(1).exists());
        assert_eq!(*on_executor.lock().unwrap(), [true, false]);
        // A slot evicted while its file is written: the file that lands must go, and its room
        // in the budget waits for that, not only for the write.
        s3.adopt((0..24).collect()).unwrap();
        o.unpin(&s3);
        let s4 = miss(o.admit(&key(4), 24, 1).unwrap()); // evicts 2, which has no file
        let write = pool.begin_write(&s4);
        s4.adopt((0..24).collect()).unwrap();
        o.unpin(&s4);
        let s5 = miss(o.admit(&key(5), 24, 1).unwrap()); // evicts 3
        let wait_for_4 = |what: &str| match o.admit(&key(6), 24, 1) {
            Err(crate::PoolError::WaitForWrites { writing_bytes, .. }) => {
                assert_eq!(writing_bytes, 24, "{what}")
            }
            other => panic!("{what}: expected to wait for chunk 4's file, got {other:?}"),
        };
        wait_for_4("chunk 4 evicted mid-write");
        let mapped = write_slot(pool.disk().unwrap(), s4.key(), (0..24).collect());
        let unlinks = write.landed(mapped);
        assert!(!unlinks.is_empty() && file(4).exists());
        wait_for_4("chunk 4's file landed, not yet unlinked");
        let generation = pool.room_returned().generation();
        block_on(move || async move {
            let mut u = unlinks;
            u.run().await
        });
        assert!(!file(4).exists());
        assert_ne!(
            pool.room_returned().generation(),
            generation,
            "the waiter is woken"
        );
        assert!(matches!(
            o.admit(&key(6), 24, 1),
            Ok(crate::Admission::Miss(_))
        ));
        assert_eq!(*on_executor.lock().unwrap(), [true, false, true]);
        drop(s5);
    }

    #[test]
    fn a_spill_slot_evicted_mid_write_keeps_its_room_until_its_write_ends() {
        let dir = tempfile::tempdir().unwrap();
        let (pool, o) = two_slot_pool(dir.path(), false);
        let key = |c: u64| SlotKey::new("g/t2m", c);
        let ready = |c: u64| ready(&o, c);
        // Chunk 0's file is being written as it comes to rest; chunk 1 rests beside it.
        let s0 = ready(0);
        let write = pool.begin_write(&s0);
        o.unpin(&s0);
        let s1 = ready(1);
        o.unpin(&s1);
        // Chunk 2 evicts both (0 first): 0's file is still in flight, so it holds its room.
        let s2 = ready(2);
        assert_eq!(pool.stats().resident_bytes, 24);
        // With 2 pinned, chunk 3 fits only once 0's write has ended.
        let seen = pool.room_returned().generation();
        match o.admit(&key(3), 24, 1) {
            Err(crate::PoolError::WaitForWrites { writing_bytes, .. }) => {
                assert_eq!(writing_bytes, 24)
            }
            other => panic!("expected to wait for the write, got {other:?}"),
        }
        drop(write); // the write failed or was abandoned: no file, the room is back
        assert_ne!(
            pool.room_returned().generation(),
            seen,
            "the waiter is woken"
        );
        assert!(matches!(
            o.admit(&key(3), 24, 1),
            Ok(crate::Admission::Miss(_))
        ));
        o.unpin(&s2);
        // A landed file of an evicted slot goes, and its room with it.
        let s4 = ready(4);
        let write = pool.begin_write(&s4);
        o.unpin(&s4);
        pool.clear_unpinned();
        let mapped = write_slot(pool.disk().unwrap(), s4.key(), (0..24).collect());
        assert!(dir.path().join(DiskTier::file_name(s4.key())).exists());
        write.landed(mapped).now();
        assert!(!dir.path().join(DiskTier::file_name(s4.key())).exists());
        assert!(matches!(
            o.admit(&key(5), 24, 1),
            Ok(crate::Admission::Miss(_))
        ));
    }

    #[test]
    fn a_spill_write_whose_slot_was_evicted_before_its_turn_is_skipped_and_gives_its_room_back() {
        for persist in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (pool, o) = two_slot_pool(dir.path(), persist);
            let key = |c: u64| SlotKey::new("g/t2m", c);
            let ready = |c: u64| ready(&o, c);
            // Chunk 0 is resident when its write's turn comes: it is written.
            let s0 = ready(0);
            let kept = pool.begin_write(&s0).unless_evicted();
            assert!(kept.is_some(), "a resident slot's write goes ahead");
            drop(kept);
            o.unpin(&s0);
            // Chunk 1 waits for its turn while chunks 2 and 3 evict it.
            let s1 = ready(1);
            let write = pool.begin_write(&s1);
            o.unpin(&s1);
            let s2 = ready(2);
            o.unpin(&s2);
            let s3 = ready(3);
            let skipped = pool.disk().unwrap().stats().writes_skipped;
            match write.unless_evicted() {
                None => {
                    assert!(!persist, "a persisted slot is always written");
                    assert_eq!(skipped, 0);
                    assert_eq!(pool.disk().unwrap().stats().writes_skipped, 1);
                    // Its room is back: chunk 4 fits beside pinned chunk 3 without waiting
                    // (chunk 2 went to make room for chunk 1's file in flight).
                    assert!(matches!(
                        o.admit(&key(4), 24, 1),
                        Ok(crate::Admission::Miss(_))
                    ));
                }
                Some(write) => {
                    assert!(persist, "an evicted spill slot's write is skipped");
                    let mapped = write_slot(pool.disk().unwrap(), s1.key(), (0..24).collect());
                    write.landed(mapped).now();
                    assert!(dir.path().join(DiskTier::file_name(s1.key())).exists());
                    assert_eq!(pool.disk().unwrap().stats().writes_skipped, 0);
                }
            }
            drop(s3);
        }
    }

    #[test]
    fn an_admission_behind_another_iterations_load_revives_the_cached_file_privately() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = persisted(dir.path());
        let tier = DiskTier::open(cfg, meta(&fingerprint(&[]))).unwrap();
        let pool = crate::ChunkPool::with_disk(crate::Budget::Bytes(1000), Some(tier));
        let a = pool.register_owner("a", 100).unwrap();
        let b = pool.register_owner("b", 100).unwrap();
        let key = SlotKey::new("g/t2m", 7);
        let crate::Admission::Miss(loading) = a.admit(&key, 24, 1).unwrap() else {
            panic!("nothing is cached yet")
        };
        // The chunk's file lands (written by another run) while a's load is in flight.
        write_slot(pool.disk().unwrap(), &key, (100..124).collect());
        // b does not wait on a's load (a's tasks may be cancelled with it): it looks the file
        // up and revives a private copy.
        let crate::Admission::Hit(revived) = b.admit(&key, 24, 1).unwrap() else {
            panic!("b must revive the cached file")
        };
        assert!(!std::sync::Arc::ptr_eq(&loading, &revived));
        assert_eq!(pool.disk().unwrap().stats().revived, 1);
        assert!(matches!(
            a.admit(&key, 24, 1).unwrap(),
            crate::Admission::InFlight(_)
        ));
        let st = pool.stats();
        assert_eq!((st.hits, st.misses, st.revived), (1, 1, 1));
    }

    #[test]
    fn persist_write_revive_stale_and_reset() {
        let dir = tempfile::tempdir().unwrap();
        let fp = fingerprint(&[]);
        let mut cfg = persisted(dir.path());
        let tier = std::sync::Arc::new(DiskTier::open(cfg.clone(), meta(&fp)).unwrap());
        let key = SlotKey::new("g/t2m", 4);
        let data: Vec<u8> = (0..24u8).collect();
        let got = write_slot(&tier, &key, data.clone());
        assert_eq!(got.data(), &data[..]);
        assert_eq!(tier.stats().writes, 1);
        drop(got);
        drop(tier);

        // A fresh tier revives it; a fingerprint change is stale until reset.
        let tier = DiskTier::open(cfg.clone(), meta(&fp)).unwrap();
        let probe = tier.probe(&key, 24);
        assert_eq!(tier.stats().revived, 0, "a probe counts nothing");
        tier.settle_revival(&key, &probe);
        let Revive::File(f) = probe else {
            panic!("expected a revival")
        };
        assert_eq!(tier.stats().revived, 1);
        let (file, offset, len) = (f.file.clone(), f.offset, f.len);
        let back = block_on(move || async move { file.read_exact_at(offset, len).await });
        assert_eq!(back.unwrap(), data);
        let wrong_size = tier.probe(&key, 25);
        assert!(matches!(wrong_size, Revive::Rejected));
        tier.settle_revival(&key, &wrong_size);
        assert_eq!(tier.stats().rejected, 1);
        assert!(
            matches!(tier.probe(&key, 24), Revive::Absent),
            "a rejected entry is forgotten"
        );
        drop((f, tier));
        let err = DiskTier::open(cfg.clone(), meta("other"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("g/t2m") && err.contains("reset_stale_cache"),
            "{err}"
        );
        cfg.reset_stale = true;
        let tier = DiskTier::open(cfg.clone(), meta("other")).unwrap();
        assert_eq!(tier.cached_chunks(), 0);
        assert!(!dir.path().join(DiskTier::file_name(&key)).exists());
    }

    #[test]
    fn a_lookup_through_the_runtime_agrees_with_the_direct_one() {
        let dir = tempfile::tempdir().unwrap();
        let fp = fingerprint(&[]);
        let cfg = persisted(dir.path());
        let tier = std::sync::Arc::new(DiskTier::open(cfg.clone(), meta(&fp)).unwrap());
        let keys: Vec<SlotKey> = (0..4).map(|c| SlotKey::new("g/t2m", c)).collect();
        for (c, k) in keys.iter().enumerate() {
            write_slot(&tier, k, vec![c as u8; 24]);
        }
        drop(tier);
        // Chunk 1's header damaged, chunk 2's file cut short, chunk 3's file gone.
        let path = |k: &SlotKey| dir.path().join(DiskTier::file_name(k));
        let mut damaged = std::fs::read(path(&keys[1])).unwrap();
        damaged[20] ^= 0xff;
        std::fs::write(path(&keys[1]), damaged).unwrap();
        let short = std::fs::OpenOptions::new()
            .write(true)
            .open(path(&keys[2]))
            .unwrap();
        short.set_len(HEADER_LEN as u64 + 10).unwrap();
        std::fs::remove_file(path(&keys[3])).unwrap();

        let tier = std::sync::Arc::new(DiskTier::open(cfg, meta(&fp)).unwrap());
        let outcome = |r: &Revive| match r {
            Revive::Absent => "absent",
            Revive::Rejected => "rejected",
            Revive::File(_) => "file",
            Revive::Failed(_) => "failed",
        };
        let cases = [
            (keys[0].clone(), 24, "file"),
            (keys[0].clone(), 25, "rejected"),
            (keys[1].clone(), 24, "rejected"),
            (keys[2].clone(), 24, "rejected"),
            (keys[3].clone(), 24, "rejected"),
            (SlotKey::new("g/t2m", 9), 24, "absent"),
        ];
        for (key, nbytes, want) in cases {
            let direct = tier.probe(&key, nbytes);
            let (t, k) = (std::sync::Arc::clone(&tier), key.clone());
            let through = block_on(move || async move {
                let r = t.probe_async(&k, nbytes).await;
                // The revived data, read through the file the lookup opened.
                let data = match &r {
                    Revive::File(f) => Some(f.file.read_exact_at(f.offset, f.len).await.unwrap()),
                    _ => None,
                };
                (outcome(&r), data)
            });
            assert_eq!(
                (outcome(&direct), through.0),
                (want, want),
                "{key} {nbytes}"
            );
            if want == "file" {
                assert_eq!(through.1.unwrap(), vec![0u8; 24]);
            }
        }
        assert_eq!(
            tier.stats().revived + tier.stats().rejected,
            0,
            "lookups count nothing"
        );
    }

    #[test]
    fn a_revival_prepared_ahead_counts_once_and_yields_to_a_resident_slot() {
        let dir = tempfile::tempdir().unwrap();
        let fp = fingerprint(&[]);
        let cfg = persisted(dir.path());
        let tier = std::sync::Arc::new(DiskTier::open(cfg.clone(), meta(&fp)).unwrap());
        let (cached, other) = (SlotKey::new("g/t2m", 2), SlotKey::new("g/t2m", 3));
        write_slot(&tier, &cached, (0..24).collect());
        drop(tier);

        let tier = DiskTier::open(cfg, meta(&fp)).unwrap();
        let pool = crate::ChunkPool::with_disk(crate::Budget::Bytes(1000), Some(tier));
        assert!(pool.revives_from_files());
        assert!(pool.would_look_up(&cached));
        assert!(!pool.would_look_up(&other), "not in the log");
        let prepare = |key: &SlotKey| {
            let (p, k) = (std::sync::Arc::clone(&pool), key.clone());
            block_on(move || async move { p.prepare_revival(&k, 24).await })
        };
        let ahead = prepare(&cached);
        assert_eq!(pool.stats().revived, 0, "preparing counts nothing");
        let owner = pool.register_owner("a", 100).unwrap();
        let crate::Admission::Hit(slot) =
            owner.admit_prepared(&cached, 24, 1, Some(ahead)).unwrap()
        else {
            panic!("a prepared file is a hit")
        };
        let bytes = slot.bytes().unwrap();
        let crate::SlotData::File(range) = &*bytes else {
            panic!("a revived slot reads its file")
        };
        let (f, offset, len) = (range.file.clone(), range.offset, range.len);
        let back = block_on(move || async move { f.read_exact_at(offset, len).await.unwrap() });
        assert_eq!(back, (0..24).collect::<Vec<u8>>());
        let st = pool.stats();
        assert_eq!((st.hits, st.revived, st.misses), (1, 1, 0));
        assert!(!pool.would_look_up(&cached), "resident now");
        // Prepared again while resident: the slot is the hit, the file is not revived twice.
        let again = prepare(&cached);
        let crate::Admission::Hit(second) =
            owner.admit_prepared(&cached, 24, 1, Some(again)).unwrap()
        else {
            panic!("resident")
        };
        assert!(std::sync::Arc::ptr_eq(&slot, &second));
        let st = pool.stats();
        assert_eq!((st.hits, st.revived, st.misses), (2, 1, 0));
        // A chunk the log does not hold is a plain miss, prepared or not.
        let absent = prepare(&other);
        assert!(matches!(
            owner.admit_prepared(&other, 24, 1, Some(absent)).unwrap(),
            crate::Admission::Miss(_)
        ));
    }
}
