"""The official Node.js client (@google-cloud/bigtable, pinned in e2e/node/package.json) works
against Basalt unchanged: e2e/node/smoke.js asserts what it reads back and exits non-zero on
any mismatch. e2e/run-tests installs its node_modules with `npm ci`."""

import os
import shutil
import subprocess
from pathlib import Path

NODE_DIR = Path(__file__).resolve().parent / "node"


def test_node_client_round_trip(basalt_server):
    node = shutil.which("node")
    assert node, "node is required for this test (install Node.js)"
    assert (NODE_DIR / "node_modules" / "@google-cloud" / "bigtable").is_dir(), (
        "run `npm ci --prefix e2e/node` first (e2e/run-tests does)"
    )
    env = {**os.environ, "BIGTABLE_EMULATOR_HOST": basalt_server.data_endpoint}
    proc = subprocess.run(
        [node, "smoke.js", "node_smoke"],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "node client: ok" in proc.stdout
