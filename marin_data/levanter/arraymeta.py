"""``zarr.json`` of a cache's arrays: the one Zarr v3 form Levanter writes, parsed strictly and rendered
byte for byte as tensorstore renders it.

The form: a 1-D array (shape 2^54), a regular chunk grid (134,217,728 elements: each chunk is one file,
``c/<k>``), one ``sharding_indexed`` codec with inner chunks of 262,144 elements encoded ``bytes``
(little endian) then ``blosc`` (lz4 clevel 5 shuffle in older Levanter, zstd clevel 1 in newer), and an index
of ``bytes`` + ``crc32c`` at the end of the file. Anything else is refused by name (`CacheFormatError`)
rather than read wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from marin_data.errors import CacheFormatError
from marin_data.levanter.jsonio import field, parse_json

__all__ = ["ZARR_JSON", "LEVANTER_SHAPE", "LEVANTER_CHUNK", "LEVANTER_INNER", "MAX_CHUNK", "MAX_INNER_CHUNKS",
           "Blosc", "LZ4", "ZSTD", "ArrayMeta", "parse_array_meta", "render_array_meta"]

ZARR_JSON = "zarr.json"
LEVANTER_SHAPE = 2 ** 54
LEVANTER_CHUNK = 134_217_728  # elements per chunk file
LEVANTER_INNER = 262_144  # elements per inner chunk (1 MiB of int32)
# The largest chunk file this reader decodes: 2^28 int64 elements are 2 GiB in memory.
MAX_CHUNK = 1 << 28
# The most inner chunks one chunk file may hold, so that its shard index (16 bytes an entry) is at most 1 MiB
# and its frames' overhead stays small beside its values. Levanter's hold 512; an inner chunk of one element
# would make a file of MAX_CHUNK elements a 4 GiB index, read whole before a single value.
MAX_INNER_CHUNKS = 1 << 16
_DTYPES = ("int32", "int64", "uint32", "uint16")
_CNAMES = ("lz4", "lz4hc", "blosclz", "zstd", "zlib", "snappy")
_SHUFFLES = ("noshuffle", "shuffle", "bitshuffle")
_LITTLE = {"name": "bytes", "configuration": {"endian": "little"}}


@dataclass(frozen=True)
class Blosc:
    """The blosc codec's settings as ``zarr.json`` records them (``typesize`` is the element size)."""

    cname: str = "lz4"
    clevel: int = 5
    shuffle: str = "shuffle"
    blocksize: int = 0


LZ4 = Blosc("lz4", 5)  # older Levanter; every Levanter reads it
ZSTD = Blosc("zstd", 1)  # newer Levanter


@dataclass(frozen=True)
class ArrayMeta:
    """One array of a cache: element type, extent, chunking and codec."""

    dtype: str  # numpy name: int32, int64
    chunk: int = LEVANTER_CHUNK  # elements per chunk file
    inner: int = LEVANTER_INNER  # elements per inner chunk
    blosc: Blosc | None = LZ4  # None: inner chunks stored raw
    shape: int = LEVANTER_SHAPE
    fill_value: int = 0
    separator: str = "/"  # chunk key: c/<k> (c.<k> with ".")
    index_crc32c: bool = True

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def inner_per_chunk(self) -> int:
        return self.chunk // self.inner

    @property
    def index_bytes(self) -> int:
        """Bytes of the shard index at the end of a chunk file: (offset, nbytes) u64 pairs, then crc32c."""
        return 16 * self.inner_per_chunk + 4 * self.index_crc32c

    def chunk_key(self, k: int) -> str:
        return f"c{self.separator}{k}"

    @property
    def codec(self) -> str:
        """How inner chunks are stored, for people: ``blosc lz4 clevel 5``, ``blosc zstd clevel 1`` or ``raw``."""
        return "raw" if self.blosc is None else f"blosc {self.blosc.cname} clevel {self.blosc.clevel}"


def _bad(what: str, where: str, actual: object = None) -> CacheFormatError:
    return CacheFormatError(f"unsupported zarr.json: {what}", path=where, actual=actual)


