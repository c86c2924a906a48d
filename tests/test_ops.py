"""marin:: ops against slow, obvious references, plus opcheck and gradcheck on every op."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from marin_model.ops import ROUTING_MODES, permute, permute_rows, route_topk, route_topk_backward, unpermute, \
    unpermute_backward


# ------------------------------------------------------------------------------------------ slow references
def reference_route_topk(logits, bias, k, mode, scale, renormalize, n_group=1, topk_group=1):
    """Python loops over tokens. Selection scores are rounded in the op's dtype (fp32 unless fp64) so the
    comparison tests selection logic, not rounding; the weights and lse are computed in float64."""
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    score = torch.softmax(logits.to(acc), -1) if mode == "softmax_topk" else logits.to(acc)
    score = (score + bias.to(acc) if bias is not None else score).tolist()
    T, E = logits.shape
    ids, weights, lses = [], [], []
    for t, row in enumerate(logits.double().tolist()):
        lse = max(row) + math.log(sum(math.exp(v - max(row)) for v in row))
        s = score[t]
        if n_group > 1:
            size = E // n_group
            group_score = [sum(sorted(s[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(n_group)]
            kept = sorted(range(n_group), key=lambda g: (-group_score[g], g))[:topk_group]
            s = [v if e // size in kept else -math.inf for e, v in enumerate(s)]
        chosen = sorted(range(E), key=lambda e: (-s[e], e))[:k]
        if mode == "sigmoid":
            gate = [1 / (1 + math.exp(-row[e])) for e in chosen]
        elif mode == "softmax_topk":
            gate = [math.exp(row[e] - lse) for e in chosen]
        else:
            exps = [math.exp(row[e] - max(row)) for e in chosen]
            gate = [v / sum(exps) for v in exps]
        if renormalize and mode != "topk_softmax":
            gate = [g / sum(gate) for g in gate]
        ids.append(chosen)
        weights.append([g * scale for g in gate])
        lses.append(lse)
    counts = [sum(r.count(e) for r in ids) for e in range(E)]
    return (torch.tensor(ids, dtype=torch.int32).view(T, k), torch.tensor(weights, dtype=torch.float64).view(T, k),
            torch.tensor(counts, dtype=torch.int32), torch.tensor(lses, dtype=torch.float64))


def reference_permute(x, expert_ids, num_experts, align, capacity):
    """Python loops: visit entries in flat order, append to their expert unless dropped, pad each group
    (src_of -1, zero); the rows past the last group are unused (src_of -2, zero here)."""
    T, K = expert_ids.shape
    R = T * K + num_experts * (align - 1)
    kept = [[] for _ in range(num_experts)]
    for flat, e in enumerate(expert_ids.reshape(-1).tolist()):
        if e >= 0 and (capacity == 0 or len(kept[e]) < capacity):
            kept[e].append(flat)
    routed, row_of, src_of, offsets = x.new_zeros(R, x.shape[1]), [[-1] * K for _ in range(T)], [-1] * R, [0]
    for e in range(num_experts):
        for i, flat in enumerate(kept[e]):
            row = offsets[e] + i
            routed[row], src_of[row], row_of[flat // K][flat % K] = x[flat // K], flat, row
        offsets.append(offsets[e] + math.ceil(len(kept[e]) / align) * align)
    src_of[offsets[-1]:] = [-2] * (R - offsets[-1])
    as_int = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return routed, as_int(row_of).view(T, K), as_int(src_of), as_int(offsets)


def reference_unpermute(routed, row_of, weights):
    T, K = row_of.shape
    out = torch.zeros(T, routed.shape[1], dtype=torch.float64)
    for t in range(T):
        for k in range(K):
            if row_of[t, k] >= 0:
                out[t] += (1.0 if weights is None else float(weights[t, k])) * routed[row_of[t, k]].double()
    return out


# Absolute and relative tolerance of float outputs per dtype (integer outputs must be equal).
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2),
       torch.float16: (2e-3, 2e-3)}


def assert_close(actual, expected, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol)


def check_route_topk(logits, bias, k, mode, scale=2.5, renormalize=True, n_group=1, topk_group=1):
    """The op equals the reference: ids and counts exactly, weights and lse within the dtype's tolerance."""
    got = route_topk(logits, bias, k, mode, scale, renormalize, n_group, topk_group)
    want = reference_route_topk(logits, bias, k, mode, scale, renormalize, n_group, topk_group)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(got[2], want[2], rtol=0, atol=0)
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    assert got[1].dtype == acc and got[3].dtype == acc
    assert_close(got[1], want[1], acc)
    assert_close(got[3], want[3], acc)
    return got


