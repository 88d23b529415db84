//! The batch copy, split across cores.
//!
//! A resident (all-hit) epoch is a memory copy and nothing else, and at the end of a cold epoch
//! the last block's rows are copied while the decoders have run dry; one core cannot saturate
//! memory bandwidth, so a large batch is cut into parts by bytes and the parts are copied on
//! every executor at once. Each part writes a disjoint set of destination ranges.
//!
//! A slot revived from the cache directory is not in memory: its runs are read from the file
//! straight into the batch buffer (one read through the runtime per run), so a revived byte is
//! copied once — by the kernel, on whichever executor runs that part.

use std::sync::Arc;

use insitubatch_pool::{FileRange, PooledBuf, Slot, SlotBytes, SlotData};
use insitubatch_runtime::{IoBuf, IoBufMut};

/// One contiguous copy: `len` bytes from `slots[slot]` at `src` to batch buffer `buf` at
/// `dst`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyRun {
    pub buf: usize,
    pub dst: usize,
    pub slot: usize,
    pub src: usize,
    pub len: usize,
}

/// A destination range of a batch buffer handed to a read. It holds the job, so the buffer stays
/// alive until the read completes even if the task that started it is dropped.
struct DstRange {
    ptr: *mut u8,
    len: usize,
    init: usize,
    _job: Arc<CopyJob>,
}

// SAFETY: the pointer is into a batch buffer the held `CopyJob` owns (heap memory that does
// not move); the range is this run's alone (checked in `CopyJob::new`).
unsafe impl Send for DstRange {}

// SAFETY: `ptr` stays valid and unmoved while the value lives (see above); the first `init`
// bytes have been written by completed reads.
unsafe impl IoBuf for DstRange {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr
    }
    fn bytes_init(&self) -> usize {
        self.init
    }
}

// SAFETY: `len` writable bytes at `ptr`, nobody else's (disjoint runs, checked in `new`).
unsafe impl IoBufMut for DstRange {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.init = self.init.max(n);
    }
}

/// Batch buffers and the slots they are filled from, shared by the tasks copying one batch.
pub(crate) struct CopyJob {
    /// Owned until every part is done; only the pointers in `dst` are written through.
    bufs: Vec<PooledBuf>,
    dst: Vec<(*mut u8, usize)>,
    /// The slots' bytes, held for the whole copy (a slot may move onto its cache file
    /// meanwhile; these keep the memory being copied from alive).
    slots: Vec<SlotBytes>,
    runs: Vec<CopyRun>,
}

// SAFETY: the raw pointers point into `bufs`' heap allocations, which `CopyJob` owns and which
// do not move when it does. Parts write disjoint destination ranges (checked in `new`), and
// nothing reads the buffers until every part has finished (`into_buffers` needs the job to be
// uniquely owned again).
unsafe impl Send for CopyJob {}
// SAFETY: as above: shared access only ever writes disjoint ranges through `copy_part`.
unsafe impl Sync for CopyJob {}

impl CopyJob {
    /// A job writing `runs` into `bufs` from `slots`, which must all be ready.
    pub fn new(mut bufs: Vec<PooledBuf>, slots: Vec<Arc<Slot>>, runs: Vec<CopyRun>) -> Self {
        let slots: Vec<SlotBytes> = slots
            .iter()
            .map(|s| s.bytes().expect("copy from a ready slot"))
            .collect();
        let dst: Vec<(*mut u8, usize)> = bufs
            .iter_mut()
            .map(|b| {
                let s = b.as_mut_slice();
                (s.as_mut_ptr(), s.len())
            })
            .collect();
        // Every run in bounds on both sides, and the runs into one buffer disjoint: what makes
        // the shared writes in `copy_part` sound.
        let mut per_buf: Vec<Vec<(usize, usize)>> = vec![Vec::new(); bufs.len()];
        for r in &runs {
            assert!(
                r.dst + r.len <= dst[r.buf].1,
                "copy run past its batch buffer"
            );
            assert!(
                r.src + r.len <= slots[r.slot].len(),
                "copy run past its slot"
            );
            per_buf[r.buf].push((r.dst, r.dst + r.len));
        }
        for ranges in &mut per_buf {
            ranges.sort_unstable();
            assert!(
                ranges.windows(2).all(|w| w[0].1 <= w[1].0),
                "overlapping copy runs"
            );
        }
        Self {
            bufs,
            dst,
            slots,
            runs,
        }
    }

    /// Total bytes to copy.
    pub fn bytes(&self) -> usize {
        self.runs.iter().map(|r| r.len).sum()
    }

    /// Cuts the runs into at most `parts` ranges of about equal bytes.
    pub fn parts(&self, parts: usize) -> Vec<std::ops::Range<usize>> {
        let per = self.bytes().max(1).div_ceil(parts.max(1));
        let mut out = Vec::new();
        let (mut start, mut acc) = (0, 0);
        for (i, r) in self.runs.iter().enumerate() {
            acc += r.len;
            if acc >= per && out.len() + 1 < parts {
                out.push(start..i + 1);
                start = i + 1;
                acc = 0;
            }
        }
        out.push(start..self.runs.len());
        out
    }

    /// Bytes of the runs that read from cache files rather than memory.
    pub fn file_bytes(&self) -> usize {
        self.runs
            .iter()
            .filter(|r| self.slots[r.slot].memory().is_none())
            .map(|r| r.len)
            .sum()
    }

