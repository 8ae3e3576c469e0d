"""Basalt next to Google's Bigtable emulator, measured in one run on this machine (not a test).

Starts a fresh standalone basalt-tablet-server and a fresh Bigtable emulator (cbtemulator) on
free loopback ports, loads `--records` rows of 1 KiB into each with the same basalt-bench
command, then runs the same basalt-bench command line against each, alternating (Basalt,
emulator, Basalt, emulator, … `--rounds` times) for every workload row:

    reads       point reads (ReadRows of one key), 32 in flight
    writes      single-row MutateRow updates of existing rows, 64 in flight
    batch       MutateRows batches of 100 rows, 16 in flight
    scans       100-row scans (ReadRows from a key, rows_limit 100), 16 in flight
    ycsb-a      YCSB A (50 % reads, 50 % updates, zipfian), 32 in flight

For every run it records basalt-bench's figures (its JSON line) and the CPU seconds the server
process used (utime + stime of the process that owns the listening socket, from
/proc/<pid>/stat) and reports server CPU per 1,000 requests (and per 1,000 rows for batches and
scans). Before each run it waits (at most `--quiet-wait` s) for the 1-minute load average to
drop below `--quiet-load` and records the load it started at, as e2e/loadgen/run-workloads.sh
does. Prints a markdown table per workload, then a summary (medians over rounds, Basalt ÷
emulator); writes every raw result to `--out` (JSON).

    e2e/.venv/bin/python e2e/bench_vs_emulator.py --records 200000
    e2e/.venv/bin/python e2e/bench_vs_emulator.py --only reads,scans --rounds 5 --duration 15

Read the figures with what the two servers are:
- The emulator keeps everything in memory and is not durable: a write is acknowledged when it
  is in a Go map, and everything is gone when the process stops. Basalt syncs every
  acknowledged write to its write-ahead log (fsync; concurrent writes share a sync) and stores
  rows in RocksDB, so a write run measures durable writes against in-memory ones.
- Basalt's background work (memtable flushes, compactions after the load and the write runs)
  is counted in whichever run it happens during.
- The load generator runs on the same machine and competes with the server for the cores.
- The emulator applies a family's GC rule only in a background loop that it starts on the
  first ModifyColumnFamilies call, not when a table is created with the rule (basalt-bench
  creates it with `max_num_versions = 1`): without that call every update adds a version and
  its reads return all of them (a 1 KiB row read back as tens of KiB after the write runs).
  After the load the script therefore runs `cbt setgcpolicy usertable cf maxversions=1`
  against both servers (cbt on PATH; `--no-setgcpolicy` skips it), and reports the KiB per
  row that reads returned. The emulator's GC pass then walks the whole table every 0.5-1.5 s;
  that CPU is counted too.
- The emulator answers a scan (a row range with no end key and rows_limit) by collecting
  every row from the start key to the end of the table, sorting them, and sending the first
  rows_limit: its scan cost grows with the table, not with the rows returned.
- basalt-bench seeds its workers the same way on every run, so both servers see the same keys.

Binaries: basalt-tablet-server and basalt-bench from `--bin-dir` (default
${CARGO_TARGET_DIR:-<repo>/target}/release; `cargo build --release --workspace`), the emulator
from `--emulator` (Google Cloud SDK's component `bigtable`). Standard library and the e2e suite's conftest helpers only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import _tail as tail, free_port  # noqa: E402  (the e2e suite's helpers)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EMULATOR = "/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator"
CLK_TCK = os.sysconf("SC_CLK_TCK")

# name, what it is, basalt-bench arguments, whether one request carries many rows
WORKLOADS = [
    ("reads", "point reads", ["--workload", "read", "--concurrency", "32"], False),
    ("writes", "single-row writes (updates; synced on Basalt)",
     ["--workload", "write", "--concurrency", "64"], False),
    ("batch", "MutateRows batches of 100 rows",
     ["--workload", "batch-write", "--batch", "100", "--concurrency", "16"], True),
    ("scans", "100-row scans", ["--workload", "scan", "--scan-rows", "100", "--concurrency", "16"], True),
    ("ycsb-a", "YCSB A (50 % reads, 50 % updates)", ["--workload", "ycsb-a", "--concurrency", "32"], False),
]
SERVERS = ("basalt", "emulator")
TABLE = ("bench", "bench", "usertable")  # basalt-bench's default table (project, instance, table)
LABEL = {"basalt": "Basalt", "emulator": "emulator"}


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)


# ---- /proc ----------------------------------------------------------------------------------

def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: [0] is field 3 (state)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads)."""
    f = proc_stat(pid)
    return (int(f[11]) + int(f[12])) / CLK_TCK


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                children.setdefault(int(proc_stat(int(d.name))[1]), []).append(int(d.name))
            except (OSError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def listening_pid(port: int, root: int) -> int | None:
    """The process (`root` or one of its descendants) that owns the TCP socket listening on
    127.0.0.1:`port`: the server itself, not a wrapper that started it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in descendants(root):
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    if os.readlink(fd) in wanted:
                        return pid
                except OSError:
                    pass
        except OSError:
            pass
    return None


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold: float, max_wait: float) -> float:
    """Waits (at most `max_wait` s) for the 1-minute load average to drop below `threshold`;
    returns the load average the run starts at."""
    deadline = time.monotonic() + max_wait
    while loadavg() >= threshold and time.monotonic() < deadline:
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    return loadavg()


# ---- servers --------------------------------------------------------------------------------

class Server:
    def __init__(self, name: str, cmd: list[str], port: int, base: Path, ready):
        self.name, self.cmd, self.port, self.ready = name, cmd, port, ready
        self.endpoint = f"127.0.0.1:{port}"
        self.stdout = base / f"{name}.stdout.log"
        self.stderr = base / f"{name}.stderr.log"
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # the process whose CPU is measured
        self.exit_code: int | None = None

    def start(self, timeout: float = 120.0) -> "Server":
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready(self):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n"
                                   f"{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.logs()}")
            time.sleep(0.1)
        self.pid = listening_pid(self.port, self.proc.pid)
        if self.pid is None:
            raise RuntimeError(f"{self.name}: no process of the tree of pid {self.proc.pid} "
                               f"listens on port {self.port}")
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def logs(self) -> str:
        return (f"--- {self.stderr} (tail) ---\n{tail(self.stderr)}\n"
                f"--- {self.stdout} (tail) ---\n{tail(self.stdout)}")

    def stop(self, timeout: float = 30.0):
        """SIGTERM to the process group it was started in (a wrapper and the server it started),
        SIGKILL after `timeout`."""
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        while self.pid and pid_alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None or (self.pid and pid_alive(self.pid)):
            log(f"{self.name} still running {timeout:.0f}s after SIGTERM: SIGKILL")
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.exit_code = self.proc.returncode


def pid_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return proc_stat(pid)[0] != "Z"
    except OSError:
        return False


def http_ready(url: str):
    def check(_server) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False
    return check


def tcp_ready(server: Server) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1):
            return True
    except OSError:
        return False


# ---- basalt-bench ---------------------------------------------------------------------------

def run_bench(bench: Path, server: Server, bench_args: list[str], timeout: float) -> dict:
    """One basalt-bench run against `server`: its result (last JSON line), the server's CPU
    seconds during it, and anything that went wrong (`problems`)."""
    cmd = [str(bench), "--endpoint", server.endpoint, "--progress", "0", *bench_args]
    problems = []
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before, t0 = server.cpu(), time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        problems.append(f"basalt-bench did not finish within {timeout:.0f}s (killed)")
    wall = time.monotonic() - t0
    alive = server.alive()
    server_cpu = server.cpu() - cpu_before if alive else None
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    bench_cpu = (children_after.ru_utime + children_after.ru_stime
                 - children_before.ru_utime - children_before.ru_stime)
    phases = []
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                phases.append(json.loads(line))
            except ValueError:
                problems.append(f"unparsable JSON line: {line[:200]}")
    result = phases[-1] if phases else None
    last_err = next((l.strip() for l in reversed(err.splitlines()) if l.strip()), "")
    if rc not in (0, None):
        problems.append(f"basalt-bench exited with {rc}" + (f": {last_err}" if last_err else ""))
    elif result is None:
        problems.append("basalt-bench printed no JSON result" + (f"; stderr: {last_err}" if last_err else ""))
    else:
        if result.get("errors"):
            problems.append(f"{result['errors']} failed requests: {result.get('errors_by_code')}")
        if result.get("misses"):
            problems.append(f"{result['misses']} reads found no row (records not loaded?)")
    if not alive:
        problems.append(f"{server.name} exited (code {server.proc.returncode}) during the run:\n"
                        f"{server.logs()}")
    return {"server": server.name, "command": ["basalt-bench", *cmd[1:]], "exit_code": rc,
            "wall_seconds": wall, "server_cpu_seconds": server_cpu, "bench_cpu_seconds": bench_cpu,
            "server_rss_mib": rss_mib(server.pid) if alive else None,
            "result": result, "problems": problems,
            "stderr_tail": err[-3000:] if (rc != 0 or result is None) else None}


def per_1k(cpu: float | None, n: float | None) -> float | None:
    if cpu is None or not n:
        return None
    return cpu / n * 1000


def annotate(run: dict):
    """CPU per 1,000 requests and per 1,000 rows."""
    r = run["result"] or {}
    rows = sum(op.get("rows", 0) for op in r.get("by_op", {}).values()) if r else None
    run["requests"] = r.get("ops")
    run["rows"] = rows
    run["cpu_s_per_1k_requests"] = per_1k(run["server_cpu_seconds"], r.get("ops"))
    run["cpu_s_per_1k_rows"] = per_1k(run["server_cpu_seconds"], rows)
    reads = [op for name, op in r.get("by_op", {}).items() if name in ("read", "scan")] if r else []
    read_rows = sum(op.get("rows", 0) for op in reads)
    run["read_kib_per_row"] = sum(op.get("bytes", 0) for op in reads) / read_rows / 1024 if read_rows else None


def set_gc_policy(cbt: str, server: "Server", home: Path) -> dict:
    """`cbt setgcpolicy` of family cf to maxversions=1 (the rule it already has): a
    ModifyColumnFamilies call, which is what starts the emulator's GC loop."""
    project, instance, table = TABLE
    cmd = [cbt, "-project", project, "-instance", instance, "setgcpolicy", table, "cf", "maxversions=1"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
           "BIGTABLE_EMULATOR_HOST": server.endpoint}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        return {"command": ["cbt", *cmd[1:]], "exit_code": p.returncode,
                "output": (p.stdout + p.stderr)[-2000:]}
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"command": ["cbt", *cmd[1:]], "exit_code": None, "output": str(e)}


