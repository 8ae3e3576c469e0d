"""A TCP proxy between processes, for network faults in multi-process tests: what stands in
front of a cluster as its gateway, spreading connections over its servers, and that a test
partitions and heals.

``TcpProxy`` listens on 127.0.0.1 (a free port, or the one given) and forwards each
connection to the next of its ``targets`` (``host:port``, round robin; settable at any time,
read per connection). It runs an asyncio loop in a thread of its own, so a synchronous test
(and its client threads) drives it with plain calls:

* ``partition()``: a black hole, as when a network drops every packet. No byte passes any
  more, in either direction, on the connections that are open (what they send is held, so
  their TCP windows fill and writes block); new connections are accepted but held, with no
  upstream. Nothing is refused or reset: a client finds out only through its own timeouts or
  keep-alives, the hard case. ``partition(reset=True)`` also aborts the open connections at
  once (a gateway that restarts).
* ``heal()``: bytes flow again. The held connections reach their targets, and what the open
  ones held is delivered, as TCP would after a partition heals (those whose client gave up
  meanwhile end when they read its close).

``forwarded`` counts the connections that reached a target; ``held`` the connections accepted
during the current partition."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterable

CHUNK = 1 << 16


class TcpProxy:
    def __init__(self, targets: Iterable[str] = (), port: int = 0):
        self._targets: list[str] = list(targets)
        self._round = itertools.count()
        self._port = port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"tcpproxy:{port}")
        self._server: asyncio.base_events.Server | None = None
        self._open: asyncio.Event | None = None
        # Every open connection's transports (client side, and upstream once connected).
        self._connections: set[asyncio.Transport] = set()
        self.forwarded = 0
        self.held = 0
        self.address = ""

    # -- control (from any thread) ------------------------------------------------------------

    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._start())
        return self

    def close(self):
        if self._thread.is_alive():
            self._call(self._close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    @property
    def targets(self) -> list[str]:
        return list(self._targets)

    @targets.setter
    def targets(self, targets: Iterable[str]):
        self._targets = list(targets)

    def partition(self, reset: bool = False):
        """From now on no byte passes; held until ``heal``. With ``reset``, the open
        connections are aborted too."""
        self._call(self._partition(reset))

    def heal(self):
        self._call(self._heal())

    @property
    def partitioned(self) -> bool:
        return self._open is not None and not self._open.is_set()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    # -- the loop -----------------------------------------------------------------------------

    async def _start(self):
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    async def _close(self):
        if self._server is not None:
            self._server.close()
        self._open.set()
        for t in list(self._connections):
            t.abort()

    async def _partition(self, reset: bool):
        self._open.clear()
        self.held = 0
        if reset:
            for t in list(self._connections):
                t.abort()

    async def _heal(self):
        self._open.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        own = [writer.transport]
        self._connections.add(writer.transport)
        try:
            if not self._open.is_set():
                self.held += 1
            await self._open.wait()
            targets = self._targets
            if not targets:
                return  # nowhere to go yet: closed, the client tries again
            host, port = targets[next(self._round) % len(targets)].rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
            except OSError:
                return
            own.append(up_writer.transport)
            self._connections.add(up_writer.transport)
            self.forwarded += 1
            pumps = [asyncio.ensure_future(self._pump(reader, up_writer)),
                     asyncio.ensure_future(self._pump(up_reader, writer))]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()
        finally:
            for t in own:
                self._connections.discard(t)
                t.abort()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter):
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    return
                # Read, but not passed on while partitioned: held as a dropped packet would be
                # retransmitted later.
                await self._open.wait()
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            return
