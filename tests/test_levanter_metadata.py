"""What a corpus says of itself survives the round trips between the formats: the tokenizer's name and
framing a Levanter ledger records (``preprocessor_metadata``: ``tokenizer``, ``append_bos``, ``append_eos``)
reach the manifest ``adopt`` writes and come back out of ``convert --format levanter``; a datasheet's BOS id
agrees with the ledgers; a pinned store converted to marin keeps its name and licenses; ``adopt --meta`` gives
each cell its license and description; and a command given no ``--tokenizer`` for an unpinned cache takes
the one its ledgers name when it is on this machine (a path, or the Hugging Face cache: never the network)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from levanter_env import FIXTURES, VOCAB, make_cache, make_store
from shard_env import make_texts, run_cli, tiny_tokenizer, write_jsonl  # noqa: F401 - tiny_tokenizer is a fixture

from marin_data.corpus.manifest import load_corpus
from marin_data.layout import DATASHEET, TOKENIZER
from marin_data.levanter import detect, open_cache
from marin_data.levanter.adopt import adopt

WORDLEVEL = FIXTURES / "levanter-fixture-wordlevel"
REPO = "marin-test/tiny-bpe"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hf_cache(root: Path, tokenizer: Path) -> dict[str, str]:
    """A Hugging Face cache holding ``REPO``'s tokenizer.json, and the environment that reads only it."""
    repo = root / f"models--{REPO.replace('/', '--')}"
    data = tokenizer.read_bytes()
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True)
    blob.write_bytes(data)
    snapshot = repo / "snapshots" / COMMIT / TOKENIZER
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(Path("..", "..", "blobs", blob.name))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(root), "HF_ENDPOINT": "http://127.0.0.1:9"}


def ledger_metadata(cache: Path) -> dict:
    return open_cache(detect(str(cache)).store).ledger.preprocessor_metadata


# --- adopt: the tokenizer's name and BOS from the ledgers, --tokenizer-name, --meta ---------------------------
def test_adopt_takes_the_tokenizer_name_the_ledgers_agree_on_and_says_so(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", {"a": 20, "b": 30}, tokenizer=REPO)
    done = run_cli("adopt", tmp_path / "store", "--tokenizer", tiny_tokenizer)
    assert done.returncode == 0, done.stderr
    assert f"tokenizer name: {REPO} (from the caches' ledgers)" in done.stdout
    assert load_corpus(tmp_path / "store").manifest.tokenizer.name == REPO

    make_store(tmp_path / "given", {"a": 20}, tokenizer=REPO)
    done = run_cli("adopt", tmp_path / "given", "--tokenizer", tiny_tokenizer, "--tokenizer-name", "org/other")
    assert done.returncode == 0 and "tokenizer name: org/other (given with --tokenizer-name)" in done.stdout
    assert load_corpus(tmp_path / "given").manifest.tokenizer.name == "org/other"

    make_store(tmp_path / "differ", {"a": 20}, tokenizer=REPO)
    make_cache(tmp_path / "differ/b", 10, tokenizer="org/another")  # the ledgers disagree: none is taken
    done = run_cli("adopt", tmp_path / "differ", "--tokenizer", tiny_tokenizer)
    assert done.returncode == 0 and "tokenizer name: tiny-bpe (from the --tokenizer path or repo id)" in done.stdout


def test_adopt_records_the_bos_the_ledgers_say_was_prepended(tmp_path):
    shutil_copy(FIXTURES / "tokenized-int64-lz4", tmp_path / "c")  # append_bos: true, BOS <s> = 1
    adopt(tmp_path / "c", tokenizer=str(WORDLEVEL / TOKENIZER))
    info = load_corpus(tmp_path / "c").manifest.tokenizer
    assert (info.name, info.bos_id, info.add_bos, info.eos_id) == ("levanter-fixture-wordlevel", 1, True, 2)


def test_adopt_meta_gives_each_cell_its_license_and_description(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", {"a": 20, "b": 30})
    meta = tmp_path / "meta.yaml"
    meta.write_text("subsets:\n  a:\n    license: GPL-2.0-or-later\n    description: Code from the kernel.\n"
                    "  b:\n    description: [Prose, from books.]\n")
    done = run_cli("adopt", tmp_path / "store", "--tokenizer", tiny_tokenizer, "--meta", meta, "--license", "odc-by")
    assert done.returncode == 0, done.stderr
    subsets = load_corpus(tmp_path / "store").manifest.subsets
    assert (subsets["a"].license, subsets["b"].license) == ("GPL-2.0-or-later", "odc-by")
    card = (tmp_path / "store/README.md").read_text()
    assert "- `a`: Code from the kernel.\n- `b`: Prose from books.\n" in card
    sets = {d["name"]: d["description"] for d in json.loads((tmp_path / "store/croissant.json").read_text())
            ["distribution"] if d["@type"] == "cr:FileSet"}
    assert sets["files/a"].startswith("Code from the kernel. The Levanter cache of subset a")

    make_store(tmp_path / "bad", {"a": 20})
    meta.write_text("subsets:\n  a:\n    licence: MIT\n")  # a typo is refused, nothing written
    done = run_cli("adopt", tmp_path / "bad", "--tokenizer", tiny_tokenizer, "--meta", meta)
    assert done.returncode != 0 and "licence" in done.stderr and not (tmp_path / "bad/manifest.json").exists()


# --- convert --format levanter: the manifest's name and the framing the documents show ------------------------
@pytest.mark.parametrize("bos", [False, True])
def test_convert_to_levanter_writes_the_tokenizer_name_and_framing(tmp_path, tiny_tokenizer, bos):
    inputs = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in make_texts(30, 3)])
    done = run_cli("shard", inputs, "--subset", "s", "--tokenizer", tiny_tokenizer, "--tokenizer-name", REPO,
                   "--out", tmp_path / "corpus", "--workers", "1", *(["--bos"] if bos else []))
    assert done.returncode == 0, done.stderr
    done = run_cli("convert", tmp_path / "corpus", "--to", tmp_path / "caches", "--format", "levanter")
    assert done.returncode == 0, done.stderr
    # the tiny tokenizer has a BOS (1): whether every document opens with it is what the corpus shows
    assert ledger_metadata(tmp_path / "caches/s") == {"tokenizer": REPO, "vocab_size": VOCAB, "append_bos": bos,
                                                      "append_eos": True}
    done = run_cli("adopt", tmp_path / "caches", "--tokenizer", tiny_tokenizer)  # and back: the same facts
    info = load_corpus(tmp_path / "caches").manifest.tokenizer
    assert done.returncode == 0 and (info.name, info.add_bos, info.bos_id) == (REPO, bos, 1 if bos else None)


