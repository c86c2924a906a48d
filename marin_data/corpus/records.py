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

__all__ = ["SubsetInfo", "FileRecord", "ShardRecord", "SHARD", "OFFSETS", "META", "KINDS"]

# What a row of the shard index is. A Parquet corpus has shards only; a pinned Levanter cache lists every
# file of a subset, so that each is fetched and hashed with it (docs/design.md, "Levanter caches").
SHARD = "shard"  # what the loader decodes: a Parquet shard, or a data chunk file of a cache
OFFSETS = "offsets"  # a cache's offsets chunk file: the document boundaries of its subset
META = "meta"  # a cache's small file: a ledger, a zarr.json, a .success or .stats.json
KINDS = (SHARD, OFFSETS, META)


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
    docs: int  # a cache's data chunk file: the documents that start in it
    tokens: int
    row_groups: int  # a cache's data chunk file: its stored inner chunks
    kind: str = SHARD
