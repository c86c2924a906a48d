"""Local helper servers on loopback: the ones run as child processes (moto S3, the Hub mirror) get a free
port to listen on and a stop that always reaps the child; test servers run in this process on a thread
(`LoopbackServer`)."""

from __future__ import annotations

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["free_port", "stop_process", "LoopbackServer"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL: never leave a server running."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # clients hang up mid-answer on purpose
        pass


class LoopbackServer:
    """A threading HTTP server on 127.0.0.1 (a free port: ``endpoint``) answering with ``handler`` on a
    daemon thread; as a context manager it is always stopped."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _QuietServer(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
