"""`cbt`, Google's Bigtable command-line tool (Debian package google-cloud-cli-cbt), works
against Basalt unchanged with nothing but BIGTABLE_EMULATOR_HOST: the README's walk-through
(create a table with a GC policy, write, read, restart and kill -9 the server, read the same
data) and the rest of cbt's table commands, each asserting what cbt prints.

cbt is run with an environment holding only BIGTABLE_EMULATOR_HOST and a scratch HOME, and
without gcloud on its PATH (it would otherwise ask gcloud for credentials it does not need
against an emulator host, which costs a second per command)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

CBT_INSTALL_HINT = (
    "cbt is required for this test: install the Debian package google-cloud-cli-cbt "
    "(from Google's Cloud SDK apt repository) or put cbt on PATH"
)


def cbt_binary() -> str:
    path = shutil.which("cbt")
    assert path, CBT_INSTALL_HINT
    return str(Path(path).resolve())


class Cbt:
    def __init__(self, endpoint: str, home: Path, project: str = "p", instance: str = "i"):
        self.binary = cbt_binary()
        self.endpoint = endpoint
        self.home = home
        self.project = project
        self.instance = instance

    def run(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
        env = {
            "BIGTABLE_EMULATOR_HOST": self.endpoint,
            "HOME": str(self.home),
            "PATH": "/nonexistent",
        }
        proc = subprocess.run(
            [self.binary, "-project", self.project, "-instance", self.instance, *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert proc.returncode == 0, (
                f"cbt {' '.join(args)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
            )
        return proc

    def __call__(self, *args: str) -> str:
        return self.run(*args).stdout

    def fails(self, *args: str) -> str:
        proc = self.run(*args, check=False)
        assert proc.returncode != 0, f"cbt {' '.join(args)} should have failed:\n{proc.stdout}"
        return proc.stderr + proc.stdout

    def rows(self, *args: str) -> dict[str, list[tuple[str, str]]]:
        return parse_rows(self(*args))


_CELL = re.compile(r"^  (\S+?:\S*)\s+@ \S+$")


def parse_rows(output: str) -> dict[str, list[tuple[str, str]]]:
    """cbt's read/lookup output → {row key: [(family:qualifier, value), ...]} in printed order.

    Rows start after a line of dashes with the key; each cell is a "  fam:qual  @ time" line
    followed by its quoted value on the next line."""
    rows: dict[str, list[tuple[str, str]]] = {}
    lines = output.splitlines()
    i = 0
    current = None
    while i < len(lines):
        line = lines[i]
        if set(line) == {"-"}:
            current = lines[i + 1]
            assert current not in rows, f"row {current!r} printed twice:\n{output}"
            rows[current] = []
            i += 2
            continue
        m = _CELL.match(line)
        if m:
            assert current is not None, output
            value = lines[i + 1].strip()
            assert value.startswith('"') and value.endswith('"'), f"unexpected value line {value!r}"
            rows[current].append((m.group(1), value[1:-1]))
            i += 2
            continue
        i += 1
    return rows


def families(ls_output: str) -> dict[str, str]:
    """`cbt ls TABLE` → {family: GC policy text}."""
    out = {}
    for line in ls_output.splitlines()[2:]:
        parts = [p for p in line.split("\t") if p]
        if parts:
            out[parts[0]] = parts[1] if len(parts) > 2 else ""
    return out


@pytest.fixture
def server(server_factory):
    return server_factory()


@pytest.fixture
def cbt(server, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return Cbt(server.data_endpoint, home)


def test_readme_walkthrough_survives_restart_and_kill(server, cbt):
    # The README's commands, verbatim apart from the endpoint.
    cbt("createtable", "users")
    cbt("createfamily", "users", "profile")
    cbt("setgcpolicy", "users", "profile", "maxversions=3")
    cbt("set", "users", "alice", "profile:name=Alice")
    assert cbt.rows("read", "users") == {"alice": [("profile:name", "Alice")]}
    assert cbt("ls").split() == ["users"]
    assert families(cbt("ls", "users")) == {"profile": "versions() > 3"}

    # Four versions into a family keeping three: the oldest is gone.
    for name in ("A2", "A3", "A4"):
        cbt("set", "users", "alice", f"profile:name={name}")
    cbt("set", "users", "bob", "profile:name=Bob", "profile:age=41")
    expected = {
        "alice": [("profile:name", "A4"), ("profile:name", "A3"), ("profile:name", "A2")],
        "bob": [("profile:age", "41"), ("profile:name", "Bob")],
    }
    assert cbt.rows("read", "users") == expected

    server.restart()
    assert cbt.rows("read", "users") == expected
    server.crash_restart()
    assert cbt.rows("read", "users") == expected
    assert families(cbt("ls", "users")) == {"profile": "versions() > 3"}


def test_table_and_family_admin(cbt):
    cbt(
        "createtable",
        "events",
        "families=raw:maxage=10d||maxversions=2,agg:never:intsum,keep:never",
        "splits=g,p",
    )
    fams = families(cbt("ls", "events"))
    assert fams == {"raw": "(age() > 10d || versions() > 2)", "agg": "", "keep": ""}
    # the same id again is ALREADY_EXISTS
    assert "AlreadyExists" in cbt.fails("createtable", "events")

    cbt("setgcpolicy", "events", "keep", "maxage=1d", "and", "maxversions=5")
    assert families(cbt("ls", "events"))["keep"] == "(age() > 1d && versions() > 5)"
    cbt("createfamily", "events", "extra")
    cbt("deletefamily", "events", "extra")
    assert "extra" not in families(cbt("ls", "events"))
    assert "NotFound" in cbt.fails("setgcpolicy", "events", "nosuch", "maxversions=1")

    cbt("createtable", "scratch")
    assert sorted(cbt("ls").split()) == ["events", "scratch"]
    cbt("deletetable", "scratch")
    assert cbt("ls").split() == ["events"]
    assert "NotFound" in cbt.fails("read", "scratch")


def test_writes_deletes_and_reads(cbt, tmp_path):
    cbt("createtable", "t", "families=cf:never,st:never")
    for key in ("a1", "a2", "b1", "b2", "c1"):
        cbt("set", "t", key, f"cf:v={key}-value", "st:n=1")
    assert cbt("count", "t").strip() == "5"

    assert list(cbt.rows("read", "t", "prefix=a")) == ["a1", "a2"]
    assert list(cbt.rows("read", "t", "start=a2", "end=c1")) == ["a2", "b1", "b2"]
    assert list(cbt.rows("read", "t", "count=2")) == ["a1", "a2"]
    assert list(cbt.rows("read", "t", "regex=.*2")) == ["a2", "b2"]
    assert list(cbt.rows("read", "t", "reversed=true", "count=3")) == ["c1", "b2", "b1"]
    assert cbt.rows("read", "t", "columns=st:n", "prefix=b") == {
        "b1": [("st:n", "1")],
        "b2": [("st:n", "1")],
    }
    assert cbt.rows("lookup", "t", "b1") == {"b1": [("cf:v", "b1-value"), ("st:n", "1")]}
    assert cbt.rows("lookup", "t", "b1", "columns=cf:") == {"b1": [("cf:v", "b1-value")]}
    # keys-only strips the values
    assert cbt.rows("read", "t", "keys-only=true", "prefix=c") == {"c1": [("cf:v", ""), ("st:n", "")]}

    # explicit timestamps and cells-per-column
    cbt("set", "t", "ts", "cf:x=old@1000", "cf:x=new@2000")
    assert cbt.rows("lookup", "t", "ts") == {"ts": [("cf:x", "new"), ("cf:x", "old")]}
    assert cbt.rows("lookup", "t", "ts", "cells-per-column=1") == {"ts": [("cf:x", "new")]}

    cbt("deletecolumn", "t", "b1", "st", "n")
    assert cbt.rows("lookup", "t", "b1") == {"b1": [("cf:v", "b1-value")]}
    cbt("deleterow", "t", "a1")
    # a missing row: cbt prints its separator and an empty key (as against the emulator)
    assert cbt.rows("lookup", "t", "a1") == {"": []}
    assert list(cbt.rows("read", "t", "prefix=a")) == ["a2"]

    # import: a CSV with the families and columns in its first two lines
    csv = tmp_path / "rows.csv"
    csv.write_text(",cf,st\n,v,n\nimp1,x1,7\nimp2,x2,8\n")
    out = cbt.run("import", "t", str(csv))
    assert "Done importing 2 rows" in out.stdout + out.stderr
    assert cbt.rows("read", "t", "prefix=imp") == {
        "imp1": [("cf:v", "x1"), ("st:n", "7")],
        "imp2": [("cf:v", "x2"), ("st:n", "8")],
    }

    cbt("deleteallrows", "t")
    assert cbt("count", "t").strip() == "0"


def test_aggregate_family_addtocell(cbt):
    cbt("createtable", "counters", "families=hits:never:intsum")
    for n in ("5", "7", "-2"):
        cbt("addtocell", "counters", "page1", f"hits:views={n}@0")
    rows = cbt.rows("lookup", "counters", "page1")
    assert list(rows) == ["page1"]
    [(column, value)] = rows["page1"]
    assert column == "hits:views"
    # cbt prints the 8-byte big-endian state as a Go-quoted string: 10 is "\x00...\x00\n"
    assert value == "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\n"
    # Plain SetCell into an aggregate family is refused.
    assert "InvalidArgument" in cbt.fails("set", "counters", "page1", "hits:views=1")


def test_read_stats_and_consistency(cbt):
    cbt("createtable", "s", "families=cf:never")
    for key in ("r1", "r2", "r3"):
        cbt("set", "s", key, "cf:a=1", "cf:b=2")
    out = cbt.run("read", "s", "columns=cf:a", "include-stats=full")
    text = out.stdout + out.stderr
    assert "Stats were requested but not received" not in text
    stats = dict(re.findall(r"^(\w+_count): (\d+)$", out.stdout, re.M))
    assert stats == {
        "rows_seen_count": "3",
        "rows_returned_count": "3",
        "cells_seen_count": "6",
        "cells_returned_count": "3",
    }, out.stdout
    assert re.search(r"^frontend_server_latency: \d+ms$", out.stdout, re.M), out.stdout
    # waitforreplication uses GenerateConsistencyToken / CheckConsistency
    out = cbt.run("waitforreplication", "s")
    assert "Waiting for all writes" in out.stdout + out.stderr
