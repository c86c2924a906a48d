"""Torch's intra-op threads in a training process: from the usable cores and the node's processes, one core
left to the loader; ``OMP_NUM_THREADS`` wins; the first log line of ``marin-train`` says what was chosen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_train import corpus  # noqa: F401 - a fixture

from marin_train.cli import main
from marin_train.threads import choose_threads

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("cores, local, threads", [(1, None, 1), (2, None, 1), (16, None, 15), (16, "4", 3),
                                                   (8, "8", 1), (6, "4", 1)])
def test_the_cores_are_shared_by_the_node_s_processes_less_one_for_the_loader(cores, local, threads):
    environ = {} if local is None else {"LOCAL_WORLD_SIZE": local}
    choice = choose_threads(environ, cores=cores)
    assert choice.threads == threads and f"{cores} usable cores" in choice.reason


def test_omp_num_threads_wins_and_is_named():
    choice = choose_threads({"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "1"}, cores=16)
    assert choice.threads == torch.get_num_threads() and "OMP_NUM_THREADS=3" in choice.describe()


def test_a_malformed_local_world_size_is_refused_by_name():
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two'"):
        choose_threads({"LOCAL_WORLD_SIZE": "two"}, cores=4)


def test_the_cores_counted_are_the_affinity_mask_s_not_the_machine_s():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from marin_train.threads import choose_threads; print(choose_threads({}).reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("1 usable cores")


def test_marin_train_sets_the_threads_and_says_so_first(corpus, capsys, monkeypatch):  # noqa: F811
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    expected = choose_threads()
    before = torch.get_num_threads()
    torch.set_num_threads(expected.threads + 1)  # not what it will choose
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["--data", str(corpus.root), "--steps", "1", "--batch-size", "2", "--seq-len", "32"])
        assert exit_.value.code == 0
        assert torch.get_num_threads() == expected.threads
    finally:
        torch.set_num_threads(before)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == expected.describe()
    assert any(line.startswith("time to first step: ") for line in lines)
