"""Small helpers shared by the e2e tests.

Everything here talks to the server through the public Google client libraries
(GAPIC clients on an insecure channel) and returns plain Python values, so a test
can assert exactly what a user would see:

    rows = t.read(keys=[b"r1"])
    assert rows == [Row(b"r1", [Cell("cf", b"q", 1000, b"v")])]
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import urllib.error
import urllib.request
from collections import namedtuple
from datetime import timedelta
from typing import Iterable, Sequence

import grpc
from google.cloud import bigtable_admin_v2, bigtable_v2
from google.cloud.bigtable_admin_v2 import types as admin_types
from google.cloud.bigtable_admin_v2.services.bigtable_table_admin.transports import (
    BigtableTableAdminGrpcTransport,
)
from google.cloud.bigtable_v2 import types as v2
from google.cloud.bigtable_v2.services.bigtable.transports import BigtableGrpcTransport
from google.protobuf import field_mask_pb2
from google.rpc import code_pb2

# The suite runs against a standalone server (any instance name) or, with BASALT_E2E_CLUSTER=1,
# against a cluster of the local runtime, which serves only its own instance.
PROJECT = os.environ.get("BASALT_E2E_PROJECT", "p")
INSTANCE = os.environ.get("BASALT_E2E_INSTANCE", "i")
INSTANCE_NAME = f"projects/{PROJECT}/instances/{INSTANCE}"

MiB = 1024 * 1024
MAX_ROW_KEY = 4096
MAX_QUALIFIER = 16 * 1024
MAX_VALUE = 100 * MiB
MAX_MUTATIONS = 100_000
SERVER_TIME = -1

# Channel options for every channel the tests build themselves: unlimited message
# sizes (100 MiB cells) and a short reconnect backoff (servers get restarted).
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]

Table = admin_types.Table
GcRule = admin_types.GcRule
View = admin_types.Table.View
RowRange = v2.RowRange


def instance_name(instance: str = INSTANCE, project: str = PROJECT) -> str:
    return f"projects/{project}/instances/{instance}"


def table_name(table_id: str, instance: str = INSTANCE, project: str = PROJECT) -> str:
    return f"{instance_name(instance, project)}/tables/{table_id}"


def b(x) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)


def now_micros() -> int:
    """Wall-clock 'now' in microseconds, aligned to milliseconds (MILLIS granularity)."""
    return (time.time_ns() // 1_000_000) * 1000


def digest(data: bytes) -> str:
    """Compare big values through this: pytest must never diff 100 MiB of bytes."""
    return f"{len(data)}:{hashlib.sha256(data).hexdigest()}"


# --------------------------------------------------------------------------- clients


class GapicClients:
    """GAPIC data + admin clients on one channel (unlimited message size): insecure, or the
    secure ``channel`` given (see ``secure_channel``)."""

    def __init__(self, endpoint: str, channel: grpc.Channel | None = None):
        self.endpoint = endpoint
        self.channel = channel or grpc.insecure_channel(endpoint, options=GRPC_OPTIONS)
        self.data = bigtable_v2.BigtableClient(
            transport=BigtableGrpcTransport(channel=self.channel)
        )
        self.admin = bigtable_admin_v2.BigtableTableAdminClient(
            transport=BigtableTableAdminGrpcTransport(channel=self.channel)
        )

    def instance_admin(self) -> bigtable_admin_v2.BigtableInstanceAdminClient:
        from google.cloud.bigtable_admin_v2.services.bigtable_instance_admin.transports import (
            BigtableInstanceAdminGrpcTransport,
        )
        return bigtable_admin_v2.BigtableInstanceAdminClient(
            transport=BigtableInstanceAdminGrpcTransport(channel=self.channel))

    def close(self):
        self.channel.close()


def secure_channel(endpoint: str, ca: bytes, key: bytes | None = None, cert: bytes | None = None,
                   token: str | None = None, server_name: str | None = None) -> grpc.Channel:
    """A TLS channel trusting ``ca``, with a client certificate and/or a bearer token (sent as
    ``authorization: Bearer``, as the official clients' OAuth credentials send it);
    ``server_name``: the name the server's certificate is checked against instead of the
    endpoint's host (a server dialled by its pod IP)."""
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                         certificate_chain=cert)
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    options = list(GRPC_OPTIONS)
    if server_name is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(endpoint, creds, options=options)


