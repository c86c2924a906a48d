"""The shard index refuses every kind of bad row, naming it, with checks that run over whole columns."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_data.corpus.index import read_shard_index, write_shard_index
from marin_data.corpus.names import bad_digests, check_digest, safe_relpath, unsafe_paths
from marin_data.corpus.records import ShardRecord
from marin_data.errors import InvalidManifestError, UnsafePathError

DIGEST = "ab" * 32
SCHEMA = pa.schema([("path", pa.string()), ("subset", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string()),
                    ("docs", pa.int64()), ("tokens", pa.int64()), ("row_groups", pa.int32())])
METADATA = {"tokenizer.json", "shards.parquet", "SHA256SUMS", "README.md", "datasheets/token-composition.png"}


def row(path: str = "data/a/part-00000.parquet", subset: str = "a", **changes) -> dict:
    return {"path": path, "subset": subset, "bytes": 10, "sha256": DIGEST, "docs": 1, "tokens": 5,
            "row_groups": 1, **changes}


def good_rows() -> list[dict]:
    return [row(f"data/{s}/part-{i:05d}.parquet", s) for s in ("a", "b/c") for i in range(3)]


def read(tmp_path, rows: list[dict], schema: pa.Schema = SCHEMA) -> list[ShardRecord]:
    path = tmp_path / "shards.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return read_shard_index(path, metadata=METADATA)


def refused(tmp_path, rows, schema=SCHEMA) -> InvalidManifestError:
    with pytest.raises(InvalidManifestError) as e:
        read(tmp_path, rows, schema)
    return e.value


def test_a_good_index_reads_back_as_written(tmp_path):
    rows = [ShardRecord(**r) for r in good_rows()]
    write_shard_index(tmp_path / "shards.parquet", rows)
    assert read_shard_index(tmp_path / "shards.parquet", metadata=METADATA) == rows
    assert read_shard_index((tmp_path / "shards.parquet").read_bytes()) == rows
    assert read(tmp_path, []) == []


BAD_ROWS = {
    # kind: (the planted row, the message it gets; the row's path names it)
    "absolute": (row("/etc/passwd"), "unsafe path '/etc/passwd'"),
    "dotdot": (row("data/../../x"), "unsafe path 'data/../../x'"),
    "dot": (row("./a"), "unsafe path './a'"),
    "empty-component": (row("data//a"), "unsafe path 'data//a'"),
    "trailing-slash": (row("data/a/"), "unsafe path 'data/a/'"),
    "empty": (row(""), "unsafe path ''"),
    "backslash": (row("data\\a"), "unsafe path 'data\\\\a'"),
    "nul": (row("data/a\x00b"), "unsafe path 'data/a\\x00b'"),
    "drive": (row("C:/x"), "unsafe path 'C:/x'"),
    "subset-space": (row(subset="a b"), "invalid subset name 'a b'"),
    "subset-dotdot": (row(subset="a/../b"), "invalid subset name 'a/../b'"),
    "subset-empty": (row(subset=""), "invalid subset name ''"),
    "subset-unicode": (row(subset="é"), "invalid subset name 'é'"),
    "digest-short": (row(sha256="ab" * 31), "row data/a/part-00000.parquet: not a hex sha256"),
    "digest-upper": (row(sha256="AB" * 32), "not a hex sha256"),
    "digest-not-hex": (row(sha256="zz" * 32), "not a hex sha256"),
    "digest-newline": (row(sha256=DIGEST + "\n"), "not a hex sha256"),
    "negative-bytes": (row(bytes=-1), "negative size or count in row data/a/part-00000.parquet"),
    "negative-docs": (row(docs=-1), "negative size or count"),
    "negative-tokens": (row(tokens=-1), "negative size or count"),
    "negative-row-groups": (row(row_groups=-1), "negative size or count"),
    "twice": (row("data/a/part-00001.parquet"), "data/a/part-00001.parquet is listed twice"),
    "a-metadata-file": (row("README.md"), "README.md is listed twice"),
    "lock": (row(".marin.lock"), ".marin.lock is a reserved name"),
    "record": (row(".marin-download.json"), ".marin-download.json is a reserved name"),
    "manifest": (row("manifest.json"), "manifest.json is a reserved name"),
    "staging": (row(".staging/commit/manifest.json"), ".staging/commit/manifest.json is a reserved name"),
    "partial": (row("data/a/x.parquet.marin-download.part"), "x.parquet.marin-download.part is a reserved name"),
    "inside-a-shard": (row("data/a/part-00000.parquet/inner.parquet"),
                       "data/a/part-00000.parquet/inner.parquet is listed inside the file data/a/part-00000.parquet"),
    "inside-a-metadata-file": (row("README.md/x.parquet"), "README.md/x.parquet is listed inside the file README.md"),
    "holding-a-metadata-file": (row("datasheets"),
                                "datasheets/token-composition.png is listed inside the file datasheets"),
}


@pytest.mark.parametrize("kind", BAD_ROWS)
def test_every_kind_of_bad_row_is_refused_by_name(tmp_path, kind):
    planted, message = BAD_ROWS[kind]
    rows = good_rows()
    rows.insert(2, planted)
    err = refused(tmp_path, rows)
    assert message in str(err) and str(tmp_path / "shards.parquet") in str(err)
    if kind in ("absolute", "dotdot", "dot", "empty", "backslash", "nul", "drive"):
        assert isinstance(err, UnsafePathError)


def test_a_file_is_found_holding_another_past_siblings_that_sort_between_them(tmp_path):
    # "data/x-1" and "data/x.c" sort between "data/x" and "data/x/y" byte by byte
    rows = [row(p) for p in ("data/x", "data/x-1", "data/x.c", "data/x/y", "data/z")]
    assert "data/x/y is listed inside the file data/x" in str(refused(tmp_path, rows))
    assert len(read(tmp_path, [row(p) for p in ("data/x", "data/x-1", "data/x.c", "data/xy/z")])) == 4


def test_the_first_bad_row_in_index_order_is_the_one_named(tmp_path):
    rows = good_rows()
    rows[1]["bytes"] = -1
    rows[4]["path"] = "/etc/passwd"
    assert "negative size or count in row data/a/part-00001.parquet" in str(refused(tmp_path, rows))


@pytest.mark.parametrize("column", ["path", "subset", "sha256", "bytes", "docs", "tokens", "row_groups"])
def test_a_null_in_any_column_is_refused_by_row(tmp_path, column):
    rows = good_rows()
    rows[3][column] = None
    assert f"row 4 has no {column} (null)" in str(refused(tmp_path, rows))


def test_columns_of_the_wrong_type_or_out_of_range_are_refused(tmp_path):
    schema = SCHEMA.set(2, pa.field("bytes", pa.float64()))
    assert "column bytes holds double, not integers" in str(refused(tmp_path, good_rows(), schema))
    wide = schema.set(2, pa.field("bytes", pa.uint64()))
    rows = good_rows()
    rows[0]["bytes"] = 2**64 - 1
    assert "column bytes holds a value out of range" in str(refused(tmp_path, rows, wide))
    path = tmp_path / "shards.parquet"
    pq.write_table(pa.table({"path": ["a"]}), path)
    with pytest.raises(InvalidManifestError, match="unreadable shard index"):
        read_shard_index(path)


def test_invalid_utf8_in_a_name_is_an_unreadable_index(tmp_path):
    import numpy as np

    offsets = pa.py_buffer(np.array([0, 2], np.int32))
    bad = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"a\xff")])
    table = pa.Table.from_pylist([row()], schema=SCHEMA).set_column(0, "path", bad)
    pq.write_table(table, tmp_path / "shards.parquet")
    with pytest.raises(InvalidManifestError, match="unreadable shard index"):
        read_shard_index(tmp_path / "shards.parquet")


TRICKY = ["a", "a/b", "", "/", "/a", "a/", "a//b", ".", "..", "./a", "a/.", "a/..", "a/../b", "..a", "a..",
          ".a/b.", "a\\b", "a\x00", "C:", "c:/x", "1:x", "ab:c", "a\n", "a/\n", "\n", "a/.\n", "é/ü", "a/ b",
          "...", "a/.../b"]


def test_the_column_checks_agree_with_the_one_name_checks():
    def refuses(check, value) -> bool:
        try:
            check(value)
        except InvalidManifestError:
            return True
        return False

    assert unsafe_paths(pa.array(TRICKY)).tolist() == [refuses(safe_relpath, p) for p in TRICKY]
    digests = [DIGEST, DIGEST.upper(), DIGEST[:-1], DIGEST + "0", DIGEST + "\n", "g" * 64, "", "0" * 64,
               "é" * 32, DIGEST[:-2] + "/0"]
    for column in (digests, [DIGEST] * 3, [DIGEST[:-1] + "x"] * 2):
        assert bad_digests(pa.array(column)).tolist() == [refuses(lambda d: check_digest(d, "x"), d) for d in column]
        assert bad_digests(pa.array(column, pa.large_string())).tolist() == bad_digests(pa.array(column)).tolist()