# --- the datasheet's BOS line agrees with the ledgers ----------------------------------------------------------
def test_the_datasheet_of_a_bos_framed_cache_states_its_bos_id(tmp_path):
    done = run_cli("datasheet", FIXTURES / "tokenized-int64-lz4", "--tokenizer", WORDLEVEL, "--out", tmp_path / "o")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "o" / DATASHEET).read_text()
    assert "`append_bos`: `True`" in text
    assert re.search(r"\| BOS id \| `1` \|", text), re.findall(r".*BOS id.*", text)


# --- convert --format marin from a pinned store keeps its name and licenses -----------------------------------
def test_a_pinned_store_converts_with_its_name_and_licenses(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", {"a": 20, "b": 30})
    meta = tmp_path / "meta.yaml"
    meta.write_text("subsets:\n  a:\n    license: GPL-2.0-or-later\n")
    adopt(tmp_path / "store", tokenizer=str(tiny_tokenizer), name="marin-store", license="MIT", meta=meta)
    done = run_cli("convert", tmp_path / "store", "--to", tmp_path / "corpus", "--format", "marin")
    assert done.returncode == 0, done.stderr
    manifest = load_corpus(tmp_path / "corpus").manifest
    assert manifest.name == "marin-store"
    assert {s: i.license for s, i in manifest.subsets.items()} == {"a": "GPL-2.0-or-later", "b": "MIT"}
    done = run_cli("convert", tmp_path / "store", "--to", tmp_path / "other", "--format", "marin", "--license",
                   "CC0-1.0")  # an explicit flag still wins
    assert done.returncode == 0, done.stderr
    assert {i.license for i in load_corpus(tmp_path / "other").manifest.subsets.values()} == {"CC0-1.0"}


# --- the tokenizer a cache's ledger names, found on this machine ----------------------------------------------
def test_show_and_convert_take_the_tokenizer_the_ledger_names_from_the_hub_cache(tmp_path, tiny_tokenizer):
    make_store(tmp_path / "store", {"a": 20, "b": 30}, tokenizer=REPO)
    env = hf_cache(tmp_path / "hf", tiny_tokenizer)
    said = f"tokenizer: {REPO}, from the cache's ledger"
    shown = run_cli("show", tmp_path / "store", "--subset", "a", "-n", "1", "--json", env=env)
    given = run_cli("show", tmp_path / "store", "--subset", "a", "-n", "1", "--json", "--tokenizer", tiny_tokenizer)
    assert shown.returncode == 0 and said in shown.stderr, shown.stderr
    assert shown.stdout == given.stdout and said not in given.stderr
    done = run_cli("convert", tmp_path / "store", "--to", tmp_path / "corpus", "--format", "marin", env=env)
    assert done.returncode == 0 and said in done.stderr, done.stderr
    assert load_corpus(tmp_path / "corpus").manifest.tokenizer.name == REPO
    done = run_cli("datasheet", tmp_path / "store", "--out", tmp_path / "sheet", env=env)
    assert done.returncode == 0 and said in done.stderr, done.stderr

    nowhere = {**env, "HF_HUB_CACHE": str(tmp_path / "empty")}  # not on this machine: asked for, as before
    for args in (("show", tmp_path / "store", "--subset", "a"),
                 ("convert", tmp_path / "store", "--to", tmp_path / "c2", "--format", "marin")):
        done = run_cli(*args, env=nowhere)
        assert done.returncode == 2 and "pass --tokenizer" in done.stderr and said not in done.stderr
    assert not (tmp_path / "c2").exists()


def shutil_copy(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst)
