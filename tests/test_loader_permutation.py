"""Keyed permutations: bijections of [0, n), never materialised, uncorrelated, new per key."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_checks import check_inverse, check_permutation

from marin_data.loader.shuffle import SHUFFLES, feistel, hierarchical, shuffle, unshuffle
from marin_data.loader.shuffle.keys import derive_key


def shards_of(n: int, size: int) -> np.ndarray:
    """Cumulative item counts of ``n`` items cut into shards of ``size`` (the last one shorter)."""
    return np.append(np.arange(0, n, size), n)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 2**20 + 1])
@pytest.mark.parametrize("name", SHUFFLES)
def test_every_shuffle_is_a_bijection_of_its_range(name, n):
    check_permutation(lambda i: shuffle(name, shards_of(n, 1000), derive_key(7, "test"), i, window=3), n)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), max_size=40), seed=st.integers(0, 2**32), window=st.integers(1, 9))
def test_hierarchical_is_a_bijection_for_any_shards_and_window(sizes, seed, window):
    starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    check_permutation(lambda i: hierarchical(starts, derive_key(seed), i, window), int(starts[-1]))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 100_003])
@pytest.mark.parametrize("name", SHUFFLES)
def test_unshuffle_finds_the_index_each_shuffled_value_came_from(name, n):
    key = derive_key(7, "test")
    check_inverse(lambda i: shuffle(name, shards_of(n, 1000), key, i, window=3),
                  lambda u: unshuffle(name, shards_of(n, 1000), key, u, window=3), n)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 300), max_size=40), seed=st.integers(0, 2**32), window=st.integers(1, 9))
def test_the_hierarchical_shuffle_is_inverted_for_any_shards_and_window(sizes, seed, window):
    starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    check_inverse(lambda i: shuffle("hierarchical", starts, derive_key(seed), i, window),
                  lambda u: unshuffle("hierarchical", starts, derive_key(seed), u, window), int(starts[-1]))


def _spearman(image: np.ndarray) -> float:
    # The ranks of i are i and the ranks of a permutation are its values: Spearman is Pearson of (i, p(i)).
    x = np.arange(len(image), dtype=np.float64) - (len(image) - 1) / 2
    y = image - (len(image) - 1) / 2
    return float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))


def test_feistel_shows_no_rank_correlation_at_a_million():
    n = 10**6
    image = check_permutation(lambda i: feistel(n, derive_key(0, "rho"), i), n)
    assert abs(_spearman(image)) < 0.01


def test_hierarchical_shows_no_rank_correlation_with_many_shards():
    n = 10**6
    # 100,000 shards: the shard order alone would give |rho| ~ 1/sqrt(shards) = 0.003 by chance.
    assert abs(_spearman(hierarchical(shards_of(n, 10), derive_key(0, "rho"), np.arange(n), 4))) < 0.01


def test_different_keys_give_unrelated_orders():
    n = 10**5
    a, b = (feistel(n, derive_key(0, "subset", epoch), np.arange(n)) for epoch in (0, 1))
    assert np.mean(a == b) < 0.001
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02


def test_hierarchical_reads_each_shard_in_one_stretch_of_the_pass_with_at_most_window_others():
    rng = np.random.default_rng(0)
    starts = np.concatenate(([0], np.cumsum(rng.integers(0, 200, 100))))  # uneven shards, some empty
    window = 4
    image = hierarchical(starts, derive_key(3), np.arange(starts[-1]), window)
    shard = np.searchsorted(starts, image, side="right") - 1
    for s in np.unique(shard):
        first, last = np.flatnonzero(shard == s)[[0, -1]]
        assert len(np.unique(shard[first : last + 1])) <= window, f"shard {s} is read in several stretches"
    # ... while the order inside a stretch is shuffled, not sequential.
    assert np.mean(np.diff(image) == 1) < 0.05


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="indices"):
        feistel(5, 1, [5])
    with pytest.raises(ValueError, match="unknown shuffle"):
        shuffle("random", [0, 5], 1, [0])
    with pytest.raises(ValueError, match="window"):
        hierarchical([0, 5], 1, [0], 0)
    with pytest.raises(ValueError, match="cumulative"):
        hierarchical([0, 5, 3], 1, [0], 1)