# ------------------------------------------------------------------------- mutations


def set_cell(family: str, qualifier, value, ts: int) -> v2.Mutation:
    return v2.Mutation(
        set_cell=v2.Mutation.SetCell(
            family_name=family,
            column_qualifier=b(qualifier),
            timestamp_micros=ts,
            value=b(value),
        )
    )


def delete_from_column(family: str, qualifier, start: int | None = None, end: int | None = None):
    kw = {}
    if start is not None or end is not None:
        tr = {}
        if start is not None:
            tr["start_timestamp_micros"] = start
        if end is not None:
            tr["end_timestamp_micros"] = end
        kw["time_range"] = v2.TimestampRange(**tr)
    return v2.Mutation(
        delete_from_column=v2.Mutation.DeleteFromColumn(
            family_name=family, column_qualifier=b(qualifier), **kw
        )
    )


def delete_from_family(family: str) -> v2.Mutation:
    return v2.Mutation(delete_from_family=v2.Mutation.DeleteFromFamily(family_name=family))


def delete_from_row() -> v2.Mutation:
    return v2.Mutation(delete_from_row=v2.Mutation.DeleteFromRow())


def raw_set_cells(family: str, qualifiers: Iterable, value: bytes, ts: int):
    """Many SetCell mutations as raw protobufs (fast to build, for 100k-mutation tests)."""
    pb_mutation = v2.Mutation.pb()
    pb_set = v2.Mutation.SetCell.pb()
    return [
        pb_mutation(
            set_cell=pb_set(family_name=family, column_qualifier=b(q), timestamp_micros=ts, value=value)
        )
        for q in qualifiers
    ]


# --------------------------------------------------------------------------- filters


def f_pass_all() -> v2.RowFilter:
    return v2.RowFilter(pass_all_filter=True)


def f_block_all() -> v2.RowFilter:
    return v2.RowFilter(block_all_filter=True)


def f_cells_per_column(n: int) -> v2.RowFilter:
    return v2.RowFilter(cells_per_column_limit_filter=n)


def f_chain(*filters: v2.RowFilter) -> v2.RowFilter:
    return v2.RowFilter(chain=v2.RowFilter.Chain(filters=list(filters)))


def f_interleave(*filters: v2.RowFilter) -> v2.RowFilter:
    return v2.RowFilter(interleave=v2.RowFilter.Interleave(filters=list(filters)))


def f_condition(predicate: v2.RowFilter | None, true: v2.RowFilter | None = None, false: v2.RowFilter | None = None) -> v2.RowFilter:
    """Condition filter; a branch left as None is absent (outputs nothing for that case)."""
    kw = {}
    if predicate is not None:
        kw["predicate_filter"] = predicate
    if true is not None:
        kw["true_filter"] = true
    if false is not None:
        kw["false_filter"] = false
    return v2.RowFilter(condition=v2.RowFilter.Condition(**kw))


def f_sink() -> v2.RowFilter:
    return v2.RowFilter(sink=True)


def f_row_key(regex) -> v2.RowFilter:
    return v2.RowFilter(row_key_regex_filter=b(regex))


def f_sample(p: float) -> v2.RowFilter:
    return v2.RowFilter(row_sample_filter=p)


def f_family(regex: str) -> v2.RowFilter:
    return v2.RowFilter(family_name_regex_filter=regex)


def f_qualifier(regex) -> v2.RowFilter:
    return v2.RowFilter(column_qualifier_regex_filter=b(regex))


def f_value(regex) -> v2.RowFilter:
    return v2.RowFilter(value_regex_filter=b(regex))


