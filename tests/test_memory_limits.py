"""Memory stays bounded whatever the input: a zstd bomb, one huge document, an oversized remote manifest.

Each test sends a bit more than a limit (the limit made small where it is large) and checks, with
``tracemalloc`` and Arrow's pool (`memory_checks`), that the reader never held much more than the limit.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from memory_checks import peak_bytes
from shard_env import run_cli, tiny_tokenizer  # noqa: F401 - a fixture

from marin_data.errors import BadRecordError, RemoteError, UnreadableInputError
from marin_data.raw.documents import read_documents
from marin_data.raw.records import TOO_LONG
from marin_data.stores.hf import HfStore
from marin_data.testing.mirror import running_mirror


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


@pytest.mark.parametrize("column", ["text", "id"])
def test_a_value_many_parquet_rows_repeat_is_refused_by_length_without_being_expanded(tmp_path, column):
    # 256 rows of one 1 MiB value in a few KB (the same as 1,024 rows of 16 MB at the default limit)
    path = tmp_path / "repeated.parquet"
    big = "x" * (1 << 20)
    rows = {"text": [big if column == "text" else "short"] * 256, "id": [big if column == "id" else "i"] * 256}
    pq.write_table(pa.table(rows), path, compression="zstd")
    assert path.stat().st_size < 16 << 10
    skipped: list[BadRecordError] = []
    docs, peak = peak_bytes(lambda: list(read_documents(path, max_doc_bytes=64 << 10, on_bad=skipped.append)))
    assert docs == [] and [e.reason for e in skipped] == [TOO_LONG] * 256 and skipped[-1].line == 256
    assert peak < 8 << 20, peak


def test_a_parquet_page_that_decompresses_a_thousandfold_is_refused_before_decoding(tmp_path, monkeypatch):
    from marin_data.raw import parquet

    monkeypatch.setattr(parquet, "_BATCH_BYTES", 4 << 20)  # the floor below which any ratio is read
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["y" * (1 << 20)] * 16}), path, compression="zstd", use_dictionary=False)
    err, peak = peak_bytes(lambda: list(read_documents(path, max_doc_bytes=64 << 10)))
    assert isinstance(err, UnreadableInputError) and "compression bomb" in str(err) and peak < 4 << 20, peak
    assert len(str(err)) < 300


def test_plain_parquet_strings_are_read_in_batches_bounded_in_bytes(tmp_path, monkeypatch):
    import numpy as np

    from marin_data.raw import parquet

    monkeypatch.setattr(parquet, "_BATCH_BYTES", 1 << 20)
    texts = [np.random.default_rng(i).bytes(60_000).hex() for i in range(100)]  # 120 KB each, 12 MB in all
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": texts}), path, compression="zstd", use_dictionary=False)
    docs, peak = peak_bytes(lambda: [d.text == t for d, t in zip(read_documents(path), texts)])
    assert docs == [True] * 100 and peak < 20 << 20, peak  # 34 MiB when the row group is one batch


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


def _shard(path, ids, lengths, row_group_size=None) -> None:
    import numpy as np

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(offsets[-1], np.uint32)))
    pq.write_table(pa.table({"id": ids, "tokens": tokens}), path, compression="zstd", row_group_size=row_group_size,
                   use_byte_stream_split=["tokens.list.element"], use_dictionary=["id"])


def test_show_and_the_datasheet_bound_a_row_group_from_its_footer_before_decoding(tmp_path):
    from marin_data.corpus.records import ShardRecord
    from marin_data.corpus.show import decode_rows
    from marin_data.docs.stats import _scan
    from marin_data.errors import ShardFormatError

    path = tmp_path / "zeros.parquet"
    _shard(path, ["a", "b"], [1, 4 << 20])  # 4M zero tokens (16 MiB decoded) in a few KB
    assert path.stat().st_size < 64 << 10
    shard = ShardRecord("zeros.parquet", "s", path.stat().st_size, "0" * 64, 2, (4 << 20) + 1, 1)
    err, peak = peak_bytes(lambda: decode_rows(iter([(shard, str(path))]), None, n=1, doc_id=None,
                                               max_row_group_bytes=4 << 20))
    assert isinstance(err, ShardFormatError) and "row group 0 may decode to" in str(err) and peak < 4 << 20, peak

    class Bar:
        def update(self, n):
            pass

    err, peak = peak_bytes(lambda: _scan(tmp_path, [shard], Bar(), None, 0, max_row_group_bytes=4 << 20))
    assert isinstance(err, ShardFormatError) and "row group 0 may decode to" in str(err) and peak < 4 << 20, peak


def test_show_expands_only_the_rows_it_shows(tmp_path):
    from marin_data.corpus.records import ShardRecord
    from marin_data.corpus.show import decode_rows

    class Tokenizer:  # what `decode_rows` asks of a loaded tokenizer
        info = type("Info", (), {"eos_id": 0, "add_bos": False, "bos_id": None})()
        tokenizer = type("Decoder", (), {"decode": staticmethod(lambda ids, skip_special_tokens: f"{len(ids)}")})()

    path = tmp_path / "ids.parquet"
    _shard(path, ["k" * (256 << 10)] * 2000, [3] * 2000)  # one 256 KiB id, 2,000 rows: 512 MB expanded
    shard = ShardRecord("ids.parquet", "s", path.stat().st_size, "0" * 64, 2000, 6000, 1)
    shown, peak = peak_bytes(lambda: decode_rows(iter([(shard, str(path))]), Tokenizer(), n=2, doc_id=None))
    assert [(d.tokens, d.text) for d in shown] == [(3, "2")] * 2 and peak < 16 << 20, peak
    found, peak = peak_bytes(lambda: decode_rows(iter([(shard, str(path))]), Tokenizer(), n=1, doc_id="k" * (256 << 10)))
    assert len(found) == 1 and peak < 16 << 20, peak
