"""SIGTERM (a scheduler's stop) and SIGINT (Ctrl-C) during ``marin-train``: every rank finishes its step, one
checkpoint is written, the exit code is 143 or 130 with no traceback, and the same command resumes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_train import corpus  # noqa: F401 - a fixture

from marin_train.seal import verify_checkpoint

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["--steps", "1000", "--log-every", "1", "--batch-size", "2", "--seq-len", "32"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def start(argv: list[str]) -> subprocess.Popen:
    """``argv`` with its output piped, killed if it outlives a bound (so that a hang fails, never waits)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.watchdog = threading.Timer(300, proc.kill)
    proc.watchdog.daemon = True
    proc.watchdog.start()
    return proc


def signal_at(proc: subprocess.Popen, pattern: str, signum: int) -> tuple[int, str, str]:
    """Read the run's log until a line matches ``pattern``, send ``signum`` to the run, then wait for it to end.
    Returns its exit code, its whole stdout and its stderr."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if re.search(pattern, line):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=300)
    proc.watchdog.cancel()
    return proc.returncode, "".join(lines) + out, err


def stopped_step(out: str, run: Path) -> int:
    """The step the log says the run stopped after; its checkpoint is the run's latest, and intact."""
    found = re.search(r"stopped by a signal after step (\d+): checkpoint (\S+); the same command resumes", out)
    step = int(found.group(1))
    assert found.group(2) == str(run / f"step-{step:08d}") and (run / "latest").read_text() == f"step-{step:08d}"
    verify_checkpoint(run / f"step-{step:08d}")
    return step


def resume_one_more_step(argv: list[str], step: int) -> None:
    resumed = subprocess.run([*argv, "--until", str(step + 1)], capture_output=True, text=True, cwd=ROOT,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from " in resumed.stdout and f" at step {step}\n" in resumed.stdout
    assert f"done: step {step + 1};" in resumed.stdout


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_finishes_the_step_writes_a_checkpoint_and_the_same_command_resumes(corpus, tmp_path, signum, code):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "marin_train", "--data", str(corpus.root), *TRAIN, "--checkpoint-dir", str(run)]
    rc, out, err = signal_at(start(argv), r"^step +2/1000", signum)
    assert rc == code, err[-4000:]
    assert f"{signal.Signals(signum).name}: finishing this step, then writing a checkpoint" in err
    assert "Traceback" not in out + err and "Abort" not in err
    step = stopped_step(out, run)
    assert step >= 2 and f"stopped: step {step};" in out
    resume_one_more_step(argv, step)


@pytest.mark.parametrize("flags, signum, says", [
    ([], signal.SIGTERM, "SIGTERM: stopping now; no --checkpoint-dir, so nothing is saved"),
    (["--checkpoint-dir", "{run}", "--no-checkpoint-on-signal"], signal.SIGINT,
     "SIGINT: stopping now; nothing since the last checkpoint is saved (--no-checkpoint-on-signal)")])
def test_where_nothing_is_to_be_saved_a_signal_stops_at_once_and_says_so(corpus, tmp_path, flags, signum, says):
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "marin_train", "--data", str(corpus.root), *TRAIN,
            *(f.format(run=run) for f in flags)]
    rc, out, err = signal_at(start(argv), r"^step +2/1000", signum)
    assert rc == 128 + signum and says in err, err[-4000:]
    assert "Traceback" not in out + err and "stopped by a signal" not in out and not (run / "latest").exists()


SECOND = """
import os, signal
from marin_train.signals import StopSignals
with StopSignals(checkpoint=True) as stop:
    os.kill(os.getpid(), signal.SIGINT)
    while not stop.requested():  # the handler runs between two bytecodes of this thread
        pass
    print("asked to stop", flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    while True:
        pass
"""


def test_a_second_signal_ends_the_process_at_once():
    done = subprocess.run([sys.executable, "-c", SECOND], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 130 and done.stdout == "asked to stop\n"
    assert done.stderr.splitlines() == [
        "SIGINT: finishing this step, then writing a checkpoint (a second signal stops at once, without one)",
        "SIGINT again: stopping now; nothing since the last checkpoint is saved"]


@pytest.mark.slow
def test_under_torchrun_sigterm_stops_every_rank_after_the_same_step_with_one_checkpoint(corpus, tmp_path):
    """torchrun forwards the SIGTERM it gets to each rank; the ranks agree on the step through its all-reduce.
    torchrun itself then ends with its own exception (its code, not a rank's)."""
    run = tmp_path / "run"
    args = ["--data", str(corpus.root), *TRAIN, "--checkpoint-dir", str(run)]
    rc, out, err = signal_at(start([*TORCHRUN, "-m", "marin_train", *args]), r"^step +2/1000", signal.SIGTERM)
    assert "[rank" not in out + err and err.count("Traceback") == err.count("SignalException: Process"), err[-4000:]
    step = stopped_step(out, run)  # sealed: both ranks wrote and hashed their shards
    assert out.count("stopped by a signal") == 1 and rc != 0  # rank 0 logs
    resume_one_more_step([sys.executable, "-m", "marin_train", *args], step)  # one process takes it on


def test_ctrl_c_outside_a_run_s_own_handlers_is_one_line_and_130(monkeypatch, capsys, tmp_path):
    """Before the run installs its handlers (or in another command), SIGINT raises KeyboardInterrupt as usual."""
    import marin_train.cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what Python's own SIGINT handler raises

    monkeypatch.setattr(marin_train.cli, "run_training", interrupted)
    with pytest.raises(SystemExit) as exit_:
        marin_train.cli.main(["--data", str(tmp_path), "--steps", "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 130 and err.strip().endswith("Aborted.") and "Traceback" not in err
