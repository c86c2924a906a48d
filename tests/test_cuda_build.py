"""cuda/ builds and links with nvcc on a machine without a GPU, and the result is what the kernels need.

Checked here, without a GPU: the library builds for sm_90 and sm_100 plus compute_100 PTX, as shipped; ptxas
reports no spills and no stack frame (local memory) in any kernel on either; the row kernels move 16-byte vectors (read off the embedded
PTX); the library exports the C ABI of cuda/marin_kernels.h and dlopens without a driver; builds are cached
by content; dispatch falls back to the reference, silently, when there is no GPU.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marin_model import ops  # noqa: F401 - defines torch.ops.marin
from marin_model.cuda import build, dispatch, library, ptxas

ROOT = Path(__file__).resolve().parent.parent
needs_nvcc = pytest.mark.skipif(build.find_nvcc() is None,
                                reason="nvcc not found (set MARIN_NVCC or CUDA_HOME): cannot build cuda/")

# Kernel families and how many instantiations each must have (dtypes x scores-per-lane, vector widths).
KERNELS = {"route_topk_kernel": 18, "route_topk_backward_kernel": 18, "permute_rank_kernel": 1,
           "permute_scan_kernel": 1, "permute_scatter_kernel": 5, "unpermute_kernel": 11,
           "unpermute_backward_kernel": 17}


ARCHS = ["90", "100"]  # the default build: H200 and GB200


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The default build, in ``$MARIN_CUDA_BUILD_DIR`` when it is set (scripts/gpu_check.sh sets it, so its
    build is found cached rather than compiled twice), else in a folder of this test session, shared by its
    workers (file lock), so a checkout's own cuda/build is left alone."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found (set MARIN_NVCC or CUDA_HOME): cannot build cuda/")
    if os.environ.get("MARIN_CUDA_BUILD_DIR"):
        return build.build_library(archs=ARCHS)
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return build.build_library(out_dir=base / "cuda-build", archs=ARCHS)


def family(mangled):
    return next((name for name in sorted(KERNELS, key=len, reverse=True) if f"{len(name)}{name}" in mangled), None)


def embedded_ptx(library: Path) -> str:
    """The PTX inside the library's fatbin: via cuobjdump when installed, else by unpacking its zstd frames."""
    cuobjdump = shutil.which("cuobjdump") or (Path(build.find_nvcc()).parent / "cuobjdump")
    if cuobjdump and os.access(cuobjdump, os.X_OK):
        return subprocess.run([str(cuobjdump), "--dump-ptx", str(library)], capture_output=True, text=True,
                              check=True).stdout
    zstandard = pytest.importorskip("zstandard", reason="neither cuobjdump nor zstandard to read the fatbin")
    data, texts = library.read_bytes(), []
    for frame in re.finditer(rb"\x28\xb5\x2f\xfd", data):  # zstd frame magic
        try:
            text = zstandard.ZstdDecompressor().decompressobj().decompress(data[frame.start():])
        except zstandard.ZstdError:
            continue
        if b".version" in text[:4096]:
            texts.append(text.decode(errors="replace"))
    return "".join(texts)


@needs_nvcc
def test_every_kernel_compiles_for_sm90_and_sm100_without_spills_or_stack_frames(built):
    report = ptxas.parse_ptxas_report(built.log)
    seen = {(f"sm_{arch}", name): 0 for arch in ARCHS for name in KERNELS}
    for kernel in report:
        assert (kernel.spill_stores, kernel.spill_loads, kernel.stack_frame) == (0, 0, 0), kernel
        assert kernel.registers <= 128, kernel  # occupancy: the row kernels are bounded to 64 by launch bounds
        seen[kernel.arch, family(kernel.name)] += 1
    assert seen == {(f"sm_{arch}", name): n for arch in ARCHS for name, n in KERNELS.items()}


@needs_nvcc
def test_library_embeds_ptx_and_moves_rows_in_16_byte_vectors(built):
    ptx = embedded_ptx(built.library)
    bodies = dict(re.findall(r"\.entry (\S+)\((.*?)\n}", ptx, flags=re.S))
    assert len(bodies) == sum(KERNELS.values())
    vector_kernels = [name for name in bodies
                      if re.search(r"permute_scatter_kernelI5uint4|"
                                   r"unpermute(_backward)?_kernelI(ff?Li4|(13__nv_bfloat16|6__half)(S\d*_)?Li8)E", name)]
    assert len(vector_kernels) == 7  # the 16-byte paths: permute's copy, unpermute and its backward x 3 dtypes
    for name in vector_kernels:
        assert re.search(r"ld\.global\.nc\.v4\.\w32", bodies[name]), name  # 4 x 32 bits = 16 bytes per access
        assert re.search(r"st\.global\.v4\.\w32", bodies[name]), name


