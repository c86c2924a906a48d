"""Stalled downloads against a server, and that server's memory: what `marin-data serve` spends on clients
that ask for a large file and never read it (tests/test_mirror_memory.py, benchmarks/bench_mirror_load.py).

`stalled_downloads` opens ``n`` sockets that each send one GET and never read the answer (a 4 KiB receive
buffer, so the stall begins at once); `settled_rss` reads a process's resident memory once it has stopped
moving (the server has sent what the sockets take, or freed what their closing released).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

__all__ = ["rss_bytes", "settled_rss", "stalled_downloads"]


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (``VmRSS``), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise RuntimeError(f"no VmRSS for process {pid}")


def settled_rss(pid: int, *, quiet: float = 1.0, timeout: float = 30.0, tolerance: int = 256 << 10) -> int:
    """``rss_bytes(pid)`` once it has moved less than ``tolerance`` over ``quiet`` seconds (at most
    ``timeout`` seconds of waiting; then the last reading)."""
    deadline = time.monotonic() + timeout
    last, since = rss_bytes(pid), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = rss_bytes(pid)
        if abs(now - last) > tolerance:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return now
    return rss_bytes(pid)


@contextlib.contextmanager
def stalled_downloads(host: str, port: int, path: str, n: int) -> Iterator[list[socket.socket]]:
    """``n`` connections that each ``GET path`` and never read the answer; all closed on exit."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(10)
            s.connect((host, port))
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        yield socks
    finally:
        for s in socks:
            s.close()
