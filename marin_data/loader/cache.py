"""The local decoded-shard store: each Parquet shard decoded once into memory-mappable arrays.

Why decode at all: Parquet decoding caps a core at ~124M tokens/s (docs/design.md, *measured*), while copying
from a memory map runs at 500M–1.3G tokens/s. So the first read of a shard decodes it into two ``.npy``
files — ``tokens`` (``[N]`` uint32) and ``offsets`` (``[docs + 1]`` int64, document ``d`` is
``tokens[offsets[d]:offsets[d+1]]``) — about 3x the Parquet bytes, and every later read is a memory map
served by the page cache. A Parquet shard's row groups are decoded on several cores at once (`ParquetDecoder`).

Files are named by the shard's sha256 (content addressing): two corpora holding the same shard share one
decode, and a re-sharded file can never be served from a stale decode. Before its first decode a shard's
SHA-256 and size are checked against the manifest, local or remote (``verify=False`` skips it; the hash
reads the file once more, from the page cache the decode then reads). Both files are written atomically
(`marin_data.fileio.atomic`), then a seal (``decoded.json``: the shard, its counts, each file's size and mtime),
and only a sealed decode whose files are still the ones the seal describes is ever mapped: a partial,
foreign or edited entry is decoded again. A file lock makes ranks and DataLoader workers on one host
decode each shard once instead of racing.

The first read does not wait for the disk: the shard is decoded straight into the temporary files (only
the ``tokens`` column; document ids are not needed), served at once from memory maps of those files, and
a background thread fsyncs and renames them into place. *Measured* on 3M-token shards: the two
fsyncs took as long as the decode itself, so waiting for them would halve the first pass.

What a shard file is and how it decodes is its format's (``decoder``, a `marin_data.formats.ShardDecoder`:
Parquet decodes its ``tokens`` column, a pinned Levanter cache's data chunk file is read whole, hashed and
decoded from those very bytes). A decode may also depend on files around the shard (a chunk file's part's
offsets, ``zarr.json`` and ledger): its seal then records a digest of them (the decoder's ``context``), and
a decode sealed for other surroundings is decoded again.

The interface the loader needs is one method, ``open(shard) -> DecodedShard``; the remote
shard cache (`marin_data.loader.remote.cache`) is a bounded LRU store behind the same method.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import mmap
import os
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from marin_data.corpus.records import ShardRecord
from marin_data.fileio.atomic import SafeDir, atomic_path, atomic_write_bytes
from marin_data.fileio.parquet_io import ArrowBytes
from marin_data.fileio.untrusted_json import loads
from marin_data.corpus.manifest import load_corpus
from marin_data.corpus.readers import LocalFiles
from marin_data.formats import ShardDecoder, decoder_for

__all__ = ["DecodedShard", "ShardSource", "DecodedShardCache", "default_cache_dir",
           "map_npy", "SEAL", "sealed"]

log = logging.getLogger(__name__)
SEAL = "decoded.json"  # written last, by the loader only: the decode beside it is whole and unchanged
_SEAL_LIMIT = 4096


@dataclass(frozen=True)
class DecodedShard:
    tokens: np.ndarray  # [N] uint32, memory-mapped
    offsets: np.ndarray  # [docs + 1] int64, memory-mapped; offsets[0] == 0, offsets[-1] == N


class ShardSource(Protocol):
    """Anything that can hand the loader a shard's decoded tokens (local or remote)."""

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
        verify: check each shard's SHA-256 and size against the index before decoding it.
        decoder: the corpus's shard decoder (`marin_data.formats.decoder_for`); by default the one the manifest
            at ``corpus_root`` names, made when first needed.
    """

    def __init__(self, corpus_root: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                 *, decoder: ShardDecoder | None = None, max_open: int = 256, verify: bool = True) -> None:
        self.corpus_root = Path(corpus_root)
        self._decoder = decoder
        self._default_dir = cache_dir is None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_open = max_open
        self.verify = verify
        self._open: OrderedDict[str, DecodedShard] = OrderedDict()
        self._publisher: tuple[int, ThreadPoolExecutor] | None = None  # `_own_thread`

    def __getstate__(self) -> dict:  # DataLoader workers get the settings, not open maps or threads
        return {**self.__dict__, "_open": OrderedDict(), "_publisher": None}

    @property
    def decoder(self) -> ShardDecoder:
        if self._decoder is None:
            corpus = load_corpus(self.corpus_root)
            self._decoder = decoder_for(corpus, LocalFiles(corpus.root, self.verify))
        return self._decoder

    def paths(self, shard: ShardRecord) -> tuple[Path, Path]:
        """``(tokens.npy, offsets.npy)`` of a shard's decode."""
        d = self.cache_dir / shard.sha256[:2] / shard.sha256
        return d / "tokens.npy", d / "offsets.npy"

    def context(self, shard: ShardRecord) -> str | None:
        """What a decode depends on besides the shard's bytes (sealed with it), if anything."""
        return self.decoder.context(shard)

    def ensure(self, shard: ShardRecord, body: ArrowBytes | None = None) -> None:
        """Decode ``shard`` unless its decode is already there, and wait until it is on disk. ``body``: the
        shard's bytes, fetched into memory and checked (`marin_data.transfer.body`), decoded instead of its file."""
        if not sealed(self.paths(shard)[0].parent, shard, self.context(shard)):
            self._decode(shard, wait=True, body=body)

    def open(self, shard: ShardRecord) -> DecodedShard:
        """The shard's decoded arrays, decoding it first if needed (most recently used stay mapped)."""
        hit = self._open.get(shard.sha256)
        if hit is not None:
            self._open.move_to_end(shard.sha256)
            return hit
        tokens_path, offsets_path = self.paths(shard)
        context = self.context(shard)
        if sealed(tokens_path.parent, shard, context):
            decoded = _map(tokens_path, offsets_path)
        else:
            with _pending_lock:
                pending = _pending.get(str(tokens_path))
            decoded = pending[1] if pending is not None and pending[0] == context else self._decode(shard, wait=False)
        self._open[shard.sha256] = decoded
        while len(self._open) > self.max_open:
            self._open.popitem(last=False)
        return decoded

    def wait(self) -> None:
        """Block until every decode this cache started is stored under its final name."""
        if self._publisher is not None and self._publisher[0] == os.getpid():
            self._publisher[1].shutdown(wait=True)
        self._publisher = None

    def _decode(self, shard: ShardRecord, *, wait: bool, body: ArrowBytes | None = None) -> DecodedShard:
        """Decode into temporary files, map them, and publish them (now, or on the background thread)."""
        from filelock import FileLock

        tokens_path, offsets_path = self.paths(shard)
        context = self.context(shard)
        if self._default_dir:
            _say_where(self.cache_dir)
        with SafeDir.of(tokens_path, self.cache_dir) as folder:  # no link below the cache folder is followed
            folder.regular("decode.lock")
        with _pending_lock:
            pending = _pending.get(str(tokens_path))
        if pending is not None:  # this process is still storing a decode there (of another context): let it end
            pending[2].wait()
        # thread_local=False: the publishing thread releases it, so other processes wait for the final files.
        lock = FileLock(str(tokens_path.parent / "decode.lock"), thread_local=False)
        lock.acquire()
        try:
            if sealed(tokens_path.parent, shard, context):  # another process decoded it while we waited
                lock.release()
                return _map(tokens_path, offsets_path)
            (tokens_path.parent / SEAL).unlink(missing_ok=True)  # a stale seal must not outlive its files
            with contextlib.ExitStack() as files:
                # Entered tokens first: the stack closes in reverse, publishing offsets before the tokens marker.
                tokens_tmp = files.enter_context(atomic_path(tokens_path, root=self.cache_dir))
                offsets_tmp = files.enter_context(atomic_path(offsets_path, root=self.cache_dir))
                self.decoder.decode_into(self.corpus_root / shard.path if body is None else body, shard, tokens_tmp,
                                         offsets_tmp, verify=self.verify)
                decoded = _map(tokens_tmp, offsets_tmp)
                publish = files.pop_all()
        except BaseException:
            lock.release()
            raise
        done = threading.Event()
        if wait:
            _publish(publish, lock, shard, str(tokens_path), context, done)
        else:
            with _pending_lock:
                _pending[str(tokens_path)] = (context, decoded, done)
            self._publisher = _own_thread(self._publisher, "marin-decode-publish")
            self._publisher[1].submit(_publish, publish, lock, shard, str(tokens_path), context, done)
        return decoded


