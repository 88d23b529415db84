//! Time to first batch on a cold pool: the first round also pays process warm-up (allocator,
//! thread pools), later rounds clear the pool first. `cargo run --release --example ttfb STORE`.
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: ttfb STORE")?;
    let t = Instant::now();
    let ds = insitubatch::InSituDataset::builder(&path).build()?;
    println!("build {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    let rounds: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    for round in 0..rounds {
        ds.clear_cache();
        let t = Instant::now();
        let mut pass = ds.train()?;
        let b = pass.next().ok_or("empty")??;
        println!(
            "round {round}: first batch of {} in {:.1} ms",
            b.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

// The same allocator as the `insitubatch` command (see docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
