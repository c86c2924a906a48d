"""Presets and parameter counts: the meta-device count equals the documented formula and the published totals."""

import pytest

from marin_model.config import PRESETS, MoEConfig, get_preset, with_overrides
from marin_model.params import PUBLISHED, count_params, formula_params

MARIN = PRESETS["marin-535b-a23b"]


def check_counts_match_formula(cfg) -> None:
    assert count_params(cfg) == formula_params(cfg)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_meta_device_count_equals_formula_for_presets(name):
    check_counts_match_formula(PRESETS[name])


@pytest.mark.parametrize("changes", [dict(tie_embeddings=True), dict(moe_latent_dim=0), dict(moe_num_shared=0),
                                     dict(n_layers=5, global_every=2)])
def test_meta_device_count_equals_formula_for_variants(changes):
    check_counts_match_formula(with_overrides(PRESETS["tiny"], **changes))


def test_exact_counts_of_both_presets():
    marin = count_params(MARIN)
    assert (marin.total, marin.active_non_embedding, marin.embedding) == \
        (535_192_737_792, 22_649_837_568, 1_576_009_728)
    # The usual figures (535,192,141,824 / 22,649,241,600) are ours without the 48*2*6144 + 6144 RMSNorm weights.
    norms = 48 * 2 * 6144 + 6144
    assert (marin.total - norms, marin.active_non_embedding - norms) == (535_192_141_824, 22_649_241_600)
    assert (marin.published_total, marin.published_active_non_embedding) == (535_305_984_000, 22_763_083_776)
    tiny = count_params(PRESETS["tiny"])
    assert (tiny.total, tiny.active_non_embedding, tiny.embedding) == (254_528, 115_264, 65_536)


def test_marin_matches_published_totals_and_tied_embeddings_do_not():
    total, active = PUBLISHED["marin-535b-a23b"]
    for counts in (count_params(MARIN), formula_params(MARIN)):
        for value in (counts.total, counts.published_total):
            assert abs(value - total) / total < 1e-3
        for value in (counts.active_non_embedding, counts.published_active_non_embedding):
            assert abs(value - active) / active < 1e-2
    tied = count_params(with_overrides(MARIN, tie_embeddings=True))
    assert abs(tied.published_total - total) / total > 1e-3
    assert abs(tied.total - total) / total > 1e-3


def test_layer_pattern_puts_a_global_layer_every_fourth():
    assert [i for i in range(MARIN.n_layers) if MARIN.is_global(i)] == list(range(3, 48, 4))


@pytest.mark.parametrize("bad", [dict(routing="argmax"), dict(bias_update="aux"), dict(top_k=384),
                                 dict(routing="softmax_topk", bias_update="quantile")])
def test_invalid_moe_config_is_rejected(bad):
    with pytest.raises(ValueError):
        MoEConfig(**bad)


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(KeyError, match="tiny"):
        get_preset("marin-8b")