# Decodes of this process still being stored, by final tokens path: (context, the decode, set once stored).
# Another cache object in this process (another rank's dataset, say) maps the same temporary files instead of
# waiting on the file lock, which the storing thread holds (filelock refuses a second acquisition from one
# thread as a deadlock); one that needs another context's decode there waits until it is stored.
_pending: dict[str, tuple[str | None, DecodedShard, threading.Event]] = {}
_pending_lock = threading.Lock()
_said: set[Path] = set()


def _say_where(folder: Path) -> None:
    """Name the default cache folder once per process: it grows to about 3x the Parquet bytes read."""
    if folder not in _said:
        _said.add(folder)
        log.warning("decoding shards into %s (about 3x their Parquet size; cache_dir= or MARIN_CACHE_DIR moves it)",
                    folder)


def _publish(files: contextlib.ExitStack, lock, shard: ShardRecord, key: str, context: str | None,
             done: threading.Event) -> None:
    """fsync and rename the decoded files into place (offsets, then tokens), seal them, then let other
    processes (and ``done``'s waiters) in."""
    try:
        files.close()
        folder = Path(key).parent
        stat = {name: _stat(folder / name) for name in ("tokens.npy", "offsets.npy")}
        seal = {"sha256": shard.sha256, "docs": shard.docs, "tokens": shard.tokens, "files": stat}
        if context is not None:  # a Parquet shard's seal keeps its old form
            seal["context"] = context
        atomic_write_bytes(folder / SEAL, json.dumps(seal, sort_keys=True).encode())
    except OSError as e:  # the maps stay valid; the next process to need the shard decodes it again
        log.warning("could not store the decode of %s: %s", shard.path, e)
    finally:
        with _pending_lock:
            _pending.pop(key, None)
        lock.release()
        done.set()


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def sealed(folder: Path, shard: ShardRecord | None = None, context: str | None = None) -> bool:
    """Whether ``folder`` holds a decode the loader wrote whole (of ``shard`` in ``context``, when given) and
    nobody changed since: its seal names the shard, counts and context, and each file still has the size and
    mtime sealed."""
    try:
        if (folder / SEAL).stat().st_size > _SEAL_LIMIT:
            return False
        seal = loads((folder / SEAL).read_bytes())
        files = seal["files"]
        if any(_stat(folder / name) != files[name] for name in ("tokens.npy", "offsets.npy")):
            return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return shard is None or (seal.get("sha256"), seal.get("docs"), seal.get("tokens"), seal.get("context")) == (
        shard.sha256, shard.docs, shard.tokens, context)


