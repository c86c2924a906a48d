"""``marin-data sample``: a deterministic, offline corpus from the Python installation itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from shard_env import ROOT, run_cli, tree_bytes

from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.sample import SAMPLE_JSON, sample_documents
from marin_data.layout import MANIFEST, SUMS
from marin_data.raw.tokenizer import load_tokenizer

TRAIN = """
import hashlib, sys
sys.path.insert(0, {tests!r})
from shard_env import make_texts
from marin_data.raw.bpe import train_tokenizer
print(hashlib.sha256(train_tokenizer(make_texts(400, 7), 1000)).hexdigest())
"""


def test_tokenizer_training_gives_the_same_bytes_in_other_processes_and_thread_counts():
    digests = set()
    for threads in ("1", "2", "4"):
        done = subprocess.run([sys.executable, "-c", TRAIN.format(tests=str(ROOT / "tests"))], capture_output=True,
                              text=True, env={**os.environ, "RAYON_NUM_THREADS": threads}, cwd=ROOT, check=True)
        digests.add(done.stdout.strip())
    assert len(digests) == 1


@pytest.mark.slow
def test_sample_is_a_real_multi_subset_corpus_that_round_trips(sample_corpus, tmp_path):
    out = sample_corpus  # built with --workers 2
    corpus = load_corpus(out)
    subsets = corpus.manifest.subsets
    assert len(subsets) >= 3 and sum(s.tokens for s in subsets.values()) >= 5_000_000
    assert all(s.shards >= 4 for s in subsets.values()), subsets
    assert {s.license for s in subsets.values()} >= {"PSF-2.0"}
    assert subprocess.run(["sha256sum", "-c", "--quiet", SUMS], cwd=out).returncode == 0

    docs, fingerprint = sample_documents()
    recorded = json.loads((out / SAMPLE_JSON).read_bytes())
    assert SAMPLE_JSON in corpus.manifest.files
    assert {k: recorded[k] for k in fingerprint} == fingerprint
    tok = load_tokenizer(str(out / "tokenizer.json"))
    for name in subsets:
        texts = dict(docs[name])
        first = next(s for s in corpus.shards_of([name]))
        table = pq.read_table(out / first.path)
        for doc_id, tokens in list(zip(table.column("id").to_pylist(), table.column("tokens").to_pylist()))[:20]:
            assert tokens[-1] == corpus.manifest.tokenizer.eos_id
            assert tok.tokenizer.decode(tokens[:-1]) == texts[doc_id]

    before = tree_bytes(out)
    rebuilt = run_cli("sample", tmp_path / "rebuilt", "--workers", "1", timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert tree_bytes(tmp_path / "rebuilt") == before  # deterministic: same bytes, other worker count
    again = run_cli("sample", tmp_path / "rebuilt", timeout=300)  # the shared build stays untouched
    assert again.returncode == 0, again.stderr
    assert "built 0 of 4 subsets" in again.stdout and tree_bytes(tmp_path / "rebuilt") == before
    assert (tmp_path / "rebuilt" / MANIFEST).exists()
