"""The MoE layer's custom ops: ``marin::route_topk``, ``marin::permute``, ``marin::unpermute``.

Each op is a ``torch.library.custom_op`` whose body is the CPU reference (vectorized torch, deterministic),
registered for both "cpu" and "cuda" so CUDA tensors work before the kernels of ``cuda/`` are built;
``marin_model/kernels.py`` then overrides "cuda" with ``torch.library.register_kernel`` (issue 7). Each op
has a fake (meta) implementation, so ``torch.compile`` sees static output shapes, and an autograd formula
that calls a backward op of the same family, so the CUDA kernels take the backward pass too.

Contract (the CUDA kernels must match it exactly; ``S`` below is an op's accumulation dtype):

* ``route_topk(logits[T,E], bias[E]?, k, mode, scale, renormalize, n_group, topk_group)
  -> (expert_ids[T,k] int32, weights[T,k], counts[E] int32, lse[T])``.
  Selection on ``score + bias`` (bias never reaches the weights and gets no gradient); ``score`` is the
  logit for "sigmoid" and "topk_softmax", the softmax probability for "softmax_topk". Ties go to the
  lower expert id (stable sort of the negated score), ids are listed in that order. ``n_group > 1`` keeps
  only the ``topk_group`` groups (contiguous, equal size) with the largest sum of their top-2 scores.
  weights: "sigmoid" sigmoid(logit), "softmax_topk" the probability, both divided by their sum over the k
  chosen if ``renormalize``; "topk_softmax" the softmax over the k chosen logits; then times ``scale``.
  ``lse`` = logsumexp(logits) per token, so the z-loss mean(lse**2) is differentiable through it.
* ``route_topk_backward(grad_weights, grad_lse, logits, expert_ids, weights, mode, scale, renormalize)
  -> grad_logits[T,E]`` (logits' dtype).
* ``permute(x[T,H], expert_ids[T,K], num_experts, align, capacity) -> (routed[R,H], row_of[T,K] int32,
  src_of[R] int32, offsets[E+1] int32)`` with the static bound ``R = T*K + E*(align-1)``: a stable counting
  sort by expert (flat index t*K+k ascending within an expert), -1 ids dropped, entries ranked >= capacity
  in their expert dropped when capacity > 0, each group padded to a multiple of ``align``; rows not filled
  are zero, their ``src_of`` is -1; ``row_of`` is -1 for dropped entries.
* ``unpermute(routed[R,H], row_of[T,K], src_of[R], weights[T,K]?) -> out[T,H]`` (routed's dtype):
  out[t] = sum over kept k, in k order, of w[t,k] * routed[row_of[t,k]], accumulated in S; pull-based.
* ``unpermute_backward(grad_out, routed, row_of, src_of, weights?) -> (grad_routed[R,H], grad_weights[T,K])``;
  grad_weights has weights' dtype, and is all zeros (fp32) when weights is None.

The signatures are the ones the issue-6 brief gave both helpers, unchanged. Where it left a choice, this
module decided (issue 6):

* Floating dtypes: logits fp32 or bf16 (fp16 works too), hidden states fp32, bf16 or fp16, bias and combine
  weights fp32; math runs in fp32 (``S`` = fp32) and weights, lse and grad_weights are fp32. fp64 is accepted
  everywhere by the CPU reference so that ``gradcheck`` can run: any fp64 input makes ``S`` fp64 and those
  outputs fp64 (grad_weights takes the weights' dtype). The CUDA kernels need not take fp64.
* ``unpermute_backward`` without weights returns grad_weights as zeros of shape [T,K], fp32 (not an empty
  tensor), so the output's shape never depends on an optional input.
* Inputs are checked by ``check_*_args`` (shared with the CUDA entry points): ValueError names the argument.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ROUTING_MODES", "route_topk", "route_topk_backward", "permute", "unpermute", "unpermute_backward",
           "permute_rows", "check_route_topk_args", "check_permute_args", "check_unpermute_args"]

ROUTING_MODES = ("sigmoid", "softmax_topk", "topk_softmax")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _acc_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """fp64 if any input is fp64 (gradcheck), else fp32: the accumulation dtype ``S`` of the contract."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _gather_rows(table_RH: Tensor, index_N: Tensor) -> Tensor:
    """table[index] (rows of a 2-D table, elements of a 1-D one) with zeros where index is -1. One index_select
    (it takes the int32 row maps as they are), then only the -1 rows are zeroed, so no multiply-by-zero can turn
    a non-finite value in an unrelated row into NaN."""
    rows_NH = table_RH.index_select(0, index_N.clamp(min=0))
    return rows_NH.index_fill_(0, torch.nonzero(index_N < 0).squeeze(1), 0)