def parse_array_meta(data: bytes, where: str) -> ArrayMeta:
    """Parse ``zarr.json`` bytes, refusing any form but the one described in the module docstring."""
    doc = parse_json(data, where, limit=1 << 20)
    if doc.get("zarr_format") != 3 or doc.get("node_type") != "array":
        raise _bad("not a Zarr v3 array (zarr_format 3, node_type array)", where, doc.get("zarr_format"))
    if doc.get("storage_transformers"):
        raise _bad("storage transformers", where)
    dtype = field(doc, "data_type", str, where)
    if dtype not in _DTYPES:
        raise _bad(f"data_type {dtype!r} (a token cache holds {', '.join(_DTYPES)})", where, dtype)
    shape = field(doc, "shape", list, where)
    if len(shape) != 1 or isinstance(shape[0], bool) or not isinstance(shape[0], int) or not 0 < shape[0] <= 2**62:
        raise _bad(f"shape {shape!r:.60} (a 1-D array is expected)", where, shape)
    grid = field(doc, "chunk_grid", dict, where)
    chunk = _one_int(grid.get("configuration", {}).get("chunk_shape") if grid.get("name") == "regular" else None)
    if chunk is None or not 0 < chunk <= MAX_CHUNK:
        raise _bad(f"chunk grid {grid!r:.80} (regular, 1 to {MAX_CHUNK} elements)", where, grid)
    keys = field(doc, "chunk_key_encoding", dict, where, default={"name": "default"})
    separator = keys.get("configuration", {}).get("separator", "/") if keys.get("name") == "default" else None
    if separator not in ("/", "."):
        raise _bad(f"chunk_key_encoding {keys!r:.80}", where, keys)
    fill = field(doc, "fill_value", int, where)
    if not np.iinfo(dtype).min <= fill <= np.iinfo(dtype).max:
        raise _bad(f"fill_value {str(fill):.40} outside {dtype}", where, fill)
    codecs = field(doc, "codecs", list, where)
    if len(codecs) != 1 or not isinstance(codecs[0], dict) or codecs[0].get("name") != "sharding_indexed":
        raise _bad("codecs other than one sharding_indexed", where, codecs)
    conf = codecs[0].get("configuration")
    if not isinstance(conf, dict):
        raise _bad("sharding_indexed without a configuration", where)
    inner = _one_int(conf.get("chunk_shape"))
    if inner is None or inner <= 0 or chunk % inner:
        raise _bad(f"inner chunk {conf.get('chunk_shape')!r:.40} does not divide the chunk {chunk}", where)
    if chunk // inner > MAX_INNER_CHUNKS:
        raise _bad(f"inner chunks of {inner} elements: {chunk // inner:,} in a chunk file of {chunk:,}, more than "
                   f"the {MAX_INNER_CHUNKS:,} this reader accepts (a shard index of at most 1 MiB)", where, inner)
    if conf.get("index_location", "end") != "end":
        raise _bad("a shard index at the start of the file", where)
    index = conf.get("index_codecs")
    if index not in ([_LITTLE, {"name": "crc32c"}], [_LITTLE]):
        raise _bad(f"index_codecs {index!r:.100}", where, index)
    inner_codecs = conf.get("codecs")
    if not isinstance(inner_codecs, list) or not inner_codecs or inner_codecs[0] != _LITTLE or len(inner_codecs) > 2:
        raise _bad(f"inner codecs {inner_codecs!r:.100} (bytes little endian, then blosc)", where, inner_codecs)
    blosc = _blosc(inner_codecs[1], np.dtype(dtype).itemsize, where) if len(inner_codecs) == 2 else None
    return ArrayMeta(dtype=dtype, chunk=chunk, inner=inner, blosc=blosc, shape=shape[0], fill_value=fill,
                     separator=separator, index_crc32c=len(index) == 2)


def _one_int(value: object) -> int | None:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], int) and not isinstance(value[0], bool):
        return value[0]
    return None


def _blosc(codec: object, itemsize: int, where: str) -> Blosc:
    conf = codec.get("configuration") if isinstance(codec, dict) and codec.get("name") == "blosc" else None
    if not isinstance(conf, dict):
        raise _bad(f"inner codec {codec!r:.80} (blosc expected)", where, codec)
    b = Blosc(conf.get("cname"), conf.get("clevel"), conf.get("shuffle"), conf.get("blocksize", 0))
    if (b.cname not in _CNAMES or b.shuffle not in _SHUFFLES or not isinstance(b.clevel, int)
            or not 0 <= b.clevel <= 9 or not isinstance(b.blocksize, int) or b.blocksize < 0
            or conf.get("typesize", itemsize) != itemsize):
        raise _bad(f"blosc configuration {conf!r:.120}", where, conf)
    return b


def render_array_meta(meta: ArrayMeta) -> bytes:
    """``zarr.json`` as tensorstore writes it: sorted keys, no spaces, no newline."""
    inner = [_LITTLE]
    if meta.blosc is not None:
        b = meta.blosc
        inner.append({"name": "blosc", "configuration": {"blocksize": b.blocksize, "clevel": b.clevel,
                                                          "cname": b.cname, "shuffle": b.shuffle,
                                                          "typesize": meta.itemsize}})
    index = [_LITTLE, {"name": "crc32c"}] if meta.index_crc32c else [_LITTLE]
    keys = {"name": "default"} if meta.separator == "/" else {"name": "default",
                                                              "configuration": {"separator": meta.separator}}
    doc = {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [meta.chunk]}},
           "chunk_key_encoding": keys,
           "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [meta.inner], "codecs": inner,
                                                                      "index_codecs": index}}],
           "data_type": meta.dtype, "fill_value": meta.fill_value, "node_type": "array", "shape": [meta.shape],
           "zarr_format": 3}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
