"""The MoE block: the op chain equals the naive per-expert loop, compiles, and its bias update balances load."""

import os

import pytest
import torch
import torch.distributed as dist
from ranks import spawn_ranks

from marin_model.config import PRESETS, with_overrides
from marin_model.balance import histogram_quantile, margin_histogram
from marin_model.moe import MoE, GroupedExperts, _grouped_mm_ok, permute_tokens, swiglu_expert, unpermute_tokens
from marin_model.naive import naive_moe_forward
from marin_train.distributed import shutdown_distributed

TINY = PRESETS["tiny"]
TOL = {torch.float64: 1e-10, torch.float32: 1e-4}


def make_moe(dtype=torch.float32, seed=0, **moe_changes) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(with_overrides(TINY, **{f"moe_{k}": v for k, v in moe_changes.items()})).to(dtype)
    moe.bias_E.normal_(std=0.01)  # a nonzero selection bias, as after some balancing
    return moe


def check_matches_naive(moe: MoE, x_TD: torch.Tensor, **naive_options) -> None:
    """Same output, z-loss and gradients (input and every parameter) as naive_moe_forward(**naive_options)."""
    tol = TOL[x_TD.dtype]
    x_TD = x_TD.detach().requires_grad_()
    out, stats = moe(x_TD)
    want, want_z = naive_moe_forward(moe, x_TD, **naive_options)
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    torch.testing.assert_close(stats.z_loss, want_z, atol=tol, rtol=tol)
    params = [x_TD] + list(moe.parameters())
    probe = torch.randn_like(out)
    got_grads = torch.autograd.grad((out * probe).sum() + stats.z_loss, params)
    want_grads = torch.autograd.grad((want * probe).sum() + want_z, params)
    for got, expected in zip(got_grads, want_grads):
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # fp32: grouped GEMM on CPU; fp64: the loop
@pytest.mark.parametrize("routing", ["sigmoid", "softmax_topk", "topk_softmax"])
@pytest.mark.parametrize("capacity_factor,align", [(0.0, 1), (1.0, 8)])
def test_moe_block_equals_naive_per_expert_loop(dtype, routing, capacity_factor, align):
    moe = make_moe(dtype, routing=routing, capacity_factor=capacity_factor, align=align, bias_update="sign")
    check_matches_naive(moe, torch.randn(48, TINY.d_model, dtype=dtype))


@pytest.mark.parametrize("naive_options", [dict(dense_mask=True), dict(index_stacked=True),
                                           dict(dense_mask=True, index_stacked=True)])
@pytest.mark.parametrize("capacity_factor,align", [(0.0, 1), (0.5, 8)])
def test_moe_block_equals_the_dense_masking_and_stacked_naive_loops(naive_options, capacity_factor, align):
    """The benchmark's other baselines compute the same block (capacity 0.5 drops about half the copies)."""
    moe = make_moe(capacity_factor=capacity_factor, align=align)
    check_matches_naive(moe, torch.randn(48, TINY.d_model), **naive_options)


def test_router_logits_stay_fp32_under_bf16_autocast():
    """Routing under autocast (how train.py runs on CUDA) equals routing without it: the same experts and the
    same z-loss, bit for bit, although the experts themselves run in bf16."""
    moe, x_TD = make_moe(), torch.randn(256, TINY.d_model)
    out_TD, want = moe(x_TD)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_bf16_TD, got = moe(x_TD)
    assert out_bf16_TD.dtype == torch.bfloat16 and not torch.equal(out_bf16_TD.float(), out_TD)
    assert torch.equal(got.counts_E, want.counts_E) and torch.equal(got.z_loss, want.z_loss)


def test_moe_block_without_latent_or_shared_experts_equals_naive():
    moe = make_moe(latent_dim=0, num_shared=0, top_k=1)
    check_matches_naive(moe, torch.randn(20, TINY.d_model))


def test_moe_block_gradients_match_finite_differences():
    moe = make_moe(torch.float64, capacity_factor=1.5, align=4)  # training mode: tokens over capacity drop
    x = torch.randn(6, TINY.d_model, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: moe(x)[0], (x,), fast_mode=True)


def test_grouped_experts_equal_a_loop_over_groups():
    experts = GroupedExperts(4, 16, 24)
    offsets = torch.tensor([0, 8, 8, 11, 19], dtype=torch.int32)
    x_RL = torch.cat([torch.randn(19, 16), torch.full((5, 16), float("nan"))])  # 5 unused rows past offsets[E]
    y_RL = experts(x_RL, offsets)
    for e in range(4):
        a, b = offsets[e], offsets[e + 1]
        want = swiglu_expert(x_RL[a:b], experts.w13_EL2F[e], experts.w2_EFL[e])
        torch.testing.assert_close(y_RL[a:b], want, atol=1e-5, rtol=1e-5)


