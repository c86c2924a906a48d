"""The CUDA kernels of ``cuda/``: build them with nvcc, load them with ctypes, serve the ``marin::`` ops.

Why ctypes and not a torch extension (DESIGN.md, "CUDA without a GPU in CI"): ``cuda/*.cu`` include no torch
header, so they compile in seconds on a machine with nvcc and no GPU, and the one shared library works with
any torch >= 2.11 and any Python >= 3.11 — there is no torch ABI to match. The price is this module: it
checks every argument on the Python side, allocates the outputs with torch (so the caching allocator and
CUDA graphs see them), and passes raw pointers and the current stream to the ``extern "C"`` launchers of
``cuda/marin_kernels.h``.

Build: :func:`build_library` compiles each ``.cu`` in parallel and links ``libmarin_kernels-<hash>.so``,
where the hash covers the sources, the flags and the nvcc version; the file appears by atomic rename, under
a file lock, so concurrent test workers build once and never load half a file. ``make cuda`` (``python -m
marin_model.kernels --build``) does it ahead of time; otherwise the first :func:`register_cuda_kernels` on a
machine with a GPU does it.

Dispatch: ``marin_model/ops.py`` defines the ops with their CPU reference for "cpu" and "cuda" and calls
:func:`register_cuda_kernels` at its bottom, which replaces the "cuda" kernels with the entry points below.
It is a silent no-op (returns False, see :func:`status`) when torch sees no GPU or the library cannot be
built or loaded; ``MARIN_CUDA_KERNELS=off`` skips it and ``=require`` turns a failure into an exception.

This module imports nothing but torch and the standard library: it must run on a GPU machine that has
torch and nothing else of ours.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import dataclasses
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "SOURCES",
    "KernelBuildError",
    "BuildResult",
    "KernelResources",
    "cuda_dir",
    "build_dir",
    "find_nvcc",
    "nvcc_flags",
    "build_library",
    "load_library",
    "parse_ptxas_report",
    "register_cuda_kernels",
    "status",
    "route_topk",
    "route_topk_backward",
    "permute",
    "unpermute",
    "unpermute_backward",
]

SOURCES = ("api.cu", "route_topk.cu", "permute.cu", "unpermute.cu")
ABI_VERSION = 1  # must equal MARIN_KERNELS_ABI_VERSION in cuda/marin_kernels.h
MAX_EXPERTS = 512  # marin::kMaxExperts
MAX_TOP_K = 16  # marin::kMaxTopK
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_MODES = {"sigmoid": 0, "softmax_topk": 1, "topk_softmax": 2}


class KernelBuildError(RuntimeError):
    """The CUDA library could not be built or loaded (no nvcc, a compile error, an ABI mismatch).

    Defined here rather than in ``marin_data.errors`` because marin_model must import nothing of
    marin_data's dependencies. ``log`` holds the compiler output when there is one.
    """

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(message)
        self.log = log


# ---------------------------------------------------------------------------------------------------- build
def cuda_dir() -> Path:
    """The kernel sources: ``$MARIN_CUDA_DIR`` or the repository's ``cuda/``."""
    return Path(os.environ.get("MARIN_CUDA_DIR") or Path(__file__).resolve().parent.parent / "cuda")


def build_dir() -> Path:
    """Where built libraries go: ``$MARIN_CUDA_BUILD_DIR``, else ``cuda/build`` (``~/.cache/marin/cuda`` when
    the sources are read-only, e.g. an installed package)."""
    if os.environ.get("MARIN_CUDA_BUILD_DIR"):
        return Path(os.environ["MARIN_CUDA_BUILD_DIR"])
    src = cuda_dir()
    if os.access(src, os.W_OK):
        return src / "build"
    return Path.home() / ".cache" / "marin" / "cuda"


