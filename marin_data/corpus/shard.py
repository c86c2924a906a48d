"""Write and read one shard: a Parquet file of tokenized documents.

Schema: ``id`` (string) and ``tokens`` (``large_list<uint32>``; a Llama-3 vocabulary of 128,256 needs more
than 16 bits), zstd, row groups of about 1M tokens, the tokenizer fingerprint in the key-value metadata.
The token values are written with BYTE_STREAM_SPLIT and no dictionary: measured at 0.33x of raw
uint32 (docs/design.md, "The corpus format") and ~124M tokens/s/core to decode. Only ``use_byte_stream_split=["tokens.list.element"]`` does it —
``True`` raises on the string column, ``["tokens"]`` silently writes PLAIN, and the default dictionary
silently writes RLE_DICTIONARY — so `inspect_shard` reads the encodings back and refuses anything else.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marin_data.arrays import numbers, strings
from marin_data.atomic import atomic_path, sha256_file
from marin_data.errors import ShardFormatError
from marin_data.layout import DATA
from marin_data.parquet_io import open_parquet
from marin_data.raw.tokenizer import TokenizerInfo

__all__ = [
    "ROW_GROUP_TOKENS",
    "MAX_ROW_GROUP_BYTES",
    "MAX_SHARDS_PER_SUBSET",
    "TOKENS_VALUES",
    "ShardStats",
    "ShardInspection",
    "shard_path",
    "shard_schema",
    "write_shard",
    "read_shard",
    "check_schema",
    "inspect_shard",
]

ROW_GROUP_TOKENS = 1 << 20  # ~1M tokens per row group: a unit a reader can decode and seek to
# What a reader that has not checked a shard's bytes (`show`, the datasheet's scan) lets one row group decode
# to, bounded from the footer first: ours hold ~1M tokens (~12 MB decoded with their offsets).
MAX_ROW_GROUP_BYTES = 1 << 30
# The Hub allows fewer than 10,000 files per folder. Subset names are paths, so a subset that outgrows
# this is split into child subsets (pretrain/dclm/000, pretrain/dclm/001...) that `--subset pretrain/dclm`
# still selects as one.
MAX_SHARDS_PER_SUBSET = 9_999
TOKENS_VALUES = "tokens.list.element"  # the Parquet column path of the token values
_META_SCHEMA = b"marin.schema_version"
_META_TOKENIZER = b"marin.tokenizer.sha256"
_META_TOKENIZER_NAME = b"marin.tokenizer.name"


@dataclass(frozen=True)
class ShardStats:
    bytes: int
    sha256: str
    docs: int
    tokens: int
    row_groups: int


def shard_path(subset: str, number: int) -> str:
    """Relative path of a subset's ``number``-th shard (numbered in write order, no ``-of-N``)."""
    if not 0 <= number < MAX_SHARDS_PER_SUBSET:
        raise ValueError(
            f"subset {subset!r} would get shard #{number}; the Hub allows < 10,000 files per folder: "
            f"split it into child subsets ({subset}/000, {subset}/001, ...)"
        )
    return f"{DATA}/{subset}/part-{number:05d}.parquet"


def shard_schema(tokenizer: TokenizerInfo):
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("tokens", pa.large_list(pa.uint32()))],
        metadata={
            _META_SCHEMA: b"1",
            _META_TOKENIZER: tokenizer.sha256.encode(),
            _META_TOKENIZER_NAME: tokenizer.name.encode(),
        },
    )


