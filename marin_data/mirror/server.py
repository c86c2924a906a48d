"""Running the mirror: the WSGI app on cheroot's threaded HTTP server, started and stopped from Python.

`start_mirror` binds (port 0 picks a free one), scans every repo once so the first client does not wait for
hashing, and serves on a background thread; `serve` blocks until interrupted, for the CLI. Tests and the
quickstart start it through `marin_data.testing.mirror`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cheroot import wsgi

from marin_data.mirror.app import DEFAULT_PAGE_SIZE, MirrorApp

__all__ = ["RunningMirror", "start_mirror", "serve"]

log = logging.getLogger(__name__)


@dataclass
class RunningMirror:
    """A mirror serving on a background thread."""

    url: str  # e.g. http://127.0.0.1:43123 — what clients use as HF_ENDPOINT / endpoint=
    app: MirrorApp
    _server: wsgi.Server
    _thread: threading.Thread

    def stop(self) -> None:
        """Stop accepting, finish or drop open connections, and wait for the serving thread (bounded)."""
        self._server.stop()
        self._thread.join(timeout=10)

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
) -> RunningMirror:
    """Start serving ``root`` on ``host:port`` and return once it accepts connections.

    Args:
        root: folder whose ``org/name`` subfolders are served as Hub repos.
        host: interface to bind; the default serves this machine only.
        port: TCP port; 0 picks a free one (read it from the returned ``url``).
        token: bearer token required for writes (with ``writable``).
        writable: accept uploads (``HfApi.create_repo`` / ``upload_folder`` / ``create_commit``).
        threads: worker threads, i.e. requests served at once (idle keep-alive connections hold none).
        page_size: tree entries per page.
    """
    app = MirrorApp(root, token=token, writable=writable, page_size=page_size)
    t0 = time.perf_counter()
    repos = app.repos.repo_ids()
    for repo_id in repos:  # hash what must be hashed now, not while a client waits
        app.repos.snapshot(repo_id)
    log.info("scanned %d repos under %s in %.1fs", len(repos), app.repos.root, time.perf_counter() - t0)
    server = wsgi.Server((host, port), app, numthreads=threads, server_name="marin-data-mirror", timeout=60)
    server.prepare()  # binds and listens: connections queue from here on
    bound_host, bound_port = server.bind_addr[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    thread = threading.Thread(target=server.serve, name="marin-mirror", daemon=True)
    thread.start()
    return RunningMirror(url=f"http://{shown}:{bound_port}", app=app, _server=server, _thread=thread)


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
