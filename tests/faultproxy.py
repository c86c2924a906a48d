"""A fault-injecting HTTP proxy on loopback, for tests only.

It sits between a client (boto3 pointed at ``proxy.endpoint``) and a real server (moto), forwards every
request, and on demand breaks responses the ways networks and stores do: a connection dropped mid-body, an
error status with ``Retry-After``, a 200 where a 206 was asked, a body truncated under a consistent
``Content-Length``, a corrupted body, or a slow body. It counts the body bytes it sends per object, so tests
can prove that finished files are never fetched again, and logs each request (method, path, Range, status,
headers) so tests can see what the client asked for.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from marin_data.testing.loopback import LoopbackServer

__all__ = ["Fault", "Logged", "FaultProxy"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
_CHUNK = 64 << 10


@dataclass
class Fault:
    """One kind of breakage for requests whose path contains ``match`` (``times`` requests, then gone).

    kind: ``drop`` (close the connection after ``fraction`` of the body), ``status`` (answer ``status`` with
    ``retry_after``), ``ignore_range`` (drop the Range header: a 200 with the whole object), ``truncate``
    (send ``fraction`` of the body with a Content-Length that agrees), ``corrupt`` (flip one byte),
    ``slow`` (sleep ``delay`` seconds per 64 KiB).
    """

    kind: str
    match: str = ""
    times: int = 1
    method: str = "GET"
    status: int = 503
    retry_after: str | None = None
    fraction: float = 0.5
    delay: float = 0.0


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    status: int
    headers: dict = field(default_factory=dict)
    fault: str | None = None


class FaultProxy(LoopbackServer):
    """``with FaultProxy("http://127.0.0.1:5000") as proxy: ... proxy.endpoint ...``"""

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.faults: list[Fault] = []
        self.served: Counter[str] = Counter()  # body bytes sent for GETs, by path
        self.log: list[Logged] = []
        self.lock = threading.Lock()
        self._active = 0  # requests being forwarded right now
        super().__init__(_handler(self))

    def add(self, fault: Fault) -> None:
        with self.lock:
            self.faults.append(fault)

    def clear(self) -> None:
        with self.lock:
            self.faults.clear()

    def reset_counts(self) -> None:
        with self.lock:
            self.served.clear()
            self.log.clear()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until no request is being forwarded: a killed client's responses may still be streaming (and
        counting) for a moment after it died."""
        deadline = time.monotonic() + timeout
        while self._active and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._active:
            raise TimeoutError(f"{self._active} requests still in flight after {timeout} s")

    def requests(self, path_part: str, method: str = "GET") -> list[Logged]:
        with self.lock:
            return [r for r in self.log if path_part in r.path and r.method == method]

    def _take(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for f in self.faults:
                if f.times > 0 and f.method == method and f.match in path:
                    f.times -= 1
                    return f
        return None

    def _record(self, entry: Logged) -> None:
        with self.lock:
            self.log.append(entry)

    def _count(self, path: str, n: int) -> None:
        with self.lock:
            self.served[path] += n

    def rewrite_request(self, method: str, target: str, headers: dict) -> tuple[str, dict]:
        """The request target (path and query) and headers sent upstream: as they came (a subclass that
        plays another server rewrites them)."""
        return target, headers

    def rewrite_response(self, method: str, target: str, status: int, headers: list[tuple[str, str]],
                         body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """The upstream answer as it is passed on: unchanged (a subclass that plays another server rewrites
        it; ``target`` is what the client asked for)."""
        return status, headers, body


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            self._forward()

        def do_HEAD(self) -> None:
            self._forward()

        def do_PUT(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def do_DELETE(self) -> None:
            self._forward()

        def _forward(self) -> None:
            with proxy.lock:
                proxy._active += 1
            try:
                self._forward_one()
            finally:
                with proxy.lock:
                    proxy._active -= 1

        def _forward_one(self) -> None:
            path = urlsplit(self.path).path
            fault = proxy._take(self.command, path)
            kind = fault.kind if fault else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if kind == "status":
                self._error(fault, path, headers)
                return
            if kind == "ignore_range":
                headers = {k: v for k, v in headers.items() if k.lower() != "range"}
            target, headers = proxy.rewrite_request(self.command, self.path, headers)
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                conn.request(self.command, target, body=body, headers=headers)
                resp = conn.getresponse()
                status, answer, data = proxy.rewrite_response(self.command, self.path, resp.status,
                                                              resp.getheaders(), resp.read())
            finally:
                conn.close()
            proxy._record(Logged(self.command, path, self.headers.get("Range"), status, dict(self.headers), kind))
            out = data
            if kind == "truncate":
                out = data[: int(len(data) * fault.fraction)]
            elif kind == "corrupt" and data:
                i = len(data) // 2
                out = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
            self.send_response(status)
            for k, v in answer:
                if k.lower() not in _HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            head = self.command == "HEAD"  # no body: pass the object's length through
            length = next((v for k, v in answer if k.lower() == "content-length"), "0")
            self.send_header("Content-Length", length if head else str(len(out)))
            self.end_headers()
            if head:
                return
            stop = int(len(out) * fault.fraction) if kind == "drop" else len(out)
            for i in range(0, stop, _CHUNK):
                piece = out[i:min(i + _CHUNK, stop)]
                self.wfile.write(piece)
                if self.command == "GET":
                    proxy._count(path, len(piece))
                if kind == "slow":
                    self.wfile.flush()
                    time.sleep(fault.delay)
            if kind == "drop":
                self.wfile.flush()
                self.close_connection = True

        def _error(self, fault: Fault, path: str, headers: dict) -> None:
            proxy._record(Logged(self.command, path, self.headers.get("Range"), fault.status, headers, "status"))
            body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
                    f"<Message>injected {fault.status}</Message></Error>").encode()
            self.send_response(fault.status)
            if fault.retry_after is not None:
                self.send_header("Retry-After", fault.retry_after)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

    return Handler
