//! Latency of 32 concurrent whole-file reads through the runtime, with the system allocator:
//! the measurement behind the allocator note in docs/benchmarks.md.
//!
//! `cargo run --release -p insitubatch-runtime --example readlat DIR` (DIR holds the files).
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("usage: readlat DIR");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("read DIR")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files.truncate(32);
    let rt = insitubatch_runtime::RuntimeBuilder::new()
        .executor_threads(2)
        .build()
        .expect("runtime");
    for round in 0..5 {
        let t = Instant::now();
        let handles: Vec<_> = files
            .iter()
            .cloned()
            .map(|p| {
                rt.spawn_on(1, "read", move || async move {
                    insitubatch_runtime::fs::read(&p).await.expect("read").len()
                })
            })
            .collect();
        let bytes: usize = handles.into_iter().map(|h| h.join().expect("task")).sum();
        println!(
            "round {round}: {} files, {:.1} MB in {:.2} ms ({} backend)",
            files.len(),
            bytes as f64 / 1e6,
            t.elapsed().as_secs_f64() * 1e3,
            rt.io_backend()
        );
    }
}
