"""Operations: health endpoints, Prometheus metrics, --help, SIGTERM, PingAndWarm."""

import os
import subprocess

import pytest
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2 import types as v2

from btlib import (
    INSTANCE_NAME,
    Cell,
    Row,
    create_table,
    http_get,
    mutate_row,
    read_rows,
    scrape,
    set_cell,
    table_name,
)
from conftest import BasaltServer, server_binary


def test_healthz_and_readyz(bt):
    for path in ("/healthz", "/readyz"):
        status, _, _ = http_get(f"{bt.server.http_url}{path}")
        assert status == 200, path


def test_unknown_http_path_is_404(bt):
    status, _, _ = http_get(f"{bt.server.http_url}/no-such-page")
    assert status == 404


def test_metrics_exposition_has_the_documented_families(bt):
    t = bt.table(["cf"])
    t.write(b"r", ("cf", b"q", 1000, b"v"))
    t.read()
    status, headers, body = http_get(f"{bt.server.http_url}/metrics")
    assert status == 200
    assert headers.get("Content-Type", headers.get("content-type", "")).startswith("text/plain")
    m = scrape(bt.server.http_url)
    expected_types = {
        "basalt_grpc_requests_total": "counter",
        "basalt_grpc_request_duration_seconds": "histogram",
        "basalt_rows_read_total": "counter",
        "basalt_rows_written_total": "counter",
        "basalt_bytes_read_total": "counter",
        "basalt_bytes_written_total": "counter",
        "basalt_storage_bytes": "gauge",
        "basalt_compaction_pending_bytes": "gauge",
    }
    for name, typ in expected_types.items():
        assert m.types.get(name) == typ, f"# TYPE of {name}: {m.types.get(name)!r}"
    names = m.names()
    for name in ("basalt_rows_read_total", "basalt_rows_written_total", "basalt_bytes_read_total",
                 "basalt_bytes_written_total", "basalt_storage_bytes", "basalt_compaction_pending_bytes",
                 "basalt_grpc_request_duration_seconds_bucket", "basalt_grpc_request_duration_seconds_sum",
                 "basalt_grpc_request_duration_seconds_count"):
        assert name in names, f"{name} missing from /metrics"
    assert m.find("basalt_grpc_requests_total", rpc="MutateRow", code="OK")
    assert m.find("basalt_grpc_request_duration_seconds_count", rpc="ReadRows")
    assert m.find("basalt_grpc_request_duration_seconds_bucket", rpc="MutateRow", le="+Inf")
    assert m.value("basalt_storage_bytes") >= 0
    assert m.value("basalt_compaction_pending_bytes") >= 0


def test_metrics_count_traffic(bt):
    t = bt.table(["cf"])
    url = bt.server.http_url
    before = scrape(url)
    value = b"x" * 10_000
    for i in range(3):
        t.write(b"r%d" % i, ("cf", b"q", 1000, value))
    assert t.mutate_rows([(b"m%d" % i, [set_cell("cf", b"q", value, 1000)]) for i in range(4)]) == ["OK"] * 4
    rows = t.read()
    assert len(rows) == 7
    with pytest.raises(gexc.NotFound):
        mutate_row(bt.data, table_name("no-such-table"), b"r", [set_cell("cf", b"q", b"v", 1000)])
    after = scrape(url)

    def delta(name, **labels):
        return after.value(name, **labels) - before.value(name, **labels)

    assert delta("basalt_grpc_requests_total", rpc="MutateRow", code="OK") >= 3
    assert delta("basalt_grpc_requests_total", rpc="MutateRows", code="OK") >= 1
    assert delta("basalt_grpc_requests_total", rpc="ReadRows", code="OK") >= 1
    assert delta("basalt_grpc_requests_total", rpc="MutateRow", code="NOT_FOUND") >= 1
    assert delta("basalt_grpc_request_duration_seconds_count", rpc="MutateRow") >= 4
    assert delta("basalt_rows_written_total") >= 7
    assert delta("basalt_bytes_written_total") >= 7 * len(value)
    assert delta("basalt_rows_read_total") >= 7
    assert delta("basalt_bytes_read_total") >= 7 * len(value)
    # The server's CPU: the time it used grew with the requests, and its allocation says
    # where it comes from (no flag here: the cgroup's limit or the machine's cores).
    assert after.types.get("process_cpu_seconds_total") == "counter"
    assert delta("process_cpu_seconds_total") > 0
    cores = [(lab, val) for n, lab, val in after.samples if n == "basalt_cpu_allocation_cores"]
    assert len(cores) == 1 and cores[0][0]["source"] in ("cgroup-limit", "machine"), cores
    assert 0 < cores[0][1] <= (os.cpu_count() or 1)


def test_tablets_gauge_counts_every_table_split(bt):
    url = bt.server.http_url
    before = scrape(url).value("basalt_tablets")
    t = bt.table(["cf"], splits=[b"g", b"p", b"w"])
    assert scrape(url).value("basalt_tablets") == before + 4
    bt.admin.delete_table(name=t.name)
    bt.created.remove(t)
    assert scrape(url).value("basalt_tablets") == before


