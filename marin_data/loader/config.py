"""`LoaderConfig`: what the loader serves, the settings a `marin_data.loader.stream.TokenStream` is built from
(the sequence length, the mixture, the seed, the split and shuffle, the packing) and those that only shape
how batches are handed out (the batch size, how rows are dealt to ranks, whether document boundaries come
along). Plain values only, so a config pickles to DataLoader workers; the stream checks them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from marin_data.loader.mixture import DEFAULT_BLOCK, Phase
from marin_data.loader.packing import DEFAULT_PACKING

__all__ = ["LoaderConfig"]


@dataclass(frozen=True)
class LoaderConfig:
    """What the loader serves. Every field but ``batch_size``, ``rank_rows`` and ``segments`` is part of the
    stream's fingerprint."""

    seq_len: int = 4096  # tokens per sequence; each window holds seq_len + 1 (inputs and labels)
    batch_size: int = 8  # sequences per rank per step (not in the fingerprint: resume with any)
    mixture: Mapping[str, float] | Sequence[Phase] | None = None  # None: selected subsets by token count
    subsets: Sequence[str] | None = None  # names/globs to select; None: all subsets the mixture names
    seed: int = 0  # keys the shuffle and the order of mixture slots
    val_fraction: float = 0.001  # held out from training as the validation stream (holdout.py)
    shuffle: str = "hierarchical"  # one of shuffle.SHUFFLES
    shuffle_window: int = 4  # shards shuffled together: the reader's working set per subset
    mixture_block: int = DEFAULT_BLOCK  # smallest mixture block (raised to 1/w_min)
    # How each global batch's rows are dealt to ranks, one of `ranks.RANK_ROWS`; "auto": `TokenStream.rank_rows`.
    # Not in the fingerprint: the global batches are the same either way.
    rank_rows: str = "auto"
    # Also deliver ``segment_ids`` and ``positions`` (document boundaries, for document masking; `packing`).
    # Not in the fingerprint: the sequences are the same either way.
    segments: bool = False
    # How tokens become sequences, one of `packing.PACKINGS`: "overlap" (seq_len + 1 tokens inside one shard)
    # or "levanter" (Levanter's windows: a subset's flat tokens [i*seq_len, (i+1)*seq_len), the last label -100).
    packing: str = DEFAULT_PACKING
    # Every token id must lie below it: the model's vocabulary (None: the corpus tokenizer's). Checked once per
    # shard as it is opened (`packing.ShardTable`). Not in the fingerprint: the sequences are the same.
    vocab_size: int | None = None
