"""Free TCP ports for the processes the tests start, chosen outside the kernel's ephemeral range.

A port from ``bind(("127.0.0.1", 0))`` is an *ephemeral* port: once that socket is closed, the
kernel may hand the same number to any outgoing connection (a client of a test, or a process
talking to itself, as ``weed mini``'s filer does to its master before its S3 gateway listens), and
the process the port was meant for then fails with "address already in use". Ports below
``ip_local_port_range`` are never given to outgoing connections, so a port chosen there stays free
until someone listens on it on purpose. Each call hands out the next port of a per-process walk
(from a random start) that binds now, so one test run does not hand the same port out twice while
its first user may still be starting.
"""

from __future__ import annotations

import os
import random
import socket
import threading

_LOW = 10_000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_HIGH = max(_ephemeral_low(), _LOW + 1_000)
_lock = threading.Lock()
_next = random.Random(os.getpid()).randrange(_LOW, _HIGH)


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now, below the ephemeral range, not handed out recently."""
    global _next
    with _lock:
        for _ in range(_HIGH - _LOW):
            port = _next
            _next = _LOW if _next + 1 >= _HIGH else _next + 1
            if _bindable(host, port):
                return port
    raise AssertionError(f"no free port in [{_LOW}, {_HIGH}) on {host}")
