"""What a run of this loader trained on: the documents of a step, the steps of a document, and each subset's
exposure, all computed from the stream's pure order (docs/training.md, "Our own runs").

A run's optimizer step ``t`` (counted as its log, ``metrics.jsonl`` and checkpoint names count them: 1 is
the first) trains on the global batch of stream positions ``[(t-1)·G, t·G)``, ``G`` the global batch
(micro-batches and ranks are slices of it; `marin_data.loader.dataset`). Its *slot* ``j`` is position
``(t-1)·G + j``, whatever rank read it.

- Forward (`Trace.step`): each slot's subset, the subset's sequence number (counting every epoch), the
  window's tokens in the subset's stream (``seq_len + 1`` of them with the default packing: the inputs and
  the last label), the shard holding its first token (path, sha256), the subset's license and the
  documents the window touches (`marin_data.formats.documents`, as the corpus's format finds them) — what `TokenStream.locate` serves.
- Backward (`Trace.document`): every (step, slot) at which any token of a document was served, by
  inverting each stage instead of scanning steps: its tokens -> the windows that touch them (packing grid)
  -> their training indices (`holdout.train_indices`) -> for each epoch the subset has started, the pass
  positions (`shuffle.unshuffle`) -> the global positions (`Mixture.positions_of`). Cost: one shard order
  per epoch of that subset, one mixture block per hit.
- Exposure (`exposure`): per subset, what the first ``until`` steps serve: sequences, tokens, epochs,
  the fraction of its training sequences seen, the first step it appears at; from the mixture's counts alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marin_data.errors import LoaderConfigError
from marin_data.formats.documents import Document, Documents
from marin_data.loader.holdout import train_indices
from marin_data.loader.packing import PACKINGS
from marin_data.loader.shuffle import unshuffle
from marin_data.loader.shuffle.keys import sub_key
from marin_data.loader.stream import TokenStream

__all__ = ["Slot", "Exposure", "Trace", "exposure", "never_served"]


@dataclass(frozen=True)
class Slot:
    """One sequence of a step's global batch (module docstring)."""

    step: int
    slot: int  # its place in the step's global batch
    position: int  # its global stream position
    subset: str
    sequence: int  # the subset's sequence number, counting every epoch (its mixture counter)
    epoch: int
    tokens: tuple[int, int]  # [start, stop) of the window in the subset's token stream
    shard: str  # the shard holding the window's first token
    sha256: str
    license: str
    documents: tuple[Document, ...]

    def to_json(self) -> dict:
        return {"subset": self.subset, "sequence": self.sequence, "epoch": self.epoch, "slot": self.slot,
                "position": self.position, "tokens": list(self.tokens), "shard": self.shard, "sha256": self.sha256,
                "license": self.license,
                "documents": [{"id": d.id, "first": d.first, "last": d.last} for d in self.documents]}


@dataclass(frozen=True)
class Exposure:
    """What a run's first ``until`` steps serve of one subset (`exposure`)."""

    subset: str
    sequences: int  # served, counting repeats
    tokens: int  # sequences x seq_len: the tokens the model is trained to predict
    epochs: float  # passes over its training sequences
    fraction: float  # of its training sequences served at least once
    first_step: int | None  # the first step that serves it; None: none up to ``until``


