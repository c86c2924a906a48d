"""``marin-data convert`` killed midway, and given what it must refuse.

A kill (``os._exit`` in a forked child, at a chosen step) leaves no corpus and no cache that looks whole,
and the re-run finishes with the bytes of an uninterrupted run, redoing only what was not finished. A broken
cache, a wrong flag, a destination holding other data, a damaged shard: each is refused by name with its
exit code, and nothing is committed.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
from levanter_env import make_cache, make_store, wide_tokenizer
from shard_env import tiny_tokenizer, tree_bytes  # noqa: F401 - a fixture

from marin_data.cli import main
from marin_data.corpus.manifest import load_corpus
from marin_data.errors import InvalidManifestError
from marin_data.layout import LOCK_NAME, STAGING
from marin_data.levanter import cell_shards, to_levanter, to_marin
from marin_data.levanter.adopt import adopt
from marin_data.levanter.convert import on_threads

KILLED = 99
CELLS = {"cluster=0/quality=0": 60, "cluster=0/quality=4": 90, "cluster=1/quality=4": 40}


def convert(*args, capsys) -> tuple[int, str]:
    """``marin-data convert ARGS`` in this process: its exit code and what it printed on stderr."""
    with pytest.raises(SystemExit) as done:
        main(["convert", *map(str, args)])
    return done.value.code, capsys.readouterr().err


def files(root: Path) -> dict[str, bytes]:
    """What a reader sees: not the lock, the staging or a temporary file."""
    return {p: b for p, b in tree_bytes(root).items()
            if p != LOCK_NAME and not p.startswith(STAGING) and not p.endswith(".part")}


def killed(target, module, name: str, n: int, *, before: bool = False) -> int:
    """Run ``target()`` in a forked child that exits (as if killed) right after the ``n``-th call of
    ``module.name`` returns (``before``: as it is entered); its exit code (0: it finished first)."""
    def child() -> None:
        real, calls = getattr(module, name), [0]

        def step(*a, **k):
            calls[0] += 1
            if before and calls[0] == n:
                os._exit(KILLED)
            out = real(*a, **k)
            if calls[0] == n:
                os._exit(KILLED)
            return out

        setattr(module, name, step)
        target()
        os._exit(0)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join(120)
    return process.exitcode


def counting(monkeypatch, module, name: str) -> list[int]:
    """Count the calls of ``module.name`` from now on."""
    real, calls = getattr(module, name), [0]

    def step(*a, **k):
        calls[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(module, name, step)
    return calls


@pytest.mark.parametrize("where,n", [("shard", 1), ("shard", 4), ("shard", 7), ("place", 1), ("commit", 1)])
def test_a_convert_to_marin_killed_midway_resumes_to_the_same_bytes(tmp_path, tiny_tokenizer, monkeypatch, where,
                                                                     n):
    make_store(tmp_path / "store", CELLS)
    options = {"tokenizer": str(tiny_tokenizer), "shard_tokens": 600, "workers": 1}
    shards = counting(monkeypatch, cell_shards._Shards, "_close")
    to_marin.convert_to_marin(tmp_path / "store", dest=tmp_path / "reference/out", **options)  # the same name
    total, shards[0] = shards[0], 0
    assert total > 7

    def run() -> None:
        to_marin.convert_to_marin(tmp_path / "store", dest=tmp_path / "out", **options)

    module, name = {"shard": (cell_shards._Shards, "_close"), "place": (to_marin, "place_shards"),
                    "commit": (to_marin, "commit_corpus")}[where]
    assert killed(run, module, name, n, before=where == "commit") == KILLED
    with pytest.raises(InvalidManifestError, match="not a marin corpus"):
        load_corpus(tmp_path / "out")  # nothing looks whole
    run()
    assert files(tmp_path / "out") == files(tmp_path / "reference/out")
    assert shards[0] == (total - n if where == "shard" else 0)  # finished shards are not written again
    assert not (tmp_path / "out" / STAGING).exists()


def test_a_convert_to_levanter_killed_midway_keeps_the_finished_caches(tmp_path, tiny_tokenizer, monkeypatch):
    make_store(tmp_path / "store", CELLS)
    to_marin.convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    options = {"chunk": 1024, "inner": 256, "workers": 1}
    to_levanter.convert_to_levanter(tmp_path / "corpus", dest=tmp_path / "reference", **options)

    def run() -> None:
        to_levanter.convert_to_levanter(tmp_path / "corpus", dest=tmp_path / "out", **options)

    assert killed(run, to_levanter.CacheWriter, "close", 2, before=True) == KILLED  # the second cache unfinished
    first, second = sorted(CELLS)[:2]
    assert (tmp_path / "out" / first / "shard_ledger.json").exists() and not (tmp_path / "out" / second).exists()
    assert list((tmp_path / "out" / STAGING).rglob("c/0"))  # its chunk files, out of the way
    kept = {p: p.stat().st_ino for p in (tmp_path / "out" / first).rglob("*")}
    writers = counting(monkeypatch, to_levanter.CacheWriter, "close")
    report = to_levanter.convert_to_levanter(tmp_path / "corpus", dest=tmp_path / "out", **options)
    assert report.reused == (first,) and writers[0] == len(CELLS) - 1
    assert {p: p.stat().st_ino for p in (tmp_path / "out" / first).rglob("*")} == kept
    assert files(tmp_path / "out") == files(tmp_path / "reference")


def test_the_first_failing_unit_stops_the_others_at_their_next_step():
    """A cell that fails stops the run: the others give up at their next chunk file instead of converting on."""
    steps, started = [0], threading.Event()

    def work(item: int, run) -> int:
        if item == 0:
            started.wait(5)
            raise ValueError("cell 0 is broken")
        started.set()
        for _ in range(500):  # five seconds, unless told to stop
            run.check()
            steps[0] += 1
            time.sleep(0.01)
        return item

    with pytest.raises(ValueError, match="cell 0 is broken"):
        on_threads(work, [0, 1, 2], workers=2, tokens=0)
    assert steps[0] < 100  # stopped, not run to its end; item 2 never started


def _unfinished(store: Path) -> None:
    ledger = store / "cluster=0/quality=4/shard_ledger.json"
    ledger.write_text(json.dumps({**json.loads(ledger.read_text()), "is_finished": False}))


def _no_zarr_json(store: Path) -> None:
    (store / "cluster=1/quality=4/input_ids/offsets/zarr.json").unlink()


def _miscounted(store: Path) -> None:
    ledger = store / "cluster=0/quality=0/shard_ledger.json"
    ledger.write_text(json.dumps({**json.loads(ledger.read_text()), "total_num_rows": 7}))


@pytest.mark.parametrize("damage,code,named", [
    (_unfinished, 20, "cluster=0/quality=4/shard_ledger.json"),
    (_no_zarr_json, 19, "cluster=1/quality=4/input_ids/offsets/zarr.json"),
    (_miscounted, 21, "cluster=0/quality=0"),
    (None, 21, "outside the tokenizer's vocabulary [0, 100)"),  # ids up to 399, a vocabulary of 100
])
def test_a_broken_cache_is_refused_by_name_and_nothing_is_committed(tmp_path, tiny_tokenizer, capsys, damage, code,
                                                                    named):
    make_store(tmp_path / "store", CELLS)
    if damage:
        damage(tmp_path / "store")
    tokenizer = tiny_tokenizer if damage else wide_tokenizer(tmp_path / "small", vocab=100)
    done, err = convert(tmp_path / "store", "--to", tmp_path / "out", "--format", "marin", "--tokenizer", tokenizer,
                        capsys=capsys)
    assert (done, named in err) == (code, True), err
    assert files(tmp_path / "out") == {}


def test_flags_that_do_not_fit_the_source_are_usage_errors(tmp_path, tiny_tokenizer, capsys):
    make_store(tmp_path / "store", {"cluster=0/quality=0": 10})
    make_store(tmp_path / "pinned", {"cluster=0/quality=0": 10})
    adopt(tmp_path / "pinned", tokenizer=str(tiny_tokenizer))
    to_marin.convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    for args, says in [
        ((tmp_path / "corpus", "--format", "marin"), "a marin corpus already"),
        ((tmp_path / "pinned", "--format", "levanter"), "a pinned Levanter cache"),
        ((tmp_path / "store", "--format", "levanter"), "a Levanter store"),
        ((tmp_path / "store", "--format", "marin"), "pass --tokenizer"),
        ((tmp_path / "pinned", "--format", "marin", "--tokenizer", tiny_tokenizer), "its own tokenizer"),
        ((tmp_path / "store", "--format", "marin", "--tokenizer", tiny_tokenizer, "--codec", "zstd"), "--codec"),
        ((tmp_path / "corpus", "--format", "levanter", "--shard-tokens", "1M"), "--shard-tokens"),
        ((tmp_path / "nowhere", "--format", "marin"), "no folder"),
        ((tmp_path / "store", "--format", "marin", "--tokenizer", tiny_tokenizer, "--manifest-sha256", "ab" * 32),
         "no manifest to pin"),
        ((tmp_path / "store", "--format", "marin", "--tokenizer", tiny_tokenizer, "--endpoint-url", "http://x"),
         "s3:// and hf:// sources only"),
        (("s3://bucket/corpus", "--format", "levanter"), "from local disk"),
    ]:
        done, err = convert(*args, "--to", tmp_path / "out", capsys=capsys)
        assert (done, says in err) == (2, True), (args, err)
    assert not (tmp_path / "out").exists()


def test_a_destination_holding_other_data_is_refused_untouched(tmp_path, tiny_tokenizer, capsys):
    make_store(tmp_path / "a", {"cluster=0/quality=0": 30})
    make_cache(tmp_path / "b/cluster=0/quality=0", 30, seed=7)  # the same cell name, other documents
    to_marin.convert_to_marin(tmp_path / "a", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    before = tree_bytes(tmp_path / "corpus")
    done, err = convert(tmp_path / "b", "--to", tmp_path / "corpus", "--format", "marin", "--tokenizer",
                        tiny_tokenizer, capsys=capsys)
    assert (done, "sources/cluster=0/quality=0.json" in err) == (4, True), err
    done, err = convert(tmp_path / "a", "--to", tmp_path / "a/inside", "--format", "marin", "--tokenizer",
                        tiny_tokenizer, capsys=capsys)
    assert (done, "lies inside the source" in err) == (4, True), err
    assert tree_bytes(tmp_path / "corpus") == before

    make_cache(tmp_path / "caches/cluster=0/quality=0", 5, seed=1)  # a finished cache of other counts
    done, err = convert(tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter", capsys=capsys)
    assert (done, "caches/cluster=0/quality=0" in err) == (4, True), err
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray/notes.txt").write_text("mine")
    done, err = convert(tmp_path / "corpus", "--to", tmp_path / "stray", "--format", "levanter", capsys=capsys)
    assert (done, "notes.txt" in err) == (4, True), err
    assert sorted(p.name for p in (tmp_path / "stray").iterdir()) == ["notes.txt"]


def test_subsets_nested_in_one_another_cannot_be_caches_of_one_store(tmp_path, tiny_tokenizer, capsys):
    make_store(tmp_path / "store", {"web": 10, "web/2024": 10})
    to_marin.convert_to_marin(tmp_path / "store/web/2024", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer),
                              name="web/2024")
    to_marin.convert_to_marin(tmp_path / "store/web", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer),
                              name="web")
    done, err = convert(tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter", capsys=capsys)
    assert (done, "'web/2024' lies inside subset 'web'" in err) == (4, True), err
    assert convert(tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter", "--subset", "web/2024",
                   capsys=capsys)[0] == 0


def test_a_damaged_shard_is_refused_before_its_cache_is_finished(tmp_path, tiny_tokenizer, capsys):
    make_store(tmp_path / "store", CELLS)
    to_marin.convert_to_marin(tmp_path / "store", dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer))
    shard = next((tmp_path / "corpus/data/cluster=0/quality=4").glob("part-*.parquet"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 1
    shard.write_bytes(bytes(data))
    done, err = convert(tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter", "--subset",
                        "cluster=0/quality=4", capsys=capsys)
    assert (done, shard.name in err, "sha256" in err) == (6, True, True), err
    assert sorted(p.name for p in (tmp_path / "caches").iterdir()) == []  # not even the lock is left
