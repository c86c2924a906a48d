"""Every client command against a hostile server (tests/hostile.py), over the Hub's API and over S3's.

``info``, ``show``, ``download`` (alone and with a ``--mirror``), ``verify --remote`` and the loader
(`make_loader`, alone and with a mirror) run in one child process per case, through the real entry point.
Whatever the server answers, each ends with a documented exit code and a message naming the store, never the
internal error (70), and with a mirror it still succeeds; no command raises the child's peak RSS by more
than `GROWTH_BOUND`, while the server would hand an unbounded client three times that. The bounds are made
small through the environment so that each case takes seconds.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hostile import CAP, Hostility, HostileServer
from shard_env import tiny_tokenizer, write_jsonl  # noqa: F401 - a fixture

from marin_data.corpus.build import shard_subset

from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import Manifest, load_corpus

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "MARIN_MAX_RETRIES": "1", "MARIN_RETRY_WAIT": "0.01",  # the retry helper runs, without its waits
    "MARIN_REQUEST_GRACE_SECONDS": "5", "MARIN_FLOOR_BYTES_PER_SECOND": str(256 << 10),
    "MARIN_LIST_MAX_BYTES": str(16 << 20), "MARIN_LIST_MAX_ENTRIES": "25000",
}
GROWTH_BOUND = 256 << 20  # what one command may add to the runner's resident memory (bodies: 768 MiB)
assert CAP > 2 * GROWTH_BOUND
KINDS = ("hf", "s3")
TYPED = {2, 7, 8, 23}  # an untrusted manifest, a transient failure outlasting retries, a refusal, a limit
pytestmark = pytest.mark.slow


def make_corpus(root: Path, tokenizer: Path):
    """Two subsets of a few shards each, tokenized with a real tokenizer (`show` decodes them)."""
    for subset, n in (("a", 40), ("b", 10)):
        texts = [{"id": f"{subset}-{i}", "text": f"document {i} of {subset}: the quick brown fox"} for i in range(n)]
        shard_subset([write_jsonl(root / f"{subset}.jsonl", texts)], subset=subset, tokenizer=str(tokenizer),
                     out=root / "c", workers=1, shard_tokens=300)
    return load_corpus(root / "c")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_tokenizer):  # noqa: F811
    return make_corpus(tmp_path_factory.mktemp("hostile"), tiny_tokenizer)


@pytest.fixture(scope="module")
def server(corpus):
    with HostileServer(corpus.root) as srv:
        yield srv


def commands(srv: HostileServer, kind: str, corpus_root: Path, tmp: Path, *, pin: str | None = None) -> list:
    """``[name, argv]`` for every client command against ``srv`` as a ``kind`` store."""
    url, *opts = srv.store_args(kind)
    pinned = ["--manifest-sha256", pin] if pin else []
    options = srv.store_options(kind)
    return [
        ["info", ["info", url, *opts, *pinned]],
        ["show", ["show", url, *opts, "--subset", "a", "-n", "1", *pinned]],
        ["download", ["download", url, *opts, "--subset", "a", "--to", str(tmp / "d"), *pinned]],
        ["download --mirror", ["download", url, *opts, "--subset", "a", "--to", str(tmp / "dm"), "--mirror",
                               str(corpus_root), *pinned]],
        ["verify --remote", ["verify", str(corpus_root), "--remote", url, *opts, *pinned]],
        ["loader", ["loader", url, {**options, "manifest_sha256": pin}, str(tmp / "cache")]],
        ["loader + mirror", ["loader", url, {**options, "manifest_sha256": pin, "mirrors": [str(corpus_root)]},
                             str(tmp / "cache-m")]],
    ]


class Runner:
    """One child process serving commands (`hostile.serve_commands`): started once, restarted after a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        code = f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import hostile; hostile.serve_commands()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                                     env={**os.environ, "PYTHONFAULTHANDLER": "1", **ENV})

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def run(self, name: str, argv: list, timeout: float, env: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write(json.dumps([name, argv, env]) + "\n")
        self.proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and sel.select(timeout=max(0.0, deadline - time.monotonic())):
                line = self.proc.stdout.readline()
                if line.startswith("REPORT "):
                    return json.loads(line.removeprefix("REPORT "))
                if not line:
                    break
        self.stop()
        raise AssertionError(f"{name} did not finish within {timeout} s (or its process died)")


@pytest.fixture(scope="module")
def runner():
    r = Runner()
    try:
        yield r
    finally:
        r.stop()


def run_all(runner: Runner, spec: list, *, timeout: float = 120, env: dict | None = None) -> dict[str, dict]:
    """Each command of ``spec`` in the runner, ``env`` added to `ENV`; name -> {code, stdout, stderr, rss,
    growth, seconds}."""
    results = {name: runner.run(name, argv, timeout, env or {}) for name, argv in spec}
    print({name: (r["code"], r["seconds"], r["growth"] >> 20) for name, r in results.items()})  # shown on failure
    return results


def check(results: dict[str, dict], expected: dict[str, set[int]], words: str = "") -> None:
    """Each command exited with one of its expected codes, named the store when it failed, and stayed within
    `GROWTH_BOUND`."""
    for name, r in results.items():
        where = f"{name}: exit {r['code']} after {r['seconds']} s\n{r['stderr'][-2000:]}"
        assert r["code"] in expected[name], where
        assert r["code"] != 70 and "Traceback" not in r["stderr"], where
        if r["code"] not in (0, 1):
            assert ("hf://datasets/team/corpus" in r["stderr"] or "s3://bkt/corpus" in r["stderr"]), where
            assert words.lower() in r["stderr"].lower(), where
        assert r["growth"] < GROWTH_BOUND, f"{name}: peak RSS {r['rss'] >> 20} MiB, {r['growth'] >> 20} MiB over start"


def expect(failing: set[int], **overrides: set[int]) -> dict[str, set[int]]:
    """Without a mirror: ``failing``; with one: success; ``overrides`` by command (``_`` for spaces)."""
    out = {"info": failing, "show": failing, "download": failing, "download --mirror": {0},
           "verify --remote": failing, "loader": failing, "loader + mirror": {0}}
    out.update({k.replace("__", " --").replace("_", " "): v for k, v in overrides.items()})
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_an_honest_answer_serves_every_command(runner, server, corpus, kind, tmp_path):
    server.hostility = None
    results = run_all(runner, commands(server, kind, corpus.root, tmp_path))
    check(results, {name: {0} for name in results})


BODY_ONLY = {"drip", "bad_encoding", "cut_chunked"}  # modes that touch a body only
WORDS = {"drip": "too slow", "drip_head": "too slow", "redirect_loop": "redirect",
         "bad_encoding": "", "cut_chunked": "", "reset": "", "tls": "", "bad_http": ""}


@pytest.mark.parametrize("mode", sorted(WORDS))
@pytest.mark.parametrize("kind", KINDS)
def test_every_transport_failure_is_typed_retried_and_falls_back_to_the_mirror(runner, server, corpus, kind, mode,
                                                                                tmp_path):
    if kind == "s3" and mode == "drip_head":
        pytest.skip("botocore reads an S3 answer's head with its idle timeout only (docs/security.md, Limits)")
    server.hostility = Hostility(mode)
    slow = {"MARIN_REQUEST_GRACE_SECONDS": "0.2"} if mode.startswith("drip") else {}  # every request drips
    try:
        results = run_all(runner, commands(server, kind, corpus.root, tmp_path), env=slow)
    finally:
        server.hostility = None
    typed = {2} if kind == "s3" and mode == "bad_encoding" else TYPED  # raw gzip bytes: not a manifest
    verify = typed
    if kind == "s3" and mode in BODY_ONLY:  # S3's `verify --remote` only asks HEAD, whose answer has no body,
        # but a chunked one has no Content-Length (transient), and that of the gzip garbage is not the file's
        verify = {"drip": {0}, "cut_chunked": {7}, "bad_encoding": {1}}[mode]
    elif kind == "s3" and mode == "reset":  # the head arrived whole; the reset may or may not discard it
        verify = {0, 7}
    check(results, expect(typed, verify__remote=verify), WORDS[mode])


@pytest.mark.parametrize("mode", ["endless", "whole", "wrong_range"])
@pytest.mark.parametrize("kind", KINDS)
def test_reads_stop_at_what_they_asked_for(runner, server, corpus, kind, mode, tmp_path):
    """Shards answered with more than was asked (or elsewhere): `show` reads its ranges, the downloads
    cut the body at the listed size (the digest proves it), and nothing buffers the rest."""
    server.hostility = Hostility(mode, match="/data/")
    try:
        results = run_all(runner, commands(server, kind, corpus.root, tmp_path))
    finally:
        server.hostility = None
    # S3's HEAD of a shard (`verify --remote`) gets no Content-Length in these answers: a transient failure
    verify = {7} if kind == "s3" and mode != "wrong_range" else {0}
    if mode == "wrong_range":  # only the ranged reads of `show` see it: retried, then refused
        check(results, {**{n: {0} for n in results}, "show": {7}}, "Content-Range")
    else:
        check(results, {**{n: {0} for n in results}, "verify --remote": verify})
    assert (tmp_path / "d" / corpus.shards[0].path).read_bytes() == (corpus.root / corpus.shards[0].path).read_bytes()


def test_a_tree_listing_without_end_is_refused_at_its_bound_by_every_command(runner, server, corpus, tmp_path):
    pin = load_corpus(corpus.root).manifest_sha256
    server.hostility = Hostility("endless_tree")
    try:
        results = run_all(runner, commands(server, "hf", corpus.root, tmp_path, pin=pin))
    finally:
        server.hostility = None
    check(results, expect({23}), "more than")
    assert "more than 25,000 entries" in results["info"]["stderr"]
    assert "MARIN_LIST_MAX_ENTRIES" in results["info"]["stderr"]  # the bound, and how to raise it


def test_an_s3_listing_without_end_is_refused_at_its_bound(server, monkeypatch):
    from marin_data.errors import RemoteLimitError
    from marin_data.stores import open_store

    monkeypatch.setenv("MARIN_LIST_MAX_ENTRIES", "25000")
    server.hostility = Hostility("endless_tree")
    try:
        store = open_store(server.s3_url, **server.store_options("s3"))
        with pytest.raises(RemoteLimitError, match="more than 25,000 entries") as info:
            sum(1 for _ in store.list())
    finally:
        server.hostility = None
    assert info.value.path == "s3://bkt/corpus/"


def test_an_s3_listing_that_names_keys_outside_its_prefix_is_refused(server):
    """ListObjectsV2 answers only keys under the prefix asked for; one that does not is no name to cut a path
    from (cut blindly, ``corpusx/a`` would become ``a``)."""
    from marin_data.errors import RemoteError
    from marin_data.stores import open_store

    store = open_store(server.s3_url, **server.store_options("s3"))
    server.prefix = "corpusx"  # every key listed now starts with "corpusx/", outside "corpus/"
    try:
        with pytest.raises(RemoteError, match="outside 'corpus/'") as info:
            list(store.list())
    finally:
        server.prefix = "corpus"
    assert "corpusx/" in info.value.message


CONTROLS = "\x1b]0;owned\x07\r\x1b[2KDownloaded: 0 failed\u202e"


def test_control_characters_in_remote_names_are_escaped_in_every_output(runner, tmp_path, tiny_tokenizer):  # noqa: F811
    """A corpus whose name, version and a shard's path hold a title-setting escape, a carriage return, a
    line-clearing sequence and a bidi override: no command prints one of them raw."""
    corpus = make_corpus(tmp_path, tiny_tokenizer)
    first = corpus.shards[0]
    evil = first.path.replace("part-00000", "part" + CONTROLS)
    (corpus.root / first.path).rename(corpus.root / evil)
    shards = [first._replace(path=evil), *corpus.shards[1:]]
    m = corpus.manifest
    commit_corpus(corpus.root, Manifest(name="evil" + CONTROLS, version="1" + CONTROLS, tokenizer=m.tokenizer,
                                        subsets=m.subsets), shards)
    with HostileServer(corpus.root) as srv:
        srv.hostility = Hostility("missing", match="part\x1b")  # the evil shard fails: its name is in errors
        for kind in KINDS:
            results = run_all(runner, [c for c in commands(srv, kind, corpus.root, tmp_path / kind)
                               if "mirror" not in c[0]])
            for name, r in results.items():
                text = r["stdout"] + r["stderr"]
                assert r["code"] != 70 and "Traceback" not in text, (name, text[-2000:])
                assert not any(c in text for c in "\x1b\r\x07\u202e"), (name, text[-2000:])
            assert "evil\\x1b]0;owned\\x07\\x0d" in results["info"]["stdout"]
            assert results["download"]["code"] == 1 and "part\\x1b]0;owned" in results["download"]["stderr"]
            assert results["verify --remote"]["code"] == 1 and "part\\x1b]0" in results["verify --remote"]["stdout"]
