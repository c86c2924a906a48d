"""The transformer: document masking, sliding windows, positions, a training step, and the demo."""

import torch

from marin_model.__main__ import main as demo
from marin_model.config import PRESETS, with_overrides
from marin_model.model import Attention, Transformer, attention_mask, positions_from_segments, rope_angles

TINY = PRESETS["tiny"]


def tiny_model(seed: int = 0, **changes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(with_overrides(TINY, **changes)).eval()


def test_attention_mask_equals_its_definition():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 5, 5]])
    mask = attention_mask(segments, 8, 3, segments.device)
    for b in range(2):
        for i in range(8):
            for j in range(8):
                allowed = j <= i and i - j < 3 and segments[b, i] == segments[b, j]
                assert mask[b, 0, i, j].item() == allowed, (b, i, j)
    assert attention_mask(None, 8, 16, segments.device) is None  # plain causal: SDPA's is_causal path


def test_positions_restart_at_each_document():
    segments = torch.tensor([[3, 3, 3, 7, 7, 9], [1, 1, 1, 1, 1, 1]])
    assert positions_from_segments(segments).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_a_packed_document_gives_the_logits_it_gives_alone():
    model = tiny_model()
    first, second = torch.randint(0, TINY.vocab_size, (1, 23)), torch.randint(0, TINY.vocab_size, (1, 41))
    packed = torch.cat([first, second], dim=1)
    segments = torch.cat([torch.zeros(1, 23), torch.ones(1, 41)], dim=1).long()
    with torch.no_grad():
        together = model(packed, segment_ids_BS=segments).logits
        alone = model(second).logits
    torch.testing.assert_close(together[:, 23:], alone, atol=1e-5, rtol=1e-5)


def test_window_layers_ignore_tokens_beyond_the_window_and_global_layers_do_not():
    cfg = with_overrides(TINY, window=4)
    x = torch.randn(1, 10, cfg.d_model)
    changed = x.clone()
    changed[0, 2] += 1.0  # 7 tokens before the last one: outside a window of 4
    cos, sin = rope_angles(torch.arange(10)[None], cfg.head_dim, cfg.rope_theta)
    for layer in (0, 3):
        torch.manual_seed(0)
        attn = Attention(cfg, layer)
        mask = attention_mask(None, 10, None if attn.is_global else cfg.window, x.device)
        with torch.no_grad():
            last, last_changed = attn(x, cos, sin, mask)[0, -1], attn(changed, cos, sin, mask)[0, -1]
        assert attn.is_global == (layer == 3)
        assert torch.equal(last, last_changed) != attn.is_global
        assert attn.wk.out_features == cfg.head_dim * (cfg.n_kv_heads_global if attn.is_global else cfg.n_kv_heads)


def test_loss_adds_the_weighted_router_z_loss_and_training_lowers_it():
    model = tiny_model().train()
    tokens = torch.randint(0, TINY.vocab_size, (4, 33))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        out = model(tokens[:, :-1], tokens[:, 1:])
        torch.testing.assert_close(out.loss, out.ce_loss + TINY.moe.z_loss * out.z_loss)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.update_router_bias()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0] - 0.3, losses
    assert len(out.router) == TINY.n_layers and all(s.counts_E.sum() == 4 * 32 * 2 for s in out.router)


def test_tied_embeddings_share_one_matrix():
    model = tiny_model(tie_embeddings=True)
    assert model.lm_head.weight is model.embed.weight


def test_demo_prints_counts_timing_and_router_stats(capsys):
    demo(["--preset", "tiny", "--steps", "1", "--batch", "2", "--seq", "16", "--capacity-factor", "1.0"])
    out = capsys.readouterr().out
    for expected in ("active non-embedding", "forward+backward of 2x16 tokens", "z-loss", "dropped", "layer  3"):
        assert expected in out
    demo(["--preset", "marin-535b-a23b"])
    assert "535,192,737,792" in capsys.readouterr().out


def test_recompute_counts_each_token_once_for_balancing():
    torch.manual_seed(0)
    model = Transformer(TINY).train()
    model.recompute = True
    tokens = torch.randint(0, TINY.vocab_size, (2, 16))
    model(tokens, tokens).loss.backward()  # the backward pass runs every block's forward again
    for block in model.blocks:
        assert block.moe.balancer.load_E.sum() == 2 * 16 * TINY.moe.top_k
