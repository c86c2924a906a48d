"""What `marin-data serve` spends on downloads that stall: the server's own memory (its RSS, in its own process)
per stalled 400 MiB download stays within the bound docs/security.md states, and goes back to where it was
when the clients close, round after round."""

from __future__ import annotations

import resource
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from marin_data.testing.mirror import served_process
from marin_data.testing.stalls import settled_rss, stalled_downloads

CONNECTIONS = 200
PER_CONNECTION = 64 << 10  # docs/security.md, "The mirror": the server's own memory per stalled download
SLACK = 8 << 20  # what the allocator may keep of freed objects; a few KiB per connection of a round
BIG = "/datasets/team/big/resolve/main/big.bin"


@pytest.fixture
def open_files():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < CONNECTIONS + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(CONNECTIONS + 256, hard), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stalled_download_costs_a_bounded_few_kib_and_closing_returns_them(tmp_path, open_files):
    repo = tmp_path / "root" / "team" / "big"
    repo.mkdir(parents=True)
    with open(repo / "big.bin", "wb") as f:
        f.truncate(400 << 20)  # sparse: 400 MiB to serve, no disk spent
    with served_process(tmp_path / "root") as (url, server):
        host, port = urlsplit(url).hostname, urlsplit(url).port
        with stalled_downloads(host, port, BIG, CONNECTIONS):  # warm: every worker thread started
            settled_rss(server.pid)
        base = settled_rss(server.pid)
        for round_ in range(3):
            with stalled_downloads(host, port, BIG, CONNECTIONS):
                held = settled_rss(server.pid)
            after = settled_rss(server.pid)
            assert (held - base) / CONNECTIONS < PER_CONNECTION, (round_, held - base)
            assert after < base + SLACK, (round_, after - base)  # not the high-water mark of the round


def test_a_stalled_download_is_cut_after_the_send_timeout_and_a_reading_one_gets_every_byte(tmp_path):
    import hashlib
    import socket
    import time

    from marin_data.mirror.front import Limits
    from marin_data.testing.mirror import running_mirror

    repo = tmp_path / "root" / "team" / "big"
    repo.mkdir(parents=True)
    data = bytes(range(256)) * (12 << 12)  # 12 MiB: many sendfile pieces
    (repo / "big.bin").write_bytes(data)
    with running_mirror(tmp_path / "root", limits=Limits(send_timeout=1.0)) as mirror:
        host, port = urlsplit(mirror.url).hostname, urlsplit(mirror.url).port
        with stalled_downloads(host, port, BIG, 1) as (stalled,):
            # A stalled client reads nothing, so nothing on this side can see the cut before it happens: wait out
            # the server's send timeout (1 s for the client to take a piece, then it cuts) with room for a load.
            time.sleep(4)
            got = 0
            try:
                while chunk := stalled.recv(1 << 20):
                    got += len(chunk)
            except ConnectionResetError:
                pass
            assert got < len(data)
        with socket.create_connection((host, port), timeout=30) as s:  # a client that reads gets it all
            s.sendall(f"GET {BIG} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            reply = b""
            while chunk := s.recv(1 << 20):
                reply += chunk
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
