"""The process kubelet's streaming server: what ``kubectl port-forward`` reaches through the API
server.

``kubectl port-forward`` asks the API server for ``pods/<pod>/portforward`` (an HTTP upgrade);
the API server looks up the pod's Node and dials
``https://<node address>:<status.daemonEndpoints.kubeletEndpoint.Port>/portForward/<ns>/<pod>``,
forwards the upgrade request and, once the kubelet answers ``101 Switching Protocols``, copies
bytes both ways: from then on kubectl and the kubelet speak SPDY/3.1 to each other. This module
is that kubelet side (``pkg/kubelet/cri/streaming/portforward`` in Kubernetes 1.20 over
``github.com/docker/spdystream``, which kubectl uses too):

* HTTPS on 127.0.0.1 with a self-signed certificate: kube-apiserver without
  ``--kubelet-certificate-authority`` does not verify the kubelet's certificate (1.20's
  ``KubeletClientConfig.transportConfig``: no CA, ``Insecure``), and without
  ``--kubelet-client-certificate`` presents none, so none is asked for here.
* ``POST /portForward/<ns>/<pod>[/<uid>]`` for a pod this kubelet runs: the protocol is
  negotiated from the request's ``X-Stream-Protocol-Version`` values (``portforward.k8s.io``
  only; none in common is 403 with ``X-Accepted-Stream-Protocol-Versions``), the request must
  ask for ``Connection: Upgrade``, ``Upgrade: SPDY/3.1`` (else 400), then 101 and SPDY.
* SPDY/3 framing (the SPDY/3 draft, which SPDY/3.1 only extends with session flow control):
  control frames SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS and
  WINDOW_UPDATE, data frames with FLAG_FIN. Header blocks are zlib streams with the SPDY/3
  dictionary, one compression context per direction for the connection's lifetime, each
  block ending with a sync flush.
* The port-forward protocol: for each forwarded connection the client opens an ``error``
  stream and a ``data`` stream (headers ``streamtype``, ``port``, ``requestid``; without a
  ``requestid`` the pair is the error stream's id and that id + 2, as the kubelet derives it).
  Every valid stream gets a SYN_REPLY at once (the client waits for it); an invalid one (no or
  a bad ``port``, an unknown ``streamtype``) is reset. Once both streams of a request are
  there, the kubelet connects to the pod's IP and port (the pod's process listens on its own
  IP: the kubelet rewrote its 127.0.0.1), copies the data stream to the socket and the socket
  to the data stream, half-closes the socket when the client's FIN comes, and when the pod
  side closes sends FIN on both streams. A connection that fails writes
  ``error forwarding port P to pod NS/NAME, uid U: <why>`` on the error stream (kubectl prints
  it and closes its local connection). A pair that stays incomplete for 30 s gets
  ``timed out waiting for streams``.
* Flow control: spdystream (kubectl's side) implements none. It never sends WINDOW_UPDATE and
  ignores those it gets, so a sender that waited for window after the initial 64 KiB would stall
  forever; the real kubelet (spdystream too) writes without window accounting, and so does this
  one. Back-pressure comes from TCP instead (the writer's drain towards the API server, the
  pod socket's drain towards the pod). Received WINDOW_UPDATE and SETTINGS are read and
  ignored.
* PING frames from the client (odd ids) are echoed; GOAWAY stops new streams, the streams
  already open go on until the connection closes; when it closes every pod socket is closed.

Several forwarded connections share one SPDY connection (one ``kubectl port-forward`` process)
and several SPDY connections are served at once: everything runs on one asyncio event loop in a
thread of its own (TLS included, so no SSL object is shared between threads).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import ssl
import struct
import subprocess
import threading
import traceback
import urllib.parse
import zlib
from pathlib import Path
from typing import Callable

SPDY_VERSION = 3
# Control frame types (SPDY/3 draft, 2.6).
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS = 1, 2, 3, 4
PING, GOAWAY, HEADERS, WINDOW_UPDATE = 6, 7, 8, 9
FLAG_FIN = 0x01
# RST_STREAM status codes (2.6.3) and GOAWAY status codes (2.6.6).
PROTOCOL_ERROR, REFUSED_STREAM, CANCEL = 1, 3, 5
GOAWAY_OK, GOAWAY_PROTOCOL_ERROR = 0, 1

PORT_FORWARD_PROTOCOLS = ("portforward.k8s.io",)
# The kubelet's stream creation timeout (its streaming server's default): a request's second
# stream must come within it.
STREAM_CREATION_TIMEOUT = 30.0
# Largest payload read from a pod socket into one DATA frame.
CHUNK = 32 * 1024

# The SPDY/3 header compression dictionary (SPDY/3 draft, 2.6.10.1): 65 words, each as a 32-bit
# big-endian length and its bytes, then a run of status codes, reason phrases, dates and media
# types. zlib names a dictionary by its Adler-32: both sides must hold exactly these 1,423 bytes.
# ("200_OK" is the word "200 OK": the list is split on spaces.)
_DICTIONARY_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language "
    "accept-ranges age allow authorization cache-control connection content-base "
    "content-encoding content-language content-length content-location content-md5 "
    "content-range content-type date etag expect expires from host if-match if-modified-since "
    "if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer "
    "transfer-encoding upgrade user-agent vary via warning www-authenticate method get status "
    "200_OK version HTTP/1.1 url public set-cookie keep-alive origin").split()
_DICTIONARY_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
HEADER_DICTIONARY = b"".join(
    struct.pack(">I", len(w)) + w.replace("_", " ").encode() for w in _DICTIONARY_WORDS
) + _DICTIONARY_TAIL.encode()
assert len(HEADER_DICTIONARY) == 1423 and zlib.adler32(HEADER_DICTIONARY) == 0xE3C6A7C2


# ------------------------------------------------------------------------------- framing


def control_frame(ftype: int, flags: int, payload: bytes) -> bytes:
    """A control frame: control bit, version, type; flags and 24-bit length; payload."""
    return struct.pack(">HHI", 0x8000 | SPDY_VERSION, ftype, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, flags: int, data: bytes) -> bytes:
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(data)) + data


def encode_header_block(headers: dict[str, list[str]]) -> bytes:
    """A header block before compression: the pair count, then each lowercase name and its
    values joined by NUL, each with a 32-bit length."""
    out = [struct.pack(">I", len(headers))]
    for name, values in headers.items():
        n, v = name.lower().encode(), "\0".join(values).encode()
        out += [struct.pack(">I", len(n)), n, struct.pack(">I", len(v)), v]
    return b"".join(out)


def decode_header_block(block: bytes) -> dict[str, list[str]]:
    (count,), pos, headers = struct.unpack_from(">I", block), 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from(">I", block, pos)
        name = block[pos + 4:pos + 4 + n].decode("latin-1").lower()
        pos += 4 + n
        (n,) = struct.unpack_from(">I", block, pos)
        value = block[pos + 4:pos + 4 + n].decode("latin-1")
        pos += 4 + n
        headers.setdefault(name, []).extend(value.split("\0"))
    if pos != len(block):
        raise ValueError(f"header block of {len(block)} bytes has {len(block) - pos} left over")
    return headers


class HeaderCompression:
    """One SPDY connection's two zlib contexts (one per direction, for its whole life)."""

    def __init__(self):
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 9, zlib.Z_DEFAULT_STRATEGY,
                                         HEADER_DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=HEADER_DICTIONARY)

    def compress(self, headers: dict[str, list[str]]) -> bytes:
        block = encode_header_block(headers)
        return self._deflate.compress(block) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> dict[str, list[str]]:
        return decode_header_block(self._inflate.decompress(data))