@needs_nvcc
def test_library_exports_the_c_abi_and_loads_without_a_driver(built):
    nm = shutil.which("nm")
    if nm:
        symbols = subprocess.run([nm, "-D", "--defined-only", str(built.library)], capture_output=True, text=True,
                                 check=True).stdout
        exported = set(re.findall(r" T (marin_\w+)", symbols))
        assert exported == set(library.SIGNATURES)  # noqa: SLF001 - the table that mirrors the header
    lib = library.open_library(built.library)  # dlopen + ABI version check
    assert lib.marin_kernels_abi_version() == library.ABI_VERSION
    assert lib.marin_cuda_error_string(0) == b"no error"
    # the scratch of permute: a [tile][expert] histogram of 1024-entry tiles plus one count per expert
    assert lib.marin_permute_workspace_bytes(4096, 8, 384) == 4 * (32 + 1) * 384
    assert lib.marin_permute_workspace_bytes(1, 1, 7) == 4 * (1 + 1) * 7


@needs_nvcc
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-driver path; a GPU is present")
def test_launcher_without_a_gpu_returns_an_error_instead_of_crashing(built):
    lib = library.open_library(built.library)
    err = lib.marin_route_topk(None, 0, None, 1, 8, 2, 0, 1.0, 1, 1, 1, None, None, None, None, None)
    assert err != 0
    assert lib.marin_cuda_error_string(err).decode()  # e.g. "CUDA driver version is insufficient ..."
    invalid = lib.marin_route_topk(None, 0, None, 1, 513, 2, 0, 1.0, 1, 1, 1, None, None, None, None, None)
    assert invalid == 1  # cudaErrorInvalidValue: E > 512 is refused before touching the device


@needs_nvcc
def test_builds_are_cached_by_content(built, tmp_path):
    again = build.build_library(out_dir=built.library.parent, archs=ARCHS)
    assert again.cached and again.library == built.library and again.log == built.log
    assert (built.library.parent / "libmarin_kernels.so").resolve() == built.library
    copy = tmp_path / "cuda"
    shutil.copytree(build.cuda_dir(), copy, ignore=shutil.ignore_patterns("build"))
    flags, version = build.nvcc_flags(["90"]), "nvcc 13"
    before = build._source_hash(copy, flags, version)  # noqa: SLF001
    (copy / "permute.cuh").write_text((copy / "permute.cuh").read_text() + "\n// edited\n")
    assert build._source_hash(copy, flags, version) != before  # noqa: SLF001
    assert build._source_hash(copy, build.nvcc_flags(["80", "90"]), version) != before  # noqa: SLF001


