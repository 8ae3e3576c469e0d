"""The README's and the user guide's code blocks, run as a reader would run them.

Each document's blocks run in order, as one reader's session: the block that starts a server
runs each of its commands (``cargo run …``, the built binary) as the reader would, waits
until it is ready, stops the earlier ones with SIGTERM (exit 0 asserted) and keeps the last
one serving the blocks that follow; ``sh`` blocks run in bash and ``python`` blocks in the
test venv's Python (the pinned official client), with ``BIGTABLE_EMULATOR_HOST`` set as the
reader's ``export`` sets it. Blocks run verbatim but for two rewrites, so that the test
neither touches a reader's own server or data nor depends on fixed ports being free: the
documented addresses ``127.0.0.1:8086``/``127.0.0.1:8087`` become free ports, and
``./basalt-data`` becomes a temporary directory.

Every fenced block of the documents below must be covered: a new block that no rule here
runs fails ``test_every_block_is_run``. ``text`` blocks (the README's layout) are not code.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from btlib import http_get
from conftest import REPO, free_port

DOCUMENTS = ["README.md", "docs/user-guide.md"]
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)
# cargo run may compile the server first (a different feature set than the test build).
SERVER_START_TIMEOUT = 1200


def blocks(doc: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer((REPO / doc).read_text())]


def starts_server(lang: str, code: str) -> bool:
    return lang == "sh" and "--standalone" in code


def commands(code: str) -> list[str]:
    """The commands of a block: its lines without comments and blank lines."""
    return [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# The README's test command sits in the block of its run command; it is what runs this test.
TEST_COMMAND = "e2e/run-tests"


def server_commands(code: str) -> list[str]:
    return [c for c in commands(code) if c != TEST_COMMAND]


class Session:
    """One reader's shell session: a data dir, two free ports and the server they started."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.grpc = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.data_dir = tmp / "basalt-data"
        self.server: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.env = {
            **os.environ,
            "BIGTABLE_EMULATOR_HOST": self.grpc,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        self.env.pop("BASALT_LISTEN", None)
        self.env.pop("BASALT_HTTP_LISTEN", None)

    def rewrite(self, code: str) -> str:
        return (code.replace("127.0.0.1:8086", self.grpc)
                    .replace("127.0.0.1:8087", self.http)
                    .replace("./basalt-data", str(self.data_dir)))

    def log_tail(self) -> str:
        return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-8000:]}" for p in self.logs)

    def start_server(self, command: str):
        """Runs one documented server command (the addresses come from the environment the
        flags fall back to, so the command itself stays as written)."""
        self.stop_server()
        log = self.tmp / f"server-{len(self.logs)}.log"
        self.logs.append(log)
        env = {**self.env, "BASALT_LISTEN": self.grpc, "BASALT_HTTP_LISTEN": self.http}
        with open(log, "wb") as out:
            self.server = subprocess.Popen(
                ["bash", "-c", f"exec {self.rewrite(command)}"], cwd=REPO, env=env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                pytest.fail(f"`{command}` exited with {self.server.returncode}\n{self.log_tail()}")
            try:
                if http_get(f"http://{self.http}/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        pytest.fail(f"`{command}` not ready after {SERVER_START_TIMEOUT}s\n{self.log_tail()}")

    def stop_server(self):
        if self.server is None:
            return
        self.server.send_signal(signal.SIGTERM)
        rc = self.server.wait(60)
        self.server = None
        assert rc == 0, f"the server exited with {rc} on SIGTERM\n{self.log_tail()}"

    def run(self, lang: str, code: str) -> str:
        code = self.rewrite(code)
        argv = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
        cp = subprocess.run(argv, cwd=self.tmp, env=self.env, capture_output=True, text=True, timeout=300)
        assert cp.returncode == 0, (
            f"{lang} block failed ({cp.returncode}):\n{code}\n--- stdout\n{cp.stdout}\n--- stderr\n{cp.stderr}"
            f"\n{self.log_tail()}")
        return cp.stdout


def run_document(doc: str, tmp: Path) -> list[str]:
    session = Session(tmp)
    outputs = []
    try:
        for lang, code in blocks(doc):
            if lang == "text":
                continue
            if starts_server(lang, code):
                for command in server_commands(code):
                    session.start_server(command)
                outputs.append("")
            else:
                outputs.append(session.run(lang, code))
        session.stop_server()
    finally:
        if session.server is not None:
            session.server.kill()
            session.server.wait()
    return outputs


def test_every_block_is_run():
    for doc in DOCUMENTS:
        for lang, code in blocks(doc):
            assert lang in ("sh", "python", "text"), f"{doc}: a ```{lang} block that test_docs.py does not run"
            if starts_server(lang, code):
                for command in server_commands(code):
                    assert "--standalone" in command, f"{doc}: {command!r} is not a server command"
    # The server blocks start what they say: at least one server per document.
    assert all(any(starts_server(*b) for b in blocks(doc)) for doc in DOCUMENTS)


@pytest.mark.timeout(SERVER_START_TIMEOUT + 600)
def test_readme(tmp_path):
    run_cmd, cbt, python = run_document("README.md", tmp_path)
    # cbt's read prints the row it just wrote; Python prints the value it read back.
    assert re.search(r"^alice\n\s+profile:name\s+@ .*\n\s+\"Alice\"", cbt, re.M), cbt
    assert python.strip() == "b'Alice'", python


@pytest.mark.timeout(SERVER_START_TIMEOUT + 600)
def test_user_guide(tmp_path):
    outputs = run_document("docs/user-guide.md", tmp_path)
    # The last block: `cbt ls` lists the table the Python block created.
    assert "events" in outputs[-1].split(), outputs[-1]
