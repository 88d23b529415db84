//! Runtime behaviour on both IO backends: concurrency, cancellation, shutdown, actors, fallback.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use insitubatch_runtime::{
    AlignedBuf, FallbackReason, Handle, IoBackend, IoBackendChoice, JoinHandle, Runtime,
    RuntimeBuilder, SendError, TaskError, fs, probe,
};

/// Every backend this machine can run (io_uring only when the probe succeeds).
fn backends() -> Vec<IoBackendChoice> {
    let mut v = vec![IoBackendChoice::Threads];
    if probe().unavailable.is_none() {
        v.push(IoBackendChoice::Uring);
    }
    v
}

fn runtime(choice: IoBackendChoice, name: &str) -> Runtime {
    RuntimeBuilder::new()
        .executor_threads(2)
        .io_backend(choice)
        .name(name)
        .build()
        .unwrap()
}

/// `threads_named(prefix)` once it equals `want`, or its value after 2 s: a joined thread can stay
/// listed in `/proc/self/task` for a moment while the kernel finishes its exit.
fn threads_named_settled(prefix: &str, want: usize) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let n = threads_named(prefix);
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.starts_with(prefix))
        .count()
}

#[test]
fn ten_thousand_small_files_read_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    const N: usize = 10_000;
    for i in 0..N {
        std::fs::write(
            dir.path().join(format!("{i}")),
            format!("chunk-{i}-").repeat(i % 7 + 1),
        )
        .unwrap();
    }
    for choice in backends() {
        let rt = runtime(choice, "tenk");
        let mut handles = Vec::new();
        // 64 tasks each reading a strided share, so hundreds of reads are in flight at once.
        for t in 0..64usize {
            let root = dir.path().to_path_buf();
            handles.push(rt.spawn("reader", move || async move {
                let mut ok = 0usize;
                for i in (t..N).step_by(64) {
                    let data = fs::read(root.join(format!("{i}"))).await.unwrap();
                    assert_eq!(
                        data,
                        format!("chunk-{i}-").repeat(i % 7 + 1).into_bytes(),
                        "file {i}"
                    );
                    ok += 1;
                }
                ok
            }));
        }
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, N, "backend {choice:?}");
    }
}

#[test]
fn read_range_write_and_fsync_roundtrip() {
    let dir = tempfile::tempdir().unwrap();
    for choice in backends() {
        let rt = runtime(choice, "rw");
        let path = dir.path().join(format!("f-{choice:?}"));
        let p = path.clone();
        rt.block_on(move || async move {
            let f = fs::File::open(&p, fs::OpenOptions::write_create())
                .await
                .unwrap();
            let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let (r, back) = f.write_all_at(data, 10).await;
            r.unwrap();
            assert_eq!(back.len(), 100_000, "the buffer comes back");
            f.sync(false).await.unwrap();
            assert_eq!(f.stat().await.unwrap().len, 100_010);
            let got = fs::read_range(&p, 1010, 500).await.unwrap();
            let want: Vec<u8> = (1000..1500u32).map(|i| (i % 251) as u8).collect();
            assert_eq!(got, want);
            // Past the end: a short read, not an error.
            assert_eq!(fs::read_range(&p, 100_000, 100).await.unwrap().len(), 10);
        })
        .unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(&on_disk[..10], &[0u8; 10]);
        assert_eq!(on_disk[10 + 300], (300 % 251) as u8);
    }
}

