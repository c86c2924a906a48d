"""The stream: global position ``i`` -> one sequence, a pure function (DESIGN.md, "order is a pure function").

``TokenStream`` composes the pieces and holds no iteration state::

    position i --mixture--> (subset s, per-subset index J)        mixture.py: cumulative apportionment
             J --epoch----> (epoch e = J // n_train, t = J % n_train)  every subset wraps on its own
             t --shuffle--> u, keyed by (seed, s, e)               permutation.py: hierarchical Feistel
             u --holdout--> window w (skipping held-out windows)   holdout.py
             w --packing--> tokens [w·L, w·L + L + 1) of s          packing.py, via cache.py

so the sequence at ``i`` depends on exactly (the selected shards and tokenizer, the mixture schedule, the
seed, ``seq_len``, the validation and shuffle settings, ``i``) — the `fingerprint` — and on nothing
else: not on ranks, workers, batch sizes or what was read before. Resuming is setting ``i``.

Cost grows with shards, not tokens: per subset, one cumulative token count per shard (numpy) and a few
integers; nothing per document or per sequence is ever built.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from marin_data.errors import LoaderConfigError
from marin_data.loader.cache import DecodedShardCache, ShardSource
from marin_data.loader.holdout import holdout_every, split_sizes, train_window1, val_window1
from marin_data.loader.mixture import DEFAULT_BLOCK, Mixture, Phase
from marin_data.loader.packing import Batch, ShardTable, SubsetTokens, new_batch, pack_rows, window_count
from marin_data.loader.permutation import SHUFFLES, derive_key, permute1, sub_key
from marin_data.manifest import Corpus, load_corpus, select_subsets, shards_fingerprint

__all__ = ["LoaderConfig", "TokenStream", "SPLITS", "STREAM_FORMAT"]

SPLITS = ("train", "validation")
STREAM_FORMAT = 1  # bump when the position -> sequence map changes, so old checkpoints are refused


@dataclass(frozen=True)
class LoaderConfig:
    """What the loader serves. Every field but ``batch_size`` is part of the stream's fingerprint."""

    seq_len: int = 4096  # tokens per sequence; each window holds seq_len + 1 (inputs and labels)
    batch_size: int = 8  # sequences per rank per step (not in the fingerprint: resume with any)
    mixture: Mapping[str, float] | Sequence[Phase] | None = None  # None: selected subsets by token count
    subsets: Sequence[str] | None = None  # names/globs to select; None: all subsets the mixture names
    seed: int = 0  # keys the shuffle and the order of mixture slots
    val_fraction: float = 0.001  # held out from training as the validation stream (holdout.py)
    shuffle: str = "hierarchical"  # a key of permutation.SHUFFLES
    shuffle_window: int = 4  # blocks shuffled together: the reader's working set per subset
    shuffle_block: int | None = None  # sequences per shuffle block; None: about one shard's worth
    mixture_block: int = DEFAULT_BLOCK  # smallest mixture block (raised to 1/w_min)


@dataclass(frozen=True)
class _Params:
    """Per-subset numbers the index kernels need, one ``[S]`` array each (``S`` = subsets)."""

    windows: np.ndarray  # int64: complete windows
    train: np.ndarray  # int64: training windows (one pass)
    val: np.ndarray  # int64: held-out windows
    block: np.ndarray  # int64: training shuffle block (about one shard of sequences)
    val_block: np.ndarray  # int64: held-out shuffle block (block // every)
    key: np.ndarray  # uint64: training shuffle key (seed, name); epoch e uses sub_key(key, e)
    val_key: np.ndarray  # uint64: held-out shuffle key (seed, name)
    holdout_key: np.ndarray  # uint64: keyed by the name only, so the held-out set does not depend on the seed


@numba.njit(cache=True, nogil=True)
def _train_windows(code, subset, index, train, windows, every, key, holdout_key, block, window):
    """Per-subset training index -> window: epoch, keyed shuffle of the epoch, then skip held-out windows."""
    out = np.empty(subset.shape[0], np.int64)
    for r in range(subset.shape[0]):
        s = subset[r]
        epoch, t = divmod(index[r], train[s])
        u = permute1(code, train[s], sub_key(key[s], np.uint64(epoch)), t, block[s], window)
        out[r] = train_window1(u, windows[s], every, holdout_key[s])
    return out


@numba.njit(cache=True, nogil=True)
def _val_windows(code, subset, index, val, every, val_key, holdout_key, val_block, window):
    """Held-out index -> window: one keyed shuffle (the validation stream is one pass)."""
    out = np.empty(subset.shape[0], np.int64)
    for r in range(subset.shape[0]):
        s = subset[r]
        u = permute1(code, val[s], val_key[s], index[r], val_block[s], window)
        out[r] = val_window1(u, every, holdout_key[s])
    return out


