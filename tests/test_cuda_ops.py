"""The CUDA kernels against the CPU reference ops, on a GPU (every test here is skipped without one).

The reference is the CPU implementation in marin_model/ops/ of the same ``marin::`` op (itself tested
against slow loops in tests/test_ops.py): each test runs the op on CUDA tensors, which dispatch to cuda/
through marin_model/cuda/dispatch.py, and on copies of them on the CPU. Integer outputs (ids, counts, rows)
must be equal; so must permute's rows (a copy) and unpermute's outputs (the kernels round in the reference's
order); the other float outputs within the tolerance table below. The unused rows of routed and grad_routed (past
offsets[E], src_of -2) are unspecified and not compared. Run on the H200 with ``scripts/gpu_check.sh``.
"""

import math

import pytest
import torch

from cuda_env import cuda_kernels  # noqa: F401 - autouse fixture
from op_checks import opcheck_cases, opcheck_specified

from marin_model import ops
from marin_model.cuda import dispatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

MODES = ["sigmoid", "softmax_topk", "topk_softmax"]
# (rtol, atol) of float outputs per dtype; integer outputs and copies must be equal.
TOL = {torch.float32: (2e-5, 1e-6), torch.bfloat16: (1.6e-2, 1e-5), torch.float16: (2e-3, 1e-6)}
GRAD_WEIGHTS_TOL = (1e-4, 1e-4)  # dot products over H: the kernel and torch sum in different orders


def gen(seed):
    return torch.Generator().manual_seed(seed)


def both(fn, *args):
    """fn on CUDA copies of the tensor arguments, and on the CPU originals: (cuda result on CPU, cpu result)."""
    on_gpu = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    got = fn(*on_gpu)
    got = tuple(t.cpu() for t in got) if isinstance(got, tuple) else got.cpu()
    return got, fn(*args)


def assert_close(got, want, dtype=torch.float32):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)


def assert_permute_equal(got, want):
    """permute's outputs equal, routed's rows up to offsets[E] only: the unused rows past it are unspecified."""
    used = int(want[3][-1])
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    assert torch.equal(got[0][:used], want[0][:used])
    assert all(torch.equal(a, b) for a, b in zip(got[1:], want[1:]))


def used_rows(src_of):
    """The rows of routed (or grad_routed) the contract specifies: all but the unused ones (src_of -2)."""
    return src_of != -2


def assert_same_experts(got, want, logits, bias, mode):
    """Ids and counts equal. In softmax_topk the selection score is a probability, whose last bit differs
    between CUDA's expf and the CPU's vectorized exp, so a near-tie may flip: a differing row (at most 1%)
    must then pick experts whose scores equal the reference's choice within 1e-6."""
    ids, counts, want_ids = got[0], got[2], want[0]
    if mode != "softmax_topk" or torch.equal(ids, want_ids):
        assert torch.equal(ids, want_ids) and torch.equal(counts, want[2])
        return
    rows = (ids != want_ids).any(-1)
    assert rows.float().mean() <= 0.01, f"{int(rows.sum())} tokens routed differently"
    score = torch.softmax(logits.float(), -1) + (0 if bias is None else bias)
    torch.testing.assert_close(score.gather(1, ids.long())[rows], score.gather(1, want_ids.long())[rows],
                               rtol=0, atol=1e-6)
    assert torch.equal(counts, torch.bincount(ids.flatten().long(), minlength=logits.shape[1]).int())


# ---------------------------------------------------------------------------------------------- route_topk
ROUTE_SHAPES = [(7, 1, 1, 1), (7, 5, 1, 1), (257, 8, 1, 1), (256, 8, 8, 4), (384, 8, 1, 1), (384, 16, 12, 6),
                (512, 16, 1, 1), (512, 8, 16, 4)]  # (E, k, n_group, topk_group)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E,k,n_group,topk_group", ROUTE_SHAPES)
def test_route_topk_equals_the_reference(E, k, n_group, topk_group, mode, dtype):
    g = gen(E + k)
    logits = (torch.randn(1000, E, generator=g) * 2).to(dtype)
    bias = torch.randn(E, generator=g) * (0.01 if mode == "softmax_topk" else 0.5)
    for b, renormalize in ((None, True), (bias, True), (bias, False)):
        got, want = both(ops.route_topk, logits, b, k, mode, 2.5, renormalize, n_group, topk_group)
        assert_same_experts(got, want, logits, b, mode)
        same = (got[0] == want[0]).all(-1)  # weights compared where the experts agree
        assert_close(got[1][same], want[1][same])
        assert_close(got[3], want[3])


