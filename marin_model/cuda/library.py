"""Load the built library with ctypes and declare its C ABI (``cuda/marin_kernels.h``).

ctypes rather than a torch extension: the ``.cu`` files include no torch header, so they compile in seconds
and one library serves any torch and any Python; there is no torch ABI to match.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from marin_model.cuda.build import build_library, default_archs, KernelBuildError

__all__ = ["ABI_VERSION", "SIGNATURES", "STATUS", "DriverTooOld", "cuda_versions", "driver_supports",
           "kernel_occupancy", "load_library", "open_library"]

ABI_VERSION = 3  # must equal MARIN_KERNELS_ABI_VERSION in cuda/marin_kernels.h
_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {  # name -> (restype, argtypes), mirroring cuda/marin_kernels.h
    "marin_kernels_abi_version": (_I, ()),
    "marin_cuda_error_string": (ctypes.c_char_p, (_I,)),
    "marin_cuda_versions": (None, (_P, _P)),
    "marin_kernel_occupancy": (_I, (_I, _P, _P, _P)),
    "marin_route_topk": (_I, (_P, _I, _P, _L, _I, _I, _I, _F, _I, _I, _I, _P, _P, _P, _P, _P)),
    "marin_route_topk_backward": (_I, (_P, _P, _P, _I, _P, _L, _I, _I, _I, _F, _I, _P, _P)),
    "marin_permute_workspace_bytes": (ctypes.c_size_t, (_L, _I, _I)),
    "marin_permute": (_I, (_P, _L, _L, _I, _P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P)),
    "marin_unpermute": (_I, (_P, _I, _L, _L, _P, _L, _I, _P, _P, _P)),
    "marin_unpermute_backward": (_I, (_P, _I, _P, _I, _L, _L, _P, _P, _L, _I, _P, _P, _P, _P)),
}


def open_library(path: Path) -> ctypes.CDLL:
    """dlopens a built library and declares the launcher signatures. Works without a GPU or driver."""
    lib = ctypes.CDLL(str(path))
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    if lib.marin_kernels_abi_version() != ABI_VERSION:
        raise KernelBuildError(f"{path} has ABI {lib.marin_kernels_abi_version()}, this module wants {ABI_VERSION}")
    return lib


class DriverTooOld(KernelBuildError):
    """The driver is older than the CUDA runtime the library links statically: every launch would fail."""


def driver_supports(runtime_version: int, driver_version: int) -> bool:
    """Whether a driver (``cudaDriverGetVersion``: 1000 * major + 10 * minor, 0 without one) runs a runtime of
    ``runtime_version``: any driver of the runtime's major or newer does (CUDA's minor version compatibility);
    CUDA 13 thus needs an r580+ driver (13000), CUDA 12 an r525+ one (12000)."""
    return driver_version > 0 and driver_version >= runtime_version // 1000 * 1000


def cuda_versions(lib: ctypes.CDLL) -> tuple[int, int]:
    """(runtime the library was built with, installed driver), e.g. (13000, 12080)."""
    runtime, driver = ctypes.c_int(), ctypes.c_int()
    lib.marin_cuda_versions(ctypes.byref(runtime), ctypes.byref(driver))
    return runtime.value, driver.value


def _version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def kernel_occupancy(lib: ctypes.CDLL) -> list[tuple[str, int, int]]:
    """(kernel, threads per block, resident blocks per multiprocessor; -1 without a GPU) for each kernel."""
    rows, index = [], 0
    name, threads, blocks = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int()
    while lib.marin_kernel_occupancy(index, ctypes.byref(name), ctypes.byref(threads), ctypes.byref(blocks)) == 0:
        rows.append((name.value.decode(), threads.value, blocks.value))
        index += 1
    return rows


_lib: Optional[ctypes.CDLL] = None
STATUS = {"registered": False, "reason": "register_cuda_kernels() was not called", "library": None}


def load_library() -> ctypes.CDLL:
    """The loaded library, built first if no cached build matches the sources (see :func:`build_library`)."""
    global _lib
    if _lib is None:
        archs = default_archs()
        if torch.cuda.is_available():  # pre-Hopper GPUs cannot run sm_90 code nor JIT compute_90 PTX
            major, minor = torch.cuda.get_device_capability()
            if major < 9 and f"{major}{minor}" not in archs:
                archs = [f"{major}{minor}", *archs]
        result = build_library(archs=archs)
        lib = open_library(result.library)
        runtime, driver = cuda_versions(lib)
        if torch.cuda.is_available() and not driver_supports(runtime, driver):
            raise DriverTooOld(f"the CUDA driver ({_version(driver)}) is older than the CUDA {_version(runtime)} runtime "
                               f"{result.library.name} links: update the driver, or build with the CUDA "
                               f"{_version(driver).split('.')[0]} toolkit (MARIN_NVCC); the reference ops serve CUDA "
                               "tensors meanwhile")
        _lib = lib
        STATUS["library"] = str(result.library)
    return _lib
