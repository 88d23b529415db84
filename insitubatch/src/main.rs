//! The `insitubatch` command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use insitubatch::inspect::{human_bytes, inspect};
use insitubatch::readbench::bench_read;
use insitubatch::runtime::{Runtime, RuntimeBuilder};
use insitubatch::store::{LocalStore, Store, open_geometries, open_hierarchy};
use insitubatch::synth::{Codec, SynthSpec, make_dataset};

#[derive(Parser)]
#[command(
    name = "insitubatch",
    version,
    about = "Read-once, sample-once batches from Zarr arrays read in place"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a small ERA5-like store (in a temporary directory unless --dir), inspect it, and
    /// read + decode every stored chunk once.
    Demo {
        /// Where to build the store (kept); default: a temporary directory (removed).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Samples along time.
        #[arg(long, default_value_t = 512)]
        samples: u64,
    },
    /// Describe a store: per variable shape, chunks, dtype, codecs, bytes, regime; IO backend.
    Inspect {
        /// Store directory (a Zarr group or array).
        path: PathBuf,
        /// The sample axis (physical axis index).
        #[arg(long, default_value_t = 0)]
        sample_axis: usize,
        /// Only these arrays (comma-separated); bypasses the coordinate rule.
        #[arg(long, value_delimiter = ',')]
        variables: Option<Vec<String>>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a synthetic ERA5-like store: smooth float32 (time, latitude, longitude) fields.
    MakeDataset {
        /// Output directory.
        dir: PathBuf,
        /// Samples along time.
        #[arg(long, default_value_t = 256)]
        samples: u64,
        /// Grid as LATxLON.
        #[arg(long, default_value = "181x360", value_parser = parse_pair)]
        grid: (u64, u64),
        /// Samples per chunk along time.
        #[arg(long, default_value_t = 8)]
        sample_chunk: u64,
        /// Spatial (inner) chunks as LATxLON; default: the whole grid.
        #[arg(long, value_parser = parse_pair)]
        inner_chunks: Option<(u64, u64)>,
        /// Zarr format, 2 or 3.
        #[arg(long, default_value_t = 3)]
        format: u8,
        /// zstd, blosc (lz4 + shuffle) or none.
        #[arg(long, default_value = "zstd")]
        codec: String,
        /// Compression level.
        #[arg(long, default_value_t = 3)]
        level: i32,
        /// Shard along time with this many samples per shard (v3); chunks become inner chunks.
        #[arg(long)]
        shard_samples: Option<u64>,
        /// Data variables (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "t2m,u10")]
        variables: Vec<String>,
        /// Replace an existing store at DIR.
        #[arg(long)]
        force: bool,
    },
    /// Benchmark the read layer: read + decode every stored chunk on each IO backend, against
    /// std::fs::read + zarrs decode on plain threads and the raw read ceiling.
    BenchRead {
        /// Store directory.
        path: PathBuf,
        /// Repeats per path (best kept).
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// Executor / plain threads (default: one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// Concurrent chunk reads per executor.
        #[arg(long, default_value_t = 16)]
        inflight: usize,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
}

fn parse_pair(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("`{s}` is not of the form AxB (e.g. 181x360)"))?;
    let p = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| format!("`{v}` in `{s}` is not a whole number"))
    };
    Ok((p(a)?, p(b)?))
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

fn runtime() -> Result<Runtime, Box<dyn std::error::Error>> {
    Ok(RuntimeBuilder::new().build()?)
}

