"""``marin-train export --format transformers``: transformers loads the model and computes our logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from test_train import corpus  # noqa: F401 - corpus is a fixture

from marin_data.errors import UnexportableModelError
from marin_model.config import get_preset, with_overrides
from marin_model.model import Transformer
from marin_train.cli import main
from marin_train.export_hf import export_transformers

transformers = pytest.importorskip("transformers")

TINY = get_preset("tiny")  # GQA: 2 KV heads on window layers, 1 on global ones; a latent; a shared expert
CONFIGS = {
    "softmax_topk, latent, shared": dict(moe_routing="softmax_topk", moe_bias_update="sign", moe_route_scale=1.7),
    "topk_softmax (Mixtral), top-3": dict(moe_routing="topk_softmax", moe_bias_update="none", moe_top_k=3),
    "no renormalisation, no latent, no shared expert, tied": dict(
        moe_routing="softmax_topk", moe_bias_update="none", moe_renormalize=False, moe_latent_dim=0,
        moe_num_shared=0, tie_embeddings=True),
    "every layer global, MHA, two shared experts": dict(
        moe_routing="softmax_topk", moe_bias_update="none", global_every=1, n_kv_heads=4, n_kv_heads_global=4,
        moe_num_shared=2, moe_shared_dim=24),
}


def _saved(tmp_path, cfg, seed=0, bias=None):
    """A random model of `cfg` (every layer's balancing bias set to `bias` if given), written as `marin-train
    export` writes one (what `load_model` reads)."""
    torch.manual_seed(seed)
    model = Transformer(cfg).eval()
    for block in model.blocks if bias is not None else ():
        block.moe.bias_E.copy_(bias)
    _write(tmp_path / "marin", cfg, model.state_dict())
    return model, tmp_path / "marin"


def _write(source, cfg, state):
    source.mkdir(exist_ok=True)
    save_file({k: v.clone() for k, v in state.items()}, source / "model.safetensors")  # tied weights: copies
    (source / "config.json").write_text(json.dumps(json.loads(json.dumps(cfg, default=vars))))


@pytest.mark.parametrize("name", CONFIGS)
def test_transformers_computes_our_logits(tmp_path, name):
    torch.set_num_threads(1)
    model, source = _saved(tmp_path, with_overrides(TINY, **CONFIGS[name]))
    out = export_transformers(source, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen2MoeForCausalLM"
    tokens = torch.randint(0, TINY.vocab_size, (2, 3 * TINY.window))  # past the window: sliding layers slide
    with torch.no_grad():
        ours, theirs = model(tokens).logits, hf(tokens).logits
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-5), (ours - theirs).abs().max()
    assert json.loads((out / "generation_config.json").read_text())["max_length"] == TINY.max_seq_len


def test_a_constant_bias_chooses_the_same_experts_and_is_exported(tmp_path):
    torch.set_num_threads(1)
    cfg = with_overrides(TINY, moe_routing="topk_softmax", moe_bias_update="sign")
    model, source = _saved(tmp_path, cfg, bias=torch.full((cfg.moe.num_experts,), 0.25))
    hf = transformers.AutoModelForCausalLM.from_pretrained(export_transformers(source, tmp_path / "hf"),
                                                           dtype=torch.float32).eval()
    tokens = torch.randint(0, TINY.vocab_size, (1, 40))
    with torch.no_grad():
        assert torch.allclose(model(tokens).logits, hf(tokens).logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("changes", "named"), [
    (dict(moe_routing="sigmoid"), "moe.routing='sigmoid'"),
    (dict(moe_routing="softmax_topk", moe_bias_update="none", moe_n_group=2, moe_topk_group=1), "moe.n_group=2"),
])
def test_an_option_transformers_cannot_compute_is_refused_by_name(tmp_path, changes, named):
    _, source = _saved(tmp_path, with_overrides(TINY, **changes))
    with pytest.raises(UnexportableModelError, match=named):
        export_transformers(source, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_balancing_bias_that_changes_the_choice_is_refused(tmp_path):
    cfg = with_overrides(TINY, moe_routing="softmax_topk", moe_bias_update="sign")
    model, source = _saved(tmp_path, cfg)
    state = model.state_dict()
    state["blocks.1.moe.bias_E"][3] = 1e-3
    _write(source, cfg, state)
    with pytest.raises(UnexportableModelError, match="layer 1: the balancing bias"):
        export_transformers(source, tmp_path / "hf")


def test_the_cli_refuses_a_sigmoid_routed_run_with_a_usage_error(corpus, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["--data", str(corpus.root), "--steps", "1", "--batch-size", "2", "--seq-len", "32",
              "--checkpoint-dir", str(run)])
    assert exit_.value.code == 0
    with pytest.raises(SystemExit) as exit_:
        main(["export", str(run), "--to", str(tmp_path / "hf"), "--format", "transformers"])
    assert exit_.value.code == 2 and "moe.routing='sigmoid'" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
