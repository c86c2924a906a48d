"""The HTTP client of the Hub store: httpx2 whose every socket read and write waits at most what the
request's clock has left, and the one mapping of its failures to typed errors.

httpx's timeouts are per socket operation: a server that sends one byte every 20 s never times out. Here
each read and write of a connection is bounded by the `marin_data.stores.limits.RequestClock` of the request
the calling thread waits on (set by `RequestClock.running`), so a request ends on time whatever the server
does, in the answer's head as in its body. `mapped_errors` turns whatever httpx2 raises (a reset, a
truncated or undecodable body, a redirect loop, bytes that are not HTTP) into `RetryableRemoteError` (a
timeout: `TooSlowError`) or `RemoteError` naming the URL.
"""

from __future__ import annotations

from typing import Any

import httpcore2
import httpx2

from marin_data.errors import MarinDataError, RemoteError, RetryableRemoteError, TooSlowError
from marin_data.stores.limits import current_clock

__all__ = ["IDLE_TIMEOUT", "CONNECT_TIMEOUT", "MAX_REDIRECTS", "http_client", "mapped_errors"]

IDLE_TIMEOUT = 60.0  # seconds without a byte before a read gives up, whatever the clock says
CONNECT_TIMEOUT = 10.0
MAX_REDIRECTS = 10  # the Hub redirects a resolve once, to its CDN


def _bounded(timeout: float | None) -> float | None:
    """``timeout`` shortened to what the current request's clock has left; raise once it has run out."""
    clock = current_clock()
    if clock is None:
        return timeout
    left = clock.remaining()
    if left <= 0:
        raise httpcore2.ReadTimeout(str(clock.late()))
    return left if timeout is None else min(timeout, left)


class _ClockedStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore2.NetworkStream:
        return _ClockedStream(self._inner.start_tls(ssl_context, server_hostname, _bounded(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _ClockedBackend(httpcore2.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore2.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _ClockedStream(self._inner.connect_tcp(host, port, _bounded(timeout), local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _ClockedStream(self._inner.connect_unix_socket(path, _bounded(timeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _ClockedTransport(httpx2.HTTPTransport):
    """httpx2's transport over a connection pool whose sockets follow the request clock. HTTPTransport takes
    no network backend, so its pool is replaced by one built the same way with ours."""

    def __init__(self, limits: httpx2.Limits) -> None:
        super().__init__(limits=limits)
        self._pool = httpcore2.ConnectionPool(
            ssl_context=httpx2.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_ClockedBackend())


def http_client(max_connections: int) -> httpx2.Client:
    """The client: redirects followed (credentials dropped when one leaves the host), no retries of its own.
    A proxy named in the environment gets httpx2's own transport, which the clock does not reach."""
    limits = httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx2.Client(timeout=httpx2.Timeout(IDLE_TIMEOUT, connect=CONNECT_TIMEOUT), follow_redirects=True,
                         max_redirects=MAX_REDIRECTS, transport=_ClockedTransport(limits))


class mapped_errors:
    """Turn every failure of httpx2 (and of the socket under it) into `RetryableRemoteError` naming ``where``;
    a redirect loop or an unusable URL, which retrying cannot fix, into `RemoteError`."""

    def __init__(self, where: str):
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, etype, exc, tb) -> bool:
        if exc is None or isinstance(exc, MarinDataError) or not isinstance(exc, Exception):
            return False
        clock = current_clock()
        if clock is not None and clock.remaining() <= 0:  # a read cut at the end of the request's time
            raise clock.late() from exc
        if isinstance(exc, httpx2.TooManyRedirects):
            raise RemoteError(f"redirected more than {MAX_REDIRECTS} times: a redirect loop", path=self.where) from exc
        if isinstance(exc, (httpx2.InvalidURL, httpx2.UnsupportedProtocol)):
            raise RemoteError(f"{type(exc).__name__}: {exc}", path=self.where) from exc
        if isinstance(exc, (httpx2.TimeoutException, httpcore2.TimeoutException)):  # silent past a timeout
            raise TooSlowError(f"{type(exc).__name__}: {exc}", path=self.where) from exc
        if isinstance(exc, (httpx2.HTTPError, httpx2.StreamError, httpcore2.ReadTimeout, OSError)):
            kind = "undecodable body" if isinstance(exc, httpx2.DecodingError) else type(exc).__name__
            raise RetryableRemoteError(f"{kind}: {exc}", path=self.where) from exc
        return False
