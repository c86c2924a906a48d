"""`marin-data verify`: every kind of corruption is found, by path and kind, with the right exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin_data.fileio.atomic import sha256_file
from marin_data.cli import main
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.shard import read_shard, write_shard
from marin_data.corpus.verify import ProblemKind, verify_corpus
from marin_data.layout import LOCK_NAME, MANIFEST, RECORD, SHARDS_INDEX, STAGING, TOKENIZER, UNLISTED
from marin_data.transfer.download import download

SUBSETS = {"a": [20, 10], "b/c": [5]}
(DATASHEET,) = UNLISTED


def verify_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``marin-data verify ARGS`` in-process; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", *map(str, args)])
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def verify_json(capsys, *args: str) -> tuple[int, dict]:
    code, out, _ = verify_cli(capsys, *args, "--json")
    return code, json.loads(out)


def findings(report: dict) -> list[tuple[str, str]]:
    return [(p["path"], p["kind"]) for p in report["problems"]]


def relist(corpus, path: str, **changes) -> None:
    """Re-commit the corpus with one shard's index row changed (``changes``) or re-hashed from disk."""
    size_digest = {} if changes else dict(zip(("sha256", "bytes"), sha256_file(corpus.root / path)))
    rows = [s._replace(**size_digest, **changes) if s.path == path else s for s in corpus.shards]
    commit_corpus(corpus.root, corpus.manifest, rows)


