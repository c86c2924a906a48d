"""Sampling from the model, with a KV cache that knows sliding-window and global layers.

`generate` runs the prompt once (the prefill), then one new token at a time. While it runs, every attention
layer holds a `KVCache` (`kv_caches`): a global layer keeps the keys and values of every token so far, a
sliding-window layer only its last ``window - 1`` (a query sees itself and the ``window - 1`` tokens
before it, so nothing older is ever read again). Rotary positions count from the prompt's first token: a
prompt is one document, at positions 0, 1, ... as in training. ``use_cache=False`` runs the whole context
every step instead: the reference the cache is tested against, and the baseline of its benchmark. A prompt
and its new tokens fit the model's context (``max_seq_len`` positions), or `generate` refuses them.

The model is put in eval mode (no balancing statistics, no token dropping), so a token's output does not
depend on the batch and a cached step computes what a full forward computes at that position.
"""

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Optional

import torch
from torch import Tensor

from marin_model.model import Transformer

__all__ = ["KVCache", "generate", "kv_caches", "sample_next"]


class KVCache:
    """One attention layer's keys and values of the tokens seen so far, ``[B,Hkv,K,d]`` each.

    ``window``: the layer's sliding window (None for a global layer); only the last ``window - 1`` are kept.
    """

    def __init__(self, window: Optional[int]):
        self.window = window
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.length = 0  # tokens seen: the position of the next one

    def update(self, k_BHSd: Tensor, v_BHSd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add the keys and values of ``S`` new tokens; return every key and value they may attend to
        (``[B,Hkv,K,d]``) and which (``[1,1,S,K]`` bool: causal, within the window)."""
        S = k_BHSd.shape[2]
        k = k_BHSd if self.k is None else torch.cat([self.k, k_BHSd], dim=2)  # [B,Hkv,K,d]
        v = v_BHSd if self.v is None else torch.cat([self.v, v_BHSd], dim=2)
        K = k.shape[2]
        query_S = torch.arange(self.length, self.length + S, device=k.device)
        key_K = torch.arange(self.length + S - K, self.length + S, device=k.device)
        distance_SK = query_S[:, None] - key_K[None, :]
        mask_SK = (distance_SK >= 0) & (distance_SK < (self.window or K))
        keep = K if self.window is None else min(K, self.window - 1)
        self.k, self.v = k[:, :, K - keep:], v[:, :, K - keep:]
        self.length += S
        return k, v, mask_SK[None, None]


@contextmanager
def kv_caches(model: Transformer) -> Iterator[None]:
    """Give every attention layer of ``model`` a fresh `KVCache` for the duration of the block."""
    for block in model.blocks:
        block.attn.kv_cache = KVCache(None if block.attn.is_global else model.cfg.window)
    try:
        yield
    finally:
        for block in model.blocks:
            block.attn.kv_cache = None


def sample_next(logits_BV: Tensor, *, temperature: float, top_k: int, generator: Optional[torch.Generator]) -> Tensor:
    """``[B]`` next tokens: the argmax when ``temperature`` is 0, else a draw from softmax(logits / temperature)
    over the ``top_k`` most likely (0: all)."""
    if temperature == 0:
        return logits_BV.argmax(-1)
    logits_BV = logits_BV.float() / temperature
    if 0 < top_k < logits_BV.shape[-1]:
        kth_B1 = logits_BV.topk(top_k, dim=-1).values[:, -1:]
        logits_BV = logits_BV.masked_fill(logits_BV < kth_B1, float("-inf"))
    return torch.multinomial(logits_BV.softmax(-1), 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: Transformer, prompt_BS: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int = 0,
             generator: Optional[torch.Generator] = None, use_cache: bool = True,
             stop_token: Optional[int] = None) -> Tensor:
    """``[B, S + n]``: the prompts (``[B,S]``, one document each) and ``n <= max_new_tokens`` tokens after them,
    fewer when every row has produced ``stop_token``. Sampling as `sample_next`.

    ``S + max_new_tokens`` must fit the model's context (``max_seq_len``): attention over a prompt costs
    memory with the square of its length, so a longer prompt is refused (ValueError), not run; cut it to its
    last tokens first."""
    if prompt_BS.shape[1] + max_new_tokens > model.cfg.max_seq_len:
        raise ValueError(f"a prompt of {prompt_BS.shape[1]:,} tokens and {max_new_tokens:,} new ones do not fit the "
                         f"model's context of {model.cfg.max_seq_len:,} positions: cut the prompt to its last tokens")
    was_training = model.training
    model.eval()
    tokens_BT, fresh_BS = prompt_BS, prompt_BS  # fresh: what the cache has not seen
    try:
        with kv_caches(model) if use_cache else nullcontext():
            for _ in range(max_new_tokens):
                if use_cache:
                    T, S = tokens_BT.shape[1], fresh_BS.shape[1]
                    positions_BS = torch.arange(T - S, T, device=prompt_BS.device).expand_as(fresh_BS)
                    logits_BV = model(fresh_BS, positions_BS=positions_BS).logits[:, -1]
                else:
                    logits_BV = model(tokens_BT).logits[:, -1]
                next_B = sample_next(logits_BV, temperature=temperature, top_k=top_k, generator=generator)
                tokens_BT, fresh_BS = torch.cat([tokens_BT, next_B[:, None]], dim=1), next_B[:, None]
                new_BN = tokens_BT[:, prompt_BS.shape[1]:]
                if stop_token is not None and bool((new_BN == stop_token).any(1).all()):
                    break
    finally:
        model.train(was_training)
    return tokens_BT
