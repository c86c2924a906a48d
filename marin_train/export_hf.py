"""A saved model as a Hugging Face ``transformers`` model: ``AutoModelForCausalLM.from_pretrained(DIR)``.

The target is Qwen2-MoE (``Qwen2MoeForCausalLM``), the built-in architecture that computes what ours computes:
pre-norm RMSNorm blocks, grouped-query attention without biases or qk-norm, rotary positions in the same
rotate-half (Llama) layout as ``apply_rope`` (so q and k need no permutation), a sliding window or global
attention per layer (``layer_types``, the query's own token inside the window as here), SwiGLU experts chosen
by a softmax router, and a shared expert. What differs is mapped exactly: global layers' fewer KV heads are
repeated up to one head count for every layer, the latent down/up projections are multiplied into each routed
expert, ``route_scale`` into the experts' output weights, and the shared expert's sigmoid gate is zero (0.5)
with its output weights doubled. "topk_softmax" (Mixtral) is the renormalised "softmax_topk".

Refused (`UnexportableModelError`, naming the option): ``routing="sigmoid"`` (selection on logit + bias has
no transformers equivalent), a balancing bias that would change which experts are chosen, ``n_group > 1``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save
from torch import Tensor

from marin_data.errors import UnexportableModelError
from marin_model.config import ModelConfig
from marin_model.model import Block, Transformer
from marin_train.checkpoint import atomic_write
from marin_train.export import load_model

__all__ = ["export_transformers", "check_exportable", "transformers_config", "transformers_state_dict"]

WEIGHTS = "model.safetensors"


def export_transformers(source: str | os.PathLike, to: str | os.PathLike) -> Path:
    """Write ``to/config.json`` and ``to/model.safetensors`` that ``transformers`` loads as a Qwen2-MoE model,
    with ``generation_config.json``, and the run's ``tokenizer.json`` (and a ``tokenizer_config.json`` naming
    the fast tokenizer) when it recorded one. ``source``: a checkpoint, a run directory or an exported model.

    Raises:
        UnexportableModelError: the model uses an option that Qwen2-MoE cannot compute (the module docstring).
        InvalidCheckpointError: ``source`` is not a saved model.
    """
    saved = load_model(source)
    model, cfg = saved.model, saved.model.cfg
    check_exportable(model, path=str(saved.path))
    tensors = transformers_state_dict(model)
    to = Path(to)
    to.mkdir(parents=True, exist_ok=True)
    atomic_write(to / WEIGHTS, lambda f: f.write(save(tensors, metadata={"format": "pt"})))
    _write_json(to / "config.json", transformers_config(cfg))
    _write_json(to / "generation_config.json", {"max_length": cfg.max_seq_len})
    if saved.tokenizer is not None:
        atomic_write(to / "tokenizer.json", lambda f: shutil.copyfileobj(saved.tokenizer.open("rb"), f))
        _write_json(to / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast",
                                                   "model_max_length": cfg.max_seq_len})
    return to


def check_exportable(model: Transformer, path: str | None = None) -> None:
    """Raises `UnexportableModelError` naming the first option of ``model`` that Qwen2-MoE cannot compute."""
    m = model.cfg.moe
    if m.routing == "sigmoid":
        raise UnexportableModelError(
            "moe.routing='sigmoid' has no transformers equivalent: Marin chooses experts on logit + bias, "
            "DeepSeek-V3-style models on sigmoid(logit) + bias; export models routed by softmax_topk or "
            "topk_softmax", path=path, actual=m.routing)
    if m.n_group > 1:
        raise UnexportableModelError(
            f"moe.n_group={m.n_group}: group-limited routing has no equivalent in Qwen2-MoE's router",
            path=path, actual=m.n_group)
    for i, block in enumerate(model.blocks):
        bias_E = block.moe.bias_E
        if bool((bias_E != bias_E[0]).any()):  # a constant shift chooses the same experts
            raise UnexportableModelError(
                f"layer {i}: the balancing bias (moe.bias_update={m.bias_update!r}) changes which experts are "
                "chosen, and Qwen2-MoE's router has no selection bias", path=path,
                actual=float((bias_E - bias_E[0]).abs().max()))


def transformers_config(cfg: ModelConfig) -> dict:
    """The ``config.json`` of the Qwen2-MoE model that computes ``cfg``'s model."""
    m = cfg.moe
    return {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": kv_heads(cfg),
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rope_theta": cfg.rope_theta,  # where transformers 4.x reads it
        "tie_word_embeddings": cfg.tie_embeddings,
        "qkv_bias": False,
        "use_sliding_window": True,
        "sliding_window": cfg.window,
        "max_window_layers": cfg.n_layers,
        "layer_types": ["full_attention" if cfg.is_global(i) else "sliding_attention" for i in range(cfg.n_layers)],
        "num_experts": m.num_experts,
        "num_experts_per_tok": m.top_k,
        "moe_intermediate_size": m.expert_dim,
        "shared_expert_intermediate_size": _shared_width(cfg),
        "norm_topk_prob": m.routing == "topk_softmax" or m.renormalize,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "initializer_range": cfg.init_std,
        "torch_dtype": "float32",
    }


