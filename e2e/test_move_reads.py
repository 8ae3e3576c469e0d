"""Reads while tablets move (local runtime: real etcd, tablet servers and master processes on
127.0.0.1). A read must see every write acknowledged before it began, or be retried by the
frontend on the tablet's new owner — never end early with fewer rows.

* ``test_a_slow_scan_through_the_source_sees_every_row_of_a_tablet_that_moved_meanwhile``:
  deterministic. Fail points hold a move at each of its phases in turn; at every phase, scans
  with a value filter start through the move's source server and stop reading after their first
  response (a slow consumer: gRPC flow control stalls the frontend inside an earlier tablet,
  owned by another server). They resume only after the move committed and the source deleted
  its copy; each must still return every row acknowledged before it began, the moved
  tablet's included. (Before the fix, the frontend read the moved tablet from the source's
  store as its old plan said, after the release had deleted it, and ended without its rows.)
* ``test_every_read_shape_sees_every_acknowledged_write_while_tablets_split_and_move``:
  randomized and bounded in time. Low split thresholds and a scale-out keep the master
  splitting and moving tablets while writers write and write-then-read loops, through
  every server (most rows are another server's), check each read shape against the writes
  acknowledged before it began.
"""

from __future__ import annotations

import random
import threading
import time

import grpc
from google.api_core import exceptions as gexc
from google.cloud.bigtable_v2.services.bigtable import BigtableClient
from google.cloud.bigtable_v2.services.bigtable.transports import BigtableGrpcTransport
from google.cloud.bigtable_v2.types import bigtable as v2
from google.cloud.bigtable_v2.types import data as v2data

import btlib
import localrt
from localrt import wait
from btlib import GapicClients
from conftest import free_port

PROJECT = "move-reads-p"


def tname(instance: str, tid: str) -> str:
    return btlib.table_name(tid, instance, PROJECT)


def create_table(rt: localrt.LocalRuntime, instance: str, tid: str, splits: list[bytes],
                 families: dict | None = None):
    client = GapicClients(rt.servers()[0]["grpc"])
    try:
        client.admin.create_table(
            request=btlib.admin_types.CreateTableRequest(
                parent=btlib.instance_name(instance, PROJECT), table_id=tid,
                table=btlib.Table(column_families=families or {"cf": btlib.column_family()}),
                initial_splits=[btlib.admin_types.CreateTableRequest.Split(key=k) for k in splits]),
            timeout=60)
    finally:
        client.close()



def settled(cl: localrt.EtcdCluster, tablets: int | None = None) -> bool:
    ts = cl.tablets()
    names = cl.names()
    return (not cl.moves() and all(t["state"] == "serving" and t["owner"] in names for t in ts)
            and (tablets is None or len(ts) == tablets))


def server_of(rt: localrt.LocalRuntime, cl: localrt.EtcdCluster, store_id: str) -> dict:
    name = cl.names()[store_id]
    return next(s for s in rt.servers() if s["name"] == name)


def key_range(start: bytes, end: bytes | None) -> v2data.RowRange:
    r = v2data.RowRange(start_key_closed=start)
    if end:
        r.end_key_open = end
    return r


# ------------------------------------------------------------------- the deterministic one

# Every phase of a move held in turn, by the master or by the servers. The snapshot's chunks
# are held each; the rest (the catch-up too) once per move.
HOLDS = {
    "move-before-snapshot": 1500,
    "move-source-mid-stream": 400,
    "move-destination-catch-up": 100,
    "move-before-fence": 1500,
    "move-after-fence": 1000,
    "move-source-after-fence": 500,
    "move-before-commit": 1000,
    "move-after-commit": 1500,
}
SPLITS = [b"g", b"n", b"t"]            # 4 tablets: [-g) [g-n) [n-t) [t-)
BIG_PREFIXES = [b"c", b"j", b"q", b"w"]  # one in each tablet
BIG_ROWS = 24                          # per tablet
BIG_VALUE = 256 << 10                  # bytes: 6 MiB per tablet on the wire
# A slow consumer: gRPC's receive window stays small (no BDP growth), so a client that stops
# reading stalls the server's stream after a few hundred KiB.
SLOW_OPTIONS = btlib.GRPC_OPTIONS + [("grpc.http2.bdp_probe", 0)]