@pytest.mark.parametrize("T", [0, 1])
def test_route_topk_tiny_batches(T):
    logits = torch.randn(T, 384, generator=gen(T))
    got, want = both(ops.route_topk, logits, None, 8, "sigmoid", 2.5, True, 1, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    assert_close(got[1], want[1])


@pytest.mark.parametrize("mode", MODES)
def test_route_topk_ties_and_one_hot_routing(mode):
    tied = torch.randint(0, 3, (512, 257), generator=gen(1)).float()  # exact ties everywhere
    got, want = both(ops.route_topk, tied, None, 8, mode, 1.0, True, 1, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    flat = torch.zeros(64, 384)  # all equal: experts 0..k-1
    got, _ = both(ops.route_topk, flat, None, 16, mode, 1.0, True, 1, 1)
    assert got[0].tolist() == [list(range(16))] * 64
    bias = torch.zeros(384)
    bias[300] = 1e4  # every token picks expert 300 first
    got, want = both(ops.route_topk, torch.randn(256, 384, generator=gen(2)), bias, 8, mode, 1.0, True, 1, 1)
    assert torch.equal(got[0], want[0]) and got[2][300] == 256


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_backward_equals_the_reference(mode, renormalize, dtype):
    g = gen(7)
    for E, k in ((7, 1), (257, 8), (512, 16)):
        logits = torch.randn(300, E, generator=g).to(dtype)
        ids, weights, _, _ = ops.route_topk(logits, None, k, mode, 2.5, renormalize, 1, 1)
        grad_w, grad_lse = torch.randn(300, k, generator=g), torch.randn(300, generator=g)
        got, want = both(ops.route_topk_backward, grad_w, grad_lse, logits, ids, weights, mode, 2.5, renormalize)
        assert got.dtype == dtype
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got.float(), want.float(), rtol=max(rtol, 1e-4), atol=max(atol, 1e-5))


@pytest.mark.parametrize("mode", ["sigmoid", "softmax_topk"])
@pytest.mark.parametrize("E,k,n_group,topk_group", [(384, 8, 1, 1), (256, 8, 8, 4)])
def test_route_topk_and_backward_loop_over_a_long_batch(E, k, n_group, topk_group, mode):
    """More tokens than the persistent grid holds at once (at most 8 blocks of 4 warps per SM, a token per
    warp): both kernels' grid-stride loops go round, so a loop that skips or repeats a stride fails."""
    T = 12_289
    assert T > torch.cuda.get_device_properties(0).multi_processor_count * 8 * 4
    g = gen(T + E)
    logits = torch.randn(T, E, generator=g) * 2
    bias = torch.randn(E, generator=g) * (0.01 if mode == "softmax_topk" else 0.5)
    got, want = both(ops.route_topk, logits, bias, k, mode, 2.5, True, n_group, topk_group)
    assert_same_experts(got, want, logits, bias, mode)
    same = (got[0] == want[0]).all(-1)
    assert_close(got[1][same], want[1][same])
    assert_close(got[3], want[3])
    grad_w, grad_lse = torch.randn(T, k, generator=g), torch.randn(T, generator=g)
    got, want = both(ops.route_topk_backward, grad_w, grad_lse, logits, want[0], want[1], mode, 2.5, True)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------- permute
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,K,E", [(1, 1, 7), (4096, 8, 384), (3000, 16, 512), (2048, 2, 257), (513, 5, 7)])
@pytest.mark.parametrize("align,capacity", [(1, 0), (16, 0), (8, 40)])
def test_permute_equals_the_reference_bitwise(T, K, E, align, capacity, dtype):
    g = gen(T + K + E)
    x = torch.randn(T, 96, generator=g).to(dtype)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    got, want = both(ops.permute, x, ids, E, align, capacity)
    assert_permute_equal(got, want)


@pytest.mark.parametrize("H", [1, 33, 4096])  # 2-, 66- and 8192-byte bf16 rows: narrow and 16-byte paths
def test_permute_any_row_width_and_misaligned_rows(H):
    g = gen(H)
    storage = torch.randn(300 * H + 1, generator=g).bfloat16().cuda()
    x = storage[1:].view(300, H)  # contiguous, but 2 bytes past an aligned address
    assert x.data_ptr() % 16 == 2
    ids = torch.randint(0, 7, (300, 2), generator=g, dtype=torch.int32)
    got = ops.permute(x, ids.cuda(), 7, 4, 0)
    assert_permute_equal(tuple(t.cpu() for t in got), ops.permute(x.cpu(), ids, 7, 4, 0))


def test_permute_all_tokens_to_one_expert_and_empty_input():
    ids = torch.full((5000, 2), 3, dtype=torch.int32)
    got, want = both(ops.permute, torch.randn(5000, 64, generator=gen(3)), ids, 7, 16, 0)
    assert_permute_equal(got, want)
    got, want = both(ops.permute, torch.randn(0, 64), torch.zeros(0, 8, dtype=torch.int32), 384, 16, 0)
    assert_permute_equal(got, want)  # every row unused: src_of -2


def test_kernels_serve_cuda_tensors():
    """Out-of-range ids: the reference raises, the kernel (no host sync) drops them: proof of dispatch."""
    ids = torch.tensor([[0, 9]], dtype=torch.int32)
    with pytest.raises(ValueError):
        ops.permute(torch.ones(1, 8), ids, 7, 1, 0)
    _, row_of, src_of, _ = ops.permute(torch.ones(1, 8).cuda(), ids.cuda(), 7, 1, 0)
    assert row_of.tolist() == [[0, -1]] and src_of.tolist() == [0, -2]


def test_inputs_the_kernels_do_not_take_fall_back_to_the_reference():
    g = gen(19)
    logits = torch.randn(64, 1024, generator=g)  # E > 512
    got, want = both(ops.route_topk, logits, None, 20, "sigmoid", 1.0, True, 1, 1)  # and k > 16
    assert torch.equal(got[0], want[0])
    x, ids = torch.randn(64, 8, generator=g, dtype=torch.float64), torch.randint(0, 1024, (64, 20), generator=g,
                                                                                  dtype=torch.int32)
    got, want = both(ops.permute, x, ids, 1024, 4, 0)
    assert_permute_equal(got, want)
    got, want = both(ops.unpermute, want[0], want[1], want[2], None)  # fp64 rows
    assert torch.equal(got, want)


# ----------------------------------------------------------------------------------------------- unpermute
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("T,K,E,H", [(1, 1, 7, 64), (4096, 8, 384, 256), (1000, 16, 512, 72), (300, 2, 7, 33)])
def test_unpermute_and_backward_equal_the_reference(T, K, E, H, weighted, dtype):
    g = gen(T + H)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(T, 1), ids, E, 8, 0)
    routed = torch.randn(src_of.shape[0], H, generator=g).to(dtype)
    weights = torch.rand(T, K, generator=g) if weighted else None
    got, want = both(ops.unpermute, routed, row_of, src_of, weights)
    assert torch.equal(got, want)  # same products, same sums, same order
    grad_out = torch.randn(T, H, generator=g).to(dtype)
    (grad_routed, grad_w), (want_routed, want_w) = both(ops.unpermute_backward, grad_out, routed, row_of, src_of,
                                                        weights)
    used = used_rows(src_of)
    assert torch.equal(grad_routed[used], want_routed[used])
    torch.testing.assert_close(grad_w, want_w, rtol=GRAD_WEIGHTS_TOL[0], atol=GRAD_WEIGHTS_TOL[1])


