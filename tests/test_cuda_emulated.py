"""The kernels of cuda/ run on the CPU, from their own source, against the reference ops (no GPU, no nvcc).

tests/cuda_emu builds cuda/*.cu with g++ under a small CUDA execution model (blocks in sequence, the threads
of a block as fibers with real barriers, lock-step warp collectives, garbage-filled shared memory, a random
thread order at every barrier, two multiprocessors holding one block each so grid-stride loops go round).
The library is served through the same Python entry points as the GPU build, so their checks run too; a
subset runs again on the ASan + UBSan and ThreadSanitizer builds. The cases are the ones
tests/test_cuda_ops.py runs on a GPU. What must be bitwise and what has a tolerance is docs/cuda.md's table
("Exactness"): ids, counts, every permute output, unpermute's output and grad_routed bitwise (softmax_topk's
ids up to near-ties); weights, lse and gradients of the logits within fp32 tolerance; NaN compares as NaN.
The unused rows of routed and grad_routed (past offsets[E], src_of -2) are unspecified: not compared, and
checked to be left unwritten.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marin_model import ops

sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_emu"))
from host_build import build_host_library, sanitizer_runtime  # noqa: E402
from op_checks import opcheck_cases, opcheck_specified  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODES = ["sigmoid", "softmax_topk", "topk_softmax"]
WEIGHT_TOL = dict(rtol=2e-5, atol=1e-6)  # fp32 math, another exp and another summation order
LSE_TOL = dict(rtol=2e-6, atol=1e-6)
GRAD_TOL = dict(rtol=1e-4, atol=1e-6)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------- the build
def build_dir() -> Path:
    """One build per checkout, shared by test workers and runs (cached by content)."""
    return Path(os.environ.get("MARIN_EMU_BUILD_DIR") or ROOT / "cuda" / "build" / "host")


def host_build(flavour: str) -> Path:
    """The host build of cuda/ (or of $MARIN_EMU_CUDA_DIR: scripts/mutate_kernels.py) in `flavour`."""
    cuda_dir = os.environ.get("MARIN_EMU_CUDA_DIR")
    return build_host_library(build_dir(), cuda_dir=Path(cuda_dir) if cuda_dir else None, flavour=flavour,
                              extra_flags=tuple(os.environ.get("MARIN_EMU_EXTRA_FLAGS", "").split()))


@pytest.fixture(scope="session")
def host_lib():
    """The host build of cuda/, bound to the entry points (the flavour of $MARIN_EMU_FLAVOUR: the sanitizer
    tests' child processes). A missing g++ fails the suite: without it nothing here would check the kernels."""
    from marin_model.cuda import dispatch

    with dispatch.host_library(host_build(os.environ.get("MARIN_EMU_FLAVOUR", "plain"))) as lib:
        lib.cuda_emu_set_seed.argtypes = (ctypes.c_uint64,)
        lib.cuda_emu_last_grid_blocks.restype = lib.cuda_emu_last_kernel_offset.restype = ctypes.c_uint64
        yield lib


@pytest.fixture(autouse=True)
def _seeded(request):
    """A new thread order and shared-memory garbage per test, reproducible from the test's name (in the tests
    that run kernels: the sanitizer test only starts a child, and needs no plain build)."""
    if {"host_lib", "kern"} & set(request.fixturenames):
        request.getfixturevalue("host_lib").cuda_emu_set_seed(sum(request.node.name.encode()) * 7919)


@pytest.fixture
def kern(host_lib):
    from marin_model.cuda import dispatch

    return dispatch


# ------------------------------------------------------------------------------------------ slow references
def slow_topk_ids(score_E, k):
    """The tie rule, spelled out: larger first, equal -> lower id, NaN after everything (then by id)."""
    return sorted(range(len(score_E)),
                  key=lambda e: (math.isnan(score_E[e]), 0 if math.isnan(score_E[e]) else -score_E[e], e))[:k]


def slow_counting_sort(ids_N, num_experts, align, capacity):
    """Entries in flat order appended to their expert's list (unless dropped), groups padded: (rows, offsets)."""
    groups = [[] for _ in range(num_experts)]
    for flat, e in enumerate(ids_N):
        if 0 <= e < num_experts and (capacity == 0 or len(groups[e]) < capacity):
            groups[e].append(flat)
    row_of, offsets = [-1] * len(ids_N), [0]
    for flat_list in groups:
        for rank, flat in enumerate(flat_list):
            row_of[flat] = offsets[-1] + rank
        offsets.append(offsets[-1] + -(-len(flat_list) // align) * align)
    return row_of, offsets


# ------------------------------------------------------------------------------------------------ comparing
def assert_same_experts(got, want, logits, bias, mode):
    """Ids and counts equal; in softmax_topk a row may differ only where the reference's and the kernel's
    choices score equal within 1e-6 (the probabilities' last bits: docs/cuda.md, "Exactness")."""
    ids, counts, want_ids = got[0], got[2], want[0]
    if mode != "softmax_topk" or torch.equal(ids, want_ids):
        assert torch.equal(ids, want_ids)
        assert torch.equal(counts, want[2])
        return
    rows = (ids != want_ids).any(-1)
    score = torch.softmax(logits.float(), -1) + (0 if bias is None else bias)
    torch.testing.assert_close(score.gather(1, ids.long())[rows], score.gather(1, want_ids.long())[rows],
                               rtol=0, atol=1e-6)
    assert torch.equal(counts, torch.bincount(ids.flatten().long(), minlength=logits.shape[1]).int())


def assert_routes_match(got, want, logits, bias, mode):
    assert_same_experts(got, want, logits, bias, mode)
    same = (got[0] == want[0]).all(-1)
    torch.testing.assert_close(got[1][same], want[1][same], equal_nan=True, **WEIGHT_TOL)
    torch.testing.assert_close(got[3], want[3], equal_nan=True, **LSE_TOL)


def assert_bitwise(got, want):
    """Equal tensors, NaN equal to any NaN (a NaN's bits are not part of the contract)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.is_floating_point():
        nan = torch.isnan(got)
        assert torch.equal(nan, torch.isnan(want))
        assert torch.equal(got[~nan], want[~nan])
    else:
        assert torch.equal(got, want)


def assert_permute_bitwise(got, want):
    """permute's outputs bitwise, routed's only before offsets[E]: the unused rows past it are unspecified."""
    used = int(want[3][-1])
    assert got[0].shape == want[0].shape
    assert_bitwise(got[0][:used], want[0][:used])
    for a, b in zip(got[1:], want[1:]):
        assert_bitwise(a, b)


def used_rows(src_of):
    """The rows of routed and grad_routed the contract specifies: all but the unused ones (src_of -2)."""
    return src_of != -2


def assert_grid_looped(host_lib, tokens):
    """The latest launch, a persistent route kernel (a token per warp, 4 warps a block), had fewer warps than
    tokens: its grid-stride loop went round, so a loop that skips or repeats a stride fails the test."""
    assert host_lib.cuda_emu_last_grid_blocks() * 4 < tokens


@functools.lru_cache(maxsize=None)
def kernel_symbols(library: str) -> dict:
    """Offset in `library` -> name (template arguments included) of its functions, as nm gives them."""
    listing = subprocess.run(["nm", "--defined-only", "-C", library], capture_output=True, text=True, check=True)
    rows = (line.split(" ", 2) for line in listing.stdout.splitlines())
    return {int(row[0], 16): row[2] for row in rows if len(row) == 3}


def assert_launched(host_lib, pattern):
    """The kernel of the latest emulated launch, named with its template arguments (the access width among
    them), matches the regular expression `pattern`."""
    name = kernel_symbols(host_lib._name)[host_lib.cuda_emu_last_kernel_offset()]  # noqa: SLF001 - its path
    assert re.search(pattern, name), name


# ---------------------------------------------------------------------------------------------- route_topk
ROUTE_SHAPES = [  # (E, k, n_group, topk_group): every scores-per-lane path (1, 2, 4, 8, 12, 16)
    (7, 1, 1, 1), (7, 5, 1, 1), (32, 8, 1, 1), (64, 8, 8, 3), (65, 4, 1, 1), (100, 6, 4, 2), (129, 8, 1, 1),
    (256, 8, 8, 4), (257, 16, 1, 1), (384, 8, 1, 1), (384, 16, 12, 6), (385, 8, 5, 2), (512, 16, 1, 1),
    (512, 8, 16, 4), (512, 8, 512, 64),  # the last: groups of one, as many as the warp's scratch row holds
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E,k,n_group,topk_group", ROUTE_SHAPES)
def test_route_topk_equals_the_reference(kern, host_lib, E, k, n_group, topk_group, mode):
    g = gen(E * 131 + k)
    logits = torch.randn(21, E, generator=g) * 3
    bias = torch.randn(E, generator=g) * (0.01 if mode == "softmax_topk" else 1.0)
    for b, renormalize in ((None, True), (bias, False)):
        args = (k, mode, 2.5, renormalize, n_group, topk_group)
        got, want = kern.route_topk(logits, b, *args), ops.route_topk(logits, b, *args)
        assert_grid_looped(host_lib, 21)
        assert_routes_match(got, want, logits, b, mode)
        if n_group == 1 and mode != "softmax_topk":  # and the tie rule, spelled out
            score = logits + b if b is not None else logits
            assert got[0].tolist() == [slow_topk_ids(row, k) for row in score.tolist()]


@pytest.mark.parametrize("resident,blocks", [("3", 6), ("1", 2), ("100", 16), ("0", 16), ("-1", 16)])
def test_route_grid_holds_the_blocks_that_can_be_resident_and_routes_the_same(kern, host_lib, monkeypatch,
                                                                              resident, blocks):
    """Two emulated SMs; 200 tokens would take 50 blocks of 4 warps. The persistent grid holds what can be
    resident at once, at most 8 per SM; a zero or failed occupancy answer falls back to 8 per SM."""
    monkeypatch.setenv("CUDA_EMU_RESIDENT_BLOCKS", resident)
    logits = torch.randn(200, 64, generator=gen(11)) * 3
    args = (6, "sigmoid", 2.5, True, 1, 1)
    got = kern.route_topk(logits, None, *args)
    assert host_lib.cuda_emu_last_grid_blocks() == blocks
    assert_routes_match(got, ops.route_topk(logits, None, *args), logits, None, "sigmoid")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("E,k", [(7, 2), (200, 8), (512, 16)])
def test_route_topk_16_bit_logits(kern, E, k, dtype):
    logits = (torch.randn(33, E, generator=gen(E)) * 2).to(dtype)
    for mode in MODES:
        got, want = kern.route_topk(logits, None, k, mode, 1.0, True, 1, 1), ops.route_topk(logits, None, k, mode,
                                                                                              1.0, True, 1, 1)
        assert_routes_match(got, want, logits, None, mode)


@pytest.mark.parametrize("mode", MODES)
def test_route_topk_ties_go_to_the_lower_expert(kern, mode):
    g = gen(5)
    logits = torch.randint(0, 3, (40, 257), generator=g).float()  # many exact ties
    logits[(logits == 0) & (torch.arange(257) % 2 == 0)] = -0.0  # -0 ties with +0
    bias = torch.randint(-1, 2, (257,), generator=g).float()  # ties that only appear after the bias
    for b, groups in ((None, (1, 1)), (bias, (1, 1)), (bias, (257, 30))):
        args = (8, mode, 1.0, True, *groups)
        assert_routes_match(kern.route_topk(logits, b, *args), ops.route_topk(logits, b, *args), logits, b, mode)
    flat = torch.zeros(4, 384)  # all equal: ids 0..k-1
    assert kern.route_topk(flat, None, 16, mode, 1.0, True, 1, 1)[0].tolist() == [list(range(16))] * 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("E", [40, 300])
def test_route_topk_infinities_and_nan(kern, mode, E):
    logits = torch.randn(12, E, generator=gen(2))
    logits[0, :] = -math.inf  # nothing to choose: ids 0..k-1
    logits[1, ::3] = -math.inf
    logits[2, [4, 9]] = math.inf
    logits[3, [1, 2]] = float("nan")  # NaN sorts last: never chosen while anything else remains
    logits[4, :E - 2] = float("nan")
    logits[5, :] = float("nan")
    logits[6, 0], logits[6, 1:] = float("nan"), -math.inf
    logits[7, :] = math.inf
    got, want = kern.route_topk(logits, None, 4, mode, 1.0, True, 1, 1), ops.route_topk(logits, None, 4, mode,
                                                                                         1.0, True, 1, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], equal_nan=True, **WEIGHT_TOL)
    torch.testing.assert_close(got[3], want[3], equal_nan=True, **LSE_TOL)  # NaN where torch.logsumexp has it


@pytest.mark.parametrize("mode", MODES)
def test_route_topk_nan_in_a_group_under_group_limited_routing(kern, mode):
    """A NaN logit makes its group's score NaN, and a NaN group ranks below every other (as in the reference)."""
    logits = torch.randn(6, 64, generator=gen(8))
    logits[0, 3] = float("nan")  # group 0 of 4
    logits[1, 20:24] = float("nan")  # group 1
    logits[2, ::16] = float("nan")  # every group
    logits[3, 40] = math.inf
    got, want = (op(logits, None, 4, mode, 1.0, True, 4, 2) for op in (kern.route_topk, ops.route_topk))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    torch.testing.assert_close(got[1], want[1], equal_nan=True, **WEIGHT_TOL)


def test_route_topk_one_hot_bias_and_counts_across_blocks(kern):
    bias = torch.zeros(384)
    bias[300] = 1e4  # every token picks expert 300 first
    logits = torch.randn(97, 384, generator=gen(2))  # 97 tokens: 25 blocks of 4 warps on 2 emulated SMs
    got = kern.route_topk(logits, bias, 8, "sigmoid", 1.0, True, 1, 1)
    want = ops.route_topk(logits, bias, 8, "sigmoid", 1.0, True, 1, 1)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]) and got[2][300] == 97


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_topk_backward_equals_the_reference(kern, host_lib, mode, renormalize, dtype):
    g = gen(7)
    for E, k in ((7, 1), (100, 4), (257, 8), (512, 16)):
        logits = torch.randn(19, E, generator=g).to(dtype)
        ids, weights, _, _ = ops.route_topk(logits, None, k, mode, 2.5, renormalize, 1, 1)
        grad_w, grad_lse = torch.randn(19, k, generator=g), torch.randn(19, generator=g)
        got = kern.route_topk_backward(grad_w, grad_lse, logits, ids, weights, mode, 2.5, renormalize)
        assert_grid_looped(host_lib, 19)
        want = ops.route_topk_backward(grad_w, grad_lse, logits, ids, weights, mode, 2.5, renormalize)
        assert got.dtype == dtype
        tol = GRAD_TOL if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-5)
        torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("bad", [8, -1])
