"""One chunk file of a cache array (``input_ids/data/c/<k>``): the ``sharding_indexed`` format, read from
the very bytes that were hashed and written without a Zarr library.

A chunk file is its inner chunks' encoded bytes, then an index of ``(offset, nbytes)`` little-endian u64
pairs, one per inner chunk (``2^64-1`` twice: not stored, all fill value), then the index's crc32c. Every
field is hostile: the index must pass its crc32c and name disjoint ranges inside the file, and each blosc
frame must declare exactly an inner chunk's size before anything is decompressed (a frame may claim any
size), so decoding never allocates more than the chunk it was asked for. The stored frames must fill the
file's data part end to end, as every writer lays them out: bytes that no index entry names are a frame
whose entry was taken away (marked not stored: its tokens would read as the fill value). `decode_block`
decodes one blosc block of a frame (a lookup needs a few rows, not an inner chunk's 262,144).
"""

from __future__ import annotations

import ctypes
import struct

import crc32c
import numpy as np
from numcodecs import blosc

from marin_data.errors import CacheFormatError
from marin_data.levanter.arraymeta import ArrayMeta

__all__ = ["EMPTY", "read_index", "stored_frames", "decode_chunk", "decode_inner", "block_items", "decode_block",
           "encode_chunk"]

EMPTY = 2 ** 64 - 1
_SHUFFLE = {"noshuffle": blosc.NOSHUFFLE, "shuffle": blosc.SHUFFLE, "bitshuffle": blosc.BITSHUFFLE}
_BLOSC_HEADER = 16


def read_index(tail: bytes, file_size: int, meta: ArrayMeta, where: str) -> np.ndarray:
    """The ``[inner_per_chunk, 2]`` (offset, nbytes) table of a chunk file, from its last ``meta.index_bytes``
    bytes, checked: crc32c, every stored range inside the data part of the file, no two overlapping, and
    together covering all of it. Entries of an inner chunk that is not stored are ``EMPTY``."""
    n = meta.inner_per_chunk
    if len(tail) != meta.index_bytes or file_size < meta.index_bytes:
        raise CacheFormatError(f"{file_size} bytes, too short for a shard index of {meta.index_bytes}", path=where,
                               expected=meta.index_bytes, actual=file_size)
    table = np.frombuffer(tail, "<u8", count=2 * n).reshape(n, 2)
    if meta.index_crc32c:
        (want,) = struct.unpack("<I", tail[-4:])
        got = crc32c.crc32c(tail[:-4])
        if got != want:
            raise CacheFormatError(f"shard index crc32c {got:08x} != the recorded {want:08x}: a damaged file",
                                   path=where, expected=want, actual=got)
    stored = table[:, 0] != EMPTY
    if np.any(table[~stored, 1] != EMPTY):
        raise CacheFormatError("shard index entry with an offset of 'none' but a size", path=where)
    body = file_size - meta.index_bytes
    offsets, sizes = table[stored, 0], table[stored, 1]
    if np.any(sizes > body) or np.any(offsets > body - sizes):  # no overflow: sizes <= body checked first
        raise CacheFormatError(f"shard index points outside the file's {body} data bytes", path=where)
    order = np.argsort(offsets, kind="stable")
    starts, ends = offsets[order], (offsets + sizes)[order]
    if np.any(starts[1:] < ends[:-1]):
        raise CacheFormatError("shard index ranges overlap", path=where)
    previous_end = np.concatenate([np.zeros(1, np.uint64), ends])  # each range starts where the last one ended
    gaps = np.flatnonzero(previous_end != np.concatenate([starts, np.full(1, body, np.uint64)]))
    if len(gaps):
        at = int(previous_end[gaps[0]])
        raise CacheFormatError(f"bytes from offset {at} lie outside every inner chunk the shard index names: a "
                               "frame no entry references (an entry marked not stored reads as the fill value)",
                               path=where, actual=at)
    return table


def stored_frames(table: np.ndarray) -> list[tuple[int, int, int]]:
    """``(inner chunk, offset, nbytes)`` of every stored inner chunk of a checked index (`read_index`), in file
    order."""
    stored = np.flatnonzero(table[:, 0] != EMPTY)
    order = stored[np.argsort(table[stored, 0], kind="stable")]
    return [(int(i), int(table[i, 0]), int(table[i, 1])) for i in order]