def tablet_of(key: bytes) -> int:
    return sum(1 for s in SPLITS if key >= s)


class SlowScan(threading.Thread):
    """A ReadRows through one server that reads its first response, then waits for ``go``
    before reading the rest."""

    def __init__(self, endpoint: str, table: str, ranges, reversed_: bool, go: threading.Event,
                 phase: str, acked_before: set[bytes]):
        super().__init__(daemon=True)
        self.endpoint, self.table, self.ranges, self.reversed = endpoint, table, ranges, reversed_
        self.go, self.phase, self.acked_before = go, phase, acked_before
        self.started = threading.Event()
        self.rows: list[bytes] | None = None
        self.error: str | None = None

    def run(self):
        channel = grpc.insecure_channel(self.endpoint, options=SLOW_OPTIONS)
        data = BigtableClient(transport=BigtableGrpcTransport(channel=channel))
        try:
            req = v2.ReadRowsRequest(
                table_name=self.table, reversed=self.reversed,
                rows=v2data.RowSet(row_ranges=self.ranges),
                # A value filter, as the scan that first missed a row had (values are never
                # empty: it keeps every cell).
                filter=btlib.f_value_range(start_open=b""))
            stream = iter(data.read_rows(request=req, retry=None, timeout=240))
            first = next(stream)
            self.started.set()
            self.go.wait(240)
            rows = btlib.merge_chunks(_chain(first, stream), reversed_=self.reversed)
            self.rows = [r.key for r in rows]
        except (gexc.GoogleAPICallError, StopIteration, AssertionError) as e:
            self.error = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            self.started.set()
            channel.close()


def _chain(first, rest):
    yield first
    yield from rest


