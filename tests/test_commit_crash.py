"""``kill -9`` at every file-system step of a ``shard`` commit, and of an ``adopt``: readers see the corpus
before or after it, never a mix, and the re-run finishes the run with the bytes of an uninterrupted one."""

from __future__ import annotations

import multiprocessing
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from shard_env import make_texts, tiny_tokenizer, tree_bytes, write_jsonl  # noqa: F401 - a fixture
from s3_env import bucket_url, moto  # noqa: F401 - fixtures

from marin_data.corpus import build
from marin_data.corpus.manifest import load_corpus
from marin_data.errors import InvalidManifestError
from marin_data.layout import LOCK_NAME, STAGING

KILLED = 99
_STEPS = ("replace", "rename", "unlink", "rmdir", "mkdir", "open")  # open: for writing


def _crash_after(n: int, run: Callable[[], object], counted_from: tuple[object, str] | None) -> None:
    """In a forked child: ``run()``, and ``os._exit`` right after its ``n``-th file-system step (counted from
    the call of ``counted_from``, a module and a function's name, when given); exit 0 when it finishes first."""
    count = [0]
    counting = [counted_from is None]

    def wrap(real):
        opens = real is os.open

        def step(*a, **k):
            out = real(*a, **k)
            if counting[0] and (not opens or a[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
                count[0] += 1
                if count[0] == n:
                    os._exit(KILLED)
            return out
        return step

    for name in _STEPS:
        setattr(os, name, wrap(getattr(os, name)))
    if counted_from is not None:
        module, name = counted_from
        start = getattr(module, name)

        def counted(*a, **k):
            counting[0] = True
            return start(*a, **k)

        setattr(module, name, counted)
    run()
    os._exit(0)


def _shard(inputs: Path, tokenizer: Path, out: Path) -> None:
    build.shard_subset([inputs], subset="b", tokenizer=str(tokenizer), out=out, name="c", workers=1, shard_tokens=8000)


def _run_killed(n: int, args: tuple) -> int:
    """A shard killed at the ``n``-th step of its commit, from placing the shards on."""
    return _killed(n, lambda: _shard(*args), (build, "place_shards"))


def _killed(n: int, run: Callable[[], object], counted_from: tuple[object, str] | None = None) -> int:
    child = multiprocessing.get_context("fork").Process(target=_crash_after, args=(n, run, counted_from))
    child.start()
    child.join(120)
    return child.exitcode


def _files(root: Path) -> dict[str, bytes]:
    """The corpus's files: not the lock, the staging or a temporary file a kill left (``verify`` reports those
    apart, as leftovers, and no reader opens them)."""
    return {p: b for p, b in tree_bytes(root).items()
            if p != LOCK_NAME and not p.startswith(STAGING) and not p.endswith(".part")}


@pytest.mark.parametrize("existing", [True, False], ids=["existing-corpus", "new-corpus"])
def test_a_kill_at_any_step_of_the_commit_leaves_a_corpus_the_rerun_finishes(tiny_tokenizer, tmp_path, existing):
    texts = make_texts(60, 3)
    a = write_jsonl(tmp_path / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts[:30])])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(texts[30:])])
    base = tmp_path / "base"
    if existing:
        build.shard_subset([a], subset="a", tokenizer=str(tiny_tokenizer), out=base, name="c", workers=1)
    else:
        base.mkdir()
    before = load_corpus(base).manifest.subsets if existing else None
    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    _shard(b, tiny_tokenizer, reference)
    after = load_corpus(reference).manifest.subsets
    primed = tmp_path / "primed"  # tokenized and packed, killed at the commit's first step
    shutil.copytree(base, primed)
    assert _run_killed(1, (b, tiny_tokenizer, primed)) == KILLED
    for n in range(1, 500):
        work = tmp_path / f"kill-{n}"
        shutil.copytree(primed, work)
        code = _run_killed(n, (b, tiny_tokenizer, work))
        if code == 0:
            break
        assert code == KILLED
        try:
            seen = load_corpus(work).manifest.subsets
        except InvalidManifestError as e:
            assert not existing and "not a marin corpus" in str(e), (n, e)  # nothing committed yet
        else:
            assert seen in (before, after), n  # the corpus before the commit or after it, never a mix
        _shard(b, tiny_tokenizer, work)
        assert _files(work) == _files(reference), n  # byte for byte: verify would pass as it does there
        shutil.rmtree(work)
    assert n > 10  # the commit's steps were all reached



