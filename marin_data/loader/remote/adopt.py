"""What a remote shard cache takes over when it starts in a directory an earlier run used: the complete
decodes it left (``decoded/<sha[:2]>/<sha>/``, sealed, no partial file in it), which the cache then serves
without fetching them again once a shard of its corpus turns out to have that digest. Everything else is
deleted: the fetched files not yet decoded (``fetch/``) and partial decodes. The cache's budget takes them in
oldest first out (`marin_data.loader.remote.budget.Budget.adopt`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from marin_data.loader.cache import sealed
from marin_data.loader.remote.budget import dir_bytes

__all__ = ["found_decodes"]


def found_decodes(root: Path, fetch_root: Path) -> list[tuple[float, str, int]]:
    """``(mtime, sha256, bytes)`` of each complete decode under ``root``; partial files under it and everything
    under ``fetch_root`` deleted."""
    shutil.rmtree(fetch_root, ignore_errors=True)
    found = []
    for d in sorted((root / "decoded").glob("??/*")):
        if not sealed(d) or any(p.name.endswith(".part") for p in d.iterdir()):
            shutil.rmtree(d, ignore_errors=True)
            continue
        found.append((d.stat().st_mtime, d.name, dir_bytes(d)))
    return found
