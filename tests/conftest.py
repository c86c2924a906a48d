"""Shared fixtures: small synthetic corpora written with the real shard and manifest code."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from marin_data.corpus.commit import MAX_FILES_PER_REPO, commit_corpus
from marin_data.corpus.manifest import Corpus, Manifest, load_corpus
from marin_data.corpus.records import ShardRecord, SubsetInfo
from marin_data.corpus.shard import shard_path, write_shard
from marin_data.layout import TOKENIZER
from marin_data.raw.tokenizer import TokenizerInfo

VOCAB = 1000
EOS = 0

# Inductor's on-disk kernel cache does not key its entries by ATEN_CPU_CAPABILITY: kernels compiled in a run
# forced to AVX2 were loaded by a later AVX-512 run of the same test and aborted it (seen with torch 2.13 on an
# AVX-512 machine). A run forced to one width keeps its own cache, unless the caller chose one.
if os.environ.get("ATEN_CPU_CAPABILITY") and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY']}")


def pytest_report_header(config) -> list[str]:
    """The machine at the top of every run, so a red suite names it: the CPU model and the SIMD path torch's
    CPU kernels take (bits of a float reduction may differ between AVX2 and AVX-512)."""
    import torch

    model = platform.processor() or platform.machine()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    return [f"cpu: {model}, {os.cpu_count()} cores; torch {torch.__version__} CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}" + (f" (ATEN_CPU_CAPABILITY={forced})" if forced else "")]


def build_corpus(
    root: Path,
    subsets: dict[str, list[int]],
    *,
    seed: int = 0,
    doc_tokens: tuple[int, int] = (1, 400),
    row_group_tokens: int = 1 << 20,
    max_files_per_repo: int = MAX_FILES_PER_REPO,
) -> Corpus:
    """Write a corpus whose subset ``name`` has shards with the given document counts.

    Documents have random lengths in ``doc_tokens`` and random token ids in [1, VOCAB), each followed by
    EOS (id 0), so tests can find document boundaries. Deterministic in ``seed``. ``max_files_per_repo``
    spreads the subsets over Hub repos as `marin_data.corpus.commit.assign_repos` packs them.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    tok_json = json.dumps({"model": {"type": "synthetic", "vocab_size": VOCAB}}).encode()
    root.mkdir(parents=True, exist_ok=True)
    (root / TOKENIZER).write_bytes(tok_json)
    tokenizer = TokenizerInfo(name="synthetic", sha256=hashlib.sha256(tok_json).hexdigest(), vocab_size=VOCAB,
                              eos_id=EOS)
    records = []
    for subset, docs_per_shard in sorted(subsets.items()):
        for n, ndocs in enumerate(docs_per_shard):
            lens = rng.integers(doc_tokens[0], doc_tokens[1] + 1, size=ndocs)
            offsets = np.concatenate([[0], np.cumsum(lens + 1)]).astype(np.int64)
            tokens = rng.integers(1, VOCAB, size=int(offsets[-1])).astype(np.uint32)
            tokens[offsets[1:] - 1] = EOS
            rel = shard_path(subset, n)
            ids = [f"{subset}/{n}/{i}" for i in range(ndocs)]
            st = write_shard(root / rel, ids, tokens, offsets, tokenizer, row_group_tokens=row_group_tokens)
            records.append(ShardRecord(path=rel, subset=subset, bytes=st.bytes, sha256=st.sha256, docs=st.docs,
                                       tokens=st.tokens, row_groups=st.row_groups))
    manifest = Manifest(name="synthetic", version="0", tokenizer=tokenizer,
                        subsets={s: SubsetInfo(0, 0, 0, 0, license="CC0-1.0") for s in subsets})
    commit_corpus(root, manifest, records, max_files_per_repo=max_files_per_repo)
    return load_corpus(root)


# Words with two- and three-byte UTF-8 characters: bytes per token is not one.
_WORDS = "alpha beta gamma delta café naïve über smörgåsbord crème déjà façade — ✓ zeta theta".split()


def build_text_corpus(root: Path, docs_per_subset: dict[str, int], *, seed: int = 0, vocab_size: int = 320,
                      shard_tokens: int = 4096) -> tuple[Corpus, dict[str, list[str]]]:
    """A corpus of real text, tokenized with a byte-level BPE trained on it (the sample corpus's kind): random
    sentences of `_WORDS`, ``docs_per_subset[name]`` documents per subset. Returns it and the documents."""
    import random

    from marin_data.corpus.build import shard_subset
    from marin_data.corpus.sample import train_tokenizer
    from marin_data.raw.tokenizer import load_tokenizer

    rng = random.Random(seed)
    docs = {name: [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 60))) for _ in range(n)]
            for name, n in docs_per_subset.items()}
    inputs = Path(root).parent / f"{Path(root).name}-inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / TOKENIZER).write_bytes(train_tokenizer([d for texts in docs.values() for d in texts], vocab_size))
    tokenizer = load_tokenizer(str(inputs / TOKENIZER))
    for name, texts in sorted(docs.items()):
        path = inputs / f"{name.replace('/', '_')}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{name}/{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
        shard_subset([str(path)], subset=name, tokenizer=tokenizer, out=root, workers=1, shard_tokens=shard_tokens)
    return load_corpus(root), docs


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    """Decoded shards go to a temporary folder, never the user's ``~/.cache/marin`` (subprocesses inherit it)."""
    import os

    before = os.environ.get("MARIN_CACHE_DIR")
    os.environ["MARIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("marin-cache"))
    yield
    if before is None:
        os.environ.pop("MARIN_CACHE_DIR", None)
    else:
        os.environ["MARIN_CACHE_DIR"] = before


@pytest.fixture
def make_corpus(tmp_path: Path) -> Callable[..., Corpus]:
    """``make_corpus({"a": [50, 30], "b/c": [20]})`` -> a committed corpus under a fresh tmp dir."""
    counter = iter(range(1_000_000))

    def make(subsets: dict[str, list[int]], **kwargs) -> Corpus:
        return build_corpus(tmp_path / f"corpus{next(counter)}", subsets, **kwargs)

    return make


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled once in this test session, for every test that needs
    it: under pytest-xdist the workers share one, the first to take its lock builds it and the others wait.
    A build that raised is started again from an empty folder by the next test that asks."""
    base = tmp_path_factory.getbasetemp()  # under xdist, one per worker inside the session's directory
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    done = root.with_name(f"{name}.done")
    with FileLock(f"{root}.lock"):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            build(root)
            done.touch()
    return root


@pytest.fixture(scope="session")
def sample_corpus(tmp_path_factory) -> Path:
    """`marin-data sample OUT --workers 2`, run once for the session: tests must read it, not change it."""
    from shard_env import run_cli

    def build(root: Path) -> None:
        done = run_cli("sample", root / "sample", "--workers", "2", timeout=300)
        assert done.returncode == 0, done.stderr

    return built_once(tmp_path_factory, "sample", build) / "sample"
