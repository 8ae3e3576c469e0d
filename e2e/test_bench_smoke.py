"""Smoke run of the load generator ``basalt-bench`` against a real server.

Asserts only that every workload completes without errors and prints its machine-readable
JSON line; performance is judged from the figures in docs/benchmarks.md, never by timed tests.
The binary is built by ``cargo build --release --workspace`` next to the server binary.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import server_binary

BENCH_TIMEOUT = 120


def bench_binary():
    path = server_binary().with_name("basalt-bench")
    if not path.exists():
        pytest.fail(f"{path} not found: build the workspace (cargo build --release --workspace)")
    return path


def run_bench(server, *args: str) -> list[dict]:
    cmd = [
        str(bench_binary()),
        "--endpoint",
        server.data_endpoint,
        "--records",
        "2000",
        "--concurrency",
        "8",
        "--progress",
        "0.5",
        *args,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BENCH_TIMEOUT)
    detail = f"{' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, detail
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert reports, detail
    for r in reports:
        assert r["errors"] == 0, detail
        assert r["errors_by_code"] == {}, detail
        assert r["ops"] > 0 and r["ok"] == r["ops"], detail
        for key in ("p50", "p90", "p99", "p999", "max"):
            assert r["latency_ms"][key] >= 0, detail
    return reports


def test_load_then_ycsb_workloads_complete_without_errors(server_factory):
    server = server_factory()
    table = "projects/bench/instances/bench/tables/ycsb"
    load, run = run_bench(server, "--table", table, "--load", "--workload", "ycsb-a", "--duration", "1")
    assert load["phase"] == "load" and load["ok"] == 20  # 2,000 records in batches of 100
    assert load["by_op"]["load"]["rows"] == 2000
    assert set(run["by_op"]) == {"read", "update"}
    assert run["misses"] == 0  # every record was loaded

    for workload, ops in [
        ("ycsb-b", {"read", "update"}),
        ("ycsb-c", {"read"}),
        ("ycsb-d", {"read", "insert"}),
        ("ycsb-e", {"scan", "insert"}),
        ("ycsb-f", {"read", "read-modify-write"}),
    ]:
        (r,) = run_bench(server, "--table", table, "--workload", workload, "--operations", "400")
        assert r["ops"] == 400, r
        assert set(r["by_op"]) <= ops, r
    server.assert_alive()


def test_raw_workloads_and_distributions_complete_without_errors(server_factory):
    server = server_factory()
    table = "projects/bench/instances/bench/tables/raw"
    (load,) = run_bench(server, "--table", table, "--workload", "load", "--columns", "4")
    assert load["by_op"]["load"]["rows"] == 2000
    for args in [
        ("--workload", "write", "--distribution", "sequential"),
        ("--workload", "batch-write", "--batch", "20", "--distribution", "zipfian"),
        ("--workload", "read", "--distribution", "uniform"),
        ("--workload", "scan", "--scan-rows", "50"),
    ]:
        (r,) = run_bench(server, "--table", table, "--columns", "4", "--duration", "1", *args)
        assert r["misses"] == 0, r
        if args[1] == "scan":
            assert r["mb_per_s"] > 0
    server.assert_alive()
