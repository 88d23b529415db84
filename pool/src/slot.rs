//! A slot: one variable's decoded sample-axis chunk, the unit of residency.
//!
//! A slot holds every stored chunk (tile) that shares one sample-axis chunk index, assembled
//! sample-first: `[samples_per_chunk, *inner_shape]`, C order. It is filled exactly once, either
//! by adopting one decoded tile whose layout already is the slot's (no copy) or by assembling
//! tiles into a buffer, and then its contents are immutable until evicted. With a cache
//! directory the bytes move once, from the heap to the slot's mapped file, when the file is
//! written and the slot is no longer pinned; readers hold [`SlotBytes`], so a move never pulls
//! memory out from under a copy.

use std::sync::{Arc, Mutex};

use insitubatch_runtime::sync::Notify;

use crate::disk::MappedFile;
use crate::lock;

/// Where a ready slot's bytes live: on the heap (the decoded buffer, adopted), in a mapped
/// `.npy` file of the cache directory (a slot this run wrote), or in a cache file left for
/// whoever copies from it to read (a slot revived from an earlier run: the gather reads its rows
/// straight into the batch, so a revival costs one copy).
#[derive(Debug)]
pub enum SlotData {
    /// A buffer this process owns.
    Heap(Vec<u8>),
    /// The data section of a slot file, mapped read-only.
    Mapped(MappedFile),
    /// The data section of a checked slot file, read on demand.
    File(FileRange),
    /// A revived slot at rest in the pool's LRU: its file is closed (an unpinned slot holds no
    /// descriptor, so a budget of many slots never runs out of them) and mapped on its next hit.
    Closed(ClosedRange),
}

/// Where a closed file-backed slot's data is.
#[derive(Clone, Debug)]
pub struct ClosedRange {
    /// The slot file.
    pub path: std::path::PathBuf,
    /// Where the data starts.
    pub offset: u64,
    /// Data bytes.
    pub len: usize,
}

/// `len` bytes at `offset` of an open slot file.
#[derive(Clone, Debug)]
pub struct FileRange {
    /// The file (its IO goes through the runtime).
    pub file: insitubatch_runtime::fs::File,
    /// Where the data starts.
    pub offset: u64,
    /// Data bytes.
    pub len: usize,
}

impl SlotData {
    /// A closed slot file's data again: mapped (a mapping holds no descriptor, and this and later
    /// epochs copy from memory — the first touch faults the pages in), or the file reopened when
    /// mapping fails (`vm.max_map_count`). `None` if the file cannot be opened.
    pub(crate) fn reopen(c: &ClosedRange) -> Option<SlotData> {
        let file = std::fs::File::open(&c.path).ok()?;
        Some(match MappedFile::map_range(&file, c.offset, c.len) {
            Ok(m) => SlotData::Mapped(m),
            Err(_) => SlotData::File(FileRange {
                file: insitubatch_runtime::fs::File::from_std(file, &c.path),
                offset: c.offset,
                len: c.len,
            }),
        })
    }

    /// The bytes, when they are in memory (heap or mapping); `None` for a file range.
    pub fn memory(&self) -> Option<&[u8]> {
        match self {
            SlotData::Heap(v) => Some(v),
            SlotData::Mapped(m) => Some(m.data()),
            SlotData::File(_) | SlotData::Closed(_) => None,
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        match self {
            SlotData::Heap(v) => v.len(),
            SlotData::Mapped(m) => m.data().len(),
            SlotData::File(f) => f.len,
            SlotData::Closed(c) => c.len,
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A ready slot's bytes, shared: whoever copies from a slot holds one, which keeps that memory
/// (heap buffer, mapping or open file) alive even if the slot moves to its file meanwhile.
#[derive(Clone, Debug)]
pub struct SlotBytes(Arc<SlotData>);

impl std::ops::Deref for SlotBytes {
    type Target = SlotData;
    fn deref(&self) -> &SlotData {
        &self.0
    }
}

impl SlotBytes {
    /// Bytes on the heap (for tests and tools).
    pub fn heap(v: Vec<u8>) -> Self {
        Self(Arc::new(SlotData::Heap(v)))
    }
}

/// Which chunk a slot holds: the array path and the chunk index along the sample axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// Array path in the store.
    pub path: Arc<str>,
    /// Stored-chunk index along the sample axis (absolute, not relative to a split).
    pub chunk: u64,
}

impl SlotKey {
    /// The key of chunk `chunk` of array `path`.
    pub fn new(path: impl Into<Arc<str>>, chunk: u64) -> Self {
        Self {
            path: path.into(),
            chunk,
        }
    }
}

impl std::fmt::Display for SlotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[chunk {}]", self.path, self.chunk)
    }
}

/// Why a slot will never become ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotFailure {
    /// The pass that was loading it stopped (consumer gone, another error); not a data problem.
    pub cancelled: bool,
    /// What went wrong, naming the array, chunk key and file.
    pub message: Arc<str>,
}