def test_a_slow_scan_through_the_source_sees_every_row_of_a_tablet_that_moved_meanwhile(tmp_path):
    instance, cluster = "slow-scan", "slow-scan-c1"
    rt = localrt.LocalRuntime(
        tmp_path, localrt.manifest(instance, PROJECT, cluster, 2), f"127.0.0.1:{free_port()}",
        env={"FAILPOINTS": ";".join(f"{p}=return({ms})" for p, ms in HOLDS.items()),
             "BASALT_MOVES_PER_CLUSTER": "1"}).start()
    cl = localrt.EtcdCluster(rt, instance, cluster)
    table = tname(instance, "t")
    go = threading.Event()
    scans: list[SlowScan] = []
    acked: dict[bytes, float] = {}
    stop = threading.Event()
    writer_errors: list[str] = []
    try:
        create_table(rt, instance, "t", SPLITS)
        wait("4 tablets on 2 servers", lambda: sorted(cl.owners().values()) == [2, 2], 30, rt, every=0.1)
        client = GapicClients(rt.servers()[0]["grpc"])
        big = b"v" * BIG_VALUE
        for p in BIG_PREFIXES:
            entries = [(p + b"-big-%02d" % i, [btlib.set_cell("cf", b"q", big, 1000)])
                       for i in range(BIG_ROWS)]
            assert set(btlib.mutate_rows(client.data, table, entries)) == {"OK"}
            for k, _ in entries:
                acked[k] = time.monotonic()

        def writer():
            """Small rows into every tablet for the whole test, through the first server."""
            w = GapicClients(rt.servers()[0]["grpc"])
            n = 0
            try:
                while not stop.is_set():
                    key = b"%s-small-%05d" % (BIG_PREFIXES[n % 4], n)
                    try:
                        btlib.mutate_row(w.data, table, key,
                                         [btlib.set_cell("cf", b"q", b"s%d" % n, 1000)], timeout=30)
                        acked[key] = time.monotonic()
                    except gexc.GoogleAPICallError as e:
                        writer_errors.append(f"{key!r}: {str(e)[:200]}")
                    n += 1
                    time.sleep(0.05)
            finally:
                w.close()

        threading.Thread(target=writer, daemon=True).start()
        before = {t["start"]: t for t in cl.tablets()}
        assert rt.apply(localrt.manifest(instance, PROJECT, cluster, 3)).returncode == 0
        move = wait("a move to the new server", lambda: (cl.moves() or [None])[0], 60, rt, every=0.02)
        source = server_of(rt, cl, move["from"])
        moving = before[move["start"]]
        t_index = tablet_of(bytes.fromhex(moving["start"]))
        # Tablets of the other server, before and after the moving one: a scan stalls inside
        # one of them (forwarded) while its plan still names the source for the moving one.
        others = sorted(tablet_of(bytes.fromhex(t["start"]))
                        for t in before.values() if t["owner"] != move["from"])
        shapes = []
        if any(i < t_index for i in others):
            first = max(i for i in others if i < t_index)
            start = SPLITS[first - 1] if first else b""
            shapes.append(([key_range(start, None)], False))
        if any(i > t_index for i in others):
            last = min(i for i in others if i > t_index)
            end = SPLITS[last] if last < len(SPLITS) else None
            shapes.append(([key_range(b"", end)], True))
        assert shapes, (before, move)

        # Scans start all through the move, phase by phase, until its record is gone.
        phases_seen = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            moves = cl.moves()
            phase = moves[0]["phase"] if moves else "committed"
            for ranges, reversed_ in shapes:
                scan = SlowScan(source["grpc"], table, ranges, reversed_, go, phase, set(acked.copy()))
                scan.start()
                assert scan.started.wait(60), "no first response"
                assert scan.error is None, scan.error
                scans.append(scan)
            phases_seen.add(phase)
            if not moves:
                break
            time.sleep(0.5)
        print(f"move of tablet {moving['start']!r} from {source['name']}: {len(scans)} scans "
              f"started in phases {sorted(phases_seen)}")
        assert {"copying", "fencing", "committed"} <= phases_seen, phases_seen
        # The move is over and the source gave the tablet up (its rows are deleted there).
        wait("the moves to end", lambda: settled(cl), 120, rt, every=0.1)
        after = {t["start"]: t for t in cl.tablets()}
        assert after[moving["start"]]["owner"] != moving["owner"], (moving, after)
        time.sleep(1.0)
        go.set()
        for scan in scans:
            scan.join(240)
        stop.set()

        missing = []
        for scan in scans:
            assert scan.error is None, (scan.phase, scan.error)
            got = set(scan.rows)
            assert len(got) == len(scan.rows), "a row came twice"
            (rng,) = scan.ranges
            lo, hi = rng.start_key_closed, rng.end_key_open or None
            want = {k for k in scan.acked_before if k >= lo and (hi is None or k < hi)}
            lost = want - got
            if lost:
                missing.append((scan.phase, scan.reversed, len(lost), sorted(lost)[:3]))
        assert not missing, f"scans missed acknowledged rows: {missing}"
        assert writer_errors == [], writer_errors[:5]
        client.close()
    finally:
        go.set()
        stop.set()
        if rt.running():
            assert rt.stop() == 0, rt.logs()


# ----------------------------------------------------------------- the randomized check

RUN_SECONDS = 45
CHECK_SPLITS = [b"e", b"j", b"o", b"t"]


def counter_value(row) -> int:
    """The newest value of ``cf:n`` of a row (cells come newest first within a column)."""
    cell = next(c for c in row.cells if c.family == "cf" and c.qualifier == b"n")
    return int.from_bytes(cell.value, "big", signed=True)


