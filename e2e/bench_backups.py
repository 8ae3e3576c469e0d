"""Backups of a standalone server, measured (not a test; docs/benchmarks.md).

Starts a fresh standalone basalt-tablet-server on free loopback ports with `--backup-url` (a
directory under the run's, or the URL given; for s3:// set the AWS_* variables), loads
`--records` rows of 1 KB with basalt-bench, then measures with the official Python admin client:

    backup      CreateBackup of the table, until its operation is done (MB/s of the backup)
    restore     RestoreTable of it into a new table, until done
    incremental `--updates` rows rewritten, a second backup: the bytes it uploaded
    under load  YCSB A (16 in flight) for `--duration` s alone, then `--rounds` times: with a
                backup started 3 s in, then alone again; ops/s and latency percentiles, and
                each round's p99 against the mean of the windows alone around it

    e2e/.venv/bin/python e2e/bench_backups.py --records 500000
    e2e/.venv/bin/python e2e/bench_backups.py --server-args=--backup-max-mb-per-sec=0
"""
import argparse
import datetime
import glob
import json
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time

from ports import free_port

BIN = os.environ.get("BASALT_BIN_DIR",
                     os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--duration", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--url", help="backup location (default: file:// under the run's directory)")
    p.add_argument("--server-args", action="append", default=[])
    a = p.parse_args()
    run = tempfile.mkdtemp(prefix="basalt-bench-backups-")
    url = a.url or f"file://{run}/backups"
    port, http = free_port(), free_port()
    endpoint = f"127.0.0.1:{port}"
    os.environ["BIGTABLE_EMULATOR_HOST"] = endpoint
    server = subprocess.Popen(
        [os.path.join(BIN, "basalt-tablet-server"), "--standalone", "--data-dir", f"{run}/data",
         "--listen", endpoint, "--http-listen", f"127.0.0.1:{http}", "--backup-url", url,
         *a.server_args],
        stdout=open(f"{run}/server.log", "w"), stderr=subprocess.STDOUT)
    try:
        measure(a, run, endpoint)
    finally:
        server.terminate()
        server.wait()
        print(f"(run directory {run})")


def measure(a, run, endpoint):
    from google.cloud.bigtable import Client
    from google.cloud.bigtable_admin_v2.types import Backup

    table = "projects/bench/instances/bench/tables/usertable"

    def bench(*args):
        out = subprocess.run([os.path.join(BIN, "basalt-bench"), "--endpoint", endpoint,
                              "--records", str(a.records), "--row-size", "1000", *args],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                j = json.loads(line)
                return {"ops_per_s": round(j["ops_per_s"]),
                        **{k + "_ms": j["latency_ms"][k] for k in ("p50", "p99", "p999")}}
        raise RuntimeError(out)

    for _ in range(50):
        try:
            socket.create_connection(endpoint.split(":"), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    bench("--workload", "load")
    client = Client(project="bench", admin=True)
    admin = client.table_admin_client
    expire = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7)
    parent = "projects/bench/instances/bench/clusters/local"

    def backup(backup_id):
        started = time.time()
        b = admin.create_backup(parent=parent, backup_id=backup_id, backup=Backup(
            source_table=table, expire_time=expire)).result(timeout=1800)
        return b, time.time() - started

    full, secs = backup("full")
    mb = full.size_bytes / 1e6
    print(f"backup:      {mb:.0f} MB in {secs:.1f} s = {mb / secs:.0f} MB/s")
    started = time.time()
    client.instance("bench").table("restored").restore(
        "restored", backup_name=full.name).result(timeout=1800)
    secs = time.time() - started
    print(f"restore:     {mb:.0f} MB in {secs:.1f} s = {mb / secs:.0f} MB/s")
    bench("--workload", "write", "--operations", str(a.updates))
    second, secs = backup("second")
    manifests = glob.glob(f"{run}/backups/backups/**/second/manifest.json", recursive=True)
    if manifests:
        uploaded = json.load(open(manifests[0]))["uploaded_bytes"] / 1e6
        print(f"incremental: {a.updates} rows rewritten, second backup of "
              f"{second.size_bytes / 1e6:.0f} MB uploaded {uploaded:.1f} MB in {secs:.1f} s")
    # YCSB A's latency drifts as its updates pile up (throughput alone fell by a third over
    # four rounds on 2026-11-29), so each window with a backup is compared with the mean of
    # the windows alone just before and just after it: a drift biases neither way.
    def ycsb():
        return bench("--workload", "ycsb-a", "--duration", str(a.duration), "--concurrency", "16")

    alone = [ycsb()]
    print(f"ycsb-a alone:         {alone[-1]}")
    costs = []
    for r in range(a.rounds):
        result = {}
        load = threading.Thread(target=lambda: result.update(ycsb()))
        load.start()
        time.sleep(3)
        b, secs = backup(f"under-load-{r}")
        load.join()
        print(f"ycsb-a with a backup: {result}  (backup of {b.size_bytes / 1e6:.0f} MB in {secs:.1f} s)")
        alone.append(ycsb())
        print(f"ycsb-a alone:         {alone[-1]}")
        around = (alone[-2]["p99_ms"] + alone[-1]["p99_ms"]) / 2
        costs.append(result["p99_ms"] / around - 1)
        print(f"  p99 cost of the backup: {costs[-1]:+.1%} (against {around:.2f} ms, the mean of the windows around it)")
    costs.sort()
    print(f"p99 cost per round: {', '.join(f'{c:+.1%}' for c in costs)}; median {statistics.median(costs):+.1%}")

if __name__ == "__main__":
    main()
