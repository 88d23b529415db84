//! Time to first batch on a cold pool: the first round also pays process warm-up (allocator,
//! thread pools), later rounds clear the pool first.
//! `cargo run --release --example ttfb STORE [ROUNDS] [SPLIT] [--fast-first-batch]`: SPLIT
//! `train` (the default, a shuffled pass) or `val`, `test`, `all` (sequential passes, as for
//! inference); `--fast-first-batch` ramps the shuffled blocks up from one batch's chunks.
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fast = std::env::args().any(|a| a == "--fast-first-batch");
    let args: Vec<String> = std::env::args()
        .filter(|a| a != "--fast-first-batch")
        .collect();
    let path = args
        .get(1)
        .ok_or("usage: ttfb STORE [ROUNDS] [SPLIT] [--fast-first-batch]")?;
    let split = args.get(3).cloned().unwrap_or_else(|| "train".into());
    let t = Instant::now();
    let ds = insitubatch::InSituDataset::builder(path)
        .fast_first_batch(fast)
        .build()?;
    println!("build {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    for round in 0..rounds {
        ds.clear_cache();
        let (rss0, faults0) = (rss_kib(), minor_faults());
        let t = Instant::now();
        let mut pass = ds.iter(&split)?;
        let b = pass.next().ok_or("empty")??;
        println!(
            "round {round}: first batch of {} in {:.1} ms; RSS +{} KiB, {} minor faults",
            b.len(),
            t.elapsed().as_secs_f64() * 1e3,
            rss_kib() as i64 - rss0 as i64,
            minor_faults() - faults0,
        );
    }
    Ok(())
}

/// Resident set size now (Linux), KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Minor page faults of the process so far (Linux).
fn minor_faults() -> u64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}

// The same allocator as the `insitubatch` command (see docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
