"""``marin-data info``: the subsets table, totals, tokenizer and the manifest's own sha256."""

from __future__ import annotations

import hashlib
import json

from shard_env import run_cli

from marin_data.corpus.info import corpus_info


def test_info_sums_the_subsets_and_shows_the_manifest_digest(make_corpus):
    corpus = make_corpus({"a": [50, 30], "b/c": [20]})
    info = corpus_info(corpus.root)
    assert info.manifest_sha256 == hashlib.sha256((corpus.root / "manifest.json").read_bytes()).hexdigest()
    doc = info.to_json()
    assert sorted(doc["subsets"]) == ["a", "b/c"]
    keys = ("docs", "tokens", "bytes", "shards")
    assert doc["total"] == {k: sum(s[k] for s in doc["subsets"].values()) for k in keys}
    assert doc["total"]["docs"] == 100 and doc["total"]["shards"] == 3
    assert doc["tokenizer"]["sha256"] == corpus.manifest.tokenizer.sha256


def test_cli_table_and_json_agree_with_the_manifest(make_corpus):
    corpus = make_corpus({"a": [50, 30], "b/c": [20]})
    table = run_cli("info", corpus.root)
    as_json = run_cli("info", corpus.root, "--json")
    assert table.returncode == as_json.returncode == 0, table.stderr + as_json.stderr
    doc = json.loads(as_json.stdout)
    rows = {cells[0]: cells for cells in map(str.split, table.stdout.splitlines())
            if cells and cells[0] in {*doc["subsets"], "total"}}
    for name, s in doc["subsets"].items():
        assert rows[name][1:4] == [f"{s['docs']:,}", f"{s['tokens']:,}", f"{s['shards']:,}"]
        assert rows[name][-1] == s["license"] == "CC0-1.0"
    total = doc["total"]
    assert rows["total"][1:4] == [f"{total['docs']:,}", f"{total['tokens']:,}", f"{total['shards']:,}"]
    assert f"manifest sha256  {doc['manifest_sha256']}" in table.stdout
    assert corpus.manifest.tokenizer.sha256 in table.stdout


def test_info_on_a_directory_without_a_manifest_is_a_usage_error(tmp_path):
    done = run_cli("info", tmp_path)
    assert done.returncode == 2
    assert "no manifest.json" in done.stderr
