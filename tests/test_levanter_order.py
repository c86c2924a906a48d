"""Levanter's training order in numpy against golden fixtures written by REAL Levanter and JAX
(scripts/make_levanter_order_fixtures.py): threefry known answers, then every slot of a few steps of runs
covering each shuffle kind, staged weights, a data seed, validation splits, budgets and max_train_batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marin_data.levanter.order.config import parse_run
from marin_data.levanter.order.jaxperm import inverse, num_rounds, permutation
from marin_data.levanter.order.run import RunOrder
from marin_data.levanter.order.shuffle import BlockShuffle, Feistel, Linear
from marin_data.levanter.order.threefry import fold_in, prng_key, random_bits, randint, split

FIXTURES = Path(__file__).parent / "fixtures" / "levanter_order"
KATS = sorted(FIXTURES.glob("threefry-*.json"))
ORDERS = sorted(set(FIXTURES.glob("*.json")) - set(KATS))


def check_permutation(perm, n: int) -> None:
    """A bijection of [0, n) whose inverse undoes it."""
    out = perm(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    assert perm.inverse(out).tolist() == list(range(n))


@pytest.mark.parametrize("path", KATS, ids=lambda p: p.stem)
def test_threefry_matches_jax_known_answers(path):
    kat = json.loads(path.read_text())
    assert kat["partitionable"]
    for case in kat["cases"]:
        key = prng_key(case["seed"])
        assert key.tolist() == case["key"]
        assert split(key, 3).tolist() == case["split3"]
        assert fold_in(key, 7).tolist() == case["fold_in_7"]
        assert fold_in(key, 4_000_000_000).tolist() == case["fold_in_big"]
        assert random_bits(key, 6).tolist() == case["bits6"]
        assert randint(key, 5, 0, 1000).tolist() == case["randint_0_1000"]
        assert int(randint(key, 1, 0, 2**30)[0]) == case["randint_2pow30"]
        assert randint(key, 4, -50, 77).tolist() == case["randint_neg"]
        assert permutation(key, 10).tolist() == case["perm10"]
        p = permutation(key, 2000)
        assert p[:16].tolist() == case["perm2000_head"]
        assert int((p.astype(np.int64) ** 2 * np.arange(2000)).sum()) == case["perm2000_sum_sq"]
        p = permutation(key, 200_000)
        assert int((p.astype(np.int64) ** 2 * np.arange(200_000)).sum()) == case["perm200000_sum_sq"]


def test_jax_permutation_rounds_grow_with_the_length():
    assert [num_rounds(n) for n in (0, 1, 2, 1625, 1626, 49_152)] == [0, 0, 1, 1, 2, 2]
    p = permutation(prng_key(5), 49_152)
    assert np.array_equal(inverse(p)[p], np.arange(49_152))


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 1000])
def test_component_shuffles_are_bijections_with_inverses(n):
    key = prng_key(n)
    check_permutation(Feistel.from_key(n, key), n)
    check_permutation(Linear.from_key(n, key), n)
    check_permutation(BlockShuffle(n, 4, 3, key), n)
    check_permutation(BlockShuffle(n, 7, 2, key, "linear"), n)


@pytest.mark.parametrize("path", ORDERS, ids=lambda p: p.stem)
def test_every_slot_matches_real_levanter(path):
    fixture = json.loads(path.read_text())
    order = RunOrder(parse_run(fixture["config"]), fixture["tokens"])
    for step, want in fixture["steps"].items():
        component, sequence = order.step(int(step))
        got = [[order.names[c], int(j)] for c, j in zip(component, sequence)]
        assert got == want, f"step {step}"