#[test]
fn vectored_write_puts_the_body_right_after_the_head_and_hands_both_back() {
    let dir = tempfile::tempdir().unwrap();
    for choice in backends() {
        let rt = runtime(choice, "wv");
        let path = dir.path().join(format!("v-{choice:?}"));
        let p = path.clone();
        rt.block_on(move || async move {
            let f = fs::File::open(&p, fs::OpenOptions::write_create())
                .await
                .unwrap();
            let head: Vec<u8> = (0..100u32).map(|i| 200 + (i % 50) as u8).collect();
            let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            let (r, head, body) = f.write_all_vectored_at(head, body, 7).await;
            r.unwrap();
            assert_eq!(
                (head.len(), body.len()),
                (100, 300_000),
                "both buffers come back"
            );
            // An empty head writes the body alone, at the offset.
            let (r, _, _) = f
                .write_all_vectored_at(Vec::new(), vec![9u8; 5], 400_000)
                .await;
            r.unwrap();
            // A file open for reading only refuses the write, and still hands both back.
            let ro = fs::File::open(&p, fs::OpenOptions::read()).await.unwrap();
            let (r, head, body) = ro
                .write_all_vectored_at(vec![1u8; 3], vec![2u8; 4], 0)
                .await;
            assert!(r.is_err(), "a write through a read-only descriptor");
            assert_eq!((head, body), (vec![1u8; 3], vec![2u8; 4]));
        })
        .unwrap();
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len(), 400_005, "backend {choice:?}");
        assert_eq!(&on_disk[..7], &[0u8; 7]);
        let head: Vec<u8> = (0..100u32).map(|i| 200 + (i % 50) as u8).collect();
        assert_eq!(&on_disk[7..107], &head[..]);
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(&on_disk[107..300_107], &body[..], "backend {choice:?}");
        assert!(on_disk[300_107..400_000].iter().all(|&b| b == 0));
        assert_eq!(&on_disk[400_000..], &[9u8; 5]);
    }
}

#[test]
fn rename_replaces_the_target_and_fails_for_a_missing_source() {
    let dir = tempfile::tempdir().unwrap();
    for choice in backends() {
        let rt = runtime(choice, "mv");
        let (from, to) = (dir.path().join("from"), dir.path().join("to"));
        std::fs::write(&from, b"new").unwrap();
        std::fs::write(&to, b"old").unwrap();
        let (f, t) = (from.clone(), to.clone());
        let missing = rt
            .block_on(move || async move {
                // The file open before the rename is the file after it.
                let open = fs::File::open(&f, fs::OpenOptions::read()).await.unwrap();
                fs::rename(&f, &t).await.unwrap();
                assert_eq!(open.read_exact_at(0, 3).await.unwrap(), b"new");
                fs::rename(&f, &t).await.unwrap_err()
            })
            .unwrap();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{choice:?}");
        assert!(!from.exists(), "{choice:?}");
        assert_eq!(std::fs::read(&to).unwrap(), b"new", "{choice:?}");
        // Off the runtime it is refused, not run on the caller's thread.
        let mut off = std::pin::pin!(fs::rename(&to, &from));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(off) = off.as_mut().poll(&mut cx) else {
            panic!("a rename off the runtime must fail at once")
        };
        let off = off.unwrap_err();
        assert!(off.to_string().contains("executor thread"), "{off}");
        assert!(to.exists());
    }
}

#[test]
fn remove_file_unlinks_a_name_whose_open_file_stays_readable_and_fails_for_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    for choice in backends() {
        let rt = runtime(choice, "rm");
        let path = dir.path().join("gone");
        std::fs::write(&path, b"data").unwrap();
        let p = path.clone();
        let missing = rt
            .block_on(move || async move {
                let open = fs::File::open(&p, fs::OpenOptions::read()).await.unwrap();
                fs::remove_file(&p).await.unwrap();
                assert!(!p.exists());
                // An open descriptor (or a mapping) keeps the inode.
                assert_eq!(open.read_exact_at(0, 4).await.unwrap(), b"data");
                fs::remove_file(&p).await.unwrap_err()
            })
            .unwrap();
        assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{choice:?}");
        // Off the runtime it is refused, not run on the caller's thread.
        std::fs::write(&path, b"data").unwrap();
        let mut off = std::pin::pin!(fs::remove_file(&path));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(off) = off.as_mut().poll(&mut cx) else {
            panic!("an unlink off the runtime must fail at once")
        };
        assert!(off.unwrap_err().to_string().contains("executor thread"));
        assert!(path.exists());
        std::fs::remove_file(&path).unwrap();
    }
}

