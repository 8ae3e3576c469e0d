"""App-profile routing measured (docs/benchmarks.md), not a test. On the local runtime, two
clusters of one server each, a table of 10,000 rows of 1 KiB, through the official Python
client's GAPIC layer (so the numbers include a Python client's own cost, the same on both
sides of each comparison):

1. **Routing overhead**: point reads and writes sent to cluster a's server with a
   single-cluster profile to a (served there) and with one to b (sent on to b's server and
   back): the latency each adds, p50 and p99.
2. **Priority**: HIGH point reads through a's server alone, then next to a batch job (a
   process of its own, four threads writing MutateRows batches of 100 rows of 1 KiB through
   the same server) whose profile is LOW, then the same batch with a HIGH profile: HIGH's
   p50/p99 and the batch's throughput in each case (HIGH reads run from before the batch
   starts; they are measured once it has run for a while). ``--nice-batch 19`` runs the batch
   process at that niceness (a batch client on a machine of its own); ``--pin`` puts the
   servers on core 0 and the clients on the others.

    e2e/.venv/bin/python e2e/bench_routing.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

import btlib  # noqa: E402
import localrt  # noqa: E402
from btlib import GapicClients  # noqa: E402
from conftest import free_port  # noqa: E402
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as at  # noqa: E402
from google.cloud.bigtable_v2 import types as v2  # noqa: E402

PROJECT = "bench-route"
INSTANCE = "routing"
ROWS = 10_000


def manifest() -> str:
    docs = [f"""apiVersion: basalt.dev/v1alpha1
kind: Instance
metadata:
  name: {INSTANCE}
spec:
  displayName: Bench
  type: Development
  projectId: {PROJECT}
"""]
    for c in ("a", "b"):
        docs.append(f"""apiVersion: basalt.dev/v1alpha1
kind: Cluster
metadata:
  name: {INSTANCE}-{c}
spec:
  instanceRef: {INSTANCE}
  serveNodes: 1
  storageSize: 1Gi