# ---------------------------------------------------------------------------- port-forward


class Stream:
    def __init__(self, stream_id: int, headers: dict[str, list[str]]):
        self.id = stream_id
        self.headers = headers
        # What the client sent on it, None for its FIN.
        self.inbound: asyncio.Queue = asyncio.Queue()
        self.local_fin = False  # FIN sent
        self.remote_fin = False  # FIN received
        self.reset = False
        self.pair: Pair | None = None

    def header(self, name: str) -> str:
        return (self.headers.get(name) or [""])[0]


class Pair:
    """The error and data streams of one forwarded connection."""

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.error: Stream | None = None
        self.data: Stream | None = None
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None


class Session:
    """One SPDY/3.1 connection (one ``kubectl port-forward``), server side."""

    def __init__(self, server: "StreamingServer", reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, pod: tuple[str, str, str, str]):
        self.server = server
        self.reader, self.writer = reader, writer
        self.ns, self.name, self.ip, self.uid = pod
        self.headers = HeaderCompression()
        self.streams: dict[int, Stream] = {}
        self.pairs: dict[str, Pair] = {}
        self.last_stream_id = 0
        self.going_away = False
        self.closed = False
        self.tasks: set[asyncio.Task] = set()

    # --------------------------------------------------------------------- output

    def send(self, frame: bytes) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(frame)

    async def flush(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            self.closed = True

    def send_data(self, stream: Stream, data: bytes) -> None:
        if not (stream.local_fin or stream.reset):
            self.send(data_frame(stream.id, 0, data))

    def send_fin(self, stream: Stream | None) -> None:
        if stream is None or stream.local_fin or stream.reset:
            return
        stream.local_fin = True
        self.send(data_frame(stream.id, FLAG_FIN, b""))
        self._forget_if_done(stream)

    def send_reset(self, stream_id: int, status: int) -> None:
        self.send(control_frame(RST_STREAM, 0, struct.pack(">II", stream_id & 0x7FFFFFFF, status)))

    def _forget_if_done(self, stream: Stream) -> None:
        if stream.reset or (stream.local_fin and stream.remote_fin):
            self.streams.pop(stream.id, None)

    # ---------------------------------------------------------------------- input

    async def run(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(8)
                word, flags_length = struct.unpack(">II", head)
                flags, length = flags_length >> 24, flags_length & 0xFFFFFF
                payload = await self.reader.readexactly(length) if length else b""
                if word & 0x80000000:
                    version, ftype = (word >> 16) & 0x7FFF, word & 0xFFFF
                    if version != SPDY_VERSION:
                        self.server.log(f"kubelet: port-forward: SPDY version {version}: going away")
                        self.send(control_frame(GOAWAY, 0, struct.pack(">II", self.last_stream_id,
                                                                       GOAWAY_PROTOCOL_ERROR)))
                        break
                    self.control(ftype, flags, payload)
                else:
                    self.data(word & 0x7FFFFFFF, flags, payload)
                await self.flush()
                if self.closed:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ssl.SSLError):
            pass  # the API server closed the connection (kubectl stopped)
        except (zlib.error, ValueError, struct.error) as e:
            self.server.log(f"kubelet: port-forward: malformed frame from the client: {e!r}")
        except Exception:  # noqa: BLE001 - a bug here: logged, the connection closed
            self.server.log(f"kubelet: port-forward session failed: {traceback.format_exc()}")
        finally:
            self.closed = True
            for p in list(self.pairs.values()):
                if p.timer:
                    p.timer.cancel()
            for t in list(self.tasks):
                t.cancel()
            self.writer.close()

    def control(self, ftype: int, flags: int, payload: bytes) -> None:
        if ftype == SYN_STREAM:
            stream_id = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
            # Decompressed whatever happens to the stream: the context must see every block.
            headers = self.headers.decompress(payload[10:])
            self.syn_stream(stream_id, flags, headers)
        elif ftype == HEADERS:
            self.headers.decompress(payload[4:])  # nothing to do with them but keep in sync
        elif ftype == RST_STREAM:
            stream = self.streams.pop(struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF, None)
            if stream is not None:
                stream.reset = True
                stream.inbound.put_nowait(None)
                if stream.pair and stream.pair.task and stream is stream.pair.data:
                    stream.pair.task.cancel()  # the connection to the pod goes with its data
        elif ftype == PING:
            (ping_id,) = struct.unpack_from(">I", payload)
            if ping_id % 2 == 1:  # the client's (a server's are even): echoed as it came
                self.send(control_frame(PING, 0, payload))
        elif ftype == GOAWAY:
            self.going_away = True
        # SETTINGS, WINDOW_UPDATE (see the module's docstring), SPDY/2's NOOP, unknown types:
        # nothing to do.

    def syn_stream(self, stream_id: int, flags: int, headers: dict[str, list[str]]) -> None:
        if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
            self.send_reset(stream_id, PROTOCOL_ERROR)  # ids from the client: odd, increasing
            return
        self.last_stream_id = stream_id
        if self.going_away:
            self.send_reset(stream_id, REFUSED_STREAM)
            return
        stream = Stream(stream_id, headers)
        why = self.invalid(stream)
        if why:
            # As the kubelet's stream handler: the stream is reset (spdystream: CANCEL).
            self.server.log(f"kubelet: port-forward to {self.ns}/{self.name}: stream rejected: {why}")
            self.send_reset(stream_id, CANCEL)
            return
        self.streams[stream_id] = stream
        self.send(control_frame(SYN_REPLY, 0, struct.pack(">I", stream_id)
                                + self.headers.compress({})))
        if flags & FLAG_FIN:
            stream.remote_fin = True
            stream.inbound.put_nowait(None)
        self.pair(stream)

    @staticmethod
    def invalid(stream: Stream) -> str | None:
        port = stream.header("port")
        if not port:
            return '"port" header is required'
        if not port.isdigit() or not 0 < int(port) < 65536:
            return f"unable to parse {port!r} as a port"
        if stream.header("streamtype") not in ("error", "data"):
            return f"invalid stream type {stream.header('streamtype')!r}"
        return None

    def pair(self, stream: Stream) -> None:
        kind = stream.header("streamtype")
        request_id = stream.header("requestid") or str(stream.id if kind == "error" else stream.id - 2)
        p = self.pairs.get(request_id)
        if p is None:
            p = self.pairs[request_id] = Pair(request_id)
            p.timer = asyncio.get_running_loop().call_later(STREAM_CREATION_TIMEOUT, self.timed_out, p)
        if getattr(p, kind) is not None:
            msg = f"error processing stream for request {request_id}: {kind} stream already assigned"
            if p.error is not None:
                self.send_data(p.error, msg.encode())
            self.server.log(f"kubelet: port-forward to {self.ns}/{self.name}: {msg}")
            return
        setattr(p, kind, stream)
        stream.pair = p
        if p.error is not None and p.data is not None:
            p.timer.cancel()
            del self.pairs[request_id]
            p.task = asyncio.ensure_future(self.forward(p))
            self.tasks.add(p.task)
            p.task.add_done_callback(self.tasks.discard)

    def timed_out(self, p: Pair) -> None:
        if self.pairs.get(p.request_id) is p:
            del self.pairs[p.request_id]
            if p.error is not None:
                self.send_data(p.error, f"(request={p.request_id}) timed out waiting for streams".encode())
                self.send_fin(p.error)

    def data(self, stream_id: int, flags: int, payload: bytes) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_fin:
            return  # a stream reset or closed meanwhile (spdystream drops these too)
        if payload:
            stream.inbound.put_nowait(payload)
        if flags & FLAG_FIN:
            stream.remote_fin = True
            stream.inbound.put_nowait(None)
            self._forget_if_done(stream)

    # ------------------------------------------------------------------- forwarding

    async def forward(self, p: Pair) -> None:
        port = int(p.data.header("port"))
        where = f"{self.ns}/{self.name} port {port} ({self.ip}:{port})"
        try:
            try:
                pod_reader, pod_writer = await asyncio.wait_for(asyncio.open_connection(self.ip, port), 10)
            except (OSError, asyncio.TimeoutError) as e:
                # Worded as the kubelet's (Go's dialer) would: "connect: connection refused".
                errno = getattr(e, "errno", None)
                why = (f"connect: {os.strerror(errno).lower()}" if errno
                       else "i/o timeout" if isinstance(e, asyncio.TimeoutError) else str(e))
                msg = (f"error forwarding port {port} to pod {self.ns}/{self.name}, uid {self.uid}: "
                       f"dial tcp {self.ip}:{port}: {why}")
                self.server.log(f"kubelet: port-forward: {msg}")
                self.send_data(p.error, msg.encode())
                return
            self.server.log(f"kubelet: port-forward: request {p.request_id} to {where}")
            to_pod = asyncio.ensure_future(self.to_pod(p.data, pod_writer))
            try:
                while not self.closed and not p.data.reset:
                    chunk = await pod_reader.read(CHUNK)
                    if not chunk:
                        break
                    self.send_data(p.data, chunk)
                    await self.flush()
            except (ConnectionError, OSError):
                pass
            finally:
                to_pod.cancel()
                pod_writer.close()
        finally:
            self.send_fin(p.data)
            self.send_fin(p.error)
            await self.flush()

    @staticmethod
    async def to_pod(stream: Stream, pod_writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                chunk = await stream.inbound.get()
                if chunk is None:
                    if not stream.reset and pod_writer.can_write_eof():
                        pod_writer.write_eof()  # the client's FIN: half-close, read on
                    return
                pod_writer.write(chunk)
                await pod_writer.drain()
        except (ConnectionError, OSError):
            pass


# ---------------------------------------------------------------------------------- server

# A pod this kubelet runs: (namespace, name) -> (pod IP, uid), or None.
Resolver = Callable[[str, str], "tuple[str, str] | None"]
PATH = re.compile(r"^/portForward/([^/]+)/([^/]+)(?:/([^/]+))?/?$")


def self_signed_certificate(d: Path, name: str) -> tuple[Path, Path]:
    """A P-256 key and a self-signed certificate for ``name`` and 127.0.0.1 (openssl)."""
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "kubelet.key", "-out", "kubelet.crt", "-days", "2",
                    "-subj", f"/CN={name}", "-addext", f"subjectAltName=IP:127.0.0.1,DNS:{name}"],
                   cwd=d, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return d / "kubelet.crt", d / "kubelet.key"


def _response(status: str, headers: dict[str, str] | None = None, body: str = "") -> bytes:
    data = body.encode()
    lines = [f"HTTP/1.1 {status}"]
    for k, v in {**(headers or {}), "Content-Type": "text/plain; charset=utf-8",
                 "Content-Length": str(len(data)), "Connection": "close"}.items():
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


class StreamingServer:
    """HTTPS on ``host`` (a port of its own, ``port`` once started) serving ``/portForward``
    for the pods ``resolve`` knows, and ``/healthz``."""

    def __init__(self, root: Path, resolve: Resolver, node_name: str, log=lambda msg: None,
                 host: str = "127.0.0.1"):
        self.root = Path(root)
        self.resolve = resolve
        self.node_name = node_name
        self.log = log
        self.host = host
        self.port = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.sessions: set[Session] = set()
        self._server: asyncio.AbstractServer | None = None

    def start(self) -> "StreamingServer":
        cert, key = self_signed_certificate(self.root, self.node_name)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        # A port of its own, held from now on (bound here: nothing can take it meanwhile).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((self.host, 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        failed: list[BaseException] = []

        def run():
            asyncio.set_event_loop(self.loop)
            try:
                self._server = self.loop.run_until_complete(asyncio.start_server(
                    self._serve, sock=sock, ssl=ctx, ssl_handshake_timeout=15))
            except BaseException as e:  # noqa: BLE001 - reported by start()
                failed.append(e)
                ready.set()
                return
            ready.set()
            self.loop.run_forever()
            self.loop.close()

        self.thread = threading.Thread(target=run, name="kubelet-streaming", daemon=True)
        self.thread.start()
        ready.wait(30)
        if failed:
            raise failed[0]
        return self

    def stop(self) -> None:
        if self.loop is None or self.loop.is_closed() or self._server is None:
            return

        async def shutdown():
            self._server.close()
            for s in list(self.sessions):
                s.closed = True
                s.writer.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(15)
        except Exception as e:  # noqa: BLE001 - stopping anyway
            self.log(f"kubelet: streaming server shutdown: {e!r}")
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self.thread:
            self.thread.join(15)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                    ConnectionError, OSError, ssl.SSLError):
                return
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, target, _ = (request_line.split(" ", 2) + ["", ""])[:3]
            headers: dict[str, list[str]] = {}
            for line in lines:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers.setdefault(k.strip().lower(), []).append(v.strip())
            length = int((headers.get("content-length") or ["0"])[0] or 0)
            if length:
                await reader.readexactly(length)
            path = urllib.parse.urlsplit(target).path
            answer = self._upgrade(method, path, headers)
            if isinstance(answer, bytes):
                writer.write(answer)
                await writer.drain()
                return
            pod, protocol = answer
            writer.write(("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                          f"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\n\r\n").encode())
            await writer.drain()
            session = Session(self, reader, writer, pod)
            self.sessions.add(session)
            self.log(f"kubelet: port-forward session to {pod[0]}/{pod[1]} opened")
            try:
                await session.run()
            finally:
                self.sessions.discard(session)
                self.log(f"kubelet: port-forward session to {pod[0]}/{pod[1]} closed")
        except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _upgrade(self, method: str, path: str, headers: dict[str, list[str]]):
        """The pod and protocol of a port-forward upgrade, or the HTTP response refusing it."""
        if path == "/healthz" and method == "GET":
            return _response("200 OK", body="ok")
        m = PATH.match(path)
        if not m:
            return _response("404 Not Found", body="404 page not found")
        if method not in ("GET", "POST"):
            return _response("405 Method Not Allowed", body=f"{method} not allowed")
        ns, name, uid = (urllib.parse.unquote(g) if g else g for g in m.groups())
        found = self.resolve(ns, name)
        if found is None or (uid and uid != found[1]):
            return _response("404 Not Found", body=f'pod "{ns}/{name}" not found on this node')
        wanted = [p.strip() for v in headers.get("x-stream-protocol-version", []) for p in v.split(",")
                  if p.strip()]
        if not wanted:
            return _response("400 Bad Request",
                             body="unable to upgrade: X-Stream-Protocol-Version is required")
        protocol = next((p for p in wanted if p in PORT_FORWARD_PROTOCOLS), None)
        if protocol is None:
            return _response("403 Forbidden",
                             {"X-Accepted-Stream-Protocol-Versions": ", ".join(PORT_FORWARD_PROTOCOLS)},
                             f"unable to upgrade: unable to negotiate protocol: client supports {wanted}, "
                             f"server accepts {list(PORT_FORWARD_PROTOCOLS)}")
        connection = " ".join(headers.get("connection", [])).lower()
        upgrade = " ".join(headers.get("upgrade", [])).lower()
        if "upgrade" not in connection or "spdy/3.1" not in upgrade:
            return _response("400 Bad Request", body="unable to upgrade: missing upgrade headers in request")
        return (ns, name, found[0], found[1]), protocol
