"""``marin::route_topk``: choose k experts per token and their combine weights, and its backward.

Selection: the k largest of ``s + bias``, s the logit ("sigmoid", "topk_softmax") or the softmax probability
("softmax_topk"); with ``n_group > 1``, among the ``topk_group`` groups whose two largest such scores sum
highest (group-limited routing). The bias is a selection-only balancing term like DeepSeek-V3's, but
DeepSeek-V3 adds it to the sigmoid of the logit (arXiv:2412.19437, section 2.1.2), not to the logit, and its
group scores sum those biased sigmoids: the two choose the same experts only with no bias and no groups.
Gates: "sigmoid" (sigmoid(logit)), "softmax_topk" (the softmax probability), both divided by their sum over
the k chosen when ``renormalize``; "topk_softmax" (the softmax over the k chosen logits); then times
``scale``. ``lse`` (logsumexp of each token's logits) makes the router z-loss differentiable.
"""

from typing import Optional

import torch
from torch import Tensor

from marin_model.ops.contract import acc_dtype, check_route_topk_args, reference_op, softmax

__all__ = ["route_topk", "route_topk_backward"]


def _limit_groups(score_TE: Tensor, n_group: int, topk_group: int) -> Tensor:
    """Group-limited routing: experts outside the topk_group groups with the largest sum of their two best
    selection scores get -inf (the module docstring says how this differs from DeepSeek-V3)."""
    T, E = score_TE.shape
    grouped_TGS = score_TE.view(T, n_group, E // n_group)
    group_score_TG = grouped_TGS.topk(min(2, E // n_group), dim=-1).values.sum(-1)
    best_TG = torch.sort(-group_score_TG, dim=-1, stable=True).indices[:, :topk_group]  # ties: lower group
    keep_TG = torch.zeros(T, n_group, dtype=torch.bool, device=score_TE.device).scatter_(1, best_TG, True)
    return score_TE.masked_fill(~keep_TG.repeat_interleave(E // n_group, dim=1), float("-inf"))


@reference_op("marin::route_topk")
def route_topk(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, scale: float, renormalize: bool,
               n_group: int, topk_group: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Chooses k experts per token and their combine weights (contract in the module docstring).

    Args: logits [T,E]; bias [E] or None (selection only). Returns (expert_ids [T,k] int32, weights [T,k],
    counts [E] int32, lse [T]).
    """
    check_route_topk_args(logits, bias, k, mode, n_group, topk_group)
    acc = acc_dtype(logits)
    if logits.numel() == 0:
        return _empty_route(logits, k, acc)
    logits_TE = logits.to(acc)
    probs_TE = softmax(logits_TE) if mode == "softmax_topk" else None
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
        gate_TK = softmax(logits_TE.gather(1, ids_TK))
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
    return _empty_route(logits, k, acc_dtype(logits))


@reference_op("marin::route_topk_backward")
def route_topk_backward(grad_weights: Tensor, grad_lse: Tensor, logits: Tensor, expert_ids: Tensor,
                        weights: Tensor, mode: str, scale: float, renormalize: bool) -> Tensor:
    """Gradient of route_topk's (weights, lse) with respect to the logits, exact for each mode.

    With g the weight gradient, w the weights and G the chosen gates before renormalisation, the gradient
    at a gate is ``(scale*g - sum(g*w)) / sum(G)`` when renormalised, else ``scale*g``; it then goes through
    the sigmoid or the softmax. "topk_softmax": ``q * (scale*g - sum(g*w))`` with q the softmax of the chosen.
    """
    if logits.numel() == 0:
        return torch.zeros_like(logits)
    acc = acc_dtype(logits)
    logits_TE, ids_TK = logits.to(acc), expert_ids.long()
    g_TK, w_TK = grad_weights.to(acc), weights.to(acc)
    gw_T1 = (g_TK * w_TK).sum(-1, keepdim=True)
    probs_TE = softmax(logits_TE)
    grad_TE = grad_lse.to(acc)[:, None] * probs_TE  # the lse term; the chosen gates' terms are added to it
    if mode == "topk_softmax":
        q_TK = softmax(logits_TE.gather(1, ids_TK))
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