def write_shard(
    path: str | os.PathLike,
    ids: Sequence[str],
    tokens: np.ndarray,
    offsets: np.ndarray,
    tokenizer: TokenizerInfo,
    *,
    row_group_tokens: int = ROW_GROUP_TOKENS,
) -> ShardStats:
    """Write documents atomically to one shard and return its size, sha256 and counts.

    Args:
        path: the final path; the bytes go to a ``.part`` file first and are renamed only when complete.
        ids: one id per document.
        tokens: ``[N]`` uint32, all documents' tokens concatenated (EOS already appended).
        offsets: ``[len(ids) + 1]`` int64, document ``i`` is ``tokens[offsets[i]:offsets[i+1]]``.
        tokenizer: recorded in the file's key-value metadata.
        row_group_tokens: a row group closes once it holds at least this many tokens.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokens = np.ascontiguousarray(tokens, dtype=np.uint32)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if len(offsets) != len(ids) + 1 or offsets[0] != 0 or offsets[-1] != len(tokens):
        raise ValueError(f"offsets do not describe {len(ids)} documents over {len(tokens)} tokens")
    schema = shard_schema(tokenizer)
    # Row-group boundaries: the first document at which the running token count reaches each multiple.
    cuts = np.searchsorted(offsets, np.arange(row_group_tokens, int(offsets[-1]), row_group_tokens), "left")
    bounds = [0, *sorted(set(int(c) for c in cuts if 0 < c < len(ids))), len(ids)]
    with atomic_path(path) as tmp:
        with pq.ParquetWriter(
            tmp, schema, compression="zstd", use_dictionary=["id"], use_byte_stream_split=[TOKENS_VALUES],
            write_statistics=["id"],
        ) as writer:
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                off = offsets[lo : hi + 1] - offsets[lo]
                column = pa.LargeListArray.from_arrays(numbers(off, np.int64),
                                                       numbers(tokens[offsets[lo] : offsets[hi]], np.uint32))
                writer.write_table(pa.table({"id": strings(ids[lo:hi]), "tokens": column}, schema=schema))
        digest, size = sha256_file(tmp)
    return ShardStats(bytes=size, sha256=digest, docs=len(ids), tokens=int(offsets[-1]),
                      row_groups=len(bounds) - 1)


def read_shard(path: str | os.PathLike) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Read a whole shard: ``(ids, tokens [N] uint32, offsets [docs + 1] int64)``."""
    try:
        with open_parquet(path) as pf:
            table = pf.read()
        column = table.column("tokens").combine_chunks()
        ids = table.column("id").to_pylist()
    except (OSError, ValueError, KeyError) as e:
        raise ShardFormatError(f"not a readable shard: {e}", path=str(path)) from e
    offsets = np.asarray(column.offsets, dtype=np.int64)
    tokens = np.asarray(column.values, dtype=np.uint32)
    base = offsets[0]
    return ids, tokens[base : offsets[-1]], offsets - base


def check_schema(schema, path: str | os.PathLike) -> None:
    """Raise `ShardFormatError` unless ``schema`` (a shard's Arrow schema, from its footer) is the shard format's:
    ``id`` string and ``tokens`` ``large_list<uint32>``. Tokens of another type (int64, say) would be served
    reinterpreted: half of them zeros, half of each shard dropped."""
    import pyarrow as pa

    want = {"id": pa.string(), "tokens": pa.large_list(pa.uint32())}
    got = {f.name: f.type for f in schema}
    if got != want:
        found = ", ".join(f"{k}: {v}" for k, v in got.items())
        raise ShardFormatError(f"schema {{{found}}} is not {{id: string, tokens: large_list<uint32>}}",
                               path=str(path), expected=want, actual=got)


@dataclass(frozen=True)
class ShardInspection:
    docs: int
    tokens: int
    row_groups: int
    tokenizer_sha256: str | None
    token_encodings: tuple[str, ...]  # Parquet encodings of the token values, e.g. ("BYTE_STREAM_SPLIT",)


def inspect_shard(path: str | os.PathLike) -> ShardInspection:
    """Read a shard's footer (not its data) and check schema and encodings.

    Raises:
        ShardFormatError: unreadable footer, wrong schema, or token values not BYTE_STREAM_SPLIT or
            dictionary-encoded.
    """
    import pyarrow as pa

    try:
        pf = open_parquet(path)
    except (OSError, ValueError) as e:
        raise ShardFormatError(f"not a readable Parquet file (truncated or half-written?): {e}",
                               path=str(path)) from e
    schema = pf.schema_arrow
    check_schema(schema, path)
    md = pf.metadata
    col = next(i for i in range(md.num_columns) if md.schema.column(i).path == TOKENS_VALUES)
    encodings = sorted({e for rg in range(md.num_row_groups) for e in md.row_group(rg).column(col).encodings})
    if "BYTE_STREAM_SPLIT" not in encodings or any("DICT" in e for e in encodings):
        raise ShardFormatError(f"token values encoded {encodings}, expected BYTE_STREAM_SPLIT, no dictionary",
                               path=str(path), expected=["BYTE_STREAM_SPLIT"], actual=encodings)
    tokens = sum(md.row_group(rg).column(col).num_values for rg in range(md.num_row_groups))
    kv = schema.metadata or {}
    fp = kv.get(_META_TOKENIZER)
    return ShardInspection(docs=md.num_rows, tokens=tokens, row_groups=md.num_row_groups,
                           tokenizer_sha256=fp.decode() if fp else None, token_encodings=tuple(encodings))