def _softmax(x_TE: Tensor) -> Tensor:
    """softmax over the last dim. torch's CPU kernel takes a slow path when that dim is narrower than 16 (at
    2048 x 8: 0.30 ms, 5x the padded 0.06 ms; AVX-512, torch 2.13, benchmarks/bench_softmax_cpu.py), so narrow
    rows are padded with -inf, whose exp is exactly 0: the same sum, the same values to rounding."""
    width = x_TE.shape[-1]
    if x_TE.device.type != "cpu" or width >= 16:
        return torch.softmax(x_TE, dim=-1)
    return torch.softmax(F.pad(x_TE, (0, 16 - width), value=float("-inf")), dim=-1)[..., :width]


def _check_ids(name: str, ids: Tensor, rows: int) -> None:
    _check(ids.dim() == 2 and ids.shape[0] == rows, f"{name} must be [T,K] with T={rows}, got {tuple(ids.shape)}")
    _check(ids.dtype == torch.int32, f"{name} must be int32, got {ids.dtype}")


def _reference_op(name: str):
    """``torch.library.custom_op`` `name` whose body serves CPU and CUDA tensors (until kernels.py takes CUDA).

    The two devices are registered one call each: torch's ``register_kernel`` given several device types binds
    its loop variable late (torch 2.13, ``torch/_library/custom_ops.py``), so every device's dispatch entry
    would call the kernel registered for the *last* one, and the CUDA kernels that kernels.py registers would
    then take CPU tensors too (and refuse them). tests/test_ops.py checks that they do not.
    """
    def wrap(body):
        op = torch.library.custom_op(name, body, mutates_args=(), device_types="cpu")
        op.register_kernel("cuda", body)
        return op

    return wrap