def unused_rows_case(T: int, hidden: int, seed: int):
    """Experts (4 of width 16, ``hidden`` wide: 24 runs torch._grouped_mm, 10 the loop over experts) and
    ``T`` tokens routed to 2 of them or dropped (-1): ``(experts, E, x_TL, weights_TK, probe_TL, ids_TK)``."""
    torch.manual_seed(seed)
    K, E, L = 2, 4, 16
    experts = GroupedExperts(E, L, hidden)
    assert _grouped_mm_ok(torch.zeros(1, L), hidden) == (hidden == 24)
    x_TL, weights_TK, probe_TL = torch.randn(T, L), torch.rand(T, K), torch.randn(T, L)
    return experts, E, x_TL, weights_TK, probe_TL, torch.randint(-1, E, (T, K), dtype=torch.int32)


@pytest.mark.parametrize("hidden", [24, 10])
def test_unused_routed_rows_reach_no_output_or_gradient(hidden):
    """permute -> experts -> unpermute with the unused rows of routed (past offsets[E]) zero or NaN: the same
    output and the same finite gradients (input, combine weights, expert weights) to the bit."""
    experts, E, x_TL, weights_TK, probe_TL, ids_TK = unused_rows_case(20, hidden, seed=0)
    results = []
    for fill in (0.0, float("nan")):
        x, weights = x_TL.clone().requires_grad_(), weights_TK.clone().requires_grad_()
        routed_RL, meta = permute_tokens(x, ids_TK, E, 8, 0)
        unused_R1 = (torch.arange(routed_RL.shape[0]) >= meta.offsets_E1[-1])[:, None]
        assert unused_R1.any()
        y_RL = experts(torch.where(unused_R1, fill, routed_RL), meta.offsets_E1)
        out_TL = unpermute_tokens(y_RL, meta, weights)
        grads = torch.autograd.grad((out_TL * probe_TL).sum(), [x, weights, experts.w13_EL2F, experts.w2_EFL])
        results.append([out_TL, *grads])
    for zero, nan in zip(*results):
        assert torch.isfinite(nan).all() and torch.equal(zero, nan)


def test_router_stats_report_drops_and_z_loss():
    moe = make_moe(capacity_factor=0.5)
    x = torch.randn(64, TINY.d_model)
    _, stats = moe(x)
    capacity = 64 * 2 * 0.5 / 8
    expected_dropped = (stats.counts_E.float() - capacity).clamp(min=0).sum() / (64 * 2)
    assert stats.dropped.item() == pytest.approx(expected_dropped.item())
    assert stats.counts_E.sum() == 64 * 2
    assert stats.z_loss.item() == pytest.approx(naive_moe_forward(moe, x)[1].item(), rel=1e-5)


def test_an_evaluated_moe_block_drops_no_token_so_a_token_ignores_its_batch():
    moe = make_moe(capacity_factor=0.5)
    x = torch.randn(64, TINY.d_model)
    assert moe(x)[1].dropped > 0  # training: over capacity
    moe.eval()
    out, stats = moe(x)
    assert stats.dropped == 0
    torch.testing.assert_close(moe(x[:5])[0], out[:5], atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="torch._grouped_mm is missing in this build")