class TokenStream:
    """The pure map from stream positions to sequences of a local corpus; see the module docstring.

    Args:
        corpus: a `Corpus` or the path of a local corpus.
        config: what to serve.
        source: decoded shards; by default a `DecodedShardCache` under ``cache_dir``.
        cache_dir: where the default source keeps decoded shards (`cache.default_cache_dir`).

    Raises:
        InvalidManifestError: a subset pattern matches nothing.
        LoaderConfigError: bad settings, or a weighted subset too small for one training sequence.
    """

    def __init__(self, corpus: Corpus | str | os.PathLike, config: LoaderConfig = LoaderConfig(), *,
                 source: ShardSource | None = None, cache_dir: str | os.PathLike | None = None) -> None:
        corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus)
        if config.seq_len < 1 or config.batch_size < 1 or config.shuffle_window < 1:
            raise LoaderConfigError(f"seq_len, batch_size and shuffle_window must be >= 1: {config}")
        if config.shuffle not in SHUFFLES:
            raise LoaderConfigError(f"unknown shuffle {config.shuffle!r}; choose one of {', '.join(SHUFFLES)}")
        if config.shuffle_block is not None and config.shuffle_block < 1:
            raise LoaderConfigError(f"shuffle_block must be >= 1, got {config.shuffle_block}")
        self.config = config
        self.corpus = corpus
        self.source = source if source is not None else DecodedShardCache(corpus.root, cache_dir)
        try:
            self.every = holdout_every(config.val_fraction)
        except ValueError as e:
            raise LoaderConfigError(str(e), actual=config.val_fraction) from None
        names = select_subsets(corpus.manifest.subsets, config.subsets)
        totals = [corpus.manifest.subsets[n].tokens for n in names]
        schedule = config.mixture if config.mixture is not None else dict(zip(names, totals))
        mixture = Mixture(names, totals, schedule, seed=config.seed, block=config.mixture_block)
        self.mixture = mixture
        self.subsets: tuple[str, ...] = mixture.subsets
        by_subset: dict[str, list] = {n: [] for n in self.subsets}
        for shard in corpus.shards:
            if shard.subset in by_subset:
                by_subset[shard.subset].append(shard)
        # Each subset's token stream as shards: O(shards) numpy metadata, nothing per document.
        self.subset_tokens = tuple(SubsetTokens.from_shards(n, by_subset[n]) for n in self.subsets)
        self._params = self._index_params()
        self._code = SHUFFLES[config.shuffle]
        self.components = {
            "data": shards_fingerprint([s for n in self.subsets for s in by_subset[n]],
                                       corpus.manifest.tokenizer.sha256),
            "mixture": hashlib.sha256(mixture.canonical().encode()).hexdigest(),
            "seed": str(config.seed),
            "seq_len": str(config.seq_len),
            "split": json.dumps([STREAM_FORMAT, self.every, config.shuffle, config.shuffle_window,
                                 self._params.block.tolist()]),
        }
        self.fingerprint = hashlib.sha256(json.dumps(self.components, sort_keys=True).encode()).hexdigest()
        self._validation: Mixture | None = None
        self._table: ShardTable | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_table": None}

    def _index_params(self) -> _Params:
        seq_len, seed = self.config.seq_len, self.config.seed
        windows = np.array([window_count(t.tokens, seq_len) for t in self.subset_tokens], dtype=np.int64)
        train, val = split_sizes(windows, self.every)
        for t, n in zip(self.subset_tokens, train):
            if n < 1:
                raise LoaderConfigError(
                    f"subset {t.name!r} has {t.tokens} tokens: no training sequence of {seq_len} + 1 tokens "
                    "fits; give it weight 0, or lower seq_len", path=t.name, actual=t.tokens)
        if self.config.shuffle_block is not None:
            block = np.full(len(self.subset_tokens), self.config.shuffle_block, dtype=np.int64)
        else:  # about one shard of sequences, so a pass reads each shard in ~1-2 blocks
            block = np.array([max(1, round(t.tokens / max(1, len(t.shards)) / seq_len))
                              for t in self.subset_tokens], dtype=np.int64)

        def keys(seed: int, purpose: str) -> np.ndarray:
            return np.array([derive_key(seed, purpose, t.name) for t in self.subset_tokens], dtype=np.uint64)

        return _Params(windows=windows, train=train, val=val, block=block,
                       val_block=np.maximum(1, block // max(1, self.every)), key=keys(seed, "shuffle"),
                       val_key=keys(seed, "validation"), holdout_key=keys(0, "holdout"))

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
            held = {t.name: int(n) for t, n in zip(self.subset_tokens, self._params.val) if n}
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
        mixture = self._mixture(split)
        subset, index = mixture.locate(positions)
        p = self._params
        if mixture is self.mixture:
            window = _train_windows(self._code, subset, index, p.train, p.windows, self.every, p.key,
                                    p.holdout_key, p.block, self.config.shuffle_window)
        else:  # the validation mixture has only the subsets that hold some out
            subset = self._val_subsets[subset]
            window = _val_windows(self._code, subset, index, p.val, self.every, p.val_key, p.holdout_key,
                                  p.val_block, self.config.shuffle_window)
        return subset, window * self.config.seq_len

    def fill(self, positions: range | np.ndarray, out: Batch, split: str = "train") -> Batch:
        """Write the sequences at ``positions`` (``B`` of them) into ``out`` (``B`` rows) and return it."""
        subset, start = self.locate(positions, split)
        if self._table is None:  # per process: DataLoader workers build their own
            self._table = ShardTable(self.source, self.subset_tokens)
        pack_rows(self._table, subset, start, self.config.seq_len, out)
        out.index[:] = positions
        return out

    def read(self, positions: range | np.ndarray, split: str = "train") -> Batch:
        """The sequences at ``positions`` in fresh buffers (tests, inspection)."""
        if not isinstance(positions, range):
            positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        return self.fill(positions, new_batch(len(positions), self.config.seq_len), split)

    def sizes(self, split: str = "train") -> dict[str, int]:
        """Sequences per subset in one pass (epoch) of ``split``."""
        return dict(zip(self.subsets, (int(n) for n in (self._params.train if split == "train" else
                                                         self._params.val))))

    def served(self, position: int) -> dict[str, int]:
        """Training sequences of each subset served at positions ``< position``."""
        return dict(zip(self.subsets, (int(c) for c in self.mixture.served(position))))

    def passes(self, position: int) -> dict[str, float]:
        """How many passes (epochs) over its training sequences each subset has made by ``position``."""
        return {name: c / int(n) for (name, c), n in zip(self.served(position).items(), self._params.train)}