def f_column_range(family: str, start_closed=None, start_open=None, end_closed=None, end_open=None) -> v2.RowFilter:
    kw = {"family_name": family}
    for name, v in (("start_qualifier_closed", start_closed), ("start_qualifier_open", start_open),
                    ("end_qualifier_closed", end_closed), ("end_qualifier_open", end_open)):
        if v is not None:
            kw[name] = b(v)
    return v2.RowFilter(column_range_filter=v2.ColumnRange(**kw))


def f_value_range(start_closed=None, start_open=None, end_closed=None, end_open=None) -> v2.RowFilter:
    kw = {}
    for name, v in (("start_value_closed", start_closed), ("start_value_open", start_open),
                    ("end_value_closed", end_closed), ("end_value_open", end_open)):
        if v is not None:
            kw[name] = b(v)
    return v2.RowFilter(value_range_filter=v2.ValueRange(**kw))


def f_timestamp_range(start: int | None = None, end: int | None = None) -> v2.RowFilter:
    kw = {}
    if start is not None:
        kw["start_timestamp_micros"] = start
    if end is not None:
        kw["end_timestamp_micros"] = end
    return v2.RowFilter(timestamp_range_filter=v2.TimestampRange(**kw))


def f_row_offset(n: int) -> v2.RowFilter:
    return v2.RowFilter(cells_per_row_offset_filter=n)


def f_row_limit(n: int) -> v2.RowFilter:
    return v2.RowFilter(cells_per_row_limit_filter=n)


def f_strip() -> v2.RowFilter:
    return v2.RowFilter(strip_value_transformer=True)


def f_label(label: str) -> v2.RowFilter:
    return v2.RowFilter(apply_label_transformer=label)


# ----------------------------------------------------------------------------- reads

Cell = namedtuple("Cell", "family qualifier ts value labels", defaults=((),))
Row = namedtuple("Row", "key cells")


class ChunkProtocolError(AssertionError):
    pass


def merge_chunks(responses, reversed_: bool = False) -> list[Row]:
    """Reassembles ReadRowsResponse chunks into rows, checking the chunk protocol
    (the same rules the client libraries enforce, including that every response ends on a
    row boundary: Python's and Go's row mergers reset their state per response).

    ``responses`` may be proto-plus ReadRowsResponse messages or raw protobufs."""
    rows: list[Row] = []
    key = None
    cells: list[Cell] = []
    family = qualifier = None
    cell = None  # [family, qualifier, ts, labels, [value parts], expected size]
    last_key = None

    def fail(msg):
        raise ChunkProtocolError(f"{msg} (row {key!r}, after {len(rows)} rows)")

    for resp in responses:
        pb = resp if not hasattr(type(resp), "pb") else type(resp).pb(resp)
        for ch in pb.chunks:
            if ch.reset_row:
                if key is None:
                    fail("reset_row outside a row")
                if ch.row_key or ch.HasField("family_name") or ch.HasField("qualifier") or ch.value or ch.timestamp_micros or ch.labels:
                    fail("reset_row chunk carries data")
                key, cells, family, qualifier, cell = None, [], None, None, None
                continue
            if cell is None:
                # a new cell starts
                if key is None:
                    if not ch.row_key:
                        fail("new row without row_key")
                    if last_key is not None:
                        if reversed_ and not ch.row_key < last_key:
                            fail(f"reversed rows out of order: {ch.row_key!r} after {last_key!r}")
                        if not reversed_ and not ch.row_key > last_key:
                            fail(f"rows out of order: {ch.row_key!r} after {last_key!r}")
                    key = ch.row_key
                    family = qualifier = None
                    if not ch.HasField("family_name"):
                        fail("first cell of a row without family_name")
                elif ch.row_key and ch.row_key != key:
                    fail(f"row_key changed to {ch.row_key!r} without commit")
                if ch.HasField("family_name"):
                    family = ch.family_name.value
                    if not ch.HasField("qualifier"):
                        fail("new family without qualifier")
                if ch.HasField("qualifier"):
                    qualifier = ch.qualifier.value
                if family is None or qualifier is None:
                    fail("cell without family/qualifier")
                cell = [family, qualifier, ch.timestamp_micros, tuple(ch.labels), [ch.value], ch.value_size]
            else:
                # continuation of a split cell
                if ch.row_key or ch.HasField("family_name") or ch.HasField("qualifier") or ch.timestamp_micros or ch.labels:
                    fail("continuation chunk carries cell metadata")
                cell[4].append(ch.value)
            if ch.value_size == 0:
                value = b"".join(cell[4])
                if cell[5] and len(value) != cell[5]:
                    fail(f"split cell value_size {cell[5]} but got {len(value)} bytes")
                cells.append(Cell(cell[0], cell[1], cell[2], value, cell[3]))
                cell = None
            if ch.commit_row:
                if cell is not None:
                    fail("commit_row in the middle of a split cell")
                rows.append(Row(key, cells))
                last_key = key
                key, cells, family, qualifier = None, [], None, None
        if key is not None or cell is not None:
            fail("response ends inside a row (the official clients refuse it)")
    if key is not None or cell is not None:
        fail("stream ended inside a row")
    return rows


