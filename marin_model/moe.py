"""The mixture-of-experts block: router -> route_topk -> permute -> experts (grouped) -> unpermute.

With expert parallelism (`GroupedExperts.shard`, the weights split by expert over an EP process group) the
experts step becomes a dispatch: the routed rows go with ``all_to_all_single`` to the ranks owning their
experts, are regrouped by local expert (``marin::permute`` again), run, regrouped back (``marin::unpermute``)
and returned the same way. Gradients flow back through both exchanges (the all-to-all's autograd).

Shape suffixes:
    T  tokens (batch x sequence, flattened)     D  d_model
    L  width the routed experts act in: the latent width, or D without a latent projection
    E  routed experts      K  experts per token (top-k)      F  hidden width of a routed expert
    R  routed rows, the static bound T*K + E*(align-1) of ``permute`` (groups padded; rows past the last
       group, offsets_E1[E], are unused: never written or read)
    E1 E+1 group offsets
    P  EP ranks      X  experts of this EP rank (E/P)      N  rows this rank's experts receive from all ranks

Balancing: experts are chosen on ``logits + bias_E``; the bias has no gradient and is moved between optimizer
steps by ``MoE.update_bias`` through the layer's balancer (``marin_model/balance.py``).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from marin_model import ops
from marin_model.balance import make_balancer
from marin_model.config import ModelConfig, MoEConfig
from marin_model.cuda.dispatch import register_cuda_kernels

__all__ = ["MoE", "GroupedExperts", "Router", "SwiGLU", "Routing", "PermuteMeta", "RouterStats", "route",
           "permute_tokens", "unpermute_tokens", "swiglu_expert", "dispatch_experts"]

register_cuda_kernels()  # CUDA tensors take the kernels of cuda/ where they can run (a no-op elsewhere)


class Routing(NamedTuple):
    expert_ids_TK: Tensor   # int32, best first
    weights_TK: Tensor      # fp32 combine weights
    counts_E: Tensor        # int32 token copies the router sent to each expert (before any dropping)
    lse_T: Tensor           # fp32 logsumexp of each token's logits, for the z-loss


@dataclass(frozen=True)
class PermuteMeta:
    """What ``unpermute`` needs to bring the routed rows back."""

    row_of_TK: Tensor       # int32 row of each token copy in the routed rows, -1 if dropped
    src_of_R: Tensor        # int32 flat source t*K+k of each routed row, -1 for padding, -2 if unused
    offsets_E1: Tensor      # int32 start row of each expert's group; offsets_E1[E] = rows in use


class RouterStats(NamedTuple):
    z_loss: Tensor          # scalar: mean over tokens of logsumexp(logits)**2 (times no coefficient)
    counts_E: Tensor        # int32 token copies routed to each expert in this forward
    dropped: Tensor         # scalar: fraction of token copies dropped by the capacity limit


def route(logits_TE: Tensor, bias_E: Optional[Tensor], cfg: MoEConfig) -> Routing:
    """Chooses cfg.top_k experts per token: ``marin::route_topk``."""
    return Routing(*ops.route_topk(logits_TE, bias_E, cfg.top_k, cfg.routing, cfg.route_scale, cfg.renormalize,
                                   cfg.n_group, cfg.topk_group))


def permute_tokens(x_TL: Tensor, expert_ids_TK: Tensor, num_experts: int, align: int,
                   capacity: int) -> tuple[Tensor, PermuteMeta]:
    """Copies each token once per chosen expert into rows grouped by expert: ``marin::permute``."""
    routed_RL, row_of_TK, src_of_R, offsets_E1 = ops.permute(x_TL, expert_ids_TK, num_experts, align, capacity)
    return routed_RL, PermuteMeta(row_of_TK, src_of_R, offsets_E1)


def unpermute_tokens(y_RL: Tensor, meta: PermuteMeta, weights_TK: Optional[Tensor]) -> Tensor:
    """Sums each token's expert outputs with its combine weights (unweighted if None): ``marin::unpermute``."""
    return ops.unpermute(y_RL, meta.row_of_TK, meta.src_of_R, weights_TK)


def swiglu_expert(x_NL: Tensor, w13_L2F: Tensor, w2_FL: Tensor) -> Tensor:
    """One expert's SwiGLU on its rows (gate and up projections fused in w13)."""
    gate_NF, up_NF = (x_NL @ w13_L2F).chunk(2, dim=-1)
    return (F.silu(gate_NF) * up_NF) @ w2_FL


class Router(nn.Linear):
    """The router's logits [T,E], in fp32 (fp64 for gradcheck) whatever autocast or a mixed-precision policy
    does to the rest: top-k selection between near-tied experts needs the precision. Under FSDP it is its own
    unit with an fp32 policy, so its weights are gathered in fp32 too."""

    def __init__(self, dim: int, num_experts: int):
        super().__init__(dim, num_experts, bias=False)

    def forward(self, x_TD: Tensor) -> Tensor:
        fp32 = torch.promote_types(x_TD.dtype, torch.float32)
        with torch.autocast(x_TD.device.type, enabled=False):
            return F.linear(x_TD.to(fp32), self.weight.to(fp32))


