"""A run's data schedule in one file: mixture phases by optimizer step, rounded to whole mixture blocks.

A schedule file (YAML or JSON; ``marin-train --schedule FILE``, ``python -m marin_train.plan --schedule FILE``)::

    steps: 390251            # optimizer steps of the run
    global_batch: 11264      # sequences per optimizer step (batch x accumulation x ranks must equal it)
    seq_len: 4096            # tokens per sequence
    mixture_block: 49152     # sequences per mixture block; each phase starts on a block boundary
    phases:                  # the first starts at step 0; each runs until the next starts, the last to the end
      - {name: pretrain, start_step: 0, weights: {"pretrain/*": 1.0}}
      - {name: midtrain, start_step: 312192, weights: {"pretrain/*": 0.7, "midtrain/*": 0.3}}
    packing: overlap         # optional: "overlap" (the default) or "levanter" (marin_data.loader.packing)
    val_fraction: 0.001      # optional: the held-out fraction, in [0, 0.5] (default 0.001)

A phase starting at step ``s`` starts at sequence ``s * global_batch`` rounded to the nearest whole number of
blocks (halves up), in exact integer arithmetic; the file maps onto the loader's schedule
(`marin_data.loader.Phase` lists, ``LoaderConfig.mixture_block``) with every bounded phase a whole number of
blocks, which the loader keeps as it is. The loader raises a phase's block to ``ceil(1/w)`` for its smallest
weight ``w``; a schedule whose weights would move a boundary that way is refused when the run starts
(`check_loader`). Weights map subset names, parents or globs to relative weights, as ``--mixture`` does.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from marin_data.errors import InvalidScheduleError
from marin_data.loader.mixture import Mixture, Phase
from marin_data.loader.packing import PACKINGS

__all__ = ["Schedule", "SchedulePhase", "load_schedule", "round_to_block"]

_KEYS = {"steps", "global_batch", "seq_len", "mixture_block", "phases"}
_OPTIONAL = {"packing", "val_fraction"}  # the run's DataConfig fields of the same names
_PHASE_KEYS = {"start_step", "weights"}
_MAX_BYTES = 1 << 20  # a schedule is a few lines; refuse to buffer anything larger


def round_to_block(sequences: int, block: int) -> int:
    """``sequences`` rounded to the nearest multiple of ``block``, halves up (exact integers)."""
    return (2 * sequences + block) // (2 * block) * block


@dataclass(frozen=True)
class SchedulePhase:
    start_step: int  # the optimizer step it starts at, before rounding to a block
    weights: Mapping[str, float]
    name: str = ""


@dataclass(frozen=True)
class Schedule:
    """A schedule file, checked (`load_schedule`). Sequences count from the start of the run."""

    steps: int
    global_batch: int
    seq_len: int
    mixture_block: int
    phases: tuple[SchedulePhase, ...]
    packing: str | None = None  # None: the run's (--packing, else the default)
    val_fraction: float | None = None  # None: the run's (--val-fraction, else the default)
    source: str = ""  # the file it was read from, for messages

    @property
    def sequences(self) -> int:
        """Sequences the run trains on: ``steps * global_batch``."""
        return self.steps * self.global_batch

    def starts(self) -> list[int]:
        """The first sequence of each phase: its start step's, rounded to a whole number of blocks."""
        return [round_to_block(p.start_step * self.global_batch, self.mixture_block) for p in self.phases]

    def lengths(self) -> list[int]:
        """Sequences each phase serves within the run (the last ends with it)."""
        ends = [*self.starts()[1:], self.sequences]
        return [e - s for s, e in zip(self.starts(), ends)]

    def loader_phases(self) -> list[Phase]:
        """The loader's schedule: each phase but the last bounded by a whole number of blocks, the last open."""
        lengths = self.lengths()
        return [Phase(dict(p.weights), lengths[k] if k < len(self.phases) - 1 else None)
                for k, p in enumerate(self.phases)]

    def data_fields(self) -> dict[str, Any]:
        """The optional keys the file sets, as `DataConfig` fields (``packing``, ``val_fraction``)."""
        return {k: getattr(self, k) for k in sorted(_OPTIONAL) if getattr(self, k) is not None}

    def check_loader(self, mixture: Mixture) -> None:
        """Refuse a loader whose mixture starts a phase elsewhere than `starts` (a weight under 1/block).

        Raises:
            InvalidScheduleError: naming the phase, where the schedule and the loader start it, and its block.
        """
        for k, (want, phase) in enumerate(zip(self.starts(), mixture.phases)):
            if phase.start != want:
                raise InvalidScheduleError(
                    f"phase {k} starts at sequence {want:,} by the schedule, at {phase.start:,} by the loader, whose "
                    f"block for phase {k - 1} is {mixture.phases[k - 1].block:,} sequences (a weight under "
                    f"1/{self.mixture_block:,}): raise mixture_block to a multiple of it, or that weight",
                    path=self.source, expected=want, actual=phase.start)


