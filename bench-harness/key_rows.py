"""The key rows of a harness run: one line per store of the family, as `docs/benchmarks.md`
("Side by side against torch DataLoader") shows them, from the rows `run.py` wrote.

    python3 bench-harness/key_rows.py docs/harness/results.jsonl
"""

import json
import re
import sys

HEADER = (
    "| samples/chunk | insitubatch steady samples/s (Rust / Python) | tuned DataLoader steady "
    "| × tuned (Rust / Python) | steady × decode ceiling (Rust / Python) | epoch 0 × decode "
    "ceiling (Rust / Python) | TTFB ms (Rust: from iterator / from process start) | TTFB ms "
    "with `fast_first_batch` (from iterator / from process start) | peak RSS MiB insitubatch "
    "(Rust) / tuned DataLoader | peak RSS MiB, `fast_first_batch` | × tuned, "
    "`fast_first_batch` | xbatcher steady |\n"
    "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def steady(row) -> dict:
    """The best epoch after the first (run.py's `best_epoch`)."""
    pool = row["epochs"][1:] if len(row["epochs"]) > 1 else row["epochs"]
    return max(pool, key=lambda e: e["samples_per_s"])


def key_rows(rows) -> str:
    by_spc: dict = {}
    for r in rows:
        if r.get("variant", "family") != "family" or r.get("mode") == "inference":
            continue
        by_spc.setdefault(r["samples_per_chunk"], {})[r["engine"]] = r
    lines = [HEADER]
    for spc in sorted(by_spc):
        e = by_spc[spc]
        rust = e["insitubatch (Rust API)"]
        py = e["insitubatch (Python shim)"]
        ffb = e["insitubatch (Rust API, fast_first_batch)"]
        tuned = max((r for k, r in e.items() if k.startswith("torch DataLoader")),
                    key=lambda r: steady(r)["samples_per_s"])
        workers = re.search(r"(\d+) workers", tuned["engine"]).group(1)
        xbatcher = [r for k, r in e.items() if k.startswith("xbatcher")]
        ceiling = rust["decode_ceiling_mb_s"]

        def rate(r):
            return steady(r)["samples_per_s"]

        def ratio(r, epoch=None):
            e = steady(r) if epoch is None else r["epochs"][epoch]
            return e["mb_per_s"] / ceiling

        def mib(r):
            return r["peak_rss_bytes"] / 2**20

        def ttfb(r):
            e = r["epochs"][0]
            return f"{e['ttfb_ms']:.0f} / {e['ttfb_from_process_start_ms']:.0f}"

        t = rate(tuned)
        xb = f"{rate(xbatcher[0]):.0f}" if xbatcher else "—"
        lines.append(
            f"| {spc} | {rate(rust):.0f} / {rate(py):.0f} | {t:.0f} ({workers} workers) "
            f"| {rate(rust) / t:.1f} / {rate(py) / t:.1f} | {ratio(rust):.2f} / {ratio(py):.2f} "
            f"| {ratio(rust, 0):.2f} / {ratio(py, 0):.2f} | {ttfb(rust)} | {ttfb(ffb)} "
            f"| {mib(rust):.0f} / {mib(tuned):.0f} | {mib(ffb):.0f} | {rate(ffb) / t:.1f} | {xb} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(key_rows([json.loads(line) for line in f]))