def find_nvcc() -> Optional[str]:
    """``$MARIN_NVCC``, nvcc on the PATH, ``$CUDA_HOME/bin/nvcc`` or ``/usr/local/cuda/bin/nvcc``; None if none."""
    candidates = [os.environ.get("MARIN_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            candidates.append(str(Path(home) / "bin" / "nvcc"))
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _archs() -> list[str]:
    """Compute capabilities to build for: ``$MARIN_CUDA_ARCHS`` ("80;90"), default Hopper ("90")."""
    return [a for a in re.split(r"[;, ]+", os.environ.get("MARIN_CUDA_ARCHS", "90")) if a]


def nvcc_flags(archs: Optional[list[str]] = None) -> list[str]:
    """Compile flags: machine code for each arch plus PTX of the last (newer GPUs JIT it); ``-Xptxas -v``
    so the build log reports registers, stack frames and spills (tests/test_cuda_build.py reads it)."""
    archs = archs or _archs()
    flags = ["-O3", "-std=c++17", "-lineinfo", "-Xcompiler", "-fPIC", "-Xptxas", "-v"]
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    return flags + ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]


@dataclasses.dataclass(frozen=True)
class BuildResult:
    """A built library: its path, the compiler's report (ptxas -v), and whether it came from the cache."""

    library: Path
    log: str
    cached: bool


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def _source_hash(src: Path, flags: list[str], version: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in src.iterdir() if p.suffix in (".cu", ".cuh", ".h")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(("\0".join(flags) + "\0" + version).encode())
    return digest.hexdigest()[:16]


def build_library(*, out_dir: Optional[Path] = None, nvcc: Optional[str] = None, archs: Optional[list[str]] = None,
                  force: bool = False) -> BuildResult:
    """Builds ``cuda/*.cu`` into one shared library, or returns the cached one for the same inputs.

    Args:
        out_dir: where the library goes (default :func:`build_dir`).
        nvcc: the compiler (default :func:`find_nvcc`).
        archs: compute capabilities, e.g. ``["90"]`` (default ``$MARIN_CUDA_ARCHS`` or Hopper).
        force: rebuild even when a library for these inputs exists.

    Returns: a :class:`BuildResult`; its log is the ptxas report, kept beside the library as ``.log``.
    Raises: :class:`KernelBuildError` without nvcc or when a compile fails (with the compiler output).
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelBuildError("nvcc not found: install the CUDA toolkit, or set MARIN_NVCC or CUDA_HOME")
    src, out = cuda_dir(), Path(out_dir) if out_dir is not None else build_dir()
    flags = nvcc_flags(archs)
    tag = _source_hash(src, flags, _nvcc_version(nvcc))
    library, log_path = out / f"libmarin_kernels-{tag}.so", out / f"libmarin_kernels-{tag}.log"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build per directory at a time; later comers find it cached
        if library.exists() and log_path.exists() and not force:
            return BuildResult(library, log_path.read_text(), cached=True)
        with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp:
            log = _compile_and_link(nvcc, src, Path(tmp), flags)
            (Path(tmp) / "lib.log").write_text(log)
            os.replace(Path(tmp) / "lib.log", log_path)  # atomic renames: no reader sees half a file
            os.replace(Path(tmp) / "lib.so", library)
        _point_latest(out, library)
    return BuildResult(library, log, cached=False)


def _compile_and_link(nvcc: str, src: Path, tmp: Path, flags: list[str]) -> str:
    def compile_one(name: str) -> str:
        cmd = [nvcc, *flags, "-c", str(src / name), "-o", str(tmp / (name + ".o"))]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise KernelBuildError(f"nvcc failed on cuda/{name}:\n{done.stderr[-4000:]}", log=done.stderr)
        return done.stdout + done.stderr

    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(SOURCES), os.cpu_count() or 1)) as pool:
        logs = list(pool.map(compile_one, SOURCES))
    # cudart is linked statically (nvcc's default): loading needs no libcudart on the library path, only the
    # driver, and only once a launcher runs.
    cmd = [nvcc, "--shared", *[str(tmp / (n + ".o")) for n in SOURCES], "-o", str(tmp / "lib.so")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KernelBuildError(f"nvcc failed to link:\n{done.stderr[-4000:]}", log=done.stderr)
    return "".join(logs)


def _point_latest(out: Path, library: Path) -> None:
    """``libmarin_kernels.so`` -> the newest build (a symlink replaced atomically); older builds removed."""
    link, tmp = out / "libmarin_kernels.so", out / f".libmarin_kernels.so.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(library.name)
    os.replace(tmp, link)
    for old in out.glob("libmarin_kernels-*"):
        if old.stem != library.stem:
            old.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel's line in the ptxas report."""

    name: str  # mangled
    arch: str  # "sm_90"
    registers: int
    stack_frame: int  # bytes; > 0 means local memory
    spill_stores: int
    spill_loads: int


def parse_ptxas_report(log: str) -> list[KernelResources]:
    """Reads ``nvcc -Xptxas -v`` output into one record per compiled kernel (entry function)."""
    found: list[KernelResources] = []
    current: Optional[dict] = None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line):
            current = {"name": m.group(1), "arch": m.group(2)}
        elif current is None:
            continue
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := re.search(r"Used (\d+) registers", line):
            found.append(KernelResources(registers=int(m.group(1)), **current))
            current = None
    return found


# ----------------------------------------------------------------------------------------------------- load
_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
_SIGNATURES = {  # name -> (restype, argtypes), mirroring cuda/marin_kernels.h
    "marin_kernels_abi_version": (_I, ()),
    "marin_cuda_error_string": (ctypes.c_char_p, (_I,)),
    "marin_route_topk": (_I, (_P, _I, _P, _L, _I, _I, _I, _F, _I, _I, _I, _P, _P, _P, _P, _P)),
    "marin_route_topk_backward": (_I, (_P, _P, _P, _I, _P, _L, _I, _I, _I, _F, _I, _P, _P)),
    "marin_permute_workspace_bytes": (ctypes.c_size_t, (_L, _I, _I)),
    "marin_permute": (_I, (_P, _L, _L, _I, _P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P)),
    "marin_unpermute": (_I, (_P, _I, _L, _P, _L, _I, _P, _P, _P)),
    "marin_unpermute_backward": (_I, (_P, _P, _I, _L, _L, _P, _P, _L, _I, _P, _P, _P, _P)),
}


def open_library(path: Path) -> ctypes.CDLL:
    """dlopens a built library and declares the launcher signatures. Works without a GPU or driver."""
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.marin_kernels_abi_version() != ABI_VERSION:
        raise KernelBuildError(f"{path} has ABI {lib.marin_kernels_abi_version()}, this module wants {ABI_VERSION}")
    return lib


_lib: Optional[ctypes.CDLL] = None
_status = {"registered": False, "reason": "register_cuda_kernels() was not called", "library": None}


def load_library() -> ctypes.CDLL:
    """The loaded library, built first if no cached build matches the sources (see :func:`build_library`)."""
    global _lib
    if _lib is None:
        archs = _archs()
        if torch.cuda.is_available():  # pre-Hopper GPUs cannot run sm_90 code nor JIT compute_90 PTX
            major, minor = torch.cuda.get_device_capability()
            if major < 9 and f"{major}{minor}" not in archs:
                archs = [f"{major}{minor}", *archs]
        result = build_library(archs=archs)
        _lib = open_library(result.library)
        _status["library"] = str(result.library)
    return _lib


# ---------------------------------------------------------------------------------------------- entry points
def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _launch(name: str, device: torch.device, *args) -> None:
    """Calls launcher `name` on `device`'s current stream (so CUDA graphs capture it); raises on error."""
    _check(device.type == "cuda", f"the CUDA kernels need CUDA tensors, got {device}")
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
    from marin_model import ops

    op = getattr(ops, name)
    with op.set_kernel_enabled("cuda", False):
        return op(*args)


def route_topk(logits: Tensor, bias: Optional[Tensor], k: int, mode: str, scale: float, renormalize: bool,
               n_group: int, topk_group: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CUDA ``marin::route_topk`` (contract: marin_model/ops.py). One warp per token, one pass over the logits."""
    from marin_model.ops import check_route_topk_args  # lazy: ops imports this module

    T, E = logits.shape
    ids, weights = logits.new_empty(T, k, dtype=torch.int32), logits.new_empty(T, k, dtype=torch.float32)
    counts, lse = logits.new_empty(E, dtype=torch.int32), logits.new_empty(T, dtype=torch.float32)
    if logits.numel() == 0:
        return ids, weights, counts.zero_(), lse
    check_route_topk_args(logits, bias, k, mode, n_group, topk_group)
    if logits.dtype not in _DTYPES or E > MAX_EXPERTS or k > MAX_TOP_K:
        return _reference("route_topk", logits, bias, k, mode, scale, renormalize, n_group, topk_group)
    _on_device(logits.device, bias=bias)
    dtype, logits = _DTYPES[logits.dtype], logits.contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    _launch("marin_route_topk", logits.device, logits.data_ptr(), dtype, _ptr(bias), T, E, k, _MODES[mode],
            float(scale), int(renormalize), max(n_group, 1), topk_group, ids.data_ptr(), weights.data_ptr(),
            counts.data_ptr(), lse.data_ptr())
    return ids, weights, counts, lse


def route_topk_backward(grad_weights: Tensor, grad_lse: Tensor, logits: Tensor, expert_ids: Tensor, weights: Tensor,
                        mode: str, scale: float, renormalize: bool) -> Tensor:
    """CUDA ``marin::route_topk_backward``: gates recomputed from the logits, one warp per token."""
    if logits.numel() == 0:
        return torch.zeros_like(logits)
    T, E = logits.shape
    k = expert_ids.shape[1]
    _check(mode in _MODES, f"mode must be one of {tuple(_MODES)}, got {mode!r}")
    _check(expert_ids.shape == (T, k) and grad_weights.shape == (T, k) and grad_lse.shape == (T,),
           f"shapes disagree: logits {tuple(logits.shape)}, expert_ids {tuple(expert_ids.shape)}, "
           f"grad_weights {tuple(grad_weights.shape)}, grad_lse {tuple(grad_lse.shape)}")
    _check(expert_ids.dtype == torch.int32, f"expert_ids must be int32, got {expert_ids.dtype}")
    _check(1 <= k <= E, f"k={k} must be in [1, E={E}]")
    if logits.dtype not in _DTYPES or E > MAX_EXPERTS or k > MAX_TOP_K:
        return _reference("route_topk_backward", grad_weights, grad_lse, logits, expert_ids, weights, mode, scale,
                          renormalize)
    _on_device(logits.device, grad_weights=grad_weights, grad_lse=grad_lse, expert_ids=expert_ids)
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
    from marin_model.ops import check_permute_args, permute_rows

    check_permute_args(x, expert_ids, num_experts, align, capacity)
    T, K = expert_ids.shape
    R, H = permute_rows(T, K, num_experts, align), x.shape[1]
    row_of, src_of = expert_ids.new_empty(T, K), expert_ids.new_empty(R)
    offsets = expert_ids.new_empty(num_experts + 1)
    if expert_ids.numel() == 0:
        return x.new_zeros(R, H), row_of, src_of.fill_(-1), offsets.zero_()
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
    from marin_model.ops import check_unpermute_args

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
    _launch("marin_unpermute", routed.device, routed.data_ptr(), dtype, H, row_of.data_ptr(), T, row_of.shape[1],
            _ptr(weights), out.data_ptr())
    return out


def unpermute_backward(grad_out: Tensor, routed: Tensor, row_of: Tensor, src_of: Tensor,
                       weights: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """CUDA ``marin::unpermute_backward``: each token pushes w*grad to its rows and takes the weight grads.
    row_of and src_of must come from one permute call (the kernel writes the rows row_of names)."""
    supported = _unpermute_supported(routed, row_of, src_of, weights)
    T, K = row_of.shape
    if not supported:
        return _reference("unpermute_backward", grad_out, routed, row_of, src_of, weights)
    grad_weights = routed.new_zeros(T, K, dtype=torch.float32)
    if row_of.numel() == 0:
        return torch.zeros_like(routed), grad_weights
    _check(grad_out.shape == (T, routed.shape[1]), f"grad_out must be {(T, routed.shape[1])}, got {tuple(grad_out.shape)}")
    _on_device(routed.device, grad_out=grad_out)
    dtype, routed = _DTYPES[routed.dtype], routed.contiguous()
    grad_out, row_of, src_of = grad_out.to(routed.dtype).contiguous(), row_of.contiguous(), src_of.contiguous()
    weights = None if weights is None else weights.contiguous()
    grad_routed = torch.empty_like(routed)
    _launch("marin_unpermute_backward", routed.device, grad_out.data_ptr(), routed.data_ptr(), dtype,
            routed.shape[0], routed.shape[1], row_of.data_ptr(), src_of.data_ptr(), T, K, _ptr(weights),
            grad_routed.data_ptr(), None if weights is None else grad_weights.data_ptr())
    return grad_routed, grad_weights


# ------------------------------------------------------------------------------------------------- dispatch
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
    if _status["registered"]:
        return True
    if policy == "off":
        _status["reason"] = "MARIN_CUDA_KERNELS=off"
        return False
    try:
        if not torch.cuda.is_available():
            raise KernelBuildError("torch sees no CUDA device")
        load_library()
        for name, fn in _ENTRY_POINTS.items():
            torch.library.register_kernel(name, "cuda", fn)
    except Exception as error:  # noqa: BLE001 - any failure leaves the reference in place, by design
        _status["reason"] = f"{type(error).__name__}: {error}"
        if policy == "require":
            raise
        return False
    _status.update(registered=True, reason="")
    return True


def status() -> dict:
    """Whether the kernels serve CUDA tensors (``registered``), why not (``reason``), and the library path."""
    return dict(_status)


# ---------------------------------------------------------------------------------------------------- CLI
def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m marin_model.kernels",
        description="Build the CUDA kernels of cuda/ (needs nvcc, not a GPU) or report their status.",
        epilog="EXAMPLES:\n  python -m marin_model.kernels --build          # what `make cuda` runs\n"
               "  python -m marin_model.kernels --build --force  # rebuild even if cached\n"
               "  python -m marin_model.kernels --status         # is CUDA dispatch active here?",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="build (or find cached) cuda/build/libmarin_kernels-*.so")
    parser.add_argument("--force", action="store_true", help="with --build: rebuild even when cached")
    parser.add_argument("--status", action="store_true", help="try to register the kernels and say what happened")
    args = parser.parse_args(argv)
    if not (args.build or args.status):
        parser.error("give --build or --status")
    if args.build:
        try:
            result = build_library(force=args.force)
        except KernelBuildError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        kernels = parse_ptxas_report(result.log)
        worst = max((k.registers for k in kernels), default=0)
        spills = sum(k.spill_stores + k.spill_loads + k.stack_frame for k in kernels)
        print(f"{'cached' if result.cached else 'built'}: {result.library}")
        print(f"{len(kernels)} kernels, at most {worst} registers, {spills} bytes of spills/stack frames")
    if args.status:
        from marin_model import ops  # noqa: F401 - defines the ops and calls register_cuda_kernels()

        register_cuda_kernels()
        for key, value in status().items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