""")
    profiles = "".join(
        localrt.app_profile(name, INSTANCE,
                            {"singleClusterRouting": {"clusterId": f"{INSTANCE}-{cluster}"}},
                            priority)
        for name, cluster, priority in (("to-a", "a", "High"), ("to-b", "b", "High"),
                                        ("batch-low", "a", "Low"), ("batch-high", "a", "High")))
    return "---\n".join(docs) + profiles


TABLE = btlib.table_name("t", INSTANCE, PROJECT)


def params(profile: str):
    return [("x-goog-request-params", f"table_name={quote(TABLE, safe='')}&app_profile_id={profile}")]


def read(data, key: bytes, profile: str):
    list(data.read_rows(request=v2.ReadRowsRequest(
        table_name=TABLE, app_profile_id=profile, rows=v2.RowSet(row_keys=[key])),
        metadata=params(profile), retry=None, timeout=30))


def write(data, key: bytes, profile: str):
    data.mutate_row(request=v2.MutateRowRequest(
        table_name=TABLE, row_key=key, app_profile_id=profile,
        mutations=[btlib.set_cell("cf", b"q", b"w" * 1024, 1000)]),
        metadata=params(profile), retry=None, timeout=30)


def quantiles(samples: list[float]) -> str:
    s = sorted(samples)
    p = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000  # noqa: E731
    return f"p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms ({len(s)} requests)"


def timed(endpoint: str, op, profile: str, count: int, threads: int = 2) -> list[float]:
    out: list[float] = []
    lock = threading.Lock()

    def run(idx: int):
        client = GapicClients(endpoint)
        mine = []
        try:
            for n in range(count // threads):
                key = f"row-{(idx * 7919 + n * 31) % ROWS:06}".encode()
                t0 = time.perf_counter()
                op(client.data, key, profile)
                mine.append(time.perf_counter() - t0)
        finally:
            client.close()
        with lock:
            out.extend(mine)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


class Batch:
    """A batch job in a process of its own (so that its client work does not compete with the
    measured reads' inside one Python process): threads writing MutateRows batches of 100
    rows of 1 KiB through ``profile``, until the parent closes its stdin; it then prints the
    rows it wrote per second."""

    def __init__(self, endpoint: str, profile: str, threads: int = 4, nice: int = 0):
        self.args = [sys.executable, __file__, "--batch-child", endpoint, profile, str(threads),
                     str(nice)]

    def __enter__(self):
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        return self

    def __exit__(self, *exc):
        out, _ = self.proc.communicate(input="", timeout=120)
        self.rows_per_second = float(out.strip().splitlines()[-1])


def batch_child(endpoint: str, profile: str, threads: int, nice: int):
    if nice:
        os.nice(nice)
    stop = threading.Event()
    rows = [0] * threads

    # Ten requests per thread built before the batch starts and sent in turn (rows written
    # again and again), so the batch client spends little CPU of its own next to the
    # measured one.
    requests = [[v2.MutateRowsRequest(table_name=TABLE, app_profile_id=profile, entries=[
        v2.MutateRowsRequest.Entry(
            row_key=f"batch-{idx}-{i:07}".encode(),
            mutations=[btlib.set_cell("cf", b"q", b"b" * 1024, 1000)])
        for i in range(k * 100, k * 100 + 100)]) for k in range(10)] for idx in range(threads)]
    clients = [GapicClients(endpoint) for _ in range(threads)]

    def run(idx: int):
        n = 0
        while not stop.is_set():
            for _ in clients[idx].data.mutate_rows(request=requests[idx][n % 10],
                                                   metadata=params(profile), retry=None,
                                                   timeout=60):
                pass
            n += 1
            rows[idx] += 100

    print("ready", flush=True)
    started = time.monotonic()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    sys.stdin.read()  # until the parent closes it
    stop.set()
    for t in ts:
        t.join()
    for c in clients:
        c.close()
    print(sum(rows) / (time.monotonic() - started), flush=True)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--batch-child":
        return batch_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--pin", action="store_true",
                    help="the servers on core 0, the clients on the other cores (Linux)")
    ap.add_argument("--nice-batch", type=int, default=0,
                    help="the batch process's niceness: with the clients on the server's "
                         "machine, 19 stands for a batch client on a machine of its own")
    ap.add_argument("--only", choices=("overhead", "priority"),
                    help="measure only the routing overhead or only priority")
    ap.add_argument("--rounds", type=int, default=1,
                    help="priority rounds (the LOW and HIGH batches alternate their order)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rt = localrt.LocalRuntime(Path(tmp), manifest(), f"127.0.0.1:{free_port()}").start()
        try:
            a = rt.cluster(INSTANCE, f"{INSTANCE}-a")["servers"][0]["grpc"]
            if args.pin:
                for c in ("a", "b"):
                    for server in rt.cluster(INSTANCE, f"{INSTANCE}-{c}")["servers"]:
                        for task in Path(f"/proc/{server['pid']}/task").iterdir():
                            os.sched_setaffinity(int(task.name), {0})
                os.sched_setaffinity(0, set(range(1, os.cpu_count() or 2)))
            client = GapicClients(a)
            client.admin.create_table(request=at.CreateTableRequest(
                parent=btlib.instance_name(INSTANCE, PROJECT), table_id="t",
                table=btlib.Table(column_families={"cf": btlib.column_family()})), timeout=60)
            for start in range(0, ROWS, 500):
                btlib.mutate_rows(client.data, TABLE, [
                    (f"row-{i:06}".encode(), [btlib.set_cell("cf", b"q", b"v" * 1024, 1000)])
                    for i in range(start, start + 500)])
            client.close()
            time.sleep(3)  # replicated to b
            print("## routing overhead (requests received by cluster a's server)")
            overhead = ((read, "ReadRows of one row"), (write, "MutateRow of 1 KiB"))
            for op, name in overhead if args.only != "priority" else ():
                timed(a, op, "to-a", 400)  # warm-up
                timed(a, op, "to-b", 400)
                local = timed(a, op, "to-a", args.requests)
                crossing = timed(a, op, "to-b", args.requests)
                print(f"{name}: served in a: {quantiles(local)}; sent on to b: "
                      f"{quantiles(crossing)}; added p50 "
                      f"{(statistics.median(crossing) - statistics.median(local)) * 1000:.2f} ms")
            if args.only == "overhead":
                return
            print("## priority (HIGH point reads through a's server)")
            timed(a, read, "to-a", 400)  # warm-up
            for r in range(args.rounds):
                alone = timed(a, read, "to-a", args.requests)
                print(f"round {r + 1}: HIGH reads alone: {quantiles(alone)}")
                batches = ("batch-low", "batch-high") if r % 2 == 0 else ("batch-high", "batch-low")
                for batch_profile in batches:
                    with Batch(a, batch_profile, nice=args.nice_batch) as batch:
                        # HIGH traffic from before the batch's first write; measured once
                        # the batch has run for a while.
                        timed(a, read, "to-a", args.requests)
                        high = timed(a, read, "to-a", args.requests)
                    print(f"round {r + 1}: HIGH reads next to a {batch_profile} batch: "
                          f"{quantiles(high)}; the batch wrote {batch.rows_per_second:.0f} rows/s")
                    time.sleep(2)  # the batch's flushes settle
        finally:
            rt.stop()


if __name__ == "__main__":
    main()
