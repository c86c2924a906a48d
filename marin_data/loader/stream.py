"""The stream: global position ``i`` -> one sequence, a pure function (docs/design.md, "The loader").

``TokenStream`` composes the pieces and holds no iteration state::

    position i --mixture--> (subset s, per-subset index J)        mixture.py: cumulative apportionment
             J --epoch----> (epoch e = J // n_train, t = J % n_train)  every subset wraps on its own
             t --shuffle--> u, keyed by (seed, s, e)               shuffle/: shards, then sequences
             u --holdout--> window w (skipping held-out windows)   holdout.py
             w --packing--> tokens [j·L, j·L + L + 1) of the shard holding w, j its window there
                            (or, packing="levanter", the subset's tokens [w·L, (w+1)·L))
                                                                   packing.py, via cache.py

so the sequence at ``i`` depends on exactly (the selected shards and tokenizer, the mixture schedule, the
seed, ``seq_len``, the validation and shuffle settings, ``i``) — the `fingerprint` — and on nothing
else: not on ranks, workers, batch sizes or what was read before. Resuming is setting ``i``.

Cost grows with shards, not tokens: per subset, a few cumulative counts per shard (tokens, windows, each
split's sequences) and, per epoch being read, the shuffled order of its shards; nothing per document or per
sequence is ever built.

Which files a subset's shards are, in which order, and how each decodes is the corpus's format's
(`marin_data.formats.decoder_for`): Parquet shards by path, a pinned Levanter cache's data chunk files in the
order of its cells' flat tokens. A source that no manifest pins is refused (`load_local`): no hash vouches
for its bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from marin_data.corpus.manifest import Corpus, load_corpus, shards_fingerprint
from marin_data.corpus.records import ShardRecord
from marin_data.corpus.names import select_subsets
from marin_data.errors import InvalidManifestError, LoaderConfigError
from marin_data.layout import MANIFEST
from marin_data.corpus.readers import LocalFiles
from marin_data.formats import ShardDecoder, decoder_for, refuse_unpinned
from marin_data.formats.documents import Documents
from marin_data.loader.cache import DecodedShardCache, ShardSource
from marin_data.loader.config import LoaderConfig
from marin_data.loader.holdout import held_before, holdout_every, train_window1, val_window1
from marin_data.loader.mixture import Mixture, Phase
from marin_data.loader.packing import DEFAULT_PACKING, PACKINGS, Batch, ShardTable, SubsetTokens, new_batch, \
    pack_rows, shard_rows, window_shards
from marin_data.loader.ranks import RANK_ROWS, RankRows
from marin_data.loader.shuffle import SHUFFLES
from marin_data.loader.shuffle.feistel import feistel1
from marin_data.loader.shuffle.hierarchical import hierarchical1, shard_order
from marin_data.loader.shuffle.keys import derive_key, sub_key

__all__ = ["LoaderConfig", "TokenStream", "SPLITS", "STREAM_FORMAT", "SERVES_CHECKED", "load_local"]

SPLITS = ("train", "validation")
STREAM_FORMAT = 2  # bump when the position -> sequence map changes, so old checkpoints are refused


@dataclass(frozen=True)
class _Ragged:
    """``S`` int64 arrays of different lengths back to back: array ``s`` is ``flat[offsets[s]:offsets[s+1]]``.

    Plain arrays rather than numba typed lists: a jitted call unboxes an array far faster than a list."""

    flat: np.ndarray
    offsets: np.ndarray  # [S + 1]

    @classmethod
    def of(cls, arrays: Sequence[np.ndarray]) -> _Ragged:
        sizes = [len(a) for a in arrays]
        flat = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        return cls(flat, np.concatenate(([0], np.cumsum(sizes))).astype(np.int64))

    def __getitem__(self, s: int) -> np.ndarray:
        return self.flat[self.offsets[s] : self.offsets[s + 1]]


@dataclass(frozen=True)
class _Split:
    """One split's per-subset index arrays."""

    items: np.ndarray  # [S] int64: sequences in one pass
    starts: _Ragged  # S x [shards + 1]: shard k holds the split's sequences [starts[k], starts[k+1])
    key: np.ndarray  # [S] uint64: shuffle key (seed, purpose, name); training epoch e uses sub_key(key, e)
    training: bool


@numba.njit(cache=True, inline="always")
def _part(flat, offsets, s):
    return flat[offsets[s] : offsets[s + 1]]


