"""The side-by-side benchmark: every engine on the same store in one run.

    python bench-harness/run.py [--dir DIR] [--spc 1,2,4,8,16,32] [--epochs 4] [--smoke]
                                [--out results.jsonl] [--markdown table.md] [--plots DIR]

Stores are made with `insitubatch make-dataset` (ERA5-like 181x360 float32, two variables, zstd
level 3). Engines: insitubatch through the Rust API (`insitubatch bench --json`) and through the
Python shim; torch DataLoader over a per-sample zarr-python Dataset with num_workers swept 0..2x
cores (the best is "tuned workers"); naive sequential zarr-python; the in-memory ceiling (the
same batch sizes gathered from arrays preloaded in RAM); the raw read ceiling (bytes only). Each
engine runs in its own process; its whole process tree's resident memory is sampled from here.
After each store's engines, an inference pass (unless --no-inference): one sequential pass over
every sample from a fresh process — insitubatch (Rust and Python) and the tuned DataLoader — for
time to first batch as a single scoring or inference job meets it.
Page cache warm: every store is read once before timing. The all-core decode ceiling
(`insitubatch bench-read`) is measured just before the insitubatch engines and again just after
them; each engine's "× decode ceiling" is of the mean, and the table gives both. Every row
carries what it was measured on and with (`machine`: CPU, cores, memory, kernel, Python and
package versions, the insitubatch version and commit, the start time), and the table says it.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "insitubatch"
ENGINES = Path(__file__).resolve().parent / "engines.py"


def machine_info():
    """What the figures were measured on and with, saved with every row (a run's ratios are
    only comparable with another's on the same machine and software)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass

    def version(package):
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def git(*args):
        r = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "--short=12", "HEAD")
    # docs/ is where a run writes its own results; a change anywhere else is in what it measures.
    if commit and git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"):
        commit += " (with uncommitted changes)"
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "kernel": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "packages": {p: version(p) for p in ("torch", "zarr", "numpy", "xbatcher")},
        "insitubatch": subprocess.run([BIN, "--version"], capture_output=True,
                                      text=True).stdout.strip(),
        "commit": commit,
        "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def machine_line(m):
    """One markdown line saying what `machine_info` recorded."""
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    commit = f" at {m['commit']}" if m.get("commit") else ""
    return (f"_Measured from {m['started_utc']} on {m['cpu']}, {m['logical_cores']} logical "
            f"cores, {m['memory_bytes'] / 2**30:.1f} GiB, {m['kernel']}; Python {m['python']}, "
            f"{packages}; {m['insitubatch']}{commit}; page cache warm._")


def shim_env():
    """The environment that imports the Python shim from the checkout, without installing it."""
    return {"PYTHONPATH": str(ROOT / "bindings" / "python"),
            "INSITUBATCH_LIB": str(ROOT / "target" / "release" / "libinsitubatch.so")}


