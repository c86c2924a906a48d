"""The kernels' per-element logic, compiled for the CPU, against the reference ops (no GPU, no nvcc needed).

cuda/*.cuh hold every decision the kernels make (the tie rule, group limiting, gates and their gradients,
tile ranks, the scans, padding offsets) as functions that a plain C++ compiler builds too.
tests/cuda_host/harness.cpp replays each kernel's algorithm with them, emulating the warp primitives lane by
lane, and this file checks the result against marin_model/ops.py's CPU reference: integer outputs exactly,
floats within fp32 tolerance.
"""

import ctypes
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from marin_model import ops

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ slow references
def slow_topk_ids(score_E, k):
    """The tie rule, spelled out: larger first, equal -> lower id, NaN after everything (then by id)."""
    return sorted(range(len(score_E)), key=lambda e: (math.isnan(score_E[e]), -score_E[e] if not math.isnan(score_E[e]) else 0, e))[:k]


def slow_counting_sort(ids_N, num_experts, align, capacity):
    """Entries in flat order appended to their expert's list (unless dropped), groups padded: (rows, offsets)."""
    groups = [[] for _ in range(num_experts)]
    for flat, e in enumerate(ids_N):
        if 0 <= e < num_experts and (capacity == 0 or len(groups[e]) < capacity):
            groups[e].append(flat)
    row_of, offsets = [-1] * len(ids_N), [0]
    for e, flats in enumerate(groups):
        for rank, flat in enumerate(flats):
            row_of[flat] = offsets[-1] + rank
        offsets.append(offsets[-1] + -(-len(flats) // align) * align)
    return row_of, offsets


# ------------------------------------------------------------------------------------------------ harness
@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++/c++ or $CXX) to build the host harness")
    out = tmp_path_factory.mktemp("harness") / "libharness.so"
    cmd = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{ROOT / 'cuda'}",
           str(ROOT / "tests" / "cuda_host" / "harness.cpp"), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(out))
    P, I, L, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    signatures = {
        "host_route_topk": (I, (P, P, L, I, I, I, F, I, I, I, P, P, P, P)),
        "host_route_topk_backward": (None, (P, P, P, P, L, I, I, I, F, I, P)),
        "host_permute": (I, (P, L, I, I, I, I, P, P, P)),
        "host_better": (I, (F, I, F, I)),
        "host_group_score": (F, (P, I)),
        "host_expert_of_row": (I, (P, I, L)),
        "host_padded_count": (I, (I, I)),
        "host_vpt_for": (I, (I,)),
    }
    for name, (restype, argtypes) in signatures.items():
        getattr(lib, name).restype, getattr(lib, name).argtypes = restype, argtypes
    return lib


def _p(array):
    return None if array is None else array.ctypes.data_as(ctypes.c_void_p)


MODES = {"sigmoid": 0, "softmax_topk": 1, "topk_softmax": 2}


def host_route_topk(lib, logits, bias, k, mode, scale, renormalize, n_group, topk_group):
    T, E = logits.shape
    x = np.ascontiguousarray(logits.numpy(), dtype=np.float32)
    b = None if bias is None else np.ascontiguousarray(bias.numpy(), dtype=np.float32)
    ids, weights = np.zeros((T, k), np.int32), np.zeros((T, k), np.float32)
    counts, lse = np.zeros(E, np.int32), np.zeros(T, np.float32)
    assert lib.host_route_topk(_p(x), _p(b), T, E, k, MODES[mode], scale, renormalize, n_group, topk_group,
                               _p(ids), _p(weights), _p(counts), _p(lse)) == 0
    return [torch.from_numpy(a) for a in (ids, weights, counts, lse)]


def host_permute(lib, expert_ids, num_experts, align, capacity):
    T, K = expert_ids.shape
    R = ops.permute_rows(T, K, num_experts, align)
    ids = np.ascontiguousarray(expert_ids.numpy(), dtype=np.int32)
    row_of, src_of, offsets = np.zeros((T, K), np.int32), np.full(R, -7, np.int32), np.zeros(num_experts + 1, np.int32)
    uncovered = lib.host_permute(_p(ids), T, K, num_experts, align, capacity, _p(row_of), _p(src_of), _p(offsets))
    assert uncovered == 0, f"{uncovered} routed rows written zero or several times"
    return torch.from_numpy(row_of), torch.from_numpy(src_of), torch.from_numpy(offsets)