def kv_heads(cfg: ModelConfig) -> int:
    """One KV head count for every layer: the least common multiple of the window and global layers' (a
    divisor of ``n_heads``, as both are), each head repeated so every query head reads the same values."""
    return math.lcm(cfg.n_kv_heads, cfg.n_kv_heads_global)


def transformers_state_dict(model: Transformer) -> dict[str, Tensor]:
    """``model``'s weights under Qwen2-MoE's names (one tensor per expert, as its published checkpoints are)."""
    tensors = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight}
    if not model.cfg.tie_embeddings:
        tensors["lm_head.weight"] = model.lm_head.weight
    for i, block in enumerate(model.blocks):
        tensors.update(_block_tensors(model.cfg, block, f"model.layers.{i}."))
    return {name: t.detach().float().contiguous() for name, t in tensors.items()}


def _block_tensors(cfg: ModelConfig, block: Block, prefix: str) -> dict[str, Tensor]:
    attn, moe, m = block.attn, block.moe, cfg.moe
    repeat = kv_heads(cfg) // attn.n_kv
    tensors = {
        "input_layernorm.weight": block.attn_norm.weight,
        "post_attention_layernorm.weight": block.moe_norm.weight,
        "self_attn.q_proj.weight": attn.wq.weight,
        "self_attn.k_proj.weight": _repeat_heads(attn.wk.weight, attn.n_kv, repeat),
        "self_attn.v_proj.weight": _repeat_heads(attn.wv.weight, attn.n_kv, repeat),
        "self_attn.o_proj.weight": attn.wo.weight,
        "mlp.gate.weight": moe.router.weight,
    }
    with torch.no_grad():
        width = m.latent_dim or cfg.d_model
        down_LD = moe.down.weight if m.latent_dim else torch.eye(width)
        up_DL = moe.up.weight if m.latent_dim else torch.eye(width)
        for e in range(m.num_experts):
            gate_up_2FD = moe.experts.w13_EL2F[e].float().T @ down_LD.float()  # the latent projection folded in
            tensors[f"mlp.experts.{e}.gate_proj.weight"], tensors[f"mlp.experts.{e}.up_proj.weight"] = \
                gate_up_2FD.chunk(2, dim=0)
            down_DF = up_DL.float() @ moe.experts.w2_EFL[e].float().T
            tensors[f"mlp.experts.{e}.down_proj.weight"] = m.route_scale * down_DF
        tensors.update(_shared_tensors(cfg, block))
    return {prefix + name: t for name, t in tensors.items()}


def _shared_tensors(cfg: ModelConfig, block: Block) -> dict[str, Tensor]:
    """The shared expert, behind a gate of zero weights (sigmoid 0.5) that its doubled output weights undo; a
    model without shared experts gets one of width 1 and zero weights (its output is 0)."""
    D, shared = cfg.d_model, block.moe.shared
    if shared is None:
        return {"mlp.shared_expert.gate_proj.weight": torch.zeros(1, D),
                "mlp.shared_expert.up_proj.weight": torch.zeros(1, D),
                "mlp.shared_expert.down_proj.weight": torch.zeros(D, 1),
                "mlp.shared_expert_gate.weight": torch.zeros(1, D)}
    gate_HD, up_HD = shared.w13.weight.chunk(2, dim=0)
    return {"mlp.shared_expert.gate_proj.weight": gate_HD, "mlp.shared_expert.up_proj.weight": up_HD,
            "mlp.shared_expert.down_proj.weight": 2 * shared.w2.weight,
            "mlp.shared_expert_gate.weight": torch.zeros(1, D)}


def _shared_width(cfg: ModelConfig) -> int:
    return cfg.moe.num_shared * cfg.moe.shared_dim or 1


def _repeat_heads(w_KdD: Tensor, heads: int, repeat: int) -> Tensor:
    """A K or V projection with each of its ``heads`` heads repeated ``repeat`` times, in place (head h becomes
    heads h*repeat .. h*repeat+repeat-1), so query head q still reads head q // (n_heads / heads)."""
    return w_KdD.view(heads, -1, w_KdD.shape[-1]).repeat_interleave(repeat, dim=0).flatten(0, 1)


def _write_json(path: Path, value: dict) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(value, indent=1).encode()))