def test_nan_and_infinite_logits_lse_and_unpermute_edge_cases():
    """What the emulated suite checks on the CPU, once on the device: NaN lse, fp32 gradients of bf16 rows,
    row_of outside [0, R) dropped, NaN outputs compared as NaN."""
    logits = torch.randn(8, 300, generator=gen(31))
    logits[0, 3], logits[1, :], logits[2, 0], logits[2, 1:] = float("nan"), float("nan"), float("nan"), -math.inf
    logits[3, 5] = math.inf
    for mode in MODES:
        got, want = both(ops.route_topk, logits, None, 4, mode, 1.0, True, 1, 1)
        assert torch.equal(got[0], want[0])
        torch.testing.assert_close(got[3], want[3], rtol=2e-6, atol=1e-6, equal_nan=True)
    ids = torch.randint(0, 9, (64, 4), generator=gen(32), dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(64, 1), ids, 9, 4, 0)
    routed, weights = torch.randn(src_of.shape[0], 24, generator=gen(33)).bfloat16(), torch.rand(64, 4, generator=gen(34))
    grad = torch.randn(64, 24, generator=gen(35))  # fp32 gradient, bf16 rows: rounded once
    got, want = both(ops.unpermute_backward, grad, routed, row_of, src_of, weights)
    assert torch.equal(got[0][used_rows(src_of)], want[0][used_rows(src_of)])
    garbage = row_of.clone()
    garbage[::3, 1] = 10**6
    clean = torch.where(garbage < src_of.shape[0], garbage, -1)
    got = ops.unpermute(routed.cuda(), garbage.cuda(), src_of.cuda(), weights.cuda()).cpu()
    assert torch.equal(got, ops.unpermute(routed, clean, src_of, weights))
    routed[0, :3] = float("nan")
    got, want = both(ops.unpermute, routed, row_of, src_of, weights)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_opcheck_on_cuda_tensors():
    """torch.library.opcheck with the kernels: schema, autograd registration, fake-tensor agreement, and eager
    against compiled (AOTDispatcher) on the rows the contract specifies (tests/op_checks.py; the emulated suite
    runs the same check on the host build)."""
    for op, args in opcheck_cases("cuda"):
        opcheck_specified(op, args)


