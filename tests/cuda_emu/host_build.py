"""Builds cuda/*.cu with g++ against the CUDA emulation of this directory: the kernels' own lines, run on
the CPU (see emu.h). Used by tests/test_cuda_emulated.py and scripts/mutate_kernels.py.

Flavours: "plain" (-O1), "asan" (AddressSanitizer + UndefinedBehaviorSanitizer, which catch what x86
forgives: out-of-bounds and misaligned accesses) and "tsan" (ThreadSanitizer, which reports two threads of a
launch racing on memory with nothing ordering them: a plain read-modify-write where an atomic belongs, a
missing barrier, whatever the thread order of the run; emu.cpp says how). A Python process must preload the
sanitizer's runtime (:func:`sanitizer_runtime`) to load the last two. Builds are cached by the hash of the
sources and flags, and appear by atomic rename, so parallel test workers build once.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

EMU_DIR = Path(__file__).resolve().parent
ROOT = EMU_DIR.parent.parent
SOURCES = ("api.cu", "route_topk.cu", "permute.cu", "unpermute.cu")

COMMON_FLAGS = ["-std=c++17", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wno-sign-compare",
                "-Wno-unused-function", "-Werror", "-g1"]
FLAVOURS = {
    "plain": ["-O1"],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"],
    "tsan": ["-O1", "-fsanitize=thread"],
}
# The emulator's own source where it differs: under "tsan" not instrumented (the scheduler's bookkeeping is
# not the kernels' memory), its happens-before annotations on.
EMULATOR_FLAVOURS = {"tsan": ["-O1", "-DCUDA_EMU_TSAN"]}
RUNTIMES = {"asan": "libasan.so", "tsan": "libtsan.so"}


class HostBuildError(RuntimeError):
    """g++ is missing or rejected the sources (the message holds its output)."""


def find_compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++")
    if compiler is None:
        raise HostBuildError("g++ not found (or set $CXX): the emulated CUDA suite needs a C++17 compiler")
    return compiler


def _digest(cuda_dir: Path, flags: list[str], compiler: str) -> str:
    digest = hashlib.sha256()
    for directory in (cuda_dir, EMU_DIR):
        for path in sorted(p for p in directory.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".cpp")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest.update(("\0".join(flags) + "\0" + version).encode())
    return digest.hexdigest()[:16]


def build_host_library(out_dir: Path, *, flavour: str = "plain", cuda_dir: Optional[Path] = None,
                       jobs: int = 2, extra_flags: tuple[str, ...] = ()) -> Path:
    """The host build of cuda_dir (default: the repository's cuda/) as a shared library under out_dir."""
    compiler = find_compiler()
    cuda_dir = Path(cuda_dir or ROOT / "cuda")
    tail = list(extra_flags) + [f"-I{EMU_DIR}", f"-I{cuda_dir}"]
    flags = COMMON_FLAGS + FLAVOURS[flavour] + tail
    emulator_flags = COMMON_FLAGS + EMULATOR_FLAVOURS.get(flavour, FLAVOURS[flavour]) + tail
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / f"libmarin_kernels_host-{flavour}-{_digest(cuda_dir, flags + emulator_flags, compiler)}.so"
    with open(out_dir / ".host-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():
            return library
        with tempfile.TemporaryDirectory(dir=out_dir, prefix=".host-build-") as tmp:
            def compile_one(source: Path) -> Path:
                obj = Path(tmp) / (source.name + ".o")
                language = ["-x", "c++"] if source.suffix == ".cu" else []
                own = emulator_flags if source.name == "emu.cpp" else flags
                done = subprocess.run([compiler, *own, *language, "-c", str(source), "-o", str(obj)],
                                      capture_output=True, text=True)
                if done.returncode != 0:
                    raise HostBuildError(f"g++ failed on {source.name}:\n{done.stderr[-6000:]}")
                return obj

            sources = [cuda_dir / name for name in SOURCES] + [EMU_DIR / "emu.cpp", EMU_DIR / "selftest.cu"]
            with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
                objects = list(pool.map(compile_one, sources))
            link = [compiler, "-shared", *FLAVOURS[flavour], *map(str, objects), "-o", str(Path(tmp) / "lib.so")]
            done = subprocess.run(link, capture_output=True, text=True)
            if done.returncode != 0:
                raise HostBuildError(f"g++ failed to link:\n{done.stderr[-6000:]}")
            os.replace(Path(tmp) / "lib.so", library)
    return library


def sanitizer_runtime(flavour: str) -> Optional[str]:
    """The path of g++'s libasan.so or libtsan.so, which a Python process must preload to load the "asan" or
    "tsan" flavour; None when g++ has none."""
    done = subprocess.run([find_compiler(), f"-print-file-name={RUNTIMES[flavour]}"], capture_output=True, text=True)
    path = done.stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None
