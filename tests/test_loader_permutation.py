"""Keyed permutations: bijections of [0, n), never materialised, uncorrelated, new per key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_checks import check_permutation

from marin_data.loader.permutation import SHUFFLES, derive_key, feistel, hierarchical, shuffle


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 2**20 + 1])
@pytest.mark.parametrize("name", sorted(SHUFFLES))
def test_every_shuffle_is_a_bijection_of_its_range(name, n):
    check_permutation(lambda i: shuffle(name, n, derive_key(7, "test"), i, block=1000, window=3), n)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32), block=st.integers(1, 500), window=st.integers(1, 9))
def test_hierarchical_is_a_bijection_for_any_block_and_window(n, seed, block, window):
    check_permutation(lambda i: hierarchical(n, derive_key(seed), i, block, window), n)


def _spearman(image: np.ndarray) -> float:
    # The ranks of i are i and the ranks of a permutation are its values: Spearman is Pearson of (i, p(i)).
    x = np.arange(len(image), dtype=np.float64) - (len(image) - 1) / 2
    y = image - (len(image) - 1) / 2
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


def test_feistel_shows_no_rank_correlation_at_a_million():
    n = 10**6
    image = check_permutation(lambda i: feistel(n, derive_key(0, "rho"), i), n)
    assert abs(_spearman(image)) < 0.01


def test_hierarchical_shows_no_rank_correlation_with_many_blocks():
    n = 10**6
    # 100,000 blocks: the block order alone would give |rho| ~ 1/sqrt(blocks) = 0.003 by chance.
    assert abs(_spearman(hierarchical(n, derive_key(0, "rho"), np.arange(n), 10, 4))) < 0.01


def test_different_keys_give_unrelated_orders():
    n = 10**5
    a, b = (feistel(n, derive_key(0, "subset", epoch), np.arange(n)) for epoch in (0, 1))
    assert np.mean(a == b) < 0.001
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


def test_hierarchical_reads_each_block_in_one_window_of_the_pass():
    n, block, window = 10_000, 100, 4
    image = hierarchical(n, derive_key(3), np.arange(n), block, window)
    group_of_block = {}
    for t, v in enumerate(image):
        group_of_block.setdefault(v // block, set()).add(t // (block * window))
    assert all(len(groups) == 1 for groups in group_of_block.values())
    # ... while the order inside a window is shuffled, not sequential.
    assert np.mean(np.diff(image[: block * window]) == 1) < 0.05


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="indices"):
        feistel(5, 1, [5])
    with pytest.raises(ValueError, match="unknown shuffle"):
        shuffle("random", 5, 1, [0])
    with pytest.raises(ValueError, match="block"):
        hierarchical(5, 1, [0], 0, 1)