def assert_routes_equal(got, want):
    ids, weights, counts, lse = got
    want_ids, want_weights, want_counts, want_lse = want
    assert torch.equal(ids, want_ids)
    assert torch.equal(counts, want_counts)
    torch.testing.assert_close(weights, want_weights, rtol=2e-5, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(lse, want_lse, rtol=2e-6, atol=1e-6, equal_nan=True)


# ------------------------------------------------------------------------------------------------ tie rule
ADVERSARIAL = [1.0, float("nan"), -math.inf, 0.0, -0.0, math.inf, 1.0, float("nan"), -math.inf, 1e-38, -1.0, math.inf]


def test_tie_rule_is_the_stable_sort_of_the_reference(harness):
    order = torch.sort(-torch.tensor(ADVERSARIAL), stable=True).indices.tolist()
    assert order == slow_topk_ids(ADVERSARIAL, len(ADVERSARIAL))
    position = {e: i for i, e in enumerate(order)}
    for a, va in enumerate(ADVERSARIAL):
        for b, vb in enumerate(ADVERSARIAL):
            if a != b:
                assert harness.host_better(va, a, vb, b) == (position[a] < position[b]), (va, a, vb, b)


def test_group_score_is_the_sum_of_the_top_two_and_nan_wins(harness):
    def score(values):
        array = np.array(values, np.float32)
        return harness.host_group_score(_p(array), len(values))

    assert score([3.0, 1.0, 2.0]) == 5.0
    assert score([-4.0]) == -4.0
    assert score([2.0, 2.0, 2.0]) == 4.0
    assert score([-math.inf, -math.inf]) == -math.inf
    assert math.isnan(score([1.0, float("nan"), 5.0]))  # torch.topk ranks NaN highest


def test_scores_per_lane_cover_every_expert_count(harness):
    for E in range(1, 513):
        vpt = harness.host_vpt_for(E)
        assert 32 * vpt >= E and (vpt == 1 or 16 * vpt < E)
    assert harness.host_vpt_for(513) == 0


# ---------------------------------------------------------------------------------------------- route_topk
ROUTE_CASES = [  # (E, k, n_group, topk_group)
    (7, 1, 1, 1), (7, 5, 1, 1), (32, 8, 1, 1), (33, 2, 1, 1), (64, 8, 8, 3), (257, 8, 1, 1),
    (256, 8, 8, 4), (384, 8, 1, 1), (384, 16, 12, 6), (512, 16, 1, 1), (512, 8, 512, 16),
]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("E,k,n_group,topk_group", ROUTE_CASES)
def test_route_topk_equals_the_reference(harness, mode, E, k, n_group, topk_group):
    gen = torch.Generator().manual_seed(E * 131 + k)
    logits = torch.randn(37, E, generator=gen) * 3
    bias = torch.randn(E, generator=gen) * (0.01 if mode == "softmax_topk" else 1.0)
    for use_bias, renormalize in ((False, True), (True, True), (True, False)):
        b = bias if use_bias else None
        args = (k, mode, 2.5, renormalize, n_group, topk_group)
        assert_routes_equal(host_route_topk(harness, logits, b, *args), ops.route_topk(logits, b, *args))
        ids = host_route_topk(harness, logits, b, *args)[0]
        if n_group == 1:  # and the tie rule, spelled out
            score = torch.softmax(logits, -1) if mode == "softmax_topk" else logits
            score = score + bias if use_bias else score
            assert ids.tolist() == [slow_topk_ids(row, k) for row in score.tolist()]


@pytest.mark.parametrize("mode", ["sigmoid", "topk_softmax"])
def test_route_topk_ties_go_to_the_lower_expert(harness, mode):
    gen = torch.Generator().manual_seed(5)
    logits = torch.randint(0, 3, (64, 257), generator=gen).float()  # many exact ties
    bias = torch.randint(-1, 2, (257,), generator=gen).float()  # ties that only appear after the bias
    for b, groups in ((None, (1, 1)), (bias, (1, 1)), (bias, (257, 30))):
        args = (8, mode, 1.0, True, *groups)
        assert_routes_equal(host_route_topk(harness, logits, b, *args), ops.route_topk(logits, b, *args))
    flat = torch.zeros(4, 384)  # all equal: ids 0..k-1
    assert host_route_topk(harness, flat, None, 16, mode, 1.0, True, 1, 1)[0].tolist() == [list(range(16))] * 4


def test_route_topk_softmax_ties_survive_the_softmax(harness):
    logits = torch.randint(0, 4, (32, 64), generator=torch.Generator().manual_seed(1)).float()
    args = (8, "softmax_topk", 1.0, True, 8, 2)
    assert_routes_equal(host_route_topk(harness, logits, None, *args), ops.route_topk(logits, None, *args))


def test_route_topk_infinities_and_nan_follow_the_reference(harness):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(16, 40, generator=gen)
    logits[0, :] = -math.inf  # a row with nothing to choose: ids 0..k-1, gates NaN after renormalising
    logits[1, ::3] = -math.inf
    logits[2, [4, 9]] = math.inf
    logits[3, [1, 2]] = float("nan")  # NaN sorts last: never chosen while anything else remains
    logits[4, :38] = float("nan")
    for mode in ("sigmoid", "topk_softmax"):
        want = ops.route_topk(logits, None, 4, mode, 1.0, True, 1, 1)
        got = host_route_topk(harness, logits, None, 4, mode, 1.0, True, 1, 1)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
        torch.testing.assert_close(got[1][5:], want[1][5:])  # rows without NaN or inf weights
        torch.testing.assert_close(got[3][[0, 1, 5]], want[3][[0, 1, 5]])


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("E,k", [(7, 1), (7, 5), (64, 8), (384, 8), (512, 16)])
def test_route_topk_backward_equals_the_reference(harness, mode, renormalize, E, k):
    gen = torch.Generator().manual_seed(E + k)
    logits = torch.randn(23, E, generator=gen)
    ids, weights, _, _ = ops.route_topk(logits, None, k, mode, 2.5, renormalize, 1, 1)
    grad_w, grad_lse = torch.randn(23, k, generator=gen), torch.randn(23, generator=gen)
    want = ops.route_topk_backward(grad_w, grad_lse, logits, ids, weights, mode, 2.5, renormalize)
    got = np.zeros((23, E), np.float32)
    arrays = [np.ascontiguousarray(t.numpy()) for t in (grad_w, grad_lse, logits, ids)]
    harness.host_route_topk_backward(*map(_p, arrays), 23, E, k, MODES[mode], 2.5, renormalize, _p(got))
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------------------------------------- permute
PERMUTE_CASES = [  # (T, K, E): T*K > 1024 spans several tiles of the ranking kernel, > 16384 several scan batches
    (1, 1, 7), (1, 5, 7), (37, 2, 7), (300, 5, 257), (700, 2, 384), (300, 16, 512), (129, 8, 512), (2100, 8, 384),
]


@pytest.mark.parametrize("align,capacity", [(1, 0), (8, 0), (16, 3), (1, 1)])
@pytest.mark.parametrize("T,K,E", PERMUTE_CASES)
def test_permute_is_the_stable_counting_sort_of_the_reference(harness, T, K, E, align, capacity):
    gen = torch.Generator().manual_seed(T * K + E)
    ids = torch.randint(-1, E, (T, K), generator=gen, dtype=torch.int32)  # -1 = dropped
    row_of, src_of, offsets = host_permute(harness, ids, E, align, capacity)
    _, want_row_of, want_src_of, want_offsets = ops.permute(torch.zeros(T, 1), ids, E, align, capacity)
    assert torch.equal(row_of, want_row_of) and torch.equal(src_of, want_src_of)
    assert torch.equal(offsets, want_offsets)
    slow_rows, slow_offsets = slow_counting_sort(ids.reshape(-1).tolist(), E, align, capacity)
    assert row_of.reshape(-1).tolist() == slow_rows and offsets.tolist() == slow_offsets


@pytest.mark.parametrize("capacity", [0, 100])
def test_permute_all_tokens_to_one_expert(harness, capacity):
    ids = torch.full((1500, 2), 6, dtype=torch.int32)  # 3000 entries: three tiles, one expert
    row_of, src_of, offsets = host_permute(harness, ids, 7, 4, capacity)
    _, want_row_of, want_src_of, want_offsets = ops.permute(torch.zeros(1500, 1), ids, 7, 4, capacity)
    assert torch.equal(row_of, want_row_of) and torch.equal(src_of, want_src_of)
    assert torch.equal(offsets, want_offsets)


def test_permute_counts_ids_outside_the_experts_as_dropped(harness):
    ids = torch.tensor([[0, 9], [-5, 1], [2, 7]], dtype=torch.int32)  # E = 7: 9, -5 and 7 are out of range
    row_of, src_of, offsets = host_permute(harness, ids, 7, 2, 0)
    clean = torch.where((ids >= 0) & (ids < 7), ids, -1)
    _, want_row_of, want_src_of, want_offsets = ops.permute(torch.zeros(3, 1), clean, 7, 2, 0)
    assert torch.equal(row_of, want_row_of) and torch.equal(src_of, want_src_of)
    assert torch.equal(offsets, want_offsets)


def test_padding_rows_map_to_their_group_even_past_empty_groups(harness):
    offsets = np.array([0, 0, 4, 4, 4, 12, 12], np.int32)  # experts 0, 2, 3 and 5 empty
    owners = {row: e for e in range(6) for row in range(offsets[e], offsets[e + 1])}
    for row in range(20):
        assert harness.host_expert_of_row(_p(offsets), 6, row) == owners.get(row, 6)
    assert [harness.host_padded_count(n, 8) for n in (0, 1, 8, 9)] == [0, 8, 8, 16]
