"""Fixtures for the S3 tests: a real moto server on loopback, fresh buckets, corpora, the fault proxy.

Test modules import the fixtures they use (``from s3_env import moto, bucket_url, ...``). The server runs
in its own process for the whole session and is always stopped (`local_s3_server`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import build_corpus
from faultproxy import Fault, FaultProxy

from marin_data.layout import PARTIAL_SUFFIX
from marin_data.testing.local_s3 import LOCAL_S3_ENV, create_bucket, local_s3_server
from marin_data.transfer.plan import DOWNLOAD_POLICY

__all__ = ["moto", "bucket_url", "proxy", "fault_corpus", "published", "copy_corpus", "object_key", "s3_client",
           "run_cli", "FAST", "file_sha256", "interrupt_download", "kill_and_resume", "plain_client", "upload_tree",
           "rewrite_keeping_metadata"]

ROOT = Path(__file__).resolve().parent.parent
# Tiny waits, few retries: the fault tests exercise the retry paths without sleeping.
FAST = replace(DOWNLOAD_POLICY, max_retries=3, base_wait=0.01, max_wait=0.02, max_retry_after=0.5)


@pytest.fixture(scope="session")
def moto():
    """The endpoint URL of a moto S3 server on 127.0.0.1, with dummy credentials in the environment."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in LOCAL_S3_ENV.items():
            mp.setenv(k, v)
        mp.delenv("AWS_PROFILE", raising=False)
        with local_s3_server() as endpoint:
            yield endpoint


@pytest.fixture
def bucket_url(moto) -> str:
    """``s3://<fresh bucket>/corpus``."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    create_bucket(moto, name)
    return f"s3://{name}/corpus"


@pytest.fixture
def proxy(moto):
    with FaultProxy(moto) as p:
        yield p


@pytest.fixture(scope="session")
def fault_corpus(tmp_path_factory):
    """A corpus with four shards of ~1.3-2.7 MB in two subsets, built once."""
    return build_corpus(tmp_path_factory.mktemp("fault") / "corpus", {"a": [2000, 3000], "b": [1500, 4000]},
                        doc_tokens=(400, 600), seed=3)


@pytest.fixture
def published(moto, bucket_url, fault_corpus, tmp_path):
    """(url, local root) of a private copy of the fault corpus published to a fresh bucket."""
    from marin_data.transfer.publish_s3 import publish

    root = copy_corpus(fault_corpus, tmp_path / "src")
    publish(root, to=bucket_url, endpoint_url=moto)
    return bucket_url, root


def object_key(url: str, path: str) -> str:
    """The proxy's request path for a corpus file (`FaultProxy.served` is keyed by it)."""
    return "/" + url.removeprefix("s3://") + "/" + path


def copy_corpus(corpus, dest: Path) -> Path:
    """A private copy of a session corpus (publish records mirrors in the manifest)."""
    shutil.copytree(corpus.root, dest)
    return dest


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def plain_client(endpoint: str):
    """A client that sends no checksum of its own: an object keeps only what it is given (and its ETag)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(request_checksum_calculation="when_required"))


def upload_tree(endpoint: str, url: str, root: Path) -> None:
    """Every file under ``root`` to ``url`` as plain PUTs (no checksum, no metadata), as another tool uploads."""
    from marin_data.stores.s3 import parse_s3_url

    bucket, prefix = parse_s3_url(url)
    client = plain_client(endpoint)
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{p.relative_to(root).as_posix()}", Body=p.read_bytes())


def rewrite_keeping_metadata(endpoint: str, url: str, path: str) -> None:
    """Flip one byte of ``path`` in the bucket, keeping its size and its user metadata (our ``sha256``, the old
    one): what the store says of it from its metadata is unchanged, its bytes are not."""
    from marin_data.stores.s3 import parse_s3_url

    bucket, prefix = parse_s3_url(url)
    key = f"{prefix}/{path}"
    client = s3_client(endpoint)
    head = client.head_object(Bucket=bucket, Key=key)
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 0x01
    plain_client(endpoint).put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=head["Metadata"])


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``marin-data ARGS`` in a subprocess (the real entry point: error table, exit codes)."""
    env = {**os.environ, **LOCAL_S3_ENV}
    return subprocess.run([sys.executable, "-m", "marin_data", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=timeout)


def _partial_sizes(dest: Path) -> dict[str, int]:
    """Bytes of each partial file under ``dest`` by the path it will have; ones renamed meanwhile are skipped."""
    out = {}
    for p in dest.rglob(f"*{PARTIAL_SUFFIX}"):
        with contextlib.suppress(FileNotFoundError):
            out[p.relative_to(dest).as_posix().removesuffix(PARTIAL_SUFFIX)] = p.stat().st_size
    return out


# `marin-data` with Python's own Ctrl-C handler, as a terminal starts it: a suite started in the background
# by a shell without job control (`make test &` in a script) inherits SIGINT ignored, and so would the child.
_AS_FROM_A_TERMINAL = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                       "from marin_data.cli import main; main(sys.argv[1:])")