# ---- formatting -----------------------------------------------------------------------------

def num(x, fmt=",.0f", none="–") -> str:
    return none if x is None else format(x, fmt)


def cpu_fmt(x) -> str:
    return num(x, ".4f") if x is not None and x < 0.1 else num(x, ".3f")


def ratio(a, b) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def workload_table(name: str, what: str, bench_args: list[str], multi_row: bool, runs: list[dict]) -> str:
    reads = any(r["read_kib_per_row"] is not None for r in runs)
    lines = [f"### {name}: {what}", "",
             f"`basalt-bench {' '.join(bench_args)}` (both servers)", ""]
    head = ["server", "round", "load before", "ops/s"]
    if multi_row:
        head.append("rows/s")
    head += ["MB/s", "p50 ms", "p99 ms", "errors", "server CPU s", "CPU s / 1k req"]
    if multi_row:
        head.append("CPU s / 1k rows")
    if reads:
        head.append("KiB per row read")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + " --- |" * len(head))
    for run in sorted(runs, key=lambda r: (SERVERS.index(r["server"]), r["round"])):
        r = run["result"] or {}
        lat = r.get("latency_ms", {})
        errors = r.get("errors")
        err_cell = num(errors) if not run["problems"] else f"{num(errors)} ⚠"
        cells = [LABEL[run["server"]], str(run["round"]), f"{run['load_before']:.2f}",
                 num(r.get("ops_per_s"))]
        if multi_row:
            cells.append(num(r.get("rows_per_s")))
        cells += [num(r.get("mb_per_s"), ".1f"), num(lat.get("p50"), ".2f"), num(lat.get("p99"), ".2f"),
                  err_cell, num(run["server_cpu_seconds"], ".2f"), cpu_fmt(run["cpu_s_per_1k_requests"])]
        if multi_row:
            cells.append(cpu_fmt(run["cpu_s_per_1k_rows"]))
        if reads:
            cells.append(num(run["read_kib_per_row"], ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def medians(runs: list[dict], server: str) -> dict:
    mine = [r for r in runs if r["server"] == server and r["result"] is not None]
    get = lambda f: med([f(r) for r in mine])  # noqa: E731
    return {
        "rounds": len(mine),
        "ops_per_s": get(lambda r: r["result"]["ops_per_s"]),
        "rows_per_s": get(lambda r: r["result"]["rows_per_s"]),
        "mb_per_s": get(lambda r: r["result"]["mb_per_s"]),
        "p50_ms": get(lambda r: r["result"]["latency_ms"]["p50"]),
        "p99_ms": get(lambda r: r["result"]["latency_ms"]["p99"]),
        "cpu_s_per_1k_requests": get(lambda r: r["cpu_s_per_1k_requests"]),
        "cpu_s_per_1k_rows": get(lambda r: r["cpu_s_per_1k_rows"]),
        "errors": sum(r["result"].get("errors", 0) for r in mine),
    }


def summary_table(summary: list[tuple[str, bool, dict]]) -> str:
    head = ["workload", "Basalt ops/s", "emulator ops/s", "throughput Basalt ÷ emulator",
            "Basalt p50 / p99 ms", "emulator p50 / p99 ms",
            "Basalt CPU s / 1k req", "emulator CPU s / 1k req", "CPU per request Basalt ÷ emulator"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, multi_row, s in summary:
        b, e = s["basalt"], s["emulator"]

        def thr(m):
            t = num(m["ops_per_s"])
            return f"{t} ({num(m['rows_per_s'])} rows/s)" if multi_row and m["ops_per_s"] is not None else t

        def cpu(m):
            c = cpu_fmt(m["cpu_s_per_1k_requests"])
            return f"{c} ({cpu_fmt(m['cpu_s_per_1k_rows'])} / 1k rows)" if multi_row else c

        lines.append("| " + " | ".join([
            name, thr(b), thr(e), ratio(b["ops_per_s"], e["ops_per_s"]),
            f"{num(b['p50_ms'], '.2f')} / {num(b['p99_ms'], '.2f')}",
            f"{num(e['p50_ms'], '.2f')} / {num(e['p99_ms'], '.2f')}",
            cpu(b), cpu(e), ratio(b["cpu_s_per_1k_requests"], e["cpu_s_per_1k_requests"]),
        ]) + " |")
    return "\n".join(lines)


# ---- main -----------------------------------------------------------------------------------

def machine() -> dict:
    info = {"cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        info["mem_gib"] = round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    return info


def emulator_build(emulator: Path) -> str | None:
    try:
        snap = emulator.resolve().parents[2] / ".install" / "bigtable-linux-x86_64.snapshot.json"
        for c in json.loads(snap.read_text())["components"]:
            if c["id"].startswith("bigtable"):
                return str(c["version"].get("build_number"))
    except (OSError, IndexError, KeyError, ValueError, AttributeError):
        pass
    return None


def git_rev() -> str | None:
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return f"{rev}{' (+ uncommitted changes)' if dirty else ''}" if rev else None
    except (OSError, subprocess.SubprocessError):
        return None


def main() -> int:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", type=Path, default=target / "release",
                    help="directory of basalt-tablet-server and basalt-bench (default: %(default)s)")
    ap.add_argument("--emulator", type=Path, default=Path(DEFAULT_EMULATOR),
                    help="the Bigtable emulator binary (default: %(default)s)")
    ap.add_argument("--records", type=int, default=200_000, help="rows of 1 KiB loaded (default: %(default)s)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per run (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per server and workload (default: %(default)s)")
    ap.add_argument("--only", default="",
                    help=f"comma-separated workload rows to run, of: {', '.join(w[0] for w in WORKLOADS)}")
    ap.add_argument("--quiet-load", type=float, default=0.8,
                    help="wait before each run for the 1-minute load average to drop below this (default: %(default)s)")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="... but at most this many seconds (default: %(default)s; 0: do not wait)")
    ap.add_argument("--no-setgcpolicy", action="store_true",
                    help="do not run `cbt setgcpolicy` after the load (the emulator then never applies "
                         "the GC rule and keeps every version)")
    ap.add_argument("--out", type=Path, help="file for every raw result (JSON; default: a new temp file)")
    ap.add_argument("--keep", action="store_true", help="keep the temp directory (data, server logs)")
    args = ap.parse_args()

    names = [w[0] for w in WORKLOADS]
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in names]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    workloads = [w for w in WORKLOADS if not only or w[0] in only]
    server_bin, bench_bin = args.bin_dir / "basalt-tablet-server", args.bin_dir / "basalt-bench"
    for b in (server_bin, bench_bin, args.emulator):
        if not os.access(b, os.X_OK):
            ap.error(f"{b}: not an executable file (cargo build --release --workspace, or --bin-dir / --emulator)")
    if args.out is None:
        fd, out_name = tempfile.mkstemp(prefix="bench-vs-emulator-", suffix=".json")
        os.close(fd)
        args.out = Path(out_name)

    base = Path(tempfile.mkdtemp(prefix="bench-vs-emulator-"))
    bp, hp, ep = free_port(), free_port(), free_port()
    basalt = Server("basalt", [str(server_bin), "--standalone", "--data-dir", str(base / "basalt-data"),
                               "--listen", f"127.0.0.1:{bp}", "--http-listen", f"127.0.0.1:{hp}"],
                    bp, base, http_ready(f"http://127.0.0.1:{hp}/readyz"))
    emulator = Server("emulator", [str(args.emulator), "-host", "127.0.0.1", "-port", str(ep)],
                      ep, base, tcp_ready)
    servers = {"basalt": basalt, "emulator": emulator}
    common = ["--records", str(args.records)]
    report = {
        "settings": {"records": args.records, "duration": args.duration, "rounds": args.rounds,
                     "workloads": [w[0] for w in workloads], "quiet_load": args.quiet_load,
                     "quiet_wait": args.quiet_wait, "bin_dir": str(args.bin_dir),
                     "emulator": str(args.emulator)},
        "machine": machine(), "basalt_commit": git_rev(), "emulator_build": emulator_build(args.emulator),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "servers": {}, "load": [], "runs": [],
        "summary": {}, "problems": [], "notes": [], "setgcpolicy": [],
    }
    problems, notes = report["problems"], report["notes"]
    bench_timeout = args.duration + 180

    def note(where: str, run: dict):
        for p in run["problems"]:
            problems.append(f"{where}: {p}")
            log(f"  PROBLEM {where}: {p.splitlines()[0]}")

    try:
        for s in (basalt, emulator):
            s.start()
            report["servers"][s.name] = {"command": s.cmd, "pid": s.pid, "process": comm(s.pid),
                                         "launched_pid": s.proc.pid}
            log(f"{s.name}: {s.endpoint}, pid {s.pid} ({comm(s.pid)})")

        print(f"## Basalt vs the Bigtable emulator — {args.records:,} rows of 1 KiB, "
              f"{args.duration:g} s per run, {args.rounds} round(s)\n")
        m = report["machine"]
        print(f"- machine: {m.get('cpus')} CPUs ({m.get('cpu', '?')}), {m.get('mem_gib', '?')} GiB; "
              f"load generator on the same machine")
        print(f"- Basalt: `{server_bin}` (commit {report['basalt_commit'] or '?'}), standalone, "
              f"every acknowledged write synced")
        print(f"- emulator: `{args.emulator}` (build {report['emulator_build'] or '?'}), in memory, "
              f"not durable")
        print(f"- server CPU: utime + stime of the server process (Basalt pid {basalt.pid}, "
              f"emulator pid {emulator.pid} `{comm(emulator.pid)}`)\n", flush=True)

        # Load phase: the same command against each server.
        print("### load\n")
        print(f"`basalt-bench --workload load --records {args.records}` (both servers)\n")
        print("| server | load before | seconds | rows/s | MB/s | errors | server CPU s | "
              "CPU s / 1k rows | server RSS MiB after |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
        load_failed = False
        for name in SERVERS:
            s = servers[name]
            before = wait_quiet(args.quiet_load, args.quiet_wait)
            log(f"load {name} (load average {before:.2f}) …")
            run = run_bench(bench_bin, s, ["--workload", "load", *common],
                            timeout=max(600.0, args.records / 100))
            run.update(workload="load", round=1, load_before=before)
            annotate(run)
            report["load"].append(run)
            note(f"load {name}", run)
            load_failed |= bool(run["problems"])
            r = run["result"] or {}
            print(f"| {LABEL[name]} | {before:.2f} | {num(r.get('seconds'), '.1f')} | "
                  f"{num(r.get('rows_per_s'))} | {num(r.get('mb_per_s'), '.1f')} | "
                  f"{num(r.get('errors'))}{' ⚠' if run['problems'] else ''} | "
                  f"{num(run['server_cpu_seconds'], '.2f')} | {cpu_fmt(run['cpu_s_per_1k_rows'])} | "
                  f"{num(run['server_rss_mib'])} |", flush=True)
        print()
        if load_failed:
            raise RuntimeError("the load phase failed; the workloads would not measure the same data")

        cbt = shutil.which("cbt")
        if args.no_setgcpolicy:
            notes.append("no `cbt setgcpolicy` (--no-setgcpolicy): the emulator keeps every version it is sent")
        elif cbt is None:
            notes.append("cbt is not on PATH: no `cbt setgcpolicy`, so the emulator never runs its GC and "
                         "keeps every version it is sent (see KiB per row read)")
        else:
            (base / "cbt-home").mkdir(exist_ok=True)
            for name in SERVERS:
                r = set_gc_policy(cbt, servers[name], base / "cbt-home")
                r["server"] = name
                report["setgcpolicy"].append(r)
                if r["exit_code"] != 0:
                    problems.append(f"`{' '.join(r['command'])}` against {name} failed "
                                    f"({r['exit_code']}): {r['output'].strip()}")
            print("After the load, on both servers: `cbt setgcpolicy usertable cf maxversions=1` (the rule "
                  "the table already has; it starts the emulator's GC loop).\n", flush=True)

        summary = []
        for name, what, wargs, multi_row in workloads:
            runs = []
            for rnd in range(1, args.rounds + 1):
                for sname in SERVERS:
                    s = servers[sname]
                    if not s.alive():
                        raise RuntimeError(f"{sname} is no longer running:\n{s.logs()}")
                    before = wait_quiet(args.quiet_load, args.quiet_wait)
                    log(f"{name} round {rnd}/{args.rounds}: {sname} (load average {before:.2f}) …")
                    run = run_bench(bench_bin, s, [*wargs, *common, "--duration", f"{args.duration:g}"],
                                    timeout=bench_timeout)
                    run.update(workload=name, round=rnd, load_before=before)
                    annotate(run)
                    runs.append(run)
                    report["runs"].append(run)
                    note(f"{name} round {rnd} {sname}", run)
                    kib = run["read_kib_per_row"]
                    row_kib = (run["result"] or {}).get("row_size", 1024) / 1024
                    if kib is not None and kib > 1.5 * row_kib:
                        notes.append(f"{name} round {rnd} {sname}: reads returned {kib:.1f} KiB per row "
                                     f"(rows of {row_kib:g} KiB): more than one version per column")
                    r = run["result"] or {}
                    log(f"  {num(r.get('ops_per_s'))} ops/s, p99 {num(r.get('latency_ms', {}).get('p99'), '.2f')} ms, "
                        f"server CPU {num(run['server_cpu_seconds'], '.2f')} s, errors {num(r.get('errors'))}")
            print(workload_table(name, what, [*wargs, *common, "--duration", f"{args.duration:g}"],
                                 multi_row, runs) + "\n", flush=True)
            s = {sname: medians(runs, sname) for sname in SERVERS}
            report["summary"][name] = s
            summary.append((name, multi_row, s))

        if summary:
            print(f"### summary (median of {args.rounds} round(s))\n")
            print(summary_table(summary) + "\n")
            print("Throughput ÷ above 1: Basalt serves more; CPU per request ÷ below 1: Basalt uses less "
                  "server CPU per request. The emulator keeps rows in memory and syncs nothing.\n")
    except Exception as e:  # reported below, with whatever was measured until then
        problems.append(f"aborted: {e}")
        log(f"ABORTED: {e}")
    except KeyboardInterrupt:
        problems.append("interrupted")
        log("interrupted: stopping the servers")
    finally:
        for s in (basalt, emulator):
            s.stop()
            report["servers"].setdefault(s.name, {})["exit_code"] = s.exit_code
        if basalt.exit_code not in (0, None):
            problems.append(f"basalt exited with {basalt.exit_code} after SIGTERM:\n{basalt.logs()}")
        if problems:
            log("problems, in full:\n" + "\n".join(f"- {p}" for p in problems))
            for s in (basalt, emulator):
                log(f"{s.name} logs:\n{s.logs()}")
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        log(f"raw results: {args.out}")
        if args.keep:
            log(f"kept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    if notes:
        print(f"### notes ({len(notes)})\n")
        for n in notes:
            print(f"- {n}")
        print()
    if problems:
        print(f"### problems ({len(problems)})\n")
        for p in problems:
            print(f"- {p.splitlines()[0]}")
        print()
    print(f"Raw results: {args.out}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