def _map(tokens_path: Path, offsets_path: Path) -> DecodedShard:
    return DecodedShard(np.asarray(map_npy(tokens_path)), np.asarray(map_npy(offsets_path)))


_MADV_POPULATE_READ = 22  # Linux 5.14+; Python 3.11's mmap module does not name it
_filler: tuple[int, ThreadPoolExecutor] | None = None  # `_own_thread`
_filler_lock = threading.Lock()


def _own_thread(pool: tuple[int, ThreadPoolExecutor] | None, name: str) -> tuple[int, ThreadPoolExecutor]:
    """``pool`` (process id, one-thread pool) if this process made it, else a new one: a forked child (a
    DataLoader worker) inherits the parent's pool object but not its thread, and would queue work forever."""
    if pool is None or pool[0] != os.getpid():
        pool = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix=name))
    return pool


def map_npy(path: Path) -> np.memmap:
    """A read-only memory map of a ``.npy`` file whose page tables a background thread fills.

    Without the fill, the first read of each part of the file in this process is a page fault (one per
    folio, which the kernel maps whole): the loader took 6 of them per 8 x 4096 batch at first and still 1-2
    through its first ~1,000 batches (*measured*), ~5-10 us each (estimated from the step times). Filling
    the tables of a 45 MB shard took 0.7-4 ms from the page cache, and of a whole 576 MB corpus about what
    touching every page did (13 vs 12-17 ms). On a thread, because a file not in the page cache is read
    whole by the fill (~28 ms per 45 MB shard here): the loader goes on meanwhile, and its own reads of
    pages not yet there fault as before. Where the kernel lacks ``MADV_POPULATE_READ`` nothing is filled.
    """
    global _filler
    array = np.load(path, mmap_mode="r")
    if array.nbytes and sys.platform == "linux":
        with _filler_lock:
            _filler = _own_thread(_filler, "marin-map-fill")
        # The task keeps the mapping, not the array: whoever watches the array's lifetime (the remote shard
        # cache pins a shard while its arrays live) sees it end when the caller drops it.
        _filler[1].submit(_fill_pages, array.ctypes.data, array.nbytes, array._mmap)
    return array


def _fill_pages(address: int, size: int, mapping: mmap.mmap | None = None) -> int:
    """Fill the page tables of ``size`` bytes at ``address``, inside ``mapping`` (kept open until done): 0,
    or the errno of a fill that failed (which only leaves the faults to come). ctypes releases the GIL."""
    start = address // mmap.PAGESIZE * mmap.PAGESIZE
    done = _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(address + size - start), _MADV_POPULATE_READ)
    return 0 if done == 0 else ctypes.get_errno()


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
