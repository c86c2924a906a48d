"""``marin::unpermute``: bring the routed rows back to their tokens, weighted, and its backward.

Pull-based (each token gathers its k rows) and summed in k order, so the result is deterministic without
``scatter_add``.
"""

from typing import Optional

import torch
from torch import Tensor

from marin_model.ops.contract import acc_dtype, check_unpermute_args, gather_rows, reference_op

__all__ = ["unpermute", "unpermute_backward"]


@reference_op("marin::unpermute")
def unpermute(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> Tensor:
    """Pulls each token's kept rows back and sums them, weighted, in k order (deterministic, no scatter).

    Args: routed [R,H]; row_of [T,K] int32 (-1 = dropped); src_of [R] int32; weights [T,K] or None (= 1).
    Returns: out [T,H] in routed's dtype.
    """
    check_unpermute_args(routed, row_of, src_of, weights)
    T, K = row_of.shape
    if row_of.numel() == 0:
        return routed.new_zeros(T, routed.shape[1])
    acc = acc_dtype(routed, weights)
    out_TH = torch.zeros(T, routed.shape[1], dtype=acc, device=routed.device)
    weights_TK = None if weights is None else torch.where(row_of >= 0, weights, 0).to(acc)
    for k in range(K):  # k order fixes the summation order; one [T,H] gather at a time stays in cache
        pulled_TH = gather_rows(routed, row_of[:, k])
        if weights_TK is None:
            out_TH.add_(pulled_TH)
        else:  # the product rounded, then the sum, as the CUDA kernel does (addcmul_ fuses them on AVX2 CPUs)
            out_TH.add_(pulled_TH.to(acc).mul_(weights_TK[:, k, None]))  # a fresh gather: scaled in place
    return out_TH.to(routed.dtype)


@unpermute.register_fake
def _(routed, row_of, src_of, weights):
    check_unpermute_args(routed, row_of, src_of, weights)
    return routed.new_empty(row_of.shape[0], routed.shape[1])


@reference_op("marin::unpermute_backward")
def unpermute_backward(grad_out: Tensor, routed: Tensor, row_of: Tensor, src_of: Tensor,
                       weights: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """Gradients of unpermute: grad_routed[r] = w[src] * grad_out[src // K] (0 where src_of[r] = -1; the
    unused rows, src_of -2, get 0 here and are unspecified by the contract) and
    grad_weights[t,k] = <grad_out[t], routed[row_of[t,k]]> in S (0 for dropped; all 0 without weights)."""
    check_unpermute_args(routed, row_of, src_of, weights)
    T, K = row_of.shape
    acc = acc_dtype(routed, weights)
    grad_weights_TK = row_of.new_zeros(T, K, dtype=torch.float32 if weights is None else weights.dtype)
    if row_of.numel() == 0:
        return torch.zeros_like(routed), grad_weights_TK
    grad_RH = gather_rows(grad_out, src_of // K)  # padding and unused rows (src -1, -2) stay zero
    if weights is not None:
        grad_RH = grad_RH.to(acc)
        # Row r of grad_RH is grad_out[t] for the copy (t,k) in row r, so the row-wise dots with routed are the
        # weight gradients in row order, and routed is not gathered a second time (the op's CPU time at the
        # sizes of benchmarks/bench_moe_cpu.py: -23% tiny, -15% mid).
        # (1-D gathers: index_select of [N,1] columns is 2x slower on CPU.)
        dots_R = (grad_RH * routed.to(acc)).sum(-1)
        grad_weights_TK = gather_rows(dots_R, row_of.reshape(-1)).view(T, K).to(weights.dtype)
        grad_RH.mul_(gather_rows(weights.reshape(-1), src_of).to(acc)[:, None])  # in S, rounded once
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