def check_permute(x, expert_ids, num_experts, align=1, capacity=0):
    """The op equals the reference exactly (rows are copies; routed only up to offsets[E], the unused rows past
    it are unspecified), and unpermute inverts it for kept entries."""
    got = permute(x, expert_ids, num_experts, align, capacity)
    want = reference_permute(x, expert_ids, num_experts, align, capacity)
    assert got[0].shape == want[0].shape and got[0].shape[0] == permute_rows(*expert_ids.shape, num_experts, align)
    used = int(want[3][-1])
    torch.testing.assert_close(got[0][:used], want[0][:used], rtol=0, atol=0)
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    back = unpermute(got[0], got[1], got[2], None)
    kept = (got[1] >= 0).sum(1, keepdim=True).to(x.dtype)
    torch.testing.assert_close(back, x * kept, rtol=0, atol=0)
    return got


def random_ids(T, K, E, generator, drop=0.0):
    """[T,K] int32 distinct experts per token, a fraction `drop` of entries set to -1."""
    ids = torch.rand(T, E, generator=generator).argsort(dim=1)[:, :K].to(torch.int32)
    return torch.where(torch.rand(T, K, generator=generator) < drop, -1, ids).to(torch.int32)


# ------------------------------------------------------------------------------------------------ route_topk
@pytest.mark.parametrize("E", [7, 257, 384])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("mode", ROUTING_MODES)
def test_route_topk_matches_reference(E, k, mode):
    g = torch.Generator().manual_seed(E * 10 + k)
    logits = torch.randn(17, E, generator=g) * 3
    bias = torch.randn(E, generator=g)
    check_route_topk(logits, bias, k, mode)
    check_route_topk(logits, None, k, mode, scale=1.0, renormalize=False)


@pytest.mark.parametrize("mode", ROUTING_MODES)
def test_route_topk_breaks_ties_toward_lower_expert_ids(mode):
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 3, (40, 7), generator=g).float()  # three distinct values over 7 experts
    check_route_topk(logits, None, 5, mode)
    assert check_route_topk(torch.zeros(3, 9), None, 4, mode)[0].tolist() == [[0, 1, 2, 3]] * 3


@pytest.mark.parametrize("E,n_group,topk_group,k", [(384, 8, 4, 8), (256, 8, 4, 8), (12, 4, 2, 3), (8, 8, 3, 2)])
def test_route_topk_device_limited_routing_matches_reference(E, n_group, topk_group, k):
    g = torch.Generator().manual_seed(E)
    logits = torch.randn(20, E, generator=g)
    ids = check_route_topk(logits, torch.randn(E, generator=g) * 0.1, k, "sigmoid", n_group=n_group,
                           topk_group=topk_group)[0]
    groups_used = (ids.long() // (E // n_group)).sort(dim=1).values
    assert all(len(set(row)) <= topk_group for row in groups_used.tolist())


def test_route_topk_sends_every_token_to_an_expert_with_a_dominant_bias():
    bias = torch.zeros(7)
    bias[3] = 100.0
    ids, weights, counts, _ = check_route_topk(torch.randn(30, 7), bias, 2, "sigmoid")
    assert (ids[:, 0] == 3).all() and counts[3] == 30 and counts.sum() == 60
    assert torch.allclose(weights.sum(1), torch.full((30,), 2.5))  # bias reaches selection, not weights


def test_route_topk_handles_one_token_and_no_tokens():
    check_route_topk(torch.randn(1, 384), None, 8, "sigmoid")
    ids, weights, counts, lse = route_topk(torch.empty(0, 384), None, 8, "sigmoid", 2.5, True, 1, 1)
    assert ids.shape == (0, 8) and weights.shape == (0, 8) and lse.shape == (0,)
    assert counts.tolist() == [0] * 384 and counts.dtype == torch.int32


def test_route_topk_accepts_bf16_logits_and_computes_in_fp32():
    logits = torch.randn(9, 16).bfloat16()
    got = check_route_topk(logits, torch.randn(16), 4, "sigmoid")
    assert got[1].dtype == torch.float32


@pytest.mark.parametrize("bad", [dict(k=0), dict(k=9), dict(mode="top1"), dict(n_group=3, topk_group=1),
                                 dict(n_group=4, topk_group=1, k=3)])
def test_route_topk_rejects_bad_arguments(bad):
    args = dict(k=2, mode="sigmoid", n_group=1, topk_group=1) | bad
    with pytest.raises(ValueError):
        route_topk(torch.randn(3, 8), None, args["k"], args["mode"], 1.0, True, args["n_group"], args["topk_group"])


@pytest.mark.parametrize("mode", ROUTING_MODES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_gradients_match_finite_differences(mode, renormalize):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, 12, generator=g, dtype=torch.float64) * 2).requires_grad_()
    bias = torch.randn(12, generator=g, dtype=torch.float64)
    fn = lambda x: route_topk(x, bias, 3, mode, 2.5, renormalize, 3, 2)[1::2]  # noqa: E731 (weights, lse)
    assert torch.autograd.gradcheck(fn, (logits,))


