"""Levanter's ``BatchSchedule`` (``levanter/schedule.py``): which global indices step ``s`` reads, and the
rescaling of a ``[step, weights]`` mixture schedule to global indices (``rescale_mixture_schedule_for_batch_
schedule``). Step ``s`` reads ``[offset(s), offset(s) + batch_size(s))``; one index is one sequence."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchSchedule"]


@dataclass(frozen=True)
class BatchSchedule:
    """``[(start_step, batch_size), ...]``, the first starting at step 0."""

    segments: tuple[tuple[int, int], ...]

    def _segment(self, step: int) -> tuple[int, int, int]:
        """(start step, batch size, global offset at its start) of the segment holding ``step``."""
        offset = 0
        for n, (start, size) in enumerate(self.segments):
            last = n + 1 == len(self.segments)
            until = None if last else self.segments[n + 1][0]
            if last or step < until:
                return start, size, offset
            offset += (until - start) * size
        raise AssertionError("unreachable: the last segment is open-ended")

    def batch_size(self, step: int) -> int:
        return self._segment(step)[1]

    def offset(self, step: int) -> int:
        """The first global index step ``step`` reads."""
        start, size, offset = self._segment(step)
        return offset + (step - start) * size

    def indices(self, step: int) -> range:
        start = self.offset(step)
        return range(start, start + self.batch_size(step))

    def step_of(self, index: int) -> int:
        """The step that reads global index ``index``."""
        offset = 0
        for n, (start, size) in enumerate(self.segments):
            if n + 1 == len(self.segments):
                return start + (index - offset) // size
            span = (self.segments[n + 1][0] - start) * size
            if index < offset + span:
                return start + (index - offset) // size
            offset += span
        raise AssertionError("unreachable")