@needs_nvcc
def test_make_cuda_command_builds_into_the_build_dir(built):
    env = dict(os.environ, MARIN_CUDA_BUILD_DIR=str(built.library.parent), MARIN_CUDA_ARCHS=";".join(ARCHS))
    done = subprocess.run([sys.executable, "-m", "marin_model.cuda", "--build"], capture_output=True, text=True,
                          env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"cached: {built.library}" in done.stdout
    assert "0 bytes of spills/stack frames" in done.stdout


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(build, "find_nvcc", lambda: None)
    with pytest.raises(build.KernelBuildError, match="nvcc not found"):
        build.build_library()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a machine without a GPU")
def test_without_a_gpu_dispatch_keeps_the_reference(monkeypatch):
    monkeypatch.delenv("MARIN_CUDA_KERNELS", raising=False)
    assert dispatch.register_cuda_kernels() is False
    assert "no CUDA device" in dispatch.status()["reason"]
    monkeypatch.setenv("MARIN_CUDA_KERNELS", "require")
    with pytest.raises(build.KernelBuildError, match="no CUDA device"):
        dispatch.register_cuda_kernels()
    monkeypatch.setenv("MARIN_CUDA_KERNELS", "off")
    assert dispatch.register_cuda_kernels() is False and dispatch.status()["reason"] == "MARIN_CUDA_KERNELS=off"
    ids, *_ = torch.ops.marin.route_topk(torch.tensor([[0.0, 2.0, 1.0]]), None, 2, "sigmoid", 1.0, True, 1, 1)
    assert ids.tolist() == [[1, 2]]


@needs_nvcc
@pytest.mark.skipif(torch.cuda.is_available(), reason="passes host pointers to the launchers: only without a GPU")
def test_entry_points_pass_arguments_the_launchers_accept(built, monkeypatch):
    """Every entry point's argument list against the launcher's ctypes signature, on a machine with no GPU:
    the call must reach the launcher (ctypes rejects a wrong count or type) and come back with its CUDA error.
    Only the device guard and the stream lookup of ``_launch`` are replaced; without a driver the launchers
    fail before touching the (host) pointers."""
    monkeypatch.setattr(library, "_lib", library.open_library(built.library))
    monkeypatch.setattr(dispatch, "_launch", lambda name, device, *args: dispatch._call(name, *args, None))
    g = torch.Generator().manual_seed(0)
    logits, x = torch.randn(6, 7, generator=g), torch.randn(6, 16, generator=g)
    ids, weights = torch.randint(0, 7, (6, 2), generator=g, dtype=torch.int32), torch.rand(6, 2, generator=g)
    routed, row_of, src_of, _ = ops.permute(x, ids, 7, 4, 0)
    calls = {
        "marin_route_topk": lambda: dispatch.route_topk(logits, torch.zeros(7), 2, "sigmoid", 2.5, True, 1, 1),
        "marin_route_topk_backward": lambda: dispatch.route_topk_backward(weights, torch.zeros(6), logits, ids,
                                                                         weights, "softmax_topk", 1.0, False),
        "marin_permute": lambda: dispatch.permute(x.bfloat16(), ids, 7, 4, 0),
        "marin_unpermute": lambda: dispatch.unpermute(routed, row_of, src_of, weights),
        "marin_unpermute_backward": lambda: dispatch.unpermute_backward(x, routed, row_of, src_of, None),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=rf"{name} failed: CUDA error [1-9]"):
            call()


# ------------------------------------------------------------------------------ toolchain and driver choice
def test_the_pypi_toolchain_is_found_where_its_wheels_put_nvcc(tmp_path, monkeypatch):
    """``pip install "nvidia-cuda-nvcc==13.*"`` puts nvcc in site-packages/nvidia/cu13/bin (checked against
    the 13.5 wheels); the CUDA 12 wheels' nvidia/cuda_nvcc/bin has only ptxas."""
    for folder in ("cu13/bin", "cuda_nvcc/bin"):
        (tmp_path / "nvidia" / folder).mkdir(parents=True)
    (tmp_path / "nvidia" / "cu13" / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (tmp_path / "nvidia" / "cu13" / "bin" / "nvcc").chmod(0o755)
    (tmp_path / "nvidia" / "cuda_nvcc" / "bin" / "ptxas").write_text("")
    spec = build.importlib.util.spec_from_loader("nvidia", loader=None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "nvidia")]
    monkeypatch.setattr(build.importlib.util, "find_spec", lambda name: spec if name == "nvidia" else None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for name in ("MARIN_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(name, raising=False)
    assert str(tmp_path / "nvidia" / "cu13" / "bin" / "nvcc") in build.nvcc_candidates()


def test_nvcc_is_chosen_to_match_torchs_cuda_major():
    versions = {"/usr/local/cuda/bin/nvcc": "Cuda compilation tools, release 13.0, V13.0.88",
                "/opt/cuda-12.8/bin/nvcc": "Cuda compilation tools, release 12.8, V12.8.93"}
    assert build.choose_nvcc(versions, "13.0") == ("/usr/local/cuda/bin/nvcc", "")
    assert build.choose_nvcc(versions, "12.6") == ("/opt/cuda-12.8/bin/nvcc", "")  # not the first one found
    assert build.choose_nvcc(versions, None)[0] == "/usr/local/cuda/bin/nvcc"  # CPU torch: any will do
    path, why = build.choose_nvcc({"/usr/local/cuda/bin/nvcc": versions["/usr/local/cuda/bin/nvcc"]}, "12.4")
    assert path is None and "conda-forge cuda-nvcc=12" in why and "only ptxas" in why and "CUDA 13" in why
    path, why = build.choose_nvcc({"/opt/cuda-12.8/bin/nvcc": versions["/opt/cuda-12.8/bin/nvcc"]}, "13.0")
    assert path is None and 'pip install "nvidia-cuda-nvcc==13.*" nvidia-cuda-cccl' in why
    assert build.choose_nvcc({}, "12.4")[0] is None
    assert build.nvcc_major("release 12.8, V12.8.93") == 12 and build.nvcc_major("garbage") is None


def test_default_archs_are_hopper_and_blackwell_where_nvcc_has_them():
    assert build.default_archs() == ["90", "100"] or os.environ.get("MARIN_CUDA_ARCHS")
    flags = build.nvcc_flags(["90", "100"])
    assert "arch=compute_90,code=sm_90" in flags and "arch=compute_100,code=sm_100" in flags
    assert flags[-1] == "arch=compute_100,code=compute_100"  # PTX of the newest, for later GPUs
    listed_12_6 = "compute_50\ncompute_80\ncompute_90\n"
    assert build.supported_archs(["90", "100"], listed_12_6) == ["90"]  # sm_100 needs CUDA 12.8+
    assert build.supported_archs(["90", "100"], "compute_90\ncompute_100\ncompute_120\n") == ["90", "100"]


def test_driver_must_be_of_the_runtimes_major_or_newer():
    assert library.driver_supports(13000, 13000) and library.driver_supports(13000, 13020)
    assert not library.driver_supports(13000, 12080)  # r570 cannot run the statically linked CUDA 13 runtime
    assert library.driver_supports(12080, 12020)  # minor version compatibility within CUDA 12
    assert library.driver_supports(12040, 13000)
    assert not library.driver_supports(12040, 0)  # no driver at all


@needs_nvcc
def test_library_reports_its_runtime_and_kernel_occupancy(built):
    lib = library.open_library(built.library)
    runtime, driver = library.cuda_versions(lib)
    assert runtime // 1000 == build.nvcc_major(subprocess.run([build.find_nvcc(), "--version"], capture_output=True,
                                                              text=True).stdout)
    rows = library.kernel_occupancy(lib)
    assert len(rows) == 8 and all(threads in (128, 256, 512) for _, threads, _ in rows)
    if not torch.cuda.is_available():
        assert driver == 0 and all(blocks == -1 for *_, blocks in rows)
