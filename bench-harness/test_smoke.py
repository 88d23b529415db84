"""CI smoke run of the harness: a tiny store, every engine once, a table and a plot."""

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_every_engine_runs_once_and_reports(tmp_path):
    out = tmp_path / "results.jsonl"
    docs = tmp_path / "benchmarks.md"
    docs.write_text("intro\n<!-- harness:family:begin -->\nold table\n<!-- harness:family:end -->\noutro\n")
    subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--smoke", "--dir", str(tmp_path / "stores"),
         "--out", str(out), "--markdown", str(tmp_path / "table.md"), "--plots", str(tmp_path),
         "--train-step", "--accelerator-ms", "5", "--docs", str(docs)],
        check=True, capture_output=True, text=True,
    )
    # The docs region was regenerated from this run's table; the text around it is kept.
    text = docs.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old table" not in text
    assert (tmp_path / "table.md").read_text().strip() in text
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    rows = [r for r in lines if r.get("mode") != "inference"]
    # The inference pass: one sequential pass from a fresh process per loader, every sample once.
    inference = [r for r in lines if r.get("mode") == "inference"]
    assert [r["engine"] for r in inference][:2] == ["insitubatch (Rust API)",
                                                    "insitubatch (Python shim)"]
    assert "DataLoader" in inference[2]["engine"] and len(inference) == 3
    for r in inference:
        (e,) = r["epochs"]
        assert e["samples"] == 64 and 0 < e["ttfb_ms"] <= e["ttfb_from_process_start_ms"], r
    assert "**Inference pass**" in text
    engines = {r["engine"] for r in rows}
    for needle in ["Rust API", "Python shim", "DataLoader, 0 workers", "DataLoader, 1 workers",
                   "xbatcher", "sequential", "in-memory", "raw read"]:
        assert any(needle in e for e in engines), (needle, engines)
    for r in rows:
        assert r["best"]["samples_per_s"] > 0 and r["peak_rss_bytes"] > 0
        assert r["best"]["samples"] == 64, r["engine"]
    assert sum(1 for r in rows if r.get("tuned")) == 1
    # The decode ceiling, measured before and after the insitubatch engines: each row's fraction
    # is of the mean of the two, and the table says both.
    for r in rows:
        before, after = r["decode_ceiling_runs_mb_s"]
        assert before > 0 and after > 0
        assert r["decode_ceiling_mb_s"] == (before + after) / 2
        assert abs(r["vs_decode_ceiling"] - r["best"]["mb_per_s"] / r["decode_ceiling_mb_s"]) < 1e-9
    # The model-step mode reports how much of each epoch waited for data.
    shim = next(r for r in rows if "Python shim" in r["engine"])
    assert 0.0 <= shim["best"]["data_stall_fraction"] <= 1.0
    # With a simulated accelerator every step waits its 5 ms: two batches of 32, at least 10 ms.
    assert shim["best"]["step_s"] >= 2 * 0.005 and shim["accelerator_ms"] == 5.0
    rust = next(r for r in rows if r["engine"] == "insitubatch (Rust API)")
    assert rust["best"]["step_s"] >= 2 * 0.005 and 0.0 <= rust["best"]["data_stall_fraction"] < 1
    # With a model step, both insitubatch engines also run with prefetch_next_epoch; in one
    # epoch nothing can have been started early.
    for name in ("insitubatch (Rust API, prefetch_next_epoch)",
                 "insitubatch (Python shim, prefetch_next_epoch)"):
        r = next(r for r in rows if r["engine"] == name)
        assert [e["started_ahead"] for e in r["epochs"]] == [False], r
        assert 0.0 <= r["best"]["data_stall_fraction"] < 1
    table = (tmp_path / "table.md").read_text()
    assert "× tuned DataLoader (steady)" in table and "× decode ceiling (steady)" in table
    assert f"(mean of {before:.0f} before and {after:.0f} after the insitubatch engines)" in table
    # What the run was measured on and with is saved in every row and said once in the table.
    machines = {json.dumps(r["machine"], sort_keys=True) for r in lines}
    assert len(machines) == 1, machines
    m = lines[0]["machine"]
    assert m["logical_cores"] == os.cpu_count() and m["python"] == platform.python_version()
    assert m["packages"]["zarr"] == importlib.metadata.version("zarr")
    assert m["insitubatch"].startswith("insitubatch ") and m["memory_bytes"] > 0
    head = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert m["commit"] is None or m["commit"].startswith(head), (m["commit"], head)
    assert table.count("_Measured from ") == 1
    assert (f"{m['logical_cores']} logical cores" in table and f"Python {m['python']}" in table
            and f"zarr {m['packages']['zarr']}" in table), table[:600]
    # The saved rows render the same table again without measuring anything.
    subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--from", str(out),
         "--markdown", str(tmp_path / "again.md")],
        check=True, capture_output=True, text=True,
    )
    assert (tmp_path / "again.md").read_text() == table
    assert (tmp_path / "throughput.png").stat().st_size > 1000
    assert any(p.name.startswith("latency_cdf_") for p in tmp_path.iterdir())
    # Every engine's batch-latency percentiles (HdrHistogram) are ordered and positive.
    for r in rows:
        for e in r["epochs"]:
            if "latency_ms_p50" in e:
                lat = [e[f"latency_ms_{q}"] for q in ("p50", "p90", "p99", "max")]
                assert 0 < lat[0] <= lat[1] <= lat[2] <= lat[3], (r["engine"], lat)
    rust = next(r for r in rows if "Rust API" in r["engine"])
    assert rust["epochs"][0]["ttfb_from_process_start_ms"] > 0
    # The ramped blocks run as their own engine, over the same samples.
    fast = next(r for r in rows if r["engine"] == "insitubatch (Rust API, fast_first_batch)")
    assert [e["samples"] for e in fast["epochs"]] == [e["samples"] for e in rust["epochs"]]


def test_a_store_an_older_make_dataset_wrote_is_made_again(tmp_path, monkeypatch):
    """`make_store` keeps a store this build's `make-dataset` wrote and rebuilds one whose
    recorded layout is another (or missing): results are never measured on stale data."""
    monkeypatch.syspath_prepend(str(HERE))
    import run

    store = run.make_store(tmp_path, 2, 8, "3x4")
    layout = run.synthetic_layout(store)
    assert layout is not None and layout == run.current_layout()
    doc = store / "zarr.json"
    stamp = doc.stat().st_mtime_ns
    assert run.make_store(tmp_path, 2, 8, "3x4") == store and doc.stat().st_mtime_ns == stamp
    meta = json.loads(doc.read_text())
    meta["attributes"]["insitubatch_synthetic"]["layout"] = layout - 1
    doc.write_text(json.dumps(meta))
    run.make_store(tmp_path, 2, 8, "3x4")
    assert run.synthetic_layout(store) == layout
    v2 = run.make_store(tmp_path, 8, 8, "3x4", variant="v2-blosc")
    assert run.synthetic_layout(v2) == layout and (v2 / ".zattrs").exists()


def test_the_key_rows_in_the_docs_are_the_committed_runs():
    """docs/benchmarks.md's key rows of the harness are what `key_rows.py` makes of the
    committed `docs/harness/results.jsonl`, so the table and the rows it came from agree."""
    sys.path.insert(0, str(HERE))
    from key_rows import key_rows

    root = HERE.parent
    rows = [json.loads(l) for l in (root / "docs/harness/results.jsonl").read_text().splitlines()]
    table = key_rows(rows)
    assert len(table.splitlines()) == 2 + 6
    assert table in (root / "docs/benchmarks.md").read_text()
