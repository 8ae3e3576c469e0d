"""Tablet moves measured (docs/benchmarks.md), not a test: a 3-server cluster of the local
runtime holding one table of 16 tablets loaded with `--records` rows of 1 KiB (basalt-bench),
a write and read load running through the endpoint (basalt-bench), then serveNodes 3 → 5.

Prints: the load's latency before the scale-out (baseline) and while the rebalancer moves 5
tablets; each move's bytes, copy time (snapshot stream, checks, ingest) and write-unavailable
window (fence to commit) from the master's log; the time until the cluster is even (3 or 4 tablets each).

    e2e/.venv/bin/python e2e/bench_moves.py --records 600000 [--rate-limit 0]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import btlib  # noqa: E402
import localrt  # noqa: E402
from btlib import GapicClients  # noqa: E402
from conftest import free_port  # noqa: E402
from test_moves import Cluster, apply, endpoint_serves, manifest  # noqa: E402

INSTANCE, CLUSTER, PROJECT = "bench-moves", "bench-moves-c1", "moves-p"
# Hashed keys are user<16 hex digits>: 16 tablets of equal size.
SPLITS = [f"user{d:x}".encode() for d in range(1, 16)]


def bench(endpoint: str, table: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(localrt._bin("basalt-bench")), "--endpoint", endpoint, "--table", table, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=600)
    phases = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    if not phases:
        raise RuntimeError(f"basalt-bench failed:\n{out}\n{err[-3000:]}")
    return phases[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=600_000)
    ap.add_argument("--rate-limit", type=int, default=0, help="bytes/s per move (0: unlimited)")
    ap.add_argument("--duration", type=int, default=20, help="seconds of each load run")
    ap.add_argument("--moves-at-once", type=int, default=2, help="moves at once per cluster")
    ap.add_argument("--idle", action="store_true",
                    help="move with no client load (the machine's own move throughput)")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-moves-"))
    rt = localrt.LocalRuntime(base, manifest(INSTANCE, CLUSTER, 3), f"127.0.0.1:{free_port()}",
                              env={"BASALT_MOVE_RATE_BYTES_PER_SEC": str(args.rate_limit),
                                   "BASALT_MOVES_PER_CLUSTER": str(args.moves_at_once),
                                   "RUST_LOG": "info"}).start()
    cl = Cluster(rt, INSTANCE, CLUSTER)
    table = btlib.table_name("usertable", INSTANCE, PROJECT)
    try:
        c = GapicClients(rt.servers()[0]["grpc"])
        c.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name(INSTANCE, PROJECT), table_id="usertable",
                table=btlib.Table(column_families={"cf": btlib.column_family()}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in SPLITS]),
            timeout=60)
        c.close()
        while sorted(cl.per_server().values()) != [5, 5, 6] or not endpoint_serves(rt, table):
            time.sleep(0.2)
        started = time.monotonic()
        load = result(bench(rt.endpoint, table, "--workload", "load", "--records", str(args.records),
                            "--concurrency", "16"))
        print(f"loaded {args.records} rows in {time.monotonic() - started:.1f}s "
              f"({load['rows_per_s']:.0f} rows/s)")
        work = ["--workload", "ycsb-a", "--records", str(args.records), "--concurrency", "8",
                "--duration", str(args.duration)]
        baseline = None if args.idle else result(bench(rt.endpoint, table, *work))
        during = None if args.idle else bench(rt.endpoint, table, *work)
        if during:
            time.sleep(2)
        apply(rt, manifest(INSTANCE, CLUSTER, 5))
        t0 = time.monotonic()
        while not (len(cl.names()) == 5 and sorted(cl.per_server().values()) == [3, 3, 3, 3, 4]):
            time.sleep(0.2)
        converged = time.monotonic() - t0
        loaded = result(during) if during else None
        log = (rt.data_dir / "logs" / f"{INSTANCE}-master.log").read_text(errors="replace")
        log = re.sub(r"\x1b\[[0-9;]*m", "", log)
        moves = [dict(bytes=int(m.group(1)), seconds=float(m.group(2)), copy=float(m.group(3)),
                      fenced=float(m.group(4)))
                 for m in re.finditer(r"tablet moved .*?bytes=(\d+) seconds=([\d.]+) "
                                      r"copy_seconds=([\d.]+) fenced_seconds=([\d.]+)", log)]
        print(f"3 → 5 {'idle' if args.idle else 'under load'}: even (3 or 4 tablets each) after {converged:.1f}s, {len(moves)} moves")
        for m in moves:
            print(f"  move: {m['bytes'] / 2**20:.1f} MiB, copy {m['copy']:.2f}s "
                  f"({m['bytes'] / 2**20 / max(m['copy'], 1e-9):.0f} MiB/s), total {m['seconds']:.2f}s, "
                  f"write-unavailable {m['fenced'] * 1000:.0f} ms")
        for name, r in (("baseline", baseline), ("during the moves", loaded)):
            if r is None:
                continue
            lat = r["latency_ms"]
            print(f"  ycsb-a {name}: {r['ops_per_s']:.0f} ops/s, p50 {lat['p50']:.2f} ms, "
                  f"p99 {lat['p99']:.2f} ms, max {lat['max']:.1f} ms, errors {r['errors']}")
    finally:
        rt.stop()


if __name__ == "__main__":
    main()
