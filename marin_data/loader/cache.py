"""The local decoded-shard store: each Parquet shard decoded once into memory-mappable arrays.

Why decode at all: Parquet decoding caps a core at ~124M tokens/s (DESIGN.md, *measured*), while copying
from a memory map runs at 500M–1.3G tokens/s. So the first read of a shard decodes it into two ``.npy``
files — ``tokens`` (``[N]`` uint32) and ``offsets`` (``[docs + 1]`` int64, document ``d`` is
``tokens[offsets[d]:offsets[d+1]]``) — about 3x the Parquet bytes, and every later read is a memory map
served by the page cache.

Files are named by the shard's sha256 (content addressing): two corpora holding the same shard share one
decode, and a re-sharded file can never be served from a stale decode. Both files are written atomically
(`marin_data.atomic`), offsets first, so the presence of ``tokens.npy`` means both are complete; a file
lock makes ranks and DataLoader workers on one host decode each shard once instead of racing.

The interface the loader needs is one method, ``open(shard) -> DecodedShard``; issue 9 puts a remote,
bounded LRU store behind the same method.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from marin_data.atomic import atomic_path
from marin_data.errors import ShardFormatError, ShardMissingError
from marin_data.manifest import ShardRecord
from marin_data.shards import read_shard

__all__ = ["DecodedShard", "ShardSource", "DecodedShardCache", "default_cache_dir"]


@dataclass(frozen=True)
class DecodedShard:
    tokens: np.ndarray  # [N] uint32, memory-mapped
    offsets: np.ndarray  # [docs + 1] int64, memory-mapped; offsets[0] == 0, offsets[-1] == N


class ShardSource(Protocol):
    """Anything that can hand the loader a shard's decoded tokens (local now, remote in issue 9)."""

    def open(self, shard: ShardRecord) -> DecodedShard: ...


def default_cache_dir() -> Path:
    """``$MARIN_CACHE_DIR/decoded``, else ``~/.cache/marin/decoded``: a corpus directory may be read-only."""
    root = os.environ.get("MARIN_CACHE_DIR") or Path.home() / ".cache" / "marin"
    return Path(root) / "decoded"


class DecodedShardCache:
    """Decode a local corpus's shards on first use and serve them as memory maps.

    Args:
        corpus_root: the corpus directory (shard paths are relative to it).
        cache_dir: where decoded shards live; see `default_cache_dir`.
        max_open: shards kept memory-mapped at once (two maps each; Linux allows ~65,000 maps a process).
    """

    def __init__(self, corpus_root: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                 *, max_open: int = 256) -> None:
        self.corpus_root = Path(corpus_root)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_open = max_open
        self._open: OrderedDict[str, DecodedShard] = OrderedDict()

    def __getstate__(self) -> dict:  # DataLoader workers get the settings, not the open maps
        return {**self.__dict__, "_open": OrderedDict()}

    def paths(self, shard: ShardRecord) -> tuple[Path, Path]:
        """``(tokens.npy, offsets.npy)`` of a shard's decode."""
        d = self.cache_dir / shard.sha256[:2] / shard.sha256
        return d / "tokens.npy", d / "offsets.npy"

    def ensure(self, shard: ShardRecord) -> None:
        """Decode ``shard`` unless its decode is already there."""
        tokens_path, offsets_path = self.paths(shard)
        if tokens_path.exists():
            return
        from filelock import FileLock

        tokens_path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(tokens_path.parent / "decode.lock")):
            if tokens_path.exists():  # another process decoded it while we waited
                return
            source = self.corpus_root / shard.path
            if not source.exists():
                raise ShardMissingError(f"shard of subset {shard.subset!r} is not on local disk",
                                        path=str(source))
            _, tokens, offsets = read_shard(source)
            if len(tokens) != shard.tokens or len(offsets) != shard.docs + 1:
                raise ShardFormatError(
                    f"holds {len(offsets) - 1} documents / {len(tokens)} tokens, the index says "
                    f"{shard.docs} / {shard.tokens}", path=str(source),
                    expected=(shard.docs, shard.tokens), actual=(len(offsets) - 1, len(tokens)))
            for path, array in ((offsets_path, offsets), (tokens_path, tokens)):  # tokens last: the marker
                with atomic_path(path) as tmp, open(tmp, "wb") as f:
                    np.save(f, array)

    def open(self, shard: ShardRecord) -> DecodedShard:
        """The shard's decoded arrays, decoding it first if needed (most recently used stay mapped)."""
        hit = self._open.get(shard.sha256)
        if hit is not None:
            self._open.move_to_end(shard.sha256)
            return hit
        self.ensure(shard)
        tokens_path, offsets_path = self.paths(shard)
        decoded = DecodedShard(np.asarray(np.load(tokens_path, mmap_mode="r")),
                               np.asarray(np.load(offsets_path, mmap_mode="r")))
        self._open[shard.sha256] = decoded
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        return decoded
