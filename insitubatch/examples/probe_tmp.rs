use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let ds = insitubatch::InSituDataset::builder(&args[1]).build()?;
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4);
    for round in 0..rounds {
        if std::env::var("NOCLEAR").is_err() {
            ds.clear_cache();
        }
        ds.set_epoch(round as u64);
        let f0 = minflt();
        let t = Instant::now();
        let mut ts = Vec::new();
        let mut pass = ds.iter("train")?;
        for b in pass.by_ref() {
            let _b = b?;
            ts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let end = t.elapsed().as_secs_f64() * 1e3;
        let d: Vec<String> = ts
            .windows(2)
            .map(|w| format!("{:.1}", w[1] - w[0]))
            .collect();
        println!(
            "round {round}: first {:.1} gaps [{}] end {:.1} faults {}",
            ts[0],
            d.join(" "),
            end,
            minflt() - f0
        );
    }
    Ok(())
}

fn minflt() -> u64 {
    // SAFETY: plain integers.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: writes into our struct.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_minflt as u64
}
