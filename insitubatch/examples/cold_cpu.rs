//! Where a cold-pool epoch's time goes against the all-core decode ceiling: for each round, the
//! ceiling (every stored chunk decoded by zarrs on every core, no loader) and then a cold-pool
//! epoch (`clear_cache` first), each with its wall time, the CPU time the process used during
//! it (user + system, all threads), the cores that makes busy on average and the minor page
//! faults it took (the ceiling's call begins with a read-only pass over the chunks, which its
//! CPU time includes). The same order as `insitubatch bench --ceilings`.
//! `cargo run --release --example cold_cpu -- STORE [ROUNDS]`; `INSITUBATCH_DECODE_INTO_BATCHES`
//! picks where chunks are decoded, as for every dataset.
use std::time::Instant;

/// CPU seconds (user + system) and minor faults of the whole process so far.
fn usage() -> (f64, i64) {
    // SAFETY: `rusage` is plain data; getrusage writes it whole for RUSAGE_SELF.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut r);
        r
    };
    let secs = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    (secs(r.ru_utime) + secs(r.ru_stime), r.ru_minflt)
}

/// Wall seconds, CPU seconds and minor faults of `f`, and its value.
fn measured<T>(f: impl FnOnce() -> T) -> (f64, f64, i64, T) {
    let (cpu0, faults0) = usage();
    let t = Instant::now();
    let out = f();
    let wall = t.elapsed().as_secs_f64();
    let (cpu1, faults1) = usage();
    (wall, cpu1 - cpu0, faults1 - faults0, out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: cold_cpu STORE [ROUNDS]")?;
    let rounds: usize = match args.get(2) {
        Some(s) => s
            .parse()
            .map_err(|_| format!("ROUNDS must be a whole number, not `{s}`"))?,
        None => 5,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ds = insitubatch::InSituDataset::builder(path).build()?;
    // Warm-up: process, allocator, page cache.
    insitubatch::enginebench::run_epoch(&ds, "train", 0, &|_, _| {})?;
    for r in 0..rounds {
        let (wall, cpu, faults, ceiling) =
            measured(|| insitubatch::readbench::decode_ceiling(ds.root(), threads, 1));
        let ceiling = ceiling?;
        println!(
            "round {r}: ceiling {:.0} MB/s, its pass {:.0} ms (the call, with a read-only pass \
             first: {:.0} ms, {:.0} ms of CPU, {:.2} cores, {faults} faults)",
            ceiling.decoded_mb_s,
            ceiling.seconds * 1e3,
            wall * 1e3,
            cpu * 1e3,
            cpu / wall
        );
        ds.clear_cache();
        let (wall, cpu, faults, epoch) = measured(|| {
            insitubatch::enginebench::run_epoch(&ds, "train", 1 + r as u64, &|_, _| {})
        });
        let epoch = epoch?;
        let mb_s = epoch.stats.bytes_decoded as f64 / wall / 1e6;
        println!(
            "round {r}: cold epoch {mb_s:.0} MB/s = {:.1} % of the ceiling, {:.0} ms, {:.0} ms of \
             CPU ({:.2} cores), {faults} faults, {} chunks decoded into batch rows",
            100.0 * mb_s / ceiling.decoded_mb_s,
            wall * 1e3,
            cpu * 1e3,
            cpu / wall,
            epoch.stats.tiles_into_batches,
        );
    }
    Ok(())
}

// The same allocator as the `insitubatch` command (see docs/benchmarks.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
