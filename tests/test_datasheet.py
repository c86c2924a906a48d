"""`marin-data datasheet`: every number is the corpus's, answers are never invented, outputs are stable.

The corpora are real (written by `make_corpus` with the shard and manifest code); the checks read the
outputs back with the tools users will use: Markdown tables parsed back, `huggingface_hub.DatasetCard`,
`datasets`, `mlcroissant`, Pillow, `sha256sum`, and the commands the datasheet prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from marin_data.cli import main
from marin_data.corpus.commit import commit_corpus
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.mirrors import record_mirrors
from marin_data.corpus.shard import read_shard, write_shard
from marin_data.docs.questions import QUESTIONS, SUBSET_QUESTIONS, not_answered
from marin_data.docs.stats import PERCENTILES, nearest_rank
from marin_data.formats.datasheet import write_datasheet
from marin_data.errors import DatasheetIncompleteError, InvalidMetadataError, ShardFormatError
from marin_data.layout import CARD, CROISSANT, DATASHEET, FIGURES, LISTED, MANIFEST, UNLISTED

SUBSETS = {"a": [20, 10], "b/c": [5], "web/en": [40, 25, 30]}


# --- helpers ------------------------------------------------------------------------------------------
def answers_for(subsets, *, skip: tuple[str, ...] = ()) -> dict:
    """A metadata document answering every question (each answer names its id, so tests can find it)."""
    doc: dict = {"pretty_name": "Test corpus", "subsets": {}}
    for q in QUESTIONS:
        value = {"url": "https://example.org/corpus", "date": "2025-01-31"}.get(q.kind, f"Answer to {q.id}.")
        if q.id not in skip:
            doc.setdefault(q.section, {})[q.leaf] = value
    for s in subsets:
        doc["subsets"][s] = {q.leaf: f"Answer to subsets.{s}.{q.leaf}." for q in SUBSET_QUESTIONS
                             if f"subsets.{s}.{q.leaf}" not in skip}
    return doc


def write_meta(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def md_tables(text: str) -> dict[tuple[str, ...], list[list[str]]]:
    """Markdown tables by header row -> body rows of cells."""
    tables, block = {}, []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip("|").split(" | ")])
        elif block:
            tables[tuple(block[0])] = block[2:]
            block = []
    return tables


def num(cell: str) -> int:
    return int(cell.replace(",", ""))


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def stated_digest(text: str) -> str:
    return re.search(r"`manifest.json` has sha256 \*\*`([0-9a-f]{64})`\*\*", text).group(1)


def doc_lengths(root: Path, shards) -> np.ndarray:
    return np.concatenate([np.diff(read_shard(root / s.path)[2]) for s in shards])


@pytest.fixture
def documented(make_corpus, tmp_path):
    """A corpus documented in place with every question answered: (corpus, result, datasheet text)."""
    corpus = make_corpus(SUBSETS)
    meta = write_meta(tmp_path / "meta.yaml", answers_for(SUBSETS))
    result = write_datasheet(corpus.root, meta=meta)
    return load_corpus(corpus.root), result, (corpus.root / DATASHEET).read_text()


# --- the datasheet: numbers ---------------------------------------------------------------------------
def test_every_number_in_the_subset_table_equals_the_manifest(documented):
    corpus, _, text = documented
    rows = md_tables(text)[("Subset", "Documents", "Tokens", "Bytes", "Shards", "Token share", "License")]
    total_tokens = sum(i.tokens for i in corpus.manifest.subsets.values())
    body, total = rows[:-1], rows[-1]
    assert [r[0].strip("`") for r in body] == sorted(corpus.manifest.subsets)
    for name, docs, tokens, nbytes, shards, share, license_ in body:
        info = corpus.manifest.subsets[name.strip("`")]
        assert (num(docs), num(tokens), num(nbytes), num(shards)) == (info.docs, info.tokens, info.bytes, info.shards)
        assert share == f"{100 * info.tokens / total_tokens:.2f}%" and license_ == info.license
    assert total[0] == "**Total**"
    assert [num(c) for c in total[1:5]] == [sum(getattr(i, f) for i in corpus.manifest.subsets.values())
                                            for f in ("docs", "tokens", "bytes", "shards")]


def test_the_headline_and_the_tokenizer_table_equal_the_manifest(documented):
    corpus, _, text = documented
    m, subsets = corpus.manifest, corpus.manifest.subsets.values()
    head = re.search(r"Corpus `(.+)` version `(.+)`: ([\d,]+) subsets, ([\d,]+) documents, ([\d,]+) tokens, "
                     r"([\d,]+) bytes \(.+\) in ([\d,]+) shards\. Manifest sha256 `([0-9a-f]{64})`", text)
    assert head.groups()[:2] == (m.name, m.version)
    assert [num(g) for g in head.groups()[2:7]] == [len(m.subsets), *(sum(getattr(i, f) for i in subsets)
                                                                      for f in ("docs", "tokens", "bytes", "shards"))]
    assert head.group(8) == hashlib.sha256((corpus.root / MANIFEST).read_bytes()).hexdigest()
    rows = dict(md_tables(text)[("Tokenizer", "Value")])
    tok = m.tokenizer
    assert rows["Name"] == f"`{tok.name}`"
    assert rows["Fingerprint (sha256 of `tokenizer.json`)"] == f"`{tok.sha256}`"
    assert tok.sha256 == hashlib.sha256((corpus.root / "tokenizer.json").read_bytes()).hexdigest()
    assert num(rows["Vocabulary size"]) == tok.vocab_size
    assert rows["EOS id (appended to every document)"] == f"`{tok.eos_id}`"
    assert rows["BOS"] == (f"`{tok.bos_id}`, prepended to every document" if tok.add_bos else "not added")


def test_document_length_percentiles_equal_numpy_over_the_shards(documented):
    corpus, _, text = documented
    rows = md_tables(text)[("Subset", "Documents scanned", *(f"p{p}" for p in PERCENTILES), "max", "mean", "Scope")]
    assert len(rows) == len(SUBSETS)
    for row in rows:
        name = row[0].strip("`")
        info = corpus.manifest.subsets[name]
        lengths = doc_lengths(corpus.root, corpus.shards_of([name]))
        assert num(row[1]) == len(lengths) == info.docs and lengths.sum() == info.tokens
        for p, cell in zip(PERCENTILES, row[2:5]):
            assert num(cell) == int(np.percentile(lengths, p, method="inverted_cdf")), (name, p)
        assert num(row[5]) == lengths.max()
        assert row[6] == f"{info.tokens / info.docs:,.1f}" and row[7] == "all shards"


@pytest.mark.parametrize("p", [0.1, 1, 50, 90, 99, 99.9, 100])
def test_nearest_rank_matches_numpy_inverted_cdf(p):
    values = np.random.default_rng(7).integers(1, 50, size=999)
    lengths, counts = np.unique(values, return_counts=True)
    assert nearest_rank(lengths, counts, p) == int(np.percentile(values, p, method="inverted_cdf"))


def test_large_subsets_are_measured_on_spread_shards_and_labelled(make_corpus, tmp_path):
    corpus = make_corpus({"big": [30] * 8, "small": [10]})
    budget = corpus.manifest.subsets["big"].tokens // 3
    write_datasheet(corpus.root, out=tmp_path / "out", scan_tokens=budget)
    text = (tmp_path / "out" / DATASHEET).read_text()
    rows = {r[0].strip("`"): r for r in md_tables(text)[("Subset", "Documents scanned", *(f"p{p}" for p in PERCENTILES),
                                                            "max", "mean", "Scope")]}
    scope = re.fullmatch(r"sample: (\d+) of 8 shards", rows["big"][7])
    assert scope and 1 < int(scope.group(1)) < 8 and rows["small"][7] == "all shards"
    assert "estimates from the documents scanned" in text
    # the stated figures are exactly those of the shards scanned (whole shards, spread over the subset)
    assert num(rows["big"][1]) == 30 * int(scope.group(1))


def planted_corpus(root: Path) -> Path:
    """Subsets a (2 shards), b, c and d with duplicates planted within and across subsets.

    Text X occurs twice in a's first shard and once in its second; Y once in a and twice in b; Z once in b
    and once in c; Z with one more token (a longer document that contains it) in d. Every other document
    is unique.
    """
    from conftest import EOS, VOCAB, build_corpus

    corpus = build_corpus(root, {"a": [6, 6], "b": [6], "c": [6], "d": [6]}, doc_tokens=(3, 40))
    x, y, z = [1, 2, 3, 4, 5], [7, 8, 9], [11, 12, 13, 14]
    planted = {("a", 0): [x, x], ("a", 1): [x, y], ("b", 0): [y, y, z], ("c", 0): [z], ("d", 0): [z + [15]]}
    records = []
    for shard in corpus.shards:
        ids, tokens, offsets = read_shard(root / shard.path)
        docs = [tokens[a:b - 1].tolist() for a, b in zip(offsets, offsets[1:])]
        for n, doc in enumerate(planted.get((shard.subset, int(shard.path[-13:-8])), [])):
            docs[2 * n + 1] = doc  # every other slot, so copies are never adjacent in a shard
        offsets = np.cumsum([0] + [len(d) + 1 for d in docs]).astype(np.int64)
        tokens = np.concatenate([np.array(d + [EOS], np.uint32) for d in docs])
        assert tokens.max() < VOCAB
        st = write_shard(root / shard.path, ids, tokens, offsets, corpus.manifest.tokenizer)
        records.append(shard._replace(bytes=st.bytes, sha256=st.sha256, tokens=st.tokens))
    commit_corpus(root, corpus.manifest, records)
    return root


def brute_force_duplicates(corpus) -> tuple[dict, dict]:
    """Within: {subset: (copies, tokens)}; across: {(a, b): (docs of a also in b, their tokens)}."""
    where: dict[bytes, dict[str, int]] = {}
    for shard in corpus.shards:
        _, tokens, offsets = read_shard(corpus.root / shard.path)
        for a, b in zip(offsets, offsets[1:]):
            counts = where.setdefault(tokens[a:b].tobytes(), {})
            counts[shard.subset] = counts.get(shard.subset, 0) + 1
    within = {s: (0, 0) for s in corpus.manifest.subsets}
    across: dict[tuple[str, str], tuple[int, int]] = {}
    for text, counts in where.items():
        n = len(text) // 4
        for s, c in counts.items():
            within[s] = (within[s][0] + c - 1, within[s][1] + (c - 1) * n)
            for t in counts:
                if t != s:
                    d, k = across.get((s, t), (0, 0))
                    across[(s, t)] = (d + c, k + c * n)
    return within, across


@pytest.mark.parametrize("bucket_rows", [3, 1 << 22])
def test_exact_duplicates_within_and_across_subsets(tmp_path, monkeypatch, bucket_rows):
    import marin_data.docs.stats as stats

    monkeypatch.setattr(stats, "BUCKET_ROWS", bucket_rows)  # 3: the 30 documents spill into 10 buckets
    corpus = load_corpus(planted_corpus(tmp_path / "corpus"))
    within, across = brute_force_duplicates(corpus)
    assert within["a"] == (2, 12) and within["b"] == (1, 4) and within["c"] == within["d"] == (0, 0)
    assert across == {("a", "b"): (1, 4), ("b", "a"): (2, 8), ("b", "c"): (1, 5), ("c", "b"): (1, 5)}
    write_datasheet(corpus.root, out=tmp_path / "out")
    text = (tmp_path / "out" / DATASHEET).read_text()
    tokens = {name: info.tokens for name, info in corpus.manifest.subsets.items()}
    rows = md_tables(text)[("Subset", "Documents scanned", "Copies", "Tokens in copies", "Share of scanned tokens")]
    assert {r[0].strip("`"): (num(r[2]), num(r[3]), r[4]) for r in rows} == {
        s: (d, k, f"{100 * k / tokens[s]:.2f}%") for s, (d, k) in within.items()}
    rows = md_tables(text)[("Subset A", "Subset B", "Documents of A also in B", "Share of A's tokens",
                            "Documents of B also in A", "Share of B's tokens")]
    assert [(r[0].strip("`"), r[1].strip("`")) for r in rows] == [("a", "b"), ("b", "c")]  # d contains Z: no copy
    for r in rows:
        a, b = r[0].strip("`"), r[1].strip("`")
        assert (num(r[2]), r[3]) == (across[(a, b)][0], f"{100 * across[(a, b)][1] / tokens[a]:.2f}%")
        assert (num(r[4]), r[5]) == (across[(b, a)][0], f"{100 * across[(b, a)][1] / tokens[b]:.2f}%")


def test_a_corpus_without_duplicates_says_so(documented):
    _, _, text = documented
    rows = md_tables(text)[("Subset", "Documents scanned", "Copies", "Tokens in copies", "Share of scanned tokens")]
    assert [(r[2], r[3]) for r in rows] == [("0", "0")] * len(SUBSETS)
    assert "No two subsets share a document." in text


# --- the datasheet: answers and --strict ----------------------------------------------------------
def test_every_question_appears_once_with_its_answer(documented):
    _, result, text = documented
    assert result.unanswered == () and "Every question is answered." in text
    for qid in [q.id for q in QUESTIONS if q.kind == "text"] + [f"subsets.{s}.{q.leaf}" for s in SUBSETS
                                                                  for q in SUBSET_QUESTIONS]:
        assert text.count(f"Answer to {qid}.") == 1, qid
    assert "Not answered" not in text
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## 1. Motivation", "## 2. Composition", "## 3. Collection process",
        "## 4. Preprocessing, cleaning and labeling", "## 5. Uses", "## 6. Distribution", "## 7. Maintenance",
        "## Unanswered questions"]


def test_a_missing_answer_is_shown_not_invented(make_corpus, tmp_path):
    corpus = make_corpus(SUBSETS)
    meta = write_meta(tmp_path / "meta.yaml", answers_for(SUBSETS, skip=("uses.out_of_scope", "subsets.b/c.sources")))
    result = write_datasheet(corpus.root, meta=meta, out=tmp_path / "out")
    text = (tmp_path / "out" / DATASHEET).read_text()
    assert result.unanswered == ("uses.out_of_scope", "subsets.b/c.sources")
    assert not_answered("uses.out_of_scope") == "**Not answered.** (question id `uses.out_of_scope`)"
    for qid in result.unanswered:
        assert text.count(not_answered(qid)) == 1 and f"- `{qid}`" in text


def test_strict_fails_listing_the_unanswered_questions_and_writes_nothing(make_corpus, tmp_path, capsys):
    corpus = make_corpus(SUBSETS)
    meta = write_meta(tmp_path / "meta.yaml", answers_for(SUBSETS, skip=("uses.out_of_scope",)))
    before = snapshot(corpus.root)
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(corpus.root), "--meta", str(meta), "--strict"])
    assert e.value.code == 11
    err = capsys.readouterr().err
    assert ("1 datasheet question unanswered; the metadata file needs these keys:\n"
            "    uses:\n      out_of_scope:  # text") in err
    assert "--meta-template" in err
    assert snapshot(corpus.root) == before
    with pytest.raises(DatasheetIncompleteError) as info:
        write_datasheet(corpus.root, strict=True)  # no metadata at all: every question is missing
    assert len(info.value.missing) == len(QUESTIONS) + len(SUBSET_QUESTIONS) * len(SUBSETS)
    write_meta(meta, answers_for(SUBSETS))
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(corpus.root), "--meta", str(meta), "--strict"])
    assert e.value.code == 0


def test_the_meta_template_filled_in_mechanically_passes_strict(make_corpus, tmp_path, capsys):
    corpus = make_corpus({"a": [5], "b/c": [4], "2024": [3]})  # "2024" would read as a number unquoted
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(corpus.root), "--meta-template"])
    template = capsys.readouterr().out
    assert e.value.code == 0 and not (corpus.root / DATASHEET).exists()  # nothing written
    filled, question = [], None
    for line in template.splitlines():
        if m := re.fullmatch(r"\s*# (\S+) \((\w+)\): .+", line):
            question = m.groups()
        elif question and line.endswith(":"):  # the key under its question: answer it by its kind
            qid, kind = question
            line += " " + {"url": "https://example.org/c", "date": "2025-01-31"}.get(kind, json.dumps(f"About {qid}."))
            question = None
        filled.append(line)
    ids = [q.id for q in QUESTIONS] + [q.for_subset(s).id for s in ("2024", "a", "b/c") for q in SUBSET_QUESTIONS]
    assert all(f"# {qid} (" in template for qid in ids)
    meta = tmp_path / "meta.yaml"
    meta.write_text("\n".join(filled))
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(corpus.root), "--meta", str(meta), "--strict"])
    assert e.value.code == 0, capsys.readouterr().err
    text = (corpus.root / DATASHEET).read_text()
    assert "About subsets.2024.sources." in text and "Not answered" not in text


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["uses"].update(intendd="x"), "unknown key(s) intendd in uses"),
    (lambda d: d.update(motivaton={}), "unknown key(s) motivaton"),
    (lambda d: d["subsets"].update({"nope": {}}), "unknown key(s) nope in subsets"),
    (lambda d: d["distribution"].update(date_published="last year"), "expected a date YYYY-MM-DD"),
    (lambda d: d["distribution"].update(homepage="example.org"), "expected one http(s) URL"),
    (lambda d: d["uses"].update(intended={"a": 1}), "expected text or a list of text"),
])
def test_metadata_mistakes_are_errors_naming_the_key(make_corpus, tmp_path, capsys, edit, message):
    corpus = make_corpus({"a": [3], "b/c": [2], "web/en": [2]})
    doc = answers_for(SUBSETS)
    edit(doc)
    meta = write_meta(tmp_path / "meta.yaml", doc)
    with pytest.raises(InvalidMetadataError, match=re.escape(message)):
        write_datasheet(corpus.root, meta=meta)
    with pytest.raises(SystemExit) as e:
        main(["datasheet", str(corpus.root), "--meta", str(meta)])
    assert e.value.code == 2 and "meta.yaml" in capsys.readouterr().err


# --- the root of trust and the files the manifest lists -----------------------------------------------
def test_the_stated_digest_is_the_manifest_on_disk_and_covers_the_generated_files(documented):
    corpus, result, text = documented
    digest = stated_digest(text)
    assert digest == result.manifest_sha256 == hashlib.sha256((corpus.root / MANIFEST).read_bytes()).hexdigest()
    assert f"Manifest sha256 `{digest}`" in text
    load_corpus(corpus.root, manifest_sha256=digest)  # the pinned digest opens the corpus
    assert set(LISTED) <= set(corpus.manifest.files) and not set(UNLISTED) & set(corpus.manifest.files)
    sums = (corpus.root / "SHA256SUMS").read_text()
    assert all(f"  {rel}\n" in sums for rel in LISTED) and DATASHEET not in sums
    out = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=corpus.root, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{CARD}: OK" in out.stdout and f"{FIGURES[0]}: OK" in out.stdout


def test_the_printed_download_and_verify_commands_work(documented, tmp_path, capsys):
    corpus, _, text = documented
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    downloads = [shlex.split(line) for b in blocks for line in b.splitlines() if line.startswith("marin-data download")]
    assert [d[d.index("--subset") + 1] for d in downloads] == sorted(SUBSETS)
    argv = downloads[1][1:]  # b/c, from "SOURCE": no mirror is recorded
    assert argv[1] == "SOURCE" and "No mirror is recorded yet" in text
    dest = tmp_path / "copy"
    argv[1], argv[argv.index("--to") + 1] = str(corpus.root), str(dest)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0, capsys.readouterr()
    verify = next(shlex.split(line) for b in blocks for line in b.splitlines() if line.startswith("marin-data verify"))
    verify[2] = str(dest)
    with pytest.raises(SystemExit) as e:
        main(["verify", *verify[2:], "--subset", "b/c"])
    assert e.value.code == 0, capsys.readouterr()


def test_recorded_mirrors_are_shown_with_their_commands(make_corpus, tmp_path):
    corpus = make_corpus(SUBSETS)
    record_mirrors(corpus.root, [
        {"url": "s3://bucket/marin", "endpoint_url": "http://127.0.0.1:9000", "subsets": ["a", "web/en"]},
        {"url": "s3://other/marin"},  # no subsets list: holds every subset
        {"url": "hf://datasets/team/marin", "endpoint": "http://127.0.0.1:8080", "subsets": ["b/c"]},
    ])
    digest = corpus.manifest_sha256  # recording mirrors leaves the manifest alone
    assert load_corpus(corpus.root).manifest_sha256 == digest
    write_datasheet(corpus.root, out=tmp_path / "out")
    text = (tmp_path / "out" / DATASHEET).read_text()
    assert md_tables(text)[("URL", "Endpoint", "Subsets")] == [
        ["`hf://datasets/team/marin`", "`http://127.0.0.1:8080`", "`b/c`"],
        ["`s3://bucket/marin`", "`http://127.0.0.1:9000`", "`a`, `web/en`"], ["`s3://other/marin`", "default", "all"]]
    assert (f"marin-data download s3://bucket/marin --endpoint-url http://127.0.0.1:9000 --subset a "
            f"--to ./synthetic --manifest-sha256 {digest}") in text
    assert f"marin-data download s3://other/marin --subset b/c --to ./synthetic --manifest-sha256 {digest}" in text
    assert (f"marin-data download hf://datasets/team/marin --endpoint http://127.0.0.1:8080 --subset b/c "
            f"--to ./synthetic --manifest-sha256 {digest}") in text
    assert "s3://bucket/marin --endpoint-url http://127.0.0.1:9000 --subset b/c" not in text
    assert "SOURCE" not in text


def test_verify_passes_on_a_documented_corpus(documented):
    from marin_data.corpus.verify import verify_corpus

    corpus, result, _ = documented
    report = verify_corpus(corpus.root, manifest_sha256=result.manifest_sha256)
    assert report.ok, report.problems


# --- determinism ------------------------------------------------------------------------------------
def test_rerunning_changes_nothing(documented, tmp_path):
    corpus, result, _ = documented
    before = snapshot(corpus.root)
    again = write_datasheet(corpus.root, meta=tmp_path / "meta.yaml")
    assert again.written == () and set(again.unchanged) == {*LISTED, DATASHEET}
    assert again.manifest_sha256 == result.manifest_sha256
    assert snapshot(corpus.root) == before  # bytes and mtimes


def test_the_same_corpus_gives_byte_identical_outputs_from_a_fresh_process(make_corpus, tmp_path):
    one, two = make_corpus(SUBSETS, seed=3), make_corpus(SUBSETS, seed=3)
    meta = write_meta(tmp_path / "meta.yaml", answers_for(SUBSETS))
    write_datasheet(one.root, meta=meta)
    subprocess.run([sys.executable, "-m", "marin_data", "datasheet", str(two.root), "--meta", str(meta)], check=True,
                   capture_output=True)
    for rel in (*LISTED, DATASHEET, MANIFEST, "SHA256SUMS"):
        assert (one.root / rel).read_bytes() == (two.root / rel).read_bytes(), rel


def test_out_dir_leaves_the_corpus_untouched_and_states_its_current_digest(make_corpus, tmp_path):
    corpus = make_corpus(SUBSETS)
    before = snapshot(corpus.root)
    result = write_datasheet(corpus.root, out=tmp_path / "out")
    assert snapshot(corpus.root) == before and not result.in_corpus
    text = (tmp_path / "out" / DATASHEET).read_text()
    assert stated_digest(text) == corpus.manifest_sha256
    assert "generated outside the corpus (`--out`)" in text
    assert sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file()) == \
        sorted([*LISTED, DATASHEET])


# --- the dataset card -------------------------------------------------------------------------------
def test_card_parses_and_has_one_config_per_subset(documented):
    from huggingface_hub import DatasetCard

    corpus, _, _ = documented
    card = DatasetCard.load(corpus.root / CARD)
    data = card.data.to_dict()
    assert data["license"] == "cc0-1.0" and data["pretty_name"] == "Test corpus"
    assert data["size_categories"] == ["n<1K"]
    configs = {c["config_name"]: c["data_files"] for c in data["configs"]}
    assert configs.pop("all") == [{"split": "train", "path": [f"data/{n}/*.parquet" for n in sorted(SUBSETS)]}]
    assert [c["config_name"] for c in data["configs"] if c.get("default")] == ["all"]
    assert configs == {n.replace("/", "--"): [{"split": "train", "path": f"data/{n}/*.parquet"}] for n in SUBSETS}
    for name, files in configs.items():  # each glob selects exactly that subset's shards
        subset = name.replace("--", "/")
        globbed = sorted(str(p.relative_to(corpus.root)) for p in corpus.root.glob(files[0]["path"]))
        assert globbed == sorted(s.path for s in corpus.shards_of([subset]))
    info = {i["config_name"]: i for i in data["dataset_info"]}
    for name, subset in corpus.manifest.subsets.items():
        entry = info[name.replace("/", "--")]
        assert entry["splits"][0]["num_examples"] == subset.docs and entry["download_size"] == subset.bytes
    assert "Answer to motivation.summary." in card.text


def test_datasets_reads_a_subset_through_the_card(documented, tmp_path):
    import datasets  # a dev dependency: missing, the test fails rather than skips
    corpus, _, _ = documented
    ds = datasets.load_dataset(str(corpus.root), "b--c", split="train", cache_dir=str(tmp_path / "hf"))
    ids, tokens, _ = read_shard(corpus.root / corpus.shards_of(["b/c"])[0].path)
    assert ds["id"] == ids and np.concatenate([np.asarray(t) for t in ds["tokens"]]).tolist() == tokens.tolist()
    builder = datasets.load_dataset_builder(str(corpus.root), "web--en", cache_dir=str(tmp_path / "hf"))
    assert builder.info.splits["train"].num_examples == corpus.manifest.subsets["web/en"].docs


def test_datasets_loads_every_subset_by_repo_name_through_the_mirror(documented, tmp_path):
    import shutil

    from huggingface_hub import HfApi

    from marin_data.testing.mirror import running_mirror

    corpus, _, _ = documented
    shutil.copytree(corpus.root, tmp_path / "hub/team/doc")
    code = ("import datasets\n"
            f"ds = datasets.load_dataset('team/doc', split='train', cache_dir={str(tmp_path / 'ds')!r})\n"
            "print(ds.num_rows)\n")
    with running_mirror(tmp_path / "hub") as mirror:
        card = HfApi(endpoint=mirror.url).dataset_info("team/doc").card_data.to_dict()
        env = dict(os.environ, HF_ENDPOINT=mirror.url, HF_HOME=str(tmp_path / "hf_home"),
                   HF_HUB_DISABLE_PROGRESS_BARS="1")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert card["configs"][0]["config_name"] == "all"  # cardData, as the Hub answers it
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) == sum(s.docs for s in corpus.manifest.subsets.values())


@pytest.mark.parametrize("spdx, hub", [("CC-BY-4.0", "cc-by-4.0"), ("ODC-By-1.0", "odc-by"), ("PSF-2.0", "other")])
def test_card_license_uses_hub_ids(spdx, hub):
    from marin_data.docs.card import hub_license

    assert hub_license(spdx) == hub


@pytest.mark.parametrize("license_id, link", [
    ("PSF-2.0", "https://spdx.org/licenses/PSF-2.0.html"),
    ("psf-2.0", "https://spdx.org/licenses/PSF-2.0.html"),  # any case: the page has the list's spelling
    ("LicenseRef-Debian-copyright", DATASHEET),  # the corpus's own: SPDX has no page for it
    ("MIT OR PSF-2.0", DATASHEET), ("Not-A-License-1.0", DATASHEET)])
def test_the_card_links_a_license_page_only_for_an_id_on_the_spdx_list(make_corpus, license_id, link):
    from marin_data.docs.card import card_header
    from marin_data.docs.questions import Metadata
    from marin_data.docs.stats import CorpusStats, corpus_stats

    corpus = make_corpus({"a": [3]})
    stats = corpus_stats(corpus)
    stats = CorpusStats.of([replace(s, license=license_id) for s in stats.subsets])  # as the manifest would say
    header = card_header(corpus.manifest, stats, Metadata())
    assert header["license"] == "other" and header["license_link"] == link


# --- Croissant -------------------------------------------------------------------------------------
def test_croissant_validates_and_its_sha256_values_match_the_shards(documented):
    import mlcroissant as mlc  # a dev dependency: missing, the test fails rather than skips
    corpus, _, _ = documented
    path = corpus.root / CROISSANT
    dataset = mlc.Dataset(jsonld=str(path))  # raises ValidationError on any error
    assert dataset.metadata.ctx.issues.warnings == set()
    doc = json.loads(path.read_text())
    files = {d["contentUrl"]: d for d in doc["distribution"] if d["@type"] == "cr:FileObject"}
    assert sorted(files) == sorted(s.path for s in corpus.shards)
    for rel, entry in files.items():
        data = (corpus.root / rel).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["contentSize"] == f"{len(data)} B"
    sets = {d["includes"] for d in doc["distribution"] if d["@type"] == "cr:FileSet"}
    assert sets == {f"data/{n}/*.parquet" for n in SUBSETS}
    assert [r["name"] for r in doc["recordSet"]] == sorted(SUBSETS)
    records = list(dataset.records("b/c"))  # mlcroissant reads the shards through the description
    ids, tokens, offsets = read_shard(corpus.root / corpus.shards_of(["b/c"])[0].path)
    assert [r["b/c/id"].decode() for r in records] == ids
    assert [len(r["b/c/tokens"]) for r in records] == np.diff(offsets).tolist()


# --- figures and robustness -------------------------------------------------------------------------
def test_figures_are_valid_pngs_named_by_the_datasheet(documented):
    from PIL import Image

    corpus, _, text = documented
    for rel in FIGURES:
        path = corpus.root / rel
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as img:
            img.verify()
        with Image.open(path) as img:
            assert img.format == "PNG" and img.width == 800 and img.height > 200
            assert img.text == {"Software": f"matplotlib {__import__('matplotlib').__version__}"}
        assert f"]({Path(rel).name})" in text


def test_a_shard_that_disagrees_with_the_index_is_refused(make_corpus, tmp_path):
    corpus = make_corpus({"a": [5, 7]})
    first, second = (corpus.root / s.path for s in corpus.shards)
    first.write_bytes(second.read_bytes())  # 7 documents where the index says 5
    with pytest.raises(ShardFormatError, match="holds 7 documents"):
        write_datasheet(corpus.root, out=tmp_path / "out")


def test_a_datasheet_that_changes_the_manifest_says_which_pin_it_replaces(make_corpus, capsys):
    """The card, Croissant file and figures join the manifest, so its sha256 changes on the first run: the
    command names the old digest and says that pins of it no longer match; a re-run changes nothing, says
    nothing of it, and the old pin is refused as the warning says."""
    corpus = make_corpus({"a": [20]})
    before = corpus.manifest_sha256
    with pytest.raises(SystemExit) as exit_:
        main(["datasheet", str(corpus.root)])
    out, err = capsys.readouterr()
    after = load_corpus(corpus.root).manifest_sha256
    assert exit_.value.code == 0 and after != before
    assert f"manifest sha256 (stated in the datasheet): {after}" in out
    assert f"sha256 changed from {before}" in err and "pin the new one" in err
    with pytest.raises(SystemExit):
        main(["datasheet", str(corpus.root)])
    out, err = capsys.readouterr()
    assert "changed from" not in err and load_corpus(corpus.root).manifest_sha256 == after
    with pytest.raises(SystemExit) as exit_:
        main(["verify", str(corpus.root), "--manifest-sha256", before])
    assert exit_.value.code != 0
