"""Held-out evaluation: loss and bits per byte on a corpus's validation split, per subset and overall.

The sequences are the loader's ``split="validation"`` (`marin_data.loader.holdout`: windows no training run
on the same corpus, ``seq_len`` and held-out fraction ever serves), read with a fixed seed, so every run and
every checkpoint is evaluated on the same sequences in the same order. The first ``max_sequences`` of them,
or all.

- **Loss** is the mean cross-entropy, in nats, of the model's prediction of every target token (a window's
  tokens 1..L), attention blocked across documents as in training.
- **Bytes** are the UTF-8 bytes the target tokens decode to (`token_byte_lengths`: a byte-level BPE's raw
  bytes per token; EOS and other special tokens count 0). **Bits per byte** = total nats / ln 2 / total
  bytes: a figure runs with different tokenizers share.
- **Exact on any number of ranks.** The sequences are cut into fixed chunks of ``batch_size`` (the same
  chunks whatever the world size); each rank runs a contiguous range of chunks and writes each sequence's
  nats (float64 sums of its tokens' float32 losses), tokens and bytes into its slot of a vector the ranks
  all-reduce. Every slot is written by one rank and zero elsewhere, so the reduction adds exact zeros, and
  the totals are exactly rounded sums (``math.fsum``) of those per-sequence values: 1 rank and N ranks give
  the same numbers to the last bit, as long as each chunk's forward computes the same bits. That holds for
  a whole model on each rank (``marin-train eval``); a model sharded for training (``--eval-every``) runs
  the same chunks, in lockstep, and computes the same bits unless its experts are split over ranks
  (``--ep``), which groups the experts' rows differently, or it computes in bf16.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from torch.distributed.fsdp import FSDPModule

from marin_data.loader.dataset import to_tensors
from marin_data.loader.remote.cache import RemoteShardCache
from marin_data.loader.stream import TokenStream
from marin_model.model import Transformer
from marin_train.loop import segment_inputs

__all__ = ["EVAL_SEED", "EvalResult", "HeldOut", "Totals", "evaluate"]

EVAL_SEED = 0  # the validation stream's order: fixed, so that every run reads the same sequences


@dataclass(frozen=True)
class Totals:
    """What one subset (or all of them) contributed: sequences, target tokens, their bytes and summed loss."""

    sequences: int
    tokens: int
    bytes: int
    nats: float  # summed cross-entropy of the target tokens

    @property
    def loss(self) -> float:
        """Mean cross-entropy per target token, in nats."""
        return self.nats / self.tokens if self.tokens else math.nan

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes if self.bytes else math.nan

    def to_json(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "tokens": self.tokens, "bytes": self.bytes, "loss": self.loss,
                "bits_per_byte": self.bits_per_byte}


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.3g}%"


@dataclass(frozen=True)
class HeldOut:
    """Which held-out evaluation is read, and its size (`HeldOut.of` a stream): the first ``sequences`` of the
    ``split`` sequences of ``seq_len`` tokens held out, out of the ``total`` (both splits) that the stream's
    subsets give at its packing and held-out fraction. `describe` is the line a run's log and ``marin-train
    eval`` print before evaluating."""

    sequences: int
    seq_len: int
    split: int  # sequences in the held-out split
    total: int  # sequences in both splits
    packing: str
    val_fraction: float

    @classmethod
    def of(cls, stream: TokenStream, max_sequences: int | None = None) -> HeldOut:
        """Raises `LoaderConfigError` when nothing is held out."""
        split = stream.stop("validation")
        n = split if max_sequences is None else min(split, max_sequences)
        return cls(n, stream.seq_len, split, split + sum(stream.sizes("train").values()), stream.config.packing,
                   stream.config.val_fraction)

    def describe(self, every: int = 0) -> str:
        """``evaluation: N sequences of L tokens (T tokens): F of the held-out split, which is P of the data
        (val_fraction V, K packing)``, and with ``every`` how often a run evaluates."""
        when = "" if not every else "; every step" if every == 1 else f"; every {every:,} steps and at the last"
        return (f"evaluation: {self.sequences:,} sequences of {self.seq_len:,} tokens "
                f"({self.sequences * self.seq_len:,} tokens): {_percent(self.sequences / self.split)} of the held-out "
                f"split, which is {_percent(self.split / self.total)} of the data (val_fraction {self.val_fraction:g}, "
                f"{self.packing} packing){when}")

    def to_json(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "seq_len": self.seq_len, "tokens": self.sequences * self.seq_len,
                "split_sequences": self.split, "data_sequences": self.total,
                "of_split": self.sequences / self.split, "split_of_data": self.split / self.total,
                "packing": self.packing, "val_fraction": self.val_fraction}


@dataclass(frozen=True)
class EvalResult:
    """Per-subset and overall `Totals` of one evaluation."""

    subsets: dict[str, Totals]  # the subsets that hold sequences out, in the stream's order
    overall: Totals
    seq_len: int
    seconds: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)  # what was evaluated: checkpoint, step, data, ...

    def metrics(self) -> dict[str, float]:
        """Flat fields for a metrics record (the ``eval`` group, `marin_train.metrics`): ``eval/loss``,
        ``eval/bpb``, ``eval/tokens``, ``eval/seconds``, and ``eval/SUBSET/loss``, ``eval/SUBSET/bpb`` for each
        subset."""
        out = {"eval/loss": self.overall.loss, "eval/bpb": self.overall.bits_per_byte,
               "eval/tokens": self.overall.tokens, "eval/seconds": self.seconds}
        for name, t in self.subsets.items():
            out[f"eval/{name}/loss"] = t.loss
            out[f"eval/{name}/bpb"] = t.bits_per_byte
        return out

    def to_json(self) -> dict[str, Any]:
        return {**self.meta, "seq_len": self.seq_len, "overall": self.overall.to_json(),
                "subsets": {name: t.to_json() for name, t in self.subsets.items()}}


def _per_sequence(model: Transformer, batch: dict[str, torch.Tensor], token_bytes: torch.Tensor,
                  device: torch.device) -> torch.Tensor:
    """``[4, B]`` float64: each sequence's summed loss, target tokens, their bytes, and its subset + 1."""
    labels = batch["labels"].to(device)
    logits = model(batch["input_ids"].to(device), **segment_inputs(batch, device)).logits
    nll_BS = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100,
                             reduction="none").view_as(labels)
    counted_BS = labels != -100
    nbytes_BS = torch.where(counted_BS, token_bytes.to(device)[labels.clamp(min=0)], 0)
    return torch.stack([nll_BS.double().sum(1), counted_BS.sum(1).double(), nbytes_BS.sum(1).double(),
                        batch["subset"].to(device).double() + 1]).cpu()


