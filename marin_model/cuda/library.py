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

__all__ = ["ABI_VERSION", "SIGNATURES", "STATUS", "load_library", "open_library"]

ABI_VERSION = 2  # must equal MARIN_KERNELS_ABI_VERSION in cuda/marin_kernels.h
_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
SIGNATURES = {  # name -> (restype, argtypes), mirroring cuda/marin_kernels.h
    "marin_kernels_abi_version": (_I, ()),
    "marin_cuda_error_string": (ctypes.c_char_p, (_I,)),
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
        _lib = open_library(result.library)
        STATUS["library"] = str(result.library)
    return _lib