def test_compiled_moe_block_equals_eager():
    """fullgraph compile needs bf16: torch's grouped GEMM has a meta kernel only for bf16."""
    moe = make_moe(torch.bfloat16, capacity_factor=1.0)
    x = torch.randn(64, TINY.d_model, dtype=torch.bfloat16, requires_grad=True)
    results = []
    for module in (moe, torch.compile(moe, fullgraph=True)):
        out, stats = module(x)
        (out.float().square().sum() + stats.z_loss).backward()
        results.append((out, stats.counts_E, stats.dropped, x.grad, moe.router.weight.grad))
        x.grad, moe.router.weight.grad = None, None
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------------ balancing
def skewed_batch(moe: MoE, tokens: int = 512, seed: int = 1, two_sided: bool = False) -> torch.Tensor:
    """Inputs with a common direction that the router rows of experts 0 and 1 favour: they win every token.
    two_sided: the second half points the other way, so there experts 0 and 1 win nothing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        moe.router.weight[:2] += 0.05
    shift = torch.ones(tokens, 1)
    if two_sided:
        shift[tokens // 2:] = -1.0
    return torch.randn(tokens, TINY.d_model, generator=g) + shift


def imbalance(moe: MoE, x: torch.Tensor) -> float:
    """Max over mean of the per-expert load on x (1.0 = perfectly balanced)."""
    with torch.no_grad():
        counts = moe.eval()(x)[1].counts_E.float()
    return (counts.max() / counts.mean()).item()


def check_bias_update_balances(rule: str, rounds: int, **changes) -> None:
    moe = make_moe(bias_update=rule, **changes)
    moe.bias_E.zero_()
    x = skewed_batch(moe)
    before = imbalance(moe, x)
    for _ in range(rounds):
        with torch.no_grad():
            moe.train()(x)
        moe.update_bias()
    after = imbalance(moe, x)
    assert before > 3.0, "the router is not skewed: the test proves nothing"
    assert after < 1.5 < before, (before, after)
    assert all(int(b.sum()) == 0 for b in moe.balancer.buffers())  # the counts restart after each update


def test_quantile_rule_balances_a_skewed_router():
    check_bias_update_balances("quantile", rounds=4)


def test_sign_rule_balances_a_skewed_router():
    check_bias_update_balances("sign", rounds=80, bias_rate=0.05)


def test_bias_update_ignores_eval_forwards_and_needs_load():
    moe = make_moe(bias_update="sign")
    before = moe.bias_E.clone()
    with torch.no_grad():
        moe.eval()(torch.randn(16, TINY.d_model))
    moe.update_bias()
    assert torch.equal(moe.bias_E, before)


def test_histogram_quantile_matches_the_exact_quantile_within_a_bin():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4000, 8, generator=g) * 2
    hist = margin_histogram(logits, 2, 1024, 16.0)
    margins = logits - logits.topk(3, dim=-1).values[:, 2:]
    exact = torch.quantile(margins, 1 - 2 / 8, dim=0)
    torch.testing.assert_close(histogram_quantile(hist, 1 - 2 / 8, 16.0), exact, atol=32 / 1024, rtol=0)
    assert hist.sum() == logits.numel()


def test_casting_the_block_keeps_the_balancing_bias_in_fp32():
    moe = make_moe()
    moe.bias_E.fill_(1 + 2 ** -12)  # not representable in bf16
    moe.to(torch.bfloat16)
    assert moe.bias_E.dtype == torch.float32 and moe.bias_E[0].item() == 1 + 2 ** -12
    assert moe.experts.w13_EL2F.dtype == torch.bfloat16


def _rank_update(rank: int, world: int, init_file: str, rule: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # the same GEMM blocking as the single process, so the same routing to the bit
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    moe = make_moe(bias_update=rule, bias_rate=0.05)
    x = skewed_batch(moe, two_sided=True)
    with torch.no_grad():
        moe.train()(x.chunk(world)[rank])
    moe.update_bias()
    torch.save(moe.bias_E, os.path.join(out_dir, f"bias{rank}.pt"))
    shutdown_distributed()


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["quantile", "sign"])
def test_bias_update_uses_the_load_summed_over_ranks(rule, tmp_path):
    """Two ranks, each with half the batch (skewed in opposite ways), end with the bias that one process gets
    from both halves (as two micro-batches: the same GEMM shapes, hence the same routing)."""
    spawn_ranks(_rank_update, (2, str(tmp_path / "init"), rule, str(tmp_path)), 2)
    moe = make_moe(bias_update=rule, bias_rate=0.05)
    x = skewed_batch(moe, two_sided=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for half in x.chunk(2):
                moe.train()(half)
    finally:
        torch.set_num_threads(threads)
    moe.update_bias()
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"bias{rank}.pt"), moe.bias_E, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------ expert parallelism
def _ep_rank(rank: int, world: int, init_file: str, bias: list[float], out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    moe = make_moe()
    moe.bias_E.copy_(torch.tensor(bias))
    moe.experts.shard(init_device_mesh("cpu", (world,)))
    x, g = ep_batch()
    x = x.chunk(world)[rank].clone().requires_grad_()
    out, stats = moe(x)
    (out * g.chunk(world)[rank]).sum().backward()
    torch.save({"out": out.detach(), "x_grad": x.grad, "counts": stats.counts_E,
                "w13_grad": moe.experts.w13_EL2F.grad.to_local(), "w2_grad": moe.experts.w2_EFL.grad.to_local()},
               os.path.join(out_dir, f"ep{rank}.pt"))
    shutdown_distributed()


def ep_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(64, TINY.d_model, generator=g), torch.randn(64, TINY.d_model, generator=g)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["expert 5 gets no token", "all tokens to rank 0's experts"])
def test_expert_parallel_dispatch_equals_one_process(case, tmp_path):
    """Two EP ranks, 4 experts each, each with half the tokens: the same outputs and input gradients as one
    process with all 8 experts, and each rank's expert gradients are its slice of the whole batch's."""
    bias = [0.0] * 8
    if case == "expert 5 gets no token":
        bias[5] = -100.0
    else:
        bias[:4] = [100.0] * 4  # rank 1's experts receive nothing, rank 0 everything
    spawn_ranks(_ep_rank, (2, str(tmp_path / "init"), bias, str(tmp_path)), 2)
    moe = make_moe()
    moe.bias_E.copy_(torch.tensor(bias))
    x, g = ep_batch()
    x.requires_grad_()
    out, stats = moe(x)
    (out * g).sum().backward()
    ranks = [torch.load(tmp_path / f"ep{r}.pt") for r in range(2)]
    assert (stats.counts_E[5] == 0) if case.startswith("expert") else (stats.counts_E[4:].sum() == 0)
    torch.testing.assert_close(torch.cat([r["out"] for r in ranks]), out.detach())
    torch.testing.assert_close(torch.cat([r["x_grad"] for r in ranks]), x.grad)
    torch.testing.assert_close(torch.cat([r["w13_grad"] for r in ranks]), moe.experts.w13_EL2F.grad)
    torch.testing.assert_close(torch.cat([r["w2_grad"] for r in ranks]), moe.experts.w2_EFL.grad)