def row_set(keys: Sequence | None = None, ranges: Sequence | None = None):
    if keys is None and ranges is None:
        return None
    return v2.RowSet(row_keys=[b(k) for k in (keys or [])], row_ranges=list(ranges or []))


def read_rows(
    data: bigtable_v2.BigtableClient,
    table: str,
    keys=None,
    ranges=None,
    filter: v2.RowFilter | None = None,
    limit: int = 0,
    reversed: bool = False,
    timeout: float = 120,
) -> list[Row]:
    req = v2.ReadRowsRequest(table_name=table, rows_limit=limit, reversed=reversed)
    rs = row_set(keys, ranges)
    if rs is not None:
        req.rows = rs
    if filter is not None:
        req.filter = filter
    stream = data.read_rows(request=req, retry=None, timeout=timeout)
    return merge_chunks(stream, reversed_=reversed)


def mutate_row(data, table: str, key, mutations, timeout: float = 60) -> None:
    data.mutate_row(
        request=v2.MutateRowRequest(table_name=table, row_key=b(key), mutations=list(mutations)),
        retry=None,
        timeout=timeout,
    )


def mutate_rows(data, table: str, entries, timeout: float = 120) -> list[str]:
    """entries: [(key, [mutation, ...]), ...] -> list of status code names, by entry index."""
    req = v2.MutateRowsRequest(
        table_name=table,
        entries=[v2.MutateRowsRequest.Entry(row_key=b(k), mutations=list(ms)) for k, ms in entries],
    )
    statuses: dict[int, str] = {}
    for resp in data.mutate_rows(request=req, retry=None, timeout=timeout):
        for e in resp.entries:
            assert e.index not in statuses, f"entry {e.index} reported twice"
            statuses[e.index] = code_pb2.Code.Name(e.status.code)
    assert sorted(statuses) == list(range(len(entries))), f"statuses for {sorted(statuses)}"
    return [statuses[i] for i in range(len(entries))]


def sample_row_keys(data, table: str) -> list[tuple[bytes, int]]:
    return [
        (r.row_key, r.offset_bytes)
        for r in data.sample_row_keys(request=v2.SampleRowKeysRequest(table_name=table), timeout=60)
    ]


def check_and_mutate(data, table: str, key, predicate: v2.RowFilter | None = None, true=(), false=(), timeout: float = 60) -> bool:
    """CheckAndMutateRow; returns ``predicate_matched``. ``predicate=None`` leaves the filter unset."""
    req = v2.CheckAndMutateRowRequest(
        table_name=table, row_key=b(key), true_mutations=list(true), false_mutations=list(false)
    )
    if predicate is not None:
        req.predicate_filter = predicate
    return data.check_and_mutate_row(request=req, retry=None, timeout=timeout).predicate_matched


def rmw_append(family: str, qualifier, value) -> v2.ReadModifyWriteRule:
    return v2.ReadModifyWriteRule(family_name=family, column_qualifier=b(qualifier), append_value=b(value))


def rmw_increment(family: str, qualifier, amount: int) -> v2.ReadModifyWriteRule:
    return v2.ReadModifyWriteRule(family_name=family, column_qualifier=b(qualifier), increment_amount=amount)