@torch.no_grad()
def evaluate(model: Transformer, stream: TokenStream, token_bytes: np.ndarray, *, batch_size: int = 8,
             max_sequences: int | None = None, device: torch.device | str = "cpu") -> EvalResult:
    """Evaluate ``model`` on the validation split of ``stream`` (module docstring); a collective when a
    process group is joined: every rank calls it with the same arguments and gets the same result.

    Args:
        model: a whole model, or one sharded over the ranks (its forward then runs on all ranks in lockstep).
        stream: a stream of the corpus with the run's ``seq_len``, held-out fraction and packing, seed
            `EVAL_SEED`, segments on where the packing has them (`marin_train.data.eval_stream` builds one).
        token_bytes: ``[V]`` bytes of each token id (`marin_data.raw.tokenizer.token_byte_lengths`).
        batch_size: sequences per forward (the chunk: part of what the numbers are, not of the ranks).
        max_sequences: evaluate the first this many sequences of the split (None: all of it).
        device: where the model computes.

    Returns:
        An `EvalResult`.
    """
    t0 = time.perf_counter()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    n = HeldOut.of(stream, max_sequences).sequences
    chunks = -(-n // batch_size)
    mine = range(rank * chunks // world, (rank + 1) * chunks // world)  # contiguous: a remote cache reads ahead
    rounds = -(-chunks // world) if isinstance(model, FSDPModule) else len(mine)  # a sharded forward: collective
    table = torch.as_tensor(token_bytes, dtype=torch.int64)
    bounded = isinstance(stream.source, RemoteShardCache)  # the held-out rows of every shard pass through it
    rows = torch.zeros(4, n, dtype=torch.float64)
    was_training = model.training
    model.eval()  # no balancing statistics, no token dropping
    try:
        for r in range(rounds):
            c = mine[min(r, len(mine) - 1)] if mine else 0  # past its share a rank repeats a chunk, unused
            start, stop = c * batch_size, min(n, (c + 1) * batch_size)
            batch = to_tensors(stream.read(range(start, stop), "validation"))  # a remote shard: fetched on use
            if bounded:
                stream.release()  # the rows are copied out: let a bounded cache evict what they came from
            values = _per_sequence(model, batch, table, torch.device(device))
            if r < len(mine):
                rows[:, start:stop] = values
    finally:
        model.train(was_training)
    if world > 1:
        rows = rows.to(device)
        dist.all_reduce(rows)  # each slot is non-zero on one rank only: exact
        rows = rows.cpu()
    nats, tokens, nbytes, subset = rows.numpy()
    subset = subset.astype(np.int64) - 1
    out = {}
    for s in np.unique(subset):
        sel = subset == s
        out[stream.subsets[s]] = Totals(int(sel.sum()), int(tokens[sel].sum()), int(nbytes[sel].sum()),
                                        math.fsum(nats[sel]))
    overall = Totals(n, int(tokens.sum()), int(nbytes.sum()), math.fsum(nats))
    ordered = {name: out[name] for name in stream.subsets if name in out}
    return EvalResult(ordered, overall, stream.seq_len, time.perf_counter() - t0)

