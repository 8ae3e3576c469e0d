"""Replication measured (docs/benchmarks.md), not a test. On the local runtime, one server per
cluster (so that the numbers are about replication, not about a cluster's spread):

1. **The change log's cost**: basalt-bench `write` and `batch-write` against the server of a
   one-cluster instance, then against cluster a's server of a two-cluster instance whose
   cluster b is stopped (SIGSTOP: a logs every write for b, nothing is applied there to
   compete for the CPU).
2. **Lag under a write load**: b running, basalt-bench `write` through a; meanwhile a probe
   writes a row through a every 100 ms and reads it through b every 5 ms until it is there
   (what a user sees); plus the servers' `basalt_replication_latency_seconds` histogram.
3. **Convergence after a 30 s partition**: b stopped for 30 s under the same load, then
   resumed: the time until a consistency token generated at the resume is consistent.
4. **Seeding throughput**: a one-cluster instance loaded with `--records` rows of 1 KiB, then
   cluster b added: the time until b is READY, and the bytes the master copied.

    e2e/.venv/bin/python e2e/bench_replication.py --records 200000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import btlib  # noqa: E402
import localrt  # noqa: E402
from btlib import GapicClients  # noqa: E402
from conftest import free_port  # noqa: E402
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as at  # noqa: E402

PROJECT = "bench-repl"


def manifest(instance: str, clusters) -> str:
    docs = [f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {instance}
spec:
  displayName: Bench
  type: Development
  projectId: {PROJECT}
"""]
    for c in clusters:
        docs.append(f"""apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {instance}-{c}
spec:
  instanceRef: {instance}
  serveNodes: 1
  storageSize: 1Gi
""")
    return "---\n".join(docs)


def table(instance: str) -> str:
    return btlib.table_name("usertable", instance, PROJECT)


def server(rt, instance: str, cluster: str) -> dict:
    return rt.cluster(instance, f"{instance}-{cluster}")["servers"][0]


