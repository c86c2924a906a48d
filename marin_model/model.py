"""The Marin transformer, written to be read top-down (nanoGPT style).

Token embedding -> n_layers x Block -> RMSNorm -> output head. A Block is pre-norm attention then a pre-norm
MoE block (moe.py). Attention is grouped-query with rotary positions; every ``global_every``-th layer attends
to the whole causal context with fewer KV heads, the others to a sliding window. When a batch carries segment
ids (one id per packed document), attention never crosses a document boundary and rotary positions restart
at each document. ``Transformer.recompute`` keeps only each block's input for the backward pass and runs the
block again there (activation checkpointing): memory per layer falls to one [B,S,D] tensor for ~1/3 more
compute. Sampling (generate.py) gives each attention layer a KV cache, which keeps a sliding-window layer's
last window only.
"""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from marin_model.config import ModelConfig
from marin_model.moe import MoE, RouterStats, SwiGLU

__all__ = ["Transformer", "Block", "Attention", "RMSNorm", "SwiGLU", "ModelOutput", "attention_mask",
           "positions_from_segments", "rope_angles", "apply_rope"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


def positions_from_segments(segment_ids_BS: Tensor) -> Tensor:
    """Position of each token within its document: 0 where the segment id changes (and at the start)."""
    B, S = segment_ids_BS.shape
    index_BS = torch.arange(S, device=segment_ids_BS.device).expand(B, S)
    starts_BS = torch.ones_like(segment_ids_BS, dtype=torch.bool)
    starts_BS[:, 1:] = segment_ids_BS[:, 1:] != segment_ids_BS[:, :-1]
    return index_BS - torch.where(starts_BS, index_BS, 0).cummax(dim=1).values


def attention_mask(segment_ids_BS: Optional[Tensor], seq_len: int, window: Optional[int],
                   device: torch.device) -> Optional[Tensor]:
    """Boolean mask [B or 1, 1, S, S] (True = may attend): causal, within `window` tokens (the query's own
    included) if given, within the same segment if segment ids are given. None means plain causal."""
    if segment_ids_BS is None and (window is None or seq_len <= window):
        return None
    index_S = torch.arange(seq_len, device=device)
    distance_SS = index_S[:, None] - index_S[None, :]  # query minus key
    mask_SS = (distance_SS >= 0) & (distance_SS < (window or seq_len))
    if segment_ids_BS is None:
        return mask_SS[None, None]
    same_BSS = segment_ids_BS[:, :, None] == segment_ids_BS[:, None, :]
    return (mask_SS & same_BSS)[:, None]


def rope_angles(positions_BS: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin [B,S,head_dim/2] of the rotary angles at the given positions."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions_BS.device).float() / head_dim)
    angles_BSh = positions_BS.float()[..., None] * inv_freq
    return angles_BSh.cos(), angles_BSh.sin()


def apply_rope(x_BHSd: Tensor, cos_BSh: Tensor, sin_BSh: Tensor) -> Tensor:
    """Rotates the two halves of each head (the Llama layout) by the position's angles, in fp32."""
    x1, x2 = x_BHSd.float().chunk(2, dim=-1)
    cos, sin = cos_BSh[:, None], sin_BSh[:, None]  # [B,1,S,h]: broadcast over heads
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x_BHSd)


class Attention(nn.Module):
    """Grouped-query attention; a global layer sees the whole causal context, the others a window."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.is_global = cfg.is_global(layer)
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.n_kv = cfg.n_kv_heads_global if self.is_global else cfg.n_kv_heads
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.n_kv * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.n_kv * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.kv_cache = None  # while sampling, the keys and values of earlier tokens (generate.py)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor]) -> Tensor:
        B, S, _ = x_BSD.shape
        q = self.wq(x_BSD).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)  # [B,Hq,S,d]
        k = self.wk(x_BSD).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)  # [B,Hkv,S,d]
        v = self.wv(x_BSD).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)  # [B,Hkv,S,d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_cache is not None:  # the new tokens also attend to the cached ones: [B,Hkv,K,d], mask [1,1,S,K]
            k, v, mask = self.kv_cache.update(k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, S, -1))  # [B,S,Hq*d]


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.moe_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.moe = MoE(cfg)

    def forward(self, x_BSD: Tensor, cos: Tensor, sin: Tensor, mask: Optional[Tensor]):
        x_BSD = x_BSD + self.attn(self.attn_norm(x_BSD), cos, sin, mask)
        moe_TD, stats = self.moe(self.moe_norm(x_BSD).flatten(0, 1))  # [B*S,D]: the MoE sees tokens
        return x_BSD + moe_TD.view_as(x_BSD), stats


class ModelOutput(NamedTuple):
    logits: Tensor                  # [B,S,V]
    loss: Optional[Tensor]          # cross-entropy + z_loss coefficient * z_loss (None without targets)
    ce_loss: Optional[Tensor]
    z_loss: Tensor                  # router z-loss, mean over layers (before the coefficient)
    router: list[RouterStats]       # one per layer


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.recompute = False  # activation checkpointing per block while training
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        for name, p in self.named_parameters():  # nanoGPT's init; norms keep their ones
            if not name.endswith("norm.weight"):
                nn.init.normal_(p, std=cfg.init_std)

    def embedding_parameters(self) -> list[nn.Parameter]:
        return [self.embed.weight, self.lm_head.weight]

    def forward(self, tokens_BS: Tensor, targets_BS: Optional[Tensor] = None,
                segment_ids_BS: Optional[Tensor] = None, positions_BS: Optional[Tensor] = None) -> ModelOutput:
        """tokens [B,S] -> logits [B,S,V]; targets (-100 = ignore) add the loss; segment ids block attention
        across documents and, unless positions are given, restart rotary positions per document."""
        cfg, (B, S) = self.cfg, tokens_BS.shape
        if positions_BS is None:
            positions_BS = (positions_from_segments(segment_ids_BS) if segment_ids_BS is not None
                            else torch.arange(S, device=tokens_BS.device).expand(B, S))
        cos, sin = rope_angles(positions_BS, cfg.head_dim, cfg.rope_theta)
        local_mask = attention_mask(segment_ids_BS, S, cfg.window, tokens_BS.device)
        global_mask = attention_mask(segment_ids_BS, S, None, tokens_BS.device)
        x_BSD, router = self.embed(tokens_BS), []
        for block in self.blocks:
            args = (x_BSD, cos, sin, global_mask if block.attn.is_global else local_mask)
            x_BSD, stats = (checkpoint(block, *args, use_reentrant=False) if self.recompute and self.training
                            else block(*args))
            router.append(stats)
        logits_BSV = self.lm_head(self.norm(x_BSD))
        z_loss = torch.stack([s.z_loss for s in router]).mean()
        if targets_BS is None:
            return ModelOutput(logits_BSV, None, None, z_loss, router)
        ce = F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten(), ignore_index=-100)
        return ModelOutput(logits_BSV, ce + cfg.moe.z_loss * z_loss, ce, z_loss, router)

    def update_router_bias(self) -> None:
        """Between optimizer steps: every MoE block moves its balancing bias (all-reduced when distributed)."""
        for block in self.blocks:
            block.moe.update_bias()
