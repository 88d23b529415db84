//! Reads that wait for an ephemeral spill's evicted files to go.
//!
//! A chunk admitted into the room of slots the pool evicted must not land its own cache file
//! while theirs are still on disk, or the spill directory would hold more than its budget. An
//! unlink waits for its directory's lock and, on a file system mounted with `discard`, for the
//! device (0.3 ms for a 464 KiB file on the benchmark VM, almost none of it CPU), so neither the
//! planner nor an executor waits for it: the planner hands the files to a task of their own and
//! gives the chunk's read jobs a [`Gate`], which the fetcher passes before it reads. Other jobs
//! go on meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use insitubatch_pool::Unlinks;
use insitubatch_runtime::Handle;
use insitubatch_runtime::sync::Notify;

/// Opens once every batch of files given to it ([`Gate::unlink`]) is gone.
#[derive(Clone, Default)]
pub(crate) struct Gate(Arc<Inner>);

#[derive(Default)]
struct Inner {
    pending: AtomicUsize,
    opened: Notify,
}

impl Gate {
    /// Unlinks `unlinks` on a task of the runtime's; the gate stays shut until they are gone.
    pub(crate) fn unlink(&self, runtime: &Handle, unlinks: Unlinks) {
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        let batch = Unlinking {
            unlinks,
            _opens: Opens(self.clone()),
        };
        // A task dropped unfinished drops `batch`: what it had not unlinked goes then, on the
        // dropping thread, before the gate opens. The task owns all of `batch` (a closure that
        // named only `batch.unlinks` would capture that field alone, and the gate would open
        // here, as this function returns).
        runtime.spawn("unlink", move || async move {
            let mut batch = batch;
            batch.unlinks.run().await
        });
    }

    /// Completes once the gate is open.
    pub(crate) async fn passed(&self) {
        loop {
            let generation = self.0.opened.generation();
            if self.0.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            self.0.opened.changed_since(generation).await;
        }
    }
}

/// One batch of a gate's files; its fields drop in order, so the gate opens after the files
/// are gone.
struct Unlinking {
    unlinks: Unlinks,
    _opens: Opens,
}

struct Opens(Gate);

impl Drop for Opens {
    fn drop(&mut self) {
        if self.0.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.0.opened.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Waker};

    use insitubatch_pool::disk::fingerprint;
    use insitubatch_pool::{
        Admission, ArrayMeta, Budget, CacheConfig, ChunkPool, DiskTier, SlotBytes, SlotKey,
    };
    use insitubatch_runtime::RuntimeBuilder;

    use super::Gate;

    #[test]
    fn a_gate_stays_shut_until_its_files_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let meta = ArrayMeta {
            path: "v".into(),
            slot_shape: vec![2, 3],
            descr: "<f4".into(),
            fingerprint: fingerprint(&[]),
        };
        let tier = DiskTier::open(CacheConfig::new(dir.path()), vec![meta]).unwrap();
        // Room for one 24-byte slot: admitting chunk 1 evicts chunk 0, whose file landed.
        let pool = ChunkPool::with_disk(Budget::Bytes(24), Some(tier));
        let rt = RuntimeBuilder::new().executor_threads(1).build().unwrap();
        let handle = rt.handle();
        let spill_dir = dir.path().to_path_buf();
        rt.block_on(move || async move {
            let owner = pool.register_owner("a", 24).unwrap();
            let key = |c| SlotKey::new("v", c);
            let Ok(Admission::Miss(s0)) = owner.admit(&key(0), 24, 1) else {
                panic!("chunk 0 is a miss")
            };
            let write = pool.begin_write(&s0);
            s0.adopt((0..24).collect()).unwrap();
            let disk = pool.disk().unwrap();
            let permit = disk.reserve_write().await.unwrap();
            let mapped = disk
                .write(s0.key(), SlotBytes::heap((0..24).collect()), permit)
                .await
                .unwrap();
            assert!(write.landed(mapped).is_empty());
            owner.unpin(&s0);
            let spilled: Vec<_> = std::fs::read_dir(&spill_dir)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".0.npy"))
                .map(|e| e.path())
                .collect();
            assert_eq!(spilled.len(), 1, "chunk 0's file landed");
            let (admitted, unlinks) = owner.admit_deferring_unlinks(&key(1), 24, 1, None);
            assert!(matches!(admitted, Ok(Admission::Miss(_))));
            assert!(!unlinks.is_empty() && spilled[0].exists());
            let gate = Gate::default();
            gate.unlink(&handle, unlinks);
            // The unlink's task shares this executor and has not run: the gate is shut.
            let mut passed = std::pin::pin!(gate.passed());
            let mut cx = Context::from_waker(Waker::noop());
            assert!(passed.as_mut().poll(&mut cx).is_pending(), "open too soon");
            assert!(spilled[0].exists());
            passed.await;
            assert!(!spilled[0].exists(), "the gate opened before the file went");
        })
        .unwrap();
    }
}
