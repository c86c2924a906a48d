"""``marin-data shard``: the corpus it writes, determinism, restarts, locking and bad input.

One reference subset is built twice (``--workers 1`` and ``2``) from ten input files in every format;
most tests read it, the rest copy it or shard small inputs of their own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shard_env import (  # noqa: F401 - tiny_tokenizer is a fixture
    ROOT,
    make_texts,
    run_cli,
    tiny_tokenizer,
    train_tiny,
    tree_bytes,
    write_jsonl,
    write_parquet,
)

from marin_data.fileio.arrays import numbers, strings, view
from marin_data.corpus.build import shard_subset
from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.shard import TOKENS_VALUES, ShardWriter, inspect_shard, write_shard
from marin_data.corpus.sources import sources_path
from marin_data.engines.local import LocalEngine
from marin_data.errors import (
    BadRecordError,
    CorpusConflictError,
    CorpusLockedError,
    TokenizerMismatchError,
    UnreadableInputError,
)
from marin_data.layout import MANIFEST, SHARDS_INDEX, STAGING, SUMS, TOKENIZER
from marin_data.fileio.lock import corpus_lock
from marin_data.raw.tokenizer import TokenizerInfo, load_tokenizer

SUBSET = "web/mix"
SHARD_TOKENS = 16_000
EOS, BOS = 0, 1


def _make_inputs(folder: Path) -> dict[str, str]:
    """Ten input files (gzip, zstd, Parquet, plain; one without ids, with an empty document) -> {id: text}."""
    expected = {}
    for f in range(10):
        texts = make_texts(120, seed=f)
        if f == 3:
            texts[7] = ""  # empty documents are skipped (and counted) even without --skip-bad
            name, records = f"f{f:02d}.jsonl", [{"text": t} for t in texts]
            ids = [f"{name}:{i + 1}" for i in range(len(texts))]
        else:
            ids = [f"doc-{f}-{i}" for i in range(len(texts))]
            records = [{"text": t, "id": i} for t, i in zip(texts, ids)]
            name = {0: "f00.jsonl.gz", 1: "f01.jsonl.zst", 2: "f02.parquet"}.get(f, f"f{f:02d}.jsonl")
        if name.endswith(".parquet"):
            write_parquet(folder / name, {"text": texts, "id": ids})
        else:
            write_jsonl(folder / name, records, {".gz": "gzip", ".zst": "zstd"}.get(Path(name).suffix))
        expected.update({i: t for i, t in zip(ids, texts) if t})
    return expected


def _shard_args(inputs: Path, tokenizer: Path, out: Path, workers: int) -> list[str]:
    return [str(inputs), "--subset", SUBSET, "--tokenizer", str(tokenizer), "--out", str(out), "--workers",
            str(workers), "--shard-tokens", str(SHARD_TOKENS), "--license", "CC0-1.0"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer: Path) -> dict:
    base = tmp_path_factory.mktemp("reference")
    expected = _make_inputs(base / "inputs")
    corpora = {}
    for workers in (1, 2):
        out = base / f"w{workers}" / "corpus"
        corpora[workers] = shard_subset([base / "inputs"], subset=SUBSET, tokenizer=str(tiny_tokenizer), out=out,
                                        workers=workers, shard_tokens=SHARD_TOKENS, license="CC0-1.0")
    return {"inputs": base / "inputs", "expected": expected, "root": base / "w2" / "corpus",
            "reports": corpora, "tokenizer": tiny_tokenizer}


def _copy(reference: dict, tmp_path: Path) -> Path:
    dst = tmp_path / "corpus"
    shutil.copytree(reference["root"], dst)
    return dst


# --- what one run writes ---------------------------------------------------------------------------------


def test_worker_count_does_not_change_a_single_byte(reference):
    one, two = (tree_bytes(reference["root"].parent.parent / f"w{w}" / "corpus") for w in (1, 2))
    assert one == two
    report = reference["reports"][2]
    assert report.units == 10 and report.shards > 5 and report.skipped == {"empty": 1}


class _LastFirst:
    """An engine that runs the jobs queued so far in this process, then returns their results last first."""

    workers = 1

    def map_unordered(self, fn, jobs):
        done = 0
        while done < len(jobs):  # the packs are appended while the units' results are read
            batch = [(i, fn(jobs[i])) for i in range(done, len(jobs))]
            done = len(jobs)
            yield from reversed(batch)

    def close(self) -> None:
        pass


def test_units_finishing_in_any_order_cut_the_same_shards(reference, tmp_path):
    """The last unit finishes first and the first one last: no shard can be cut until the end, then all are."""
    out = tmp_path / "corpus"
    shard_subset([reference["inputs"]], subset=SUBSET, tokenizer=str(reference["tokenizer"]), out=out,
                 engine=_LastFirst(), shard_tokens=SHARD_TOKENS, license="CC0-1.0")
    assert tree_bytes(out) == tree_bytes(reference["root"])


def test_a_local_engine_runs_the_jobs_appended_while_its_results_are_read():
    engine = LocalEngine(2)
    jobs = [-1, -2]
    try:
        results = {}
        for k, result in engine.map_unordered(abs, jobs):
            results[k] = result
            if result < 100:
                jobs.append(-100 * result)
    finally:
        engine.close()
    assert results == {k: abs(job) for k, job in enumerate(jobs)} and sorted(results.values()) == [1, 2, 100, 200]


def test_sharding_never_makes_pyarrow_import_pandas(reference, tmp_path):
    """pyarrow imports pandas on a process's first `pa.array` or `to_numpy` (~0.2 s, once per worker and in
    the parent, measured): every step of a run, done in one process here, builds and reads arrays without."""
    code = f"""