def test_route_topk_backward_refuses_expert_ids_that_name_no_expert(kern, bad):
    """The kernel reads each chosen expert's logit, so an id outside [0, E) would read another token's or past
    the logits; the reference raises, and so does the entry point."""
    g = gen(3)
    logits = torch.randn(5, 8, generator=g)
    ids, weights, _, _ = ops.route_topk(logits, None, 2, "sigmoid", 1.0, True, 1, 1)
    ids[4, 1] = bad
    args = (torch.randn(5, 2, generator=g), torch.randn(5, generator=g), logits, ids, weights, "sigmoid", 1.0, True)
    for op in (ops.route_topk_backward, kern.route_topk_backward):
        with pytest.raises(RuntimeError, match="out of bounds|expert_ids"):
            op(*args)


# ------------------------------------------------------------------------------------------------- permute
PERMUTE_CASES = [  # (T, K, E): T*K > 1024 spans several tiles of the ranking kernel
    (1, 1, 7), (37, 2, 7), (300, 5, 257), (129, 8, 512), (2100, 2, 384), (90, 16, 100),
]


@pytest.mark.parametrize("align,capacity", [(1, 0), (8, 0), (16, 3), (128, 0), (1, 1)])
@pytest.mark.parametrize("T,K,E", PERMUTE_CASES)
def test_permute_equals_the_reference_bitwise(kern, T, K, E, align, capacity):
    g = gen(T * K + E)
    x = torch.randn(T, 24, generator=g)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)  # -1 = dropped
    got, want = kern.permute(x, ids, E, align, capacity), ops.permute(x, ids, E, align, capacity)
    assert_permute_bitwise(got, want)
    slow_rows, slow_offsets = slow_counting_sort(ids.reshape(-1).tolist(), E, align, capacity)
    assert got[1].reshape(-1).tolist() == slow_rows and got[3].tolist() == slow_offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [1, 3, 33, 64, 1540])  # row bytes 2..6160: 1- to 16-byte copies; 385 vectors:
# a thread's second round of loads ends exactly at the end of a row
def test_permute_any_row_width_and_offset_views(kern, H, dtype):
    g = gen(H)
    storage = torch.randn(70 * H + 1, generator=g).to(dtype)
    for x in (storage[:-1].view(70, H), storage[1:].view(70, H)):  # aligned, then one element past it
        ids = torch.randint(-1, 7, (70, 3), generator=g, dtype=torch.int32)
        assert_permute_bitwise(kern.permute(x, ids, 7, 4, 0), ops.permute(x, ids, 7, 4, 0))


def test_permute_all_tokens_to_one_expert_and_out_of_range_ids(kern):
    ids = torch.full((1500, 2), 6, dtype=torch.int32)  # 3000 entries: three tiles, one expert
    x = torch.randn(1500, 8, generator=gen(3))
    for capacity in (0, 100):
        assert_permute_bitwise(kern.permute(x, ids, 7, 4, capacity), ops.permute(x, ids, 7, 4, capacity))
    for align in (1, 8):  # a single expert
        ones = torch.zeros(1500, 2, dtype=torch.int32)
        assert_permute_bitwise(kern.permute(x, ones, 1, align, 0), ops.permute(x, ones, 1, align, 0))
    ids = torch.tensor([[0, 9], [-5, 1], [2, 7]], dtype=torch.int32)  # E = 7: 9, -5 and 7 count as dropped
    clean = torch.where((ids >= 0) & (ids < 7), ids, -1)
    x = torch.randn(3, 8, generator=gen(4))
    assert_permute_bitwise(kern.permute(x, ids, 7, 2, 0), ops.permute(x, clean, 7, 2, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("align,capacity", [(4, 0), (128, 0), (16, 3)])
def test_permute_marks_padding_and_unused_rows_and_leaves_unused_rows_unwritten(host_lib, align, capacity, dtype):
    """Called through the C entry point with NaN-filled outputs: padding rows inside a group come back zero
    with src_of -1, the unused rows past offsets[E] keep their NaN and get src_of -2."""
    g = gen(align + capacity)
    T, K, E, H = 50, 3, 9, 8
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    R = ops.permute_rows(T, K, E, align)
    routed, src_of = torch.full((R, H), float("nan"), dtype=dtype), torch.full((R,), 12345, dtype=torch.int32)
    row_of, offsets = torch.empty(T, K, dtype=torch.int32), torch.empty(E + 1, dtype=torch.int32)
    workspace = torch.empty(host_lib.marin_permute_workspace_bytes(T, K, E), dtype=torch.uint8)
    assert host_lib.marin_permute(x.data_ptr(), T, H, x.element_size(), ids.data_ptr(), K, E, align, capacity,
                                  routed.data_ptr(), row_of.data_ptr(), src_of.data_ptr(), offsets.data_ptr(),
                                  workspace.data_ptr(), None) == 0
    want = ops.permute(x, ids, E, align, capacity)
    assert_permute_bitwise((routed, row_of, src_of, offsets), want)
    used = int(offsets[-1])
    assert 0 < used < R and (src_of[used:] == -2).all() and torch.isnan(routed[used:]).all()
    padding = src_of == -1
    assert padding.any() and (routed[padding] == 0).all()


# ----------------------------------------------------------------------------------------------- unpermute
UNPERMUTE_CASES = [(1, 1, 7, 64), (120, 8, 384, 256), (50, 16, 512, 72), (60, 2, 7, 33), (40, 3, 9, 5),
                   (30, 5, 20, 2)]  # (T, K, E, H): H * element size a multiple of 16, of 8, 4 and 2 bytes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("T,K,E,H", UNPERMUTE_CASES)
def test_unpermute_and_backward_equal_the_reference(kern, T, K, E, H, weighted, dtype):
    g = gen(T + H)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(T, 1), ids, E, 8, 0)
    routed = torch.randn(src_of.shape[0], H, generator=g).to(dtype)
    weights = torch.rand(T, K, generator=g) if weighted else None
    assert_bitwise(kern.unpermute(routed, row_of, src_of, weights), ops.unpermute(routed, row_of, src_of, weights))
    grad_out = torch.randn(T, H, generator=g).to(dtype)
    got_routed, got_w = kern.unpermute_backward(grad_out, routed, row_of, src_of, weights)
    want_routed, want_w = ops.unpermute_backward(grad_out, routed, row_of, src_of, weights)
    used = used_rows(src_of)
    assert_bitwise(got_routed[used], want_routed[used])
    torch.testing.assert_close(got_w, want_w, rtol=1e-4, atol=1e-4)  # dots over H in another order


def test_unpermute_offset_views(kern):
    g = gen(9)
    ids = torch.randint(-1, 7, (30, 3), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(30, 1), ids, 7, 4, 0)
    rows = src_of.shape[0]
    storage = torch.randn(rows * 16 + 1, generator=g).bfloat16()
    routed = storage[1:].view(rows, 16)  # 32-byte rows starting 2 bytes past an aligned address
    weights = torch.rand(30, 3, generator=g)
    assert_bitwise(kern.unpermute(routed, row_of, src_of, weights), ops.unpermute(routed, row_of, src_of, weights))
    grad = torch.randn(30 * 16 + 1, generator=g).bfloat16()[1:].view(30, 16)
    (got_routed, got_w), (want_routed, want_w) = (kern.unpermute_backward(grad, routed, row_of, src_of, weights),
                                                  ops.unpermute_backward(grad, routed, row_of, src_of, weights))
    used = used_rows(src_of)
    assert_bitwise(got_routed[used], want_routed[used])
    torch.testing.assert_close(got_w, want_w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("T,K,E,align", [(32, 2, 4, 17), (30, 3, 5, 4)])  # R = 128 rows, then 105
def test_row_kernels_launch_a_block_per_token_and_per_128_rows(kern, host_lib, T, K, E, align):
    """The row kernels' grids: a block per token, plus a block per 128 rows for the padding in permute and
    unpermute's backward. A block more does no harm but takes a slot (only the launch shows it)."""
    g = gen(T)
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    routed, row_of, src_of, _ = kern.permute(torch.randn(T, 8, generator=g), ids, E, align, 0)
    R = routed.shape[0]
    assert host_lib.cuda_emu_last_grid_blocks() == T + -(-R // 128)
    kern.unpermute(routed, row_of, src_of, None)
    assert host_lib.cuda_emu_last_grid_blocks() == T
    kern.unpermute_backward(torch.randn(T, 8, generator=g), routed, row_of, src_of, None)
    assert host_lib.cuda_emu_last_grid_blocks() == T + -(-R // 128)


def widest_vector(most, elements, *operands):
    """The access width the row kernels must take: the largest of most, most/2, ..., 1 elements that divides a
    row of `elements` and for which every operand's base address (ptr, element size) is aligned."""
    vec = most
    while vec > 1 and (elements % vec or any(ptr % (vec * size) for ptr, size in operands)):
        vec //= 2
    return vec


@pytest.mark.parametrize("grad_dtype", ["same", torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("H", [64, 36, 10, 3])
@pytest.mark.parametrize("shift", [0, 1])  # rows that start one element past an aligned address
def test_row_kernels_take_the_widest_access_the_rows_allow(kern, host_lib, H, dtype, grad_dtype, shift):
    """The access width (16, 8, 4, 2 or 1 bytes) changes only the speed, so results cannot show it: the name of
    the launched kernel does."""
    grad_dtype = dtype if grad_dtype == "same" else grad_dtype
    g = gen(H)
    ids = torch.randint(-1, 5, (12, 2), generator=g, dtype=torch.int32)
    x = torch.randn(12 * H + shift, generator=g).to(dtype)[shift:].view(12, H)
    routed, row_of, src_of, _ = kern.permute(x, ids, 5, 4, 0)
    bytes_ = widest_vector(16, H * x.element_size(), (x.data_ptr(), 1), (routed.data_ptr(), 1))
    vector = {16: "uint4", 8: "uint2", 4: "unsigned int", 2: "unsigned short", 1: "unsigned char"}[bytes_]
    assert_launched(host_lib, rf"::permute_scatter_kernel<{vector}>\(")

    routed = torch.randn(routed.numel() + shift, generator=g).to(dtype)[shift:].view(routed.shape)
    out = kern.unpermute(routed, row_of, src_of, None)
    size = routed.element_size()
    vec = widest_vector(16 // size, H, (routed.data_ptr(), size), (out.data_ptr(), size))
    assert_launched(host_lib, rf"::unpermute_kernel<[\w ]+, {vec}>\(")

    grad = torch.randn(12 * H + shift, generator=g).to(grad_dtype)[shift:].view(12, H)
    grad_routed, _ = kern.unpermute_backward(grad, routed, row_of, src_of, None)
    most = 16 // max(size, grad.element_size())
    vec = widest_vector(most, H, (grad.data_ptr(), grad.element_size()), (routed.data_ptr(), size),
                        (grad_routed.data_ptr(), size))
    assert_launched(host_lib, rf"::unpermute_backward_kernel<[\w ]+, [\w ]+, {vec}>\(")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_unpermute_backward_scales_an_fp32_gradient_before_rounding(kern, dtype):
    g = gen(10)
    ids = torch.randint(-1, 9, (40, 4), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(40, 1), ids, 9, 4, 0)
    routed = torch.randn(src_of.shape[0], 24, generator=g).to(dtype)
    weights = torch.rand(40, 4, generator=g)
    grad_out = torch.randn(40, 24, generator=g)  # fp32: the reference rounds w * grad once, to the rows' dtype
    got = kern.unpermute_backward(grad_out, routed, row_of, src_of, weights)
    want = ops.unpermute_backward(grad_out, routed, row_of, src_of, weights)
    used = used_rows(src_of)
    assert_bitwise(got[0][used], want[0][used])
    twice = ops.unpermute_backward(grad_out.to(dtype), routed, row_of, src_of, weights)[0]
    assert not torch.equal(got[0][used], twice[used])  # what casting first would give: the test can tell them apart
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("weighted", [True, False])
def test_unpermute_backward_zeroes_padding_and_leaves_unused_rows_unwritten(host_lib, weighted):
    """Called through the C entry point with a NaN-filled grad_routed: the rows with src_of -1 come back zero,
    those with src_of -2 keep their NaN, the others equal the reference."""
    g = gen(15)
    T, K, E, H = 40, 2, 5, 24
    ids = torch.randint(-1, E, (T, K), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(T, 1), ids, E, 8, 0)
    routed, grad_out = torch.randn(src_of.shape[0], H, generator=g), torch.randn(T, H, generator=g)
    weights = torch.rand(T, K, generator=g) if weighted else None
    grad_routed, grad_w = torch.full_like(routed, float("nan")), torch.zeros(T, K)
    assert host_lib.marin_unpermute_backward(
        grad_out.data_ptr(), 0, routed.data_ptr(), 0, routed.shape[0], H, row_of.data_ptr(), src_of.data_ptr(), T, K,
        None if weights is None else weights.data_ptr(), grad_routed.data_ptr(),
        None if weights is None else grad_w.data_ptr(), None) == 0
    used = used_rows(src_of)
    assert_bitwise(grad_routed[used], ops.unpermute_backward(grad_out, routed, row_of, src_of, weights)[0][used])
    assert (grad_routed[src_of == -1] == 0).all() and torch.isnan(grad_routed[~used]).all()
    assert (src_of == -1).any() and (~used).any()


@pytest.mark.parametrize("hidden", [24, 10])  # 24: torch._grouped_mm runs the experts; 10 (40-byte rows): a loop
def test_experts_between_the_kernels_read_no_unused_row(kern, hidden):
    """permute -> GroupedExperts -> unpermute and back on the kernels, with NaN in every unused row of routed
    and grad_routed (what the kernels may leave there): the output, the input and weight gradients equal the
    reference chain's (autograd through the reference ops), and are finite."""
    from test_moe import unused_rows_case

    experts, E, x, weights, probe, ids = unused_rows_case(30, hidden, seed=16)
    params = [experts.w13_EL2F, experts.w2_EFL]
    routed, row_of, src_of, offsets = kern.permute(x, ids, E, 8, 0)
    routed = routed.masked_fill(~used_rows(src_of)[:, None], float("nan")).requires_grad_()
    y = experts(routed, offsets)
    out = kern.unpermute(y.detach(), row_of, src_of, weights)
    grad_y, grad_w = kern.unpermute_backward(probe, y.detach(), row_of, src_of, weights)
    grad_y.masked_fill_(~used_rows(src_of)[:, None], float("nan"))
    grad_routed, *grad_params = torch.autograd.grad(y, [routed, *params], grad_y)
    got = [out, kern.unpermute(grad_routed, row_of, src_of, None), grad_w, *grad_params]
    x_, weights_ = x.clone().requires_grad_(), weights.clone().requires_grad_()
    ref_routed, ref_row_of, ref_src_of, ref_offsets = ops.permute(x_, ids, E, 8, 0)
    want_out = ops.unpermute(experts(ref_routed, ref_offsets), ref_row_of, ref_src_of, weights_)
    want = [want_out, *torch.autograd.grad((want_out * probe).sum(), [x_, weights_, *params])]
    for a, b in zip(got, want):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@contextlib.contextmanager
def ops_on_the_host_kernels(fill=None):
    """For the duration, CPU tensors take the host build's entry points in the marin:: ops, so opcheck and
    AOTAutograd reach the kernels. ``fill(call, routed_RH, src_of_R)``, when given, then writes into the
    routed and grad_routed outputs of permute and unpermute_backward, once per call."""
    from marin_model.cuda import dispatch

    calls = itertools.count()

    def filled(entry):
        def run(*args):
            out = entry(*args)  # permute: (routed, row_of, src_of, offsets); unpermute_backward: src_of is args[3]
            fill(next(calls), out[0], out[2] if entry is dispatch.permute else args[3])
            return out
        return run

    served = {"route_topk": dispatch.route_topk, "route_topk_backward": dispatch.route_topk_backward,
              "permute": dispatch.permute, "unpermute": dispatch.unpermute,
              "unpermute_backward": dispatch.unpermute_backward}
    if fill is not None:
        served.update(permute=filled(dispatch.permute), unpermute_backward=filled(dispatch.unpermute_backward))
    for name, entry in served.items():
        getattr(ops, name).register_kernel("cpu", entry)
    try:
        yield
    finally:  # back to each op's own body (custom_op keeps it as _init_fn)
        for name in served:
            getattr(ops, name).register_kernel("cpu", getattr(ops, name)._init_fn)  # noqa: SLF001


def fill_unused_rows(value):
    """A fill that writes value(call) into the unused rows (src_of -2): what a GPU may leave there."""
    def fill(call, routed_RH, src_of_R):
        routed_RH[src_of_R == -2] = value(call)
    return fill


@pytest.mark.parametrize("fill", [fill_unused_rows(lambda call: float("nan")),
                                  fill_unused_rows(lambda call: 1000.0 + call)], ids=["nan", "per-call"])
def test_opcheck_on_the_host_kernels(host_lib, fill):
    """tests/test_cuda_ops.py's opcheck, on the kernels built for the host. The unused rows are left
    unwritten, and on a GPU hold whatever the allocator's block held: with NaN, or a value that changes per
    call, there (the contract allows both) the check passes, as it compares only the specified rows."""
    with ops_on_the_host_kernels(fill):
        for op, args in opcheck_cases("cpu"):
            opcheck_specified(op, args)


@pytest.mark.parametrize("op_name", ["permute", "unpermute_backward"])
def test_opcheck_still_sees_a_change_in_a_specified_row(host_lib, op_name):
    """The counterpart: a value that changes per call in the last row before offsets[E] breaks the contract,
    and the check fails on it."""
    def fill(call, routed_RH, src_of_R):
        routed_RH[int((src_of_R != -2).sum()) - 1] = 1000.0 + call

    with ops_on_the_host_kernels(fill):
        op, args = next((op, args) for op, args in opcheck_cases("cpu") if op is getattr(ops, op_name))
        with pytest.raises(AssertionError, match="different in eager-mode PyTorch vs AOTDispatcher"):
            opcheck_specified(op, args)


def test_unpermute_treats_rows_out_of_range_as_dropped(kern):
    g = gen(12)
    ids = torch.randint(0, 7, (25, 3), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(25, 1), ids, 7, 2, 0)
    routed, weights = torch.randn(src_of.shape[0], 8, generator=g), torch.rand(25, 3, generator=g)
    garbage = row_of.clone()
    garbage[::4, 0] = 10**6  # far past R
    garbage[1::5, 2] = -7
    garbage[2, 1] = src_of.shape[0]  # one past the end
    clean = torch.where((garbage >= 0) & (garbage < src_of.shape[0]), garbage, -1)
    assert_bitwise(kern.unpermute(routed, garbage, src_of, weights), ops.unpermute(routed, clean, src_of, weights))
    grad = torch.randn(25, 8, generator=g)
    got_w = kern.unpermute_backward(grad, routed, garbage, src_of, weights)[1]
    torch.testing.assert_close(got_w, ops.unpermute_backward(grad, routed, clean, src_of, weights)[1],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nan_outputs_are_nan(kern, dtype):
    """The contract says NaN, not which NaN: bf16 NaN is 0x7FFF on the GPU (and here), torch's CPU differs."""
    g = gen(14)
    ids = torch.randint(0, 5, (20, 2), generator=g, dtype=torch.int32)
    _, row_of, src_of, _ = ops.permute(torch.zeros(20, 1), ids, 5, 1, 0)
    routed = torch.randn(src_of.shape[0], 16, generator=g).to(dtype)
    routed[row_of[3, 0], :5] = float("nan")
    routed[row_of[4, 1], 7] = float("inf")
    weights = torch.rand(20, 2, generator=g)
    weights[4, 0] = 0.0
    got = kern.unpermute(routed, row_of, src_of, weights)
    assert_bitwise(got, ops.unpermute(routed, row_of, src_of, weights))
    assert torch.isnan(got[3, :5]).all()
    if dtype == torch.bfloat16:
        assert (got[3, :5].view(torch.int16) == 0x7FFF).all()  # the device's canonical NaN, emulated


def test_entry_points_validate_before_allocating_and_for_empty_batches(kern):
    logits = torch.randn(4, 8)
    with pytest.raises(ValueError, match="k must be"):
        kern.route_topk(logits, None, -1, "sigmoid", 1.0, True, 1, 1)
    with pytest.raises(ValueError, match="k must be"):
        kern.route_topk(torch.randn(0, 8), None, 9, "sigmoid", 1.0, True, 1, 1)  # k > E, no tokens
    with pytest.raises(ValueError, match="mode"):
        kern.route_topk(torch.randn(0, 8), None, 2, "softmax", 1.0, True, 1, 1)
    with pytest.raises(ValueError, match="k=9"):
        kern.route_topk_backward(torch.zeros(0, 9), torch.zeros(0), torch.zeros(0, 8),
                                 torch.zeros(0, 9, dtype=torch.int32), torch.zeros(0, 9), "sigmoid", 1.0, True)
    _, row_of, src_of, _ = ops.permute(torch.zeros(0, 1), torch.zeros(0, 2, dtype=torch.int32), 4, 1, 0)
    with pytest.raises(ValueError, match="grad_out"):
        kern.unpermute_backward(torch.zeros(3, 5), torch.zeros(src_of.shape[0], 5), row_of, src_of, None)
    ids, w, counts, lse = kern.route_topk(torch.randn(0, 8), None, 2, "sigmoid", 1.0, True, 1, 1)
    assert ids.shape == (0, 2) and counts.tolist() == [0] * 8 and lse.shape == (0,)


def test_launchers_refuse_invalid_sizes_without_launching(host_lib):
    """The C ABI checks its sizes itself (a caller other than dispatch.py gets cudaErrorInvalidValue, 1) and
    writes nothing then, with buffers large enough that a launch would otherwise succeed."""
    buf = [torch.zeros(4096, dtype=torch.float32) for _ in range(8)]
    p = [ctypes.c_void_p(b.data_ptr()) for b in buf]

    def refused(launcher, *args):
        for b in buf:
            b.fill_(7)
        code, untouched = launcher(*args), all(bool((b == 7).all()) for b in buf)
        for b in buf:
            b.zero_()  # the calls that follow read some of them as ids
        return code == 1 and untouched

    route = lambda T, E, k, mode=0, n_group=1, topk_group=1: host_lib.marin_route_topk(  # noqa: E731
        p[0], 0, None, T, E, k, mode, 1.0, 1, n_group, topk_group, p[1], p[2], p[3], p[4], None)
    assert route(4, 8, 2) == 0 and route(4, 8, 2, 0, 2, 2) == 0  # every group kept is allowed
    buf[3].fill_(7)
    assert route(0, 8, 2) == 0 and buf[3][:8].view(torch.int32).tolist() == [0] * 8  # no tokens: counts zeroed
    for args in ((4, 8, 0), (4, 64, 17), (4, 8, 9), (4, 8, 2, 3), (4, 8, 2, -1), (4, 9, 2, 0, 2), (4, 8, 2, 0, 2, 0),
                 (4, 8, 2, 0, 2, 3), (4, 0, 1), (4, 513, 2)):
        assert refused(route, *args), args
    backward = lambda T, E, k, mode=0: host_lib.marin_route_topk_backward(  # noqa: E731
        p[0], p[1], p[2], 0, p[3], T, E, k, mode, 1.0, 1, p[4], None)
    assert backward(4, 8, 2) == 0 and backward(0, 8, 2) == 0
    for args in ((4, 8, 0), (4, 8, 9), (4, 64, 17), (4, 8, 2, 3)):
        assert refused(backward, *args), args
    permute = lambda T, H, size, K, E, align=1, capacity=0: host_lib.marin_permute(  # noqa: E731
        p[0], T, H, size, p[1], K, E, align, capacity, p[2], p[3], p[4], p[5], p[6], None)
    assert permute(4, 8, 4, 2, 8) == 0 and permute(4, 0, 4, 2, 8) == 0  # rows of width 0 are allowed
    assert permute(4, 8, 4, 2, 1) == 0  # one expert
    assert permute(0, 8, 4, 2, 8) == 0 and permute(4, 8, 4, 0, 8) == 0  # no tokens, no experts per token
    for args in ((4, -1, 4, 2, 8), (4, 8, 0, 2, 8), (4, 8, 4, 17, 8), (4, 8, 4, -1, 8), (4, 8, 4, 2, 0),
                 (4, 8, 4, 2, 513), (4, 8, 4, 2, 8, 0), (4, 8, 4, 2, 8, 1, -1)):
        assert refused(permute, *args), args
    unpermute = lambda R, H, T, K, dtype=0: host_lib.marin_unpermute(  # noqa: E731
        p[0], dtype, R, H, p[1], T, K, None, p[2], None)
    assert unpermute(8, 8, 4, 2) == 0 and unpermute(8, 0, 4, 2) == 0 and unpermute(0, 8, 4, 2) == 0  # empty rows
    assert unpermute(8, 8, 0, 2) == 0  # no tokens
    buf[2].fill_(7)
    assert unpermute(8, 8, 4, 0) == 0 and buf[2][:32].tolist() == [0] * 32  # no experts per token: zeros
    for args in ((-1, 8, 4, 2), (8, -1, 4, 2), (8, 8, 4, -1), (8, 8, 4, 17), (8, 8, 4, 2, 3)):
        assert refused(unpermute, *args), args
    unpermute_backward = lambda R, H, T, K, grad_dtype=0, dtype=0: host_lib.marin_unpermute_backward(  # noqa: E731
        p[0], grad_dtype, p[1], dtype, R, H, p[2], p[3], T, K, None, p[4], None, None)
    assert unpermute_backward(8, 8, 4, 2) == 0 and unpermute_backward(8, 8, 4, 2, 0, 1) == 0  # fp32 grad, bf16 rows
    assert unpermute_backward(0, 8, 4, 2) == 0 and unpermute_backward(8, 0, 4, 2) == 0
    assert unpermute_backward(8, 8, 0, 2) == 0  # no tokens
    assert unpermute_backward(8, 8, 4, 0) == 0
    for args in ((-1, 8, 4, 2), (8, -1, 4, 2), (8, 8, 4, -1), (8, 8, 4, 17), (8, 8, 4, 2, 2, 1), (8, 8, 4, 2, 1, 0)):
        assert refused(unpermute_backward, *args), args


# ---------------------------------------------------------------------------------------- the emulator itself
def test_emulator_reports_deadlocks_and_lanes_that_left_instead_of_hanging(host_lib):
    out = torch.zeros(128, dtype=torch.int32)
    for which, reason in ((0, "deadlock in block"), (1, "exited")):  # before or after the others arrived
        err = host_lib.emu_selftest(which, ctypes.c_void_p(out.data_ptr()))
        assert err == 719  # cudaErrorLaunchFailure
        host_lib.marin_cuda_error_string.restype = ctypes.c_char_p
        assert reason in host_lib.marin_cuda_error_string(err).decode()
    assert host_lib.emu_selftest(2, ctypes.c_void_p(out.data_ptr())) == 0  # threads that returned left the barrier
    assert out[0] == sum(range(64))


def test_emulated_16_bit_conversions_round_like_the_device(host_lib):
    """Round to nearest even, as torch's CPU conversions do, for finite values; NaN is the canonical 0x7FFF."""
    lib = host_lib
    values = torch.cat([torch.randn(4000, generator=gen(1)) * 10.0 ** torch.randint(-9, 6, (4000,), generator=gen(2)),
                        torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, 2.0**-24, 2.0**-25, 3 * 2.0**-25,
                                      float("inf"), -float("inf"), 1.00390625, 1.01171875])])
    for fn, dtype in ((lib.emu_to_bf16, torch.bfloat16), (lib.emu_to_half, torch.float16)):
        out = torch.empty(values.shape, dtype=torch.int16)
        fn(ctypes.c_void_p(values.data_ptr()), ctypes.c_void_p(out.data_ptr()), values.numel())
        assert torch.equal(out, values.to(dtype).view(torch.int16))
        nan = torch.tensor([float("nan"), -float("nan")])
        fn(ctypes.c_void_p(nan.data_ptr()), ctypes.c_void_p(out.data_ptr()), 2)
        assert out[:2].tolist() == [0x7FFF, 0x7FFF]
    halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    back = torch.empty(halves.shape)
    lib.emu_from_half(ctypes.c_void_p(halves.data_ptr()), ctypes.c_void_p(back.data_ptr()), halves.numel())
    assert_bitwise(back, halves.view(torch.float16).float())


def test_occupancy_query_lists_every_kernel_family(host_lib):
    from marin_model.cuda import library

    rows = library.kernel_occupancy(host_lib)
    threads_of = {"route_topk_kernel": 128, "route_topk_backward_kernel": 128, "permute_rank_kernel": 256,
                  "permute_scan_kernel": 512, "permute_scatter_kernel": 128, "unpermute_kernel": 128,
                  "unpermute_backward_kernel": 128}  # the block sizes the launchers use
    assert sorted({name.split("<")[0] for name, _, _ in rows}) == sorted(threads_of)
    for name, threads, blocks in rows:
        assert threads == threads_of[name.split("<")[0]], name
        assert blocks == 1  # the emulation's answer


# ------------------------------------------------------------------------------------------- sanitizers
ASAN_SUBSET = ("equals_the_reference and (512-16-1-1 or 100-6-4-2 or 7-5-1-1) or any_row_width or offset_views or "
               "out_of_range or scales_an_fp32 or nan or one_expert or unwritten or "
               "(unpermute_and_backward and (60-2-7-33 or 30-5-20-2))")
# Every kernel, grouped routing and not, several tiles of permute's ranking, counts summed across blocks.
TSAN_SUBSET = ("route_topk_equals_the_reference and (100-6-4-2 or 7-5-1-1 or 512-8-512-64) and sigmoid or "
               "route_topk_backward and True-sigmoid-dtype0 or one_hot_bias or "
               "permute_equals_the_reference and (37-2-7 or 129-8-512) and (1-0 or 16-3) or "
               "unpermute_and_backward and 60-2-7-33 and True")
SANITIZERS = {  # flavour: (options of its runtime, what a finding prints)
    "asan": (dict(ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:detect_odr_violation=0:abort_on_error=0",
                  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"), ("ERROR: AddressSanitizer", "runtime error:")),
    # one torch thread: torch's own threads synchronise in ways ThreadSanitizer does not see
    "tsan": (dict(TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0", OMP_NUM_THREADS="1"),
             ("WARNING: ThreadSanitizer",)),
}


def sanitizer_env(flavour: str) -> dict:
    """The environment of a child process that loads the `flavour` build (its runtime preloaded: Python itself
    is not instrumented)."""
    runtime = sanitizer_runtime(flavour)
    assert runtime, f"g++ has no runtime for {flavour} (Debian: libasan8, libtsan2): install it"
    host_build(flavour)  # build errors surface here, not in the child
    return dict(os.environ, LD_PRELOAD=runtime, MARIN_EMU_FLAVOUR=flavour, **SANITIZERS[flavour][0])


def run_under_sanitizer(flavour: str, subset: str) -> None:
    """Runs the tests of this file that `subset` selects in a child process on the `flavour` build."""
    if os.environ.get("MARIN_EMU_FLAVOUR"):
        pytest.skip("already a sanitizer run")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-s", "--noconftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", __file__, "-k", subset], env=sanitizer_env(flavour),  # -s: the report
                          capture_output=True, text=True, timeout=600)
    report = done.stdout[-6000:] + done.stderr[-6000:]
    assert done.returncode == 0 and " passed" in done.stdout, report
    assert not any(finding in report for finding in SANITIZERS[flavour][1]), report


@pytest.mark.slow
def test_kernels_are_clean_under_address_and_undefined_behaviour_sanitizers():
    """x86 forgives out-of-bounds and misaligned accesses; ASan and UBSan do not."""
    run_under_sanitizer("asan", ASAN_SUBSET)


@pytest.mark.slow
def test_kernels_have_no_data_race_under_the_thread_sanitizer():
    """A plain read-modify-write where an atomic belongs gives the right answer here, where threads switch
    only at barriers, and loses updates on a GPU; ThreadSanitizer reports it whatever the thread order."""
    run_under_sanitizer("tsan", TSAN_SUBSET)


@pytest.mark.slow
@pytest.mark.parametrize("which,race", [(3, False), (4, True), (5, True)])
def test_thread_sanitizer_build_reports_a_race_the_emulation_forgives(which, race):
    """The self-test kernel counts threads and blocks with atomicAdd (3), with a plain += in shared memory (4)
    or in global memory by the same thread of each block (5): the counts are right in all three, and only
    the last two are reported."""
    if os.environ.get("MARIN_EMU_FLAVOUR"):
        pytest.skip("already a sanitizer run")
    probe = ("import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); out = (ctypes.c_int * 128)(); "
             f"assert lib.emu_selftest({which}, out) == 0 and out[0] == 2 * 128, list(out[:2])")
    done = subprocess.run([sys.executable, "-c", probe, str(host_build("tsan"))], env=sanitizer_env("tsan"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == (66 if race else 0), done.stderr[-4000:]  # 66: ThreadSanitizer found something
    if race:
        assert "SUMMARY: ThreadSanitizer: data race" in done.stderr and "in selftest_kernel" in done.stderr
