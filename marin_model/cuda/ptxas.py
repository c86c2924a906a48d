"""Read the ptxas report (``nvcc -Xptxas -v``) of a build: registers, stack frames and spills per kernel."""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

__all__ = ["KernelResources", "parse_ptxas_report"]


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel's line in the ptxas report."""

    name: str  # mangled
    arch: str  # "sm_90"
    registers: int
    stack_frame: int  # bytes; > 0 means local memory
    spill_stores: int
    spill_loads: int


def parse_ptxas_report(log: str) -> list[KernelResources]:
    """Reads ``nvcc -Xptxas -v`` output into one record per compiled kernel (entry function)."""
    found: list[KernelResources] = []
    current: Optional[dict] = None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line):
            current = {"name": m.group(1), "arch": m.group(2)}
        elif current is None:
            continue
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.update(stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif m := re.search(r"Used (\d+) registers", line):
            found.append(KernelResources(registers=int(m.group(1)), **current))
            current = None
    return found
