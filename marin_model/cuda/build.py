"""Build ``cuda/*.cu`` into one shared library with nvcc (no GPU needed).

:func:`build_library` compiles each ``.cu`` in parallel and links ``libmarin_kernels-<hash>.so``, where the
hash covers the sources, the flags and the nvcc version; the file appears by atomic rename under a file lock,
so concurrent test workers build once and never load half a file. ``make cuda`` does it ahead of time.
Imports nothing but torch's peers in the standard library: it runs on a GPU machine with torch and nothing
else of ours.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fcntl
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

__all__ = ["SOURCES", "BuildResult", "KernelBuildError", "build_dir", "build_library", "choose_nvcc", "cuda_dir",
           "default_archs", "find_nvcc", "nvcc_flags", "nvcc_major", "pick_nvcc", "supported_archs"]

SOURCES = ("api.cu", "route_topk.cu", "permute.cu", "unpermute.cu")


class KernelBuildError(RuntimeError):
    """The CUDA library could not be built or loaded (no nvcc, a compile error, an ABI mismatch).

    Defined here, not with the data side's errors: marin_model imports nothing of marin_data. ``log`` holds
    the compiler output when there is one.
    """

    def __init__(self, message: str, *, log: str = "") -> None:
        super().__init__(message)
        self.log = log


def cuda_dir() -> Path:
    """The kernel sources: ``$MARIN_CUDA_DIR`` or the repository's ``cuda/``."""
    return Path(os.environ.get("MARIN_CUDA_DIR") or Path(__file__).resolve().parents[2] / "cuda")


def build_dir() -> Path:
    """Where built libraries go: ``$MARIN_CUDA_BUILD_DIR``, else ``cuda/build`` (``~/.cache/marin/cuda`` when
    the sources are read-only, e.g. an installed package)."""
    if os.environ.get("MARIN_CUDA_BUILD_DIR"):
        return Path(os.environ["MARIN_CUDA_BUILD_DIR"])
    src = cuda_dir()
    if os.access(src, os.W_OK):
        return src / "build"
    return Path.home() / ".cache" / "marin" / "cuda"


def nvcc_candidates() -> list[str]:
    """Executable nvccs, in order of preference: ``$MARIN_NVCC``, the PATH, ``$CUDA_HOME``/``$CUDA_PATH``,
    ``/usr/local/cuda``, ``/usr/local/cuda-*`` (newest first), and the PyPI toolkit (``nvidia/cu13/bin/nvcc``
    from ``pip install "nvidia-cuda-nvcc==13.*" nvidia-cuda-cccl``; PyPI's CUDA 12 wheels hold only ptxas)."""
    found = [os.environ.get("MARIN_NVCC"), shutil.which("nvcc")]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda",
                 *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)):
        if home:
            found.append(str(Path(home) / "bin" / "nvcc"))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found.extend(sorted(glob.glob(str(Path(root) / "cu[0-9]*" / "bin" / "nvcc")), reverse=True))
    unique = []
    for c in found:
        if c and os.access(c, os.X_OK) and os.path.realpath(c) not in map(os.path.realpath, unique):
            unique.append(c)
    return unique


def nvcc_major(version_text: str) -> Optional[int]:
    """The major version in ``nvcc --version`` output ("release 13.0, V13.0.88" -> 13)."""
    m = re.search(r"release (\d+)\.", version_text)
    return int(m.group(1)) if m else None


def choose_nvcc(versions: dict[str, str], torch_cuda: Optional[str]) -> tuple[Optional[str], str]:
    """The nvcc to build with: the first (of ``versions``, path -> ``--version`` text, in preference order) whose
    major version is torch's CUDA major, since the library's runtime must run on the driver torch runs on.
    Without a CUDA torch, the first. Returns (path or None, why not when None)."""
    if not versions:
        return None, "nvcc not found: install the CUDA toolkit, or set MARIN_NVCC or CUDA_HOME"
    if not torch_cuda:
        return next(iter(versions)), ""
    want = int(torch_cuda.split(".")[0])
    for path, text in versions.items():
        if nvcc_major(text) == want:
            return path, ""
    have = ", ".join(f"{p} (CUDA {nvcc_major(t)})" for p, t in versions.items())
    return None, (f"no nvcc for CUDA {want}, the CUDA of torch {torch_cuda}: found {have}. {install_hint(want)}, "
                  f"or set MARIN_NVCC")


def install_hint(major: int) -> str:
    """How to get an nvcc of CUDA ``major``: PyPI has a whole toolchain from CUDA 13 on (its CUDA 12 nvcc wheels
    hold only ptxas)."""
    if major >= 13:
        return f'Install it with pip install "nvidia-cuda-nvcc=={major}.*" nvidia-cuda-cccl'
    return (f"Install CUDA {major}'s toolkit (NVIDIA's installer, a CUDA {major} container, or conda install "
            f"-c conda-forge cuda-nvcc={major} cuda-cudart-dev={major}); PyPI's CUDA {major} nvcc wheels hold "
            f"only ptxas")


def pick_nvcc() -> tuple[Optional[str], str]:
    """:func:`choose_nvcc` over :func:`nvcc_candidates` for the installed torch; ``$MARIN_NVCC`` is taken as it is."""
    candidates = nvcc_candidates()
    if os.environ.get("MARIN_NVCC") and candidates and candidates[0] == os.environ["MARIN_NVCC"]:
        return candidates[0], ""
    import torch  # lazy: building needs torch only to know its CUDA version

    return choose_nvcc({c: _nvcc_version(c) for c in candidates}, torch.version.cuda)


def find_nvcc() -> Optional[str]:
    """The nvcc to build with (:func:`pick_nvcc`), None if none fits."""
    return pick_nvcc()[0]


def default_archs() -> list[str]:
    """Compute capabilities to build for: ``$MARIN_CUDA_ARCHS`` ("80;90"), default Hopper and Blackwell ("90;100")."""
    return [a for a in re.split(r"[;, ]+", os.environ.get("MARIN_CUDA_ARCHS", "90;100")) if a]


def supported_archs(archs: list[str], gpu_archs_listed: str) -> list[str]:
    """The archs an nvcc can build (``nvcc --list-gpu-arch`` prints compute_XX lines): sm_100 needs CUDA 12.8+."""
    listed = set(re.findall(r"compute_(\d+)", gpu_archs_listed))
    return [a for a in archs if not listed or a in listed]


def nvcc_flags(archs: Optional[list[str]] = None) -> list[str]:
    """Compile flags: machine code for each arch plus PTX of the last (newer GPUs JIT it); ``-Xptxas -v``
    so the build log reports registers, stack frames and spills (tests/test_cuda_build.py reads it)."""
    archs = archs or default_archs()
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
        archs: compute capabilities, e.g. ``["90"]`` (default ``$MARIN_CUDA_ARCHS`` or Hopper + Blackwell); those
            this nvcc cannot build are left out.
        force: rebuild even when a library for these inputs exists.

    Returns: a :class:`BuildResult`; its log is the ptxas report, kept beside the library as ``.log``.
    Raises: :class:`KernelBuildError` without nvcc or when a compile fails (with the compiler output).
    """
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelBuildError(pick_nvcc()[1] or "nvcc not found: install the CUDA toolkit, or set MARIN_NVCC or CUDA_HOME")
    src, out = cuda_dir(), Path(out_dir) if out_dir is not None else build_dir()
    listed = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout
    archs = supported_archs(archs or default_archs(), listed)
    if not archs:
        raise KernelBuildError(f"{nvcc} builds none of the requested GPU architectures")
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
