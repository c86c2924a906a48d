"""Done markers and records: JSON written canonically (sorted keys, one form per value), read leniently.

A step of a build leaves a marker beside its output once the output is complete, so a re-run skips it; the
subset's record of its inputs (``sources/<subset>.json``) uses the same form, so equal content means equal
bytes. A marker that cannot be read is treated as absent: the step is done again.
"""

from __future__ import annotations

import json
from pathlib import Path

from marin_data.fileio.untrusted_json import loads

__all__ = ["canonical", "read_marker"]


def canonical(doc: object) -> bytes:
    """``doc`` as the indented, key-sorted JSON every marker and record is written as."""
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def read_marker(path: Path) -> dict | None:
    """The marker at ``path``, or None when it is missing or unreadable (its step is then redone)."""
    try:
        return loads(path.read_bytes())
    except (OSError, ValueError):
        return None
