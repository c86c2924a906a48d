"""A throwaway S3 server on loopback (moto's ``moto_server``) for the quickstart, tests and benchmarks.

It runs in its own process, so it neither competes with the client for the GIL nor outlives a crashed
caller's ``with`` block: `local_s3_server` always terminates it, with bounded waits. moto is a development
dependency (``pip install 'moto[server]'``); nothing else in marin_data imports this module.

moto keeps objects in memory and stores what it is sent without checking ``ChecksumSHA256``: code tested
against it must check what was stored, not rely on the server refusing bad bytes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

from marin_data.testing.loopback import free_port, stop_process

__all__ = ["LOCAL_S3_ENV", "local_s3_server", "create_bucket"]

# Dummy credentials and region: moto accepts any signature, but botocore refuses to sign without keys.
LOCAL_S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextlib.contextmanager
def local_s3_server(host: str = "127.0.0.1", *, startup_timeout: float = 30.0) -> Iterator[str]:
    """Start ``moto_server`` on ``host`` and a free port; yield its endpoint URL; always stop it.

    Its output goes to a temporary file, not a pipe: moto logs every request, and a pipe nobody reads fills
    after a few hundred requests and freezes the server mid-response.

    Raises:
        RuntimeError: the server did not answer within ``startup_timeout`` seconds (its output is included).
    """
    port = free_port(host)
    cmd = [sys.executable, "-c", "import sys; from moto.server import main; sys.exit(main())",
           "-H", host, "-p", str(port)]
    endpoint = f"http://{host}:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **LOCAL_S3_ENV})
        try:
            _wait_ready(proc, endpoint, startup_timeout, log)
            yield endpoint
        finally:
            stop_process(proc)


def _wait_ready(proc: subprocess.Popen, endpoint: str, timeout: float, log) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace")
            raise RuntimeError(f"moto_server exited with {proc.returncode}: {err[-2000:]}")
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout:.0f}s")


def create_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the local server (idempotent)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