def bench(endpoint: str, tbl: str, *args: str) -> dict:
    out = subprocess.run(
        [str(localrt._bin("basalt-bench")), "--endpoint", endpoint, "--table", tbl, *args],
        capture_output=True, text=True, timeout=1800)
    phases = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not phases:
        raise RuntimeError(f"basalt-bench failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    return phases[-1]


def start(base: Path, instance: str, clusters) -> localrt.LocalRuntime:
    (base / instance).mkdir(parents=True, exist_ok=True)
    rt = localrt.LocalRuntime(base / instance, manifest(instance, clusters),
                              f"127.0.0.1:{free_port()}").start()
    for s in rt.servers():
        localrt.wait("ready", lambda: rt.server_ready(s), 60, rt)
    return rt


def write_rates(endpoint: str, tbl: str, seconds: int) -> dict:
    # A bulk load of new rows (MutateRows of 100, 16 in flight), then single-row writes and
    # 100-row batches that update the first 20,000 of them.
    load = bench(endpoint, tbl, "--workload", "load", "--records", "400000")
    w = bench(endpoint, tbl, "--workload", "write", "--records", "20000", "--duration", str(seconds))
    b = bench(endpoint, tbl, "--workload", "batch-write", "--records", "20000", "--batch", "100",
              "--duration", str(seconds))
    return {"load_rows_s": load["rows_per_s"], "write_ops_s": w["ops_per_s"], "write_p99_ms": w["latency_ms"]["p99"],
            "batch_rows_s": b["rows_per_s"], "batch_p99_ms": b["latency_ms"]["p99"]}


def buckets_of(metrics: str, name: str, label: str) -> dict[float, float]:
    out = {}
    for line in metrics.splitlines():
        m = re.match(rf'{name}_bucket\{{.*{label}.*le="([^"]+)"\}} (\S+)', line)
        if m:
            # One series per (source, peer, table): summed.
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            out[le] = out.get(le, 0.0) + float(m.group(2))
    return out


def histogram_quantiles(before: str, after: str, name: str, label: str, qs=(0.5, 0.99)) -> dict:
    """Quantiles of what the histogram observed between the two scrapes."""
    b, a = buckets_of(before, name, label), buckets_of(after, name, label)
    buckets = sorted((le, n - b.get(le, 0.0)) for le, n in a.items())
    total = buckets[-1][1] if buckets else 0
    out = {"count": total}
    for q in qs:
        want, prev_le, prev_n = q * total, 0.0, 0.0
        for le, n in buckets:
            if n >= want:
                if le == float("inf"):
                    out[f"p{int(q * 100)}"] = f"> {prev_le}"
                else:
                    frac = 0 if n == prev_n else (want - prev_n) / (n - prev_n)
                    out[f"p{int(q * 100)}"] = round(prev_le + (le - prev_le) * frac, 4)
                break
            prev_le, prev_n = le, n
    return out


class Probe(threading.Thread):
    """Writes a row through ``a`` every 100 ms and reads it through ``b`` until it is there."""

    def __init__(self, a: str, b: str, tbl: str):
        super().__init__(daemon=True)
        self.a, self.b, self.tbl = GapicClients(a), GapicClients(b), tbl
        self.stop = threading.Event()
        self.samples: list[float] = []

    def run(self):
        n = 0
        while not self.stop.is_set():
            key = f"probe-{n}".encode()
            btlib.mutate_row(self.a.data, self.tbl, key, [btlib.set_cell("cf", b"p", b"x", 1000)])
            t0 = time.monotonic()
            while not self.stop.is_set():
                if btlib.read_rows(self.b.data, self.tbl, keys=[key], timeout=10):
                    self.samples.append(time.monotonic() - t0)
                    break
                time.sleep(0.005)
            n += 1
            time.sleep(0.1)


def token_consistent_after(a: str, b: str, tbl: str) -> float:
    t0 = time.monotonic()
    gen, chk = GapicClients(a), GapicClients(b)
    token = gen.admin.generate_consistency_token(
        request=at.GenerateConsistencyTokenRequest(name=tbl), timeout=60).consistency_token
    while not chk.admin.check_consistency(
            request=at.CheckConsistencyRequest(name=tbl, consistency_token=token),
            timeout=10).consistent:
        time.sleep(0.05)
    return time.monotonic() - t0


def show(what: str, value):
    print(what, json.dumps(value), flush=True)
    return value


def seeding(base: Path, args, results: dict) -> None:
    """4. Seeding throughput."""
    rt = start(base, "repl-seed", ("a",))
    try:
        a = server(rt, "repl-seed", "a")
        loaded = bench(a["grpc"], table("repl-seed"), "--workload", "load", "--records",
                       str(args.records))
        show("seed_source_loaded", {"rows": loaded.get("rows_per_s"), "errors": loaded["errors"]})
        t0 = time.monotonic()
        applied = rt.apply(manifest("repl-seed", ("a", "b")))
        assert applied.returncode == 0, applied.stderr
        master_log = rt.data_dir / "logs" / "repl-seed-master.log"
        line = localrt.wait("seeded", lambda: next(
            (l for l in master_log.read_text().splitlines() if "READY" in l and "repl-seed-b" in l),
            None), 1800, rt, every=0.2)
        elapsed = time.monotonic() - t0
        text = re.sub(r"\x1b\[[0-9;]*m", "", master_log.read_text())
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        copied = int(re.search(r"bytes=(\d+)", line).group(1))
        began = next(l for l in text.splitlines() if "copying its tables" in l)

        def at(log_line: str) -> float:
            from datetime import datetime
            return datetime.fromisoformat(log_line.split()[0].rstrip("Z")).timestamp()
        copy_s = at(line) - at(began)
        results["seeding"] = show("seeding", {
            "records": args.records, "apply_to_ready_s": round(elapsed, 2),
            "copy_s": round(copy_s, 2), "bytes": copied,
            "copy_mib_per_s": round(copied / copy_s / 2**20, 1)})
    finally:
        rt.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--partition", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the log's cost, alternating which instance runs first")
    ap.add_argument("--only", choices=("all", "cost", "lag", "seed"), default="all",
                    help="lag: lag under load and convergence after a partition")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-repl-"))
    results: dict = {}

    # 1. The change log's cost: rounds alternate which instance runs first (a machine's speed
    # drifts), every round on fresh data directories.
    for r in range(args.rounds if args.only in ("all", "cost") else 0):
        order = ("one", "two") if r % 2 == 0 else ("two", "one")
        for kind in order:
            key = f"round{r + 1}_{kind}"
            if kind == "one":
                rt = start(base / key, "repl-one", ("a",))
                try:
                    results[key] = show(key, write_rates(
                        server(rt, "repl-one", "a")["grpc"], table("repl-one"), args.seconds))
                finally:
                    rt.stop()
                continue
            rt = start(base / key, "repl-two", ("a", "b"))
            try:
                a, b = server(rt, "repl-two", "a"), server(rt, "repl-two", "b")
                os.kill(b["pid"], signal.SIGSTOP)
                try:
                    results[key] = show(key, write_rates(a["grpc"], table("repl-two"), args.seconds))
                finally:
                    os.kill(b["pid"], signal.SIGCONT)
                results[key]["catch_up_s"] = show("catch_up_after_cost_run_s", round(
                    token_consistent_after(a["grpc"], b["grpc"], table("repl-two")), 1))
            finally:
                rt.stop()
    if args.only not in ("all", "lag"):
        if args.only == "seed":
            seeding(base, args, results)
        print(json.dumps(results, indent=2))
        return

    rt = start(base, "repl-two", ("a", "b"))
    try:
        a, b = server(rt, "repl-two", "a"), server(rt, "repl-two", "b")

        # 2. Lag under a write load, on rows loaded first (the load creates the table the
        # probe writes to) and shipped before the measure starts.
        bench(a["grpc"], table("repl-two"), "--workload", "load", "--records", "20000")
        token_consistent_after(a["grpc"], b["grpc"], table("repl-two"))  # the load shipped
        before = localrt.http_get(f"http://{a['http']}/metrics")[2].decode()
        probe = Probe(a["grpc"], b["grpc"], table("repl-two"))
        probe.start()
        load = bench(a["grpc"], table("repl-two"), "--workload", "write", "--records", "20000",
                     "--concurrency", "8", "--duration", str(args.seconds))
        probe.stop.set()
        probe.join()
        after = localrt.http_get(f"http://{a['http']}/metrics")[2]
        s = sorted(probe.samples)
        results["lag"] = show("lag", {
            "load_ops_s": load["ops_per_s"],
            "probe_samples": len(s),
            "probe_p50_ms": round(1000 * statistics.median(s), 1),
            "probe_p99_ms": round(1000 * s[min(len(s) - 1, int(0.99 * len(s)))], 1),
            "probe_max_ms": round(1000 * s[-1], 1),
            "metric_during_load": histogram_quantiles(
                before, after.decode(),
                "basalt_replication_latency_seconds", 'peer_cluster="repl-two-b"'),
        })

        # 3. Convergence after a partition (b stopped) under load.
        loader = subprocess.Popen(
            [str(localrt._bin("basalt-bench")), "--endpoint", a["grpc"], "--table", table("repl-two"),
             "--workload", "write", "--records", "20000", "--concurrency", "8",
             "--duration", str(args.partition + 60)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        os.kill(b["pid"], signal.SIGSTOP)
        time.sleep(args.partition)
        os.kill(b["pid"], signal.SIGCONT)
        results["converge_after_partition_s"] = show("converge_after_partition_s", round(
            token_consistent_after(a["grpc"], b["grpc"], table("repl-two")), 2))
        loader.kill()
        loader.wait()
    finally:
        rt.stop()

    if args.only == "all":
        seeding(base, args, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