def interrupt_download(args: list[str], proxy: FaultProxy, dest: Path, shards, sig: int) -> tuple[int, str]:
    """Run ``marin-data download ARGS --to DEST --workers 1`` slowly through ``proxy``; once one shard is final
    and another partial, send ``sig`` (SIGINT, SIGKILL). Returns the exit code and, for an assertion's
    message, the child's signal masks when it was signalled and what it wrote to stderr."""
    # ~0.4 s a shard: slow enough that a loaded machine still sees one shard final and the next in flight
    proxy.add(Fault("slow", match="/data/", times=100, delay=0.02))
    cmd = [sys.executable, "-c", _AS_FROM_A_TERMINAL, "download", *args, "--to", str(dest), "--workers", "1"]
    log = dest.parent / f"{dest.name}.stderr"
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **LOCAL_S3_ENV}, stdout=subprocess.DEVNULL,
                                stderr=err)
    size = {s.path: s.bytes for s in shards}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            finals = [s for s in shards if (dest / s.path).exists()]
            # A partial in its first half, so the kill lands before it completes even on a loaded machine.
            partials = [p for p, n in _partial_sizes(dest).items() if 0 < n < size.get(p, 0) // 2]
            if finals and partials:
                break
            time.sleep(0.02)
        masks = _signal_masks(proc.pid)
        assert proc.poll() is None, "the download finished before it could be interrupted"
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
        return code, f"signal masks at the kill: {masks}; stderr:\n{log.read_text(errors='replace')[-4000:]}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _signal_masks(pid: int) -> str:
    """The blocked and ignored signal masks of process ``pid``'s main thread, as ``/proc`` shows them."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        return " ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn")))
    return "unknown"


def kill_and_resume(args: list[str], proxy: FaultProxy, dest: Path, shards, resume) -> None:
    """``kill -9`` a CLI download (`interrupt_download`) with one shard final and one partial, then call
    ``resume()`` (a download returning a report) and check it through ``proxy``: finished shards are not
    fetched again, the in-flight one continues from its partial bytes with ``Range``, the rest come once."""
    interrupt_download(args, proxy, dest, shards, signal.SIGKILL)
    finals = {s.path for s in shards if (dest / s.path).exists()}
    (partial,) = [p for p in dest.rglob(f"*{PARTIAL_SUFFIX}") if p.stat().st_size > 0]
    in_flight = partial.relative_to(dest).as_posix().removesuffix(PARTIAL_SUFFIX)
    kept = partial.stat().st_size
    assert finals and in_flight not in finals

    proxy.wait_idle()  # the killed process's last response may still be streaming: count none of it
    proxy.clear()
    proxy.reset_counts()
    assert resume().ok
    for s in shards:
        served = sum(n for key, n in proxy.served.items() if key.endswith("/" + s.path))
        if s.path in finals:
            assert served == 0, s.path  # finished before the kill: never fetched again
        elif s.path == in_flight:
            assert served == s.bytes - kept and proxy.requests(s.path)[0].range == f"bytes={kept}-"
        else:
            assert served == s.bytes
