"""Running the mirror: the WSGI app behind an asyncio HTTP front (`marin_data.mirror.front`), started and stopped
from Python.

`start_mirror` binds (port 0 picks a free one), scans every repo once so the first client does not wait for
hashing, and serves on a background thread running the event loop; requests run on a bounded pool of
worker threads. `serve` blocks until interrupted, for the CLI. Tests and the quickstart start it through
`marin_data.testing.mirror`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from marin_data.mirror.app import DEFAULT_PAGE_SIZE, MirrorApp
from marin_data.mirror.front import HttpFront, Limits

__all__ = ["RunningMirror", "start_mirror", "serve"]

log = logging.getLogger(__name__)


@dataclass
class RunningMirror:
    """A mirror serving on a background thread."""

    url: str  # e.g. http://127.0.0.1:43123 — what clients use as HF_ENDPOINT / endpoint=
    app: MirrorApp
    _loop: asyncio.AbstractEventLoop
    _stopped: asyncio.Event
    _thread: threading.Thread
    _pool: ThreadPoolExecutor

    def stop(self) -> None:
        """Stop accepting, drop open connections, and wait for the serving thread (bounded)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wait(self) -> None:
        """Block until the server stops (or Ctrl-C)."""
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)


def start_mirror(
    root: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    writable: bool = False,
    threads: int = 16,
    page_size: int = DEFAULT_PAGE_SIZE,
    limits: Limits | None = None,
) -> RunningMirror:
    """Start serving ``root`` on ``host:port`` and return once it accepts connections.

    Args:
        root: folder whose ``org/name`` subfolders are served as Hub repos.
        host: interface to bind; the default serves this machine only.
        port: TCP port; 0 picks a free one (read it from the returned ``url``).
        token: bearer token required for writes (with ``writable``).
        writable: accept uploads (``HfApi.create_repo`` / ``upload_folder`` / ``create_commit``).
        threads: worker threads, i.e. requests the app works on at once (idle, slow and reading clients
            hold none).
        page_size: tree entries per page.
        limits: sizes, time limits and the connection cap (`Limits`; its defaults otherwise).
    """
    limits = limits or Limits()
    app = MirrorApp(root, token=token, writable=writable, page_size=page_size)
    t0 = time.perf_counter()
    repos = app.repos.repo_ids()
    for repo_id in repos:  # hash what must be hashed now, not while a client waits
        app.repos.snapshot(repo_id)
    log.info("scanned %d repos under %s in %.1fs", len(repos), app.repos.root, time.perf_counter() - t0)
    _raise_open_files(limits.max_connections + threads + 64)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="marin-mirror-worker")
    front = HttpFront(app, pool, limits=limits, streams_body=app.streams_body, server_name="marin-data-mirror")
    loop = asyncio.new_event_loop()
    try:
        server = loop.run_until_complete(asyncio.start_server(front.handle, host, port, limit=limits.max_request_line,
                                                              backlog=1024))
    except BaseException:
        loop.close()
        pool.shutdown(wait=False)
        raise
    front.bound = server.sockets[0].getsockname()[:2]
    stopped = asyncio.Event()
    thread = threading.Thread(target=_run, args=(loop, server, front, stopped), name="marin-mirror", daemon=True)
    thread.start()
    bound_host, bound_port = front.bound
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return RunningMirror(url=f"http://{shown}:{bound_port}", app=app, _loop=loop, _stopped=stopped,
                         _thread=thread, _pool=pool)


def _run(loop: asyncio.AbstractEventLoop, server: asyncio.Server, front: HttpFront, stopped: asyncio.Event) -> None:
    async def until_stopped() -> None:
        await stopped.wait()
        server.close()
        for task in list(front.connections):
            task.cancel()
        await asyncio.gather(*front.connections, return_exceptions=True)

    try:
        loop.run_until_complete(until_stopped())
    finally:
        loop.close()


def _raise_open_files(want: int) -> None:
    """Each connection is a file descriptor: raise the soft limit towards ``want`` (never above the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < want:
            log.warning("open-file limit %d: fewer than %d connections can be served at once", target, want)


def serve(root: str | os.PathLike, *, on_ready: Callable[[RunningMirror], None] = lambda m: None,
          **options) -> None:
    """Serve ``root`` until interrupted (Ctrl-C, or SIGTERM from a service manager); ``options`` as for
    `start_mirror`. Stopping is graceful: open connections are closed, and an upload cut short never
    leaves a file under its final name (writes are atomic)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    mirror = start_mirror(root, **options)
    try:
        on_ready(mirror)
        mirror.wait()
    except KeyboardInterrupt:
        pass
    finally:
        mirror.stop()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt
