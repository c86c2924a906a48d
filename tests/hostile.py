"""A hostile server on loopback, for tests only: a Hub-compatible and an S3-compatible endpoint in one.

It serves a real local corpus honestly (the Hub's revision, tree and resolve routes; S3's path-style GET and
HEAD of ``/bucket/prefix/key`` and ListObjectsV2), except for the requests a `Hostility` matches, which it
answers the ways a broken or malicious server can:

``endless``        the honest answer (200 or 206), then zeros with no end (close-delimited)
``whole``          a 200 with the whole file then zeros with no end, whatever ``Range`` asked
``wrong_range``    a 206 whose ``Content-Range`` starts elsewhere than asked
``drip``           honest headers, then one body byte every `DRIP_SECONDS`
``drip_head``      the status line and headers one byte every `DRIP_SECONDS`
``redirect_loop``  302 to itself
``bad_encoding``   ``Content-Encoding: gzip`` over bytes that are not gzip
``cut_chunked``    a chunked body cut mid-chunk, without its last chunk
``reset``          half of the body, then a TCP reset
``tls``            bytes of a TLS handshake, not HTTP
``bad_http``       a malformed status line and header
``missing``        404 (a file the store lacks)
``endless_tree``   tree pages (and ListObjectsV2 pages) of `PAGE_ENTRIES` entries, each naming a next page

``listed_sizes`` rewrites what ListObjectsV2 says of a file's size: ``{path: "-5"}``, or None for no ``<Size>``.
``page_keys`` cuts ListObjectsV2's answer into pages of that many keys (continuation tokens "1", "2", ...), and
``pages`` makes them lie: "changes" (every listing after the first lacks its second page's first key),
"loop" (the last page's token is the first one's again: the pages never end) or "backwards" (the pages in
reverse order, so each page's keys come before the last page's). ``listings`` counts listings started.

Endless answers stop after `CAP` bytes (and endless listings after `CAP_PAGES` pages) so that a client
without bounds fills memory for the test to see, not the machine. ``served`` counts body bytes sent,
``hostile`` the requests answered the hostile way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from marin_data.stores.hub_ids import git_blob_sha1, is_lfs
from marin_data.testing.loopback import LoopbackServer

__all__ = ["Hostility", "HostileServer", "MODES", "CAP", "DRIP_SECONDS"]

MODES = ("endless", "whole", "wrong_range", "drip", "drip_head", "redirect_loop", "bad_encoding", "cut_chunked",
         "reset", "tls", "bad_http", "missing", "endless_tree")
CAP = 768 << 20  # an endless body ends here: past any bound a fixed client keeps
CAP_PAGES = 50  # 50 pages of 10,000 entries: ~110 MB of JSON, ~1 GB parsed
PAGE_ENTRIES = 10_000  # ~2.2 MiB a tree page: the bound is reached over pages, not in one
DRIP_SECONDS = 0.4
_ZEROS = bytes(256 << 10)
COMMIT = "c0ffee" + "0" * 34


@dataclass
class Hostility:
    """Answer requests whose path contains ``match`` (and whose method is in ``methods``) in ``mode``."""

    mode: str
    match: str = ""
    methods: tuple[str, ...] = ("GET", "HEAD")
    ranged_only: bool = False  # only requests carrying a Range header


class HostileServer(LoopbackServer):
    """``with HostileServer(corpus_root) as srv: srv.hub_url / srv.s3_url / srv.endpoint``."""

    def __init__(self, root: Path, *, repo: str = "team/corpus", bucket: str = "bkt", prefix: str = "corpus"):
        self.files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        self.repo, self.bucket, self.prefix = repo, bucket, prefix
        self.hostility: Hostility | None = None
        self.listed_sizes: dict[str, str | None] = {}
        self.page_keys: int | None = None
        self.pages: str | None = None
        self.served = self.hostile = self.listings = 0
        self.lock = threading.Lock()
        super().__init__(_handler(self))
        self.hub_url = f"hf://datasets/{repo}"
        self.s3_url = f"s3://{bucket}/{prefix}"

    def store_args(self, kind: str) -> list[str]:
        """The URL and CLI options that reach this server as a ``kind`` ("hf" or "s3") store."""
        if kind == "hf":
            return [self.hub_url, "--endpoint", self.endpoint]
        return [self.s3_url, "--endpoint-url", self.endpoint, "--anonymous"]

    def store_options(self, kind: str) -> dict:
        """The same for `open_store` / `make_loader`: (url, options)."""
        if kind == "hf":
            return {"endpoint": self.endpoint}
        return {"endpoint_url": self.endpoint, "anonymous": True}

    def url(self, kind: str) -> str:
        return self.hub_url if kind == "hf" else self.s3_url

    def tree(self) -> list[dict]:
        out = []
        gone = self.hostility.match if self.hostility and self.hostility.mode == "missing" else None
        for path, data in self.files.items():
            if gone is not None and gone in path:
                continue
            entry = {"type": "file", "path": path, "size": len(data), "oid": git_blob_sha1(data)}
            if is_lfs(path, len(data), data[:512]):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 130}
            out.append(entry)
        return out

    def matches(self, method: str, path: str, ranged: bool) -> Hostility | None:
        h = self.hostility
        if h is None or method not in h.methods or h.match not in path or (h.ranged_only and not ranged):
            return None
        return h

    def count(self, n: int) -> None:
        with self.lock:
            self.served += n


def _handler(srv: HostileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self._answer()

        def do_HEAD(self) -> None:
            self._answer()

        # --- routing -------------------------------------------------------------------------------------
        def _answer(self) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            ranged = self.headers.get("Range") is not None
            hostile = srv.matches(self.command, path, ranged)
            with srv.lock:
                srv.hostile += hostile is not None
            if hostile is not None and hostile.mode not in ("endless_tree", "missing"):
                body, status, headers = self._route(path, parts.query)
                return getattr(self, f"_{hostile.mode}")(body or b"", status, headers)
            if hostile is not None and hostile.mode == "missing":
                return self._send(404, b"", {"X-Error-Message": "not here"})
            listing = "/tree/" in path or "list-type" in parts.query
            if hostile is not None and hostile.mode == "endless_tree" and listing:
                return self._endless_tree(path, parts.query)
            body, status, headers = self._route(path, parts.query)
            self._send(status, body, headers)

        def _route(self, path: str, query: str) -> tuple[bytes, int, dict]:
            hub = f"/api/datasets/{srv.repo}/"
            if path.startswith(hub + "revision/"):
                return json.dumps({"id": srv.repo, "sha": COMMIT}).encode(), 200, {"Content-Type": "application/json"}
            if path.startswith(hub + "tree/"):
                return json.dumps(srv.tree()).encode(), 200, {"Content-Type": "application/json"}
            resolve = f"/datasets/{srv.repo}/resolve/{COMMIT}/"
            s3 = f"/{srv.bucket}/{srv.prefix}/"
            rel = path[len(resolve):] if path.startswith(resolve) else path[len(s3):] if path.startswith(s3) else None
            if path == f"/{srv.bucket}" or path == f"/{srv.bucket}/":
                below = parse_qs(query).get("prefix", [""])[0].partition("/")[2]  # the asked part below the root
                keys = [k for k in srv.files if k.startswith(below)]
                return _paged(srv, keys, parse_qs(query).get("continuation-token", [None])[0]), 200, \
                    {"Content-Type": "application/xml"}
            if rel is None or rel not in srv.files:
                return b"", 404, {"X-Error-Message": "no such file"}
            data = srv.files[rel]
            extra = {"x-amz-meta-sha256": hashlib.sha256(data).hexdigest(), "ETag": '"e"'}
            wanted = self.headers.get("Range")
            if wanted:
                lo, _, hi = wanted.removeprefix("bytes=").partition("-")
                lo, hi = int(lo), min(int(hi) if hi else len(data) - 1, len(data) - 1)
                return data[lo:hi + 1], 206, {**extra, "Content-Range": f"bytes {lo}-{hi}/{len(data)}"}
            return data, 200, extra

        # --- honest ------------------------------------------------------------------------------------
        def _head(self, status: int, headers: dict) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()

        def _send(self, status: int, body: bytes, headers: dict) -> None:
            self._head(status, {**headers, "Content-Length": str(len(body))})
            if self.command != "HEAD" and body:
                self.wfile.write(body)
                srv.count(len(body))

        def _stream_forever(self, first: bytes) -> None:
            sent = 0
            try:
                self.wfile.write(first)
                sent += len(first)
                while sent < CAP:
                    self.wfile.write(_ZEROS)
                    sent += len(_ZEROS)
            except OSError:
                pass
            srv.count(sent)
            self.close_connection = True

        # --- hostile -----------------------------------------------------------------------------------
        def _endless(self, body: bytes, status: int, headers: dict) -> None:
            self._head(status, {**headers, "Connection": "close"})
            if self.command != "HEAD":
                self._stream_forever(body)
            self.close_connection = True

        def _whole(self, body: bytes, status: int, headers: dict) -> None:
            rel = self._rel()
            data = srv.files.get(rel, body) if rel else body
            headers = {k: v for k, v in headers.items() if k != "Content-Range"}
            self._endless(data, 200, headers)

        def _wrong_range(self, body: bytes, status: int, headers: dict) -> None:
            if status == 206:
                lo, hi_total = headers["Content-Range"].removeprefix("bytes ").split("-")
                headers = {**headers, "Content-Range": f"bytes {int(lo) + 1}-{hi_total}"}
            self._send(status, body, headers)

        def _drip(self, body: bytes, status: int, headers: dict) -> None:
            self._head(status, {**headers, "Content-Length": str(len(body))})
            self.wfile.flush()
            if self.command == "HEAD":
                return
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(DRIP_SECONDS)
            except OSError:
                pass
            self.close_connection = True

        def _drip_head(self, body: bytes, status: int, headers: dict) -> None:
            head = f"HTTP/1.1 {status} OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head += "X-Padding: " + "p" * 4000 + "\r\n"
            try:
                for ch in head.encode():
                    self.wfile.write(bytes([ch]))
                    self.wfile.flush()
                    time.sleep(DRIP_SECONDS)
            except OSError:
                pass
            self.close_connection = True

        def _redirect_loop(self, body: bytes, status: int, headers: dict) -> None:
            self._send(302, b"", {"Location": self.path})

        def _bad_encoding(self, body: bytes, status: int, headers: dict) -> None:
            self._send(status, b"\x1f\x8b not gzip at all" + body[:64], {**headers, "Content-Encoding": "gzip"})

        def _cut_chunked(self, body: bytes, status: int, headers: dict) -> None:
            self._head(status, {**headers, "Transfer-Encoding": "chunked"})
            if self.command != "HEAD":
                half = body[:max(1, len(body) // 2)]
                self.wfile.write(b"%x\r\n" % (len(half) * 2) + half)
                self.wfile.flush()
            self._hang_up()

        def _reset(self, body: bytes, status: int, headers: dict) -> None:
            self._head(status, {**headers, "Content-Length": str(len(body))})
            if self.command != "HEAD":
                self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self._hang_up()

        def _tls(self, body: bytes, status: int, headers: dict) -> None:
            self.wfile.write(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) * 4)
            self._hang_up()

        def _bad_http(self, body: bytes, status: int, headers: dict) -> None:
            self.wfile.write(b"HTTP/1.1 2x0 \xff\xfeOK\r\nContent-Length: nope\r\nBroken header line\r\n\r\n" + body)
            self._hang_up()

        def _hang_up(self) -> None:
            try:
                self.wfile.flush()
                self.connection.close()
            except OSError:
                pass
            self.close_connection = True

        def _endless_tree(self, path: str, query: str) -> None:
            page = int(parse_qs(query).get("page", ["0"])[0] or 0)
            if "list-type" in query:  # S3 ListObjectsV2: continuation tokens
                token = parse_qs(query).get("continuation-token", ["0"])[0]
                page = int(token)
                keys = [f"{srv.prefix}/data/a/p{page}-{i:06d}.parquet" for i in range(PAGE_ENTRIES)]
                nxt = str(page + 1) if page + 1 < CAP_PAGES else None
                return self._send(200, _list_page(srv, keys, nxt, raw=True), {"Content-Type": "application/xml"})
            items = [{"type": "file", "path": f"data/a/p{page}-{i:06d}.parquet", "size": 1,
                      "oid": "0" * 40, "lfs": {"oid": "0" * 64, "size": 1, "pointerSize": 130}}
                     for i in range(PAGE_ENTRIES)]
            headers = {"Content-Type": "application/json"}
            if page + 1 < CAP_PAGES:
                base = f"{srv.endpoint}{urlsplit(self.path).path}"
                headers["Link"] = f'<{base}?recursive=true&expand=false&page={page + 1}>; rel="next"'
            self._send(200, json.dumps(items).encode(), headers)

        def _rel(self) -> str | None:
            path = unquote(urlsplit(self.path).path)
            for base in (f"/datasets/{srv.repo}/resolve/{COMMIT}/", f"/{srv.bucket}/{srv.prefix}/"):
                if path.startswith(base):
                    return path[len(base):]
            return None

    return Handler


def _paged(srv: HostileServer, keys: list[str], token: str | None) -> bytes:
    """The page of ListObjectsV2 that ``token`` asks for (None: the first), cut and told as ``srv`` says."""
    if token is None:
        with srv.lock:
            srv.listings += 1
    size = srv.page_keys or max(1, len(keys))
    pages = [keys[i:i + size] for i in range(0, len(keys), size)] or [[]]
    if srv.pages == "backwards":
        pages.reverse()
    if srv.pages == "changes" and srv.listings > 1 and len(pages) > 1:
        pages[1] = pages[1][1:]
    n = int(token or 0)
    nxt = n + 1 if n + 1 < len(pages) else 1 if srv.pages == "loop" and len(pages) > 1 else None
    return _list_page(srv, pages[n], None if nxt is None else str(nxt))


def _list_page(srv: HostileServer, keys: list[str], next_token: str | None, *, raw: bool = False) -> bytes:
    """One ListObjectsV2 answer naming ``keys`` (corpus paths, or full keys when ``raw``)."""
    rows = []
    for key in keys:
        full = key if raw else f"{srv.prefix}/{key}"
        size = "1" if raw else srv.listed_sizes.get(key, str(len(srv.files[key])))
        rows.append(f"<Contents><Key>{quote(full)}</Key>{'' if size is None else f'<Size>{size}</Size>'}</Contents>")
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{next_token}</NextContinuationToken>" \
        if next_token else "<IsTruncated>false</IsTruncated>"
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>{srv.bucket}</Name>'
            f"<KeyCount>{len(keys)}</KeyCount><EncodingType>url</EncodingType>{more}{''.join(rows)}</ListBucketResult>").encode()


def serve_commands() -> None:
    """In a child process: for each JSON line on stdin (``[name, argv, env]``; argv ``["loader", url, options,
    cache_dir]`` builds a loader and takes one batch), run the command with ``env`` added to the environment
    through the real entry point and
    print one ``REPORT`` line: its exit code, output, seconds, its peak RSS and how far that peak rose above
    the RSS at its start (bytes; Linux resets the peak before each command). One process serves many
    commands, so torch and numba load once, before any is measured."""
    import contextlib
    import io
    import logging
    import resource
    import sys

    from marin_data.cli import main
    from marin_data.cli._errors import describe

    class _Stderr:  # the retry helper's log lines go to whatever stderr is now
        def write(self, text: str) -> None:
            sys.stderr.write(text)

        def flush(self) -> None:
            sys.stderr.flush()

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=_Stderr())
    import marin_data.loader.make  # noqa: F401 - torch and numba load before any command is measured

    import os

    for line in sys.stdin:
        name, argv, env = json.loads(line)
        saved = dict(os.environ)
        os.environ.update(env)  # the bounds of `marin_data.stores.limits` are read when a request starts
        before = _status("VmRSS")
        _reset_peak()
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if argv[0] == "loader":
                code = _take_a_batch(*argv[1:], describe=describe)
            else:
                try:
                    main(argv)
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        os.environ.clear()
        os.environ.update(saved)
        peak = _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print("REPORT " + json.dumps({"name": name, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue(),
                                      "rss": peak, "growth": peak - (before or 0),
                                      "seconds": round(time.monotonic() - t0, 2)}), flush=True)


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM, the peak resident set size


def _status(key: str) -> int | None:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak) of this process, in bytes; None off Linux."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def _take_a_batch(url: str, options: dict, cache_dir: str, *, describe) -> int:
    """`make_loader` over ``url`` and one batch; a known error printed as the CLI would and its exit code."""
    import sys
    import traceback

    from marin_data.loader import LoaderConfig, make_loader

    try:
        loader = make_loader(url, LoaderConfig(seq_len=16, batch_size=2), cache_dir=cache_dir, **options)
        try:
            next(iter(loader))
        finally:
            loader.dataset.stream.close()
        return 0
    except Exception as e:  # noqa: BLE001 - mapped as the CLI maps it
        known = describe(e)
        if known is None:
            traceback.print_exc()
            return 70
        print(f"error: {known[0]}", file=sys.stderr)
        return known[1]