/// The process's descriptors open on files under `dir`: what this test's own opens could leak,
/// whatever other tests running beside it in the same process have open.
fn fds_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// Yields until the executor has been through at least one tick of its IO driver (it polls a
/// bounded number of ready tasks between ticks).
async fn through_a_tick() {
    for _ in 0..256 {
        insitubatch_runtime::yield_now().await;
    }
}

#[test]
fn an_open_abandoned_in_flight_leaves_no_descriptor_open() {
    // A task dropped while its open is in flight (an aborted lookup, a cancelled pass) must not
    // leak the descriptor the open returns after the task is gone.
    let dir = tempfile::tempdir().unwrap();
    for choice in backends() {
        let rt = runtime(choice, "abandon");
        let d = dir.path().join(format!("{choice:?}"));
        std::fs::create_dir(&d).unwrap();
        let d = d.canonicalize().unwrap();
        let under = d.clone();
        let abandoned = rt
            .block_on(move || async move {
                let mut abandoned = 0;
                for i in 0..64 {
                    // Creating a file always leaves the executor (for io_uring's workers or an
                    // IO thread): poll the open once so that it is in flight.
                    let path = d.join(i.to_string());
                    let mut open =
                        std::pin::pin!(fs::File::open(path, fs::OpenOptions::write_create()));
                    let first = std::future::poll_fn(|cx| {
                        std::task::Poll::Ready(open.as_mut().poll(cx).is_pending())
                    });
                    abandoned += usize::from(first.await);
                    // Dropped at once (cancelled before it runs), after the executor has handed
                    // it over, or after it has completed unseen.
                    if i % 4 > 0 {
                        through_a_tick().await;
                    }
                    if i % 4 > 1 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    if i % 4 > 2 {
                        through_a_tick().await;
                    }
                }
                while insitubatch_runtime::in_flight_ops().unwrap() > 0 {
                    insitubatch_runtime::yield_now().await;
                }
                abandoned
            })
            .unwrap();
        assert!(
            abandoned > 0,
            "{choice:?}: no open was in flight when dropped"
        );
        // The last abandoned result is released just after its operation stops counting.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !fds_under(&under).is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            fds_under(&under),
            Vec::<std::path::PathBuf>::new(),
            "{choice:?}: descriptors leaked"
        );
    }
}

#[test]
fn direct_io_writes_to_a_new_file_where_the_file_system_allows() {
    // Creating the file and extending it with O_DIRECT writes cannot complete without blocking:
    // on io_uring both go to its workers at once. The bytes must land all the same.
    let dir = tempfile::tempdir_in("/var/tmp").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
    for choice in backends() {
        let rt = runtime(choice, "direct-write");
        let p = dir.path().join(format!("{choice:?}.bin"));
        let (p2, want) = (p.clone(), data.clone());
        let written = rt
            .block_on(move || async move {
                let opts = fs::OpenOptions::write_create().truncate(true).direct(true);
                match fs::File::open(&p2, opts).await {
                    Ok(f) => {
                        let mut buf = AlignedBuf::with_capacity(want.len());
                        buf.as_mut_capacity()[..want.len()].copy_from_slice(&want);
                        buf.set_len(want.len());
                        let (r, _) = f.write_all_at(buf, 0).await;
                        r.unwrap();
                        true
                    }
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
                        false
                    }
                }
            })
            .unwrap();
        if written {
            assert_eq!(std::fs::read(&p).unwrap(), data, "{choice:?}");
        }
    }
}

#[test]
fn direct_io_reads_where_the_file_system_allows() {
    // /var/tmp is usually a disk file system (tmpfs refuses O_DIRECT with EINVAL, which the
    // caller must be able to see and handle).
    let dir = tempfile::tempdir_in("/var/tmp").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let path = dir.path().join("direct.bin");
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 13) as u8).collect();
    std::fs::write(&path, &data).unwrap();
    for choice in backends() {
        let rt = runtime(choice, "direct");
        let p = path.clone();
        let want = data.clone();
        rt.block_on(move || async move {
            match fs::File::open(&p, fs::OpenOptions::read().direct(true)).await {
                Ok(f) => {
                    let (r, buf) = f.read_at(AlignedBuf::with_capacity(2 * 4096), 4096).await;
                    assert_eq!(r.unwrap(), 2 * 4096);
                    assert_eq!(buf.as_slice(), &want[4096..3 * 4096]);
                }
                Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}"),
            }
        })
        .unwrap();
    }
}

