"""One file of a Levanter cache hashed in one pass as its bytes stream by, wherever they come from.

`hash_stream` takes the file's bytes as pieces (a local file's `read_pieces`, a store's `ReadStream`) and
computes its SHA-256 and every other digest asked for (`marin_data.stores.checksums.Hasher`: a store's own
MD5, CRC32C...). A data chunk file (`ChunkCheck`) is also decoded frame by frame as it passes: its index (the
last ``meta.index_bytes``, read first) says where each stored inner chunk lies, each frame is decoded once
complete (one inner chunk in memory, never the file) and its token ids checked against the vocabulary, so the
ids checked are those of the bytes hashed. The stream must end with the very index read first and be of the
size expected: a file replaced while it was read is refused. ``adopt`` of a local folder and of a store
(`marin_data.levanter.adopt`, `marin_data.levanter.adopt_remote`) both hash through here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from marin_data.errors import CacheCheckError, CacheFormatError
from marin_data.levanter.arraymeta import ArrayMeta
from marin_data.levanter.chunkfile import decode_inner, read_index, stored_frames
from marin_data.levanter.documents import refuse_ids
from marin_data.stores.checksums import Hasher

__all__ = ["ChunkCheck", "Hashed", "hash_stream"]


@dataclass(frozen=True)
class ChunkCheck:
    """What decoding a data chunk file as it streams needs: its array, its token count, the vocabulary."""

    meta: ArrayMeta
    count: int  # the tokens the ledger puts in this file
    vocab_size: int


@dataclass(frozen=True)
class Hashed:
    digests: dict[str, str]  # algorithm -> hex: sha256 always, and those asked for
    size: int
    row_groups: int  # a data chunk file's stored inner chunks; 0 for any other file


def hash_stream(pieces: Iterable[bytes | memoryview], *, size: int, where: str, also: Iterable[str] = (),
                chunk: ChunkCheck | None = None, tail: bytes = b"") -> Hashed:
    """Hash the ``size`` bytes of ``pieces`` (SHA-256 and ``also``); a data chunk file (``chunk``, with its
    index ``tail`` read before the stream) decoded and checked on the way.

    Raises:
        CacheCheckError: a token id outside ``[0, vocab_size)``; CacheFormatError: a bad index or frame, or
            the file changed while it was read (another size, another index).
    """
    h = Hasher(also)
    if chunk is None:
        n = 0
        for piece in pieces:
            h.update(piece)
            n += len(piece)
        if n != size:
            raise CacheFormatError(f"changed while it was read ({n} bytes, {size} expected): run adopt again",
                                   path=where, expected=size, actual=n)
        return Hashed(h.hexdigests(), n, 0)
    frames = _frames(chunk, tail, size, where)
    reader = _Frames(chunk, frames, where)
    for piece in pieces:
        h.update(piece)
        reader.feed(piece)
    if reader.seen != size or reader.rest != tail:
        raise CacheFormatError("changed while it was read: run adopt again", path=where)
    return Hashed(h.hexdigests(), size, len(frames))


def _frames(chunk: ChunkCheck, tail: bytes, size: int, where: str) -> list[tuple[int, int, int]]:
    """The stored frames of a chunk file's checked index, refusing unstored inner chunks that would read as a
    fill value outside the vocabulary."""
    meta, count, vocab_size = chunk.meta, chunk.count, chunk.vocab_size
    frames = stored_frames(read_index(tail, size, meta, where))
    unstored = -(-count // meta.inner) - sum(i * meta.inner < count for i, _, _ in frames)
    if unstored and not 0 <= meta.fill_value < vocab_size:
        raise CacheCheckError(f"{unstored} inner chunks of its tokens are not stored and read as the fill "
                              f"value {meta.fill_value}, outside the tokenizer's vocabulary [0, {vocab_size})",
                              path=where)
    return frames


class _Frames:
    """Cuts a chunk file's stream into its frames (they tile its data part in index order: `read_index`),
    decoding each one holding tokens as soon as it is whole; what follows the last frame is kept as ``rest``
    (the index, to compare with the one read first; bounded by it)."""

    def __init__(self, chunk: ChunkCheck, frames: list[tuple[int, int, int]], where: str) -> None:
        self.chunk, self.frames, self.where = chunk, frames, where
        self.values = np.empty(chunk.meta.inner, np.dtype(chunk.meta.dtype).newbyteorder("<"))
        self.pending = bytearray()
        self.next = 0  # the first frame not yet decoded
        self.seen = 0
        self.rest = b""

    def feed(self, piece: bytes | memoryview) -> None:
        self.seen += len(piece)
        if self.next == len(self.frames):
            self._keep(piece)
            return
        self.pending += piece
        view, used = memoryview(self.pending), 0
        while self.next < len(self.frames) and len(view) - used >= self.frames[self.next][2]:
            i, _, nbytes = self.frames[self.next]
            self._decode(i, view[used:used + nbytes])
            used += nbytes
            self.next += 1
        left = bytes(view[used:])
        view.release()
        self.pending = bytearray() if self.next == len(self.frames) else bytearray(left)
        if self.next == len(self.frames):
            self._keep(left)

    def _decode(self, i: int, frame: memoryview) -> None:
        meta, count = self.chunk.meta, self.chunk.count
        if i * meta.inner < count:
            decode_inner(frame, meta, f"{self.where} inner chunk {i}", out=self.values)
            refuse_ids(self.values[:count - i * meta.inner], self.chunk.vocab_size, f"{self.where} inner chunk {i}")

    def _keep(self, piece: bytes | memoryview) -> None:
        if len(self.rest) + len(piece) > self.chunk.meta.index_bytes:  # longer than its index: it changed
            raise CacheFormatError("changed while it was read: run adopt again", path=self.where)
        self.rest += bytes(piece)
