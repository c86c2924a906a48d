"""Model configuration: typed dataclasses with commented defaults, and the presets.

The defaults *are* the Marin 535B-A23B shape; ``tiny`` overrides them for CPU tests. Add a preset rather than
a flag per knob. Parameter counts: ``marin_model/params.py``.
"""

from dataclasses import dataclass, field, replace

__all__ = ["MoEConfig", "ModelConfig", "PRESETS", "get_preset", "with_overrides"]


@dataclass(frozen=True)
class MoEConfig:
    """The MoE block of every layer (docs/design.md, "The MoE layer")."""

    num_experts: int = 384            # E routed experts
    top_k: int = 8                    # k experts per token
    expert_dim: int = 3072            # F, hidden width of a routed expert's SwiGLU
    latent_dim: int = 3072            # L, width the routed experts act in (down/up projection); 0 = act at d_model
    num_shared: int = 2               # shared experts, always active, acting at d_model
    shared_dim: int = 3072            # hidden width of each shared expert
    routing: str = "sigmoid"          # "sigmoid" | "softmax_topk" (OLMoE, DeepSeek-V2) | "topk_softmax" (Mixtral)
    route_scale: float = 2.5          # combine weights sum to this after renormalisation
    renormalize: bool = True          # divide the k chosen gates by their sum (ignored by "topk_softmax")
    n_group: int = 1                  # group-limited routing: expert groups (1 = off)
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

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        """The inverse of ``dataclasses.asdict`` (how checkpoints and exported models store the config)."""
        return cls(**{**values, "moe": MoEConfig(**values["moe"])})

    def is_global(self, layer: int) -> bool:
        """Whether 0-based layer `layer` attends globally: every `global_every`-th layer does."""
        return (layer + 1) % self.global_every == 0


PRESETS: dict[str, ModelConfig] = {
    # Trains on a CPU in seconds; dims are multiples of 8 so bf16 grouped GEMM strides are 16-byte aligned.
    "tiny": ModelConfig(vocab_size=512, d_model=64, n_layers=4, n_heads=4, head_dim=16, n_kv_heads=2,
                        n_kv_heads_global=1, window=32, max_seq_len=128,
                        moe=MoEConfig(num_experts=8, top_k=2, expert_dim=32, latent_dim=32, num_shared=1,
                                      shared_dim=32, bias_rate=1e-2)),
    # Marin's proportions at 1/12 of its width (latent = expert = shared width = D/2, two shared experts,
    # KV heads 1/4 of the query heads on window layers and 1/8 on global ones): benchmarks on a CPU.
    "marin-mid": ModelConfig(vocab_size=8192, d_model=512, n_layers=4, n_heads=8, head_dim=64, n_kv_heads=2,
                             n_kv_heads_global=1, window=256, max_seq_len=1024,
                             moe=MoEConfig(num_experts=64, top_k=8, expert_dim=256, latent_dim=256, num_shared=2,
                                           shared_dim=256)),
    # The defaults, plus the capacity factor Marin trains with (tokens past it are dropped in training only).
    "marin-535b-a23b": ModelConfig(moe=MoEConfig(capacity_factor=1.15)),
}



def get_preset(name: str) -> ModelConfig:
    """The preset called `name`; raises KeyError listing the known ones."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


def with_overrides(cfg: ModelConfig, **changes) -> ModelConfig:
    """`cfg` with top-level fields replaced; keys prefixed `moe_` change the MoE config."""
    moe = {k[4:]: v for k, v in changes.items() if k.startswith("moe_")}
    top = {k: v for k, v in changes.items() if not k.startswith("moe_")}
    return replace(cfg, moe=replace(cfg.moe, **moe), **top)
