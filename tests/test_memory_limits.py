"""Memory stays bounded whatever the input: a zstd bomb, one huge document, an oversized remote manifest.

Each test sends a bit more than a limit (the limit made small where it is large) and checks, with
``tracemalloc``, that the reader never held much more than the limit.
"""

from __future__ import annotations

import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from shard_env import run_cli, tiny_tokenizer  # noqa: F401 - a fixture

from marin_data.errors import BadRecordError, RemoteError, UnreadableInputError
from marin_data.raw.documents import TOO_LONG, read_documents
from marin_data.stores.hf import HfStore
from marin_data.testing.mirror import running_mirror


def peak_bytes(fn) -> tuple[object, int]:
    """``fn()``'s result (or the exception it raised) and the peak of Python allocations while it ran."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_zstd_bomb_is_decompressed_in_bounded_steps(tmp_path):
    path = tmp_path / "bomb.jsonl.zst"
    first = json.dumps({"text": "x" * 1000}).encode() + b"\n"
    path.write_bytes(zstandard.ZstdCompressor(level=1).compress(first + b"\n" * (96 << 20)))
    assert path.stat().st_size < 64 << 10
    doc, peak = peak_bytes(lambda: next(read_documents(path)))
    assert doc.text == "x" * 1000 and peak < 16 << 20


def test_zstd_frames_are_read_across_and_a_cut_in_a_later_frame_is_noticed(tmp_path):
    frames = [zstandard.ZstdCompressor().compress(b'{"text": "doc %d"}\n' % i) for i in range(3)]
    skippable = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    whole = tmp_path / "frames.jsonl.zst"
    whole.write_bytes(frames[0] + skippable + frames[1] + frames[2])
    assert [d.text for d in read_documents(whole)] == ["doc 0", "doc 1", "doc 2"]
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(frames[0] + frames[1] + frames[2][:-3])
    with pytest.raises(UnreadableInputError, match="truncated"):
        list(read_documents(cut))


def test_a_document_over_max_doc_bytes_is_refused_by_file_and_line_without_being_buffered(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(b'{"text": "small"}\n{"text": "' + b"y" * (24 << 20) + b'"}\n{"text": "after"}\n')
    err, peak = peak_bytes(lambda: list(read_documents(path, max_doc_bytes=1 << 20)))
    assert isinstance(err, BadRecordError) and (err.path, err.line, err.reason) == (str(path), 2, TOO_LONG)
    assert "--max-doc-bytes" in str(err) and peak < 8 << 20
    skipped: list[BadRecordError] = []
    docs, peak = peak_bytes(lambda: list(read_documents(path, max_doc_bytes=1 << 20, on_bad=skipped.append)))
    assert [(d.text, d.line) for d in docs] == [("small", 1), ("after", 3)] and peak < 8 << 20
    assert [(e.line, e.reason) for e in skipped] == [(2, TOO_LONG)]


def test_a_parquet_document_over_max_doc_bytes_is_refused_too(tmp_path):
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": ["ok", "z" * 5000]}), path)
    skipped: list[BadRecordError] = []
    assert [d.text for d in read_documents(path, max_doc_bytes=4096, on_bad=skipped.append)] == ["ok"]
    assert [(e.line, e.reason) for e in skipped] == [(2, TOO_LONG)]


def test_shard_refuses_a_huge_document_with_a_documented_exit_code(tiny_tokenizer, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "w " * 40_000}) + "\n")
    out = run_cli("shard", docs, "--subset", "s", "--tokenizer", tiny_tokenizer, "--out", tmp_path / "c",
                  "--max-doc-bytes", "64Ki", "--workers", "1")
    assert out.returncode == 3, out.stderr
    assert f"{docs}:2: " in out.stderr and "--max-doc-bytes" in out.stderr


def test_the_hub_store_bounds_every_metadata_read(tmp_path, monkeypatch):
    import marin_data.stores.hf as hf

    repo = tmp_path / "root/team/big"
    repo.mkdir(parents=True)
    (repo / "manifest.json").write_bytes(b" " * (24 << 20))
    monkeypatch.setattr(hf, "METADATA_LIMIT", 1 << 20)
    with running_mirror(tmp_path / "root") as mirror:
        store = HfStore("hf://datasets/team/big", endpoint=mirror.url)  # its imports are not the read's memory
        err, peak = peak_bytes(lambda: list(store.list()))
        assert isinstance(err, RemoteError) and "manifest.json" in str(err) and peak < 8 << 20
        monkeypatch.setattr(hf, "METADATA_LIMIT", 64)  # the commit lookup's JSON answer is bounded too
        with pytest.raises(RemoteError, match="bytes"):
            list(HfStore("hf://datasets/team/big", endpoint=mirror.url).list())


def test_the_download_path_bounds_the_manifest(tmp_path):
    from marin_data.stores.base import METADATA_LIMIT
    from marin_data.transfer import plan

    assert plan.METADATA_LIMIT == METADATA_LIMIT <= 64 << 20
