"""One invariant checker per loader concept (docs/design.md, "Conventions"); the tests call them in one line each."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from marin_data.loader import Mixture, TokenDataset, TokenLoader, TokenStream
from marin_data.corpus.shard import read_shard

EOS = 0  # tests/conftest.py's synthetic corpora end every document with token 0


def check_permutation(fn: Callable[[np.ndarray], np.ndarray], n: int) -> np.ndarray:
    """``fn`` maps ``[0, n)`` onto itself one to one, and gives the same image whatever chunk asks for it."""
    image = fn(np.arange(n, dtype=np.int64))
    assert image.shape == (n,)
    assert np.array_equal(np.sort(image), np.arange(n)), "not a bijection of [0, n)"
    if n:
        cut = n // 3
        again = np.concatenate([fn(np.arange(cut, n)), fn(np.arange(0, cut))])
        assert np.array_equal(again, np.concatenate([image[cut:], image[:cut]])), "depends on what was asked before"
    return image


def check_inverse(fn: Callable[[np.ndarray], np.ndarray], inverse: Callable[[np.ndarray], np.ndarray], n: int) -> None:
    """``fn`` is a bijection of ``[0, n)`` (`check_permutation`) and ``inverse`` undoes it, itself a bijection."""
    image = check_permutation(fn, n)
    assert np.array_equal(inverse(image), np.arange(n)), "the inverse does not undo it"
    check_permutation(inverse, n)


def window_ids(stream: TokenStream, subset: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The subset-wide window number of each located window, checking that it lies on its shard's grid."""
    out = np.empty(len(start), np.int64)
    for r, (s, x) in enumerate(zip(subset, start)):
        tokens = stream.subset_tokens[s]
        k = np.searchsorted(tokens.cumulative, x, side="right") - 1
        j, rest = divmod(int(x - tokens.cumulative[k]), stream.seq_len)
        assert rest == 0 and x + stream.seq_len < tokens.cumulative[k + 1], "a window off its shard's grid"
        out[r] = tokens.window_starts(stream.seq_len)[k] + j
    return out


def check_mixture(mixture: Mixture, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Over the first ``positions`` positions of ``mixture``:

    - each subset receives its sequence indices 0, 1, 2, ... in position order (nothing lost or repeated,
      phase changes included, and a subset reads its own sequences in order, keeping its shuffle's locality);
    - at every block boundary of every phase, each subset's count in the phase is within 1 of ``w·n``;
    - `Mixture.served` agrees with counting, at block boundaries and in between.
    """
    subset, index = mixture.locate(np.arange(positions))
    width = len(mixture.subsets)
    for s in range(width):
        got = index[subset == s]
        assert np.array_equal(got, np.arange(len(got))), f"subset {s}: indices lost, repeated or out of order"
    for ph in mixture.phases:
        stop = positions if ph.stop is None else min(ph.stop, positions)
        for n in range(ph.start, stop + 1, ph.block):
            count = np.bincount(subset[ph.start:n], minlength=width)
            assert np.all(np.abs(count - ph.weights() * (n - ph.start)) <= 1), (n, count, ph.weights())
    for n in sorted({0, positions, positions // 2, positions // 3 + 1}):
        assert np.array_equal(mixture.served(n), np.bincount(subset[:n], minlength=width)), n
    for s in range(width):  # `positions_of` inverts `locate` (on a sample: each costs a binary search)
        at = np.flatnonzero(subset == s)
        sample = at[:: max(1, len(at) // 100)]
        assert np.array_equal(mixture.positions_of(s, index[sample]), sample), f"subset {s}: not inverted"
    return subset, index


def reference_tokens(stream: TokenStream) -> dict[int, np.ndarray]:
    """Each subset's concatenated token stream read straight from its Parquet shards (no cache, no packing)."""
    out = {}
    for k, name in enumerate(stream.subsets):
        paths = sorted(s.path for s in stream.corpus.shards if s.subset == name)
        out[k] = np.concatenate([read_shard(stream.corpus.root / p)[1] for p in paths]).astype(np.int64)
    return out


def window_of(batch) -> np.ndarray:
    """``[B, L + 1]``: each row's input tokens and its last label, the window the row was cut from."""
    return np.concatenate([batch.input_ids, batch.labels[:, -1:]], axis=1)


def check_batch(window: np.ndarray, segment_ids: np.ndarray, positions: np.ndarray) -> None:
    """Segment ids and positions agree with the EOS tokens of each row (labels are the window shifted by one)."""
    seq_len = segment_ids.shape[1]
    assert window.shape[1] == seq_len + 1
    starts = np.zeros(segment_ids.shape, dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = window[:, : seq_len - 1] == EOS
    assert np.array_equal(segment_ids, np.cumsum(starts, axis=1) - 1)
    last_start = np.maximum.accumulate(np.where(starts, np.arange(seq_len), 0), axis=1)
    assert np.array_equal(positions, np.arange(seq_len) - last_start)


def take(loader: TokenLoader | TokenDataset, steps: int, *, state_each: bool = False) -> list[dict]:
    """``steps`` batches as numpy dicts; with ``state_each``, also the state position seen after each one."""
    out = []
    for batch in loader:
        row = {k: v.numpy().copy() for k, v in batch.items()}
        if state_each:
            row["state_position"] = loader.state_dict()["position"]
        out.append(row)
        if len(out) == steps:
            break
    return out


def check_global_stream(per_rank: list[list[dict]], start: int, reference, *, stream=None,
                        split: str = "train") -> None:
    """Rank batches of each step together are the positions ``start, start+1, ...`` of one global batch and
    carry exactly the sequences ``reference`` (a `Batch` of the uninterrupted stream from ``start``) holds there.

    Without ``stream``, ranks deal the global batch by position: joined in rank order, the batches are the
    positions in order. With ``stream`` (a `TokenStream`), by shard: each rank's rows are ascending, and
    every row of rank ``r`` comes before every row of rank ``r + 1`` in (subset, window start) order."""
    steps = {len(b) for b in per_rank}
    assert len(steps) == 1, "ranks made different numbers of steps"
    at = 0
    for step in range(steps.pop()):
        index = np.concatenate([b[step]["index"] for b in per_rank])
        expected = np.arange(start + at, start + at + len(index))
        if stream is None:
            assert np.array_equal(index, expected), (step, index)
        else:
            assert np.array_equal(np.sort(index), expected), (step, index)
            assert all(np.all(np.diff(b[step]["index"]) > 0) for b in per_rank)
            subset, token = stream.locate(index, split)
            place = np.lexsort((token, subset))  # rows in (subset, window start) order...
            rank = np.repeat(np.arange(len(per_rank)), [len(b[step]["index"]) for b in per_rank])
            assert np.all(np.diff(rank[place]) >= 0), (step, rank[place])  # ...are rank 0's, then rank 1's...
        window = np.concatenate([np.concatenate([b[step]["input_ids"], b[step]["labels"][:, -1:]], axis=1)
                                 for b in per_rank])
        assert np.array_equal(window, window_of(reference)[index - start])
        assert np.array_equal(np.concatenate([b[step]["subset"] for b in per_rank]), reference.subset[index - start])
        at += len(index)