def run_tree(cmd, env=None):
    """Runs `cmd`, sampling the RSS of its process tree; returns (stdout, peak bytes, processes)."""
    env = {**os.environ, **(env or {}), "HARNESS_T0": repr(time.time())}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    peak, procs = 0, 1
    stop = threading.Event()

    def sample():
        nonlocal peak, procs
        try:
            root = psutil.Process(p.pid)
        except psutil.Error:
            return
        while not stop.is_set():
            try:
                tree = [root] + root.children(recursive=True)
                rss = sum(q.memory_info().rss for q in tree)
                peak, procs = max(peak, rss), max(procs, len(tree))
            except psutil.Error:
                pass
            stop.wait(0.02)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = p.communicate()
    stop.set()
    t.join()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{err[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # Every process of the tree has been reaped by now, so this is the whole tree's CPU time.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return out, peak, procs, cpu


# Store variants beside the family: (name, samples per chunk, extra make-dataset arguments).
VARIANTS = {
    "fat-spatial": (16, ["--inner-chunks", "91x180"]),
    "v2-blosc": (8, ["--format", "2", "--codec", "blosc"]),
    "sharded": (2, ["--shard-samples", "16"]),
}


def synthetic_layout(store):
    """The `insitubatch_synthetic.layout` a store's group attributes record (what version of
    `make-dataset` wrote it), or None for a store without one."""
    for doc in (store / "zarr.json", store / ".zattrs"):
        if doc.exists():
            attrs = json.loads(doc.read_text())
            attrs = attrs.get("attributes", {}) if doc.name == "zarr.json" else attrs
            return attrs.get("insitubatch_synthetic", {}).get("layout")
    return None


_CURRENT_LAYOUT = []


def current_layout():
    """The layout this build of `make-dataset` writes, from a one-sample store made once per run."""
    if not _CURRENT_LAYOUT:
        with tempfile.TemporaryDirectory() as tmp:
            probe = Path(tmp) / "probe.zarr"
            subprocess.run([BIN, "make-dataset", probe, "--samples", "1", "--grid", "1x1"],
                           check=True, capture_output=True)
            _CURRENT_LAYOUT.append(synthetic_layout(probe))
    return _CURRENT_LAYOUT[0]


def make_store(directory, spc, samples, grid, variant=None):
    """The store of this shape in `directory`, made by `make-dataset` unless one made by this
    version is already there (a store an older version made is made again: its values or
    attributes may differ)."""
    extra = []
    tag = ""
    if variant:
        spc, extra = VARIANTS[variant]
        tag = f"_{variant}"
    store = Path(directory) / f"era5_spc{spc}_{samples}_{grid}{tag}.zarr"
    if synthetic_layout(store) != current_layout() or current_layout() is None:
        subprocess.run([BIN, "make-dataset", store, "--samples", str(samples), "--grid", grid,
                        "--sample-chunk", str(spc), "--force", *extra], check=True, capture_output=True)
    for f in store.rglob("*"):  # warm the page cache
        if f.is_file():
            f.read_bytes()
    return store


def best_epoch(epochs):
    """The steady-state epoch: the best of those after the first when there are several."""
    pool = epochs[1:] if len(epochs) > 1 else epochs
    return max(pool, key=lambda e: e["samples_per_s"])


try:  # xbatcher is measured when it installs (it needs xarray and dask)
    import xbatcher  # noqa: F401

    HAVE_XBATCHER = True
except ImportError:
    HAVE_XBATCHER = False


def measure(store, epochs, workers, batch_size, train_step=False, settle=0.0, accelerator_ms=0.0):
    """Every engine on `store`, each in its own process. Before each process starts, `settle`
    seconds pass, so that each starts with the machine's memory in the same state: on a VM that
    hands freed memory back to its host, an engine started right after another process exits
    would otherwise reuse that process's memory cheaply, or find it being taken away."""
    rows = []
    # The decode ceiling moves by 15-30 % over the minutes a store's engines take on a shared VM,
    # so it is measured on both sides of the insitubatch engines (the ones compared with it),
    # and their fractions are of the mean.
    ceilings = [decode_ceiling(store, settle)]

    # The Rust API with the defaults, and with each epoch's blocks ramping up from one batch's
    # chunks (its first batch); with a model step, also with each next epoch started while the
    # last one ends (a loop that takes no time per batch gains nothing from it).
    rust = [("insitubatch (Rust API)", []),
            ("insitubatch (Rust API, fast_first_batch)", ["--fast-first-batch"])]
    if train_step:
        rust.append(("insitubatch (Rust API, prefetch_next_epoch)", ["--prefetch-next-epoch"]))
    for name, extra in rust:
        time.sleep(settle)
        step = ["--accelerator-ms", str(accelerator_ms)] if train_step and accelerator_ms else []
        out, peak, procs, cpu = run_tree([BIN, "bench", store, "--epochs", str(epochs),
                                          "--batch-size", str(batch_size), *extra, *step, "--json"])
        rows.append({"engine": name, "epochs": rust_epochs(out),
                     "peak_rss_bytes": peak, "processes": procs, "cpu_s": cpu})

    py = [sys.executable, str(ENGINES)]
    common = ["--epochs", str(epochs), "--batch-size", str(batch_size)]
    if train_step:
        common.append("--train-step")
        if accelerator_ms:
            common += ["--accelerator-ms", str(accelerator_ms)]

    def run_python_engine(engine, extra=(), env=None):
        time.sleep(settle)
        out, peak, procs, cpu = run_tree(py + [engine, str(store)] + common + list(extra), env)
        r = json.loads(out)
        r["cpu_s"] = cpu
        name = {"insitubatch-python": "insitubatch (Python shim)",
                "zarr-sequential": "zarr-python, sequential",
                "in-memory": "in-memory ceiling",
                "raw-read": "raw read ceiling",
                "xbatcher": "xbatcher BatchGenerator + DataLoader, 0 workers"}.get(engine, engine)
        if engine == "torch-dataloader":
            name = f"torch DataLoader, {r['workers']} workers ({r['start_method']})"
        if "--prefetch-next-epoch" in extra:
            name = name.removesuffix(")") + ", prefetch_next_epoch)"
        r.update(engine=name, peak_rss_bytes=peak, processes=procs)
        rows.append(r)

    run_python_engine("insitubatch-python", env=shim_env())
    if train_step:
        run_python_engine("insitubatch-python", ["--prefetch-next-epoch"], env=shim_env())
    ceilings.append(decode_ceiling(store, settle))  # the insitubatch engines are done
    for w in workers:
        run_python_engine("torch-dataloader", ["--workers", str(w)])
    for engine in (["xbatcher"] if HAVE_XBATCHER else []) + ["zarr-sequential", "in-memory",
                                                              "raw-read"]:
        run_python_engine(engine)
    dl = [r for r in rows if r["engine"].startswith("torch DataLoader")]
    tuned = max(dl, key=lambda r: best_epoch(r["epochs"])["samples_per_s"])
    tuned["tuned"] = True
    decode_mb_s = sum(ceilings) / len(ceilings)
    for r in rows:
        b = best_epoch(r["epochs"])
        r["store"] = str(store)
        r["best"] = b
        r["vs_tuned_dataloader"] = b["samples_per_s"] / best_epoch(tuned["epochs"])["samples_per_s"]
        r["vs_decode_ceiling"] = b["mb_per_s"] / decode_mb_s
        r["decode_ceiling_mb_s"] = decode_mb_s
        r["decode_ceiling_runs_mb_s"] = ceilings
    return rows


def decode_ceiling(store, settle):
    """MB/s of `bench-read`'s all-core decode ceiling on `store`: every stored chunk read with
    std::fs::read and decoded by zarrs on every core, no loader (best of three)."""
    time.sleep(settle)
    out = subprocess.run([BIN, "bench-read", store, "--repeat", "3", "--inflight", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return next(json.loads(l) for l in out.splitlines()
                if "std::fs::read + zarrs" in l)["decoded_mb_s"]


def rust_epochs(out):
    """The epochs of `insitubatch bench --json`, in the harness's row format."""
    rust = json.loads(out)
    return [{
        "epoch": e["stats"]["epoch"], "samples": e["stats"]["samples"], "seconds": e["seconds"],
        "samples_per_s": e["samples_per_s"], "mb_per_s": e["mb_per_s"],
        "ttfb_ms": e["stats"]["ttfb_us"] / 1e3,
        "ttfb_from_process_start_ms": e["ttfb_from_process_start_ms"] if i == 0 else None,
        "latency_ms_p50": e["stats"]["batch_latency_us_p50"] / 1e3,
        "latency_ms_p90": e["stats"]["batch_latency_us_p90"] / 1e3,
        "latency_ms_p99": e["stats"]["batch_latency_us_p99"] / 1e3,
        "latency_ms_max": e["stats"]["batch_latency_us_max"] / 1e3,
        "started_ahead": e["stats"]["started_ahead"],
        **{k: e[k] for k in ("step_s", "data_stall_fraction") if k in e},
    } for i, e in enumerate(rust["epochs"])]


def measure_inference(store, rows, batch_size, settle=0.0):
    """One sequential pass over every sample from a fresh process, as an inference or scoring
    job makes it (the spec's case for time to first batch): insitubatch through the Rust API and
    the Python shim, and the DataLoader with the worker count tuned in `rows` (its workers start
    inside the measured time, as they would for a single pass)."""
    tuned = next(r for r in rows if r.get("tuned"))
    out = []
    time.sleep(settle)
    text, peak, procs, cpu = run_tree([BIN, "bench", store, "--epochs", "1", "--no-shuffle",
                                       "--split", "all", "--batch-size", str(batch_size), "--json"])
    out.append({"engine": "insitubatch (Rust API)", "epochs": rust_epochs(text)})
    py = [sys.executable, str(ENGINES)]
    common = ["--epochs", "1", "--batch-size", str(batch_size), "--sequential"]
    for engine, extra, env, name in [
        ("insitubatch-python", [], shim_env(), "insitubatch (Python shim)"),
        ("torch-dataloader", ["--workers", str(tuned["workers"])], None,
         f"torch DataLoader, {tuned['workers']} workers ({tuned['start_method']})"),
    ]:
        time.sleep(settle)
        text, peak, procs, cpu = run_tree(py + [engine, str(store)] + common + extra, env)
        out.append({"engine": name, "epochs": json.loads(text)["epochs"]})
    for r in out:
        r.update(store=str(store), mode="inference")
        r["epochs"][0].pop("intervals_ms", None)
    return out


def inference_markdown(rows):
    lines = ["\n**Inference pass** — one sequential pass over every sample from a fresh process\n",
             "| store | engine | TTFB from process start ms | TTFB from iterator ms | pass s | samples/s |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        e = r["epochs"][0]
        lines.append(f"| {Path(r['store']).name} | {r['engine']} | "
                     f"{e['ttfb_from_process_start_ms']:.0f} | {e['ttfb_ms']:.1f} | "
                     f"{e['seconds']:.2f} | {e['samples_per_s']:.0f} |")
    return "\n".join(lines) + "\n"


def markdown(rows):
    lines = []
    for m in dict.fromkeys(json.dumps(r["machine"], sort_keys=True) for r in rows if "machine" in r):
        lines.append("\n" + machine_line(json.loads(m)))
    for ms in dict.fromkeys(r["accelerator_ms"] for r in rows if "accelerator_ms" in r):
        lines.append(f"\n_Model step per batch: in the Python engines a small torch step, then "
                     f"{ms:g} ms of waiting, as for an accelerator's step with the cores left to "
                     f"the loader; in the Rust API rows (no torch) the {ms:g} ms wait alone. "
                     f"\"Data stall\" is the share of the epoch's wall time spent outside the "
                     f"step._")
    for store in dict.fromkeys(r["store"] for r in rows):
        rs = [r for r in rows if r["store"] == store]
        runs = rs[0].get("decode_ceiling_runs_mb_s", [])
        spread = ""
        if len(runs) == 2:
            spread = f" (mean of {runs[0]:.0f} before and {runs[1]:.0f} after the insitubatch engines)"
        lines.append(f"\n**{Path(store).name}** — decode ceiling "
                     f"{rs[0]['decode_ceiling_mb_s']:.0f} MB/s{spread}\n")
        lines.append("| engine | epoch 0 samples/s | × decode ceiling (epoch 0) | steady samples/s | × decode ceiling (steady) | × tuned DataLoader (steady) | TTFB ms | TTFB from process start ms | p50 ms | p99 ms | peak RSS MiB | processes | CPU s |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rs:
            b = r["best"]
            e0 = r["epochs"][0]
            mark = " (tuned)" if r.get("tuned") else ""
            if "data_stall_fraction" in b:
                mark += f", data stall {100 * b['data_stall_fraction']:.0f} %"
            # With a model step, the wait at the start of every later epoch (which an epoch
            # started while the last one ended does not have).
            later = r["epochs"][1:]
            if "data_stall_fraction" in b and later:
                firsts = sorted(e["ttfb_ms"] for e in later)
                mark += f", later epochs' first batch {firsts[len(firsts) // 2]:.1f} ms"
                ahead = sum(bool(e.get("started_ahead")) for e in later)
                if ahead:
                    mark += f" ({ahead} of {len(later)} started early)"
            cpu = f"{r['cpu_s']:.1f}" if "cpu_s" in r else "–"
            lines.append(
                f"| {r['engine']}{mark} | {e0['samples_per_s']:.0f} | "
                f"{e0['mb_per_s'] / r['decode_ceiling_mb_s']:.2f} | {b['samples_per_s']:.0f} | "
                f"{b['mb_per_s'] / r['decode_ceiling_mb_s']:.2f} | "
                f"{r['vs_tuned_dataloader']:.2f} | {e0['ttfb_ms']:.1f} | "
                f"{e0['ttfb_from_process_start_ms'] or float('nan'):.0f} | "
                f"{b.get('latency_ms_p50', float('nan')):.2f} | {b.get('latency_ms_p99', float('nan')):.2f} | "
                f"{r['peak_rss_bytes'] / 2**20:.0f} | {r['processes']} | {cpu} |"
            )
    return "\n".join(lines) + "\n"


def plots(rows, directory):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    engines = dict.fromkeys(r["engine"] for r in rows if not r["engine"].startswith("torch"))
    for e in engines:
        pts = sorted((r["samples_per_chunk"] if "samples_per_chunk" in r else int(Path(r["store"]).name.split("spc")[1].split("_")[0]),
                      r["best"]["samples_per_s"]) for r in rows if r["engine"] == e)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=e)
    tuned = sorted((int(Path(r["store"]).name.split("spc")[1].split("_")[0]), r["best"]["samples_per_s"])
                   for r in rows if r.get("tuned"))
    ax.plot([p[0] for p in tuned], [p[1] for p in tuned], marker="s", label="torch DataLoader (tuned)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("samples per chunk")
    ax.set_ylabel("samples/s (steady epoch)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(directory / "throughput.png", dpi=120)
    written = [directory / "throughput.png"]
    # Latency CDFs of the steady epoch, one figure per store; the Rust engine reports
    # hdrhistogram percentiles (p50, p90, p99, max), drawn as points on the same axes.
    for store in dict.fromkeys(r["store"] for r in rows):
        rs = [r for r in rows if r["store"] == store
              and (not r["engine"].startswith("torch") or r.get("tuned"))]
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in rs:
            b = r["best"]
            if b.get("intervals_ms"):
                xs = sorted(b["intervals_ms"])
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=r["engine"] + (" (tuned)" if r.get("tuned") else ""))
            elif "latency_ms_p90" in b:
                ax.plot([b["latency_ms_p50"], b["latency_ms_p90"], b["latency_ms_p99"], b["latency_ms_max"]],
                        [0.5, 0.9, 0.99, 1.0], marker="o", label=r["engine"] + " (percentiles)")
        ax.set_xscale("log")
        ax.set_xlabel("time between batches, ms (steady epoch)")
        ax.set_ylabel("fraction of batches")
        ax.set_title(Path(store).name, fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        out = directory / f"latency_cdf_{Path(store).stem}.png"
        fig.savefig(out, dpi=110)
        plt.close(fig)
        written.append(out)
    return written


def splice_into_docs(path: Path, region: str, table: str, rows_from: str | None = None) -> None:
    """Replaces the generated part of `path` between `<!-- harness:REGION:begin -->` and
    `<!-- harness:REGION:end -->` with `table` (and the date, or for a table redrawn from saved
    rows the file they came from), leaving the rest untouched."""
    begin, end = f"<!-- harness:{region}:begin -->", f"<!-- harness:{region}:end -->"
    text = path.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{path} needs exactly one {begin} ... {end} region to regenerate")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    made = (f"Redrawn by `bench-harness/run.py --from {rows_from}` on {stamp} from an earlier "
            f"run's rows" if rows_from else f"Generated by `bench-harness/run.py` on {stamp}")
    body = f"\n_{made}; do not edit by hand._\n\n{table.strip()}\n"
    path.write_text(head + begin + body + end + tail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp") + "/insitubatch-harness")
    ap.add_argument("--spc", default="1,2,4,8,16,32")
    ap.add_argument("--samples", type=int, default=512)
    ap.add_argument("--grid", default="181x360")
    # Four: an engine's steady figure is the best of three later epochs (one epoch of a fast
    # engine is ~0.2 s, too short to stand alone on a shared machine); the same for every engine.
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", default=None, help="DataLoader worker counts (default 0..2x cores)")
    ap.add_argument("--smoke", action="store_true", help="tiny store, every engine once")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--plots", default=None)
    ap.add_argument("--docs", default=None,
                    help="regenerate the harness table region of this markdown file "
                         "(docs/benchmarks.md)")
    ap.add_argument("--docs-region", default=None,
                    help="the region to replace (default: family, or variants with --variants)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated store variants instead of the family: " + ", ".join(VARIANTS))
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of idle before each engine's process starts (the same start "
                         "state for every engine; 0 with --smoke)")
    ap.add_argument("--train-step", action="store_true",
                    help="run a small torch model step per batch and report the data-stall fraction")
    ap.add_argument("--accelerator-ms", type=float, default=0.0,
                    help="with --train-step, each step also waits this long, as a host waits for "
                         "a GPU's step with the cores left to the loader (the Rust API rows: the "
                         "wait alone)")
    ap.add_argument("--from", dest="from_rows", default=None, metavar="JSONL",
                    help="measure nothing: render the table, the plots and the docs region from "
                         "the rows of an earlier run (its --out file)")
    ap.add_argument("--no-inference", action="store_true",
                    help="skip the inference pass (one sequential pass from a fresh process, "
                         "for time to first batch) that follows each store's engines")
    a = ap.parse_args()
    if a.accelerator_ms and not a.train_step:
        ap.error("--accelerator-ms needs --train-step")
    if a.smoke:
        a.spc, a.samples, a.grid, a.epochs, a.workers, a.settle = "8", 64, "16x32", 1, "0,1", 0.0
    cores = os.cpu_count() or 1
    workers = [int(w) for w in a.workers.split(",")] if a.workers else sorted({0, 1, cores, 2 * cores})
    rows, inference = [], []
    machine = None if a.from_rows else machine_info()
    if a.from_rows:
        jobs = []
        for line in Path(a.from_rows).read_text().splitlines():
            r = json.loads(line)
            (inference if r.get("mode") == "inference" else rows).append(r)
    elif a.variants:
        jobs = [(VARIANTS[v][0], v) for v in a.variants.split(",")]
    else:
        jobs = [(int(s), None) for s in a.spc.split(",")]
    for spc, variant in jobs:
        store = make_store(a.dir, spc, a.samples, a.grid, variant)
        measured = measure(store, a.epochs, workers, a.batch_size, a.train_step, a.settle,
                           a.accelerator_ms)
        passes = [] if a.no_inference else measure_inference(store, measured, a.batch_size,
                                                             a.settle)
        for r in measured + passes:
            r["samples_per_chunk"] = spc
            r["variant"] = variant or "family"
            r["machine"] = machine
            if a.train_step:
                r["accelerator_ms"] = a.accelerator_ms
            (inference if r.get("mode") == "inference" else rows).append(r)
            line = json.dumps(r)
            print(line, flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(line + "\n")
    table = markdown(rows) + (inference_markdown(inference) if inference else "")
    print(table)
    if a.markdown:
        Path(a.markdown).write_text(table)
    if a.docs:
        region = a.docs_region or ("variants" if a.variants else "family")
        splice_into_docs(Path(a.docs), region, table, a.from_rows)
        print(f"updated the {region} table in {a.docs}")
    if a.plots:
        for p in plots(rows, a.plots):
            print(f"wrote {p}")


if __name__ == "__main__":
    main()