class Trace:
    """Forward and backward queries over a stream's training order, at ``global_batch`` sequences a step.

    Args:
        stream: the run's stream (same corpus, config and fingerprint as the run's).
        global_batch: sequences per optimizer step.
        documents: where documents lie (default `TokenStream.documents`).
    """

    def __init__(self, stream: TokenStream, global_batch: int,
                 documents: Documents | None = None) -> None:
        if global_batch < 1:
            raise LoaderConfigError(f"global batch must be >= 1, got {global_batch}")
        self.stream = stream
        self.global_batch = int(global_batch)
        self.documents = documents if documents is not None else stream.documents()
        self.length = stream.seq_len + PACKINGS[stream.config.packing].extra  # tokens a window holds

    def steps(self) -> int | None:
        """The whole steps a bounded stream serves (None: unbounded)."""
        stop = self.stream.stop()
        return None if stop is None else stop // self.global_batch

    def _until(self, until: int) -> int:
        """The stream position one past step ``until``'s batch, checked against the stream's end."""
        last = self.steps()
        if until < 0 or (last is not None and until > last):
            raise LoaderConfigError(f"step {until} is outside this run's steps 1-{last}", actual=until)
        return until * self.global_batch

    def step(self, step: int) -> list[Slot]:
        """Step ``step``'s global batch, slot by slot (module docstring).

        Raises:
            LoaderConfigError: ``step`` is not a step the stream serves.
        """
        if step < 1:
            raise LoaderConfigError(f"steps count from 1, got {step}", actual=step)
        end = self._until(step)
        positions = range(end - self.global_batch, end)
        stream = self.stream
        subset, start = stream.locate(positions)
        index = stream.mixture.locate(positions)[1]
        shards = stream.shard_ids(positions)
        licenses, sizes = stream.corpus.manifest.subsets, stream.sizes()
        out = []
        for j, (s, x, sequence, g) in enumerate(zip(subset.tolist(), start.tolist(), index.tolist(), shards.tolist())):
            name, shard = stream.subsets[s], stream.shards[g]
            out.append(Slot(step, j, positions[j], name, sequence, sequence // sizes[name], (x, x + self.length),
                            shard.path, shard.sha256, licenses[name].license,
                            tuple(self.documents.touching(s, x, x + self.length))))
        return out

    def document(self, doc_id: str, until: int | None = None) -> np.ndarray:
        """``[k]`` int64, ascending: every global position up to the end of step ``until`` (default: the
        stream's end) whose window holds a token of the document ``doc_id``; step ``p // G + 1``, slot ``p % G``.

        Raises:
            UnknownDocumentError: no such document in the corpus (one of a subset the stream does not read,
                or with no token, has no position).
            LoaderConfigError: ``until`` is not a step the stream serves, or the stream is unbounded and
                ``until`` is not given.
        """
        if until is None:
            until = self.steps()
            if until is None:
                raise LoaderConfigError("this stream never ends: say up to which step to look")
        stop = self._until(until)
        s, lo, hi = self.documents.find(doc_id)
        return np.zeros(0, np.int64) if s < 0 or hi <= lo else self.positions(s, lo, hi, stop)

    def positions(self, s: int, lo: int, hi: int, stop: int) -> np.ndarray:
        """The global positions ``< stop`` whose window holds one of tokens ``[lo, hi)`` of subset ``s``."""
        stream = self.stream
        wstarts, first, train_starts, key, windows, holdout_key = stream.train_order(s)
        L = stream.seq_len
        # each shard k holds windows wstarts[k] + m, m < count, the m-th starting at token first[k] + m·L
        count = np.diff(wstarts)
        m_lo = np.maximum(0, (lo - self.length - first[:-1]) // L + 1)
        m_hi = np.minimum(count, -(-(hi - first[:-1]) // L))
        w = np.concatenate([np.arange(a, b) + ws for a, b, ws in zip(m_lo, m_hi, wstarts[:-1]) if b > a] or
                           [np.zeros(0, np.int64)]).astype(np.int64)
        u = train_indices(w, windows, stream.every, holdout_key)
        u = u[u >= 0]  # held-out windows are never trained on
        n = int(train_starts[-1])
        served = int(stream.mixture.served(stop)[s])
        found = []
        for epoch in range(-(-served // n) if u.size else 0):
            t = unshuffle(stream.config.shuffle, train_starts, int(sub_key(np.uint64(key), np.uint64(epoch))), u,
                          stream.config.shuffle_window)
            sequence = epoch * n + t
            found.append(stream.mixture.positions_of(s, sequence[sequence < served]))
        positions = np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)
        return positions[(positions >= 0) & (positions < stop)]


def exposure(stream: TokenStream, global_batch: int, until: int) -> list[Exposure]:
    """Per subset of ``stream``, what steps ``1..until`` serve (`Exposure`), from the mixture's counts: no shard
    is read. A subset no phase weighs is not in the stream; `never_served` names those too."""
    stop = until * global_batch
    served = stream.mixture.served(stop)
    sizes = stream.sizes()
    out = []
    for s, name in enumerate(stream.subsets):
        c, n = int(served[s]), sizes[name]
        first = int(stream.mixture.positions_of(s, [0])[0]) if c else -1
        out.append(Exposure(name, c, c * stream.seq_len, c / n, min(c, n) / n,
                            first // global_batch + 1 if 0 <= first < stop else None))
    return out


def never_served(stream: TokenStream, table: list[Exposure]) -> list[str]:
    """The corpus's subsets that ``table`` (`exposure`) shows unserved, or that the stream does not read at all."""
    served = {e.subset for e in table if e.sequences}
    return [name for name in stream.corpus.manifest.subsets if name not in served]