    /// Copies the runs in `range`: memory with streaming stores (`stream`), cache files with
    /// reads into the batch buffer. An error names the file.
    pub async fn copy_part(self: &Arc<Self>, range: std::ops::Range<usize>) -> Result<(), String> {
        // Reads from cache files go out together (they wait on the device when the page cache
        // lacks the pages); memory runs are copied meanwhile.
        let mut reads = Vec::new();
        for r in &self.runs[range] {
            let (base, _) = self.dst[r.buf];
            match &*self.slots[r.slot] {
                SlotData::File(f) => reads.push(self.read_run(f, r)),
                SlotData::Closed(c) => {
                    return Err(format!(
                        "internal error: the cache file {} of a pinned slot is closed",
                        c.path.display()
                    ));
                }
                data => {
                    let mem = data.memory().expect("heap and mapped slots are in memory");
                    let src = &mem[r.src..r.src + r.len];
                    // SAFETY: `new` checked that the destination range is inside the buffer and
                    // disjoint from every other run's; slot data is immutable once ready and is
                    // never a batch buffer; each run belongs to exactly one part.
                    unsafe { super::stream::copy_raw(base.add(r.dst), src.as_ptr(), r.len) };
                }
            }
        }
        super::stream::stores_done();
        insitubatch_runtime::join_all(reads)
            .await
            .into_iter()
            .collect()
    }

    /// Reads run `r` from a cache file into its destination range.
    async fn read_run(self: &Arc<Self>, f: &FileRange, r: &CopyRun) -> Result<(), String> {
        let (base, _) = self.dst[r.buf];
        let dst = DstRange {
            // SAFETY: in bounds, checked in `new`.
            ptr: unsafe { base.add(r.dst) },
            len: r.len,
            init: 0,
            _job: Arc::clone(self),
        };
        let at = f.offset + r.src as u64;
        match f.file.read_exact_buf(dst, at).await {
            (Ok(()), _) => Ok(()),
            (Err(e), _) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(format!(
                "{e}; the cache file was truncated: delete it (it is fetched again from the store)"
            )),
            (Err(e), _) => Err(format!(
                "cannot read the cache file {}: {e}",
                f.file.path().display()
            )),
        }
    }

    /// The filled buffers, once every part is done (the job is uniquely owned again).
    pub fn into_buffers(self: Arc<Self>) -> Result<Vec<PooledBuf>, Arc<Self>> {
        Arc::try_unwrap(self).map(|job| job.bufs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use insitubatch_pool::{Admission, Budget, BufferPool, ChunkPool, SlotKey};

    fn run(buf: usize, dst: usize, slot: usize, src: usize, len: usize) -> CopyRun {
        CopyRun {
            buf,
            dst,
            slot,
            src,
            len,
        }
    }

    #[test]
    fn parts_cover_every_run_once_and_copies_land_where_asked() {
        let pool = ChunkPool::new(Budget::Bytes(1 << 20));
        let owner = pool.register_owner("t", 1 << 20).unwrap();
        let mut slots = Vec::new();
        for c in 0..3u8 {
            let Admission::Miss(s) = owner.admit(&SlotKey::new("a", c as u64), 64, 1).unwrap()
            else {
                panic!("fresh pool")
            };
            s.adopt((0..64).map(|i| c * 64 + i).collect()).unwrap();
            slots.push(s);
        }
        let buffers = BufferPool::with_reuse(false);
        let bufs = vec![buffers.take(96).unwrap(), buffers.take(32).unwrap()];
        let runs = vec![
            run(0, 0, 2, 8, 32),
            run(0, 32, 0, 0, 64),
            run(1, 0, 1, 32, 32),
        ];
        let job = Arc::new(CopyJob::new(bufs, slots, runs));
        let parts = job.parts(2);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), 3);
        let rt = insitubatch_runtime::RuntimeBuilder::new()
            .executor_threads(1)
            .build()
            .unwrap();
        for p in parts {
            let job = Arc::clone(&job);
            rt.handle()
                .spawn("copy", move || async move { job.copy_part(p).await })
                .join()
                .unwrap()
                .unwrap();
        }
        drop(rt);
        let Ok(bufs) = job.into_buffers() else {
            panic!("every part is done, so the job is ours alone")
        };
        let a = bufs[0].as_slice();
        assert_eq!((a[0], a[31], a[32], a[95]), (136, 167, 0, 63));
        assert_eq!(bufs[1].as_slice()[0], 96);
    }

    #[test]
    #[should_panic(expected = "overlapping copy runs")]
    fn overlapping_runs_are_refused() {
        let pool = ChunkPool::new(Budget::Bytes(1 << 20));
        let owner = pool.register_owner("t", 1 << 20).unwrap();
        let Admission::Miss(s) = owner.admit(&SlotKey::new("a", 0), 64, 1).unwrap() else {
            panic!("fresh pool")
        };
        s.adopt(vec![0; 64]).unwrap();
        let buffers = BufferPool::with_reuse(false);
        let runs = vec![run(0, 0, 0, 0, 32), run(0, 16, 0, 0, 32)];
        let _ = CopyJob::new(vec![buffers.take(64).unwrap()], vec![s], runs);
    }
}