def decode_chunk(data: bytes | memoryview, meta: ArrayMeta, count: int, where: str) -> np.ndarray:
    """The first ``count`` elements of a chunk file (as little-endian ``meta.dtype``) from its whole bytes.

    Raises:
        CacheFormatError: a bad index, a blosc frame of the wrong size or that does not decompress.
    """
    if not 0 <= count <= meta.chunk:
        raise ValueError(f"count {count} outside a chunk of {meta.chunk}")
    view = memoryview(data)
    table = read_index(bytes(view[len(view) - meta.index_bytes:]) if len(view) >= meta.index_bytes else b"",
                       len(view), meta, where)
    out = np.full(count, meta.fill_value, np.dtype(meta.dtype).newbyteorder("<"))
    scratch = np.empty(meta.inner, out.dtype)
    for i in range(-(-count // meta.inner)):
        offset, size = int(table[i, 0]), int(table[i, 1])
        if offset == EMPTY:
            continue
        lo, hi = i * meta.inner, min(count, (i + 1) * meta.inner)
        dest = out[lo:hi] if hi - lo == meta.inner else scratch
        decode_inner(view[offset:offset + size], meta, f"{where} inner chunk {i}", out=dest)
        if dest is scratch:
            out[lo:hi] = scratch[:hi - lo]
    return out


def decode_inner(frame: bytes | memoryview | None, meta: ArrayMeta, where: str,
                 out: np.ndarray | None = None) -> np.ndarray:
    """One inner chunk (``meta.inner`` elements) from its stored bytes; ``None`` (not stored) is all fill value.
    What a ranged read of one index entry hands back, so a lookup never decodes a whole chunk file. ``out``
    (``meta.inner`` elements of the array's dtype, little-endian) is reused when given."""
    dtype = np.dtype(meta.dtype).newbyteorder("<")
    if out is None or out.shape != (meta.inner,) or out.dtype != dtype:
        out = np.empty(meta.inner, dtype)
    if frame is None:
        out[:] = meta.fill_value
        return out
    frame, want = memoryview(frame), meta.inner * meta.itemsize
    if meta.blosc is None:
        if len(frame) != want:
            raise CacheFormatError(f"{len(frame)} bytes stored, {want} expected", path=where)
        out.view(np.uint8)[:] = np.frombuffer(frame, np.uint8)
    else:
        _unblosc(frame, out, want, where)
    return out


def _checked(frame: memoryview, want: int, where: str) -> tuple[int, int]:
    """A blosc frame's typesize and block size, once its header says it decodes to exactly ``want`` bytes from
    exactly the bytes stored."""
    if len(frame) < _BLOSC_HEADER:
        raise CacheFormatError(f"{len(frame)} bytes: shorter than a blosc header", path=where)
    nbytes, blocksize, cbytes = struct.unpack("<III", frame[4:16])
    if nbytes != want or cbytes != len(frame):
        raise CacheFormatError(f"blosc frame claims {nbytes} bytes from {cbytes} (an inner chunk is {want}, "
                               f"{len(frame)} stored)", path=where, expected=want, actual=nbytes)
    return frame[3], blocksize


def _unblosc(frame: memoryview, dest: np.ndarray, want: int, where: str) -> None:
    _checked(frame, want, where)
    try:
        blosc.decompress(frame, dest)
    except (RuntimeError, ValueError) as e:
        raise CacheFormatError(f"blosc cannot decompress it: {e}", path=where) from e


def _blosc_getitem():
    """c-blosc's ``blosc_getitem`` (decode the blocks holding a range of items), which the numcodecs extension
    exports but numcodecs 0.16 no longer wraps (it dropped ``decompress_partial``); None where it is absent.
    ctypes releases the GIL during the call."""
    try:
        fn = ctypes.CDLL(blosc.__file__).blosc_getitem
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p], ctypes.c_int
    return fn


_GETITEM = _blosc_getitem()


def block_items(frame: bytes | None, meta: ArrayMeta, where: str) -> int:
    """Elements per block of an inner chunk's stored ``frame`` as `decode_block` decodes it: the frame's blosc
    block, or the whole inner chunk (not stored, stored raw, a blosc typesize other than the element's, or no
    ``blosc_getitem``). Checks the frame's header as `decode_inner` does."""
    if frame is None or meta.blosc is None:
        return meta.inner
    typesize, blocksize = _checked(memoryview(frame), meta.inner * meta.itemsize, where)
    if _GETITEM is None or typesize != meta.itemsize or not 0 < blocksize < meta.inner * meta.itemsize \
            or blocksize % typesize:
        return meta.inner
    return blocksize // typesize


def decode_block(frame: bytes | None, meta: ArrayMeta, j: int, items: int, where: str) -> np.ndarray:
    """Elements ``[j * items, (j + 1) * items)`` of an inner chunk (fewer in its last block), ``items`` from
    `block_items`: one blosc block decoded, or the whole inner chunk where ``items`` is ``meta.inner``."""
    if items == meta.inner:
        return decode_inner(frame, meta, where)
    out = np.empty(min(items, meta.inner - j * items), np.dtype(meta.dtype).newbyteorder("<"))
    src = np.frombuffer(frame, np.uint8)  # a read-only buffer's address, without a copy
    got = _GETITEM(src.ctypes.data, j * items, len(out), out.ctypes.data)
    if got != out.nbytes:
        raise CacheFormatError(f"blosc cannot decompress block {j} of it (error {got})", path=where)
    return out


def encode_chunk(values: np.ndarray, meta: ArrayMeta) -> bytes:
    """A chunk file holding ``values`` (at most ``meta.chunk`` elements) from its first element on; inner
    chunks past the values are not stored, the last one is padded with the fill value."""
    if len(values) > meta.chunk:
        raise ValueError(f"{len(values)} values do not fit a chunk of {meta.chunk}")
    values = np.ascontiguousarray(values, np.dtype(meta.dtype).newbyteorder("<"))
    table = np.full((meta.inner_per_chunk, 2), EMPTY, "<u8")
    parts, pos = [], 0
    for i in range(-(-len(values) // meta.inner)):
        piece = values[i * meta.inner:(i + 1) * meta.inner]
        if len(piece) < meta.inner:
            piece = np.concatenate([piece, np.full(meta.inner - len(piece), meta.fill_value, piece.dtype)])
        if meta.blosc is None:
            encoded = piece.tobytes()
        else:
            b = meta.blosc
            encoded = blosc.compress(piece, b.cname.encode(), b.clevel, _SHUFFLE[b.shuffle], b.blocksize)
        table[i] = (pos, len(encoded))
        parts.append(encoded)
        pos += len(encoded)
    index = table.tobytes()
    if meta.index_crc32c:
        index += struct.pack("<I", crc32c.crc32c(index))
    return b"".join(parts) + index