def test_publish_finishes_a_commit_a_kill_left_moving_in(tiny_tokenizer, tmp_path, moto, bucket_url):
    """A kill after the journal's manifest is written but before everything moved in: publish finishes the
    commit under the lock, as a writer does, so what it uploads is the committed corpus, which the store's
    own checksums then confirm (publish checks them before it records the mirror)."""
    from marin_data.layout import COMMIT
    from marin_data.transfer.publish_s3 import publish

    texts = make_texts(40, 3)
    a = write_jsonl(tmp_path / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts[:20])])
    b = write_jsonl(tmp_path / "b.jsonl", [{"id": f"b{i}", "text": t} for i, t in enumerate(texts[20:])])
    base = tmp_path / "base"
    build.shard_subset([a], subset="a", tokenizer=str(tiny_tokenizer), out=base, name="c", workers=1)
    moving = 0
    for n in range(1, 500):
        work = tmp_path / f"kill-{n}"
        shutil.copytree(base, work)
        if _run_killed(n, (b, tiny_tokenizer, work)) == 0:
            break
        if (work / COMMIT / "manifest.json").exists():  # committed, not yet wholly moved in
            moving += 1
            publish(work, to=f"{bucket_url}-{n}", endpoint_url=moto, workers=2, progress=False)
            assert not (work / COMMIT).exists()
        shutil.rmtree(work)
    assert moving > 0  # some kill left a commit moving in


def test_an_adopt_killed_at_any_step_is_finished_by_its_rerun_with_the_pin_of_an_uninterrupted_one(
        tiny_tokenizer, tmp_path):
    """``adopt`` writes its files into the commit journal and moves them in with the commit, the manifest last:
    a kill before the commit point leaves the caches as they were (and a journal the re-run discards), one after
    it a commit the re-run moves in. Either way the folder is still a store or already a corpus to every reader
    (never "files lie outside every Levanter cache"), and the re-run pins what an uninterrupted adopt pins."""
    from levanter_env import make_store

    from marin_data.errors import CorpusConflictError
    from marin_data.levanter import adopt, detect
    from marin_data.levanter.adopt import AdoptReport
    from marin_data.levanter.detect import CORPUS, STORE

    make_store(tmp_path / "store", {"cluster=0/quality=1": 60, "cluster=1/quality=4": 40})
    reference = tmp_path / "reference"
    shutil.copytree(tmp_path / "store", reference)

    def pin(root: Path) -> AdoptReport:
        return adopt(root, tokenizer=str(tiny_tokenizer), name="cells", workers=1)

    want = pin(reference).manifest_sha256
    kinds = set()
    for n in range(1, 500):
        work = tmp_path / f"kill-{n}"
        shutil.copytree(tmp_path / "store", work)
        code = _killed(n, lambda: pin(work))
        if code == 0:
            break
        assert code == KILLED
        kinds.add(kind := detect(work).kind)
        try:
            report = pin(work)
            assert report.manifest_sha256 == want and (report.seconds is None) == (kind == CORPUS), n
        except CorpusConflictError:  # killed after its last step: the pin was whole, and a pin is adopted once
            assert not (work / STAGING).exists() and load_corpus(work).manifest_sha256 == want, n
        assert _files(work) == _files(reference), n
        shutil.rmtree(work)
    assert n > 10 and kinds == {STORE, CORPUS}  # kills before the commit point and after it
