"""Opening a store without consolidated metadata over S3: how long `open_geometries` takes to
list a group of many arrays and read each one's metadata (docs/benchmarks.md, "Opening a store
without consolidated metadata").

    cargo build --release
    PYTHONPATH=bindings/python INSITUBATCH_LIB=target/release/libinsitubatch.so \\
        python3 bench/unconsolidated_open.py [--variables 64] [--repeat 7]

A local moto S3 server holds two stores written by zarr-python without consolidated metadata,
one v3 and one v2, each with `--variables` small (time, lat, lon) arrays. moto answers one
request at a time in a few milliseconds of Python, far from an object store's tens of
milliseconds of latency, so the client reaches it through a proxy that holds every response
`--delay-ms` (default 20) before passing it on, each connection on its own. Each open is timed
from a fresh call (nothing is cached between calls); the median and the fastest are printed,
with the number of metadata requests one open makes.
"""

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zarr

import insitubatch as isb

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing",
               "aws_region": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def delaying_proxy(upstream_port: int, delay: float) -> int:
    """A TCP proxy on a thread of its own that passes each chunk the server sends on after
    `delay` seconds, every connection independently (as a distant server would); its port."""
    loop = asyncio.new_event_loop()
    ready: list[int] = []

    async def pump(reader, writer, hold):
        try:
            while data := await reader.read(1 << 16):
                if hold:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def client(reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pump(reader, up_writer, False), pump(up_reader, writer, True))

    async def serve():
        server = await asyncio.start_server(client, "127.0.0.1", 0)
        ready.append(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--variables", type=int, default=64)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--delay-ms", type=float, default=20.0)
    args = p.parse_args()
    import boto3

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint, **{
            "aws_access_key_id": CREDENTIALS["aws_access_key_id"],
            "aws_secret_access_key": CREDENTIALS["aws_secret_access_key"],
            "region_name": CREDENTIALS["aws_region"]})
        client.create_bucket(Bucket="data")
        proxied = f"http://127.0.0.1:{delaying_proxy(port, args.delay_ms / 1000)}"
        options = {**CREDENTIALS, "aws_endpoint": proxied, "aws_allow_http": True}
        with tempfile.TemporaryDirectory() as tmp:
            for fmt in (3, 2):
                name = f"many_v{fmt}.zarr"
                g = zarr.open_group(Path(tmp) / name, mode="w", zarr_format=fmt)
                for k in range(args.variables):
                    kw = {"dimension_names": ["time", "lat", "lon"]} if fmt == 3 else {}
                    a = g.create_array(f"var{k:03d}", shape=(4, 3, 5), chunks=(2, 3, 5),
                                       dtype="float32", **kw)
                    a[...] = np.float32(k)
                    if fmt == 2:
                        a.attrs["_ARRAY_DIMENSIONS"] = ["time", "lat", "lon"]
                for dirpath, _, files in os.walk(Path(tmp) / name):
                    for f in files:
                        if f == ".zmetadata":  # none is written; listed, never consolidated
                            continue
                        path = os.path.join(dirpath, f)
                        client.upload_file(path, "data", os.path.relpath(path, tmp))
                requests = args.variables * (1 if fmt == 3 else 2)
                times = []
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    geoms = isb.open_geometries(f"s3://data/{name}", storage_options=options)
                    times.append(time.perf_counter() - t0)
                    assert len(geoms) == args.variables, len(geoms)
                print(f"v{fmt}, {args.delay_ms:g} ms a response: {args.variables} arrays, "
                      f"{requests} metadata requests after the listing: median {statistics.median(times) * 1e3:.1f} ms, fastest "
                      f"{min(times) * 1e3:.1f} ms over {args.repeat} opens")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