def test_route_topk_bias_gets_no_gradient():
    logits = torch.randn(5, 8, requires_grad=True)
    bias = torch.randn(8, requires_grad=True)
    _, weights, _, lse = route_topk(logits, bias, 2, "sigmoid", 2.5, True, 1, 1)
    (weights.sum() + lse.sum()).backward()
    assert bias.grad is None and logits.grad is not None


# ---------------------------------------------------------------------------------------------------- permute
@pytest.mark.parametrize("E", [7, 257, 384])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("align,capacity,drop", [(1, 0, 0.0), (4, 0, 0.2), (16, 3, 0.1)])
def test_permute_matches_reference(E, k, align, capacity, drop):
    g = torch.Generator().manual_seed(E + k)
    x = torch.randn(40, 6, generator=g)
    check_permute(x, random_ids(40, k, E, g, drop), E, align, capacity)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_permute_copies_rows_exactly_in_every_dtype(dtype):
    g = torch.Generator().manual_seed(3)
    check_permute(torch.randn(25, 8, generator=g).to(dtype), random_ids(25, 2, 7, g), 7, align=8)


def test_permute_all_tokens_to_one_expert_with_capacity_drops_the_latest():
    ids = torch.full((30, 1), 5, dtype=torch.int32)
    routed, row_of, src_of, offsets = check_permute(torch.randn(30, 4), ids, 7, align=4, capacity=10)
    assert row_of[:10, 0].tolist() == list(range(10)) and (row_of[10:] == -1).all()
    assert offsets.tolist() == [0] * 6 + [12, 12] and (src_of[10:12] == -1).all() and (src_of[12:] == -2).all()


def test_permute_handles_no_tokens_and_all_dropped():
    routed, row_of, src_of, offsets = check_permute(torch.empty(0, 4), torch.empty(0, 3, dtype=torch.int32), 7, 4)
    assert routed.shape == (21, 4) and (src_of == -2).all() and offsets.tolist() == [0] * 8  # every row unused
    check_permute(torch.randn(5, 4), torch.full((5, 2), -1, dtype=torch.int32), 7, 2)


def test_permute_rejects_expert_ids_out_of_range():
    with pytest.raises(ValueError, match="expert_ids"):
        permute(torch.randn(2, 4), torch.tensor([[0], [7]], dtype=torch.int32), 7, 1, 0)
    with pytest.raises(ValueError, match="int32"):
        permute(torch.randn(2, 4), torch.tensor([[0], [1]]), 7, 1, 0)


def test_permute_gradient_is_the_sum_over_copies():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ids = random_ids(9, 3, 7, g, drop=0.2)
    assert torch.autograd.gradcheck(lambda x: permute(x, ids, 7, 4, 2)[0], (x,))


