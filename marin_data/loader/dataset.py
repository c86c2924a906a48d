"""Torch glue: ranks, DataLoader workers, prefetch and resume state over a `TokenStream`.

This module only composes: positions come from arithmetic, sequences from the stream.

- **Global batches are slices of positions.** With per-rank batch ``b`` and ``W`` ranks, the global batch
  that starts at position ``P`` is ``[P, P + W·b)``. Rank ``r`` takes ``[P + r·b, P + (r+1)·b)``, or, for a
  remote corpus, the ``r``-th ``b`` of its rows sorted by shard, so that each rank fetches only a few of the
  shards (`marin_data.loader.ranks`; `LoaderConfig.rank_rows`).
- **Workers split arithmetically.** DataLoader worker ``w`` of ``n`` builds global batches ``w, w+n, ...``
  and torch's in-order DataLoader hands them over in step order.
- **State is the position the trainer has reached**, i.e. the start of the next global batch it has not
  been given, plus the stream fingerprint. It is advanced in the *main* process as each batch is handed
  to the trainer — never where batches are produced, since prefetch threads and worker processes run ahead
  — from the batch itself: every batch carries the global position of each row (``index``). A checkpoint
  taken after step ``k`` therefore resumes at step ``k + 1`` exactly, with any world size, worker count or
  batch size, because none of them is part of the stream.
- A bounded stream ends with the last *whole* global batch (the tail is dropped, so every rank makes the
  same number of steps and collectives never hang).

The fast path is in-process (``num_workers=0``): a background thread builds batches ahead while the
trainer computes; the index math and the copies run in numba code that releases the GIL. Worker
processes are optional: torch's worker-to-main transport tops out near 30–60M tokens/s on a small box
(docs/design.md), below what one process gathers from memory maps.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from marin_data.errors import LoaderStateMismatchError
from marin_data.loader.packing import Batch, batch_layout, new_batch
from marin_data.loader.ranks import RankRows
from marin_data.loader.stream import SPLITS, STREAM_FORMAT, TokenStream

__all__ = ["TokenDataset", "TokenLoader", "BatchTensors", "to_tensors", "distributed_rank"]

_END = object()


def distributed_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: the arguments when given, else ``torch.distributed`` when initialised, else (0, 1)."""
    if rank is None or world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank() if rank is None else rank
            world_size = torch.distributed.get_world_size() if world_size is None else world_size
        rank = 0 if rank is None else rank
        world_size = 1 if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    return rank, world_size


_TORCH = {np.dtype(np.int64): torch.int64, np.dtype(np.int32): torch.int32}


class BatchTensors(dict):
    """A batch's tensors by name (`to_tensors`): a plain dict, except that asking for the document arrays of a
    loader made without them says how to get them."""

    def __missing__(self, key):
        if key in ("segment_ids", "positions"):
            raise KeyError(f"{key!r}: this loader delivers no document ids or positions; make it with "
                           "LoaderConfig(segments=True)")
        raise KeyError(key)


def to_tensors(batch: Batch, *, one_storage: bool = False) -> BatchTensors:
    """The batch contract of `packing` as torch tensors viewing the batch's buffer (no copy).

    ``one_storage``: make every tensor a view of one torch storage. A DataLoader worker hands each storage
    to the main process through its own shared-memory segment, so one storage per batch instead of five
    made worker batches ~2.5x faster (*measured*); in-process, separate ``from_numpy`` views are cheaper.
    """
    segments = batch.segment_ids is not None
    if not one_storage:  # numpy slices wrapped one by one: slicing a torch tensor costs ~2 us per view
        out = BatchTensors(input_ids=torch.from_numpy(batch.input_ids), labels=torch.from_numpy(batch.labels),
                           subset=torch.from_numpy(batch.subset), index=torch.from_numpy(batch.index))
        if segments:
            out["segment_ids"] = torch.from_numpy(batch.segment_ids)
            out["positions"] = torch.from_numpy(batch.positions)
        return out
    buffer = torch.from_numpy(batch.buffer)
    rows, seq_len = batch.input_ids.shape
    return BatchTensors((name, buffer[offset : offset + size].view(_TORCH[dtype]).view(shape))
                        for name, offset, size, shape, dtype in batch_layout(rows, seq_len, segments))