def _recomputing() -> bool:
    """Whether this forward runs inside a backward pass: activation checkpointing recomputing the block, whose
    load the first forward already counted. (A compiled block recomputes inside its graph, without side
    effects.)"""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


class SwiGLU(nn.Module):
    """The dense SwiGLU MLP: the shared experts (several shared experts are one wider SwiGLU)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


def _grouped_mm_ok(x_RL: Tensor, hidden: int) -> bool:
    """Whether ``torch._grouped_mm`` can run the experts: present, 16-byte-aligned strides, and the dtype works
    on this device (probed once eagerly; under torch.compile only bf16 has a meta kernel, and an
    eager probe that already failed is believed). Otherwise the experts run as a loop, which needs one host
    sync and so breaks a fullgraph compile: compile the block in bf16."""
    if not hasattr(torch, "_grouped_mm") or any(d * x_RL.element_size() % 16 for d in (x_RL.shape[1], hidden)):
        return False
    if torch.compiler.is_compiling():
        return x_RL.dtype == torch.bfloat16 and _PROBED.get((x_RL.dtype, x_RL.device.type), True)
    return _probe_grouped_mm(x_RL.dtype, x_RL.device.type)


_PROBED: dict[tuple[torch.dtype, str], bool] = {}


def _probe_grouped_mm(dtype: torch.dtype, device_type: str) -> bool:
    if (dtype, device_type) not in _PROBED:
        try:
            a_MK = torch.ones(16, 8, dtype=dtype, device=device_type)
            b_EKN = torch.ones(2, 8, 8, dtype=dtype, device=device_type)
            out = torch._grouped_mm(a_MK, b_EKN, offs=torch.tensor([8, 16], dtype=torch.int32, device=device_type))
            _PROBED[dtype, device_type] = bool((out == 8).all())
        except (RuntimeError, NotImplementedError, ValueError):  # ValueError: torch's TORCH_CHECK_VALUE
            _PROBED[dtype, device_type] = False
    return _PROBED[dtype, device_type]


class GroupedExperts(nn.Module):
    """E SwiGLU experts run as grouped GEMMs over the permuted rows, or a loop over the experts.

    `shard` splits them by expert over an EP process group; ``forward`` then runs this rank's E/P experts.
    """

    def __init__(self, num_experts: int, dim: int, hidden: int, init_std: float = 0.02):
        super().__init__()
        self.w13_EL2F = nn.Parameter(torch.randn(num_experts, dim, 2 * hidden) * init_std)
        self.w2_EFL = nn.Parameter(torch.randn(num_experts, hidden, dim) * init_std)
        self.ep_group: Optional[dist.ProcessGroup] = None  # set by `shard`

    def shard(self, ep_mesh: DeviceMesh) -> None:
        """Keep only experts [r*E/P, (r+1)*E/P) on EP rank r of ``ep_mesh``. The weights become DTensors of their
        global shape, so a checkpoint stores them whole and can be loaded at another EP degree."""
        E, P = self.w13_EL2F.shape[0], ep_mesh.size()
        if E % P:
            raise ValueError(f"{E} routed experts do not split over {P} expert-parallel ranks")
        for name in ("w13_EL2F", "w2_EFL"):
            setattr(self, name, nn.Parameter(distribute_tensor(getattr(self, name).detach(), ep_mesh, [Shard(0)])))
        self.ep_group = ep_mesh.get_group()

    def forward(self, x_RL: Tensor, offsets_E1: Tensor) -> Tensor:
        w13_EL2F, w2_EFL = (w.to_local() if isinstance(w, DTensor) else w for w in (self.w13_EL2F, self.w2_EFL))
        if _grouped_mm_ok(x_RL, w2_EFL.shape[1]):
            # The groups end at offsets_E1[E]: the unused rows past it are not read, and their outputs (and
            # their input gradients) are left uninitialised; unpermute reads only the rows row_of names.
            ends_E = offsets_E1[1:]
            # torch._grouped_mm is on no autocast list: cast the weights as autocast would (gradients stay fp32).
            w13_EL2F, w2_EFL = w13_EL2F.to(x_RL.dtype), w2_EFL.to(x_RL.dtype)
            gate_RF, up_RF = torch._grouped_mm(x_RL, w13_EL2F, offs=ends_E).chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(gate_RF) * up_RF, w2_EFL, offs=ends_E)
        bounds = offsets_E1.tolist()  # one host sync; the loop needs the group sizes
        # Empty groups run too (on zero rows): every expert stays in the graph, so every rank has a gradient
        # for every weight, which the sharded gradient reduction needs.
        pieces = [swiglu_expert(x_RL[a:b], w13_EL2F[e], w2_EFL[e]) for e, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        return torch.cat(pieces + [x_RL.new_zeros(x_RL.shape[0] - bounds[-1], x_RL.shape[1])])


def dispatch_experts(experts: GroupedExperts, routed_RL: Tensor, offsets_E1: Tensor, align: int) -> Tensor:
    """The experts step: this rank's rows grouped by expert -> the experts' outputs in the same rows.

    Under expert parallelism (module docstring): exchange the per-expert row counts, send the rows to the
    ranks owning their experts, regroup the received rows by local expert, run them, and send them back.
    """
    group = experts.ep_group
    if group is None or dist.get_world_size(group) == 1:
        return experts(routed_RL, offsets_E1)
    P, (R, L) = dist.get_world_size(group), routed_RL.shape
    X = (offsets_E1.numel() - 1) // P
    sent_E = offsets_E1.diff()  # rows for each expert (alignment padding included)
    received_PX = torch.empty_like(sent_E).view(P, X)  # rows each rank sends to each of my experts
    dist.all_to_all_single(received_PX, sent_E, group=group)
    send_P, receive_P = sent_E.view(P, X).sum(1).tolist(), received_PX.sum(1).tolist()  # one host sync
    rows_NL = all_to_all_single_autograd(routed_RL[:sum(send_P)], receive_P, send_P, group)  # by source, expert
    local_X = torch.arange(X, dtype=torch.int32, device=routed_RL.device).repeat(P)
    expert_N1 = local_X.repeat_interleave(received_PX.flatten().long())[:, None]  # [N,1]: one expert per row
    local_RL, local = permute_tokens(rows_NL, expert_N1, X, align, 0)
    y_NL = unpermute_tokens(experts(local_RL, local.offsets_E1), local, None)
    back_RL = all_to_all_single_autograd(y_NL, send_P, receive_P, group)
    return torch.cat([back_RL, back_RL.new_zeros(R - sum(send_P), L)])  # [R,L]: the unused rows as zeros


class MoE(nn.Module):
    """Router, top-k routing with a selection-only bias, latent routed experts plus shared experts."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m, D = cfg.moe, cfg.d_model
        self.cfg = m
        width = m.latent_dim or D
        self.router = Router(D, m.num_experts)
        self.down = nn.Linear(D, width, bias=False) if m.latent_dim else nn.Identity()
        self.up = nn.Linear(width, D, bias=False) if m.latent_dim else nn.Identity()
        self.experts = GroupedExperts(m.num_experts, width, m.expert_dim, cfg.init_std)
        self.shared = SwiGLU(D, m.num_shared * m.shared_dim) if m.num_shared else None
        # The selection bias (fp32, kept fp32 by _apply; checkpointed) and the rule that moves it.
        self.register_buffer("bias_E", torch.zeros(m.num_experts))
        self.balancer = make_balancer(m.bias_update, m.num_experts, m.top_k, rate=m.bias_rate, bins=m.hist_bins,
                                      limit=m.hist_range)

    def forward(self, x_TD: Tensor) -> tuple[Tensor, RouterStats]:
        m, T = self.cfg, x_TD.shape[0]
        logits_TE = self.router(x_TD)
        routing = route(logits_TE, self.bias_E, m)
        # Dropping over capacity is a training-time bound on an expert's work; evaluated (eval mode), every token
        # reaches its experts, so a token's output does not depend on the others in the batch.
        dropping = m.capacity_factor > 0 and self.training
        capacity = math.ceil(m.capacity_factor * T * m.top_k / m.num_experts) if dropping else 0
        routed_RL, meta = permute_tokens(self.down(x_TD), routing.expert_ids_TK, m.num_experts, m.align, capacity)
        y_RL = dispatch_experts(self.experts, routed_RL, meta.offsets_E1, m.align)
        out_TD = self.up(unpermute_tokens(y_RL, meta, routing.weights_TK))
        if self.shared is not None:
            out_TD = out_TD + self.shared(x_TD)
        if self.training and not _recomputing():
            self.balancer.observe(logits_TE.detach() + self.bias_E, routing.counts_E)
        stats = RouterStats(z_loss=routing.lse_T.pow(2).sum() / max(T, 1), counts_E=routing.counts_E,
                            dropped=(meta.row_of_TK < 0).sum() / max(meta.row_of_TK.numel(), 1))
        return out_TD, stats

    def update_bias(self) -> None:
        """Moves the selection bias toward balance from the global load counted since the last call. Call it
        between optimizer steps on every rank (it all-reduces when distributed)."""
        self.balancer.update(self.bias_E)

    def _apply(self, fn, recurse=True):
        """Keeps the balancing bias fp32 (and its exact value) when the module is cast, e.g. to bf16: its
        sign-rule steps (1e-3) are below bf16's resolution."""
        bias_E = self.bias_E
        super()._apply(fn, recurse)
        if self.bias_E.dtype != torch.float32:
            source = self.bias_E if bias_E.device.type == "meta" else bias_E
            self.bias_E = source.to(device=self.bias_E.device, dtype=torch.float32)
        return self
