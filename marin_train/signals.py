"""SIGTERM and SIGINT during a run: finish the step, write a checkpoint, exit 143 or 130.

SLURM and Kubernetes stop a job with SIGTERM (and SIGKILL a grace period later); Ctrl-C sends SIGINT.
`StopSignals` turns the first one into a request that the training loop reads once per step, with the
step's own all-reduce, so every rank stops after the same step and writes the same checkpoint. A second
signal, or the first where nothing would be saved (no checkpoint directory, or ``checkpoint=False``), ends
the process at once with the same exit code, 128 + the signal's number, and one line instead of a
traceback. ``torchrun`` starts each rank in a session of its own and forwards the signal it gets to every
rank once, so a Ctrl-C at its terminal reaches each rank once too.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

import torch.distributed as dist

__all__ = ["StopSignals", "exit_code"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by ``signum``: 143 for SIGTERM, 130 for SIGINT."""
    return 128 + signum


def _say(line: str) -> None:
    """One line on stderr from rank 0, written straight to the file descriptor: a signal handler may run
    while ``sys.stdout`` is half way through a write, and Python's buffered files refuse a nested one."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))
    if rank == 0:
        os.write(2, (line + "\n").encode())


class StopSignals:
    """Handlers for SIGTERM and SIGINT while a run trains (a context manager, main thread only).

    Args:
        checkpoint: the first signal asks the loop to stop after its step and write a checkpoint; False ends
            the process at once (nothing since the last checkpoint is saved, and the line says so).
        unsaved: what the line says is lost when ``checkpoint`` is False (e.g. "no --checkpoint-dir, so
            nothing is saved").
    """

    def __init__(self, *, checkpoint: bool, unsaved: str = "nothing since the last checkpoint is saved") -> None:
        self.checkpoint = checkpoint
        self.unsaved = unsaved
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for s in SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def requested(self) -> bool:
        """Whether a signal asked the run to stop (read by the loop once per step)."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self._exit(signum, f"{name} again: stopping now; nothing since the last checkpoint is saved")
        if not self.checkpoint:
            self._exit(signum, f"{name}: stopping now; {self.unsaved}")
        self.signum = signum
        _say(f"{name}: finishing this step, then writing a checkpoint (a second signal stops at once, without one)")

    @staticmethod
    def _exit(signum: int, line: str) -> None:
        """End the process now: what was printed reaches its files, then ``os._exit`` (no cleanup can hang on
        a rank that is gone; every checkpoint file is written atomically, so none is left half written)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, RuntimeError):
                pass
        _say(line)
        os._exit(exit_code(signum))
