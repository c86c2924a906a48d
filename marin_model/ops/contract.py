"""The contract every implementation of the MoE ops meets (the CPU reference and the CUDA kernels alike).

``S`` is an op's accumulation dtype: fp32, or fp64 when any input is fp64 (so ``gradcheck`` runs).

* ``route_topk(logits[T,E], bias[E]?, k, mode, scale, renormalize, n_group, topk_group)
  -> (expert_ids[T,k] int32, weights[T,k] S, counts[E] int32, lse[T] S)``: choose on ``s + bias``, s the
  logit or, in mode softmax_topk, the probability (the bias gets no gradient), ties to the lower expert id,
  ids best first; ``n_group > 1`` keeps the ``topk_group`` groups with the largest sum of their top-2
  ``s + bias``. Modes and weights: docs/design.md.
* ``permute(x[T,H], expert_ids[T,K], num_experts, align, capacity) -> (routed[R,H], row_of[T,K],
  src_of[R], offsets[E+1])``, all int32 but routed, ``R = T*K + E*(align-1)``: a stable counting sort by
  expert, -1 ids (and entries ranked >= capacity when capacity > 0) dropped, groups padded to ``align``;
  ``row_of`` is -1 for a dropped entry. Groups end at ``offsets[E]``: padding rows inside a group are zero
  with ``src_of`` -1; the rows in ``[offsets[E], R)`` are *unused*, ``src_of`` -2 and their data
  unspecified (the kernel does not write them), and nothing reads them, forward or backward.
* ``unpermute(routed[R,H], row_of[T,K], src_of[R], weights[T,K]?) -> out[T,H]``: each token's kept rows,
  weighted, summed in k order in S (each product rounded before it is added).

Each backward op has the matching contract (``route_topk_backward``, ``unpermute_backward``; permute's
backward is an unweighted unpermute). ``unpermute_backward`` zeroes grad_routed in the padding rows
(``src_of`` -1) and leaves the unused ones (-2) unspecified. A NaN output is any NaN: its bits are not part
of the contract (a bf16 NaN is 0x7FFF from the GPU, another pattern from torch's CPU conversion).
docs/cuda.md says which outputs an implementation must reproduce bitwise and the tolerance of the others.
Arguments are checked by the ``check_*_args`` below, shared with the CUDA entry points: a ValueError names
the argument.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["ROUTING_MODES", "FLOATS", "acc_dtype", "check", "check_ids", "check_permute_args", "check_route_topk_args",
           "check_unpermute_args", "gather_rows", "permute_rows", "reference_op", "softmax"]

ROUTING_MODES = ("sigmoid", "softmax_topk", "topk_softmax")
FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def acc_dtype(*tensors: Optional[Tensor]) -> torch.dtype:
    """fp64 if any input is fp64 (gradcheck), else fp32: the accumulation dtype ``S`` of the contract."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def gather_rows(table_RH: Tensor, index_N: Tensor) -> Tensor:
    """table[index] (rows of a 2-D table, elements of a 1-D one) with zeros where index is negative. One
    index_select (it takes the int32 row maps as they are), then only those rows are zeroed, so no
    multiply-by-zero can turn a non-finite value in an unrelated row into NaN."""
    rows_NH = table_RH.index_select(0, index_N.clamp(min=0))
    return rows_NH.index_fill_(0, torch.nonzero(index_N < 0).squeeze(1), 0)


def softmax(x_TE: Tensor) -> Tensor:
    """softmax over the last dim. torch's CPU kernel takes a slow path when that dim is narrower than 16 (at
    2048 x 8: 0.30 ms, 5x the padded 0.06 ms; AVX-512, torch 2.13, benchmarks/bench_softmax_cpu.py), so narrow
    rows are padded with -inf, whose exp is exactly 0: the same sum, the same values to rounding."""
    width = x_TE.shape[-1]
    if x_TE.device.type != "cpu" or width >= 16:
        return torch.softmax(x_TE, dim=-1)
    return torch.softmax(F.pad(x_TE, (0, 16 - width), value=float("-inf")), dim=-1)[..., :width]


