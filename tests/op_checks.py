"""torch.library.opcheck of the marin:: ops, comparing only what the contract specifies (shared by the GPU and
emulated kernel suites; importable without tests/conftest.py).

opcheck's AOTDispatcher test runs an op eagerly and compiled and compares every output element and the
gradients of a loss summing every output. The rows of routed and grad_routed past offsets[E] (src_of -2) are
unspecified: the kernels leave them unwritten, so on a GPU they hold whatever the allocator's block held, and
eager and compiled runs differ there. So :func:`opcheck_specified` runs opcheck's schema, autograd-registration
and fake-tensor tests on the op itself, and the same AOTDispatcher comparison (the helper opcheck calls) on
the op with those rows read as zero, in its outputs and in the gradients of its inputs.
"""

from __future__ import annotations

import torch
from torch.testing._internal.optests import aot_autograd_check

from marin_model import ops

__all__ = ["NO_AOT", "opcheck_cases", "opcheck_specified"]

NO_AOT = ("test_schema", "test_autograd_registration", "test_faketensor")


def _used(routed_RH: torch.Tensor, src_of_R: torch.Tensor) -> torch.Tensor:
    return routed_RH.masked_fill((src_of_R == -2)[:, None], 0)


def _permute(x, expert_ids, num_experts, align, capacity):
    routed, row_of, src_of, offsets = ops.permute(x, expert_ids, num_experts, align, capacity)
    return _used(routed, src_of), row_of, src_of, offsets


def _unpermute(routed, row_of, src_of, weights):  # zeroing the input zeroes its gradient's unused rows
    return ops.unpermute(_used(routed, src_of), row_of, src_of, weights)


def _unpermute_backward(grad_out, routed, row_of, src_of, weights):
    grad_routed, grad_weights = ops.unpermute_backward(grad_out, routed, row_of, src_of, weights)
    return _used(grad_routed, src_of), grad_weights


def _route_topk(*args):  # floats first: the AOT check sums the outputs, and an integer first one fails it
    ids, weights, counts, lse = ops.route_topk(*args)
    return weights, lse, ids, counts


SPECIFIED = {ops.permute: _permute, ops.unpermute: _unpermute, ops.unpermute_backward: _unpermute_backward,
             ops.route_topk: _route_topk, ops.route_topk_backward: ops.route_topk_backward}


def opcheck_specified(op, args: tuple) -> None:
    """opcheck of ``op`` on ``args``, its eager/compiled comparison restricted to the specified outputs."""
    torch.library.opcheck(op, args, test_utils=NO_AOT)
    specified = SPECIFIED[op]

    def fn(*tensors_and_args):  # opcheck's own wrapper: fresh inputs per call (the check calls it repeatedly)
        return specified(*(a.clone() if isinstance(a, torch.Tensor) else a for a in tensors_and_args))

    aot_autograd_check(fn, args, {}, True, check_gradients="auto")  # dynamic shapes, as opcheck's default


def opcheck_cases(device: str) -> list[tuple]:
    """(op, args) for each of the five ops at a routed size (T = 64, E = 384, align 16: unused rows exist)."""
    g = torch.Generator().manual_seed(23)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(device)  # noqa: E731
    logits = rand(64, 384).requires_grad_()
    ids, weights, _, _ = ops.route_topk(logits.detach(), None, 8, "sigmoid", 2.5, True, 1, 1)
    x = rand(64, 32).requires_grad_()
    routed, row_of, src_of, offsets = ops.permute(x.detach(), ids, 384, 16, 0)
    assert int(offsets[-1]) < routed.shape[0], "the cases must have unused rows"
    return [
        (ops.route_topk, (logits, rand(384), 8, "sigmoid", 2.5, True, 12, 4)),
        (ops.route_topk_backward, (rand(64, 8), rand(64), logits.detach(), ids, weights, "softmax_topk", 1.0,
                                   True)),
        (ops.permute, (x, ids, 384, 16, 0)),
        (ops.unpermute, (routed.clone().requires_grad_(), row_of, src_of, weights.clone().requires_grad_())),
        (ops.unpermute_backward, (rand(64, 32), routed, row_of, src_of, weights)),
    ]