import sys
from marin_data.corpus.build import shard_subset

class Inline:
    workers = 1

    def map_unordered(self, fn, jobs):
        i = 0
        while i < len(jobs):
            yield i, fn(jobs[i])
            i += 1

    def close(self):
        pass

shard_subset([{str(reference["inputs"])!r}], subset="s", tokenizer={str(reference["tokenizer"])!r},
             out={str(tmp_path / "corpus")!r}, engine=Inline(), shard_tokens={SHARD_TOKENS})
assert "pyarrow" in sys.modules and "pandas" not in sys.modules, sorted(sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr


def test_arrays_built_on_buffers_equal_those_of_pa_array():
    ints = np.array([3, 1, 4, 1, 5], np.int64)
    assert numbers(ints, np.int64).equals(pa.array(ints, pa.int64()))
    assert numbers([7, 8], np.int32).equals(pa.array([7, 8], pa.int32()))
    texts = ["a", "héllo", "", "日本"]
    assert strings(texts).equals(pa.array(texts, pa.string())) and len(strings([])) == 0
    with pytest.raises(UnicodeEncodeError):  # as pa.array raises
        strings(["\ud800"])
    sliced = pa.array(ints, pa.int64()).slice(1, 3)
    assert view(sliced, np.int64).tolist() == [1, 4, 1] and view(sliced.slice(3), np.int64).size == 0
    with pytest.raises(ValueError):
        view(sliced, np.uint32)


@pytest.mark.parametrize("seed", range(4))
def test_a_shard_written_in_batches_is_the_bytes_of_one_write(tmp_path, seed):
    """Row groups end at the first document end at or past each multiple of row_group_tokens (none at the
    last token), whatever batches the documents arrive in: converters stream, `write_shard` writes once."""
    rng = np.random.default_rng(seed)
    info = TokenizerInfo(name="t", sha256="0" * 64, vocab_size=50, eos_id=0)
    for trial in range(25):
        n, every = int(rng.integers(0, 40)), int(rng.integers(1, 60))
        lengths = rng.integers(0, 25, n) * (rng.random(n) > 0.3)  # empty documents too, also at the end
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = rng.integers(0, 50, int(offsets[-1])).astype(np.uint32)
        ids = [f"c:{i}" for i in range(n)]
        once = write_shard(tmp_path / "once.parquet", ids, tokens, offsets, info, row_group_tokens=every)
        cuts = sorted({0, n, *rng.integers(0, n + 1, int(rng.integers(0, 6))).tolist()})
        with ShardWriter(tmp_path / "batched.parquet", info, row_group_tokens=every) as writer:
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                writer.write(ids[lo:hi], tokens[offsets[lo]:offsets[hi]], offsets[lo:hi + 1] - offsets[lo])
        assert writer.stats == once, (trial, lengths.tolist(), every, cuts)
    assert write_shard(tmp_path / "edge.parquet", ["a", "b", "c"], np.zeros(8, np.uint32),
                       np.array([0, 4, 8, 8]), info, row_group_tokens=4).row_groups == 2  # no cut at the end
    with pytest.raises(ValueError), ShardWriter(tmp_path / "never.parquet", info) as writer:
        writer.write(["a"], np.zeros(3, np.uint32), np.array([0, 2]))
    assert not list(tmp_path.glob("never.parquet*"))  # a failed write leaves nothing behind


def test_the_corpus_has_exactly_the_documented_layout(reference):
    files = set(tree_bytes(reference["root"]))
    shards = {f for f in files if f.startswith("data/")}
    assert files - shards == {MANIFEST, SHARDS_INDEX, SUMS, TOKENIZER, sources_path(SUBSET)}  # no lock file left
    assert shards == {f"data/{SUBSET}/part-{n:05d}.parquet" for n in range(len(shards))}
    assert not (reference["root"] / STAGING).exists()
    assert (reference["root"] / TOKENIZER).read_bytes() == reference["tokenizer"].read_bytes()


def test_every_document_decodes_to_its_text_with_eos_last(reference):
    tok = load_tokenizer(str(reference["tokenizer"]))
    seen = {}
    for rec in load_corpus(reference["root"]).shards:
        table = pq.read_table(reference["root"] / rec.path)
        for doc_id, tokens in zip(table.column("id").to_pylist(), table.column("tokens").to_pylist()):
            assert tokens[-1] == EOS and EOS not in tokens[:-1]
            seen[doc_id] = tok.tokenizer.decode(tokens[:-1])
    assert seen == reference["expected"]
    assert list(seen) == list(reference["expected"])  # input files in sorted order, each in file order


def test_shards_open_with_plain_pyarrow_in_the_documented_encoding(reference):
    for rec in load_corpus(reference["root"]).shards:
        pf = pq.ParquetFile(reference["root"] / rec.path)
        assert pf.schema_arrow.field("id").type == pa.string()
        assert pf.schema_arrow.field("tokens").type == pa.large_list(pa.uint32())
        md = pf.metadata
        col = [md.schema.column(i).path for i in range(md.num_columns)].index(TOKENS_VALUES)
        for rg in range(md.num_row_groups):
            chunk = md.row_group(rg).column(col)
            assert "BYTE_STREAM_SPLIT" in chunk.encodings
            assert not any("DICT" in e for e in chunk.encodings) and not chunk.has_dictionary_page
            assert chunk.compression == "ZSTD"
        assert inspect_shard(reference["root"] / rec.path).tokenizer_sha256 == \
            load_corpus(reference["root"]).manifest.tokenizer.sha256


def test_manifest_totals_are_the_sums_over_the_shards(reference):
    root = reference["root"]
    manifest = json.loads((root / MANIFEST).read_bytes())
    rows = read_shard_index(root / SHARDS_INDEX)
    subset = manifest["subsets"][SUBSET]
    assert subset["docs"] == sum(r.docs for r in rows) == len(reference["expected"])
    assert subset["tokens"] == sum(r.tokens for r in rows)
    assert subset["bytes"] == sum(r.bytes for r in rows) == sum((root / r.path).stat().st_size for r in rows)
    assert subset["shards"] == len(rows) and subset["license"] == "CC0-1.0"
    for r in rows:
        table = pq.read_table(root / r.path)
        lengths = pa.compute.list_value_length(table.column("tokens")).to_numpy()
        assert (r.docs, r.tokens) == (len(lengths), int(lengths.sum()))
        assert r.tokens <= SHARD_TOKENS or r.docs == 1
    sources = json.loads((root / sources_path(SUBSET)).read_bytes())
    assert sources["tokens"] == subset["tokens"] and sources["skipped"] == {"empty": 1}
    assert [i["name"] for i in sources["inputs"]] == sorted(p.name for p in reference["inputs"].iterdir())


def test_coreutils_sha256sum_checks_the_whole_corpus(reference):
    done = subprocess.run(["sha256sum", "-c", SUMS], cwd=reference["root"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = {line.rsplit(": ", 1)[0] for line in done.stdout.splitlines() if line.endswith(": OK")}
    assert checked == set(tree_bytes(reference["root"])) - {MANIFEST, SUMS}


def test_bos_is_prepended_with_the_flag(tmp_path, tiny_tokenizer):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in make_texts(30, 11)])
    shard_subset([inputs], subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c", workers=1, add_bos=True)
    corpus = load_corpus(tmp_path / "c")
    assert corpus.manifest.tokenizer.add_bos and corpus.manifest.tokenizer.bos_id == BOS
    tok = load_tokenizer(str(tiny_tokenizer))
    docs = pq.read_table(tmp_path / "c" / corpus.shards[0].path).column("tokens").to_pylist()
    assert [tok.tokenizer.decode(d[1:-1]) for d in docs] == make_texts(30, 11)
    assert all(d[0] == BOS and d[-1] == EOS for d in docs)


# --- re-runs, other subsets, conflicts -------------------------------------------------------------------


def test_rerunning_a_complete_subset_with_the_same_inputs_changes_nothing(reference, tmp_path):
    root = _copy(reference, tmp_path)
    before = tree_bytes(root)
    report = shard_subset([reference["inputs"]], subset=SUBSET, tokenizer=str(reference["tokenizer"]), out=root,
                          shard_tokens=SHARD_TOKENS, license="CC0-1.0")
    assert report.unchanged and report.docs == len(reference["expected"])
    assert tree_bytes(root) == before


def test_a_subset_given_other_inputs_or_settings_is_refused_untouched(reference, tmp_path):
    root = _copy(reference, tmp_path)
    before = tree_bytes(root)
    changed = tmp_path / "inputs"
    shutil.copytree(reference["inputs"], changed)
    write_jsonl(changed / "f05.jsonl", [{"text": "one changed file"}])
    tok = str(reference["tokenizer"])
    with pytest.raises(CorpusConflictError, match="different inputs"):
        shard_subset([changed], subset=SUBSET, tokenizer=tok, out=root, shard_tokens=SHARD_TOKENS)
    with pytest.raises(CorpusConflictError, match="different shard_tokens"):
        shard_subset([reference["inputs"]], subset=SUBSET, tokenizer=tok, out=root, shard_tokens=SHARD_TOKENS * 2)
    with pytest.raises(CorpusConflictError, match="name"):
        shard_subset([changed], subset="other", tokenizer=tok, out=root, name="renamed")
    assert tree_bytes(root) == before


def test_another_tokenizer_or_framing_is_refused_and_a_matching_subset_joins(reference, tmp_path):
    root = _copy(reference, tmp_path)
    before = tree_bytes(root)
    inputs = write_jsonl(tmp_path / "more.jsonl", [{"text": t} for t in make_texts(40, 21)])
    other = train_tiny(tmp_path / "other-bpe", vocab_size=350)
    with pytest.raises(TokenizerMismatchError, match="tiny-bpe"):
        shard_subset([inputs], subset="more/b", tokenizer=str(other), out=root)
    with pytest.raises(TokenizerMismatchError, match="bos on"):
        shard_subset([inputs], subset="more/b", tokenizer=str(reference["tokenizer"]), out=root, add_bos=True)
    assert tree_bytes(root) == before

    report = shard_subset([inputs], subset="more/b", tokenizer=str(reference["tokenizer"]), out=root, workers=1)
    corpus = load_corpus(root)
    assert sorted(corpus.manifest.subsets) == ["more/b", SUBSET]
    assert corpus.manifest.subsets["more/b"].docs == report.docs == 40
    assert {p: b for p, b in tree_bytes(root).items() if SUBSET in p} == \
        {p: b for p, b in before.items() if SUBSET in p}  # the first subset's shards are untouched
    assert subprocess.run(["sha256sum", "-c", "--quiet", SUMS], cwd=root).returncode == 0


def test_a_directory_that_is_not_a_corpus_is_refused(tmp_path, tiny_tokenizer):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    with pytest.raises(CorpusConflictError, match="not a marin corpus"):
        shard_subset([inputs], subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c")
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name != ".marin.lock"] == ["notes.txt"]


# --- bad input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content,where,code", [
    (b'{"text": "fine"}\n{"text": "unterminated\n', "bad.jsonl:2:", 3),
    (b'{"text": "fine"}\n{"text": "fine"}\n{"body": "no text"}\n', "bad.jsonl:3:", 3),
    (b'{"text": "caf\xe9"}\n', "bad.jsonl:1:", 3),
])
def test_bad_records_stop_the_cli_naming_file_and_line(tmp_path, tiny_tokenizer, content, where, code):
    (tmp_path / "bad.jsonl").write_bytes(content)
    done = run_cli("shard", tmp_path / "bad.jsonl", "--subset", "s", "--tokenizer", tiny_tokenizer,
                   "--out", tmp_path / "c", "--workers", "1")
    assert done.returncode == code, done.stderr
    assert where in done.stderr and "--skip-bad" in done.stderr
    assert not (tmp_path / "c" / MANIFEST).exists()