impl std::fmt::Display for SlotFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where a slot is in its life ([`Slot::phase`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Tiles still to come.
    Loading,
    /// Every tile arrived (or revived from a file): the data is published.
    Ready,
    /// Its load failed or was cancelled.
    Failed,
}

enum State {
    Loading {
        tiles_left: u64,
        buf: Option<Vec<u8>>,
    },
    Ready,
    Failed(SlotFailure),
}

/// One resident chunk. Shared (`Arc`) between the pool, the pass that loads it and the gather
/// that reads it.
pub struct Slot {
    pub(crate) id: u64,
    key: SlotKey,
    nbytes: u64,
    tiles: u64,
    state: Mutex<State>,
    data: Mutex<Option<SlotBytes>>,
    /// The slot's file, written and mapped, waiting for the slot to be unpinned.
    pending_map: Mutex<Option<MappedFile>>,
    notify: Notify,
    uncacheable: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("key", &self.key)
            .field("nbytes", &self.nbytes)
            .field("ready", &self.is_ready())
            .finish()
    }
}

impl Slot {
    pub(crate) fn new(id: u64, key: SlotKey, nbytes: u64, tiles: u64) -> Self {
        assert!(tiles > 0, "a slot holds at least one tile");
        Self {
            id,
            key,
            nbytes,
            tiles,
            state: Mutex::new(State::Loading {
                tiles_left: tiles,
                buf: None,
            }),
            data: Mutex::new(None),
            pending_map: Mutex::new(None),
            notify: Notify::new(),
            uncacheable: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A slot that is ready from the start (revived from the cache directory).
    pub(crate) fn new_ready(id: u64, key: SlotKey, data: SlotData) -> Self {
        Self {
            id,
            key,
            nbytes: data.len() as u64,
            tiles: 1,
            state: Mutex::new(State::Ready),
            data: Mutex::new(Some(SlotBytes(Arc::new(data)))),
            pending_map: Mutex::new(None),
            notify: Notify::new(),
            uncacheable: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Marks the slot as holding a stand-in (a bad chunk's NaN tile): never written to the
    /// cache directory.
    pub fn mark_uncacheable(&self) {
        self.uncacheable
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// False once a stand-in tile went into it.
    pub fn is_cacheable(&self) -> bool {
        !self.uncacheable.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Which chunk this is.
    pub fn key(&self) -> &SlotKey {
        &self.key
    }

    /// Decoded size in bytes (what it costs the budget).
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Stored chunks (tiles) that fill it.
    pub fn tiles(&self) -> u64 {
        self.tiles
    }

    /// The assembled chunk, once ready.
    pub fn bytes(&self) -> Option<SlotBytes> {
        lock(&self.data).clone()
    }

    /// True once every tile arrived.
    pub fn is_ready(&self) -> bool {
        lock(&self.data).is_some()
    }

    /// Hands the slot its written and mapped file; the slot moves onto it (and frees its heap
    /// buffer) at [`Slot::settle`], once nothing pins it.
    pub(crate) fn offer_mapping(&self, mapped: MappedFile) {
        if mapped.data().len() as u64 == self.nbytes {
            *lock(&self.pending_map) = Some(mapped);
        }
    }

    /// Moves a ready slot onto its offered mapping, if there is one.
    pub(crate) fn settle(&self) {
        let Some(m) = lock(&self.pending_map).take() else {
            return;
        };
        let mut data = lock(&self.data);
        if data.is_some() {
            *data = Some(SlotBytes(Arc::new(SlotData::Mapped(m))));
        }
    }

    /// A file-backed slot going to rest in the LRU: closes its file (readers holding a
    /// snapshot keep the descriptor until they are done), so resting slots hold no descriptor.
    pub(crate) fn close_file(&self) {
        let mut data = lock(&self.data);
        if let Some(b) = data.as_ref()
            && let SlotData::File(f) = &**b
        {
            let closed = SlotData::Closed(ClosedRange {
                path: f.file.path().to_path_buf(),
                offset: f.offset,
                len: f.len,
            });
            *data = Some(SlotBytes(Arc::new(closed)));
        }
    }

    /// Whether this is a file-backed slot at rest (its file closed).
    pub(crate) fn is_closed(&self) -> bool {
        matches!(lock(&self.data).as_deref(), Some(SlotData::Closed(_)))
    }

    /// Where a closed file-backed slot's data is (`None` for any other slot).
    pub(crate) fn closed_range(&self) -> Option<ClosedRange> {
        match lock(&self.data).as_deref() {
            Some(SlotData::Closed(c)) => Some(c.clone()),
            _ => None,
        }
    }

    /// A hit on a closed file-backed slot: `opened` is its file mapped or reopened (see
    /// [`SlotData::reopen`]), prepared by the caller without the pool's lock, `None` if the file
    /// could not be opened. False then (the slot is unusable and must be dropped). A slot that
    /// is not closed keeps its data and `opened` is dropped.
    pub(crate) fn reopen_file(&self, opened: Option<SlotData>) -> bool {
        let mut data = lock(&self.data);
        if !matches!(data.as_deref(), Some(SlotData::Closed(_))) {
            return true;
        }
        let Some(open) = opened else {
            return false;
        };
        *data = Some(SlotBytes(Arc::new(open)));
        true
    }

    /// Why it failed, if it did.
    pub fn failure(&self) -> Option<SlotFailure> {
        match &*lock(&self.state) {
            State::Failed(f) => Some(f.clone()),
            _ => None,
        }
    }

    /// True while tiles are still expected.
    pub fn is_loading(&self) -> bool {
        matches!(*lock(&self.state), State::Loading { .. })
    }

    /// Loading, ready or failed, read once. A caller that must tell the three apart has to use
    /// this: reading `is_ready` and then `is_loading` can see a slot that completed in between
    /// as neither, that is as failed.
    pub fn phase(&self) -> Phase {
        match &*lock(&self.state) {
            State::Loading { .. } => Phase::Loading,
            State::Ready => Phase::Ready,
            State::Failed(_) => Phase::Failed,
        }
    }

    /// Publishes the assembled buffer. Called with the state lock held, before the state
    /// becomes `Ready`, so whoever sees `Ready` also sees the data.
    fn publish(&self, buf: SlotData) {
        assert_eq!(
            buf.len() as u64,
            self.nbytes,
            "slot {} completed with the wrong size",
            self.key
        );
        // Only the loader that moves the state out of Loading gets here, once.
        let mut data = lock(&self.data);
        assert!(data.is_none(), "slot {} filled twice", self.key);
        *data = Some(SlotBytes(Arc::new(buf)));
    }

    /// Takes a decoded single-tile chunk as the slot's buffer, without a copy. Errors when the
    /// slot has more than one tile, the size is wrong, or the slot is no longer loading.
    pub fn adopt(&self, bytes: Vec<u8>) -> Result<(), String> {
        if self.tiles != 1 {
            return Err(format!(
                "slot {} has {} tiles and cannot adopt one buffer",
                self.key, self.tiles
            ));
        }
        self.complete(SlotData::Heap(bytes))
    }

    /// Publishes a single-tile slot's data (a decoded buffer, or a revived one). Errors when the
    /// size is wrong or the slot is no longer loading.
    pub fn complete(&self, data: SlotData) -> Result<(), String> {
        if data.len() as u64 != self.nbytes {
            return Err(format!(
                "slot {} ({} bytes) cannot take a {}-byte buffer",
                self.key,
                self.nbytes,
                data.len()
            ));
        }
        {
            let mut st = lock(&self.state);
            match &*st {
                State::Loading { tiles_left, .. } if self.tiles == 1 && *tiles_left == 1 => {}
                State::Loading { tiles_left, .. } => {
                    return Err(format!(
                        "slot {} still waits for {tiles_left} tiles",
                        self.key
                    ));
                }
                _ => return Err(format!("slot {} is not loading", self.key)),
            }
            self.publish(data);
            *st = State::Ready;
        }
        self.notify.notify_all();
        Ok(())
    }

    /// Copies one tile into the chunk being assembled with `fill` (given the whole buffer of
    /// `assembled_bytes`, zeroed on first use); after the last tile, `finish` turns the
    /// assembled chunk into the slot's bytes (the chunk transforms, which may resize it to the
    /// slot's size) before anyone can see it, or fails the slot with its error. Returns true
    /// when this was the last tile and the slot is now ready; an error when the slot is no
    /// longer loading (it failed or was cancelled) or `finish` failed.
    pub fn deliver_tile(
        &self,
        assembled_bytes: usize,
        fill: impl FnOnce(&mut [u8]),
        finish: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, String>,
    ) -> Result<bool, String> {
        let done = {
            let mut st = lock(&self.state);
            let State::Loading { tiles_left, buf } = &mut *st else {
                return Err(format!("slot {} is not loading", self.key));
            };
            if *tiles_left == 0 {
                return Err(format!("slot {} has all its tiles", self.key));
            }
            let b = buf.get_or_insert_with(|| vec![0u8; assembled_bytes]);
            fill(b);
            *tiles_left -= 1;
            if *tiles_left == 0 {
                match finish(buf.take().expect("buffer allocated above")) {
                    Ok(b) => {
                        self.publish(SlotData::Heap(b));
                        *st = State::Ready;
                        true
                    }
                    Err(message) => {
                        *st = State::Failed(SlotFailure {
                            cancelled: false,
                            message: message.clone().into(),
                        });
                        drop(st);
                        self.notify.notify_all();
                        return Err(message);
                    }
                }
            } else {
                false
            }
        };
        if done {
            self.notify.notify_all();
        }
        Ok(done)
    }

    /// Marks a loading slot failed and wakes its waiters; false if it was not loading.
    pub fn fail(&self, failure: SlotFailure) -> bool {
        {
            let mut st = lock(&self.state);
            if !matches!(*st, State::Loading { .. }) {
                return false;
            }
            *st = State::Failed(failure);
        }
        self.notify.notify_all();
        true
    }

    /// Waits until the slot is ready (or failed).
    pub async fn wait(&self) -> Result<(), SlotFailure> {
        loop {
            let generation = self.notify.generation();
            match &*lock(&self.state) {
                State::Ready => return Ok(()),
                State::Failed(f) => return Err(f.clone()),
                State::Loading { .. } => {}
            }
            // The generation was read before the check, so a completion in between is seen.
            self.notify.changed_since(generation).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_assemble_once_and_refuse_late_delivery() {
        let s = Slot::new(0, SlotKey::new("a", 3), 4, 2);
        // Six bytes assembled; `finish` runs once, on the whole buffer, after the last tile and
        // before the slot is ready, and makes the slot's four bytes of it.
        let sums = |b: Vec<u8>| Ok(b.chunks(3).flat_map(|c| [c[0] + c[1], c[2]]).collect());
        let never = |_: Vec<u8>| -> Result<Vec<u8>, String> { panic!("finished early") };
        let first = s.deliver_tile(6, |b| b[..3].copy_from_slice(&[1, 2, 3]), never);
        assert!(!first.unwrap());
        assert!(!s.is_ready());
        let last = s.deliver_tile(6, |b| b[3..].copy_from_slice(&[4, 5, 6]), sums);
        assert!(last.unwrap());
        assert_eq!(s.bytes().unwrap().memory().unwrap(), &[3, 3, 9, 6]);
        assert!(
            s.deliver_tile(6, |_| {}, Ok).is_err(),
            "a ready slot takes no tiles"
        );
        assert!(!s.fail(SlotFailure {
            cancelled: true,
            message: "x".into()
        }));
        assert!(s.adopt(vec![0; 4]).is_err());
    }

    #[test]
    fn a_failed_finish_fails_the_slot_with_its_message() {
        let s = Slot::new(0, SlotKey::new("a", 3), 4, 1);
        let broken = |_: Vec<u8>| Err("the transform broke its promise".to_string());
        let err = s.deliver_tile(4, |b| b.fill(1), broken).unwrap_err();
        assert!(err.contains("broke its promise"));
        assert!(!s.is_ready() && !s.is_loading());
        let failure = s.failure().expect("failed");
        assert!(!failure.cancelled && failure.message.contains("broke its promise"));
    }

    #[test]
    fn failed_slot_reports_the_failure_and_takes_nothing() {
        let s = Slot::new(0, SlotKey::new("a", 3), 4, 1);
        assert!(s.fail(SlotFailure {
            cancelled: false,
            message: "bad chunk a/3.0".into()
        }));
        assert_eq!(&*s.failure().unwrap().message, "bad chunk a/3.0");
        assert!(s.adopt(vec![0; 4]).is_err());
        assert!(s.bytes().is_none());
        let wrong = Slot::new(1, SlotKey::new("a", 4), 4, 1);
        assert!(wrong.adopt(vec![0; 3]).is_err(), "size is checked");
        assert!(wrong.adopt(vec![9; 4]).is_ok());
        assert_eq!(wrong.bytes().unwrap().memory().unwrap(), &[9; 4]);
    }
}