# ------------------------------------------------------------------------------------------------ route_topk
def check_route_topk_args(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, n_group: int,
                          topk_group: int) -> None:
    """Raises ValueError naming the first argument that breaks the route_topk contract (shared with kernels)."""
    _check(logits.dim() == 2, f"logits must be [T,E], got shape {tuple(logits.shape)}")
    _check(logits.dtype in _FLOATS, f"logits must be floating point, got {logits.dtype}")
    num_experts = logits.shape[1]
    _check(mode in ROUTING_MODES, f"mode must be one of {ROUTING_MODES}, got {mode!r}")
    _check(1 <= k <= num_experts, f"k must be in [1, E={num_experts}], got {k}")
    if bias is not None:
        _check(bias.shape == (num_experts,), f"bias must be [E={num_experts}], got {tuple(bias.shape)}")
        _check(bias.dtype in (torch.float32, torch.float64), f"bias must be fp32, got {bias.dtype}")
    if n_group > 1:
        _check(num_experts % n_group == 0, f"E={num_experts} is not divisible by n_group={n_group}")
        _check(1 <= topk_group <= n_group and topk_group * (num_experts // n_group) >= k,
               f"topk_group={topk_group} groups of {num_experts // n_group} experts cannot hold k={k}")


def _limit_groups(score_TE: Tensor, n_group: int, topk_group: int) -> Tensor:
    """Device-limited routing (DeepSeek-V3): experts outside the topk_group best groups get -inf."""
    T, E = score_TE.shape
    grouped_TGS = score_TE.view(T, n_group, E // n_group)
    group_score_TG = grouped_TGS.topk(min(2, E // n_group), dim=-1).values.sum(-1)
    best_TG = torch.sort(-group_score_TG, dim=-1, stable=True).indices[:, :topk_group]  # ties: lower group
    keep_TG = torch.zeros(T, n_group, dtype=torch.bool, device=score_TE.device).scatter_(1, best_TG, True)
    return score_TE.masked_fill(~keep_TG.repeat_interleave(E // n_group, dim=1), float("-inf"))


@_reference_op("marin::route_topk")
def route_topk(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, scale: float, renormalize: bool,
               n_group: int, topk_group: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Chooses k experts per token and their combine weights (contract in the module docstring).

    Args: logits [T,E]; bias [E] or None (selection only). Returns (expert_ids [T,k] int32, weights [T,k],
    counts [E] int32, lse [T]).
    """
    check_route_topk_args(logits, bias, k, mode, n_group, topk_group)
    acc = _acc_dtype(logits)
    if logits.numel() == 0:
        return _empty_route(logits, k, acc)
    logits_TE = logits.to(acc)
    probs_TE = _softmax(logits_TE) if mode == "softmax_topk" else None
    score_TE = probs_TE if probs_TE is not None else logits_TE
    if bias is not None:
        score_TE = score_TE + bias.to(acc)
    if n_group > 1:
        score_TE = _limit_groups(score_TE, n_group, topk_group)
    ids_TK = torch.sort(-score_TE, dim=-1, stable=True).indices[:, :k]  # value desc, then lower id
    if mode == "sigmoid":
        gate_TK = torch.sigmoid(logits_TE.gather(1, ids_TK))
    elif mode == "softmax_topk":
        gate_TK = probs_TE.gather(1, ids_TK)
    else:
        gate_TK = _softmax(logits_TE.gather(1, ids_TK))
    if renormalize and mode != "topk_softmax":
        gate_TK = gate_TK / gate_TK.sum(-1, keepdim=True)
    ids32_TK = ids_TK.to(torch.int32)
    counts_E = torch.bincount(ids32_TK.view(-1), minlength=logits.shape[1]).to(torch.int32)
    return ids32_TK, gate_TK * scale, counts_E, torch.logsumexp(logits_TE, dim=-1)


def _empty_route(logits: Tensor, k: int, acc: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    T, E = logits.shape
    return (logits.new_empty(T, k, dtype=torch.int32), logits.new_empty(T, k, dtype=acc),
            logits.new_zeros(E, dtype=torch.int32), logits.new_empty(T, dtype=acc))


@route_topk.register_fake
def _(logits, bias, k, mode, scale, renormalize, n_group, topk_group):
    check_route_topk_args(logits, bias, k, mode, n_group, topk_group)
    return _empty_route(logits, k, _acc_dtype(logits))


@_reference_op("marin::route_topk_backward")
def route_topk_backward(grad_weights: Tensor, grad_lse: Tensor, logits: Tensor, expert_ids: Tensor,
                        weights: Tensor, mode: str, scale: float, renormalize: bool) -> Tensor:
    """Gradient of route_topk's (weights, lse) with respect to the logits, exact for each mode.

    With g the weight gradient, w the weights and G the chosen gates before renormalisation, the gradient
    at a gate is ``(scale*g - sum(g*w)) / sum(G)`` when renormalised, else ``scale*g``; it then goes through
    the sigmoid or the softmax. "topk_softmax": ``q * (scale*g - sum(g*w))`` with q the softmax of the chosen.
    """
    if logits.numel() == 0:
        return torch.zeros_like(logits)
    acc = _acc_dtype(logits)
    logits_TE, ids_TK = logits.to(acc), expert_ids.long()
    g_TK, w_TK = grad_weights.to(acc), weights.to(acc)
    gw_T1 = (g_TK * w_TK).sum(-1, keepdim=True)
    probs_TE = _softmax(logits_TE)
    grad_TE = grad_lse.to(acc)[:, None] * probs_TE  # the lse term; the chosen gates' terms are added to it
    if mode == "topk_softmax":
        q_TK = _softmax(logits_TE.gather(1, ids_TK))
        grad_TE.scatter_add_(1, ids_TK, q_TK * (scale * g_TK - gw_T1))  # ids distinct in a row: deterministic
    else:
        gate_TK = torch.sigmoid(logits_TE.gather(1, ids_TK)) if mode == "sigmoid" else probs_TE.gather(1, ids_TK)
        dgate_TK = (scale * g_TK - gw_T1) / gate_TK.sum(-1, keepdim=True) if renormalize else scale * g_TK
        if mode == "sigmoid":
            grad_TE.scatter_add_(1, ids_TK, dgate_TK * gate_TK * (1 - gate_TK))
        else:
            dprobs_TE = torch.zeros_like(logits_TE).scatter_(1, ids_TK, dgate_TK)
            grad_TE += probs_TE * (dprobs_TE - (dprobs_TE * probs_TE).sum(-1, keepdim=True))
    return grad_TE.to(logits.dtype)


@route_topk_backward.register_fake
def _(grad_weights, grad_lse, logits, expert_ids, weights, mode, scale, renormalize):
    return torch.empty_like(logits)


def _route_topk_setup(ctx, inputs, output):
    logits, _, _, mode, scale, renormalize, _, _ = inputs
    expert_ids, weights, _, _ = output
    ctx.save_for_backward(logits, expert_ids, weights)
    ctx.mode, ctx.scale, ctx.renormalize = mode, scale, renormalize


def _route_topk_grad(ctx, _grad_ids, grad_weights, _grad_counts, grad_lse):
    logits, expert_ids, weights = ctx.saved_tensors
    grad_weights = torch.zeros_like(weights) if grad_weights is None else grad_weights
    grad_lse = weights.new_zeros(logits.shape[0]) if grad_lse is None else grad_lse
    grad_logits = route_topk_backward(grad_weights, grad_lse, logits, expert_ids, weights, ctx.mode,
                                      ctx.scale, ctx.renormalize)
    return grad_logits, None, None, None, None, None, None, None


route_topk.register_autograd(_route_topk_grad, setup_context=_route_topk_setup)


# --------------------------------------------------------------------------------------------------- permute
def permute_rows(num_tokens: int, top_k: int, num_experts: int, align: int) -> int:
    """The static row bound R = T*K + E*(align-1): every group padded, nothing dropped, no host sync."""
    return num_tokens * top_k + num_experts * (align - 1)


def check_permute_args(x: Tensor, expert_ids: Tensor, num_experts: int, align: int, capacity: int) -> None:
    """Raises ValueError naming the first argument that breaks the permute contract (shared with kernels)."""
    _check(x.dim() == 2 and x.dtype in _FLOATS, f"x must be a float [T,H] tensor, got {x.dtype} {tuple(x.shape)}")
    _check_ids("expert_ids", expert_ids, x.shape[0])
    _check(num_experts >= 1 and align >= 1 and capacity >= 0,
           f"need num_experts >= 1, align >= 1, capacity >= 0; got {num_experts}, {align}, {capacity}")


def _empty_permute(x: Tensor, expert_ids: Tensor, num_experts: int, align: int):
    T, K = expert_ids.shape
    R = permute_rows(T, K, num_experts, align)
    return (x.new_empty(R, x.shape[1]), expert_ids.new_empty(T, K), expert_ids.new_empty(R),
            expert_ids.new_empty(num_experts + 1))


@_reference_op("marin::permute")
def permute(x: Tensor, expert_ids: Tensor, num_experts: int, align: int,
            capacity: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Groups token copies by expert: a stable counting sort, padded for grouped GEMM (module docstring).

    Args: x [T,H]; expert_ids [T,K] int32 (-1 = dropped). Returns (routed [R,H], row_of [T,K] int32,
    src_of [R] int32, offsets [E+1] int32), R = T*K + E*(align-1).
    """
    check_permute_args(x, expert_ids, num_experts, align, capacity)
    T, K = expert_ids.shape
    E, N, R = num_experts, T * K, permute_rows(T, K, num_experts, align)
    if expert_ids.numel() == 0:
        return (x.new_zeros(R, x.shape[1]), expert_ids.new_empty(T, K), expert_ids.new_full((R,), -1),
                expert_ids.new_zeros(E + 1))
    ids_N = expert_ids.reshape(-1).long()  # N = T*K entries in flat order t*K+k
    lowest, highest = (int(v) for v in torch.aminmax(ids_N))
    _check(-1 <= lowest and highest < E, f"expert_ids must lie in [-1, {E}), got {lowest}..{highest}")
    bucket_N = torch.where(ids_N >= 0, ids_N, E)  # dropped entries sort into a last bucket
    bucket_S, order_S = torch.sort(bucket_N, stable=True)  # S: sorted position; flat order kept within an expert
    sizes_B = torch.bincount(bucket_N, minlength=E + 1)
    kept_E = sizes_B[:E].clamp(max=capacity) if capacity > 0 else sizes_B[:E]  # the first `capacity` stay
    padded_E = (kept_E + align - 1) // align * align
    offsets_E1 = torch.cat([padded_E.new_zeros(1), torch.cumsum(padded_E, 0)])
    rank_S = torch.arange(N, device=x.device) - (torch.cumsum(sizes_B, 0) - sizes_B)[bucket_S]  # within its expert
    keep_S = bucket_S < E
    if capacity > 0:
        keep_S &= rank_S < capacity
    row_S = torch.where(keep_S, offsets_E1[bucket_S] + rank_S, R)  # R: a scratch row for the dropped entries
    src_of_R = torch.full((R + 1,), -1, dtype=torch.long, device=x.device).index_copy_(0, row_S, order_S)[:R]
    row_N = torch.empty_like(row_S).index_copy_(0, order_S, torch.where(keep_S, row_S, -1))
    routed_RH = _gather_rows(x, src_of_R // K)  # floor division keeps -1 at -1
    return routed_RH, row_N.view(T, K).to(torch.int32), src_of_R.to(torch.int32), offsets_E1.to(torch.int32)


@permute.register_fake
def _(x, expert_ids, num_experts, align, capacity):
    check_permute_args(x, expert_ids, num_experts, align, capacity)
    return _empty_permute(x, expert_ids, num_experts, align)


def _permute_setup(ctx, inputs, output):
    _, row_of, src_of, _ = output
    ctx.save_for_backward(row_of, src_of)


def _permute_grad(ctx, grad_routed, _grad_row_of, _grad_src_of, _grad_offsets):
    row_of, src_of = ctx.saved_tensors
    grad_x = None if grad_routed is None else unpermute(grad_routed, row_of, src_of, None)  # adjoint of a copy
    return grad_x, None, None, None, None


permute.register_autograd(_permute_grad, setup_context=_permute_setup)


# ------------------------------------------------------------------------------------------------- unpermute
def check_unpermute_args(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> None:
    """Raises ValueError naming the first argument that breaks the unpermute contract (shared with kernels)."""
    _check(routed.dim() == 2 and routed.dtype in _FLOATS, f"routed must be a float [R,H] tensor, got {routed.dtype}")
    _check_ids("row_of", row_of, row_of.shape[0] if row_of.dim() == 2 else -1)
    _check(src_of.shape == (routed.shape[0],) and src_of.dtype == torch.int32,
           f"src_of must be int32 [R={routed.shape[0]}], got {src_of.dtype} {tuple(src_of.shape)}")
    if weights is not None:
        _check(weights.shape == row_of.shape and weights.dtype in (torch.float32, torch.float64),
               f"weights must be fp32 {tuple(row_of.shape)}, got {weights.dtype} {tuple(weights.shape)}")


@_reference_op("marin::unpermute")
def unpermute(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> Tensor:
    """Pulls each token's kept rows back and sums them, weighted, in k order (deterministic, no scatter).

    Args: routed [R,H]; row_of [T,K] int32 (-1 = dropped); src_of [R] int32; weights [T,K] or None (= 1).
    Returns: out [T,H] in routed's dtype.
    """
    check_unpermute_args(routed, row_of, src_of, weights)
    T, K = row_of.shape
    if row_of.numel() == 0:
        return routed.new_zeros(T, routed.shape[1])
    acc = _acc_dtype(routed, weights)
    out_TH = torch.zeros(T, routed.shape[1], dtype=acc, device=routed.device)
    weights_TK = None if weights is None else torch.where(row_of >= 0, weights, 0).to(acc)
    for k in range(K):  # k order fixes the summation order; one [T,H] gather at a time stays in cache
        pulled_TH = _gather_rows(routed, row_of[:, k])
        if weights_TK is None:
            out_TH.add_(pulled_TH)
        else:  # the product rounded, then the sum, as the CUDA kernel does (addcmul_ fuses them on AVX2 CPUs)
            out_TH.add_(pulled_TH.to(acc).mul_(weights_TK[:, k, None]))  # a fresh gather: scaled in place
    return out_TH.to(routed.dtype)


@unpermute.register_fake
def _(routed, row_of, src_of, weights):
    check_unpermute_args(routed, row_of, src_of, weights)
    return routed.new_empty(row_of.shape[0], routed.shape[1])


@_reference_op("marin::unpermute_backward")
def unpermute_backward(grad_out: Tensor, routed: Tensor, row_of: Tensor, src_of: Tensor,
                       weights: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Gradients of unpermute: grad_routed[r] = w[src] * grad_out[src // K] (0 where src_of[r] = -1) and
    grad_weights[t,k] = <grad_out[t], routed[row_of[t,k]]> in S (0 for dropped; all 0 without weights)."""
    check_unpermute_args(routed, row_of, src_of, weights)
    T, K = row_of.shape
    acc = _acc_dtype(routed, weights)
    grad_weights_TK = row_of.new_zeros(T, K, dtype=torch.float32 if weights is None else weights.dtype)
    if row_of.numel() == 0:
        return torch.zeros_like(routed), grad_weights_TK
    grad_RH = _gather_rows(grad_out, src_of // K)  # padding rows (src -1) stay zero
    if weights is not None:
        grad_RH = grad_RH.to(acc)
        # Row r of grad_RH is grad_out[t] for the copy (t,k) in row r, so the row-wise dots with routed are the
        # weight gradients in row order, and routed is not gathered a second time (the op's CPU time at the
        # sizes of benchmarks/bench_moe_cpu.py: -23% tiny, -15% mid).
        # (1-D gathers: index_select of [N,1] columns is 2x slower on CPU.)
        dots_R = (grad_RH * routed.to(acc)).sum(-1)
        grad_weights_TK = _gather_rows(dots_R, row_of.reshape(-1)).view(T, K).to(weights.dtype)
        grad_RH.mul_(_gather_rows(weights.reshape(-1), src_of).to(acc)[:, None])  # in S, rounded once
    return grad_RH.to(routed.dtype), grad_weights_TK


@unpermute_backward.register_fake
def _(grad_out, routed, row_of, src_of, weights):
    check_unpermute_args(routed, row_of, src_of, weights)
    dtype = torch.float32 if weights is None else weights.dtype
    return torch.empty_like(routed), routed.new_empty(row_of.shape, dtype=dtype)


def _unpermute_setup(ctx, inputs, output):
    routed, row_of, src_of, weights = inputs
    ctx.save_for_backward(routed, row_of, src_of, weights)


def _unpermute_grad(ctx, grad_out):
    routed, row_of, src_of, weights = ctx.saved_tensors
    grad_routed, grad_weights = unpermute_backward(grad_out, routed, row_of, src_of, weights)
    return grad_routed, None, None, (grad_weights if weights is not None else None)


unpermute.register_autograd(_unpermute_grad, setup_context=_unpermute_setup)

# The CUDA kernels of cuda/ (issue 7) take over the "cuda" dispatch key when their module exists.
try:
    import marin_model.kernels as _kernels
except ModuleNotFoundError as error:
    if error.name != "marin_model.kernels":
        raise
else:
    _kernels.register_cuda_kernels()