@numba.njit(cache=True, nogil=True)
def _locate(code, split_training, items, starts, starts_off, key, window, subset, index, windows, wstarts,
            wstarts_off, first, first_off, every, holdout_key, seq_len, order, order_off, groups,
            groups_off, slot_epoch, out):
    """Per-subset index -> first stream token of its window, into ``out``; returns how many rows it skipped.

    Training index ``J`` is epoch ``J // n``, pass position ``J % n``; the validation stream is one pass. A
    position goes through the epoch's shuffle to a sequence of the split, then to its window (skipping the
    other split's windows), then to the window's first token (``first``: each shard's first window's, the
    packing's `Packing.windows`). The hierarchical shuffle reads the epoch's `ShardOrder` from slot
    ``2s + epoch % 2`` (so a batch may straddle two epochs of a subset); a row whose order is not in its slot
    is left at -1 for the caller to load. (Ragged arrays come as flat + offsets.)
    """
    missing = 0
    for r in range(subset.shape[0]):
        s = subset[r]
        n = items[s]
        epoch, t = (index[r] // n, index[r] % n) if split_training else (0, index[r])
        k = sub_key(key[s], np.uint64(epoch)) if split_training else key[s]
        if code == 0:
            slot = 2 * s + epoch % 2
            if slot_epoch[slot] != epoch:
                out[r] = -1
                missing += 1
                continue
            u = hierarchical1(_part(starts, starts_off, s), _part(order, order_off, slot),
                              _part(groups, groups_off, slot), k, window, t)
        elif code == 1:
            u = feistel1(n, k, t)
        else:
            u = t
        if split_training:
            w = train_window1(u, windows[s], every, holdout_key[s])
        else:
            w = val_window1(u, every, holdout_key[s])
        ws = _part(wstarts, wstarts_off, s)
        j = np.searchsorted(ws, w, side="right") - 1
        out[r] = _part(first, first_off, s)[j] + (w - ws[j]) * seq_len
    return missing


class _Orders:
    """Each subset's `ShardOrder` for the two latest epochs it was read in (one split): slot ``2s + e % 2``."""

    def __init__(self, shards: Sequence[int], window: int) -> None:
        slots = [n for n in shards for _ in range(2)]
        self.order = _Ragged.of([np.zeros(n) for n in slots])
        self.groups = _Ragged.of([np.zeros(-(-n // window) + 1) for n in slots])
        self.epoch = np.full(len(slots), -1, dtype=np.int64)
        self.window = window

    def load(self, s: int, epoch: int, starts: np.ndarray, key: int) -> None:
        slot = 2 * s + epoch % 2
        order = shard_order(starts, key, self.window)
        self.order[slot][:] = order.order
        self.groups[slot][:] = order.groups
        self.epoch[slot] = epoch


SERVES_CHECKED = "the loader checks every shard it serves"  # why a cache must be pinned to be loaded


def load_local(path: str | os.PathLike, *, manifest_sha256: str | None = None) -> Corpus:
    """A local corpus for the loader (`load_corpus`): Parquet, or a Levanter cache pinned in place.

    Raises:
        UnpinnedCacheError: ``path`` holds a Levanter cache or store that was never pinned: nothing vouches
            for its bytes, and the loader checks every shard against a SHA-256 (`marin-data adopt` pins it in
            place, rewriting none of its files).
        InvalidManifestError: as `load_corpus`.
    """
    try:
        return load_corpus(path, manifest_sha256=manifest_sha256)
    except InvalidManifestError:
        if not (Path(path) / MANIFEST).exists():
            refuse_unpinned(path, SERVES_CHECKED)
        raise


class TokenStream:
    """The pure map from stream positions to sequences of a local corpus; see the module docstring.

    Args:
        corpus: a `Corpus` or the path of a local corpus (a Parquet corpus or a pinned Levanter cache).
        config: what to serve.
        source: decoded shards; by default a `DecodedShardCache` under ``cache_dir``.
        cache_dir: where the default source keeps decoded shards (`cache.default_cache_dir`).
        verify_shards: the default source checks each shard's SHA-256 against the index before its first use
            (for a pinned cache, also each ledger, ``zarr.json`` and offsets chunk file it reads).
        decoder: the corpus's shard decoder (the remote stream's reads over the network); by default its
            format's (`marin_data.formats.decoder_for`), reading the corpus's directory.

    Raises:
        InvalidManifestError: a subset pattern matches nothing; a pinned cache's index and ledgers disagree.
        UnpinnedCacheError: the path holds a Levanter cache that was never pinned (`load_local`).
        LoaderConfigError: bad settings, or a weighted subset too small for one training sequence.
    """

    default_rank_rows = "position"  # a local corpus costs nothing to read from many ranks (`ranks`)

    def __init__(self, corpus: Corpus | str | os.PathLike, config: LoaderConfig = LoaderConfig(), *,
                 source: ShardSource | None = None, cache_dir: str | os.PathLike | None = None,
                 verify_shards: bool = True, decoder: ShardDecoder | None = None) -> None:
        corpus = corpus if isinstance(corpus, Corpus) else load_local(corpus)
        counts = {"seq_len": config.seq_len, "batch_size": config.batch_size, "shuffle_window": config.shuffle_window}
        wrong = {k: v for k, v in counts.items() if not isinstance(v, (int, np.integer)) or isinstance(v, bool)}
        if wrong:
            raise LoaderConfigError(f"{', '.join(f'{k}={v!r}' for k, v in wrong.items())}: must be whole numbers",
                                    actual=wrong)
        if config.seq_len < 1 or config.batch_size < 1 or config.shuffle_window < 1:
            raise LoaderConfigError(f"seq_len, batch_size and shuffle_window must be >= 1: {config}")
        if not isinstance(config.segments, bool):
            raise LoaderConfigError(f"segments={config.segments!r}: must be True or False", actual=config.segments)
        if config.shuffle not in SHUFFLES:
            raise LoaderConfigError(f"unknown shuffle {config.shuffle!r}; choose one of {', '.join(SHUFFLES)}")
        if config.rank_rows not in ("auto", *RANK_ROWS):
            raise LoaderConfigError(f"unknown rank_rows {config.rank_rows!r}; choose auto, {', '.join(RANK_ROWS)}")
        if config.packing not in PACKINGS:
            raise LoaderConfigError(f"unknown packing {config.packing!r}; choose one of {', '.join(PACKINGS)}")
        if config.segments and not PACKINGS[config.packing].segments:
            raise LoaderConfigError(f"packing={config.packing!r} has no segment ids: its windows run across shard "
                                    "ends, where a document's start is not recorded; use segments=False")
        self.config = config
        self.corpus = corpus
        if decoder is None:
            decoder = decoder_for(corpus, LocalFiles(corpus.root, verify_shards))
        self.decoder = decoder
        self.source = source if source is not None else DecodedShardCache(corpus.root, cache_dir, decoder=decoder,
                                                                           verify=verify_shards)
        try:
            self.every = holdout_every(config.val_fraction)
        except ValueError as e:
            raise LoaderConfigError(str(e), actual=config.val_fraction) from None
        names = select_subsets(corpus.manifest.subsets, config.subsets)
        totals = [corpus.manifest.subsets[n].tokens for n in names]
        schedule = config.mixture if config.mixture is not None else dict(zip(names, totals))
        mixture = Mixture(names, totals, schedule, seed=config.seed, block=config.mixture_block)
        if config.mixture is not None:
            off = {p: total for p, total in enumerate(mixture.weight_sums) if abs(total - 1) > 1e-9}
            if off:
                warnings.warn(f"mixture weights sum to {', '.join(f'{t:g} (phase {p})' for p, t in off.items())}, "
                              "not 1: each phase is normalised to its sum", stacklevel=2)
        self.mixture = mixture
        self.subsets: tuple[str, ...] = mixture.subsets
        files: dict[str, list] = {n: [] for n in self.subsets}  # every file of each subset (the fingerprint's)
        for shard in corpus.shards:
            if shard.subset in files:
                files[shard.subset].append(shard)
        # Each subset's token stream as shards: O(shards) numpy metadata, nothing per document.
        ordered = dict(zip(self.subsets, decoder.order(self.subsets)))
        self.subset_tokens = tuple(SubsetTokens.from_shards(n, ordered[n]) for n in self.subsets)
        self.shards = tuple(s for t in self.subset_tokens for s in t.shards)  # the selected shards, subset by subset
        self._index_arrays()
        self._code = SHUFFLES.index(config.shuffle)  # `_locate` dispatches on the position in SHUFFLES
        self.components = {
            "data": shards_fingerprint([s for n in self.subsets for s in files[n]], corpus.manifest.tokenizer.sha256),
            "mixture": hashlib.sha256(mixture.canonical().encode()).hexdigest(),
            "seed": str(config.seed),
            "seq_len": str(config.seq_len),
            "split": json.dumps([STREAM_FORMAT, self.every, config.shuffle, config.shuffle_window]),
        }
        if config.packing != DEFAULT_PACKING:  # named only when not the default: older states stay valid
            self.components["packing"] = config.packing
        self.fingerprint = hashlib.sha256(json.dumps(self.components, sort_keys=True).encode()).hexdigest()
        self._validation: Mixture | None = None
        self._table: ShardTable | None = None
        self._orders: dict[str, _Orders] = {}  # per split, built when first read

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_table": None}

    def _index_arrays(self) -> None:
        """Per subset: its windows shard by shard, and each split's sequences shard by shard (`_Split`)."""
        seq_len, seed = self.config.seq_len, self.config.seed
        packing = PACKINGS[self.config.packing]
        grids = [packing.windows(t.cumulative, seq_len) for t in self.subset_tokens]
        wstarts = [starts for starts, _ in grids]
        self._windows = np.array([w[-1] for w in wstarts], dtype=np.int64)
        self._holdout_key = self._keys(0, "holdout")  # by name only: the held-out set ignores the seed
        held = [held_before(w, n, self.every, k) for w, n, k in zip(wstarts, self._windows, self._holdout_key)]
        self._splits = {
            "train": _Split(items=self._windows - [h[-1] for h in held], starts=_Ragged.of([w - h for w, h in
                            zip(wstarts, held)]), key=self._keys(seed, "shuffle"), training=True),
            "validation": _Split(items=np.array([h[-1] for h in held], dtype=np.int64), starts=_Ragged.of(held),
                                 key=self._keys(seed, "validation"), training=False),
        }
        for t, n in zip(self.subset_tokens, self._splits["train"].items):
            if n < 1:
                where = "in one of its shards" if packing.extra else "in it"
                raise LoaderConfigError(
                    f"subset {t.name!r} has {t.tokens} tokens: no training sequence of {seq_len}"
                    f"{' + 1' * packing.extra} tokens fits {where}; give it weight 0, or lower seq_len",
                    path=t.name, actual=t.tokens)
        self._wstarts = _Ragged.of(wstarts)
        self._first = _Ragged.of([first for _, first in grids])
        self._cumulative = _Ragged.of([t.cumulative for t in self.subset_tokens])

    def _keys(self, seed: int, purpose: str) -> np.ndarray:
        return np.array([derive_key(seed, purpose, t.name) for t in self.subset_tokens], dtype=np.uint64)

    @property
    def rank_rows(self) -> str:
        """How a global batch's rows are dealt to ranks (`ranks.RANK_ROWS`): the config's, or this stream's default."""
        return self.default_rank_rows if self.config.rank_rows == "auto" else self.config.rank_rows

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    def stop(self, split: str = "train") -> int | None:
        """One past the stream's last position; None when it never ends (an unbounded last phase)."""
        return self._mixture(split).stop

    def _mixture(self, split: str) -> Mixture:
        if split == "train":
            return self.mixture
        if split != "validation":
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if self._validation is None:
            # Each subset's held-out sequences exactly once, interleaved in proportion to their counts so that
            # the first few validation batches already cover every subset; quotas are whole at the end.
            held = {t.name: int(n) for t, n in zip(self.subset_tokens, self._splits["validation"].items) if n}
            if not held:
                raise LoaderConfigError("no sequences are held out (val_fraction=0 or subsets too small)")
            self._validation = Mixture(list(held), list(held.values()), [Phase(held, sum(held.values()))],
                                       seed=self.config.seed)
            self._val_subsets = np.array([self.subsets.index(n) for n in held], dtype=np.int64)
        return self._validation

    def locate(self, positions: range | np.ndarray, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """``(subset index [k] int64, first stream token of the window [k] int64)`` of stream positions.

        ``positions``: an array, or a ``range`` (faster for a batch; see `Mixture.locate`).
        """
        subset, index = self._mixture(split).locate(positions)
        if split == "validation":  # the validation mixture has only the subsets that hold some out
            subset = self._val_subsets[subset]
        sp = self._splits[split]
        orders = self._orders.get(split)
        if orders is None:
            orders = self._orders[split] = _Orders([len(t.shards) for t in self.subset_tokens],
                                                   self.config.shuffle_window)
        start = np.empty(len(subset), np.int64)
        rows = np.arange(len(subset))
        while True:
            out = np.empty(len(rows), np.int64)
            missing = _locate(self._code, sp.training, sp.items, sp.starts.flat, sp.starts.offsets, sp.key,
                              self.config.shuffle_window, subset[rows], index[rows], self._windows,
                              self._wstarts.flat, self._wstarts.offsets, self._first.flat,
                              self._first.offsets, self.every, self._holdout_key, self.config.seq_len,
                              orders.order.flat, orders.order.offsets, orders.groups.flat, orders.groups.offsets,
                              orders.epoch, out)
            start[rows] = out
            if not missing:
                return subset, start
            rows = rows[out < 0]  # rows of an epoch whose shard order is not loaded: load the first, again
            s = int(subset[rows[0]])
            epoch = int(index[rows[0]] // sp.items[s]) if sp.training else 0
            key = sub_key(sp.key[s], np.uint64(epoch)) if sp.training else sp.key[s]
            orders.load(s, epoch, sp.starts[s], key)

    def shard_ids(self, positions: range | np.ndarray, split: str = "train") -> np.ndarray:
        """The shard (an index into `shards`) holding the first token of the window at each of ``positions``:
        ``[k]`` int64."""
        subset, start = self.locate(positions, split)
        return shard_rows(subset, start, self._cumulative.flat, self._cumulative.offsets)[0]

    def shards_read(self, positions: range | np.ndarray, split: str = "train") -> np.ndarray:
        """Every shard (sorted indices into `shards`) that the sequences at ``positions`` read: with
        ``"levanter"`` packing a window may run on into the next shards."""
        subset, start = self.locate(positions, split)
        length = self.config.seq_len + PACKINGS[self.config.packing].extra
        return np.unique(window_shards(subset, start, length, self._cumulative.flat, self._cumulative.offsets))

    def fill(self, positions: range | np.ndarray, out: Batch, split: str = "train") -> Batch:
        """Write the sequences at ``positions`` (``B`` of them) into ``out`` (``B`` rows) and return it."""
        subset, start = self.locate(positions, split)
        if self._table is None:  # per process: DataLoader workers build their own
            self._table = ShardTable(self.source, self.shards, self._cumulative.flat, self._cumulative.offsets,
                                     vocab_size=self.config.vocab_size or self.corpus.manifest.tokenizer.vocab_size)
        pack_rows(self._table, subset, start, self.config.seq_len, out, self.config.packing)
        out.index[:] = positions
        return out

    def release(self) -> None:
        """Unmap every shard this stream has open (the next read maps what it needs again): a bounded shard cache
        may then evict them."""
        self._table = None

    def fill_batch(self, start: int, ranks: RankRows, out: Batch, split: str = "train") -> Batch:
        """Write this rank's rows of the global batch that starts at ``start`` into ``out`` and return it."""
        return self.fill(ranks.rows(self, start, split), out, split)

    def worker_init(self, worker: int, workers: int) -> None:
        """Called in DataLoader worker ``worker`` of ``workers`` before it builds batches: a local stream's
        decodes and maps are per process already; a remote one opens the worker's own cache."""

    def close(self) -> None:
        """Release what the stream holds besides memory: a remote stream's cache threads and directory lock; a
        local stream holds nothing."""

    def prepare(self, start: int, ranks: RankRows, split: str = "train") -> None:
        """Get ready to serve the batch at ``start`` and the next ones: a remote stream's cache starts fetching
        their shards in the background; a local stream has nothing to do."""

    def read(self, positions: range | np.ndarray, split: str = "train") -> Batch:
        """The sequences at ``positions`` in fresh buffers (tests, inspection)."""
        if not isinstance(positions, range):
            positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        return self.fill(positions, new_batch(len(positions), self.config.seq_len, self.config.segments), split)

    def documents(self) -> Documents:
        """Where this stream's documents lie (`marin_data.formats.documents`), as its corpus's format finds them."""
        return self.decoder.documents(self)

    def shard_files(self) -> Callable[[ShardRecord], object]:
        """Where a shard's bytes are read at random from (what `documents` reads a few row groups of): the
        path of its local file."""
        root = self.corpus.root
        return lambda shard: str(root / shard.path)

    def train_order(self, s: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int]:
        """What `_locate` reads of subset ``s`` (`marin_data.loader.trace.Trace.positions` inverts it)."""
        sp = self._splits["train"]
        return (self._wstarts[s], self._first[s], sp.starts[s], int(sp.key[s]), int(self._windows[s]),
                int(self._holdout_key[s]))

    def sizes(self, split: str = "train") -> dict[str, int]:
        """Sequences per subset in one pass (epoch) of ``split``."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        return dict(zip(self.subsets, (int(n) for n in self._splits[split].items)))

    def served(self, position: int) -> dict[str, int]:
        """Training sequences of each subset served at positions ``< position``."""
        return dict(zip(self.subsets, (int(c) for c in self.mixture.served(position))))

    def passes(self, position: int) -> dict[str, float]:
        """How many passes (epochs) over its training sequences each subset has made by ``position``."""
        return {name: c / int(n) for (name, c), n in zip(self.served(position).items(), self._splits["train"].items)}