#[test]
fn errors_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    for choice in backends() {
        let rt = runtime(choice, "err");
        let root = dir.path().to_path_buf();
        rt.block_on(move || async move {
            let e = fs::read(root.join("missing")).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            let e = fs::read(root.join("sub")).await.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::IsADirectory);
            assert!(e.to_string().contains("sub"), "{e}");
        })
        .unwrap();
    }
    // Off the runtime, IO is an error rather than a hang or a panic.
    let rt = runtime(IoBackendChoice::Threads, "off");
    drop(rt);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut fut = Box::pin(fs::read("/etc/hostname"));
        let r = fut.as_mut().poll(&mut cx);
        tx.send(matches!(r, std::task::Poll::Ready(Err(_))))
            .unwrap();
    });
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
}

use std::future::Future;

#[test]
fn aborting_a_task_with_a_read_in_flight_keeps_the_buffer_until_completion() {
    if probe().unavailable.is_some() {
        return; // covered on the threads backend by the shutdown test
    }
    // A pipe read blocks until data arrives: the only way it ends is cancellation.
    let mut fds = [0i32; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let read_end = format!("/proc/self/fd/{}", fds[0]);
    let rt = runtime(IoBackendChoice::Uring, "cancel");
    let started = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&started);
    let task = rt.spawn_on(0, "pipe-reader", move || async move {
        let f = fs::File::open(&read_end, fs::OpenOptions::read())
            .await
            .unwrap();
        s.fetch_add(1, Ordering::SeqCst);
        let (_r, _buf) = f.read_at(Vec::with_capacity(4096), 0).await;
        unreachable!("nothing is ever written to the pipe");
    });
    while started.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    // The read is in flight on executor 0.
    let n = rt
        .spawn_on(0, "probe", || async {
            insitubatch_runtime::in_flight_ops().unwrap()
        })
        .join()
        .unwrap();
    assert_eq!(n, 1, "the pipe read is in flight");
    task.abort();
    assert!(matches!(task.join(), Err(TaskError::Cancelled { .. })));
    // Abandoned, not leaked: the driver asked the kernel to cancel, and the completion freed it.
    let mut left = 1;
    for _ in 0..1000 {
        left = rt
            .spawn_on(0, "probe", || async {
                insitubatch_runtime::in_flight_ops().unwrap()
            })
            .join()
            .unwrap();
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        left, 0,
        "the cancelled read completed and released its buffer"
    );
    // SAFETY: closing descriptors we created.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn shutdown_with_work_queued_resolves_every_task_and_joins_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..64 {
        std::fs::write(dir.path().join(format!("{i}")), vec![i as u8; 64 * 1024]).unwrap();
    }
    for choice in backends() {
        let prefix = format!(
            "sd{}",
            if choice == IoBackendChoice::Uring {
                "u"
            } else {
                "t"
            }
        );
        let mut rt = runtime(choice, &prefix);
        assert!(threads_named(&prefix) >= 2);
        let mut handles = Vec::new();
        for t in 0..2000usize {
            let root = dir.path().to_path_buf();
            handles.push(rt.spawn("busy", move || async move {
                let mut n = 0;
                for k in 0..8 {
                    n += fs::read(root.join(format!("{}", (t + k) % 64)))
                        .await?
                        .len();
                }
                Ok::<usize, std::io::Error>(n)
            }));
        }
        rt.shutdown();
        for h in handles {
            match h.join() {
                Ok(Ok(n)) => {
                    assert_eq!(n, 8 * 64 * 1024);
                }
                Ok(Err(e)) => assert!(e.to_string().contains("shutting down"), "{e}"),
                Err(TaskError::Cancelled { .. }) | Err(TaskError::RuntimeShutDown { .. }) => {}
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert_eq!(
            threads_named_settled(&prefix, 0),
            0,
            "no runtime thread outlives shutdown ({choice:?})"
        );
        // Spawning after shutdown is an error, not a hang.
        let late = rt.spawn("late", || async { 1 });
        assert!(matches!(
            late.join(),
            Err(TaskError::RuntimeShutDown { .. })
        ));
    }
}

#[test]
fn a_panicking_actor_reports_its_panic_and_closes_its_mailbox() {
    for choice in backends() {
        let rt = runtime(choice, "actor");
        let actor = rt.spawn_actor("decoder", 4, |mut inbox| async move {
            while let Some(x) = inbox.recv().await {
                if x == 3u32 {
                    panic!("bad chunk {x}");
                }
            }
            0u32
        });
        let sender = actor.sender();
        for x in 0..4u32 {
            sender.send_blocking(x).unwrap();
        }
        // After the panic the mailbox is gone: a send fails instead of blocking forever.
        let mut gone = false;
        for _ in 0..1000 {
            match sender.send_blocking(9) {
                Err(SendError::Gone(name)) => {
                    assert_eq!(name, "decoder");
                    gone = true;
                    break;
                }
                Ok(()) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("{e}"),
            }
        }
        assert!(gone);
        match actor.join() {
            Err(TaskError::Panicked { name, message }) => {
                assert_eq!(name, "decoder");
                assert!(message.contains("bad chunk 3"), "{message}");
            }
            other => panic!("expected a panic report, got {other:?}"),
        }
    }
}

#[test]
fn actor_stop_and_blocking_join_on_executor_is_refused() {
    let rt = runtime(IoBackendChoice::Threads, "stop");
    let actor = rt.spawn_actor("counter", 2, |mut inbox| async move {
        let mut n = 0u32;
        while inbox.recv().await.is_some() {
            n += 1;
        }
        n
    });
    for _ in 0..5 {
        actor.send_blocking(()).unwrap();
    }
    // finish() drains: every queued message is handled before the actor sees the end.
    assert_eq!(actor.finish().unwrap(), 5);
    // stop() ends an idle actor parked in recv() promptly, without closing any sender.
    let idle = rt.spawn_actor(
        "idle",
        2,
        |mut inbox: insitubatch_runtime::Mailbox<()>| async move {
            let mut n = 0u32;
            while inbox.recv().await.is_some() {
                n += 1;
            }
            n
        },
    );
    std::thread::sleep(Duration::from_millis(10));
    idle.stop();
    assert_eq!(idle.join().unwrap(), 0);
    // join() from an executor thread would deadlock; it says so instead.
    let inner = rt.spawn("slow", || async { 5 });
    let r = rt.block_on(move || async move { inner.join() }).unwrap();
    assert!(matches!(r, Err(TaskError::WouldBlockExecutor { .. })));
}

#[test]
fn forced_fallback_is_reported() {
    let rt = runtime(IoBackendChoice::Threads, "forced");
    assert_eq!(rt.io_backend(), IoBackend::Threads);
    assert_eq!(rt.fallback_reason(), Some(&FallbackReason::Forced));
    // The environment variable, when the suite runs with it, is obeyed by the default builder.
    let auto = RuntimeBuilder::new().executor_threads(1).build().unwrap();
    match std::env::var("INSITUBATCH_IO").as_deref() {
        Ok("threads") => {
            assert_eq!(auto.io_backend(), IoBackend::Threads);
            assert_eq!(auto.fallback_reason(), Some(&FallbackReason::Forced));
        }
        Ok("uring") => assert_eq!(auto.io_backend(), IoBackend::Uring),
        _ => assert_eq!(
            auto.io_backend() == IoBackend::Uring,
            probe().unavailable.is_none()
        ),
    }
}

#[test]
fn invalid_builder_arguments_are_errors() {
    let e = RuntimeBuilder::new()
        .executor_threads(0)
        .build()
        .err()
        .unwrap();
    assert!(e.to_string().contains("executor_threads"), "{e}");
    // An absurd thread count is refused up front rather than spawned until something fails.
    let e = RuntimeBuilder::new()
        .executor_threads(1_000_000)
        .build()
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("executor_threads") && e.to_string().contains("1024"),
        "{e}"
    );
    let e = RuntimeBuilder::new().ring_entries(1).build().err().unwrap();
    assert!(e.to_string().contains("ring_entries"), "{e}");
}