def load_schedule(path: str | os.PathLike) -> Schedule:
    """Read and check a schedule file (module docstring).

    Raises:
        InvalidScheduleError: unreadable, not YAML/JSON, unknown or missing keys, counts that are not positive
            whole numbers, phases that do not start at step 0 and increase, a phase past the run's end, two
            phases that round to the same block, weights that are not a mapping of names to numbers >= 0, a
            packing the loader does not know, a held-out fraction outside [0, 0.5].
    """
    where = str(path)
    try:
        raw = Path(path).read_bytes()[:_MAX_BYTES + 1]
    except OSError as e:
        raise InvalidScheduleError(f"cannot be read: {e.strerror or e}", path=where) from e
    if len(raw) > _MAX_BYTES:
        raise InvalidScheduleError(f"is larger than {_MAX_BYTES} bytes: not a schedule", path=where)
    try:
        doc = json.loads(raw) if where.endswith(".json") else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidScheduleError(f"is not valid {'JSON' if where.endswith('.json') else 'YAML'}: "
                                   f"{str(e).splitlines()[0]}", path=where) from e
    if not isinstance(doc, dict):
        raise InvalidScheduleError("must be a mapping with keys " + ", ".join(sorted(_KEYS)), path=where)
    _check_keys(doc, _KEYS, _OPTIONAL, "the schedule", where)
    counts = {k: doc[k] for k in _KEYS - {"phases"}}
    for key, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidScheduleError(f"{key} must be a whole number >= 1, got {value!r}", path=where)
    if not isinstance(doc["phases"], list) or not doc["phases"]:
        raise InvalidScheduleError("phases must be a non-empty list", path=where)
    phases = tuple(_phase(p, k, where) for k, p in enumerate(doc["phases"]))
    schedule = Schedule(phases=phases, source=where, **counts, **_data_fields(doc, where))
    _check_order(schedule)
    return schedule


def _data_fields(doc: dict, where: str) -> dict[str, Any]:
    """The optional keys of ``doc`` that are set, checked as the loader checks them (`_OPTIONAL`)."""
    out = {k: doc[k] for k in _OPTIONAL if doc.get(k) is not None}
    if "packing" in out and (not isinstance(out["packing"], str) or out["packing"] not in PACKINGS):
        raise InvalidScheduleError(f"packing must be one of {', '.join(PACKINGS)}, got {out['packing']!r}",
                                   path=where)
    fraction = out.get("val_fraction", 0)
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not 0 <= fraction <= 0.5:
        raise InvalidScheduleError(f"val_fraction must be a number in [0, 0.5], got {fraction!r}", path=where)
    if "val_fraction" in out:
        out["val_fraction"] = float(fraction)
    return out


def _check_keys(doc: dict, keys: set[str], optional: set[str], what: str, where: str) -> None:
    unknown, missing = set(doc) - keys - optional, keys - set(doc)
    if unknown or missing:
        raise InvalidScheduleError(f"{what}: " + "; ".join(
            ([f"unknown keys {sorted(unknown)}"] if unknown else []) + ([f"missing {sorted(missing)}"] if missing
                                                                         else [])), path=where)


def _phase(doc: object, k: int, where: str) -> SchedulePhase:
    if not isinstance(doc, dict):
        raise InvalidScheduleError(f"phase {k} must be a mapping with start_step and weights", path=where)
    _check_keys(doc, _PHASE_KEYS, {"name"}, f"phase {k}", where)
    step, weights = doc["start_step"], doc["weights"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise InvalidScheduleError(f"phase {k}: start_step must be a whole number >= 0, got {step!r}", path=where)
    if not isinstance(weights, dict) or not weights or not all(
            isinstance(n, str) and isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
            and w >= 0 for n, w in weights.items()):
        raise InvalidScheduleError(f"phase {k}: weights must map subset names or globs to numbers >= 0, got "
                                   f"{weights!r}", path=where)
    return SchedulePhase(step, {n: float(w) for n, w in weights.items()}, str(doc.get("name", "")))


def _check_order(schedule: Schedule) -> None:
    where, phases = schedule.source, schedule.phases
    if phases[0].start_step != 0:
        raise InvalidScheduleError(f"the first phase must start at step 0, not {phases[0].start_step}", path=where)
    steps = [p.start_step for p in phases]
    if steps != sorted(set(steps)):
        raise InvalidScheduleError(f"phases must start at increasing steps, got {steps}", path=where)
    if steps[-1] >= schedule.steps:
        raise InvalidScheduleError(f"phase {len(steps) - 1} starts at step {steps[-1]}, at or after the run's end "
                                   f"({schedule.steps} steps)", path=where)
    starts = schedule.starts()
    for k, (a, b) in enumerate(zip(starts, starts[1:])):
        if a >= b:
            raise InvalidScheduleError(f"phases {k} and {k + 1} both start at sequence {b:,} once rounded to blocks "
                                       f"of {schedule.mixture_block:,}: move them apart", path=where)
    if starts[-1] >= schedule.sequences:
        raise InvalidScheduleError(f"the last phase starts at sequence {starts[-1]:,} once rounded to a block, at "
                                   f"or after the run's end ({schedule.sequences:,})", path=where)

