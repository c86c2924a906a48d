"""Where a corpus has been published: ``mirrors.json`` beside the manifest, outside the chain of trust.

Publishing the same data to one more place must not change the digest users pinned, so the places live
here and not in ``manifest.json``; which Hub repo holds which subset is fixed in the manifest itself
(``Manifest.repos``), decided when the corpus is committed. Nothing reads this file for integrity: it only
feeds the datasheet's and ``info``'s list of mirrors and their download commands. Publish adds a place only
after every file reached it and the store's own checksums matched the manifest, so a failed publish leaves
no phantom mirror. The file stays local (publish does not upload it) and is rewritten atomically under the
corpus lock; a missing or unreadable one reads as "published nowhere".

Each record is ``{"url": "s3://bucket/prefix"|"hf://datasets/org/name", "subsets": [...]}`` plus the
non-default endpoint the store was reached at (``endpoint_url`` for S3, ``endpoint`` for the Hub).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from marin_data.fileio.atomic import atomic_write_bytes
from marin_data.layout import MIRRORS
from marin_data.fileio.untrusted_json import loads

__all__ = ["read_mirrors", "record_mirrors"]

_LIMIT = 1 << 20  # a list of places, never more


def read_mirrors(root: str | os.PathLike) -> list[dict]:
    """The recorded places, sorted by URL; [] when none are recorded or the file is not a list of records."""
    path = Path(root) / MIRRORS
    try:
        if path.stat().st_size > _LIMIT:
            return []
        doc = loads(path.read_bytes())
    except (OSError, ValueError):
        return []
    if not isinstance(doc, list):
        return []
    return [m for m in doc if isinstance(m, dict) and isinstance(m.get("url"), str)]


def record_mirrors(root: str | os.PathLike, records: list[dict]) -> None:
    """Add ``records`` (replacing any with the same URL); the caller holds the corpus lock."""
    mine = {r["url"] for r in records}
    kept = [m for m in read_mirrors(root) if m["url"] not in mine]
    mirrors = sorted([*kept, *records], key=lambda m: m["url"])
    atomic_write_bytes(Path(root) / MIRRORS, (json.dumps(mirrors, indent=2, sort_keys=True) + "\n").encode())