#[test]
fn join_all_runs_reads_together_and_keeps_their_order() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..16u8 {
        std::fs::write(dir.path().join(format!("{i}")), vec![i; 1000 + i as usize]).unwrap();
    }
    for choice in backends() {
        let rt = runtime(choice, "isb-join");
        let d = dir.path().to_path_buf();
        let sizes = rt
            .handle()
            .spawn("join", move || async move {
                let reads: Vec<_> = (0..16u8)
                    .map(|i| {
                        let p = d.join(format!("{i}"));
                        async move {
                            // Interleave the reads with yields so completions arrive out of order.
                            for _ in 0..(16 - i) {
                                insitubatch_runtime::yield_now().await;
                            }
                            fs::read(&p).await.unwrap()
                        }
                    })
                    .collect();
                insitubatch_runtime::join_all(reads).await
            })
            .join()
            .unwrap();
        for (i, bytes) in sizes.iter().enumerate() {
            assert_eq!(bytes.len(), 1000 + i, "{choice:?}");
            assert!(bytes.iter().all(|&b| b as usize == i));
        }
        assert!(
            rt.handle()
                .spawn("empty", || insitubatch_runtime::join_all(Vec::<
                    std::future::Ready<u8>,
                >::new(
                )))
                .join()
                .unwrap()
                .is_empty()
        );
    }
}

