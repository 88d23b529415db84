//! Resident epochs with a consumer that reads every byte of each batch before asking for the
//! next (as a CPU training step or a host-to-device copy would), against one that drops batches
//! unread: what the gather's copies cost a consumer that touches its data.
//! `cargo run --release --example consumer STORE [EPOCHS]`.
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: consumer STORE [EPOCHS]")?;
    let epochs: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let probe = insitubatch::InSituDataset::builder(&path).build()?;
    let split_bytes = probe.split_bytes("train")?;
    drop(probe);
    let ds = insitubatch::InSituDataset::builder(&path)
        .cache_budget_bytes(split_bytes)
        .build()?;
    for b in ds.train()? {
        b?; // fills the pool
    }
    for read in [false, true] {
        let mut secs = Vec::new();
        let mut consumer = 0.0f64;
        let mut checksum = 0u64;
        for epoch in 1..=epochs {
            ds.set_epoch(epoch);
            let t = Instant::now();
            for b in ds.train()? {
                let b = b?;
                if read {
                    let c = Instant::now();
                    for (_, a) in b.arrays() {
                        // A reduction that runs at memory speed (it vectorises), so the
                        // consumer's time is its reads, not its arithmetic.
                        checksum ^= a.bytes().chunks_exact(8).fold(0u64, |acc, w| {
                            acc.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")))
                        });
                    }
                    consumer += c.elapsed().as_secs_f64();
                }
            }
            secs.push(t.elapsed().as_secs_f64());
        }
        secs.sort_by(f64::total_cmp);
        let median = secs[secs.len() / 2];
        let bytes = ds.split_bytes("train")? as f64;
        println!(
            "{}: median epoch {:.1} ms ({:.0} MB/s of the split), consumer {:.1} ms per epoch{}",
            if read {
                "consumer reads every byte"
            } else {
                "consumer drops batches"
            },
            median * 1e3,
            bytes / median / 1e6,
            consumer * 1e3 / epochs as f64,
            if read {
                format!(" (checksum {checksum:#x})")
            } else {
                String::new()
            },
        );
    }
    Ok(())
}

// The same allocator as the `insitubatch` command (see docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
