"""An asyncio HTTP/1.1 front for a WSGI app: idle and slow clients cost a socket, never a worker thread.

One event loop reads every request head, and every body the app could read before checking credentials,
itself, under the size and time limits of `Limits`; only a complete request reaches the app, which runs on
a bounded pool of worker threads. A file body (`FileSpan`) is sent by the loop with ``sendfile``, from the page
cache to the socket in pieces of ``send_buffer`` bytes, none of them through this process's memory; any other
body is pulled from the app's iterable one chunk at a time on that pool and sent by the loop. So a client that
reads slowly holds a socket (and its kernel buffers) and an open file, or one chunk of a small answer, never
a worker.
Bodies of requests that carry credentials (``streams_body``) stream to the app as they arrive (a multi-GB
LFS upload never sits in memory); the app checks the credentials before it reads. How a body is read, on the
loop and by the app: `marin_data.mirror.request_body`.

Answers of the front itself: 400 (malformed), 408 (head or body too slow), 413 (body too large),
414 (request line too long), 431 (headers too large), 501 (a transfer coding other than chunked), 503 (too
many connections), 505 (not HTTP/1.x); each closes the connection and is logged like any request.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import json
import logging
import re
import socket
import sys
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote_to_bytes

from marin_data.mirror.http import MAX_JSON_BODY, FileSpan
from marin_data.mirror.request_body import Body, Refuse, ThreadBody

__all__ = ["Limits", "HttpFront"]

access_log = logging.getLogger("marin_data.mirror.access")
log = logging.getLogger(__name__)

_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # a header name (RFC 9110 token)
_NO_BODY = (204, 304)


@dataclass(frozen=True)
class Limits:
    """What one client may make the server hold, and for how long (sizes in bytes, times in seconds)."""

    max_request_line: int = 8 << 10  # 414 beyond; also the longest header line (431 beyond)
    max_head: int = 64 << 10  # request line and headers together; 431 beyond
    max_headers: int = 100  # header lines; 431 beyond
    max_buffered_body: int = MAX_JSON_BODY  # a body read before the app checks credentials; 413 beyond
    idle_timeout: float = 60.0  # waiting for the first byte of a request (also between keep-alive requests)
    head_timeout: float = 10.0  # from the first byte of a request to the end of its head; 408 beyond
    body_timeout: float = 30.0  # waiting for the next bytes of a body; 408 (or a cut connection) beyond
    send_timeout: float = 60.0  # waiting for a client to take more of a response; the connection is cut
    max_connections: int = 4096  # open connections; more are answered 503 and closed
    send_buffer: int = 256 << 10  # response bytes queued per connection before waiting for the client; also
    # a file's sendfile piece, which the client must take within send_timeout


class HttpFront:
    """Serve ``app`` over HTTP/1.1 from ``loop``, calling it on ``pool``.

    Args:
        app: the WSGI application.
        pool: the bounded executor the app (and the iteration of its responses) runs on.
        limits: the sizes and times of `Limits`.
        streams_body: true for a request (its WSGI environ, without the body) whose body the app reads
            only after checking the credentials it carries; other bodies are read whole, at most
            ``limits.max_buffered_body`` bytes, before the app is called.
        server_name: the ``Server`` header.
    """

    def __init__(self, app: Callable, pool: Executor, *, limits: Limits, streams_body: Callable[[dict], bool],
                 server_name: str):
        self.app, self.pool, self.limits = app, pool, limits
        self.streams_body = streams_body
        self.server_name = server_name
        self.connections: set[asyncio.Task] = set()
        self.bound: tuple[str, int] = ("", 0)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.connections.add(task)
        writer.transport.set_write_buffer_limits(high=self.limits.send_buffer)
        peer = (writer.get_extra_info("peername") or ("-", 0))[:2]
        try:
            if len(self.connections) > self.limits.max_connections:
                await self._refuse(writer, peer, Refuse(503, "too many connections; retry later"))
                return
            while await self._one_request(reader, writer, peer):
                pass
        except (ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass  # the client went away or stalled: nothing to answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        except Exception:  # noqa: BLE001 - one connection's bug never stops the server
            log.exception("error on a connection from %s", peer[0])
        finally:
            self.connections.discard(task)
            writer.close()
            if not self.connections:
                _trim_heap()

    # --- one request -------------------------------------------------------------------------------------
    async def _one_request(self, reader, writer, peer) -> bool:
        """Serve one request; True to keep the connection for the next one."""
        lim = self.limits
        try:
            first = await asyncio.wait_for(reader.read(1), lim.idle_timeout)
        except asyncio.TimeoutError:
            return False
        if not first:
            return False
        head = first
        try:
            try:
                head += await asyncio.wait_for(self._head(reader, first), lim.head_timeout)
            except asyncio.TimeoutError:
                raise Refuse(408, f"request head not received within {lim.head_timeout:g} s") from None
            environ, body = self._environ(head, peer, reader)
            if body is not None and not self.streams_body(environ):
                if body.left is not None and body.left > lim.max_buffered_body:
                    raise Refuse(413, f"request body over {lim.max_buffered_body} bytes")
                environ["wsgi.input"] = io.BytesIO(await self._buffer(body, environ, writer))
            elif body is not None:
                self._continue(environ, writer)
                environ["wsgi.input"] = io.BufferedReader(ThreadBody(body, asyncio.get_running_loop(),
                                                                      lim.body_timeout), 64 << 10)
            else:
                environ["wsgi.input"] = io.BytesIO()
        except Refuse as e:
            await self._refuse(writer, peer, e, head)
            return False
        keep = await self._respond(environ, writer)
        return keep and (body is None or await self._discard(body))

    async def _head(self, reader: asyncio.StreamReader, first: bytes) -> bytes:
        lim = self.limits
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise Refuse(414, f"request line over {lim.max_request_line} bytes") from None
        if len(first) + len(line) > lim.max_request_line:
            raise Refuse(414, f"request line over {lim.max_request_line} bytes")
        head, count = line, 0
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.LimitOverrunError:
                raise Refuse(431, f"a header line over {lim.max_request_line} bytes") from None
            head += line
            count += 1
            if len(head) > lim.max_head or count > lim.max_headers + 1:
                raise Refuse(431, f"request headers over {lim.max_head} bytes or {lim.max_headers} lines")
            if line in (b"\r\n", b"\n"):
                return head

    def _environ(self, head: bytes, peer, reader: asyncio.StreamReader) -> tuple[dict, Body | None]:
        lines = head.decode("latin-1").split("\n")
        parts = lines[0].rstrip("\r").split(" ")
        if len(parts) != 3 or not parts[0].isalpha():
            raise Refuse(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise Refuse(505, f"{version[:20]!r} is not HTTP/1.0 or HTTP/1.1")
        if any(ord(c) < 0x21 or ord(c) > 0x7E for c in target):
            raise Refuse(400, "the request target must be printable ASCII")
        headers: dict[str, str] = {}
        for raw in lines[1:]:
            raw = raw.rstrip("\r")
            if not raw:
                continue
            name, sep, value = raw.partition(":")
            if not sep or not _TOKEN.match(name.encode("latin-1")) or "\0" in value or "\r" in value:
                raise Refuse(400, "malformed header line")
            key = name.upper().replace("-", "_")
            key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
            value = value.strip(" \t")
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        path, _, query = target.partition("?")
        if "://" in path:  # absolute form: keep the path
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        host, port = self.bound
        environ = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
            "QUERY_STRING": query, "REQUEST_URI": target, "RAW_URI": target, "SERVER_PROTOCOL": version,
            "SERVER_NAME": host, "SERVER_PORT": str(port), "REMOTE_ADDR": str(peer[0]),
            "REMOTE_PORT": str(peer[1]), "SERVER_SOFTWARE": self.server_name,
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True, **headers,
        }
        return environ, self._body_of(environ, reader)

    def _body_of(self, environ: dict, reader: asyncio.StreamReader) -> Body | None:
        te = environ.get("HTTP_TRANSFER_ENCODING")
        length = environ.get("CONTENT_LENGTH")
        if te is not None:
            if length is not None:
                raise Refuse(400, "both Content-Length and Transfer-Encoding: refused (request smuggling)")
            if te.strip().lower() != "chunked":
                raise Refuse(501, f"transfer coding {te[:40]!r} is not supported (only chunked)")
            environ.pop("CONTENT_LENGTH", None)
            return Body(reader, None, self.limits.body_timeout)
        if length is None:
            return None
        if not length.isdigit():
            raise Refuse(400, "malformed Content-Length")
        return Body(reader, int(length), self.limits.body_timeout) if int(length) else None

    async def _buffer(self, body: Body, environ: dict, writer) -> bytes:
        self._continue(environ, writer)
        out = bytearray()
        try:
            while not body.done:
                out += await body.read(64 << 10)
                if len(out) > self.limits.max_buffered_body:
                    raise Refuse(413, f"request body over {self.limits.max_buffered_body} bytes")
        except asyncio.TimeoutError:
            raise Refuse(408, f"request body stalled for {self.limits.body_timeout:g} s") from None
        return bytes(out)

    async def _discard(self, body: Body) -> bool:
        """Read what the app left of a body (it refused the request before reading), up to
        ``max_buffered_body`` bytes within ``head_timeout``: closing with unread bytes would reset the
        connection, and the client could lose the answer. True when the body was read to its end."""
        left = self.limits.max_buffered_body
        try:
            async with asyncio.timeout(self.limits.head_timeout):
                while not body.done and left > 0:
                    left -= len(await body.read(64 << 10))
        except (TimeoutError, Refuse):
            return False
        return body.done

    @staticmethod
    def _continue(environ: dict, writer) -> None:
        if environ.get("HTTP_EXPECT", "").lower() == "100-continue" and environ["SERVER_PROTOCOL"] == "HTTP/1.1":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    # --- responses ---------------------------------------------------------------------------------------
    async def _respond(self, environ: dict, writer: asyncio.StreamWriter) -> bool:
        loop = asyncio.get_running_loop()
        status, headers, result, chunks, first = await loop.run_in_executor(self.pool, _call_app, self.app,
                                                                            environ)
        try:
            code = int(status.split(" ", 1)[0])
            length = next((int(v) for k, v in headers if k.lower() == "content-length"), None)
            head_only = environ["REQUEST_METHOD"] == "HEAD" or code in _NO_BODY or code < 200
            http11 = environ["SERVER_PROTOCOL"] == "HTTP/1.1"
            conn = environ.get("HTTP_CONNECTION", "").lower()
            keep = ("close" not in conn) if http11 else ("keep-alive" in conn)
            chunked = not head_only and length is None and http11
            keep = keep and (head_only or length is not None or chunked)
            out = [f"HTTP/1.1 {status}"]
            out += [f"{k}: {v}" for k, v in headers if k.lower() not in ("connection", "transfer-encoding")]
            out += [f"Date: {formatdate(usegmt=True)}", f"Server: {self.server_name}"]
            out += ["Transfer-Encoding: chunked"] if chunked else []
            out += ["Connection: close" if not keep else ("Connection: keep-alive" if not http11 else "")]
            writer.write(("\r\n".join(o for o in out if o) + "\r\n\r\n").encode("latin-1"))
            sent = 0
            if isinstance(result, FileSpan) and not head_only:
                sent = await self._send_file(writer, result) if not chunked else 0
                if sent == result.length:
                    head_only = True  # the body is sent
                else:  # sendfile unavailable, or the file shrank: the rest is read and written
                    chunks = iter(FileSpan(result.file, result.start + sent, result.length - sent, result.block))
                    first = await loop.run_in_executor(self.pool, next, chunks, None)
            chunk = first
            while chunk is not None and not head_only:
                if chunk:
                    writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    sent += len(chunk)
                    await asyncio.wait_for(writer.drain(), self.limits.send_timeout)
                chunk = await loop.run_in_executor(self.pool, next, chunks, None)
            if chunked:
                writer.write(b"0\r\n\r\n")
            await asyncio.wait_for(writer.drain(), self.limits.send_timeout)
            return keep and (head_only or length is None or sent == length)
        finally:
            if hasattr(result, "close"):
                await loop.run_in_executor(self.pool, result.close)

    async def _send_file(self, writer: asyncio.StreamWriter, span: FileSpan) -> int:
        """Send what it can of ``span`` with ``sendfile``, ``send_buffer`` bytes a call, each taken within
        ``send_timeout`` (one call for the whole would give a slow client no deadline, or cut a long
        download); return the bytes sent. Fewer than the span when the file shrank or sendfile is not
        available: the caller writes the rest. asyncio's own fallback is not used, since it also stands for
        a connection the client reset, on which it would wait out the timeout."""
        loop, piece = asyncio.get_running_loop(), max(1, self.limits.send_buffer)
        sent = 0
        while sent < span.length:
            try:
                n = await asyncio.wait_for(
                    loop.sendfile(writer.transport, span.file, span.start + sent, min(piece, span.length - sent),
                                  fallback=False), self.limits.send_timeout)
            except (asyncio.SendfileNotAvailableError, RuntimeError):
                if writer.transport.is_closing() or not _established(writer):  # the client went away
                    raise ConnectionResetError("the client closed the connection") from None
                return sent  # sendfile is not available here: the caller writes the rest
            if not n:
                break
            sent += n
        return sent

    async def _refuse(self, writer, peer, e: Refuse, head: bytes = b"") -> None:
        method, target = (head.split(b" ", 2)[:2] + [b"-", b"-"])[:2] if head else (b"-", b"-")
        access_log.info("%s %s %s %s", peer[0], method.decode("latin-1")[:16], target.decode("latin-1")[:200],
                        e.status)
        body = json.dumps({"error": e.message}).encode()
        writer.write((f"HTTP/1.1 {e.status} {HTTPStatus(e.status).phrase}\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nX-Error-Message: {e.message}\r\nConnection: close\r\n"
                      f"Date: {formatdate(usegmt=True)}\r\nServer: {self.server_name}\r\n\r\n").encode() + body)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.send_timeout)
        except (ConnectionError, asyncio.TimeoutError):
            pass


def _call_app(app: Callable, environ: dict):
    """Run the app up to its first body chunk (by then it has called ``start_response``), on a worker."""
    got: list = []

    def start_response(status, headers, exc_info=None):
        if exc_info and got:
            raise exc_info[1].with_traceback(exc_info[2])
        got[:] = [status, headers]
        return _no_write

    result = app(environ, start_response)
    if isinstance(result, FileSpan):  # sent with sendfile by the loop: nothing read here
        if not got:
            raise RuntimeError("the WSGI app returned without calling start_response")
        return got[0], got[1], result, None, None
    chunks = iter(result)
    first = next(chunks, None)
    if not got:
        raise RuntimeError("the WSGI app returned without calling start_response")
    return got[0], got[1], result, chunks, first


def _established(writer: asyncio.StreamWriter) -> bool:
    """Whether the connection is still open at the TCP level (Linux's ``TCP_INFO``; elsewhere assumed so,
    and the writes that follow find out)."""
    sock = writer.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_INFO"):
        return True
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return False
    return state in (_TCP_ESTABLISHED, _TCP_CLOSE_WAIT)  # CLOSE_WAIT: the client only stopped sending


_TCP_ESTABLISHED, _TCP_CLOSE_WAIT = 1, 8  # linux/tcp_states.h


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; elsewhere there is none, and nothing to do
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _load_malloc_trim()


def _trim_heap() -> None:
    """Hand the heap memory freed by closed connections back to the system (glibc keeps it otherwise, and a
    burst of connections would leave the server at its high-water mark); called when the last one closes."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _no_write(data: bytes) -> None:
    raise NotImplementedError("this server does not support the WSGI write() callable; return an iterable")
