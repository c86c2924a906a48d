"""Starting the Hub mirror for tests, benchmarks and the quickstart: in this process, or as its own.

`running_mirror` is `marin_data.mirror.server.start_mirror` as a context manager that always stops the
server; `mirror_process` runs ``marin-data serve`` as its own process, as a user would.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from marin_data.mirror.server import RunningMirror, start_mirror
from marin_data.testing.loopback import free_port, stop_process

__all__ = ["running_mirror", "mirror_process", "served_process"]


@contextlib.contextmanager
def running_mirror(root: str | os.PathLike, **options) -> Iterator[RunningMirror]:
    """`start_mirror` as a context manager: the server is stopped however the block exits."""
    mirror = start_mirror(root, **options)
    try:
        yield mirror
    finally:
        mirror.stop()


@contextlib.contextmanager
def mirror_process(root: str | os.PathLike, *, host: str = "127.0.0.1", startup_timeout: float = 60.0,
                   args: tuple[str, ...] = ("--quiet",)) -> Iterator[str]:
    """Run ``marin-data serve ROOT`` in its own process on a free port; yield its URL once it answers; always
    stop it.

    Raises:
        RuntimeError: it exited, or did not answer within ``startup_timeout`` seconds.
    """
    with served_process(root, host=host, startup_timeout=startup_timeout, args=args) as (url, _):
        yield url


@contextlib.contextmanager
def served_process(root: str | os.PathLike, *, host: str = "127.0.0.1", startup_timeout: float = 60.0,
                   args: tuple[str, ...] = ("--quiet",), checkout: str | os.PathLike | None = None
                   ) -> Iterator[tuple[str, subprocess.Popen]]:
    """`mirror_process`, yielding ``(url, process)`` (to read the server's memory, say). ``checkout``: run
    that source tree's server (another commit's git worktree) instead of the one this process imports."""
    env = None
    if checkout is not None:  # -m puts the working directory first on the path: it must be the checkout
        env = {**os.environ, "PYTHONPATH": os.fspath(checkout)}
    port = free_port(host)
    url = f"http://{host}:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "marin_data", "serve", str(root), "--host", host, "--port",
                             str(port), *args], stdin=subprocess.DEVNULL, env=env, cwd=checkout)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/datasets", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"marin-data serve {root} did not come up on {url}") from None
                time.sleep(0.1)
        yield url, proc
    finally:
        stop_process(proc)
