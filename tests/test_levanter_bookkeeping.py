"""A tree of Levanter caches as Marin researchers receive it: fetched with ``hf download --local-dir`` (the Hub
client's ``.cache/huggingface/`` beside the caches), written by Marin's executor (``.executor_info`` and
``.executor_status`` beside each step's output and at the root), a tokenize step's caches in ``train/`` and
``validation/`` below its folder. ``info``, ``verify``, ``download``, ``convert`` and ``adopt`` (then ``verify``
of the pin) read each split as a subset and say once what they skipped; any other stray file is still refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from levanter_env import make_cache, make_store
from shard_env import run_cli, tiny_tokenizer, tree_bytes  # noqa: F401

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.verify import verify_corpus
from marin_data.levanter.detect import detect
from marin_data.levanter.download import download_cache
from marin_data.levanter.to_marin import convert_to_marin

STEP = "tokenized/fineweb-edu-3c7a2b"  # a tokenize step's output: its caches in train/ and validation/
SPLITS = (f"{STEP}/train", f"{STEP}/validation")
CELLS = ("cluster=0/quality=1", "cluster=1/quality=1")
EXECUTOR = (f"{STEP}/.executor_info", f"{STEP}/.executor_status", ".executor_info", ".executor_status",
            f"{CELLS[0]}/.executor_info")  # beside the splits, at the root, inside a cache's own folder


def hf_local_dir(root: Path) -> None:
    """What ``hf download --local-dir ROOT`` leaves beside the files it fetched (huggingface_hub's
    ``_local_folder``): ``.cache/huggingface/`` with a ``.gitignore``, a ``CACHEDIR.TAG``, and per file a
    ``download/<path>.metadata`` (commit, etag, timestamp) and its ``.lock``."""
    bookkeeping = root / ".cache/huggingface"
    fetched = [p for p in root.rglob("*") if p.is_file()]
    (bookkeeping / "download").mkdir(parents=True)
    (bookkeeping / ".gitignore").write_text("*")
    (bookkeeping / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    for i, path in enumerate(fetched):
        rel = path.relative_to(root).as_posix()
        meta = bookkeeping / "download" / f"{rel}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{'ab' * 20}\n{i:064x}\n1712656091.123\n")
        meta.with_suffix(".lock").write_bytes(b"")


def executor_files(root: Path) -> None:
    """What Marin's executor writes beside each step's output: the step's config and its status."""
    for rel in EXECUTOR:
        body = {"name": rel, "config": {"tokenizer": "tiny"}} if rel.endswith("info") else {"status": "SUCCESS"}
        (root / rel).write_text(json.dumps(body))


@pytest.fixture
def received(tmp_path) -> Path:
    """A store of two cells and one tokenize step's two splits, from the executor, then `hf download`."""
    root = tmp_path / "store"
    make_store(root, dict.fromkeys(CELLS, 30))
    make_cache(root / SPLITS[0], 50, seed=5)
    make_cache(root / SPLITS[1], 20, seed=6)
    executor_files(root)
    hf_local_dir(root)
    return root


def skipped_files(root: Path) -> dict[str, bytes]:
    return {p: b for p, b in tree_bytes(root).items() if p.startswith(".cache/") or p.endswith(EXECUTOR)}


def test_info_reads_each_split_as_a_subset_and_says_what_it_skipped(received):
    out = run_cli("info", received)
    assert out.returncode == 0, out.stderr
    note = [line for line in out.stdout.splitlines() if line.startswith("other tools' bookkeeping")]
    assert note == ["other tools' bookkeeping, not counted: .cache/huggingface/, huggingface_hub's own bookkeeping "
                    "of a `hf download --local-dir` copy; 5 executor files (.executor_info, .executor_status), "
                    "Marin's executor's record of the step that wrote their folder"]
    info = json.loads(run_cli("info", received, "--json").stdout)
    assert sorted(info["subsets"]) == sorted([*CELLS, *SPLITS])
    assert [info["subsets"][s]["docs"] for s in SPLITS] == [50, 20]
    assert info["ignored"] == sorted([".cache/huggingface", *EXECUTOR])
    assert info["subsets"][CELLS[0]]["bytes"] == sum(len(b) for p, b in tree_bytes(received / CELLS[0]).items()
                                                     if p != ".executor_info")  # bookkeeping is not counted
    (received / STEP / "notes.txt").write_text("a genuinely stray file")  # still refused, by name
    (received / ".cache/notes.txt").write_text("only the Hub client's own folder is skipped")
    refused = run_cli("info", received)
    assert refused.returncode == 2 and "2 files lie outside every Levanter cache" in refused.stderr
    assert f"{STEP}/notes.txt" in refused.stderr and ".cache/notes.txt" in refused.stderr