def test_help_mentions_every_flag():
    out = subprocess.run([str(server_binary()), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    for flag in (
        "--standalone",
        "--data-dir",
        "--listen",
        "--http-listen",
        "--cluster-id",
        "--tombstone-grace-secs",
        "--block-cache-mib",
        "--shutdown-timeout-secs",
        "--log-format",
    ):
        assert flag in out.stdout, f"{flag} not in --help output:\n{out.stdout}"


def test_block_cache_size_flag(tmp_path):
    """--block-cache-mib sizes the block cache: a small cache serves correctly; a bad value is
    refused at startup with a message naming the flag."""
    from conftest import BasaltServer

    server = BasaltServer(tmp_path / "small-cache", extra_args=("--block-cache-mib", "1"))
    server.start()
    try:
        c = server.clients()
        create_table(c.admin, "t", ["cf"])
        rows = [(b"r%03d" % i, [set_cell("cf", b"q", b"v" * 4096, 1000)]) for i in range(300)]
        from btlib import mutate_rows

        assert mutate_rows(c.data, table_name("t"), rows) == ["OK"] * 300
        got = read_rows(c.data, table_name("t"))
        assert [r.key for r in got] == [k for k, _ in rows]
        c.close()
    finally:
        server.stop()
    bad = subprocess.run(
        [str(server_binary()), "--standalone", "--data-dir", str(tmp_path / "x"), "--block-cache-mib", "lots"],
        capture_output=True, text=True, timeout=30,
    )
    assert bad.returncode == 2 and "--block-cache-mib" in bad.stderr, bad.stderr


def test_sigterm_exits_zero_and_data_survives(server_factory):
    server = server_factory()
    c = server.clients()
    create_table(c.admin, "t", ["cf"])
    mutate_row(c.data, table_name("t"), b"r", [set_cell("cf", b"q", b"survives", 1000)])
    c.close()
    assert server.stop() == 0
    with pytest.raises(OSError):
        http_get(f"{server.http_url}/healthz", timeout=1)
    server.start()
    c = server.clients()
    assert read_rows(c.data, table_name("t")) == [Row(b"r", [Cell("cf", b"q", 1000, b"survives")])]
    c.close()


def test_sigterm_with_open_client_connection(server_factory):
    server = server_factory()
    c = server.clients()
    create_table(c.admin, "t", ["cf"])
    mutate_row(c.data, table_name("t"), b"r", [set_cell("cf", b"q", b"v", 1000)])
    # channel stays open while the server shuts down
    assert server.stop() == 0
    c.close()


def test_second_server_on_same_data_dir_refuses_to_start(server_factory):
    first = server_factory()
    second = BasaltServer(first.base_dir)  # same data dir, new ports, new log files
    second.generation = 100
    server_factory.servers.append(second)  # stopped at teardown if it did start after all
    with pytest.raises(AssertionError, match="exited with code"):
        second.start(timeout=15)
    assert second.proc.returncode != 0
    status, _, _ = http_get(f"{first.http_url}/healthz")
    assert status == 200


def test_ping_and_warm(bt):
    resp = bt.data.ping_and_warm(request=v2.PingAndWarmRequest(name=INSTANCE_NAME), timeout=10)
    assert isinstance(resp, v2.PingAndWarmResponse)
    resp = bt.data.ping_and_warm(
        request=v2.PingAndWarmRequest(name="projects/other/instances/whatever", app_profile_id="default"), timeout=10
    )
    assert isinstance(resp, v2.PingAndWarmResponse)


def start_64_mib_scan(server):
    """16 rows of 4 MiB (64 MiB: far more than gRPC's flow-control windows hold, so most of it
    is still to be produced by the server when a signal arrives), and a ReadRows of them whose
    first response has been received. Returns the clients, the stream and that response."""
    c = server.clients()
    create_table(c.admin, "t", ["cf"])
    value = b"x" * (4 * 1024 * 1024)
    for i in range(16):
        mutate_row(c.data, table_name("t"), b"r%02d" % i, [set_cell("cf", b"q", value, 1000)])
    stream = c.data.read_rows(request=v2.ReadRowsRequest(table_name=table_name("t")), retry=None, timeout=60)
    return c, stream, next(iter(stream))


def test_sigterm_refuses_new_requests_while_in_flight_ones_finish(server_factory):
    """While a scan is still in flight after SIGTERM, the server stays up for it, and a new
    request is refused with UNAVAILABLE before it touches anything (nothing is written); once
    the scan is read to its end, the server exits 0."""
    import signal
    import time

    from btlib import GapicClients

    server = server_factory()
    c, stream, first = start_64_mib_scan(server)
    rows = sum(1 for ch in first.chunks if ch.commit_row)
    # The client reads no further: HTTP/2 flow control holds most of the 64 MiB in the server.
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert server.proc.poll() is None, "the server must wait for the scan in flight"
    other = GapicClients(server.data_endpoint)
    with pytest.raises(gexc.ServiceUnavailable, match="shutting down"):
        mutate_row(other.data, table_name("t"), b"late", [set_cell("cf", b"q", b"v", 1000)])
    other.close()
    for resp in stream:
        rows += sum(1 for ch in resp.chunks if ch.commit_row)
    assert rows == 16
    assert server.stop() == 0
    c.close()
    # Restarted, the refused write is not there.
    server.start()
    c = server.clients()
    keys = [r.key for r in read_rows(c.data, table_name("t"))]
    assert keys == [b"r%02d" % i for i in range(16)]
    c.close()


def test_sigterm_lets_an_in_flight_read_finish(server_factory):
    """Graceful shutdown: a ReadRows stream already under way when SIGTERM arrives is served to
    its end, then the server exits 0."""
    import signal

    server = server_factory()
    c, stream, first = start_64_mib_scan(server)
    received = len(first.chunks)
    total = sum(len(ch.value) for ch in first.chunks)
    server.proc.send_signal(signal.SIGTERM)
    for resp in stream:
        received += len(resp.chunks)
        total += sum(len(ch.value) for ch in resp.chunks)
    # 16 rows × 4 MiB in 1 MiB chunks, every byte of them.
    assert received == 64
    assert total == 64 * 1024 * 1024
    assert server.stop() == 0
    c.close()