def row_from_pb(row) -> Row:
    """A ``google.bigtable.v2.Row`` message (families > columns > cells) as a ``Row``."""
    cells = [
        Cell(fam.name, col.qualifier, c.timestamp_micros, c.value, tuple(c.labels))
        for fam in row.families
        for col in fam.columns
        for c in col.cells
    ]
    return Row(row.key, cells)


def read_modify_write(data, table: str, key, rules, timeout: float = 60) -> Row:
    """ReadModifyWriteRow; returns the response's row (the modified cells) as a ``Row``."""
    req = v2.ReadModifyWriteRowRequest(table_name=table, row_key=b(key), rules=list(rules))
    return row_from_pb(data.read_modify_write_row(request=req, retry=None, timeout=timeout).row)


def i64(n: int) -> bytes:
    """A 64-bit big-endian signed integer: the encoding of counters and Int64 aggregates."""
    return n.to_bytes(8, "big", signed=True)


# ----------------------------------------------------------------------- aggregates


def add_to_cell(family: str, qualifier, ts: int, value) -> v2.Mutation:
    """AddToCell; ``value`` is an int (sent as int_value) or a ready ``v2.Value``."""
    return v2.Mutation(
        add_to_cell=v2.Mutation.AddToCell(
            family_name=family,
            column_qualifier=v2.Value(raw_value=b(qualifier)),
            timestamp=v2.Value(raw_timestamp_micros=ts),
            input=value if isinstance(value, v2.Value) else v2.Value(int_value=value),
        )
    )


def merge_to_cell(family: str, qualifier, ts: int, value) -> v2.Mutation:
    """MergeToCell; ``value`` is an int (sent as int_value) or a ready ``v2.Value``."""
    return v2.Mutation(
        merge_to_cell=v2.Mutation.MergeToCell(
            family_name=family,
            column_qualifier=v2.Value(raw_value=b(qualifier)),
            timestamp=v2.Value(raw_timestamp_micros=ts),
            input=value if isinstance(value, v2.Value) else v2.Value(int_value=value),
        )
    )


# ----------------------------------------------------------------------------- admin


def gc_versions(n: int) -> GcRule:
    return GcRule(max_num_versions=n)


def gc_age(seconds: float) -> GcRule:
    return GcRule(max_age=timedelta(seconds=seconds))


def gc_union(*rules: GcRule) -> GcRule:
    return GcRule(union=GcRule.Union(rules=list(rules)))


def gc_intersection(*rules: GcRule) -> GcRule:
    return GcRule(intersection=GcRule.Intersection(rules=list(rules)))


def column_family(rule: GcRule | admin_types.ColumnFamily | None = None) -> admin_types.ColumnFamily:
    """A ColumnFamily from a GC rule (or None); a ready ColumnFamily is passed through."""
    if isinstance(rule, admin_types.ColumnFamily):
        return rule
    return admin_types.ColumnFamily(gc_rule=rule) if rule is not None else admin_types.ColumnFamily()


AdminType = admin_types.Type


def int64_be_type() -> AdminType:
    """Type Int64 with big-endian-bytes encoding (the input/state type of Sum, Min, Max)."""
    return AdminType(int64_type=AdminType.Int64(encoding=AdminType.Int64.Encoding(
        big_endian_bytes=AdminType.Int64.Encoding.BigEndianBytes())))


def aggregate_type(aggregator: str = "sum", input_type: AdminType | None = None) -> AdminType:
    """An Aggregate value_type: aggregator in sum / min / max / hll, input Int64 big-endian."""
    agg = {
        "sum": {"sum": AdminType.Aggregate.Sum()},
        "min": {"min_": AdminType.Aggregate.Min()},
        "max": {"max_": AdminType.Aggregate.Max()},
        "hll": {"hllpp_unique_count": AdminType.Aggregate.HyperLogLogPlusPlusUniqueCount()},
    }[aggregator]
    return AdminType(aggregate_type=AdminType.Aggregate(input_type=input_type or int64_be_type(), **agg))


