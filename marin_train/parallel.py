"""Sharding the model over the ranks: a device mesh, expert parallelism and FSDP2 (``fully_shard``).

The mesh is ``("dp", "ep")``, shape (world/P, P), P the expert-parallel degree (``TrainConfig.ep``). Rank
``d*P + e`` holds:

* 1/world of every dense parameter (attention, norms, router, shared experts, latent projections, embeddings,
  head): ``fully_shard`` over all ranks, one unit per block plus the embeddings, the head and the router
  (its own unit so that its fp32 policy holds while the rest computes in bf16);
* experts [e*E/P, (e+1)*E/P) of every layer (`GroupedExperts.shard`: a DTensor of the global shape, split by
  expert over the ``ep`` dim), each sharded on its second dim over the ``dp`` dim (the world/P ranks that
  own the same experts; dim 0 where the ``dp`` size does not divide dim 1, see `_expert_placement`).

Gradients: FSDP averages a dense gradient over all ranks, as data parallelism wants. An expert's gradient
already sums the tokens of all P ranks of its EP group (the all-to-all's backward), so averaging it over the
world/P ``dp`` ranks leaves it P times too large: `rescale_expert_grads` divides it by P after the backward
passes of a step. (FSDP's own ``set_gradient_divide_factor`` would fold that into the reduce-scatter, but it
needs ``PREMUL_SUM``, which gloo lacks; one code path on every backend costs one pass over the expert shards.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from marin_model.model import Transformer

__all__ = ["clip_grad_norm", "full_state_dict", "make_mesh", "parallelize", "rescale_expert_grads"]


def make_mesh(ep: int, device_type: str) -> DeviceMesh:
    """The ``("dp", "ep")`` mesh of all ranks (the process group must be joined)."""
    world = dist.get_world_size()
    if ep < 1 or world % ep:
        raise ValueError(f"--ep {ep} does not divide the world size {world}")
    return init_device_mesh(device_type, (world // ep, ep), mesh_dim_names=("dp", "ep"))


def parallelize(model: Transformer, mesh: DeviceMesh, *, bf16: bool) -> Transformer:
    """Shard ``model`` in place as the module docstring says; ``bf16``: gather parameters in bf16 for compute,
    reduce gradients and keep master weights in fp32 (the router stays fp32 throughout)."""
    everyone = mesh._flatten("dp_ep") if mesh.ndim > 1 else mesh
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for block in model.blocks:
        experts = block.moe.experts
        experts.shard(mesh["ep"])
        fully_shard(experts, mesh=mesh["dp"], mp_policy=policy, shard_placement_fn=_expert_placement(mesh["dp"]))
        fully_shard(block.moe.router, mesh=everyone, mp_policy=fp32)
        fully_shard(block, mesh=everyone, mp_policy=policy)
    if not model.cfg.tie_embeddings:  # tied: one matrix, left to the root unit
        fully_shard(model.embed, mesh=everyone, mp_policy=policy)
        fully_shard([model.norm, model.lm_head], mesh=everyone, mp_policy=policy)
    fully_shard(model, mesh=everyone, mp_policy=policy)
    return model


@torch.no_grad()
def rescale_expert_grads(model: Transformer) -> None:
    """Divide the routed experts' gradients by the EP degree (module docstring); call after the backward passes."""
    for block in model.blocks:
        experts = block.moe.experts
        degree = dist.get_world_size(experts.ep_group) if experts.ep_group is not None else 1
        for p in (experts.w13_EL2F, experts.w2_EFL):
            if degree > 1 and p.grad is not None:
                p.grad.div_(degree)


def _expert_placement(dp_mesh: DeviceMesh):
    """Where FSDP splits an expert weight [E/P, a, b] over the ``dp`` ranks: dim 1 when they divide it (dim 0
    is already split by expert, and E/P may be below world/P); else dim 0, the one dim FSDP splits unevenly
    (it pads), e.g. at 704 ranks = EP 64 x 11, where 11 divides no dim of Marin's experts."""
    return lambda p: Shard(1) if p.shape[1] % dp_mesh.size() == 0 else Shard(0)


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float) -> Tensor:
    """The global L2 norm of sharded gradients, scaled down in place to ``max_norm`` when above it (0: never).

    The gradients live on two meshes (dense over all ranks, experts over ``dp`` x ``ep``), where torch's
    ``clip_grad_norm_`` wants one. Every placement here is a ``Shard``, so the ranks' local pieces partition
    each gradient: the squared norm is the sum over ranks of the local squared sums, one all-reduce.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    local = []
    for g in grads:
        if isinstance(g, DTensor):
            if not all(p.is_shard() for p in g.placements):
                raise ValueError(f"clip_grad_norm needs sharded gradients, got placements {g.placements}")
            g = g.to_local()
        local.append(g)
    squares = torch.stack([g.detach().float().square().sum() for g in local]).sum() if local else torch.zeros(())
    dist.all_reduce(squares)
    norm = squares.sqrt()
    if max_norm > 0 and local:
        torch._foreach_mul_(local, (max_norm / (norm + 1e-6)).clamp(max=1.0).to(local[0].dtype))
    return norm


def full_state_dict(model: Transformer) -> dict[str, Tensor]:
    """The sharded model's state as whole tensors on the CPU, on every rank (a collective: all ranks call it)."""
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {name: t.cpu() for name, t in whole.items()}
