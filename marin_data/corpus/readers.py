"""A pinned corpus's rows read whole from local disk and checked against their SHA-256 and size
(`LocalFiles`, the reader a format's shard decoder is given for a local corpus): a decode then reads exactly the bytes that were hashed.
The loader's remote streams read the same rows over stores (`marin_data.loader.remote.files`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from marin_data.corpus.records import ShardRecord
from marin_data.errors import ShardChecksumError, ShardMissingError

__all__ = ["LocalFiles", "read_checked"]


@dataclass(frozen=True)
class LocalFiles:
    """The rows of a corpus on local disk, read whole and checked (`read_checked`): the reader a
    `marin_data.levanter.PinnedCells` of a local pinned cache is given."""

    root: Path
    verify: bool = True

    def __call__(self, row: ShardRecord) -> bytes:
        return read_checked(self.root / row.path, row, verify=self.verify)


def read_checked(source: Path, shard: ShardRecord, *, verify: bool = True) -> bytes:
    """The whole of a row's file (at most ``shard.bytes`` + 1 bytes are read), checked against its size and
    SHA-256 when ``verify``: the bytes a decode then reads are the bytes that were hashed.

    Raises:
        ShardMissingError: the file is not there; ShardChecksumError: its size or SHA-256 differs.
    """
    try:
        with open(source, "rb") as f:
            data = f.read(shard.bytes + 1)
    except FileNotFoundError:
        raise ShardMissingError(f"file of subset {shard.subset!r} is not on local disk", path=str(source)) from None
    if verify:
        digest = hashlib.sha256(data).hexdigest()
        if (digest, len(data)) != (shard.sha256, shard.bytes):
            raise ShardChecksumError(f"sha256/size {digest[:12]}…/{len(data)}{'+' * (len(data) > shard.bytes)} != "
                                     f"{shard.sha256[:12]}…/{shard.bytes} listed in the shard index: the file was "
                                     "modified", path=str(source), expected=shard.sha256, actual=digest)
    return data