def test_clean_corpus_passes_plain_and_deep(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    code, out, _ = verify_cli(capsys, corpus.root)
    assert code == 0 and out.startswith("OK:") and corpus.manifest_sha256 in out
    code, report = verify_json(capsys, corpus.root, "--deep")
    assert code == 0 and report["ok"] and report["problems"] == []
    assert report["files_checked"] == 3 + len(corpus.manifest.files)  # shards + metadata
    on_disk = sum(s.bytes for s in corpus.shards) + sum(r.bytes for r in corpus.manifest.files.values())
    assert report["bytes_checked"] == on_disk and report["manifest_sha256"] == corpus.manifest_sha256


def _delete(p: Path) -> None:
    p.unlink()


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _flip_middle_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _append(p: Path) -> None:
    with open(p, "ab") as f:
        f.write(b"\0")


def _replace_with_directory(p: Path) -> None:
    p.unlink()
    p.mkdir()


@pytest.mark.parametrize("corrupt, kind", [
    (_delete, "missing"), (_truncate, "truncated"), (_flip_middle_byte, "modified"), (_append, "oversized"),
    (_replace_with_directory, "unreadable"),
])
def test_each_corrupted_shard_is_reported_by_path_and_kind(make_corpus, capsys, corrupt, kind):
    corpus = make_corpus(SUBSETS)
    victim = corpus.shards[1].path
    corrupt(corpus.root / victim)
    code, report = verify_json(capsys, corpus.root)
    assert code == 1 and not report["ok"]
    assert findings(report) == [(victim, kind)]
    assert report["problems"][0]["expected"]["sha256"] == corpus.shards[1].sha256
    code, out, err = verify_cli(capsys, corpus.root)  # human output: one line per problem, then a summary
    assert code == 1 and out.splitlines()[0].split()[:2] == [kind, victim] and "1 problem found" in err


def test_unlisted_files_fail_while_partial_files_lock_staging_and_datasheet_do_not(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    root = corpus.root
    (root / LOCK_NAME).write_text("")
    (root / DATASHEET).parent.mkdir()
    (root / DATASHEET).write_text(f"manifest sha256 {corpus.manifest_sha256}")  # cannot be listed: states it
    (root / STAGING / "a").mkdir(parents=True)
    (root / STAGING / "a" / "part-00002.parquet").write_bytes(b"staged")
    (root / "data/a/part-00002.parquet.1a2b3c4d.part").write_bytes(b"half")
    code, report = verify_json(capsys, root)
    assert code == 0 and report["partial_files"] == ["data/a/part-00002.parquet.1a2b3c4d.part"]

    (root / "data/b/c/part-00001.parquet").write_bytes((root / "data/b/c/part-00000.parquet").read_bytes())
    (root / "datasheets/notes.md").write_text("stray")
    code, report = verify_json(capsys, root)
    assert code == 1
    assert findings(report) == [("data/b/c/part-00001.parquet", "unlisted"), ("datasheets/notes.md", "unlisted")]


def test_modified_tokenizer_json_is_a_problem(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    _flip_middle_byte(corpus.root / TOKENIZER)
    code, report = verify_json(capsys, corpus.root)
    assert code == 1 and findings(report) == [(TOKENIZER, "modified")]


def test_modified_shard_index_is_an_invalid_manifest(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    _flip_middle_byte(corpus.root / SHARDS_INDEX)
    code, out, err = verify_cli(capsys, corpus.root)
    assert code == 2 and out == "" and SHARDS_INDEX in err and "does not match the manifest" in err


def test_pinned_manifest_sha256(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    assert verify_cli(capsys, corpus.root, "--manifest-sha256", corpus.manifest_sha256.upper())[0] == 0
    code, _, err = verify_cli(capsys, corpus.root, "--manifest-sha256", "ab" * 32)
    assert code == 2 and corpus.manifest_sha256 in err
    code, _, err = verify_cli(capsys, corpus.root, "--manifest-sha256", "abc")
    assert code == 2 and "64 hex digits" in err


def test_unknown_subset_and_missing_manifest_exit_2(make_corpus, capsys, tmp_path):
    corpus = make_corpus(SUBSETS)
    code, _, err = verify_cli(capsys, corpus.root, "--subset", "nope")
    assert code == 2 and "known subsets: a, b/c" in err
    code, _, err = verify_cli(capsys, tmp_path / "empty")
    assert code == 2 and "no manifest.json" in err


def _dotdot_in_index(corpus, outside: Path) -> None:
    escape = os.path.relpath(outside, corpus.root)  # "../outside.parquet"
    commit_corpus(corpus.root, corpus.manifest, [corpus.shards[0]._replace(path=escape), *corpus.shards[1:]])


def _absolute_in_index(corpus, outside: Path) -> None:
    commit_corpus(corpus.root, corpus.manifest, [corpus.shards[0]._replace(path=str(outside)), *corpus.shards[1:]])


def _unsafe_in_files(corpus, outside: Path) -> None:
    doc = json.loads((corpus.root / MANIFEST).read_text())
    doc["files"][os.path.relpath(outside, corpus.root)] = {"bytes": 0, "sha256": "0" * 64}
    (corpus.root / MANIFEST).write_text(json.dumps(doc))


@pytest.mark.parametrize("tamper", [_dotdot_in_index, _absolute_in_index, _unsafe_in_files])
def test_manifest_naming_a_path_outside_the_corpus_is_refused_without_reading_it(make_corpus, tamper):
    corpus = make_corpus(SUBSETS)
    outside = corpus.root.parent / "outside.parquet"
    os.mkfifo(outside)  # opening a FIFO with no writer blocks: if verify read it, the timeout would fire
    tamper(corpus, outside)
    proc = subprocess.run([sys.executable, "-m", "marin_data", "verify", str(corpus.root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "unsafe path" in proc.stderr and "outside.parquet" in proc.stderr


def _rewrite_tokens(path: Path, **write_table_kwargs) -> None:
    pq.write_table(pq.read_table(path), path, compression="zstd", **write_table_kwargs)


def _rewrite_tokens_as_int64(path: Path) -> None:
    table = pq.read_table(path)
    pq.write_table(table.set_column(1, "tokens", table.column("tokens").cast(pa.large_list(pa.int64()))), path)


@pytest.mark.parametrize("rewrite, found", [
    (lambda p: _rewrite_tokens(p, use_dictionary=["id"]), "PLAIN"),
    (lambda p: _rewrite_tokens(p), "RLE_DICTIONARY"),
    (_rewrite_tokens_as_int64, "int64"),
])
def test_deep_finds_a_relisted_shard_with_the_wrong_encoding_or_schema(make_corpus, capsys, rewrite, found):
    corpus = make_corpus(SUBSETS)
    victim = corpus.shards[0].path
    rewrite(corpus.root / victim)
    relist(corpus, victim)  # listed with its new, correct hash: only the footer can tell
    code, report = verify_json(capsys, corpus.root)  # every verify reads the schema; only --deep the encodings
    assert (code, findings(report)) == ((1, [(victim, "bad_format")]) if found == "int64" else (0, []))
    code, report = verify_json(capsys, corpus.root, "--deep")
    assert code == 1 and findings(report) == [(victim, "bad_format")]
    assert found in json.dumps(report["problems"][0]["actual"])


def test_deep_finds_counts_that_disagree_with_the_index(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    victim = corpus.shards[2]
    relist(corpus, victim.path, docs=victim.docs + 1, tokens=victim.tokens - 1)
    assert verify_cli(capsys, corpus.root)[0] == 0
    code, report = verify_json(capsys, corpus.root, "--deep")
    assert code == 1 and findings(report) == [(victim.path, "count_mismatch")]
    problem = report["problems"][0]
    assert problem["expected"] == {"docs": victim.docs + 1, "tokens": victim.tokens - 1}
    assert problem["actual"] == {"docs": victim.docs, "tokens": victim.tokens}


def test_deep_finds_a_shard_tokenized_with_another_tokenizer(make_corpus, capsys):
    corpus = make_corpus(SUBSETS)
    victim = corpus.shards[0].path
    other = replace(corpus.manifest.tokenizer, sha256="f" * 64)
    write_shard(corpus.root / victim, *read_shard(corpus.root / victim), other)  # the real writer
    relist(corpus, victim)
    code, report = verify_json(capsys, corpus.root, "--deep")
    assert code == 1 and findings(report) == [(victim, "wrong_tokenizer")]
    assert report["problems"][0]["actual"] == "f" * 64


def test_subset_filter_checks_only_the_selected_subsets(make_corpus, capsys):
    corpus = make_corpus({"a": [20, 10], "b/c": [5], "b/d": [6]})
    _flip_middle_byte(corpus.root / "data/b/c/part-00000.parquet")
    (corpus.root / "data/b/c/stray.parquet").write_bytes(b"x")
    metadata = len(corpus.manifest.files)
    code, report = verify_json(capsys, corpus.root, "--subset", "a")
    assert code == 0 and report["subsets"] == ["a"] and report["files_checked"] == 2 + metadata
    code, report = verify_json(capsys, corpus.root, "--subset", "b/*")
    assert code == 1 and report["files_checked"] == 2 + metadata
    assert findings(report) == [("data/b/c/part-00000.parquet", "modified"), ("data/b/c/stray.parquet", "unlisted")]
    code, report = verify_json(capsys, corpus.root, "--subset", "b/d")  # data/b/c is not walked for b/d
    assert code == 0


@pytest.mark.parametrize("deep", [[], ["--deep"]])
def test_a_subset_filter_still_checks_the_metadata_files(make_corpus, capsys, deep):
    corpus = make_corpus(SUBSETS)
    with open(corpus.root / TOKENIZER, "a") as f:
        f.write(" ")  # a space appended to tokenizer.json: still valid JSON, not the listed bytes
    code, out, err = verify_cli(capsys, corpus.root, "--subset", "b/c", *deep)
    assert code == 1 and f"oversized  {TOKENIZER}" in out and "1 problem found" in err


def test_parent_subset_does_not_claim_a_child_subsets_folder(make_corpus):
    corpus = make_corpus({"b": [4], "b/c": [5]})
    (corpus.root / "data/b/c/stray.parquet").write_bytes(b"x")
    only_parent = verify_corpus(corpus.root, subsets=["[b]"], progress=False)  # a glob matching "b" alone
    assert only_parent.subsets == ("b",) and only_parent.ok
    for pattern in ("b", "b/c"):  # "b" selects b and b/c: the stray is reported once
        report = verify_corpus(corpus.root, subsets=[pattern], progress=False)
        assert [(p.path, p.kind) for p in report.problems] == [("data/b/c/stray.parquet", ProblemKind.UNLISTED)]


def test_report_is_the_same_whatever_the_worker_count(make_corpus):
    corpus = make_corpus({"a": [20, 10, 7, 3], "b/c": [5]})
    _truncate(corpus.root / corpus.shards[0].path)
    (corpus.root / corpus.shards[3].path).unlink()
    one, many = (verify_corpus(corpus.root, workers=w, deep=True, progress=False) for w in (1, 4))
    assert one.problems == many.problems and len(one.problems) == 2
    assert one.bytes_checked == many.bytes_checked and (one.workers, many.workers) == (1, 4)


def test_a_partial_download_is_checked_for_the_subsets_it_fetched(make_corpus, capsys, tmp_path):
    corpus = make_corpus(SUBSETS)
    dest = tmp_path / "fetched"
    assert download(corpus.root, subsets=["b/c"], dest=dest, workers=2, progress=False).ok
    code, report = verify_json(capsys, dest)
    assert code == 0 and report["subsets"] == ["b/c"] and report["scope"] == "downloaded"
    assert report["files_checked"] == 1 + len(corpus.manifest.files)
    _append(dest / "data/b/c/part-00000.parquet")
    (dest / "data/a").mkdir(parents=True)
    (dest / "data/a/part-00000.parquet").write_bytes(b"listed, not downloaded: not checked")
    (dest / "data/a/extra.parquet").write_bytes(b"unlisted")
    code, report = verify_json(capsys, dest)
    assert code == 1
    assert findings(report) == [("data/a/extra.parquet", "unlisted"), ("data/b/c/part-00000.parquet", "oversized")]
    code, report = verify_json(capsys, dest, "--subset", "a")  # an explicit filter overrides the record
    assert code == 1 and ("data/a/part-00001.parquet", "missing") in findings(report)


def test_a_download_record_for_another_manifest_is_refused(make_corpus, capsys, tmp_path):
    corpus = make_corpus(SUBSETS)
    dest = tmp_path / "fetched"
    assert download(corpus.root, subsets=["a"], dest=dest, workers=2, progress=False).ok
    record = json.loads((dest / RECORD).read_text())
    (dest / RECORD).write_text(json.dumps({**record, "manifest_sha256": "0" * 64}))
    code, _, err = verify_cli(capsys, dest)
    assert code == 2 and RECORD in err and "0" * 64 in err