def test_a_truncated_input_stops_the_cli_naming_the_file(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl.gz", [{"text": t} for t in make_texts(400, 2)], "gzip")
    path.write_bytes(path.read_bytes()[:-100])
    done = run_cli("shard", path, "--subset", "s", "--tokenizer", tiny_tokenizer, "--out", tmp_path / "c",
                   "--workers", "1", "--skip-bad")
    assert done.returncode == 3, done.stderr
    assert f"{path}: corrupt or truncated" in done.stderr


def test_skip_bad_counts_by_reason_and_a_retry_reuses_the_good_files(tmp_path, tiny_tokenizer):
    good = [write_jsonl(tmp_path / "in" / f"good{i}.jsonl", [{"text": t} for t in make_texts(20, i)]) for i in (1, 2)]
    (tmp_path / "in" / "mixed.jsonl").write_bytes(
        b'{"text": "a"}\n{oops\n{"text": ""}\n{"no": 1}\n{"text": "\xff"}\n{"text": "b"}\n[]\n')
    args = dict(subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c", workers=2)
    with pytest.raises(BadRecordError) as e:
        shard_subset([tmp_path / "in"], **args)
    assert (Path(e.value.path).name, e.value.line) == ("mixed.jsonl", 2)
    report = shard_subset([tmp_path / "in"], skip_bad=True, **args)
    assert report.skipped == {"bad_json": 2, "empty": 1, "missing_text": 1, "undecodable": 1}
    assert report.examples["bad_json"].startswith(f"{tmp_path / 'in' / 'mixed.jsonl'}:2: ")
    assert report.units_reused == len(good) and report.docs == 42
    assert json.loads((tmp_path / "c" / sources_path("s")).read_bytes())["skipped"] == report.skipped


def test_a_retry_under_another_max_doc_bytes_redoes_only_the_files_it_changes(tmp_path, tiny_tokenizer):
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a-short.jsonl", [{"text": f"short document {i}"} for i in range(20)])
    write_jsonl(inputs / "b-long.jsonl", [{"text": "long " * 60}, {"text": "short"}])
    broken = write_jsonl(inputs / "c-broken.jsonl.gz", [{"text": t} for t in make_texts(400, 2)], "gzip")
    broken.write_bytes(broken.read_bytes()[:-100])  # unreadable: fails the run even with skip_bad
    args = dict(subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c", workers=1, skip_bad=True)
    with pytest.raises(UnreadableInputError):
        shard_subset([inputs], max_doc_bytes=200, **args)  # b-long's first record (~300 bytes) is skipped
    broken.unlink()
    report = shard_subset([inputs], max_doc_bytes=1000, **args)
    # a-short skipped nothing: the higher limit reads it the same. b-long now keeps its long record.
    assert report.units_reused == 1 and report.skipped == {} and report.docs == 22


def test_a_retry_under_a_lower_max_doc_bytes_redoes_every_file(tmp_path, tiny_tokenizer):
    inputs = tmp_path / "in"
    write_jsonl(inputs / "a-long.jsonl", [{"text": "long " * 60}, {"text": "short"}])
    broken = write_jsonl(inputs / "c-broken.jsonl.gz", [{"text": t} for t in make_texts(400, 2)], "gzip")
    broken.write_bytes(broken.read_bytes()[:-100])
    args = dict(subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c", workers=1, skip_bad=True)
    with pytest.raises(UnreadableInputError):
        shard_subset([inputs], max_doc_bytes=1000, **args)
    broken.unlink()
    report = shard_subset([inputs], max_doc_bytes=200, **args)
    assert report.units_reused == 0 and report.skipped == {"too_long": 1} and report.docs == 1


def test_inputs_without_documents_are_refused(tmp_path, tiny_tokenizer):
    inputs = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"text": ""}])
    with pytest.raises(UnreadableInputError, match="no documents"):
        shard_subset([inputs], subset="s", tokenizer=str(tiny_tokenizer), out=tmp_path / "c", workers=1)
    assert not (tmp_path / "c" / MANIFEST).exists()


# --- locking and crashes ----------------------------------------------------------------------------------


def test_a_second_writer_is_refused_with_exit_code_5(tmp_path, tiny_tokenizer):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    with corpus_lock(tmp_path / "c"):  # what a running `marin-data shard` holds
        done = run_cli("shard", inputs, "--subset", "s", "--tokenizer", tiny_tokenizer, "--out", tmp_path / "c")
    assert done.returncode == 5, done.stderr
    assert "another marin-data process is writing this corpus" in done.stderr
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == []  # nothing written, the lock gone with its holder


def _wait_for(predicate, what: str, proc: subprocess.Popen, deadline: float = 60) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (rc {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.mark.parametrize("phase", ["units", "shards"])
def test_a_run_killed_mid_way_resumes_to_the_same_bytes(reference, tmp_path, phase):
    """SIGKILL the whole process group (coordinator and workers) partway, check what a crash leaves, re-run."""
    root = tmp_path / "corpus"
    staging = root / STAGING / urllib.parse.quote(SUBSET, safe="")
    markers = {"units": "units/*.json", "shards": "shards/*/*.json"}[phase]
    args = _shard_args(reference["inputs"], reference["tokenizer"], root, workers=1)
    proc = subprocess.Popen([sys.executable, "-m", "marin_data", "shard", *args], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (staging / "units").exists(), "the run started", proc)
        with pytest.raises(CorpusLockedError):  # a concurrent run on the same corpus is refused
            shard_subset([reference["inputs"]], subset="other", tokenizer=str(reference["tokenizer"]), out=root)
        _wait_for(lambda: any(staging.glob(markers)), f"the first {phase} finished", proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    total = {"units": 10, "shards": reference["reports"][1].shards}[phase]
    assert 0 < len(list(staging.glob(markers))) < total  # the kill landed inside the phase
    assert not (root / MANIFEST).exists()
    for shard in (root / "data").rglob("*.parquet") if (root / "data").exists() else ():
        inspect_shard(shard)  # nothing half-written under a final name

    done = run_cli("shard", *_shard_args(reference["inputs"], reference["tokenizer"], root, workers=2))
    assert done.returncode == 0, done.stderr
    assert "finished by an earlier run" in done.stdout
    assert tree_bytes(root) == tree_bytes(reference["root"])


def test_a_run_that_fails_while_placing_shards_resumes_to_the_same_bytes(reference, tmp_path):
    """Fail the rename of the 4th shard (a directory is in its way): three shards sit under final names,
    no manifest names them; the re-run keeps them (checked by sha256) and finishes identically."""
    root = tmp_path / "corpus"
    blocker = root / "data" / SUBSET / "part-00003.parquet"
    blocker.mkdir(parents=True)
    args = dict(subset=SUBSET, tokenizer=str(reference["tokenizer"]), out=root, shard_tokens=SHARD_TOKENS,
                license="CC0-1.0", workers=2)
    with pytest.raises(OSError):
        shard_subset([reference["inputs"]], **args)
    assert not (root / MANIFEST).exists()
    placed = sorted(p.name for p in blocker.parent.glob("part-*.parquet") if p.is_file())
    assert placed == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    blocker.rmdir()
    report = shard_subset([reference["inputs"]], **args)
    assert report.units_reused == 10
    assert tree_bytes(root) == tree_bytes(reference["root"])


def test_cli_prints_a_summary_table(reference, tmp_path):
    root = _copy(reference, tmp_path)
    done = run_cli("shard", *_shard_args(reference["inputs"], reference["tokenizer"], root, workers=1))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "already complete" in lines[0]
    row = next(line.split() for line in lines if line.startswith(SUBSET))
    corpus = load_corpus(root)
    info = corpus.manifest.subsets[SUBSET]
    assert row[1:4] == [f"{info.docs:,}", f"{info.tokens:,}", f"{info.shards:,}"]
    assert "skipped 1 empty" in done.stdout and corpus.manifest_sha256 in done.stdout
