"""The record of a partial download: which subsets of which manifest a local copy of a corpus holds.

``download`` writes `RECORD` (``.marin-download.json``) into the directory after ``manifest.json``, listing
only the subsets whose every shard was verified; ``verify`` reads it to check a partial copy against exactly
what it holds. A full corpus has no record.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from marin_data.errors import InvalidManifestError
from marin_data.layout import RECORD
from marin_data.fileio.untrusted_json import loads

__all__ = ["DownloadRecord", "read_download_record"]


@dataclass(frozen=True)
class DownloadRecord:
    """The JSON file `RECORD` in a downloaded directory: which subsets of which manifest it holds.

    Shape: ``{"schema_version": 1, "source": "s3://...", "manifest_sha256": "<hex>",
    "subsets": ["pretrain/code", ...]}``. It is written after ``manifest.json`` and lists only subsets whose
    every shard was verified, so a reader may check exactly those.
    """

    source: str
    manifest_sha256: str
    subsets: tuple[str, ...]
    schema_version: int = 1

    def to_json(self) -> bytes:
        doc = {"schema_version": self.schema_version, "source": self.source,
               "manifest_sha256": self.manifest_sha256, "subsets": sorted(self.subsets)}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def read_download_record(root: str | os.PathLike) -> DownloadRecord | None:
    """The record of a partial download in ``root``; None when there is none (a full corpus)."""
    path = Path(root) / RECORD
    try:
        doc = loads(path.read_bytes())
        return DownloadRecord(source=str(doc["source"]), manifest_sha256=str(doc["manifest_sha256"]),
                              subsets=tuple(str(s) for s in doc["subsets"]),
                              schema_version=int(doc["schema_version"]))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError) as e:
        raise InvalidManifestError(f"malformed download record: {e!r}", path=str(path)) from e