def aggregate_family(aggregator: str = "sum", rule: GcRule | None = None) -> admin_types.ColumnFamily:
    """An aggregate column family (usable wherever a GC rule is: bt.table({"f": aggregate_family()}))."""
    kw = {"value_type": aggregate_type(aggregator)}
    if rule is not None:
        kw["gc_rule"] = rule
    return admin_types.ColumnFamily(**kw)


def create_table(
    admin,
    table_id: str,
    families: dict | Iterable[str] = (),
    splits: Sequence = (),
    deletion_protection: bool = False,
    instance: str = INSTANCE,
) -> Table:
    if not isinstance(families, dict):
        families = {f: None for f in families}
    req = admin_types.CreateTableRequest(
        parent=instance_name(instance),
        table_id=table_id,
        table=Table(
            column_families={f: column_family(r) for f, r in families.items()},
            deletion_protection=deletion_protection,
        ),
        initial_splits=[admin_types.CreateTableRequest.Split(key=b(k)) for k in splits],
    )
    return admin.create_table(request=req, retry=None, timeout=60)


def get_table(admin, name: str, view=View.SCHEMA_VIEW) -> Table:
    return admin.get_table(request=admin_types.GetTableRequest(name=name, view=view), retry=None, timeout=60)


def set_deletion_protection(admin, name: str, protected: bool) -> Table:
    op = admin.update_table(
        request=admin_types.UpdateTableRequest(
            table=Table(name=name, deletion_protection=protected),
            update_mask=field_mask_pb2.FieldMask(paths=["deletion_protection"]),
        ),
        retry=None,
        timeout=60,
    )
    return op.result(timeout=30)


def mod_create(family: str, rule: GcRule | None = None):
    Mod = admin_types.ModifyColumnFamiliesRequest.Modification
    return Mod(id=family, create=column_family(rule))


def mod_update(family: str, rule: GcRule | None):
    Mod = admin_types.ModifyColumnFamiliesRequest.Modification
    return Mod(id=family, update=column_family(rule))


def mod_drop(family: str):
    Mod = admin_types.ModifyColumnFamiliesRequest.Modification
    return Mod(id=family, drop=True)


def modify_families(admin, name: str, *mods) -> Table:
    return admin.modify_column_families(
        request=admin_types.ModifyColumnFamiliesRequest(name=name, modifications=list(mods)),
        retry=None,
        timeout=60,
    )


def delete_table(admin, name: str) -> None:
    admin.delete_table(request=admin_types.DeleteTableRequest(name=name), retry=None, timeout=60)


def drop_row_range(admin, name: str, prefix=None, all_data: bool = False) -> None:
    if all_data:
        req = admin_types.DropRowRangeRequest(name=name, delete_all_data_from_table=True)
    else:
        req = admin_types.DropRowRangeRequest(name=name, row_key_prefix=b(prefix))
    admin.drop_row_range(request=req, retry=None, timeout=60)


def family_rules(table: Table) -> dict[str, GcRule]:
    return {fid: cf.gc_rule for fid, cf in table.column_families.items()}


# ------------------------------------------------------------------------------ HTTP


def http_get(url: str, timeout: float = 5) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class Metrics:
    """Parsed Prometheus text exposition."""

    def __init__(self, text: str):
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, dict, float]] = []
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split()
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3]
                continue
            m = _SAMPLE_RE.match(line)
            assert m, f"unparseable metrics line: {line!r}"
            name, labels_s, value = m.groups()
            labels = dict(_LABEL_RE.findall(labels_s or ""))
            self.samples.append((name, labels, float(value)))

    def find(self, name: str, **labels) -> list[tuple[dict, float]]:
        return [
            (lab, val)
            for n, lab, val in self.samples
            if n == name and all(lab.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for _, v in self.find(name, **labels))

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


def scrape(http_url: str) -> Metrics:
    status, headers, body = http_get(f"{http_url}/metrics")
    assert status == 200, f"/metrics returned {status}: {body[:500]!r}"
    return Metrics(body.decode())


