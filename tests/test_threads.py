"""Torch's intra-op threads in a process of ``marin-train``: ``--threads``, else ``OMP_NUM_THREADS``, else one
under torchrun whatever the process count, else the usable cores less one for the loader; the first log line of
``marin-train`` says what was chosen."""

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


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (16, 15)])
def test_a_lone_process_takes_the_usable_cores_less_one_for_the_loader(cores, threads):
    choice = choose_threads(environ={}, cores=cores)
    assert choice.threads == threads and f"{cores} usable cores" in choice.reason


@pytest.mark.parametrize("local", ["1", "2", "4", "8"])
def test_under_torchrun_every_process_takes_one_thread_whatever_the_process_count(local):
    """One process and several compute the same bits only at one count: torchrun itself sets
    OMP_NUM_THREADS=1 for several processes and nothing for one."""
    choice = choose_threads(environ={"LOCAL_WORLD_SIZE": local}, cores=16)
    assert choice.threads == 1 and "torchrun" in choice.reason


def test_omp_num_threads_wins_over_torchrun_s_rule_and_is_named():
    choice = choose_threads(environ={"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "1"}, cores=16)
    assert choice.threads == torch.get_num_threads() and "OMP_NUM_THREADS=3" in choice.describe()


def test_the_threads_flag_wins_over_everything_and_is_named():
    choice = choose_threads(2, environ={"OMP_NUM_THREADS": "3", "LOCAL_WORLD_SIZE": "4"}, cores=16)
    assert choice.threads == 2 and choice.describe() == "torch intra-op threads: 2 (--threads 2)"
    with pytest.raises(ValueError, match="--threads must be >= 1"):
        choose_threads(0, environ={}, cores=4)


def test_a_malformed_local_world_size_is_refused_by_name():
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE='two'"):
        choose_threads(environ={"LOCAL_WORLD_SIZE": "two"}, cores=4)


def test_the_cores_counted_are_the_affinity_mask_s_not_the_machine_s():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from marin_train.threads import choose_threads; print(choose_threads(environ={}).reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("1 usable cores")


@pytest.mark.parametrize("flag", [None, 3])
def test_marin_train_sets_the_threads_and_says_so_first(corpus, capsys, monkeypatch, flag):  # noqa: F811
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    expected = choose_threads(flag)
    before = torch.get_num_threads()
    torch.set_num_threads(expected.threads + 1)  # not what it will choose
    try:
        with pytest.raises(SystemExit) as exit_:
            main(["--data", str(corpus.root), "--steps", "1", "--batch-size", "2", "--seq-len", "32",
                  *(["--threads", str(flag)] if flag else [])])
        assert exit_.value.code == 0
        assert torch.get_num_threads() == expected.threads
    finally:
        torch.set_num_threads(before)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == expected.describe()
    assert any(line.startswith("time to first step: ") for line in lines)
