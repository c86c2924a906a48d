"""Model configuration: typed dataclasses, the presets, and parameter counting.

The defaults *are* the Marin 535B-A23B shape (DESIGN.md); ``tiny`` overrides them for CPU tests. Add a preset
rather than a flag per knob (STYLE rule 14).

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

For 535B-A23B this gives 535,192,737,792 total and 22,649,837,568 active non-embedding parameters. DESIGN.md's
figures (535,192,141,824 / 22,649,241,600) are the same without the 595,968 RMSNorm weights. The published
totals (~535.3B / ~22.76B) are larger by exactly n_layers*D*E = 113,246,208: a second D x E matrix per layer
that the public description does not name (a guess: a separate gating or score-correction projection). We do
not invent a role for it in the model; ``ParamCounts.published_*`` adds it as ``unnamed_router_extra`` so the
published figures come out exactly, and the model's own counts are within 0.03% / 0.5% of them anyway. Tied
embeddings would remove 788M parameters (0.15%), which the 0.1% check of the total catches.
"""

from dataclasses import dataclass, field, replace

import torch

__all__ = ["MoEConfig", "ModelConfig", "PRESETS", "PUBLISHED", "ParamCounts", "count_params", "formula_params",
           "get_preset", "with_overrides"]


@dataclass(frozen=True)
class MoEConfig:
    """The MoE block of every layer (DESIGN.md "The MoE layer")."""

    num_experts: int = 384            # E routed experts
    top_k: int = 8                    # k experts per token
    expert_dim: int = 3072            # F, hidden width of a routed expert's SwiGLU
    latent_dim: int = 3072            # L, width the routed experts act in (down/up projection); 0 = act at d_model
    num_shared: int = 2               # shared experts, always active, acting at d_model
    shared_dim: int = 3072            # hidden width of each shared expert
    routing: str = "sigmoid"          # "sigmoid" | "softmax_topk" (OLMoE, DeepSeek-V2) | "topk_softmax" (Mixtral)
    route_scale: float = 2.5          # combine weights sum to this after renormalisation
    renormalize: bool = True          # divide the k chosen gates by their sum (ignored by "topk_softmax")
    n_group: int = 1                  # device-limited routing: expert groups (1 = off)
    topk_group: int = 1               # groups each token may use when n_group > 1
    z_loss: float = 1e-4              # router z-loss coefficient: z_loss * mean(logsumexp(logits)**2)
    bias_update: str = "quantile"     # "quantile" (Marin) | "sign" (DeepSeek-V3) | "none"
    bias_rate: float = 1e-3           # step of the sign rule (DeepSeek-V3's gamma)
    hist_bins: int = 1024             # margin histogram of the quantile rule: bins over [-hist_range, hist_range]
    hist_range: float = 16.0
    capacity_factor: float = 0.0      # > 0: an expert keeps at most ceil(cf * T*k/E) token copies, drops the rest
    align: int = 1                    # rows of each expert group padded to a multiple of this (grouped GEMM tiles)

    def __post_init__(self):
        if self.routing not in ("sigmoid", "softmax_topk", "topk_softmax"):
            raise ValueError(f"routing must be sigmoid, softmax_topk or topk_softmax, got {self.routing!r}")
        if self.bias_update not in ("quantile", "sign", "none"):
            raise ValueError(f"bias_update must be quantile, sign or none, got {self.bias_update!r}")
        if self.bias_update == "quantile" and self.routing == "softmax_topk":
            raise ValueError("the quantile rule needs selection on logits; softmax_topk selects on probabilities")
        if not 1 <= self.top_k < self.num_experts:
            raise ValueError(f"top_k must be in [1, num_experts), got {self.top_k} of {self.num_experts}")


@dataclass(frozen=True)
class ModelConfig:
    """The transformer around the MoE blocks: GQA with sliding-window and global layers, RoPE, RMSNorm."""

    vocab_size: int = 128_256         # Llama-3 tokenizer
    d_model: int = 6144               # D
    n_layers: int = 48
    n_heads: int = 48                 # query heads
    head_dim: int = 128
    n_kv_heads: int = 12              # KV heads on sliding-window layers
    n_kv_heads_global: int = 6        # KV heads on global layers
    global_every: int = 4             # layers 4, 8, ... (1-based) attend globally, the others within `window`
    window: int = 2048                # sliding-window width in tokens (the query's own token included)
    max_seq_len: int = 4096
    rope_theta: float = 500_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False      # Marin's embeddings are untied
    init_std: float = 0.02
    moe: MoEConfig = field(default_factory=MoEConfig)

    def __post_init__(self):
        for name in ("n_kv_heads", "n_kv_heads_global"):
            if self.n_heads % getattr(self, name):
                raise ValueError(f"n_heads={self.n_heads} is not a multiple of {name}={getattr(self, name)}")

    def is_global(self, layer: int) -> bool:
        """Whether 0-based layer `layer` attends globally: every `global_every`-th layer does."""
        return (layer + 1) % self.global_every == 0


PRESETS: dict[str, ModelConfig] = {
    # Trains on a CPU in seconds; dims are multiples of 8 so bf16 grouped GEMM strides are 16-byte aligned.
    "tiny": ModelConfig(vocab_size=512, d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                        n_kv_heads_global=1, window=32, max_seq_len=128,
                        moe=MoEConfig(num_experts=8, top_k=2, expert_dim=32, latent_dim=32, num_shared=1,
                                      shared_dim=32, bias_rate=1e-2)),
    "marin-535b-a23b": ModelConfig(),
}

# Published totals (parameters, active non-embedding parameters) checked by tests/test_config.py.
PUBLISHED: dict[str, tuple[float, float]] = {"marin-535b-a23b": (535.3e9, 22.76e9)}


def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; raises KeyError listing the known ones."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


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
    from marin_model.model import Transformer  # here, not at the top: model.py imports this module

    with torch.device("meta"):
        model = Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied matrix once
    embedding = sum(p.numel() for p in {id(p): p for p in model.embedding_parameters()}.values())
    routed = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)
    active = total - embedding - routed + routed * cfg.moe.top_k // cfg.moe.num_experts
    return ParamCounts(total=total, embedding=embedding, active_non_embedding=active,
                       unnamed_router_extra=cfg.n_layers * cfg.d_model * cfg.moe.num_experts)


def with_overrides(cfg: ModelConfig, **changes) -> ModelConfig:
    """`cfg` with top-level fields replaced; keys prefixed `moe_` change the MoE config."""
    moe = {k[4:]: v for k, v in changes.items() if k.startswith("moe_")}
    top = {k: v for k, v in changes.items() if not k.startswith("moe_")}
    return replace(cfg, moe=replace(cfg.moe, **moe), **top)