class Checker(threading.Thread):
    """Writes a new row through one server, then reads it back with one read shape after
    another, through the same server; every read must see it (it was acknowledged before the
    read began). Keeps a counter of its own and checks each increment's answer."""

    def __init__(self, idx: int, endpoints: list[str], table: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.idx, self.endpoints, self.table, self.stop = idx, endpoints, table, stop
        self.misses: list[str] = []
        self.errors: list[str] = []
        self.checks = 0
        self.counter = 0
        self.acked: list[bytes] = []

    def run(self):
        clients = [GapicClients(e) for e in self.endpoints]
        rnd = random.Random(self.idx)
        counter_row = b"%s-counter-%d" % (b"aeiouy"[self.idx % 6:self.idx % 6 + 1], self.idx)
        n = 0
        try:
            while not self.stop.is_set():
                c = rnd.choice(clients).data
                key = b"%s-check-%d-%05d" % (bytes([rnd.choice(b"abcdefghijklmnopqrstuvwxyz")]),
                                             self.idx, n)
                value = b"checked-%d-%d" % (self.idx, n)
                n += 1
                try:
                    btlib.mutate_row(c, self.table, key, [btlib.set_cell("cf", b"q", value, 1000)],
                                     timeout=30)
                except gexc.GoogleAPICallError as e:
                    self.errors.append(f"write {key!r}: {str(e)[:200]}")
                    continue
                self.acked.append(key)
                try:
                    self.check(rnd, clients, key, value, counter_row)
                except gexc.GoogleAPICallError as e:
                    self.errors.append(f"read {key!r}: {str(e)[:200]}")
        finally:
            for cl in clients:
                cl.close()

    def miss(self, shape: str, key: bytes, got):
        self.misses.append(f"{shape} missed {key!r}: {str(got)[:200]}")

    def check(self, rnd, clients, key, value, counter_row):
        literal = btlib.f_value(value)
        c = rnd.choice(clients).data
        shapes = ["scan", "reversed", "limited", "point", "range", "check-and-mutate", "rmw",
                  "sample"]
        shape = shapes[self.checks % len(shapes)]
        self.checks += 1
        if shape == "scan":
            rows = btlib.read_rows(c, self.table, filter=literal, timeout=60)
            if [r.key for r in rows] != [key]:
                self.miss(shape, key, [r.key for r in rows])
        elif shape == "reversed":
            rows = btlib.read_rows(c, self.table, filter=literal, reversed=True, timeout=60)
            if [r.key for r in rows] != [key]:
                self.miss(shape, key, [r.key for r in rows])
        elif shape == "limited":
            # From a random point before the row, as many rows as lie before it, plus one.
            rows = btlib.read_rows(c, self.table, ranges=[key_range(key[:1], None)],
                                   filter=btlib.f_chain(btlib.f_value(rb"checked-.*"),
                                                        btlib.f_row_key(key)),
                                   limit=1, timeout=60)
            if [r.key for r in rows] != [key]:
                self.miss(shape, key, [r.key for r in rows])
        elif shape == "point":
            rows = btlib.read_rows(c, self.table, keys=[key], timeout=60)
            if len(rows) != 1 or rows[0].key != key:
                self.miss(shape, key, rows)
        elif shape == "range":
            rows = btlib.read_rows(c, self.table, ranges=[key_range(key, key + b"\x00")],
                                   filter=literal, timeout=60)
            if [r.key for r in rows] != [key]:
                self.miss(shape, key, [r.key for r in rows])
        elif shape == "check-and-mutate":
            # Nothing to write when it matches: the answer alone says what was read.
            if not btlib.check_and_mutate(c, self.table, key, predicate=literal,
                                          false=[btlib.set_cell("cf", b"miss", b"1", 1000)]):
                self.miss(shape, key, "predicate did not match")
        elif shape == "rmw":
            row = btlib.read_modify_write(c, self.table, counter_row,
                                          [btlib.rmw_increment("cf", b"n", 1)], timeout=30)
            self.counter += 1
            got = counter_value(row)
            if got != self.counter:
                self.miss(shape, counter_row, f"counter {got}, {self.counter} increments acknowledged")
        elif shape == "sample":
            samples = btlib.sample_row_keys(c, self.table)
            offsets = [o for _, o in samples]
            if not samples or samples[-1][0] != b"" or offsets != sorted(offsets):
                self.miss(shape, key, samples)


def test_every_read_shape_sees_every_acknowledged_write_while_tablets_split_and_move(tmp_path):
    instance, cluster = "read-shapes", "read-shapes-c1"
    rt = localrt.LocalRuntime(
        tmp_path, localrt.manifest(instance, PROJECT, cluster, 3), f"127.0.0.1:{free_port()}",
        # Splits by load at a low rate, and moves as often as the master may.
        env={"BASALT_SPLIT_REQUESTS_PER_SEC": "150", "BASALT_MOVES_PER_CLUSTER": "3",
             "BASALT_BALANCE_TOLERANCE": "0.05"}).start()
    cl = localrt.EtcdCluster(rt, instance, cluster)
    table = tname(instance, "shapes")
    stop = threading.Event()
    try:
        create_table(rt, instance, "shapes", CHECK_SPLITS)
        wait("5 tablets on 3 servers", lambda: sorted(cl.owners().values()) == [1, 2, 2], 30, rt, every=0.1)
        endpoints = [s["grpc"] for s in rt.servers()]
        tablets_before = len(cl.tablets())
        writes: list[bytes] = []
        write_errors: list[str] = []

        def writer(idx: int):
            """MutateRows of 100 random rows at a time (about 10 a second), through every server
            in turn."""
            clients = [GapicClients(e) for e in endpoints]
            rnd = random.Random(1000 + idx)
            n = 0
            try:
                while not stop.is_set():
                    keys = [b"%s-bulk-%d-%06d" % (bytes([rnd.choice(b"abcdefghijklmnopqrstuvwxyz")]),
                                                   idx, n + i) for i in range(100)]
                    n += 100
                    try:
                        codes = btlib.mutate_rows(clients[n % len(clients)].data, table,
                                                  [(k, [btlib.set_cell("cf", b"q", b"bulk", 1000)])
                                                   for k in keys], timeout=30)
                    except gexc.GoogleAPICallError as e:
                        write_errors.append(str(e)[:200])
                        continue
                    writes.extend(k for k, code in zip(keys, codes) if code == "OK")
                    write_errors.extend(f"{k!r}: {code}" for k, code in zip(keys, codes) if code != "OK")
                    time.sleep(0.1)
            finally:
                for c in clients:
                    c.close()

        writers = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(2)]
        checkers = [Checker(i, endpoints, table, stop) for i in range(4)]
        for t in writers + checkers:
            t.start()
        time.sleep(RUN_SECONDS / 3)
        # A fourth server: the balancer moves tablets to it while the splits go on.
        assert rt.apply(localrt.manifest(instance, PROJECT, cluster, 4)).returncode == 0
        time.sleep(RUN_SECONDS * 2 / 3)
        stop.set()
        for t in writers + checkers:
            t.join(120)
        misses = [m for c in checkers for m in c.misses]
        errors = [e for c in checkers for e in c.errors] + write_errors
        checks = sum(c.checks for c in checkers)
        tablets_after = len(cl.tablets())
        master_log = (rt.data_dir / "logs" / f"{instance}-master.log").read_text(errors="replace")
        moved = master_log.count("tablet moved")
        print(f"{checks} checked reads, {len(writes)} bulk rows, tablets {tablets_before} → "
              f"{tablets_after}, {moved} moves, owners {cl.owners()}")
        assert misses == [], misses[:10]
        assert errors == [], errors[:10]
        assert checks > 200, checks
        # The master did split and move while the reads ran.
        assert tablets_after > tablets_before, (tablets_before, tablets_after)
        assert moved >= 2, moved
        assert len(cl.owners()) == 4, cl.owners()

        # Afterwards: every acknowledged write present exactly once, counters exact, one
        # owner per tablet.
        wait("the moves to end", lambda: settled(cl), 120, rt, every=0.1)
        client = GapicClients(rt.endpoint)
        try:
            rows = btlib.read_rows(client.data, table, timeout=120)
        finally:
            client.close()
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)), "a row twice"
        present = set(keys)
        acked = set(writes) | {k for c in checkers for k in c.acked}
        assert not acked - present, sorted(acked - present)[:10]
        counters = {r.key: r for r in rows if b"-counter-" in r.key}
        for c in checkers:
            row = counters.get(b"%s-counter-%d" % (b"aeiouy"[c.idx % 6:c.idx % 6 + 1], c.idx))
            got = counter_value(row) if row else 0
            assert got == c.counter, (c.idx, got, c.counter)
        starts = [t["start"] for t in cl.tablets()]
        assert len(starts) == len(set(starts)), "a tablet twice in the map"
    finally:
        stop.set()
        if rt.running():
            assert rt.stop() == 0, rt.logs()
