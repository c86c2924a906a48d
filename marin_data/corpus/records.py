"""The rows of a corpus description: a subset's totals, a metadata file, a shard.

`SubsetInfo` is a value of ``manifest.json``'s ``subsets``, `FileRecord` of its ``files`` (the metadata files
it vouches for), `ShardRecord` a row of ``shards.parquet``. Plain frozen values: the checks live with the
files they come from (`marin_data.corpus.manifest`, `marin_data.corpus.index`).

`ShardRecord` is a named tuple, not a dataclass: a corpus holds ~100,000 of them, made at every start of the
loader, and a tuple is made in under half the time (*measured*: 0.13-0.19 s against 0.80-0.86 s for 100,000
frozen dataclasses on a loaded 2-core machine). Change one with ``record._replace(bytes=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["SubsetInfo", "FileRecord", "ShardRecord"]


@dataclass(frozen=True)
class SubsetInfo:
    docs: int
    tokens: int
    bytes: int
    shards: int
    license: str = "unknown"  # SPDX id


@dataclass(frozen=True)
class FileRecord:
    """A metadata file of the corpus (shards.parquet, tokenizer.json, SHA256SUMS, README.md...)."""

    bytes: int
    sha256: str


class ShardRecord(NamedTuple):
    path: str  # relative POSIX path inside the corpus, e.g. data/pretrain/code/part-00000.parquet
    subset: str
    bytes: int
    sha256: str
    docs: int
    tokens: int
    row_groups: int
