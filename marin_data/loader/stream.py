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
from pathlib import Path

import numpy as np

from marin_data.errors import LoaderConfigError
from marin_data.loader import holdout
from marin_data.loader.cache import DecodedShardCache, ShardSource
from marin_data.loader.mixture import DEFAULT_BLOCK, Mixture, Phase
from marin_data.loader.packing import Batch, SubsetTokens, new_batch, pack_rows, window_count
from marin_data.loader.permutation import SHUFFLES, derive_key, shuffle, sub_key
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
class _Subset:
    tokens: SubsetTokens
    windows: int
    train: int  # training windows
    val: int  # held-out windows
    block: int  # shuffle block (training); held-out blocks are block // every
    key: int  # shuffle key (seed, name)
    holdout_key: int  # keyed by the name only: the held-out set does not depend on the seed


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
            self.every = holdout.holdout_every(config.val_fraction)
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
        self._subsets = tuple(self._subset(n, by_subset[n]) for n in self.subsets)
        self._n_train = np.array([s.train for s in self._subsets], dtype=np.int64)
        self.components = {
            "data": shards_fingerprint([s for n in self.subsets for s in by_subset[n]],
                                       corpus.manifest.tokenizer.sha256),
            "mixture": hashlib.sha256(mixture.canonical().encode()).hexdigest(),
            "seed": str(config.seed),
            "seq_len": str(config.seq_len),
            "split": json.dumps([STREAM_FORMAT, self.every, config.shuffle, config.shuffle_window,
                                 [s.block for s in self._subsets]]),
        }
        self.fingerprint = hashlib.sha256(json.dumps(self.components, sort_keys=True).encode()).hexdigest()
        self._validation: Mixture | None = None

    def _subset(self, name: str, shards: list) -> _Subset:
        tokens = SubsetTokens.from_shards(name, shards)
        windows = window_count(tokens.tokens, self.config.seq_len)
        train, val = holdout.split_sizes(windows, self.every)
        if train < 1:
            raise LoaderConfigError(
                f"subset {name!r} has {tokens.tokens} tokens: no training sequence of {self.config.seq_len} + 1 "
                "tokens fits; give it weight 0, or lower seq_len", path=name, actual=tokens.tokens)
        block = self.config.shuffle_block
        if block is None:  # about one shard of sequences, so a pass reads each shard in ~1-2 blocks
            block = max(1, round(tokens.tokens / max(1, len(shards)) / self.config.seq_len))
        return _Subset(tokens, windows, train, val, block, derive_key(self.config.seed, "shuffle", name),
                       derive_key(0, "holdout", name))

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
            held = {s.tokens.name: s.val for s in self._subsets if s.val}
            if not held:
                raise LoaderConfigError("no sequences are held out (val_fraction=0 or subsets too small)")
            self._validation = Mixture(list(held), list(held.values()), [Phase(held, sum(held.values()))],
                                       seed=self.config.seed)
        return self._validation

    def locate(self, positions, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """``(subset index [k] int64, first stream token of the window [k] int64)`` of stream positions."""
        mixture = self._mixture(split)
        subset, index = mixture.locate(positions)
        if mixture is not self.mixture:  # the validation mixture has only the subsets that hold some out
            subset = np.array([self.subsets.index(n) for n in mixture.subsets], dtype=np.int64)[subset]
        window = np.empty_like(index)
        for s in np.unique(subset):
            sub = self._subsets[s]
            rows = np.flatnonzero(subset == s)
            if split == "train":
                epoch, t = np.divmod(index[rows], sub.train)
                for e in np.unique(epoch):
                    at = rows[epoch == e]
                    u = shuffle(self.config.shuffle, sub.train, int(sub_key(sub.key, np.uint64(e))),
                                t[epoch == e], sub.block, self.config.shuffle_window)
                    window[at] = holdout.train_windows(u, sub.windows, self.every, sub.holdout_key)
            else:
                u = shuffle(self.config.shuffle, sub.val, int(sub_key(sub.key, np.uint64(0xE7A1))), index[rows],
                            max(1, sub.block // self.every), self.config.shuffle_window)
                window[rows] = holdout.val_windows(u, self.every, sub.holdout_key)
        return subset, window * self.config.seq_len

    def fill(self, positions, out: Batch, split: str = "train") -> Batch:
        """Write the sequences at ``positions`` (``[B]``) into ``out`` (``B`` rows) and return it."""
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        subset, start = self.locate(positions, split)
        pack_rows(self.source, [s.tokens for s in self._subsets], subset, start, self.config.seq_len, out)
        out.index[:] = positions
        return out

    def read(self, positions, split: str = "train") -> Batch:
        """The sequences at ``positions`` in fresh buffers (tests, inspection)."""
        positions = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        return self.fill(positions, new_batch(len(positions), self.config.seq_len), split)

    def sizes(self, split: str = "train") -> dict[str, int]:
        """Sequences per subset in one pass (epoch) of ``split``."""
        return {s.tokens.name: (s.train if split == "train" else s.val) for s in self._subsets}

    def served(self, position: int) -> dict[str, int]:
        """Training sequences of each subset served at positions ``< position``."""
        return dict(zip(self.subsets, (int(c) for c in self.mixture.served(position))))

    def passes(self, position: int) -> dict[str, float]:
        """How many passes (epochs) over its training sequences each subset has made by ``position``."""
        return {name: c / int(n) for (name, c), n in zip(self.served(position).items(), self._n_train)}