# -------------------------------------------------------------------------------------------------- unpermute
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("weighted", [True, False])
def test_unpermute_matches_reference(dtype, weighted):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(33, 8, generator=g).to(dtype)
    _, row_of, src_of, _ = permute(x, random_ids(33, 5, 257, g, drop=0.1), 257, 2, 0)
    routed = torch.randn(src_of.shape[0], 8, generator=g).to(dtype)
    weights = torch.rand(33, 5, generator=g) if weighted else None
    out = unpermute(routed, row_of, src_of, weights)
    assert out.dtype == dtype
    assert_close(out, reference_unpermute(routed, row_of, weights), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unpermute_rounds_each_product_then_each_sum_like_the_cuda_kernel(dtype):
    """out = ((0 + x0*w0) + x1*w1) + ..., every product and every sum rounded to fp32: the CUDA kernel's
    ``__fmul_rn`` / ``__fadd_rn``, which tests/test_cuda_ops.py compares bitwise. (``addcmul_`` fuses the
    multiply and add into one FMA on AVX2 and AVX-512 CPUs, which differs in the last bit.)"""
    g = torch.Generator().manual_seed(11)
    T, K, E, H = 512, 4, 16, 64
    _, row_of, src_of, _ = permute(torch.zeros(T, H), random_ids(T, K, E, g, drop=0.1), E, 1, 0)
    routed = torch.randn(src_of.shape[0], H, generator=g).to(dtype)
    weights = torch.rand(T, K, generator=g)
    rows = routed.float().numpy()
    want = np.zeros((T, H), dtype=np.float32)
    for k in range(K):
        kept = row_of[:, k].numpy() >= 0
        product = rows[row_of[:, k].numpy()] * weights[:, k, None].numpy()  # numpy rounds every ufunc's result
        want = np.where(kept[:, None], want + product, want).astype(np.float32)
    assert torch.equal(unpermute(routed, row_of, src_of, weights), torch.from_numpy(want).to(dtype))  # one rounding


def test_unpermute_ignores_non_finite_values_in_rows_it_does_not_pull():
    routed = torch.tensor([[1.0], [float("nan")], [2.0]])
    out = unpermute(routed, torch.tensor([[0, -1], [2, 0]], dtype=torch.int32),
                    torch.tensor([0, -1, 2], dtype=torch.int32), torch.ones(2, 2))
    assert out.tolist() == [[1.0], [3.0]]


def test_unpermute_gradients_match_finite_differences():
    g = torch.Generator().manual_seed(6)
    _, row_of, src_of, _ = permute(torch.zeros(8, 1), random_ids(8, 3, 7, g, drop=0.2), 7, 2, 2)
    routed = torch.randn(src_of.shape[0], 4, generator=g, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda r, w: unpermute(r, row_of, src_of, w), (routed, weights))
    assert torch.autograd.gradcheck(lambda r: unpermute(r, row_of, src_of, None), (routed,))


def test_unpermute_backward_zeroes_padding_rows_and_reads_no_unused_row():
    """K = 1, where src_of // K keeps -2 at -2: padding (-1) gets zero, and a NaN in an unused row (-2) of
    routed, where no token's row_of points, reaches no gradient."""
    routed = torch.tensor([[1.0], [0.0], [float("nan")], [float("nan")]])
    row_of, src_of = torch.tensor([[0], [-1]], dtype=torch.int32), torch.tensor([0, -1, -2, -2], dtype=torch.int32)
    grad_routed, grad_w = unpermute_backward(torch.tensor([[2.0], [3.0]]), routed, row_of, src_of, torch.ones(2, 1))
    assert grad_routed[:2].tolist() == [[2.0], [0.0]] and grad_w.tolist() == [[2.0], [0.0]]


def test_unpermute_backward_weight_gradient_is_zero_for_dropped_and_without_weights():
    routed = torch.randn(4, 3)
    row_of, src_of = torch.tensor([[0, -1], [1, 2]], dtype=torch.int32), torch.tensor([0, 2, 3, -1], dtype=torch.int32)
    grad_routed, grad_w = unpermute_backward(torch.ones(2, 3), routed, row_of, src_of, torch.ones(2, 2))
    assert grad_w[0, 1] == 0 and grad_routed[3].abs().sum() == 0
    _, grad_w = unpermute_backward(torch.ones(2, 3), routed, row_of, src_of, None)
    assert grad_w.shape == (2, 2) and grad_w.dtype == torch.float32 and (grad_w == 0).all()


# -------------------------------------------------------------------------------------------------- opcheck
# opcheck's test_aot_dispatch_dynamic sums every output into one accumulator and fails when the first output
# is an integer tensor (route_topk's expert_ids); that op's compile path is covered in test_moe.py instead.
NO_AOT = ("test_schema", "test_autograd_registration", "test_faketensor")


def _opcheck_cases():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(10, 16, generator=g, requires_grad=True)
    ids, weights, _, lse = route_topk(logits.detach(), None, 4, "sigmoid", 2.5, True, 1, 1)
    x = torch.randn(10, 8, generator=g, requires_grad=True)
    routed, row_of, src_of, _ = permute(x.detach(), random_ids(10, 4, 16, g, drop=0.2), 16, 4, 3)
    w = weights.clone().requires_grad_()
    r = routed.clone().requires_grad_()
    empty_ids = torch.empty(0, 4, dtype=torch.int32)
    return [
        (route_topk, (logits, torch.randn(16, generator=g), 4, "sigmoid", 2.5, True, 4, 2), NO_AOT),
        (route_topk, (logits, None, 4, "softmax_topk", 1.0, False, 1, 1), NO_AOT),
        (route_topk, (logits, None, 4, "topk_softmax", 1.0, True, 1, 1), NO_AOT),
        (route_topk, (torch.empty(0, 16), None, 4, "sigmoid", 2.5, True, 1, 1), NO_AOT),
        (route_topk_backward, (torch.randn(10, 4), torch.randn(10), logits.detach(), ids, weights, "sigmoid", 2.5,
                               True), None),
        (permute, (x, ids, 16, 4, 0), None),
        (permute, (x, random_ids(10, 4, 16, g, drop=0.3), 16, 8, 2), None),
        (permute, (torch.empty(0, 8), empty_ids, 16, 4, 0), None),
        (unpermute, (r, row_of, src_of, w), None),
        (unpermute, (r, row_of, src_of, None), None),
        (unpermute_backward, (torch.randn(10, 8), routed, row_of, src_of, weights), None),
        (unpermute_backward, (torch.randn(10, 8), routed, row_of, src_of, None), None),
    ]


@pytest.mark.parametrize("case", range(12))
def test_opcheck(case):
    op, args, utils = _opcheck_cases()[case]
    kwargs = {} if utils is None else {"test_utils": utils}
    torch.library.opcheck(op, args, **kwargs)


def test_a_kernel_registered_for_cuda_does_not_take_cpu_tensors():
    """marin_model.cuda.dispatch registers the CUDA kernels with ``register_kernel(op, "cuda", fn)``; CPU tensors
    must keep the reference. (With ``custom_op(..., device_types=("cpu", "cuda"))`` torch 2.13 dispatches CPU
    tensors to the "cuda" kernel: see ops.contract.reference_op.) A fresh interpreter, so this process's ops keep their kernels."""
    script = """
import torch
from marin_model import ops
def refuse(*args):
    raise AssertionError("the cuda kernel ran on cpu tensors")
for name in ("route_topk", "route_topk_backward", "permute", "unpermute", "unpermute_backward"):
    torch.library.register_kernel(f"marin::{name}", "cuda", refuse)
logits = torch.randn(6, 8, requires_grad=True)
x = torch.randn(6, 4, requires_grad=True)
ids, w, _, lse = ops.route_topk(logits, None, 2, "sigmoid", 1.0, True, 1, 1)
routed, row_of, src_of, offsets = ops.permute(x, ids, 8, 1, 0)
(ops.unpermute(routed, row_of, src_of, w).sum() + lse.sum()).backward()
print("ok", bool(logits.grad.abs().sum() > 0), bool(x.grad.abs().sum() > 0))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["ok", "True", "True"]
