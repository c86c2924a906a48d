"""The MoE layer's custom ops (``torch.library``, namespace ``marin``), one module per op.

Each op's body is its CPU reference (vectorised torch, deterministic), registered for "cpu" and "cuda", with
a fake (meta) implementation for ``torch.compile`` and an autograd formula that calls the op's backward op,
so a CUDA implementation of the family takes the backward pass too. ``marin_model.cuda.dispatch`` replaces
the "cuda" implementations with the kernels of ``cuda/`` where they can run. The contract: ``contract.py``.
"""

from marin_model.ops.contract import ROUTING_MODES, permute_rows
from marin_model.ops.permute_op import permute
from marin_model.ops.route_topk_op import route_topk, route_topk_backward
from marin_model.ops.unpermute_op import unpermute, unpermute_backward

__all__ = ["ROUTING_MODES", "permute", "permute_rows", "route_topk", "route_topk_backward", "unpermute",
           "unpermute_backward"]
