"""Which subset, and which of its sequences, the stream serves at global position ``i``.

The stream is cut into *blocks* of ``B`` consecutive positions. At every block boundary ``n`` the number of
positions each subset has received is the largest-remainder (Hamilton) apportionment of ``n`` seats among
the quotas ``w_s·n``: the *cumulative* target, so every subset is within one sequence of ``w_s·n`` at every
boundary, forever. Apportioning each block on its own (what Levanter did) is biased: 0.5/0.3/0.2 with
blocks of 8 gives 4/2/2 in every block, so the 0.3 subset gets 0.25 for the whole run, and a weight under
``1/B`` never gets a slot at all.

Why blocks of at least ``1/w_min`` positions: Hamilton's method is not house-monotone (the Alabama
paradox) — the apportionment of ``n + B`` seats can give a subset fewer seats than that of ``n`` — and a
block cannot hand back a slot. Each subset gets ``floor(w·n)`` or ``floor(w·n) + 1`` seats, so when
``w·B >= 1``, ``floor(w·(n+B)) >= floor(w·n) + 1`` and the count never goes down. The block is therefore
``max(block, ceil(1/w_min))`` positions: a weight of 0.001 gets blocks of 1,000 and exactly one slot in
each. Inside a block the slots of the subsets are permuted by a keyed Feistel permutation, so the
block's composition is exact while the order is random.

Weights are exact rationals (``Fraction(float)`` is exact), so the arithmetic is integer arithmetic: every
rank, machine and restart computes the same counts, with no floating-point ties.

A *schedule* is a sequence of `Phase` s. Each subset's counter carries over a phase change: phase ``p``
starts each subset at the number of sequences it was served by phases ``< p``, so a change loses and
repeats nothing. A bounded phase is rounded to a whole number of its blocks (the proof above holds at
block boundaries), except when its end quotas are whole numbers: then ``c_s(kB) <= ceil(w_s·kB) <=
w_s·end`` and the short final block is monotone too (the validation stream relies on this to serve each
held-out sequence exactly once).

Locating position ``i`` costs two Hamilton apportionments (``O(S log S)``, exact integers) and one
labelling pass over its block (``O(block)`` Feistel evaluations, numba), both done once per block and
cached: resuming at step 1,000,000 replays nothing. Within a block each subset receives its sequence
indices in position order, so a subset reads its own sequences in order and keeps its shuffle's locality.
The inverse (`Mixture.positions_of`: where subset ``s`` is served its ``J``-th sequence) costs a binary
search over the blocks of one phase and one labelling pass.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numba
import numpy as np

from marin_data.corpus.names import select_subsets
from marin_data.errors import LoaderConfigError
from marin_data.loader.shuffle.feistel import feistel1
from marin_data.loader.shuffle.keys import derive_key, sub_key

__all__ = ["Phase", "MixturePhase", "Mixture", "phases_by_fraction", "resolve_weights", "apportion"]

DEFAULT_BLOCK = 1024  # positions per block when every weight is >= 1/1024
_CACHED_POSITIONS = 1 << 22  # blocks' labels kept at most (12 bytes each): a batch needs one or two blocks


@dataclass(frozen=True)
class Phase:
    """One weight set of a mixture schedule.

    ``weights`` maps subset names, parent paths (``pretrain``) or globs (``pretrain/*``) to relative
    weights; a pattern matching several subsets splits its weight among them in proportion to their
    tokens. A subset may be named by one pattern only.

    ``sequences`` is honoured exactly when every subset's quota at that length is whole; otherwise the
    mixture rounds the phase to whole blocks (``Mixture._phase_length``; the module docstring says why), so
    it may end up to half a block (512 sequences at the default block) earlier or later.
    """

    weights: Mapping[str, float]
    sequences: int | None = None  # length in sequences; None: until the stream ends (last phase only)


def phases_by_fraction(
    parts: Sequence[tuple[float, Mapping[str, float]]], *, total_tokens: int, seq_len: int
) -> tuple[Phase, ...]:
    """A schedule given as fractions of a token budget, e.g. ``[(0.8, pretrain), (0.2, midtrain)]``.

    Every sequence carries ``seq_len`` new tokens, so a token fraction is a sequence fraction. Phase ends are
    rounded on the cumulative fractions, so the lengths add up to exactly ``total_tokens // seq_len``; the
    last phase is bounded too, so the stream ends when the budget is spent — up to half a mixture block per
    phase later or earlier, since the mixture rounds each phase to whole blocks (see `Phase`).
    """
    total = sum(f for f, _ in parts)
    if not parts or any(f <= 0 for f, _ in parts) or not math.isclose(total, 1.0, rel_tol=1e-9):
        raise LoaderConfigError(f"phase fractions must be positive and sum to 1, got {[f for f, _ in parts]}")
    sequences = total_tokens // seq_len
    ends, acc = [], 0.0
    for f, _ in parts:
        acc += f
        ends.append(round(sequences * acc / total))
    starts = [0, *ends[:-1]]
    return tuple(Phase(dict(w), e - s) for (_, w), s, e in zip(parts, starts, ends))


def resolve_weights(weights: Mapping[str, float], subsets: Sequence[str], tokens: Sequence[int]) -> list[Fraction]:
    """Exact per-subset weights (not normalised) from pattern weights; see `Phase`.

    A subset matched by several patterns takes the weight of the one that names it exactly
    (``{"pretrain": 0.7, "pretrain/code": 0.1}`` gives ``pretrain/code`` 0.1 and splits 0.7 among the
    other ``pretrain/...`` subsets); two inexact matches are ambiguous and refused.

    Raises:
        UnknownSubsetError: a pattern matches no subset (from `select_subsets`).
        LoaderConfigError: a negative weight, an ambiguous subset, or a pattern left with no subset.
    """
    where = {name: k for k, name in enumerate(subsets)}
    matches: dict[int, list[str]] = {}
    for pattern, w in weights.items():
        if not (isinstance(w, (int, float, Fraction)) and w >= 0 and math.isfinite(w)):
            raise LoaderConfigError(f"mixture weight for {pattern!r} must be a finite number >= 0, got {w!r}",
                                    actual=w)
        for name in select_subsets(subsets, [pattern], what="mixture pattern"):
            matches.setdefault(where[name], []).append(pattern)
    owned: dict[str, list[int]] = {pattern: [] for pattern in weights}
    for k, patterns in matches.items():
        exact = [p for p in patterns if p == subsets[k]]
        if not exact and len(patterns) > 1:
            raise LoaderConfigError(f"subset {subsets[k]!r} is matched by {patterns} in one mixture phase; "
                                    "name it exactly or make the patterns disjoint")
        owned[(exact or patterns)[0]].append(k)
    out = [Fraction(0)] * len(subsets)
    for pattern, ks in owned.items():
        if not ks:
            raise LoaderConfigError(f"mixture pattern {pattern!r} only matches subsets other patterns name "
                                    "exactly; drop it")
        group = sum(tokens[k] for k in ks)
        for k in ks:
            out[k] = Fraction(weights[pattern]) * (Fraction(tokens[k], group) if group else Fraction(1, len(ks)))
    return out


def apportion(numerators: tuple[int, ...], denominator: int, n: int) -> np.ndarray:
    """Hamilton apportionment of ``n`` seats among quotas ``numerators[s] * n / denominator``.

    Each subset gets the floor of its quota; the seats left go to the largest remainders, ties to the
    lower subset index. Exact integer arithmetic (Python ints), ``[S]`` int64 out, summing to ``n``.
    """
    quota = [x * n for x in numerators]
    seats = [q // denominator for q in quota]
    left = n - sum(seats)
    for s in sorted(range(len(quota)), key=lambda s: (-(quota[s] % denominator), s))[:left]:
        seats[s] += 1
    return np.array(seats, dtype=np.int64)


def _block(numerators: tuple[int, ...], denominator: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-subset seats before ``start`` and cumulative seats within ``[start, stop)`` (both ``[S]`` int64)."""
    before = apportion(numerators, denominator, start)
    return before, np.cumsum(apportion(numerators, denominator, stop) - before)


@numba.njit(cache=True, nogil=True)
def _block_labels(size, key, cum, before):
    """Every position of one block -> (subset, per-subset sequence index).

    Position ``r`` takes slot ``feistel(r)``; the slots ``[cum[s-1], cum[s])`` belong to subset ``s``. Each
    subset's indices are handed out in *position* order (``before[s]``, ``before[s] + 1``, ...), not slot
    order: a subset then reads its sequences in the order its shuffle laid them out, which keeps the
    shuffle's locality (a block of the mixture can be far longer than a shuffle window when a weight is tiny).
    """
    subset = np.empty(size, np.int32)
    index = np.empty(size, np.int64)
    counter = before.copy()
    for r in range(size):
        s = np.searchsorted(cum, feistel1(size, key, r), side="right")
        subset[r] = s
        index[r] = counter[s]
        counter[s] += 1
    return subset, index


@dataclass(frozen=True)
class MixturePhase:
    """A phase resolved to subset indices: weight of subset ``s`` is ``numerators[s] / denominator``."""

    start: int  # first global position of the phase
    stop: int | None  # one past its last position; None: unbounded
    block: int  # positions per block (>= 1/w_min, see the module docstring)
    numerators: tuple[int, ...]
    denominator: int
    base: tuple[int, ...]  # sequences of each subset served by earlier phases
    key: int  # keys the permutation of each block's slots

    def weights(self) -> np.ndarray:
        return np.array(self.numerators, dtype=np.float64) / self.denominator


class Mixture:
    """The pure map ``global position -> (subset, per-subset sequence index)`` of a mixture schedule.

    Args:
        subsets: candidate subset names; those no phase weighs are dropped, and positions map to indices
            into `Mixture.subsets` (the rest, in the same order).
        tokens: tokens per subset (splits a pattern's weight among the subsets it matches).
        schedule: one weight mapping (a single unbounded phase) or a sequence of `Phase` s.
        seed: keys the order of slots inside each block.
        block: the smallest block; raised to ``ceil(1/w_min)`` per phase.
    """

    def __init__(
        self,
        subsets: Sequence[str],
        tokens: Sequence[int],
        schedule: Mapping[str, float] | Sequence[Phase],
        *,
        seed: int,
        block: int = DEFAULT_BLOCK,
    ) -> None:
        phases = (Phase(schedule),) if isinstance(schedule, Mapping) else tuple(schedule)
        if not phases:
            raise LoaderConfigError("a mixture schedule needs at least one phase")
        if block < 1:
            raise LoaderConfigError(f"mixture block must be >= 1, got {block}")
        self.seed = int(seed)
        table = [resolve_weights(phase.weights, subsets, tokens) for phase in phases]
        self.weight_sums = tuple(float(sum(weights)) for weights in table)  # before each phase is normalised
        for p, weights in enumerate(table):
            if not any(weights):
                raise LoaderConfigError(f"mixture phase {p} gives no subset a positive weight: "
                                        f"{dict(phases[p].weights)}")
        # Only subsets some phase weighs are part of the stream (and of its fingerprint).
        active = [k for k in range(len(subsets)) if any(weights[k] for weights in table)]
        self.subsets = tuple(subsets[k] for k in active)
        resolved: list[MixturePhase] = []
        start, base = 0, np.zeros(len(self.subsets), dtype=np.int64)
        for p, phase in enumerate(phases):
            weights = [table[p][k] for k in active]
            denominator = math.lcm(*(w.denominator for w in weights))
            numerators = tuple(int(w * denominator) for w in weights)
            denominator = sum(numerators)  # normalise: the weights sum to 1
            nblock = max(block, -(-denominator // min(x for x in numerators if x)))
            stop = None
            if phase.sequences is not None:
                length = self._phase_length(phase.sequences, nblock, numerators, denominator, p)
                stop = start + length
            elif p != len(phases) - 1:
                raise LoaderConfigError(f"mixture phase {p} has no length; only the last phase may be unbounded")
            resolved.append(MixturePhase(start, stop, nblock, numerators, denominator, tuple(int(b) for b in base),
                                         derive_key(self.seed, "mixture", p)))
            if stop is not None:
                base = base + apportion(numerators, denominator, stop - start)
                start = stop
        self.phases = tuple(resolved)
        self._starts = np.array([ph.start for ph in self.phases], dtype=np.int64)
        self._start_list = [ph.start for ph in self.phases]
        self._blocks: dict[tuple[int, int], tuple] = {}  # recently used blocks (a batch is in one or two)

    @staticmethod
    def _phase_length(sequences: int, block: int, numerators: tuple[int, ...], denominator: int, p: int) -> int:
        if sequences < 1:
            raise LoaderConfigError(f"mixture phase {p} must last at least one sequence, got {sequences}")
        if all(x * sequences % denominator == 0 for x in numerators):
            return sequences  # whole quotas at the end: the short last block is monotone (module docstring)
        return max(1, round(sequences / block)) * block

    @property
    def stop(self) -> int | None:
        """One past the last position of the stream; None when the last phase is unbounded."""
        return self.phases[-1].stop

    def canonical(self) -> str:
        """A canonical text of the resolved schedule (subsets, exact weights, bounds): the mixture fingerprint."""
        return json.dumps({"subsets": self.subsets, "seed": self.seed, "phases": [
            [ph.start, ph.stop, ph.block, [str(x) for x in ph.numerators], str(ph.denominator)]
            for ph in self.phases]})

    def phase_at(self, position: int) -> int:
        return int(np.searchsorted(self._starts, position, side="right") - 1)

    def locate(self, positions: range | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map global positions to ``(subset index [k] int64, per-subset sequence index [k] int64)``.

        ``positions`` is an array, or a ``range`` (a batch is one: its common case of one block skips the
        grouping below).
        """
        if isinstance(positions, range) and positions.step == 1 and len(positions):
            first, last = positions.start, positions.stop - 1
            self._check_bounds(first, last)
            p = bisect.bisect_right(self._start_list, first) - 1
            ph = self.phases[p]
            k = (first - ph.start) // ph.block
            if (ph.stop is None or last < ph.stop) and (last - ph.start) // ph.block == k:
                start, subset, index = self._block_of(p, k)
                lo = first - ph.start - start
                return subset[lo : lo + len(positions)].astype(np.int64), index[lo : lo + len(positions)].copy()
        pos = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
        if pos.size:
            self._check_bounds(int(pos.min()), int(pos.max()))
        subset = np.empty_like(pos)
        index = np.empty_like(pos)
        phase = np.searchsorted(self._starts, pos, side="right") - 1
        for p in np.unique(phase):
            ph = self.phases[p]
            rows = np.flatnonzero(phase == p)
            blocks = (pos[rows] - ph.start) // ph.block
            for k in np.unique(blocks):
                at = rows[blocks == k]
                start, block_subset, block_index = self._block_of(p, int(k))
                offset = pos[at] - (ph.start + start)
                subset[at], index[at] = block_subset[offset], block_index[offset]
        return subset, index

    def _check_bounds(self, first: int, last: int) -> None:
        if first < 0 or (self.stop is not None and last >= self.stop):
            raise IndexError(f"positions must lie in [0, {self.stop}) for this schedule")

    def _block_of(self, p: int, k: int) -> tuple[int, np.ndarray, np.ndarray]:
        """Block ``k`` of phase ``p``: its first offset in the phase, and each position's subset and
        per-subset index (`_block_labels`; computed once per block, O(block), and kept while recent)."""
        hit = self._blocks.get((p, k))
        if hit is None:
            ph = self.phases[p]
            start = k * ph.block
            stop = start + ph.block if ph.stop is None else min(start + ph.block, ph.stop - ph.start)
            before, cum = _block(ph.numerators, ph.denominator, start, stop)
            key = np.uint64(sub_key(ph.key, np.uint64(k)))
            hit = (start, *_block_labels(stop - start, key, cum, np.add(ph.base, before)))
            if sum(len(h[1]) for h in self._blocks.values()) + len(hit[1]) > _CACHED_POSITIONS:
                self._blocks.clear()
            self._blocks[(p, k)] = hit
        return hit

    def positions_of(self, subset: int, index: np.ndarray) -> np.ndarray:
        """The inverse of `locate` for one subset: the position at which subset ``subset`` (an index into
        `subsets`) is served its sequence ``index[r]``; ``[k]`` int64, -1 where a bounded stream ends first."""
        index = np.ascontiguousarray(index, dtype=np.int64).reshape(-1)
        return np.array([self._position_of(int(subset), j) for j in index.tolist()], dtype=np.int64)

    def _position_of(self, s: int, j: int) -> int:
        for p, ph in enumerate(self.phases):
            local, x = j - ph.base[s], ph.numerators[s]
            if local < 0 or not x:
                continue
            if ph.stop is not None:
                if local >= apportion(ph.numerators, ph.denominator, ph.stop - ph.start)[s]:
                    continue  # served by a later phase, if any
                hi = -(-(ph.stop - ph.start) // ph.block)
            else:  # at n = hi·block the count is at least floor(x·n / denominator) > local
                hi = -(-((local + 1) * ph.denominator) // (x * ph.block))
            lo = 0  # the last block whose start has served at most `local`: counts never fall (module docstring)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if apportion(ph.numerators, ph.denominator, mid * ph.block)[s] <= local:
                    lo = mid
                else:
                    hi = mid
            start, subset, index = self._block_of(p, lo)
            return ph.start + start + int(np.flatnonzero((subset == s) & (index == j))[0])
        return -1

    def served(self, position: int) -> np.ndarray:
        """``[S]`` int64: sequences of each subset served at positions ``< position`` (no replay)."""
        if position < 0 or (self.stop is not None and position > self.stop):
            raise IndexError(f"position must lie in [0, {self.stop}]")
        p = self.phase_at(position)
        ph = self.phases[p]
        k, r = divmod(position - ph.start, ph.block)
        before = apportion(ph.numerators, ph.denominator, k * ph.block)
        if r:
            before = before + np.bincount(self._block_of(p, k)[1][:r], minlength=len(self.subsets))
        return np.add(ph.base, before)
