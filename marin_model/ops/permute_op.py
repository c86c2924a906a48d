"""``marin::permute``: copy each token once per chosen expert into rows grouped by expert.

A stable counting sort padded for grouped GEMM; its backward is an unweighted ``unpermute`` (the adjoint of
a copy).
"""

import torch
from torch import Tensor

from marin_model.ops.contract import check, check_permute_args, gather_rows, permute_rows, reference_op
from marin_model.ops.unpermute_op import unpermute

__all__ = ["permute"]


def _empty_permute(x: Tensor, expert_ids: Tensor, num_experts: int, align: int):
    T, K = expert_ids.shape
    R = permute_rows(T, K, num_experts, align)
    return (x.new_empty(R, x.shape[1]), expert_ids.new_empty(T, K), expert_ids.new_empty(R),
            expert_ids.new_empty(num_experts + 1))


@reference_op("marin::permute")
def permute(x: Tensor, expert_ids: Tensor, num_experts: int, align: int,
            capacity: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Groups token copies by expert: a stable counting sort, padded for grouped GEMM (module docstring).

    Args: x [T,H]; expert_ids [T,K] int32 (-1 = dropped). Returns (routed [R,H], row_of [T,K] int32,
    src_of [R] int32, offsets [E+1] int32), R = T*K + E*(align-1). The unused rows past offsets[E] get zeros
    here (any data meets the contract) and src_of -2.
    """
    check_permute_args(x, expert_ids, num_experts, align, capacity)
    T, K = expert_ids.shape
    E, N, R = num_experts, T * K, permute_rows(T, K, num_experts, align)
    if expert_ids.numel() == 0:
        return (x.new_zeros(R, x.shape[1]), expert_ids.new_empty(T, K), expert_ids.new_full((R,), -2),
                expert_ids.new_zeros(E + 1))  # no entries: every row is unused
    ids_N = expert_ids.reshape(-1).long()  # N = T*K entries in flat order t*K+k
    lowest, highest = (int(v) for v in torch.aminmax(ids_N))
    check(-1 <= lowest and highest < E, f"expert_ids must lie in [-1, {E}), got {lowest}..{highest}")
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
    in_groups_R1 = torch.arange(R + 1, device=x.device) < offsets_E1[E]  # no host sync
    src_of_R = torch.where(in_groups_R1, -1, -2).index_copy_(0, row_S, order_S)[:R]  # padding -1, unused -2
    row_N = torch.empty_like(row_S).index_copy_(0, order_S, torch.where(keep_S, row_S, -1))
    routed_RH = gather_rows(x, src_of_R // K)  # floor division keeps -1 and -2 negative
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
