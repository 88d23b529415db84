//! Slot-file writes through the NVMe tier on io_uring against the thread fallback, O_DIRECT and
//! buffered, the backends taking turns within each repeat (the last part of `insitubatch
//! bench-cache`, on its own).
//! `cargo run --release --example slot_writes -- WORK_DIR [REPEAT] [SLOT_BYTES] [FILES]`:
//! WORK_DIR must be on the file system the cache would use; it is removed afterwards.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let work = args
        .get(1)
        .ok_or("usage: slot_writes WORK_DIR [REPEAT] [SLOT_BYTES] [FILES]")?;
    let arg = |i: usize, default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args
            .get(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let (repeat, slot_bytes, files) = (arg(2, 5)?, arg(3, 475_136)?, arg(4, 256)?);
    let rates = insitubatch::cachebench::write_rates(
        std::path::Path::new(work),
        repeat,
        slot_bytes,
        files,
    )?;
    let rate = |backend: &str, direct: bool| {
        rates
            .iter()
            .find(|r| r.backend == backend && r.direct == direct)
            .map_or(0.0, |r| r.mb_s)
    };
    for (direct, name) in [(true, "O_DIRECT"), (false, "buffered")] {
        let (u, t) = (rate("io_uring", direct), rate("threads", direct));
        println!(
            "{name}: io_uring {u:.0} MB/s, threads {t:.0} MB/s, {:.2}x",
            u / t
        );
    }
    let _ = std::fs::remove_dir_all(work);
    Ok(())
}

// The same allocator as the `insitubatch` command (see docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
