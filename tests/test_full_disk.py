"""A disk that fills up under every writer (``download``, ``shard``, ``adopt``, ``convert`` both ways): exit 17
with a one-line message, no file under its final name with bytes an uninterrupted run would not have written
there, and the same command run again (with room) finishes with the bytes of an uninterrupted run.

The disk fills through ``RLIMIT_FSIZE`` (`shard_env.run_cli`'s ``max_file_bytes``): the kernel cuts the write
that crosses the limit short, then refuses the next with EFBIG, as a full disk cuts one short and refuses the
next with ENOSPC. A writer that ignored the short count would leave a short file under its final name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import build_corpus
from levanter_env import make_store
from shard_env import make_texts, run_cli, tiny_tokenizer, tree_bytes, write_jsonl  # noqa: F401 - a fixture

from marin_data.layout import LOCK_NAME, STAGING

CELLS = {"cluster=0/quality=0": 300, "cluster=1/quality=4": 200}


def files(root: Path) -> dict[str, bytes]:
    """What a reader sees: not the lock, the staging or a temporary file."""
    return {p: b for p, b in tree_bytes(root).items()
            if p != LOCK_NAME and not p.startswith(STAGING) and ".part" not in p and ".marin-download" not in p}


def fill_then_finish(args: list, dest: Path, reference: Path, max_file_bytes: int) -> None:
    """Run ``args`` on a disk that fills past ``max_file_bytes``, then again with room, and check both runs
    against the ``reference`` an uninterrupted run wrote."""
    before = files(dest) if dest.exists() else {}
    full = run_cli(*args, max_file_bytes=max_file_bytes)
    assert full.returncode == 17, full.stderr
    assert "Traceback" not in full.stderr and "File too large" in full.stderr and "run the same command" in full.stderr
    want = files(reference)
    wrong = [p for p, b in files(dest).items() if want.get(p, before.get(p)) != b]
    assert not wrong, wrong  # under a final name: what was there, or what the finished run leaves there
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert files(dest) == want


def test_convert_to_marin(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", CELLS)
    options = ["--format", "marin", "--tokenizer", tiny_tokenizer, "--shard-tokens", "600", "--workers", "1"]
    assert run_cli("convert", tmp_path / "store", "--to", tmp_path / "reference/out", *options).returncode == 0
    out = tmp_path / "out"
    fill_then_finish(["convert", tmp_path / "store", "--to", out, *options], out, tmp_path / "reference/out", 1500)


def test_convert_to_levanter(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", CELLS)
    assert run_cli("convert", tmp_path / "store", "--to", tmp_path / "corpus", "--format", "marin", "--tokenizer",
                   tiny_tokenizer).returncode == 0
    options = ["--format", "levanter", "--workers", "1"]
    assert run_cli("convert", tmp_path / "corpus", "--to", tmp_path / "reference", *options).returncode == 0
    out = tmp_path / "out"
    fill_then_finish(["convert", tmp_path / "corpus", "--to", out, *options], out, tmp_path / "reference", 1500)


def test_adopt(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", CELLS)
    shutil.copytree(tmp_path / "store", tmp_path / "reference")
    options = ["--tokenizer", tiny_tokenizer, "--name", "cells"]
    assert run_cli("adopt", tmp_path / "reference", *options).returncode == 0
    store = tmp_path / "store"
    fill_then_finish(["adopt", store, *options], store, tmp_path / "reference", 8000)


def test_shard(tmp_path, tiny_tokenizer):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"id": str(i), "text": t} for i, t in enumerate(make_texts(80, 5))])
    options = ["--subset", "a", "--tokenizer", tiny_tokenizer, "--workers", "1", "--shard-tokens", "4000"]
    assert run_cli("shard", inputs, "--out", tmp_path / "reference/c", *options).returncode == 0
    out = tmp_path / "c"
    fill_then_finish(["shard", inputs, "--out", out, *options], out, tmp_path / "reference/c", 4000)


@pytest.mark.parametrize("part_mb", ["0", "1"], ids=["one-get", "ranges"])
def test_download(tmp_path, part_mb):
    corpus = build_corpus(tmp_path / "src", {"a": [40, 40], "b": [30]})
    options = ["--part-mb", part_mb, "--workers", "1"]
    assert run_cli("download", corpus.root, "--to", tmp_path / "reference", *options).returncode == 0
    out = tmp_path / "out"
    fill_then_finish(["download", corpus.root, "--to", out, *options], out, tmp_path / "reference", 11_000)
