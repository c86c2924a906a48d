"""One ``train_lm`` run's order: global index <-> (component, sequence of the component's cache).

It composes Levanter's pieces exactly as ``LmDataConfig.train_set`` does (levanter/data/text/datasets.py):

1. keys: ``data_key = split(PRNGKey(trainer.seed), 4)[0]``, or ``PRNGKey(data_seed)``; ``mix_key,
   shuffle_key = split(data_key)``; the components with a positive weight in some stage take, in config
   order, the successive subkeys of ``key_iterator(shuffle_key)`` (only when ``shuffle`` is on);
2. per component: ``n = tokens // seq_len`` sequences; a validation split keeps positions ``[0, n - v)`` of
   a Feistel permutation keyed ``PRNGKey(0)`` (or of the identity without ``shuffle_before_trainval_split``);
   then the shuffle; then ``experiment_budget / target_budget`` and ``max_train_batches`` cut the length;
3. the mixture (`Mixture`) maps a global index to (component, dataset index), which wraps modulo the
   component's length (``restart``; ``first_exhausted`` ends the run at the first wrap instead);
4. the batch schedule maps a step to its global indices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from marin_data.errors import TrainConfigError
from marin_data.levanter.order.config import LevanterRun
from marin_data.levanter.order.mixture import Mixture
from marin_data.levanter.order.schedule import BatchSchedule
from marin_data.levanter.order.shuffle import BlockShuffle, Feistel, Identity, Permutation, make_permutation
from marin_data.levanter.order.threefry import prng_key, split

__all__ = ["ComponentChain", "RunOrder", "data_key"]

_INT32 = 2**31


def data_key(run: LevanterRun) -> np.ndarray:
    """The key ``train_lm`` hands ``train_set``."""
    if run.data_seed is not None:
        return prng_key(run.data_seed)
    return split(prng_key(run.seed), 4)[0]


@dataclass
class ComponentChain:
    """Dataset index of one component -> sequence of its cache, and back."""

    name: str
    sequences: int  # in the cache: tokens // seq_len
    split_perm: Permutation  # validation split, over `sequences`
    train: int  # after the validation split
    shuffle: Permutation  # over `train`
    length: int  # after the budget and max_train_batches cuts: the length the mixture wraps at

    def sequence(self, d: np.ndarray) -> np.ndarray:
        """Dataset indices (already wrapped, in ``[0, length)``) -> sequences of the cache."""
        return self.split_perm(self.shuffle(d))

    def positions(self, j: np.ndarray) -> np.ndarray:
        """Sequences of the cache -> the dataset index reading each, or -1 (validation, or cut off)."""
        p = self.split_perm.inverse(j)
        out = np.full(p.shape, -1, dtype=np.int64)
        kept = p < self.train
        if kept.any():
            d = self.shuffle.inverse(p[kept])
            out[kept] = np.where(d < self.length, d, -1)
        return out


def _chain(run: LevanterRun, name: str, tokens: int, key: np.ndarray | None, batch0: int) -> ComponentChain:
    n = tokens // run.seq_len
    held = run.validation.get(name)
    if held is not None and held > n:
        raise TrainConfigError(f"data.num_validation_sequences.{name} is {held:,}, but the cache holds {n:,} "
                               "sequences")
    train = n - (held or 0)
    split_perm = Feistel.from_key(n, prng_key(0)) if held is not None and run.shuffle_before_split else Identity(n)
    kind = run.shuffle.kind
    if kind == "full":
        shuffle = make_permutation(run.shuffle.perm_type, train, key)
    elif kind == "block":
        shuffle = BlockShuffle(train, run.shuffle.io_block_size, run.shuffle.window_blocks, key,
                               run.shuffle.perm_type)
    else:
        shuffle = Identity(train)
    length = train if run.budget_ratio is None else int(train * run.budget_ratio)
    if name in run.max_train_batches:
        wanted = run.max_train_batches[name] * batch0
        if wanted > length:
            raise TrainConfigError(f"data.max_train_batches.{name} asks {wanted:,} sequences of the {length:,} it "
                                   "has (Levanter refuses that too)")
        length = wanted
    return ComponentChain(name, n, split_perm, train, shuffle, length)


class RunOrder:
    """The order of a run, given each component's token count (from its ledger).

    Args:
        run: the parsed YAML.
        tokens: component name -> tokens in its train cache (only those with a positive weight are needed).
    """

    def __init__(self, run: LevanterRun, tokens: dict[str, int]) -> None:
        self.run = run
        self.batches = BatchSchedule(tuple(run.batch))
        mix_key, shuffle_key = split(data_key(run), 2)
        stages = [(self.batches.offset(step), w) for step, w in run.stages]
        self.mixture = Mixture(list(run.components), stages, run.block_size, mix_key)
        self.names = self.mixture.names
        keys: list = []
        if run.shuffle.kind != "none":
            k = shuffle_key
            for _ in self.names:
                k, sub = split(k, 2)
                keys.append(sub)
        else:
            keys = [None] * len(self.names)
        batch0 = self.batches.batch_size(0)
        self.chains = [_chain(run, name, tokens[name], key, batch0) for name, key in zip(self.names, keys)]
        for chain in self.chains:
            if chain.length <= 0:
                raise TrainConfigError(f"component {chain.name!r} has no training sequence (its cache holds "
                                       f"{chain.sequences:,} of {run.seq_len:,} tokens)")

    def slots(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global indices -> (component number into ``names``, sequence in its cache)."""
        component, d = self.mixture.locate(np.asarray(indices, dtype=np.int64))
        if d.size and d.max() >= _INT32:
            raise TrainConfigError("this far into the run Levanter's int32 per-component counters overflow; "
                                   "marin does not reproduce that")
        lengths = np.array([c.length for c in self.chains], dtype=np.int64)[component]
        if self.run.stop_strategy == "first_exhausted" and np.any(d >= lengths):
            raise TrainConfigError("the run has ended here: with stop_strategy first_exhausted a component ran out")
        d = d % lengths
        sequence = np.empty_like(d)
        for c in np.unique(component):
            sel = component == c
            sequence[sel] = self.chains[int(c)].sequence(d[sel])
        return component, sequence

    def step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The slots of step ``step``, in batch order."""
        r = self.batches.indices(step)
        return self.slots(np.arange(r.start, r.stop, dtype=np.int64))

    def global_indices(self, component: int, sequences: np.ndarray, until_index: int) -> np.ndarray:
        """Every global index below ``until_index`` that reads one of ``sequences`` of ``component``, in order.

        Each sequence's dataset index is found by inverting the shuffles once; the mixture is then inverted
        once per epoch of the component (``d + e * length``), never by scanning steps.
        """
        chain = self.chains[component]
        d = chain.positions(np.asarray(sequences, dtype=np.int64))
        d = np.unique(d[d >= 0])
        found = []
        wrap = self.run.stop_strategy != "first_exhausted"
        epoch = 0
        while d.size:
            indices = self.mixture.indices_of(component, d + epoch * chain.length)
            indices = indices[(indices >= 0) & (indices < until_index)]
            found.append(indices)
            epoch += 1
            if not wrap or not self._reaches(component, epoch * chain.length, until_index):
                break
        return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)

    def _reaches(self, component: int, dataset_index: int, until_index: int) -> bool:
        """Whether ``component`` serves dataset index ``dataset_index`` before global index ``until_index``."""
        first = self.mixture.indices_of(component, np.array([dataset_index]))[0]
        block = self.mixture.block_size
        return first >= 0 and first // block * block < until_index  # its block's slots come in any order
