"""A/B of two builds of the server (docs/benchmarks.md), not a test: the same workloads with the
same client (this checkout's basalt-bench) against each build in turn, alternating the order
from round to round.

* standalone, on one data directory loaded once (`--records` rows of 1 KiB): point reads,
  MutateRow, MutateRows of 100 rows, 100-row scans;
* a 2-server cluster of the local runtime (one per build and round, its own operator binary):
  a table of one tablet loaded with 20,000 rows, point reads through the owner and through the
  other server (forwarded).

    e2e/.venv/bin/python e2e/bench_ab.py --a /tmp/old --b $CARGO_TARGET_DIR/release [--rounds 2]

`--a`/`--b` are directories holding basalt-tablet-server and basalt-operator.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import localrt  # noqa: E402
from conftest import free_port  # noqa: E402

# The local runtime's instance for the forwarded reads (an instance id has 6 to 33 characters).
INSTANCE = "bench-ab"
TABLE = f"projects/bench/instances/{INSTANCE}/tables/usertable"
STANDALONE = [
    ("point read", ["--workload", "read", "--concurrency", "32"]),
    ("MutateRow", ["--workload", "write", "--concurrency", "64"]),
    ("MutateRows x100", ["--workload", "batch-write", "--batch", "100", "--concurrency", "16"]),
    ("scan 100 rows", ["--workload", "scan", "--scan-rows", "100", "--concurrency", "16"]),
]


def bench(endpoint: str, *args: str, table: str | None = None) -> dict:
    cmd = [str(localrt._bin("basalt-bench")), "--endpoint", endpoint, "--progress", "0", *args]
    if table:
        cmd += ["--table", table]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    phases = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not phases:
        raise RuntimeError(f"basalt-bench failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    return phases[-1]


def ready(http: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{http}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server at {http} not ready in {timeout}s")


def standalone(build: Path, data: Path, records: int, duration: int) -> dict:
    grpc, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [str(build / "basalt-tablet-server"), "--standalone", "--data-dir", str(data),
         "--listen", grpc, "--http-listen", http],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready(http)
        out = {}
        for name, args in STANDALONE:
            r = bench(grpc, "--records", str(records), "--duration", str(duration), *args)
            out[name] = r
        return out
    finally:
        server.terminate()
        server.wait(timeout=60)


def forwarded(build: Path, duration: int) -> dict:
    base = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    env = dict(os.environ)
    os.environ["BASALT_BIN"] = str(build / "basalt-tablet-server")
    os.environ["BASALT_OPERATOR_BIN"] = str(build / "basalt-operator")
    rt = localrt.LocalRuntime(base, localrt.manifest(INSTANCE, "bench", f"{INSTANCE}-c1", 2),
                              f"127.0.0.1:{free_port()}")
    try:
        rt.start()
        servers = {s["name"]: s for s in rt.servers()}
        first = next(iter(servers.values()))
        bench(first["grpc"], "--workload", "load", "--records", "20000", table=TABLE)
        cluster = localrt.EtcdCluster(rt, INSTANCE, f"{INSTANCE}-c1")
        owners = cluster.owners()
        owner = max(owners, key=owners.get)
        other = next(n for n in servers if n != owner)
        out = {}
        for name, via in (("point read via the owner", owner),
                          ("point read forwarded", other)):
            out[name] = bench(servers[via]["grpc"], "--workload", "read", "--records", "20000",
                              "--concurrency", "16", "--duration", str(duration), table=TABLE)
        return out
    finally:
        rt.stop()
        os.environ.clear()
        os.environ.update(env)
        shutil.rmtree(base, ignore_errors=True)


def line(r: dict) -> str:
    lat = r["latency_ms"]
    rate = r["rows_per_s"] if r.get("rows_per_s") and r["rows_per_s"] != r["ops_per_s"] else r["ops_per_s"]
    return f"{rate:,.0f}/s p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ms err {r['errors']}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=Path, required=True, help="directory of build A's binaries")
    ap.add_argument("--b", type=Path, required=True, help="directory of build B's binaries")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-ab-data-"))
    # Load once, with build B, then both builds read and write the same directory.
    grpc, http = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    loader = subprocess.Popen(
        [str(args.b / "basalt-tablet-server"), "--standalone", "--data-dir", str(data),
         "--listen", grpc, "--http-listen", http],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ready(http)
    bench(grpc, "--workload", "load", "--records", str(args.records), "--concurrency", "16")
    loader.terminate()
    loader.wait(timeout=60)

    results: dict[str, dict[str, list[str]]] = {}
    for rnd in range(args.rounds):
        order = [("A", args.a), ("B", args.b)] if rnd % 2 == 0 else [("B", args.b), ("A", args.a)]
        for label, build in order:
            for name, r in {**standalone(build, data, args.records, args.duration),
                            **forwarded(build, args.duration)}.items():
                results.setdefault(name, {}).setdefault(label, []).append(line(r))
                print(f"round {rnd + 1} {label} {name}: {line(r)}", flush=True)
    print("\n| workload | A, rounds | B, rounds |\n| --- | --- | --- |")
    for name, by in results.items():
        print(f"| {name} | {' / '.join(by.get('A', []))} | {' / '.join(by.get('B', []))} |")
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
