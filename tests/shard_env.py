"""Helpers for the sharding tests: generated documents, input files in every format, a tiny trained
tokenizer, and the CLI run as a real subprocess."""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from marin_data.raw.bpe import train_tokenizer
from marin_data.layout import TOKENIZER

ROOT = Path(__file__).resolve().parent.parent
_SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["é", "ß", "日本", "ü", "ø"]


def make_texts(n: int, seed: int, *, words: tuple[int, int] = (1, 400)) -> list[str]:
    """``n`` documents of pseudo-words (some non-ASCII), punctuation and newlines; deterministic in ``seed``."""
    rng = random.Random(seed)

    def word() -> str:
        return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))

    texts = []
    for _ in range(n):
        parts = [word() + rng.choice(["", "", "", ",", ".", ".\n", "\n\n", "  "]) for _ in range(rng.randint(*words))]
        texts.append(" ".join(parts))
    return texts


def write_jsonl(path: Path, records: list[dict], compression: str | None = None) -> Path:
    """Write JSON Lines, plain or compressed (``"gzip"``/``"zstd"``)."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    if compression == "gzip":
        data = gzip.compress(data, mtime=0)
    elif compression == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, row_group_size=50)
    return path


def train_tiny(path: Path, *, vocab_size: int = 400, seed: int = 99) -> Path:
    """A real byte-level BPE trained on generated text (EOS ``<|end_of_text|>`` = 0, BOS = 1)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / TOKENIZER).write_bytes(train_tokenizer(make_texts(300, seed), vocab_size))
    return path / TOKENIZER


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("tok") / "tiny-bpe")


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            max_file_bytes: int | None = None) -> subprocess.CompletedProcess:
    """``python -m marin_data ARGS`` in a fresh process, as a user would run it. A crash (a signal) prints
    every thread's Python stack to its stderr (``PYTHONFAULTHANDLER``), which a failed assertion shows.
    ``max_file_bytes`` makes the disk full for it: the kernel refuses to grow any file past that size
    (``RLIMIT_FSIZE``: a short write, then EFBIG, the path ENOSPC takes), where no test may fill a disk."""
    return subprocess.run([sys.executable, "-m", "marin_data", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONFAULTHANDLER": "1", **os.environ, **(env or {})}, timeout=timeout,
                          preexec_fn=None if max_file_bytes is None else lambda: _file_size_limit(max_file_bytes))


def _file_size_limit(nbytes: int) -> None:
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative POSIX path -> bytes), for byte-for-byte comparisons."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