def check_ids(name: str, ids: Tensor, rows: int) -> None:
    check(ids.dim() == 2 and ids.shape[0] == rows, f"{name} must be [T,K] with T={rows}, got {tuple(ids.shape)}")
    check(ids.dtype == torch.int32, f"{name} must be int32, got {ids.dtype}")


def reference_op(name: str):
    """``torch.library.custom_op`` `name` whose body serves CPU and CUDA tensors (until the CUDA kernels take it).

    The two devices are registered one call each: torch's ``register_kernel`` given several device types binds
    its loop variable late (torch 2.13, ``torch/_library/custom_ops.py``), so every device's dispatch entry
    would call the kernel registered for the *last* one, and the CUDA kernels registered by
    ``marin_model.cuda.dispatch`` would then take CPU tensors too (and refuse them). tests/test_ops.py checks
    that they do not.
    """
    def wrap(body):
        op = torch.library.custom_op(name, body, mutates_args=(), device_types="cpu")
        op.register_kernel("cuda", body)
        return op

    return wrap


def check_route_topk_args(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, n_group: int,
                          topk_group: int) -> None:
    """Raises ValueError naming the first argument that breaks the route_topk contract (shared with kernels)."""
    check(logits.dim() == 2, f"logits must be [T,E], got shape {tuple(logits.shape)}")
    check(logits.dtype in FLOATS, f"logits must be floating point, got {logits.dtype}")
    num_experts = logits.shape[1]
    check(mode in ROUTING_MODES, f"mode must be one of {ROUTING_MODES}, got {mode!r}")
    check(1 <= k <= num_experts, f"k must be in [1, E={num_experts}], got {k}")
    if bias is not None:
        check(bias.shape == (num_experts,), f"bias must be [E={num_experts}], got {tuple(bias.shape)}")
        check(bias.dtype in (torch.float32, torch.float64), f"bias must be fp32, got {bias.dtype}")
    if n_group > 1:
        check(num_experts % n_group == 0, f"E={num_experts} is not divisible by n_group={n_group}")
        check(1 <= topk_group <= n_group and topk_group * (num_experts // n_group) >= k,
               f"topk_group={topk_group} groups of {num_experts // n_group} experts cannot hold k={k}")


def permute_rows(num_tokens: int, top_k: int, num_experts: int, align: int) -> int:
    """The static row bound R = T*K + E*(align-1): every group padded, nothing dropped, no host sync."""
    return num_tokens * top_k + num_experts * (align - 1)


def check_permute_args(x: Tensor, expert_ids: Tensor, num_experts: int, align: int, capacity: int) -> None:
    """Raises ValueError naming the first argument that breaks the permute contract (shared with kernels)."""
    check(x.dim() == 2 and x.dtype in FLOATS, f"x must be a float [T,H] tensor, got {x.dtype} {tuple(x.shape)}")
    check_ids("expert_ids", expert_ids, x.shape[0])
    check(num_experts >= 1 and align >= 1 and capacity >= 0,
           f"need num_experts >= 1, align >= 1, capacity >= 0; got {num_experts}, {align}, {capacity}")


def check_unpermute_args(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> None:
    """Raises ValueError naming the first argument that breaks the unpermute contract (shared with kernels)."""
    check(routed.dim() == 2 and routed.dtype in FLOATS, f"routed must be a float [R,H] tensor, got {routed.dtype}")
    check_ids("row_of", row_of, row_of.shape[0] if row_of.dim() == 2 else -1)
    check(src_of.shape == (routed.shape[0],) and src_of.dtype == torch.int32,
           f"src_of must be int32 [R={routed.shape[0]}], got {src_of.dtype} {tuple(src_of.shape)}")
    if weights is not None:
        check(weights.shape == row_of.shape and weights.dtype in (torch.float32, torch.float64),
               f"weights must be fp32 {tuple(row_of.shape)}, got {weights.dtype} {tuple(weights.shape)}")