def test_verify_of_the_unpinned_tree_checks_every_split_and_names_the_skipped_once(received):
    out = run_cli("verify", received)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split("  ")[1] for line in lines if line.startswith("ignored")] == [
        ".cache/huggingface/", "5 executor files (.executor_info, .executor_status)"]
    assert lines[-1].startswith("OK: ") and "4 subsets" in lines[-1]
    report = json.loads(run_cli("verify", received, "--json").stdout)
    assert report["ok"] and sorted(report["subsets"]) == sorted([*CELLS, *SPLITS])
    assert report["ignored"] == sorted([".cache/huggingface", *EXECUTOR])
    picked = run_cli("verify", received, "--subset", f"{STEP}/*", "--json")
    assert json.loads(picked.stdout)["subsets"] == list(SPLITS)


def test_adopt_pins_each_split_leaves_the_bookkeeping_alone_and_the_pin_verifies(received, tiny_tokenizer):
    before = skipped_files(received)
    out = run_cli("adopt", received, "--tokenizer", tiny_tokenizer, "--name", "received")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["other tools' bookkeeping, left in place, not pinned: .cache/huggingface/, "
                                       "huggingface_hub's own bookkeeping of a `hf download --local-dir` copy; 5 "
                                       "executor files (.executor_info, .executor_status), Marin's executor's "
                                       "record of the step that wrote their folder"]
    corpus = load_corpus(received)
    assert sorted(corpus.manifest.subsets) == sorted([*CELLS, *SPLITS])
    assert [corpus.manifest.subsets[s].docs for s in SPLITS] == [50, 20]
    pinned = {s.path for s in corpus.shards}
    assert not [p for p in pinned if p.startswith(".cache/") or p.endswith(EXECUTOR)]  # neither hashed nor listed
    assert skipped_files(received) == before  # and left in place
    verified = run_cli("verify", received)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    lines = verified.stdout.splitlines()
    assert "unlisted" not in verified.stdout and lines[-1].startswith("OK: ") and "manifest sha256" in lines[-1]
    assert [line.split("  ")[1] for line in lines if line.startswith("ignored")] == [
        ".cache/huggingface/", "5 executor files (.executor_info, .executor_status)"]
    (received / STEP / "notes.txt").write_text("not listed")  # any other file is still a finding
    assert [p.path for p in verify_corpus(received, progress=False).problems] == [f"{STEP}/notes.txt"]


def test_a_single_cache_fetched_by_the_hub_client_is_pinned_without_its_bookkeeping(tmp_path, tiny_tokenizer):
    cache = tmp_path / "train"
    make_cache(cache, 40)
    (cache / ".executor_info").write_text("{}")
    hf_local_dir(cache)
    out = run_cli("adopt", cache, "--tokenizer", tiny_tokenizer)
    assert out.returncode == 0, out.stderr
    assert not [s.path for s in load_corpus(cache).shards if s.path.startswith(".cache/") or "executor" in s.path]
    assert "left in place, not pinned: .cache/huggingface/" in out.stderr and "1 executor file (" in out.stderr
    assert verify_corpus(cache, progress=False).ok


def test_download_and_convert_read_the_splits_and_skip_the_bookkeeping(received, tiny_tokenizer, tmp_path):
    done = download_cache(detect(received), subsets=[f"{STEP}/*", CELLS[0]], dest=tmp_path / "copy",
                          progress=False)
    assert done.ok and done.checks is not None and done.checks.ok
    copied = set(tree_bytes(tmp_path / "copy"))
    assert {p.split("/input_ids")[0] for p in copied if "/input_ids/" in p} == {*SPLITS, CELLS[0]}
    assert not [p for p in copied if p.startswith(".cache/") or p.endswith(EXECUTOR)]
    report = convert_to_marin(received, dest=tmp_path / "corpus", tokenizer=str(tiny_tokenizer),
                              subsets=[f"{STEP}/*"])
    assert sorted(report.subsets) == list(SPLITS)
    assert verify_corpus(tmp_path / "corpus", progress=False).ok


def test_an_executor_file_beside_a_parquet_corpus_is_skipped_and_named(make_corpus):
    corpus = make_corpus({"a": [50, 30]})
    (corpus.root / ".executor_info").write_text("{}")
    (corpus.root / "data/a/.executor_status").write_text("{}")
    report = verify_corpus(corpus.root, progress=False)
    assert report.ok and report.ignored == (".executor_info", "data/a/.executor_status")
