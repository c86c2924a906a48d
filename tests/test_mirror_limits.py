"""The mirror under hostile clients: idle and slow connections, oversized heads and bodies, header injection,
odd ``Range`` headers, HEAD probes, and symlinks where a commit would write.

Everything runs on loopback against an in-process mirror with short time limits; every loop is bounded in
count, and every socket has a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from urllib.parse import urlsplit

import httpx2
import pytest
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import HfHubHTTPError
from test_mirror import REPO, make_root, raw_request

from marin_data.mirror.front import Limits
from marin_data.testing.mirror import running_mirror

TOKEN = "s3cret-token"
SHORT = Limits(head_timeout=1.0, idle_timeout=2.0, body_timeout=1.0)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    make_root(root)
    (root / REPO / "six.txt").write_bytes(b"abcdef")
    with running_mirror(root, limits=SHORT) as mirror:
        yield mirror


def connect(url: str, timeout: float = 10) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout)


def read_status(sock: socket.socket) -> int:
    """The status of the response on ``sock`` (reads its first line only)."""
    line = sock.makefile("rb").readline(1000)
    return int(line.split()[1])


def stopped_reading(sock: socket.socket, most: int = 64 << 20) -> bool:
    """True when the server refuses ``most`` more bytes (it closed the connection) instead of reading them."""
    sock.settimeout(5)
    block = b"x" * (1 << 20)
    try:
        for _ in range(most // len(block)):
            sock.sendall(block)
    except OSError:  # reset, broken pipe, or a full window that stays full: the server is not reading
        return True
    return False


def test_idle_and_slow_connections_do_not_block_other_clients(served):
    held = []
    try:
        for i in range(60):  # several times the old fixed pool of 16 threads
            s = connect(served.url)
            if i % 2:
                s.sendall(b"GET /api/datasets HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            held.append(s)
        with urllib.request.urlopen(f"{served.url}/api/datasets/{REPO}", timeout=10) as r:
            assert json.loads(r.read())["id"] == REPO
    finally:
        for s in held:
            s.close()


def test_clients_that_never_read_a_large_file_do_not_hold_the_workers(tmp_path):
    (tmp_path / "root/team/big").mkdir(parents=True)
    (tmp_path / "root/team/big/big.bin").write_bytes(b"\0" * (16 << 20))
    with running_mirror(tmp_path / "root", threads=2, limits=SHORT) as mirror:
        stalled = []
        try:
            for _ in range(6):  # three times the workers
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.settimeout(10)
                s.connect((urlsplit(mirror.url).hostname, urlsplit(mirror.url).port))
                s.sendall(b"GET /datasets/team/big/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                stalled.append(s)
            with urllib.request.urlopen(f"{mirror.url}/api/datasets/team/big", timeout=10) as r:
                assert json.loads(r.read())["id"] == "team/big"
        finally:
            for s in stalled:
                s.close()


def test_a_slow_head_is_cut_at_the_head_time_limit(served):
    with connect(served.url) as s:
        s.sendall(b"GET /api/datasets HTTP/1.1\r\n")
        assert read_status(s) == 408  # head_timeout is 1 s here; the client waits up to 10 s


def test_an_overlong_request_line_gets_414_and_is_not_read_on(served):
    with connect(served.url) as s:
        s.sendall(b"GET /" + b"a" * (Limits().max_request_line + 4096))
        assert read_status(s) == 414
        assert stopped_reading(s)


def test_oversized_headers_get_431_and_are_not_read_on(served):
    with connect(served.url) as s:
        pad = b"X-Pad: " + b"p" * 1000 + b"\r\n"
        s.sendall(b"GET /api/datasets HTTP/1.1\r\n" + pad * (Limits().max_head // len(pad) + 8))  # no end of head
        assert read_status(s) == 431
        assert stopped_reading(s)


def test_an_anonymous_body_over_the_limit_gets_413_before_it_is_read(served):
    too_big = Limits().max_buffered_body + 1
    with connect(served.url) as s:
        s.sendall(f"POST /api/datasets/{REPO}/paths-info/main HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  f"\r\nContent-Length: {too_big}\r\n\r\n".encode() + b"[" * 65536)
        assert read_status(s) == 413
        assert stopped_reading(s)


def test_a_json_body_over_the_limit_gets_413_also_with_a_token(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    (tmp_path / "root").mkdir()
    with running_mirror(tmp_path / "root", writable=True, token=TOKEN, limits=SHORT) as mirror:
        HfApi(endpoint=mirror.url, token=TOKEN).create_repo("team/x", repo_type="dataset")
        too_big = Limits().max_buffered_body + 1
        with connect(mirror.url) as s:
            s.sendall(f"POST /api/datasets/team/x/preupload/main HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                      f"{TOKEN}\r\nContent-Length: {too_big}\r\n\r\n".encode() + b"{" * 65536)
            assert read_status(s) == 413


def test_cr_lf_in_a_path_is_a_logged_400_and_injects_no_header(served, caplog):
    caplog.set_level(logging.INFO, logger="marin_data.mirror.access")
    status, headers, body = raw_request(served.url, "GET", f"/datasets/{REPO}/resolve/main/a%0d%0aX-Injected:%201")
    assert status == 400 and "x-injected" not in headers and json.loads(body)["error"]
    assert any(" 400" in r.getMessage() for r in caplog.records if r.name == "marin_data.mirror.access")


@pytest.mark.parametrize("rng, status, body", [
    ("bytes=-100", 206, b"abcdef"),  # a suffix longer than the file is the whole file
    ("bytes=-2", 206, b"ef"),
    ("items=0-1", 200, b"abcdef"),  # an unknown unit is ignored
    ("bytes=2-1", 200, b"abcdef"),  # a malformed range is ignored
    ("bytes=6-", 416, b""),
    ("bytes=-0", 416, b""),  # a zero-length suffix is well-formed and selects nothing
])
def test_ranges_follow_rfc_9110(served, rng, status, body):
    got = raw_request(served.url, "GET", f"/datasets/{REPO}/resolve/main/six.txt", {"Range": rng})
    assert (got[0], got[2]) == (status, body)


@pytest.mark.parametrize("path", [f"/api/datasets/{REPO}", f"/api/datasets/{REPO}/revision/main", "/api/datasets",
                                  f"/api/datasets/{REPO}/tree/main", f"/api/datasets/{REPO}/refs"])
def test_head_is_answered_wherever_get_is(served, path):
    get_status, get_headers, get_body = raw_request(served.url, "GET", path)
    status, headers, body = raw_request(served.url, "HEAD", path)
    assert (status, body) == (get_status, b"") and get_status == 200
    assert headers["content-length"] == get_headers["content-length"] == str(len(get_body))


@pytest.fixture
def writable(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    (tmp_path / "root/team/corpus").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    with running_mirror(tmp_path / "root", writable=True, token=TOKEN, limits=SHORT) as mirror:
        yield mirror, HfApi(endpoint=mirror.url, token=TOKEN), tmp_path / "root", tmp_path / "elsewhere"


@pytest.mark.parametrize("framing", ["Content-Length: 1000", "Transfer-Encoding: chunked"])
def test_a_streamed_body_that_stalls_gets_408_and_the_connection_closes(writable, framing):
    mirror, api, root, _ = writable
    api.create_repo("team/stalled", repo_type="dataset")
    with connect(mirror.url) as s:  # a bearer token: the body streams to the app, which reads it after the check
        s.sendall(f"POST /api/datasets/team/stalled/commit/main HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{TOKEN}\r\nContent-Type: application/x-ndjson\r\n{framing}\r\n\r\n".encode())
        s.sendall(b"a\r\n{\"key\": \"h\r\n" if "chunked" in framing else b'{"key": "h')  # then nothing
        reply = s.makefile("rb").read(4096)  # the whole answer: read returns at the close (or times out, failing)
    assert reply.startswith(b"HTTP/1.1 408 ") and reply.endswith(b'{"error": "request body stalled for 1 s"}')


def test_a_malformed_chunk_in_a_streamed_body_gets_400(writable):
    mirror, api, root, _ = writable
    api.create_repo("team/framing", repo_type="dataset")
    with connect(mirror.url) as s:
        s.sendall(f"POST /api/datasets/team/framing/commit/main HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                  f"{TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".encode())
        assert read_status(s) == 400


@pytest.mark.parametrize("content", [b"small", b"\0" * (11 << 20)])  # a regular file and an LFS one
def test_a_commit_never_writes_through_a_symlinked_folder(writable, content):
    mirror, api, root, elsewhere = writable
    (root / "team/corpus/evil_dir").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(HfHubHTTPError) as err:
        api.upload_file(path_or_fileobj=content, path_in_repo="evil_dir/x.txt", repo_id="team/corpus",
                        repo_type="dataset")
    assert err.value.response.status_code == 400 and "symlink" in str(err.value)
    assert list(elsewhere.iterdir()) == []


def test_uploads_never_stage_through_a_symlink_and_repos_are_not_created_through_one(writable):
    mirror, api, root, elsewhere = writable
    (root / ".mirror-uploads").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(RuntimeError) as err:  # huggingface_hub wraps the failed LFS upload
        api.upload_file(path_or_fileobj=b"\0" * (11 << 20), path_in_repo="x.bin", repo_id="team/corpus",
                        repo_type="dataset")
    assert err.value.__cause__.response.status_code == 400
    (root / "evil_org").symlink_to(elsewhere, target_is_directory=True)
    r = httpx2.post(f"{mirror.url}/api/repos/create", headers={"Authorization": f"Bearer {TOKEN}"},
                    json={"type": "dataset", "organization": "evil_org", "name": "x"})
    assert r.status_code == 400 and "symlink" in r.json()["error"]
    assert list(elsewhere.rglob("*")) == []


def test_serve_help_states_the_limits():
    from click.testing import CliRunner

    from marin_data.cli.serve import command

    text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
    lim = Limits()
    for stated in (f"request line {lim.max_request_line >> 10} KiB", f"head {lim.max_head >> 10} KiB",
                   f"{lim.max_headers} header lines", f"JSON body {lim.max_buffered_body >> 20} MiB",
                   f"within {lim.head_timeout:g} s", f"{lim.idle_timeout:g} s idle",
                   f"{lim.body_timeout:g} s without body bytes", f"{lim.send_timeout:g} s without the client",
                   f"{lim.max_connections:,} connections"):
        assert stated in text, stated
