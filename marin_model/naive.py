"""The MoE block written the obvious way: plain torch routing and a per-expert loop (no custom ops).

It uses an ``MoE`` module's parameters and must give the same output, so tests check the op chain against it
and ``benchmarks/bench_moe_cpu.py`` times them side by side. Two loops: by default each expert gathers the
tokens routed to it and ``index_add``s its weighted output back (Mixtral's reference code); ``dense_mask``
runs each expert on every token and multiplies its output by a dense [T,E] gate that is zero where the token
is not routed to that expert (the formulation of simple MoE reference code, "naive per-expert
masking": E/k times the expert FLOPs, but no data-dependent shapes). Group-limited routing (n_group > 1) is not
covered here; the ops tests check it against their own reference.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from marin_model.moe import MoE, swiglu_expert

__all__ = ["naive_moe_forward"]


def naive_moe_forward(moe: MoE, x_TD: Tensor, index_stacked: bool = False,
                      dense_mask: bool = False) -> tuple[Tensor, Tensor]:
    """Returns (out [T,D], z-loss) of `moe` on x [T,D], computed expert by expert.

    index_stacked: take each expert's weights by indexing the stacked [E,...] tensors inside the loop, as code
    written against stacked expert weights does; then every expert's backward writes a zero-filled gradient the
    size of all the experts (E times the weights' size per step). By default the loop uses one view per expert,
    as a ModuleList of experts would, which avoids that cost.
    dense_mask: run every expert on all T tokens and weight its output by the token's gate for that expert
    (zero if not routed there, or dropped by the capacity limit) instead of gathering the routed tokens."""
    m, (T, _) = moe.cfg, x_TD.shape
    if m.n_group > 1:
        raise ValueError("naive_moe_forward does not implement group-limited routing (n_group > 1)")
    logits_TE = moe.router(x_TD)
    probs_TE = torch.softmax(logits_TE, dim=-1) if m.routing == "softmax_topk" else None
    score_TE = (probs_TE if probs_TE is not None else logits_TE) + moe.bias_E
    expert_ids_TK = torch.sort(-score_TE, dim=-1, stable=True).indices[:, :m.top_k]  # ties: lower id first
    if m.routing == "topk_softmax":
        weights_TK = torch.softmax(logits_TE.gather(1, expert_ids_TK), dim=-1)
    else:
        gate_TE = torch.sigmoid(logits_TE) if m.routing == "sigmoid" else probs_TE
        weights_TK = gate_TE.gather(1, expert_ids_TK)
        if m.renormalize:
            weights_TK = weights_TK / weights_TK.sum(-1, keepdim=True)
    weights_TK = weights_TK * m.route_scale
    capacity = math.ceil(m.capacity_factor * T * m.top_k / m.num_experts) if m.capacity_factor > 0 else T * m.top_k
    latent_TL = moe.down(x_TD)
    y_TL = torch.zeros(latent_TL.shape, dtype=torch.promote_types(latent_TL.dtype, torch.float32))
    w13_EL2F, w2_EFL = moe.experts.w13_EL2F, moe.experts.w2_EFL
    w13_L2F, w2_FL = (w13_EL2F, w2_EFL) if index_stacked else (w13_EL2F.unbind(0), w2_EFL.unbind(0))
    if dense_mask:
        chosen_NE = F.one_hot(expert_ids_TK.reshape(-1), m.num_experts)  # N = T*K copies in flat order t*K+k
        kept_NE = chosen_NE * (chosen_NE.cumsum(0) <= capacity)  # the first `capacity` copies stay
        combine_TE = (kept_NE.view(T, m.top_k, -1) * weights_TK[..., None]).sum(1)  # zero where not routed
        for e in range(m.num_experts):
            y_TL = y_TL + combine_TE[:, e, None] * swiglu_expert(latent_TL, w13_L2F[e], w2_FL[e])
    else:
        for e in range(m.num_experts):
            token_N, slot_N = torch.nonzero(expert_ids_TK == e, as_tuple=True)  # in flat order t*K+k
            token_N, slot_N = token_N[:capacity], slot_N[:capacity]  # the first `capacity` copies stay
            if token_N.numel():
                out_NL = swiglu_expert(latent_TL[token_N], w13_L2F[e], w2_FL[e])
                y_TL = y_TL.index_add(0, token_N, weights_TK[token_N, slot_N, None] * out_NL)
    out_TD = moe.up(y_TL.to(x_TD.dtype))
    if moe.shared is not None:
        out_TD = out_TD + moe.shared(x_TD)
    return out_TD, torch.logsumexp(logits_TE, dim=-1).pow(2).mean()