# ------------------------------------------------------------------------------------- composed, gradients
def moe_chain(logits, x, mode):
    """route -> permute -> (a per-row scale standing in for the experts) -> unpermute; a scalar loss."""
    ids, weights, _, lse = ops.route_topk(logits, None, 8, mode, 2.5, True, 1, 1)
    routed, row_of, src_of, _ = ops.permute(x, ids, logits.shape[1], 16, 0)
    out = ops.unpermute(routed * 1.5, row_of, src_of, weights)
    return (out * torch.linspace(-1, 1, x.shape[1], device=x.device)).sum() + 1e-2 * lse.square().mean()


@pytest.mark.parametrize("mode", MODES)
def test_gradients_through_the_moe_chain_match_the_reference(mode):
    g = gen(11)
    logits, x = torch.randn(512, 384, generator=g), torch.randn(512, 128, generator=g)
    grads = []
    for device in ("cuda", "cpu"):
        lg, xx = logits.to(device).requires_grad_(), x.to(device).requires_grad_()
        moe_chain(lg, xx, mode).backward()
        grads.append((lg.grad.cpu(), xx.grad.cpu()))
    (g_logits, g_x), (want_logits, want_x) = grads
    torch.testing.assert_close(g_logits, want_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g_x, want_x, rtol=1e-5, atol=1e-6)


def test_repeated_runs_are_bitwise_identical():
    g = gen(13)
    logits = torch.randn(16384, 384, generator=g).cuda().requires_grad_()
    x = torch.randn(16384, 256, generator=g).cuda().bfloat16().requires_grad_()
    runs = []
    for _ in range(3):
        loss = moe_chain(logits, x, "sigmoid")
        runs.append((loss.detach(), *torch.autograd.grad(loss, (logits, x))))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))


def test_ops_capture_in_a_cuda_graph():
    g = gen(17)
    logits, x = torch.randn(4096, 384, generator=g).cuda(), torch.randn(4096, 256, generator=g).cuda()

    def step():
        ids, weights, counts, lse = ops.route_topk(logits, None, 8, "sigmoid", 2.5, True, 1, 1)
        routed, row_of, src_of, offsets = ops.permute(x, ids, 384, 16, 0)
        out = ops.unpermute(routed, row_of, src_of, weights)
        grad_routed, grad_w = ops.unpermute_backward(out, routed, row_of, src_of, weights)
        return ids, counts, offsets, src_of, out, grad_w, routed, grad_routed

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture (allocator, library load)
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    logits.copy_(torch.randn(4096, 384, generator=g).cuda())  # new inputs, same buffers
    x.copy_(torch.randn(4096, 256, generator=g).cuda())
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    assert all(torch.equal(a, b) for a, b in zip(captured[:6], eager[:6]))
    used = used_rows(eager[3])  # the unused rows of routed and grad_routed are unspecified
    assert all(torch.equal(a[used], b[used]) for a, b in zip(captured[6:], eager[6:]))


# ---------------------------------------------------------------------------------------------- the model
@pytest.mark.slow
def test_tiny_model_trains_on_gpu_with_the_kernels():
    from marin_model import config
    from marin_model import model as model_mod

    cfg = config.get_preset("tiny")
    torch.manual_seed(0)
    model = model_mod.Transformer(cfg).cuda().train()
    reference = model_mod.Transformer(cfg).train()
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    tokens = torch.randint(0, cfg.vocab_size, (8, 65), generator=gen(0))
    cpu_loss = reference(tokens[:, :-1], tokens[:, 1:]).loss
    tokens = tokens.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model(tokens[:, :-1], tokens[:, 1:]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.update_router_bias()
        losses.append(loss.item())
    assert dispatch.status()["registered"]
    assert abs(losses[0] - cpu_loss.item()) < 1e-3 * max(1.0, abs(cpu_loss.item()))  # same model, same loss
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.5  # it learns the batch
