"""Local helper servers (moto S3, the Hub mirror) run as child processes on loopback: a free port to
listen on, and a stop that always reaps the child."""

from __future__ import annotations

import socket
import subprocess

__all__ = ["free_port", "stop_process"]


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
