"""Parameter counts of a model config: the closed formula and a count of the real module.

Parameter formula (``formula_params``; ``count_params`` counts the real module on the ``meta`` device and a
test checks the two agree exactly). Per layer, with D = d_model, Hq query heads of width d, Hkv KV heads:

    attention   = D*Hq*d (q) + 2*D*Hkv*d (k, v) + Hq*d*D (o)       Hkv = 12 on window layers, 6 on global ones
    router      = D*E                                             (fp32 logits, no bias parameter)
    latent      = 2*D*L                                           (down- and up-projection; 0 if L = 0)
    routed      = E * 3*L'*F                                      (SwiGLU experts at width L' = L or D)
    shared      = 3*D*(n_shared*F_shared)                         (the shared experts, one wide SwiGLU)
    norms       = 2*D                                             (attention and MoE RMSNorm weights)

plus the final norm D and the embeddings V*D (input) + V*D (output head; counted once if tied). Active
parameters replace ``routed`` by ``routed * k/E``.

For 535B-A23B this gives 535,192,737,792 total and 22,649,837,568 active non-embedding parameters, or
535,192,141,824 / 22,649,241,600 without the 595,968 RMSNorm weights. The published
totals (~535.3B / ~22.76B) are larger by exactly n_layers*D*E = 113,246,208: a second D x E matrix per layer
that the public description does not name (a guess: a separate gating or score-correction projection). We do
not invent a role for it in the model; ``ParamCounts.published_*`` adds it as ``unnamed_router_extra`` so the
published figures come out exactly, and the model's own counts are within 0.03% / 0.5% of them anyway. Tied
embeddings would remove 788M parameters (0.15%), which the 0.1% check of the total catches.
"""

from dataclasses import dataclass

import torch

from marin_model.config import ModelConfig
from marin_model.model import Transformer

__all__ = ["PUBLISHED", "ParamCounts", "count_params", "formula_params"]

# Published totals (parameters, active non-embedding parameters) checked by tests/test_config.py.
PUBLISHED: dict[str, tuple[float, float]] = {"marin-535b-a23b": (535.3e9, 22.76e9)}


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of one config. `active_*` counts what one token uses: k of the E routed experts."""

    total: int
    embedding: int                    # input embedding + output head (once if tied)
    active_non_embedding: int
    unnamed_router_extra: int         # n_layers * D * E: the published figures' unnamed matrix (module docstring)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def active(self) -> int:
        return self.active_non_embedding + self.embedding

    @property
    def published_total(self) -> int:
        return self.total + self.unnamed_router_extra

    @property
    def published_active_non_embedding(self) -> int:
        return self.active_non_embedding + self.unnamed_router_extra


def formula_params(cfg: ModelConfig) -> ParamCounts:
    """The closed-form count of the module docstring."""
    D, m = cfg.d_model, cfg.moe
    attention = sum(2 * D * cfg.n_heads * cfg.head_dim
                    + 2 * D * (cfg.n_kv_heads_global if cfg.is_global(i) else cfg.n_kv_heads) * cfg.head_dim
                    for i in range(cfg.n_layers))
    width = m.latent_dim or D
    routed = cfg.n_layers * m.num_experts * 3 * width * m.expert_dim
    dense = cfg.n_layers * (D * m.num_experts + (2 * D * m.latent_dim) + 3 * D * m.num_shared * m.shared_dim
                            + 2 * D) + D
    embedding = cfg.vocab_size * D * (1 if cfg.tie_embeddings else 2)
    return ParamCounts(total=attention + routed + dense + embedding, embedding=embedding,
                       active_non_embedding=attention + dense + routed * m.top_k // m.num_experts,
                       unnamed_router_extra=cfg.n_layers * D * m.num_experts)


def count_params(cfg: ModelConfig) -> ParamCounts:
    """Counts the parameters of the real module, built on the `meta` device (no memory, any size)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once
    embedding = sum(p.numel() for p in {id(p): p for p in model.embedding_parameters()}.values())
    routed = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = total - embedding - routed + routed * cfg.moe.top_k // cfg.moe.num_experts
    return ParamCounts(total=total, embedding=embedding, active_non_embedding=active,
                       unnamed_router_extra=cfg.n_layers * cfg.d_model * cfg.moe.num_experts)