/// Drops the page-cache pages of `path` from `offset` on (clean pages only: the file is synced
/// first), so the next read of them must wait for the device.
fn drop_pages(path: &std::path::Path, offset: i64) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: advice on a descriptor we own; no memory is touched.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), offset, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0, "posix_fadvise");
}

#[test]
fn reads_are_whole_and_exact_whether_or_not_the_page_cache_holds_the_file() {
    // The thread fallback reads what the page cache holds on the executor and hands the rest to
    // an IO thread: a file half in the cache, and one not in it at all, read as whole files and
    // by range on both backends.
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..(3 << 20) as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    for choice in backends() {
        for (name, from) in [("half", 3 << 19), ("none", 0i64)] {
            let path = dir.path().join(format!("{name}-{choice:?}"));
            std::fs::write(&path, &data).unwrap();
            let rt = runtime(choice, "isb-cold");
            for round in 0..2 {
                drop_pages(&path, from);
                let p = path.clone();
                let (whole, range) = rt
                    .block_on(move || async move {
                        let whole = fs::read(&p).await.unwrap();
                        let f = fs::File::open(&p, fs::OpenOptions::read()).await.unwrap();
                        // Re-drop so the range read also starts uncached.
                        drop_pages(&p, from);
                        let range = f.read_exact_at(1_000_000, 2_000_000).await.unwrap();
                        (whole, range)
                    })
                    .unwrap();
                assert!(
                    whole == data,
                    "{choice:?} {name} round {round}: whole file differs"
                );
                assert!(
                    range[..] == data[1_000_000..3_000_000],
                    "{choice:?} {name} round {round}: range differs"
                );
            }
        }
    }
}

