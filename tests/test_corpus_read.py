"""Reading documents: every input format, ids, and bad input reported with its file and line."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from shard_env import write_jsonl, write_parquet

from marin_data.raw.documents import expand_inputs, read_documents, source_names
from marin_data.raw.records import BAD_JSON, MISSING_TEXT, UNDECODABLE
from marin_data.errors import BadRecordError, UnreadableInputError

RECORDS = [{"text": "first doc", "id": "a"}, {"text": "second\ndoc é", "id": 7}, {"text": "", "id": "c"},
           {"text": "no id"}]


@pytest.mark.parametrize("name,compression", [("in.jsonl", None), ("in.jsonl.gz", "gzip"), ("in.json.gz", "gzip"),
                                              ("in.jsonl.zst", "zstd"), ("in.ndjson.zstd", "zstd")])
def test_json_lines_in_every_compression_read_back_with_ids_and_lines(tmp_path: Path, name, compression):
    path = write_jsonl(tmp_path / name, RECORDS, compression)
    docs = list(read_documents(path, source="src/in"))
    assert [(d.id, d.text, d.line) for d in docs] == [("a", "first doc", 1), ("7", "second\ndoc é", 2),
                                                      ("c", "", 3), ("src/in:4", "no id", 4)]
    assert {d.path for d in docs} == {str(path)}


def test_parquet_rows_are_lines_and_columns_are_configurable(tmp_path: Path):
    path = write_parquet(tmp_path / "in.parquet", {"body": [f"doc {i}" for i in range(120)],
                                                   "key": [None if i == 5 else f"k{i}" for i in range(120)]})
    docs = list(read_documents(path, text_field="body", id_field="key"))
    assert len(docs) == 120
    assert (docs[0].id, docs[0].text, docs[0].line) == ("k0", "doc 0", 1)
    assert (docs[5].id, docs[119].line) == ("in.parquet:6", 120)


def test_blank_lines_are_not_records_but_count_as_lines(tmp_path: Path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n\n   \n{"text": "b"}\n')
    assert [(d.text, d.line) for d in read_documents(path)] == [("a", 1), ("b", 4)]


BAD_LINES = [
    (b'{"text": "ok"}\n{"text": "broken\n', 2, BAD_JSON),
    (b'{"text": "ok"}\n[1, 2]\n', 2, BAD_JSON),
    (b'{"text": "ok"}\n{"text": "ok"}\n{"body": "x"}\n', 3, MISSING_TEXT),
    (b'{"text": 12}\n', 1, MISSING_TEXT),
    (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', 2, UNDECODABLE),
    (b'{"text": "lone \\ud800 surrogate"}\n', 1, UNDECODABLE),
]


@pytest.mark.parametrize("data,line,reason", BAD_LINES)
def test_bad_json_lines_raise_naming_file_and_line(tmp_path: Path, data: bytes, line: int, reason: str):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(data)
    with pytest.raises(BadRecordError) as e:
        list(read_documents(path))
    assert (e.value.path, e.value.line, e.value.reason) == (str(path), line, reason)
    assert str(e.value).startswith(f"{path}:{line}: ")


def test_on_bad_skips_each_bad_record_and_keeps_the_rest(tmp_path: Path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"".join(data for data, _, _ in BAD_LINES))
    seen: list[BadRecordError] = []
    docs = list(read_documents(path, on_bad=seen.append))
    assert [d.text for d in docs] == ["ok"] * 5
    assert [e.reason for e in seen] == [r for _, _, r in BAD_LINES]


def test_parquet_bad_values_are_bad_records(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": pa.array([b"ok", None, b"caf\xe9"], pa.binary())}), path)
    seen: list[BadRecordError] = []
    assert [d.text for d in read_documents(path, on_bad=seen.append)] == ["ok"]
    assert [(e.line, e.reason) for e in seen] == [(2, MISSING_TEXT), (3, UNDECODABLE)]
    with pytest.raises(BadRecordError, match="no column 'content'"):
        list(read_documents(path, text_field="content"))


def _truncate(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("name,compression", [("t.jsonl.gz", "gzip"), ("t.jsonl.zst", "zstd")])
def test_truncated_compressed_file_is_unreadable_not_silently_short(tmp_path: Path, name, compression):
    records = [{"text": f"document number {i} " * 20} for i in range(3000)]
    path = _truncate(write_jsonl(tmp_path / name, records, compression))
    with pytest.raises(UnreadableInputError) as e:
        list(read_documents(path, on_bad=lambda err: None))  # not skippable: documents would silently vanish
    assert e.value.path == str(path)
    assert "truncated" in str(e.value)


def test_corrupt_gzip_and_parquet_and_missing_files_are_unreadable(tmp_path: Path):
    gz = tmp_path / "c.jsonl.gz"
    data = bytearray(gzip.compress(b'{"text": "x"}\n' * 1000))
    data[len(data) // 2] ^= 0xFF
    gz.write_bytes(bytes(data))
    pq_path = tmp_path / "c.parquet"
    pq_path.write_bytes(b"PAR1 not really parquet")
    for path in (gz, pq_path, tmp_path / "missing.jsonl"):
        with pytest.raises(UnreadableInputError) as e:
            list(read_documents(path, on_bad=lambda err: None))  # the gzip CRC fails even if garbage is skipped
        assert e.value.path == str(path)


def test_expand_inputs_sorts_globs_and_directories_and_rejects_what_it_cannot_read(tmp_path: Path):
    for rel in ("b/2.jsonl", "a/1.jsonl.gz", "a/deep/3.parquet", "a/.hidden.jsonl", "a/notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    got = expand_inputs([str(tmp_path / "b" / "*.jsonl"), tmp_path / "a", str(tmp_path / "b/2.jsonl")])
    assert [p.relative_to(tmp_path).as_posix() for p in got] == ["a/1.jsonl.gz", "a/deep/3.parquet", "b/2.jsonl"]
    assert source_names(got) == ["a/1.jsonl.gz", "a/deep/3.parquet", "b/2.jsonl"]
    for bad in (str(tmp_path / "*.zip"), tmp_path / "nope.jsonl", tmp_path / "a" / "notes.txt"):
        with pytest.raises(UnreadableInputError):
            expand_inputs([bad])


def test_json_ids_keep_their_value_as_text(tmp_path: Path):
    path = write_jsonl(tmp_path / "x.jsonl", [{"text": "t", "id": {"k": 1}}, {"text": "t", "id": None}])
    assert [d.id for d in read_documents(path)] == [str({"k": 1}), "x.jsonl:2"]


def test_a_record_nested_100000_levels_deep_is_a_bad_record_that_skip_bad_skips(tmp_path: Path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"text": "before"}\n{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b'}\n{"text": "after"}\n')
    with pytest.raises(BadRecordError) as e:
        list(read_documents(path))
    assert (e.value.line, e.value.reason) == (2, BAD_JSON) and "nested 100,001 levels" in str(e.value)
    skipped: list[BadRecordError] = []
    assert [d.text for d in read_documents(path, on_bad=skipped.append)] == ["before", "after"]
    assert [(s.line, s.reason) for s in skipped] == [(2, BAD_JSON)]


def test_nesting_is_measured_outside_strings_and_across_chunks():
    from marin_data.fileio.untrusted_json import depth, loads

    text = b'{"a": ["[[[\\"]]", {"b": [[1]]}], "c\\\\": "{"}'
    assert [depth(text, chunk) for chunk in (1, 2, 3, 5, 1 << 20)] == [5] * 5
    assert loads(text, max_depth=5)["c\\"] == "{"
    with pytest.raises(ValueError, match="nested 5 levels"):
        loads(text, max_depth=4)
