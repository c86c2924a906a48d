"""Serve the ``marin::`` ops on CUDA tensors with the kernels of ``cuda/``.

The entry points below check every argument (with the ops' own checks), allocate the outputs with torch (so
the caching allocator and CUDA graphs see them) and pass raw pointers and torch's current stream to the
launchers. :func:`register_cuda_kernels` installs them as the "cuda" implementation of the ops; it is a
silent no-op (False, :func:`status` says why) when torch sees no GPU or the library cannot be built or
loaded. ``MARIN_CUDA_KERNELS=off`` skips it, ``=require`` turns a failure into an exception.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import Tensor

from marin_model import ops
from marin_model.cuda.build import KernelBuildError
from marin_model.cuda import library
from marin_model.cuda.library import STATUS, load_library, open_library
from marin_model.ops.contract import check_permute_args, check_route_topk_args, check_unpermute_args, permute_rows

__all__ = ["register_cuda_kernels", "status", "route_topk", "route_topk_backward", "permute", "unpermute",
           "unpermute_backward"]

MAX_EXPERTS = 512  # marin::kMaxExperts
MAX_TOP_K = 16  # marin::kMaxTopK
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_MODES = {"sigmoid": 0, "softmax_topk": 1, "topk_softmax": 2}


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


_SERVED = {"device": "cuda"}  # the device type the entry points take: "cpu" inside host_library()


@contextlib.contextmanager
def host_library(path: Path) -> Iterator:
    """Serves this module's entry points from a host build of cuda/ (tests/cuda_emu compiles the kernels'
    own source with g++ under a CUDA emulation) on CPU tensors: the kernels and these wrappers, tested
    without a GPU. The ops' dispatch is untouched: call the entry points of this module. Yields the library."""
    saved = library._lib  # noqa: SLF001 - the one loaded library, swapped for the duration
    lib = open_library(path)
    library._lib, _SERVED["device"] = lib, "cpu"  # noqa: SLF001
    try:
        yield lib
    finally:
        library._lib, _SERVED["device"] = saved, "cuda"  # noqa: SLF001


def _launch(name: str, device: torch.device, *args) -> None:
    """Calls launcher `name` on `device`'s current stream (so CUDA graphs capture it); raises on error."""
    _check(device.type == _SERVED["device"], f"the CUDA kernels need {_SERVED['device'].upper()} tensors, got {device}")
    if device.type == "cpu":  # the host build: launches run before the call returns, no stream
        _call(name, *args, None)
        return
    with torch.cuda.device(device):
        _call(name, *args, torch.cuda.current_stream(device).cuda_stream)


def _call(name: str, *args) -> None:
    lib = load_library()
    fn = getattr(lib, name)
    if len(args) != len(fn.argtypes):  # ctypes itself accepts extra arguments
        raise TypeError(f"{name} takes {len(fn.argtypes)} arguments, got {len(args)}")
    err = fn(*args)
    if err != 0:
        raise RuntimeError(f"{name} failed: CUDA error {err} ({lib.marin_cuda_error_string(err).decode()})")


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _on_device(device: torch.device, **tensors: Optional[Tensor]) -> None:
    for name, t in tensors.items():
        _check(t is None or t.device == device, f"{name} is on {t.device if t is not None else ''}, expected {device}")


def _reference(name: str, *args):
    """The op's reference body on CUDA tensors, for inputs the kernels do not take (fp64 for gradcheck,
    E > 512, k > 16): slower, never wrong."""
    op = getattr(ops, name)
    with op.set_kernel_enabled("cuda", False):
        return op(*args)