fn progress_bar(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {per_sec} eta {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn codec_from(name: &str, level: i32) -> Result<Codec, String> {
    match name {
        "zstd" => Ok(Codec::Zstd(level)),
        "blosc" => Ok(Codec::BloscLz4(level.clamp(0, 9) as u8)),
        "none" => Ok(Codec::None),
        other => Err(format!("--codec {other:?} is not one of zstd, blosc, none")),
    }
}

fn build_store(dir: &Path, spec: &SynthSpec, force: bool) -> CliResult {
    let pb = progress_bar(0, "writing");
    let pb2 = pb.clone();
    make_dataset(dir, spec, force, &move |done, total| {
        if pb2.length() != Some(total) {
            pb2.set_length(total);
        }
        pb2.set_position(done);
    })?;
    pb.finish_and_clear();
    Ok(())
}

fn read_everything(rt: &Runtime, path: &Path) -> CliResult {
    let store = LocalStore::new(path)?;
    let st = store.clone();
    let h = rt.block_on(move || async move { open_hierarchy(&st).await })??;
    let geoms = open_geometries(&h, None, 0)?;
    let mut work = Vec::new();
    for name in geoms.keys() {
        let a = std::sync::Arc::new(h.arrays[name].clone());
        for idx in a.chunk_indices() {
            work.push((std::sync::Arc::clone(&a), idx));
        }
    }
    let work = std::sync::Arc::new(work);
    let pb = progress_bar(work.len() as u64, "decoding");
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for e in 0..rt.executor_threads() {
        for _ in 0..8 {
            let (store, work, next, pb) = (store.clone(), work.clone(), next.clone(), pb.clone());
            handles.push(rt.spawn_on(e, "demo-read", move || async move {
                let (mut read, mut decoded) = (0u64, 0u64);
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((a, idx)) = work.get(k) else { break };
                    let key = a.chunk_key(idx)?;
                    let enc = store.get(&key).await?;
                    read += enc.as_ref().map_or(0, |b| b.len() as u64);
                    decoded += a.decode_chunk(idx, enc, || store.locate(&key))?.bytes.len() as u64;
                    pb.inc(1);
                }
                Ok::<_, insitubatch::StoreError>((read, decoded))
            }));
        }
    }
    let (mut read, mut decoded) = (0, 0);
    for h in handles {
        let (r, d) = h.join()??;
        read += r;
        decoded += d;
    }
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "read + decoded {} stored chunks: {} read, {} decoded in {:.3} s = {:.0} MB/s decoded ({} backend)",
        work.len(),
        human_bytes(read),
        human_bytes(decoded),
        secs,
        decoded as f64 / secs / 1e6,
        rt.io_backend()
    );
    Ok(())
}

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Demo { dir, samples } => {
            let tmp;
            let path = match dir {
                Some(d) => d,
                None => {
                    tmp = tempfile::Builder::new()
                        .prefix("insitubatch-demo")
                        .tempdir()?;
                    tmp.path().join("era5.zarr")
                }
            };
            let spec = SynthSpec {
                samples,
                ..SynthSpec::default()
            };
            println!(
                "building a synthetic ERA5-like store at {} ({} decoded)",
                path.display(),
                human_bytes(spec.decoded_bytes())
            );
            let t = Instant::now();
            build_store(&path, &spec, true)?;
            println!("built in {:.2} s\n", t.elapsed().as_secs_f64());
            let rt = runtime()?;
            print!("{}", inspect(&rt.handle(), &path, None, 0)?.render());
            println!();
            read_everything(&rt, &path)?;
            Ok(())
        }
        Command::Inspect {
            path,
            sample_axis,
            variables,
            json,
        } => {
            let rt = runtime()?;
            let report = inspect(&rt.handle(), &path, variables, sample_axis)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.render());
            }
            Ok(())
        }
        Command::MakeDataset {
            dir,
            samples,
            grid,
            sample_chunk,
            inner_chunks,
            format,
            codec,
            level,
            shard_samples,
            variables,
            force,
        } => {
            let spec = SynthSpec {
                samples,
                grid,
                sample_chunk,
                inner_chunks,
                zarr_format: format,
                codec: codec_from(&codec, level)?,
                shard_samples,
                variables,
            };
            let t = Instant::now();
            build_store(&dir, &spec, force)?;
            println!(
                "wrote {} ({} decoded, stored chunk {:?}) in {:.2} s",
                dir.display(),
                human_bytes(spec.decoded_bytes()),
                spec.stored_chunk(),
                t.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Command::BenchRead {
            path,
            repeat,
            threads,
            inflight,
            json,
        } => {
            let threads = threads
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            if threads == 0 || inflight == 0 {
                return Err("--threads and --inflight must be at least 1".into());
            }
            let results = bench_read(&path, repeat, threads, inflight)?;
            let baseline = results
                .iter()
                .find(|r| r.engine.starts_with("std::fs"))
                .map_or(1.0, |r| r.decoded_mb_s);
            if json {
                for r in &results {
                    println!("{}", serde_json::to_string(r)?);
                }
            } else {
                println!(
                    "{} stored chunks, {} read, {} decoded; {threads} threads; best of {repeat}; warm page cache",
                    results[0].chunks,
                    human_bytes(results[0].bytes_read),
                    human_bytes(results[0].bytes_decoded)
                );
                println!(
                    "{:<60} {:>9} {:>12} {:>10} {:>9}",
                    "path", "seconds", "decoded MB/s", "read MB/s", "vs plain"
                );
                for r in &results {
                    println!(
                        "{:<60} {:>9.3} {:>12.0} {:>10.0} {:>8.1}%",
                        r.engine,
                        r.seconds,
                        r.decoded_mb_s,
                        r.read_mb_s,
                        100.0 * r.decoded_mb_s / baseline
                    );
                }
            }
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("insitubatch: error: {e}");
            ExitCode::FAILURE
        }
    }
}
