"""The KV cache against the full forward: the same logits at every position (fp32, within 2e-5), the same
greedy tokens, with prompts longer than a tiny sliding window, in chunks or one token at a time."""

from __future__ import annotations

import pytest
import torch

from marin_model.config import get_preset, with_overrides
from marin_model.generate import generate, kv_caches
from marin_model.model import Transformer

TOL = dict(atol=2e-5, rtol=2e-5)  # fp32: attention over the cached keys sums in another order than the full mask


@pytest.fixture(scope="module")
def model():
    """tiny with a window of 4 (layers 0-2 slide, layer 3 is global) and token dropping in training."""
    torch.manual_seed(0)
    cfg = with_overrides(get_preset("tiny"), window=4, init_std=0.1, moe_capacity_factor=1.0)
    return Transformer(cfg).eval()


def cached_logits(model: Transformer, tokens_BT: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """``[B,T,V]``: the tokens fed through the cache in pieces of the given lengths."""
    out, start = [], 0
    with kv_caches(model):
        for size in chunks:
            piece = tokens_BT[:, start:start + size]
            positions = torch.arange(start, start + size).expand_as(piece)
            out.append(model(piece, positions_BS=positions).logits)
            start += size
        kept = [block.attn.kv_cache.k.shape[2] for block in model.blocks]
    assert start == tokens_BT.shape[1]
    # The sliding-window layers keep window - 1 keys, the global layer all of them.
    assert kept == [3, 3, 3, tokens_BT.shape[1]]
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("chunks", [[1] * 13, [5, 1, 1, 6], [13]], ids=["one-by-one", "mixed", "prefill"])
@torch.no_grad()
def test_cached_logits_equal_the_full_forward_at_every_position(model, chunks):
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 13))
    torch.testing.assert_close(cached_logits(model, tokens, chunks), model(tokens).logits, **TOL)


def test_greedy_generation_with_and_without_the_cache_is_the_same(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (2, 9))  # longer than the window
    cached = generate(model, prompt, 12, temperature=0)
    assert torch.equal(cached, generate(model, prompt, 12, temperature=0, use_cache=False))
    tokens = prompt
    with torch.no_grad():  # the plain argmax loop over full forwards
        for _ in range(12):
            tokens = torch.cat([tokens, model(tokens).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, tokens) and cached.shape == (2, 21)


def test_sampling_follows_the_seed_and_top_k(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 5))
    runs = [generate(model, prompt, 10, temperature=1.0, top_k=1 if k == 2 else 0,
                     generator=torch.Generator().manual_seed(seed)) for k, seed in enumerate((7, 7, 8))]
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[2], generate(model, prompt, 10, temperature=0))  # top-1 is greedy


def test_generation_stops_at_the_stop_token_and_leaves_the_model_as_it_was(model):
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 5))
    greedy = generate(model, prompt, 8, temperature=0)
    stop = int(greedy[0, 7])  # the third new token
    out = generate(model, prompt, 8, temperature=0, stop_token=stop)
    assert out.shape[1] <= 8 and int(out[0, -1]) == stop
    model.train()
    generate(model, prompt, 2)
    assert model.training and all(block.attn.kv_cache is None for block in model.blocks)
    model.eval()


def test_a_prompt_and_new_tokens_beyond_the_context_are_refused_not_run(model):
    """Attention over the prompt costs memory with its square; the context (max_seq_len) bounds it."""
    context = model.cfg.max_seq_len
    prompt = torch.randint(0, model.cfg.vocab_size, (1, context - 2))
    assert generate(model, prompt, 2, temperature=0).shape == (1, context)
    for use_cache in (True, False):
        with pytest.raises(ValueError, match="context of 128 positions: cut the prompt"):
            generate(model, prompt, 3, temperature=0, use_cache=use_cache)
