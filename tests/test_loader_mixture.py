"""Mixture schedules: cumulative apportionment, lossless phase changes, no replay."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loader_checks import check_mixture

from marin_data.errors import InvalidManifestError, LoaderConfigError
from marin_data.loader.mixture import Mixture, Phase, apportion, phases_by_fraction, resolve_weights

NAMES = ["a", "b", "c", "d", "e"]
TOKENS = [100, 200, 300, 400, 500]
weights = st.lists(st.sampled_from([0.001, 0.01, 0.1, 0.2, 0.3, 0.5, 1.0, 3.0]), min_size=2, max_size=5)


def test_weights_half_three_tenths_fifth_with_blocks_of_8_stay_exact_where_per_block_rounding_drifts():
    mixture = Mixture(NAMES[:3], TOKENS[:3], {"a": 0.5, "b": 0.3, "c": 0.2}, seed=0, block=8)
    check_mixture(mixture, 8 * 500)
    # Per-block largest remainder would give 4/2/2 in every block: 0.25 for "b" after 500 blocks.
    assert mixture.served(8 * 500).tolist() == [2000, 1200, 800]


@settings(max_examples=40, deadline=None)
@given(w=weights, block=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_every_subset_is_within_one_of_its_target_at_every_block_boundary(w, block, seed):
    mixture = Mixture(NAMES[: len(w)], TOKENS[: len(w)], dict(zip(NAMES, w)), seed=seed, block=block)
    check_mixture(mixture, min(20_000, 100 * mixture.phases[0].block))


def test_a_weight_of_one_thousandth_gets_exactly_one_slot_per_block():
    mixture = Mixture(NAMES[:2], TOKENS[:2], {"a": 0.999, "b": 0.001}, seed=1, block=64)
    assert mixture.phases[0].block == 1000
    subset, _ = check_mixture(mixture, 20_000)
    assert all((subset[k * 1000 : (k + 1) * 1000] == 1).sum() == 1 for k in range(20))


@settings(max_examples=25, deadline=None)
@given(first=weights, second=weights, length=st.integers(1, 3000), seed=st.integers(0, 2**31))
def test_schedule_changes_lose_and_repeat_nothing(first, second, length, seed):
    phases = [Phase(dict(zip(NAMES, first)), length), Phase(dict(zip(NAMES, second)))]
    mixture = Mixture(NAMES, TOKENS, phases, seed=seed, block=16)
    check_mixture(mixture, mixture.phases[0].stop + 2 * mixture.phases[1].block + 5)


def test_phases_by_token_fraction_split_the_budget_eighty_twenty():
    phases = phases_by_fraction([(0.8, {"a": 1, "b": 2}), (0.2, {"a": 1})], total_tokens=4096 * 10_000,
                                seq_len=4096)
    assert [p.sequences for p in phases] == [8000, 2000]
    mixture = Mixture(NAMES[:2], TOKENS[:2], phases, seed=0)
    # 8000/3 is not whole, so phase 0 is rounded to whole blocks of 1024; phase 1's quota is whole.
    assert [(ph.start, ph.stop) for ph in mixture.phases] == [(0, 8192), (8192, 10_192)]
    assert mixture.served(mixture.stop).tolist() == [2731 + 2000, 5461]
    with pytest.raises(IndexError):
        mixture.locate([mixture.stop])


def test_locating_a_position_a_billion_steps_in_needs_no_replay():
    mixture = Mixture(NAMES, TOKENS, {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.099, "e": 0.001}, seed=5)
    far = 11_264 * 1_000_000  # step 1,000,000 of the hero run's global batch
    subset, index = mixture.locate(np.arange(far, far + 11_264))
    served = mixture.served(far)
    assert served.sum() == far
    assert np.all(np.abs(served - mixture.phases[0].weights() * far) <= 1 + mixture.phases[0].block)
    for s in range(5):  # the batch continues each subset exactly where the count before it ends
        got = np.sort(index[subset == s])
        assert np.array_equal(got, served[s] + np.arange(len(got)))


def test_the_position_of_a_sequence_a_billion_steps_in_is_found_without_a_scan():
    mixture = Mixture(NAMES, TOKENS, [Phase({"a": 0.5, "e": 0.5}, 4096), Phase({"a": 0.4, "b": 0.3, "c": 0.2,
                                      "d": 0.099, "e": 0.001})], seed=5)
    far = 11_264 * 1_000_000
    served = mixture.served(far)
    for s in range(5):
        position = int(mixture.positions_of(s, [served[s]])[0])
        subset, index = mixture.locate([position])
        assert position >= far and (subset.tolist(), index.tolist()) == ([s], [served[s]])
    bounded = Mixture(NAMES, TOKENS, [Phase({"a": 0.5, "b": 0.5}, 64)], seed=1, block=8)
    assert bounded.positions_of(0, [31, 32]).tolist()[1] == -1  # past the stream's end


def test_a_pattern_splits_its_weight_by_tokens_and_exact_names_take_precedence():
    names, tokens = ["pre/a", "pre/b", "pre/c"], [100, 300, 600]
    got = resolve_weights({"pre": Fraction(1, 2), "pre/c": Fraction(1, 2)}, names, tokens)
    assert got == [Fraction(1, 8), Fraction(3, 8), Fraction(1, 2)]


@pytest.mark.parametrize("weights, error", [
    ({"a": -1, "b": 1}, LoaderConfigError),
    ({"a": float("nan")}, LoaderConfigError),
    ({"a": 0, "b": 0}, LoaderConfigError),
    ({"zzz": 1}, InvalidManifestError),
    ({"*": 1, "?": 1}, LoaderConfigError),
])
def test_bad_weights_are_refused_with_a_typed_error(weights, error):
    with pytest.raises(error):
        Mixture(NAMES, TOKENS, weights, seed=0)


def test_mixture_errors_name_the_mixture_and_weights_off_one_are_normalised_with_a_warning(make_corpus, tmp_path):
    import warnings

    from marin_data.cli._errors import describe
    from marin_data.loader import LoaderConfig, TokenStream

    corpus = make_corpus({"a": [20], "b": [20]})
    with pytest.raises(InvalidManifestError) as e:
        TokenStream(corpus, LoaderConfig(seq_len=8, mixture={"a": 1, "nope": 1}), cache_dir=tmp_path)
    message, code = describe(e.value)
    assert message.startswith("mixture pattern 'nope' matches no subset") and "--subset" not in message
    assert "root of a marin corpus" not in message and code == 2
    with pytest.warns(UserWarning, match="sum to 3 .*normalised"):
        TokenStream(corpus, LoaderConfig(seq_len=8, mixture={"a": 2, "b": 1}), cache_dir=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TokenStream(corpus, LoaderConfig(seq_len=8, mixture={"a": 0.7, "b": 0.3}), cache_dir=tmp_path)
        TokenStream(corpus, LoaderConfig(seq_len=8), cache_dir=tmp_path)  # token counts: no mixture given


def test_only_subsets_with_a_positive_weight_somewhere_are_part_of_the_stream():
    mixture = Mixture(NAMES, TOKENS, [Phase({"a": 1, "b": 0}, 10), Phase({"c": 1})], seed=0)
    assert mixture.subsets == ("a", "c")


def test_apportionment_is_exact_integer_arithmetic():
    assert apportion((1, 1, 1), 3, 10).tolist() == [4, 3, 3]
    assert apportion((0, 5), 5, 7).tolist() == [0, 7]
