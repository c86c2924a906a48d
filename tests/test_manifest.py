"""The corpus description: chain of trust, path safety, subset selection, totals."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pyarrow.parquet as pq
import pytest

from marin_data.corpus.commit import assign_repos
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.names import safe_relpath, select_subsets
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.shard import TOKENS_VALUES, inspect_shard, read_shard
from marin_data.errors import InvalidManifestError, ManifestHashMismatchError, UnsafePathError
from marin_data.layout import MANIFEST, SHARDS_INDEX


def test_committed_corpus_passes_coreutils_sha256sum(make_corpus):
    corpus = make_corpus({"a": [20, 10], "b/c": [5]})
    out = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=corpus.root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": OK") == 3 + 2  # shards + tokenizer.json + shards.parquet


def test_manifest_totals_equal_sums_over_shards(make_corpus):
    corpus = make_corpus({"a": [20, 10], "b/c": [5]})
    for name, info in corpus.manifest.subsets.items():
        rows = corpus.shards_of([name])
        assert info.docs == sum(r.docs for r in rows) and info.tokens == sum(r.tokens for r in rows)
        assert info.shards == len(rows) and info.bytes == sum(r.bytes for r in rows)
    assert corpus.manifest.subsets["a"].docs == 30


def test_shards_use_byte_stream_split_and_no_dictionary_on_token_values(make_corpus):
    corpus = make_corpus({"a": [200]}, row_group_tokens=5000)
    path = corpus.root / corpus.shards[0].path
    md = pq.ParquetFile(path).metadata
    assert md.num_row_groups > 1
    col = [i for i in range(md.num_columns) if md.schema.column(i).path == TOKENS_VALUES][0]
    for rg in range(md.num_row_groups):
        enc = md.row_group(rg).column(col).encodings
        assert "BYTE_STREAM_SPLIT" in enc and not any("DICT" in e for e in enc)
        assert md.row_group(rg).column(col).compression == "ZSTD"
    assert inspect_shard(path).row_groups == md.num_row_groups
    ids, tokens, offsets = read_shard(path)
    assert len(ids) == 200 and tokens.dtype.name == "uint32" and offsets[-1] == len(tokens)


def test_pinned_manifest_digest_is_enforced(make_corpus):
    corpus = make_corpus({"a": [3]})
    digest = hashlib.sha256((corpus.root / MANIFEST).read_bytes()).hexdigest()
    assert load_corpus(corpus.root, manifest_sha256=digest).manifest_sha256 == digest
    with pytest.raises(ManifestHashMismatchError):
        load_corpus(corpus.root, manifest_sha256="0" * 64)


def test_shard_index_that_differs_from_manifest_is_refused(make_corpus):
    corpus = make_corpus({"a": [3], "b": [4]})
    table = pq.read_table(corpus.root / SHARDS_INDEX)
    pq.write_table(table.slice(0, 1), corpus.root / SHARDS_INDEX)
    with pytest.raises(InvalidManifestError, match="does not match the manifest"):
        load_corpus(corpus.root)


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "data/../../x", "a//b", "C:/x", "a\\b", "./a", ""])
def test_unsafe_paths_are_refused(bad):
    with pytest.raises(UnsafePathError):
        safe_relpath(bad)


def test_manifest_naming_a_path_outside_the_corpus_is_refused(make_corpus):
    corpus = make_corpus({"a": [3]})
    doc = json.loads((corpus.root / MANIFEST).read_bytes())
    doc["files"]["../../etc/passwd"] = doc["files"][SHARDS_INDEX]
    (corpus.root / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(UnsafePathError):
        load_corpus(corpus.root)


def test_subset_patterns_match_names_globs_and_parents():
    names = ["midtrain/math", "pretrain/code", "pretrain/dclm"]
    assert select_subsets(names, None) == names
    assert select_subsets(names, ["pretrain"]) == ["pretrain/code", "pretrain/dclm"]
    assert select_subsets(names, ["*/math", "pretrain/code"]) == ["midtrain/math", "pretrain/code"]
    with pytest.raises(InvalidManifestError, match="matches no subset"):
        select_subsets(names, ["pretrain/nope"])


def test_manifest_bytes_are_deterministic(make_corpus):
    a = make_corpus({"a": [5, 6]}, seed=3)
    b = make_corpus({"a": [5, 6]}, seed=3)
    assert (a.root / MANIFEST).read_bytes() == (b.root / MANIFEST).read_bytes()
    assert (a.root / SHARDS_INDEX).read_bytes() == (b.root / SHARDS_INDEX).read_bytes()


def test_hub_repos_are_assigned_first_fit_and_a_subset_keeps_its_repo():
    def rows(counts):
        return [ShardRecord(f"data/{s}/part-{i:05d}.parquet", s, 1, "0" * 64, 1, 1, 1)
                for s, n in counts.items() for i in range(n)]

    first = assign_repos(rows({"b": 3, "c": 4}), meta_files=4, previous={}, max_files_per_repo=8)
    assert first == {"b": 1, "c": 2}
    # "a" sorts first but is new: published subsets stay where they are, the newcomer goes where it fits
    assert assign_repos(rows({"a": 1, "b": 3, "c": 4}), meta_files=4, previous=first, max_files_per_repo=8) == {
        "a": 1, "b": 1, "c": 2}


def test_a_manifest_nested_100000_levels_deep_is_an_untrusted_manifest(make_corpus):
    from shard_env import run_cli

    corpus = make_corpus({"a": [3]})
    doc = (corpus.root / MANIFEST).read_bytes()
    (corpus.root / MANIFEST).write_bytes(doc[:-2] + b', "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")
    with pytest.raises(InvalidManifestError, match="nested 100,001 levels"):
        load_corpus(corpus.root)
    out = run_cli("info", corpus.root)
    assert out.returncode == 2 and "nested" in out.stderr and "Traceback" not in out.stderr, out.stderr