def route_topk(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, scale: float, renormalize: bool,
               n_group: int, topk_group: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CUDA ``marin::route_topk`` (contract: marin_model/ops/contract.py). One warp per token, one pass over the logits."""
    check_route_topk_args(logits, bias, k, mode, n_group, topk_group)  # before any allocation, T = 0 included
    _on_device(logits.device, bias=bias)
    T, E = logits.shape
    if logits.dtype not in _DTYPES or E > MAX_EXPERTS or k > MAX_TOP_K:
        return _reference("route_topk", logits, bias, k, mode, scale, renormalize, n_group, topk_group)
    ids, weights = logits.new_empty(T, k, dtype=torch.int32), logits.new_empty(T, k, dtype=torch.float32)
    counts, lse = logits.new_empty(E, dtype=torch.int32), logits.new_empty(T, dtype=torch.float32)
    if T == 0:
        return ids, weights, counts.zero_(), lse
    dtype, logits = _DTYPES[logits.dtype], logits.contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    _launch("marin_route_topk", logits.device, logits.data_ptr(), dtype, _ptr(bias), T, E, k, _MODES[mode],
            float(scale), int(renormalize), max(n_group, 1), topk_group, ids.data_ptr(), weights.data_ptr(),
            counts.data_ptr(), lse.data_ptr())
    return ids, weights, counts, lse


def route_topk_backward(grad_weights: Tensor, grad_lse: Tensor, logits: Tensor, expert_ids: Tensor, weights: Tensor,
                        mode: str, scale: float, renormalize: bool) -> Tensor:
    """CUDA ``marin::route_topk_backward``: gates recomputed from the logits, one warp per token."""
    _check(logits.dim() == 2 and expert_ids.dim() == 2, f"logits and expert_ids must be 2-D, got "
           f"{tuple(logits.shape)} and {tuple(expert_ids.shape)}")
    T, E = logits.shape
    k = expert_ids.shape[1]
    _check(mode in _MODES, f"mode must be one of {tuple(_MODES)}, got {mode!r}")
    _check(expert_ids.shape == (T, k) and grad_weights.shape == (T, k) and grad_lse.shape == (T,),
           f"shapes disagree: logits {tuple(logits.shape)}, expert_ids {tuple(expert_ids.shape)}, "
           f"grad_weights {tuple(grad_weights.shape)}, grad_lse {tuple(grad_lse.shape)}")
    _check(expert_ids.dtype == torch.int32, f"expert_ids must be int32, got {expert_ids.dtype}")
    _check(1 <= k <= E, f"k={k} must be in [1, E={E}]")
    _on_device(logits.device, grad_weights=grad_weights, grad_lse=grad_lse, expert_ids=expert_ids)
    if T == 0:
        return torch.zeros_like(logits)
    if logits.dtype not in _DTYPES or E > MAX_EXPERTS or k > MAX_TOP_K:
        return _reference("route_topk_backward", grad_weights, grad_lse, logits, expert_ids, weights, mode, scale,
                          renormalize)
    # The kernel reads logits[t, expert_ids[t, j]]. Checked on the device, as the reference's gather does: on
    # the CPU it raises, on a GPU a failure is a device-side assert, and there is no host synchronisation.
    torch._assert_async(((expert_ids >= 0) & (expert_ids < E)).all(), f"expert_ids must be in [0, E={E})")
    dtype, logits = _DTYPES[logits.dtype], logits.contiguous()
    grad_weights, grad_lse = grad_weights.to(torch.float32).contiguous(), grad_lse.to(torch.float32).contiguous()
    expert_ids, grad_logits = expert_ids.contiguous(), torch.empty_like(logits)
    _launch("marin_route_topk_backward", logits.device, grad_weights.data_ptr(), grad_lse.data_ptr(),
            logits.data_ptr(), dtype, expert_ids.data_ptr(), T, E, k, _MODES[mode], float(scale), int(renormalize),
            grad_logits.data_ptr())
    return grad_logits


def permute(x: Tensor, expert_ids: Tensor, num_experts: int, align: int,
            capacity: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CUDA ``marin::permute``: rank, scan, scatter (cuda/permute.cu); ids outside [-1, E) count as dropped."""

    check_permute_args(x, expert_ids, num_experts, align, capacity)
    T, K = expert_ids.shape
    R, H = permute_rows(T, K, num_experts, align), x.shape[1]
    row_of, src_of = expert_ids.new_empty(T, K), expert_ids.new_empty(R)
    offsets = expert_ids.new_empty(num_experts + 1)
    if expert_ids.numel() == 0:  # no entries: every row is unused
        return x.new_empty(R, H), row_of, src_of.fill_(-2), offsets.zero_()
    if num_experts > MAX_EXPERTS or K > MAX_TOP_K or R >= 2**31:
        return _reference("permute", x, expert_ids, num_experts, align, capacity)
    _on_device(x.device, expert_ids=expert_ids)
    x, expert_ids = x.contiguous(), expert_ids.contiguous()
    routed = x.new_empty(R, H)
    lib = load_library()
    workspace = torch.empty(lib.marin_permute_workspace_bytes(T, K, num_experts), dtype=torch.uint8, device=x.device)
    _launch("marin_permute", x.device, x.data_ptr(), T, H, x.element_size(), expert_ids.data_ptr(), K, num_experts,
            align, capacity, routed.data_ptr(), row_of.data_ptr(), src_of.data_ptr(), offsets.data_ptr(),
            workspace.data_ptr())
    return routed, row_of, src_of, offsets


def _unpermute_supported(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> bool:
    """Checks the arguments; False when the kernels do not take them (fp64 rows or weights, K > 16)."""

    check_unpermute_args(routed, row_of, src_of, weights)
    _on_device(routed.device, row_of=row_of, src_of=src_of, weights=weights)
    return (routed.dtype in _DTYPES and row_of.shape[1] <= MAX_TOP_K
            and (weights is None or weights.dtype == torch.float32))


def unpermute(routed: Tensor, row_of: Tensor, src_of: Tensor, weights: Optional[Tensor]) -> Tensor:
    """CUDA ``marin::unpermute``: one block per token pulls its rows; fp32 sums in k order."""
    supported = _unpermute_supported(routed, row_of, src_of, weights)
    T, H = row_of.shape[0], routed.shape[1]
    if row_of.numel() == 0:
        return routed.new_zeros(T, H)
    if not supported:
        return _reference("unpermute", routed, row_of, src_of, weights)
    dtype, routed, row_of = _DTYPES[routed.dtype], routed.contiguous(), row_of.contiguous()
    weights = None if weights is None else weights.contiguous()
    out = routed.new_empty(T, H)
    _launch("marin_unpermute", routed.device, routed.data_ptr(), dtype, routed.shape[0], H, row_of.data_ptr(), T,
            row_of.shape[1], _ptr(weights), out.data_ptr())
    return out


def unpermute_backward(grad_out: Tensor, routed: Tensor, row_of: Tensor, src_of: Tensor,
                       weights: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """CUDA ``marin::unpermute_backward``: each token pushes w*grad to its rows and takes the weight grads.
    row_of and src_of must come from one permute call (the kernel writes the rows row_of names)."""
    supported = _unpermute_supported(routed, row_of, src_of, weights)
    T, K = row_of.shape
    _check(grad_out.shape == (T, routed.shape[1]), f"grad_out must be {(T, routed.shape[1])}, got {tuple(grad_out.shape)}")
    _on_device(routed.device, grad_out=grad_out)
    if not supported:
        return _reference("unpermute_backward", grad_out, routed, row_of, src_of, weights)
    grad_weights = routed.new_zeros(T, K, dtype=torch.float32)
    if row_of.numel() == 0:
        return torch.zeros_like(routed), grad_weights
    # grad_out is read as it is when it has the rows' dtype or fp32 (scaled in fp32, rounded once, as the
    # reference does); any other float dtype is widened to fp32 first, which is exact.
    if grad_out.dtype not in (routed.dtype, torch.float32):
        grad_out = grad_out.to(torch.float32)
    dtype, routed = _DTYPES[routed.dtype], routed.contiguous()
    grad_out, row_of, src_of = grad_out.contiguous(), row_of.contiguous(), src_of.contiguous()
    weights = None if weights is None else weights.contiguous()
    grad_routed = torch.empty_like(routed)
    _launch("marin_unpermute_backward", routed.device, grad_out.data_ptr(), _DTYPES[grad_out.dtype],
            routed.data_ptr(), dtype, routed.shape[0], routed.shape[1], row_of.data_ptr(), src_of.data_ptr(), T, K,
            _ptr(weights), grad_routed.data_ptr(), None if weights is None else grad_weights.data_ptr())
    return grad_routed, grad_weights


_ENTRY_POINTS = {
    "marin::route_topk": route_topk,
    "marin::route_topk_backward": route_topk_backward,
    "marin::permute": permute,
    "marin::unpermute": unpermute,
    "marin::unpermute_backward": unpermute_backward,
}


def register_cuda_kernels() -> bool:
    """Makes CUDA tensors take the kernels of cuda/ in the ``marin::`` ops; True when they do.

    A silent no-op returning False when torch sees no GPU, nvcc is missing, or the build or load fails;
    :func:`status` says why. ``MARIN_CUDA_KERNELS``: "auto" (default), "off" (keep the reference on CUDA
    tensors), "require" (raise instead of falling back). Idempotent.
    """
    policy = os.environ.get("MARIN_CUDA_KERNELS", "auto")
    if STATUS["registered"]:
        return True
    if policy == "off":
        STATUS["reason"] = "MARIN_CUDA_KERNELS=off"
        return False
    try:
        if not torch.cuda.is_available():
            raise KernelBuildError("torch sees no CUDA device")
        load_library()
        for name, fn in _ENTRY_POINTS.items():
            torch.library.register_kernel(name, "cuda", fn)
    except Exception as error:  # noqa: BLE001 - any failure leaves the reference in place, by design
        if isinstance(error, library.DriverTooOld) and STATUS["reason"] != f"{type(error).__name__}: {error}":
            warnings.warn(str(error), RuntimeWarning, stacklevel=2)  # once: silent fallback would hide a slow run
        STATUS["reason"] = f"{type(error).__name__}: {error}"
        if policy == "require":
            raise
        return False
    STATUS.update(registered=True, reason="")
    return True


def status() -> dict:
    """Whether the kernels serve CUDA tensors (``registered``), why not (``reason``), and the library path."""
    return dict(STATUS)
