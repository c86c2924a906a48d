"""The shard index refuses every kind of bad row, naming it, with checks that run over whole columns."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from memory_checks import peak_bytes

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


def write_index(path, rows: list[dict], **options) -> int:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, compression="zstd", **options)
    return path.stat().st_size


LIMIT = 1 << 20  # the index's limit in these tests, made small (the default is MAX_INDEX_BYTES)


def test_long_names_in_a_tiny_index_are_refused_from_its_footer_before_decoding(tmp_path):
    # 12 rows of 4 MiB paths in a few KB: each would decode to 4 MiB (at the default limit: 400 MB paths)
    size = write_index(tmp_path / "shards.parquet", [row(f"data/{i}/" + "x" * (4 << 20)) for i in range(12)])
    assert size < 64 << 10
    err, used = peak_bytes(lambda: read_shard_index(tmp_path / "shards.parquet", max_bytes=LIMIT))
    assert isinstance(err, InvalidManifestError) and "over the 1,048,576 a shard index may take" in str(err)
    assert used < LIMIT and len(str(err)) < 300, (used, len(str(err)))


def test_many_identical_rows_in_a_tiny_index_are_refused_before_decoding(tmp_path):
    # 400,000 copies of one row in a few KB (at the default limit: 20 million rows in 667 KB)
    size = write_index(tmp_path / "shards.parquet", [row()] * 400_000)
    assert size < 64 << 10
    err, used = peak_bytes(lambda: read_shard_index(tmp_path / "shards.parquet", max_bytes=LIMIT))
    assert isinstance(err, InvalidManifestError) and "400,000 rows that may decode to" in str(err)
    assert used < LIMIT, used


def test_a_long_value_many_rows_repeat_is_refused_before_it_is_expanded(tmp_path):
    # within the footer's bound (the dictionary holds the value once), over it once expanded row by row
    write_index(tmp_path / "shards.parquet", [row("data/" + "y" * (100 << 10))] * 1000)
    err, used = peak_bytes(lambda: read_shard_index(tmp_path / "shards.parquet", max_bytes=LIMIT))
    assert isinstance(err, InvalidManifestError) and "whose names take 102," in str(err)
    assert used < LIMIT, used


def test_a_long_bad_name_is_cut_short_in_the_message(tmp_path):
    rows = good_rows()
    rows[1]["path"] = "/" + "z" * 100_000
    err = refused(tmp_path, rows)
    assert isinstance(err, UnsafePathError) and len(str(err)) < 400 and "more characters" in str(err)
    rows = good_rows()
    rows[4]["path"] = rows[2]["path"] = "data/" + "w" * 100_000
    assert len(str(refused(tmp_path, rows))) < 400


def vouched_index(root, rows: list[dict]) -> None:
    """Replace a corpus's shard index by ``rows`` and make its manifest vouch for the new one."""
    import hashlib
    import json

    from marin_data.layout import MANIFEST, SHARDS_INDEX

    write_index(root / SHARDS_INDEX, rows)
    data = (root / SHARDS_INDEX).read_bytes()
    doc = json.loads((root / MANIFEST).read_bytes())
    doc["files"][SHARDS_INDEX] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (root / MANIFEST).write_text(json.dumps(doc))


def test_load_corpus_refuses_an_oversized_index_its_manifest_vouches_for(make_corpus, monkeypatch):
    from marin_data.cli._errors import describe
    from marin_data.corpus import index
    from marin_data.corpus.manifest import load_corpus

    corpus = make_corpus({"a": [3]})
    shard = corpus.shards[0]._asdict()
    vouched_index(corpus.root, [{**shard, "path": f"data/a/{i}-" + "x" * (4 << 20)} for i in range(12)])
    monkeypatch.setattr(index, "MAX_INDEX_BYTES", LIMIT)
    err, used = peak_bytes(lambda: load_corpus(corpus.root))
    assert isinstance(err, InvalidManifestError) and describe(err)[1] == 2 and used < LIMIT


def test_the_mirror_serves_a_repo_whose_index_expands_without_decoding_it(tmp_path, monkeypatch):
    from conftest import build_corpus

    from marin_data.corpus import index
    from marin_data.mirror.repo import RepoStore

    corpus = build_corpus(tmp_path / "root" / "team" / "c", {"a": [3]})
    RepoStore(tmp_path / "root").snapshot("team/c")  # what a first scan imports is not the scan's memory
    vouched_index(corpus.root, [corpus.shards[0]._asdict()] * 400_000)  # the same row 400,000 times
    monkeypatch.setattr(index, "MAX_INDEX_BYTES", LIMIT)
    snapshot, used = peak_bytes(lambda: RepoStore(tmp_path / "root").snapshot("team/c"))
    # its files hashed instead, 8 MiB reads per hashing thread (`sha256_file`); 52 MB when the index is decoded
    assert corpus.shards[0].path in snapshot.files and used < 24 << 20, used