#[test]
fn a_task_reading_cached_files_in_a_loop_lets_other_tasks_run() {
    // A page-cache hit completes inline on the thread fallback, so a loop of them never waits;
    // the runtime must still make such a task yield now and then.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hot");
    std::fs::write(&path, vec![7u8; 4096]).unwrap();
    for choice in backends() {
        let rt = RuntimeBuilder::new()
            .executor_threads(1)
            .io_backend(choice)
            .name("isb-fair")
            .build()
            .unwrap();
        let ticks = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (t, d) = (Arc::clone(&ticks), Arc::clone(&done));
        let other = rt.spawn("other", move || async move {
            while !d.load(Ordering::SeqCst) {
                t.fetch_add(1, Ordering::SeqCst);
                insitubatch_runtime::yield_now().await;
            }
        });
        let (t, d, p) = (Arc::clone(&ticks), Arc::clone(&done), path.clone());
        let seen = rt
            .spawn("reader", move || async move {
                let start = t.load(Ordering::SeqCst);
                for _ in 0..2_000 {
                    assert_eq!(fs::read(&p).await.unwrap().len(), 4096);
                    let f = fs::File::open(&p, fs::OpenOptions::read()).await.unwrap();
                    assert_eq!(f.read_exact_at(0, 16).await.unwrap(), [7u8; 16]);
                }
                d.store(true, Ordering::SeqCst);
                t.load(Ordering::SeqCst) - start
            })
            .join()
            .unwrap();
        other.join().unwrap();
        assert!(
            seen >= 20,
            "{choice:?}: the other task ran {seen} times during 6,000 cached operations"
        );
    }
}

#[test]
fn an_exact_read_fills_the_buffer_or_names_the_file_that_ended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ten");
    std::fs::write(&path, b"0123456789").unwrap();
    for choice in backends() {
        let rt = runtime(choice, "isb-exact");
        let p = path.clone();
        rt.block_on(move || async move {
            let f = fs::File::open(&p, fs::OpenOptions::read()).await.unwrap();
            // After bytes already in the buffer, up to its capacity.
            let mut buf = Vec::with_capacity(6);
            buf.extend_from_slice(b"ab");
            assert_eq!(buf.capacity(), 6, "the test needs an exact capacity");
            let (r, buf) = f.read_exact_buf(buf, 3).await;
            r.unwrap();
            assert_eq!(&buf[..], b"ab3456");
            // Past the end: the bytes that were there, and an error naming the file.
            let (r, buf) = f.read_exact_buf(Vec::with_capacity(8), 6).await;
            let err = r.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{choice:?}");
            assert!(err.to_string().contains("ten"), "{err}");
            assert!(err.to_string().contains("after 4 of the"), "{err}");
            assert_eq!(&buf[..], b"6789");
        })
        .unwrap();
    }
}

/// The order in which tasks on one executor ran, as each wrote it.
type Log = Arc<std::sync::Mutex<Vec<String>>>;

fn note(log: &Log, entry: impl Into<String>) {
    log.lock().unwrap().push(entry.into());
}

fn one_executor(choice: IoBackendChoice) -> Runtime {
    RuntimeBuilder::new()
        .executor_threads(1)
        .io_backend(choice)
        .name("isb-urgent")
        .build()
        .unwrap()
}

/// Runs `spawn` in one poll of a task on executor 0, so that every task it spawns there is
/// queued in the same tick, in the order spawned.
fn spawn_together<T: Send + 'static>(
    rt: &Runtime,
    spawn: impl FnOnce(&Handle) -> Vec<JoinHandle<T>> + Send + 'static,
) -> Vec<JoinHandle<T>> {
    let handle = rt.handle();
    rt.spawn_on(0, "starter", move || async move { spawn(&handle) })
        .join()
        .unwrap()
}