class TokenDataset(IterableDataset):
    """This rank's batches of a `TokenStream`, from `position` on.

    Iterated in-process, it records each batch it hands over (``state_dict`` is then exact). Under a torch
    ``DataLoader`` with worker processes it cannot see what the trainer took: use `TokenLoader` (or call
    `consumed` with each batch taken).

    Args:
        stream: what to serve (`LoaderConfig.batch_size` sequences per rank per batch).
        rank, world_size: default to `torch.distributed` when initialised, else 0 and 1.
        split: ``"train"`` or ``"validation"`` (the held-out stream, finite).
        position: the global stream position to start from (or use `load_state_dict`).
        prefetch: batches built ahead by a background thread when iterated in-process (0: none).
    """

    def __init__(self, stream: TokenStream, *, rank: int | None = None, world_size: int | None = None,
                 split: str = "train", position: int = 0, prefetch: int = 2) -> None:
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.stream = stream
        self.rank, self.world_size = distributed_rank(rank, world_size)
        self.split = split
        self.batch_size = stream.config.batch_size
        self.ranks = RankRows(self.rank, self.world_size, self.batch_size, stream.rank_rows)
        self.global_batch = self.ranks.global_batch
        self.position = int(position)
        self.prefetch = prefetch

    @property
    def subsets(self) -> tuple[str, ...]:
        return self.stream.subsets

    def batch_at(self, start: int) -> dict[str, torch.Tensor]:
        """This rank's part of the global batch that starts at stream position ``start``."""
        out = new_batch(self.batch_size, self.stream.seq_len, self.stream.config.segments)
        return to_tensors(self.stream.fill_batch(start, self.ranks, out, self.split),
                          one_storage=get_worker_info() is not None)

    def _starts(self, worker: int, workers: int) -> Iterator[int]:
        stop = self.stream.stop(self.split)
        start = self.position + worker * self.global_batch
        while stop is None or start + self.global_batch <= stop:
            yield start
            start += workers * self.global_batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        if info is not None:  # a DataLoader worker: produce only; the main process tracks consumption
            self.stream.worker_init(info.id, info.num_workers)
            return (self.batch_at(s) for s in self._starts(info.id, info.num_workers))
        return self._deliver(self._starts(0, 1))

    def _deliver(self, starts: Iterator[int]) -> Iterator[dict[str, torch.Tensor]]:
        produced = ((s, self.batch_at(s)) for s in starts)
        for start, batch in _ahead(produced, self.prefetch) if self.prefetch else produced:
            self.position = start + self.global_batch  # handed to the trainer: consumed
            yield batch

    def prepare(self) -> None:
        """Start getting the next batches ready (a remote corpus fetches their shards in the background), e.g.
        while the model is built: the first batch then waits less."""
        self.stream.prepare(self.position, self.ranks, self.split)

    def consumed(self, batch: dict[str, torch.Tensor]) -> None:
        """Record that ``batch`` was handed to the trainer (`TokenLoader` calls this for worker batches)."""
        self.position = self.ranks.batch_start(batch["index"].numpy(), self.position) + self.global_batch

    def state_dict(self) -> dict[str, Any]:
        """The resume state: the next global position and what stream it belongs to."""
        return {"format": STREAM_FORMAT, "split": self.split, "position": self.position,
                "fingerprint": self.stream.fingerprint, "components": dict(self.stream.components)}

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        """Continue from ``state``; refuse a state of another stream unless ``strict=False``.

        Raises:
            LoaderStateMismatchError: the state's fingerprint (or split) differs and ``strict`` is set.
        """
        ours = {**self.stream.components, "split/name": self.split}
        theirs = {**state.get("components", {}), "split/name": state.get("split")}
        if state.get("fingerprint") != self.stream.fingerprint or theirs["split/name"] != self.split:
            differ = sorted(k for k in ours.keys() | theirs.keys() if theirs.get(k) != ours.get(k)) or ["fingerprint"]
            message = (f"loader state was saved for another stream (differs in: {', '.join(differ)}); resuming "
                       "would not continue the same sequence order")
            if strict:
                raise LoaderStateMismatchError(message, expected=state.get("fingerprint"),
                                               actual=self.stream.fingerprint)
            warnings.warn(message + f"; continuing from position {state['position']} as asked (strict=False)",
                          stacklevel=2)
        self.position = int(state["position"])

    def passes(self) -> dict[str, float]:
        """Passes (epochs) each subset has made by the current position (training stream)."""
        return self.stream.passes(self.position)


def _ahead(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """Run ``items`` on a background thread, ``depth`` ahead; errors are re-raised here, in order."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put(item):
                    return
                # Hand the GIL to the consumer before building the next item. Without this, the put that
                # woke us (the consumer just took an item) lets this thread take the GIL for the whole build
                # while the consumer, still in Python, waits for it up to the 5 ms switch interval: measured
                # (tiny model, 8 x 64, 50 ms steps) a median wait of 1.46 ms per step, 0.11 ms with it.
                time.sleep(0)
            put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, who re-raises it
            put(e)

    thread = threading.Thread(target=work, name="marin-loader-prefetch", daemon=True)
    thread.start()
    try:
        while (item := q.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=10)


class TokenLoader:
    """Iterate a `TokenDataset` in-process or through DataLoader workers, tracking what the trainer got.

    Not a ``torch.utils.data.DataLoader`` itself: in-process (the fast path) there is none, and with worker
    processes or pinned memory it iterates one and records each batch the trainer receives, which a plain
    DataLoader cannot report (its workers run ahead). The `TokenDataset` (``.dataset``) is a standard
    ``IterableDataset`` for code that wants its own DataLoader (``batch_size=None``; then call
    ``dataset.consumed(batch)`` with each batch for an exact ``state_dict``).

    ``state_dict()`` after receiving batch ``k`` resumes at batch ``k + 1``. `load_state_dict` takes effect
    at the next ``iter()``.
    """

    def __init__(self, dataset: TokenDataset, *, num_workers: int = 0, pin_memory: bool = False,
                 prefetch_factor: int = 2, multiprocessing_context: str | None = None) -> None:
        self.dataset = dataset
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.multiprocessing_context = multiprocessing_context

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        if self.num_workers == 0 and not self.pin_memory:
            yield from self.dataset
            return
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers, pin_memory=self.pin_memory,
                            prefetch_factor=self.prefetch_factor if self.num_workers else None,
                            multiprocessing_context=self.multiprocessing_context if self.num_workers else None)
        for batch in loader:
            self.dataset.consumed(batch)
            yield batch

    def prepare(self) -> None:
        """`TokenDataset.prepare`: call it once the position is set (after `load_state_dict`)."""
        self.dataset.prepare()

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True) -> None:
        self.dataset.load_state_dict(state, strict=strict)

    @property
    def position(self) -> int:
        return self.dataset.position

    def passes(self) -> dict[str, float]:
        """Passes (epochs) each subset has made by what the trainer received (`TokenDataset.passes`)."""
        return self.dataset.passes()