#[test]
fn a_woken_urgent_task_runs_before_the_tasks_already_queued() {
    for choice in backends() {
        for urgent in [true, false] {
            let rt = one_executor(choice);
            let log: Log = Arc::default();
            let l = Arc::clone(&log);
            let tasks = spawn_together(&rt, move |h| {
                let (tx, rx) = flume::bounded::<()>(1);
                let ll = Arc::clone(&l);
                let waiter = move || async move {
                    rx.recv_async().await.unwrap();
                    note(&ll, "woken");
                };
                let mut tasks = vec![if urgent {
                    h.spawn_urgent_on(0, "waiter", waiter)
                } else {
                    h.spawn_on(0, "waiter", waiter)
                }];
                for i in 0..3 {
                    let ll = Arc::clone(&l);
                    tasks.push(h.spawn_on(0, "busy", move || async move {
                        for step in 0..10 {
                            note(&ll, format!("busy{i}.{step}"));
                            insitubatch_runtime::yield_now().await;
                        }
                    }));
                }
                tasks.push(h.spawn_on(0, "sender", move || async move {
                    for step in 0..10 {
                        if step == 5 {
                            tx.send(()).unwrap();
                            note(&l, "sent");
                        }
                        insitubatch_runtime::yield_now().await;
                    }
                }));
                tasks
            });
            for t in tasks {
                t.join().unwrap();
            }
            let log = log.lock().unwrap().clone();
            let at = |what: &str| log.iter().position(|e| e == what).unwrap();
            let (sent, woken) = (at("sent"), at("woken"));
            if urgent {
                assert_eq!(woken, sent + 1, "{choice:?}: {log:?}");
            } else {
                // An ordinary task waits behind the three busy ones.
                assert_eq!(woken, sent + 4, "{choice:?}: {log:?}");
            }
        }
    }
}

#[test]
fn an_urgent_task_that_yields_lets_the_others_run() {
    for choice in backends() {
        let rt = one_executor(choice);
        let log: Log = Arc::default();
        let l = Arc::clone(&log);
        let tasks = spawn_together(&rt, move |h| {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (ll, d) = (Arc::clone(&l), Arc::clone(&done));
            vec![
                h.spawn_urgent_on(0, "spinner", move || async move {
                    for _ in 0..100 {
                        note(&ll, "urgent");
                        insitubatch_runtime::yield_now().await;
                    }
                    d.store(true, Ordering::SeqCst);
                }),
                h.spawn_on(0, "other", move || async move {
                    while !done.load(Ordering::SeqCst) {
                        note(&l, "other");
                        insitubatch_runtime::yield_now().await;
                    }
                }),
            ]
        });
        for t in tasks {
            t.join().unwrap();
        }
        let log = log.lock().unwrap().clone();
        let last_urgent = log.iter().rposition(|e| e == "urgent").unwrap();
        let others = log[..last_urgent].iter().filter(|e| *e == "other").count();
        assert!(
            others >= 99,
            "{choice:?}: the other task ran {others} times while the urgent one yielded 100 times"
        );
    }
}

#[test]
fn an_urgent_task_woken_from_another_thread_runs_after_the_poll_under_way() {
    // Three tasks keep the executor's ready queue full, so its tick only ends after its poll
    // budget; an ordinary wake from another thread waits for that, an urgent one does not.
    for choice in backends() {
        let rt = one_executor(choice);
        let polls = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy: Vec<_> = (0..3)
            .map(|_| {
                let (p, d) = (Arc::clone(&polls), Arc::clone(&done));
                rt.spawn_on(0, "busy", move || async move {
                    while !d.load(Ordering::SeqCst) {
                        let t = std::time::Instant::now();
                        while t.elapsed() < Duration::from_micros(200) {
                            std::hint::spin_loop();
                        }
                        p.fetch_add(1, Ordering::SeqCst);
                        insitubatch_runtime::yield_now().await;
                    }
                })
            })
            .collect();
        let (tx, rx) = flume::bounded::<()>(1);
        let p = Arc::clone(&polls);
        let waiter = rt.spawn_urgent_on(0, "waiter", move || async move {
            rx.recv_async().await.unwrap();
            p.load(Ordering::SeqCst)
        });
        // Wait until the busy tasks have run for a while (and the waiter waits).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while polls.load(Ordering::SeqCst) < 300 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        tx.send(()).unwrap();
        let at_send = polls.load(Ordering::SeqCst);
        let at_run = waiter.join().unwrap();
        done.store(true, Ordering::SeqCst);
        for b in busy {
            b.join().unwrap();
        }
        assert!(
            at_run <= at_send + 2,
            "{choice:?}: {} polls of other tasks ran between the wake and the urgent task",
            at_run - at_send
        );
    }
}
