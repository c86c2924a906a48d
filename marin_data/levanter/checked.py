"""What an unpinned download checked, recorded beside the copy (`marin_data.layout.CHECKED`).

Nothing pins a Levanter cache fetched from its store, so each file is checked against every digest the
store vouched for (`marin_data.stores.checksums`: S3's checksums and plain-MD5 ETags, GCS's
``x-goog-hash``, the Hub's LFS SHA-256) or, where it vouched for none, by its size only. The download
writes, per file: its size, the SHA-256 of the bytes put in place, the store's digests, and ``checked``:
the strongest digest compared with the source, or ``size-only``. ``verify`` re-hashes the copy against it
(a bit flipped later is found), and ``adopt`` refuses a file that changed since and states, per file,
whether its digest was checked against the source or first seen locally.

The file is local bookkeeping, like ``.marin-download.json``: a listing may not name it, and no cache
reader sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from concurrent.futures import ThreadPoolExecutor

from marin_data.corpus.verify import Problem, ProblemKind
from marin_data.errors import CacheFormatError
from marin_data.fileio.atomic import atomic_write_bytes, sha256_file
from marin_data.layout import CHECKED
from marin_data.levanter.jsonio import parse_json
from marin_data.stores.checksums import STRENGTH, strongest

__all__ = ["SIZE_ONLY", "Checked", "read_checked", "write_checked", "checked_entry", "recheck"]

SIZE_ONLY = "size-only"
_HEX = re.compile(r"[0-9a-f]{8,64}")


@dataclass(frozen=True)
class Checked:
    """One file's entry: what arrived and what the source vouched for it."""

    bytes: int
    sha256: str  # computed locally, of the bytes put in place
    vouched: Mapping[str, str]  # algorithm -> hex, as the store gave them
    checked: str  # the strongest of ``vouched`` (each was compared), or SIZE_ONLY

    @property
    def against_source(self) -> bool:
        return self.checked != SIZE_ONLY

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.sha256, "vouched": dict(sorted(self.vouched.items())),
                "checked": self.checked}


def checked_entry(size: int, sha256: str, vouched: Mapping[str, str]) -> Checked:
    """The entry of a file of ``size`` bytes with local ``sha256`` that passed every digest of ``vouched``."""
    return Checked(size, sha256, dict(vouched), strongest(vouched) or SIZE_ONLY)


def read_checked(root: str | Path) -> tuple[str, dict[str, Checked]] | None:
    """``(source URL, path -> entry)`` of the record in ``root``; None when there is none.

    Raises:
        CacheFormatError: a record that is not one (a damaged file is not silently ignored).
    """
    path = Path(root) / CHECKED
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    where = str(path)
    doc = parse_json(data, where)
    files, source = doc.get("files"), doc.get("source")
    if not isinstance(files, dict) or not isinstance(source, str):
        raise CacheFormatError("not a download record: expected 'source' and 'files'", path=where)
    return source, {rel: _entry(rel, e, where) for rel, e in files.items()}


def write_checked(root: str | Path, source: str, entries: Mapping[str, Checked], *, keep: Iterable[str] = ()) -> None:
    """Write the record of ``root``: ``entries``, and the earlier record's entries for the paths of ``keep``
    (files of other cells, fetched by an earlier run)."""
    earlier = read_checked(root)
    kept = {p: e for p, e in (earlier[1] if earlier else {}).items() if p in set(keep) and p not in entries}
    files = {p: e.to_json() for p, e in sorted({**kept, **entries}.items())}
    atomic_write_bytes(Path(root) / CHECKED, json.dumps({"source": source, "files": files}, indent=1).encode())


def recheck(root: str | Path, entries: Mapping[str, Checked], cells: Iterable[str], *,
            workers: int = 4) -> tuple[list[Problem], int, int]:
    """Re-hash the recorded files of ``cells`` ("" for a single cache) under ``root`` against the record: the
    findings (a file missing, of another size, or with another SHA-256), files hashed and bytes hashed."""
    prefixes = tuple(f"{c}/" for c in cells if c)
    chosen = [(p, e) for p, e in sorted(entries.items()) if not prefixes or p.startswith(prefixes)]

    def one(item: tuple[str, Checked]) -> tuple[Problem | None, int]:
        rel, e = item
        try:
            digest, size = sha256_file(Path(root) / rel)
        except FileNotFoundError:
            return Problem(rel, ProblemKind.MISSING, f"recorded in {CHECKED}, not on disk"), 0
        if size != e.bytes:
            kind = ProblemKind.TRUNCATED if size < e.bytes else ProblemKind.OVERSIZED
            return Problem(rel, kind, f"{size} bytes, {e.bytes} when it was downloaded ({CHECKED})"), size
        if digest != e.sha256:
            return Problem(rel, ProblemKind.MODIFIED, f"sha256 {digest[:12]}… differs from the {e.sha256[:12]}… "
                                                      f"it had when it was downloaded ({CHECKED})"), size
        return None, size

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(chosen) or 1))) as pool:
        results = list(pool.map(one, chosen))
    return [p for p, _ in results if p is not None], len(chosen), sum(n for _, n in results)


def _entry(rel: str, e: object, where: str) -> Checked:
    ok = (isinstance(e, dict) and type(e.get("bytes")) is int and e["bytes"] >= 0
          and isinstance(e.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", e["sha256"])
          and isinstance(e.get("vouched"), dict)
          and all(a in STRENGTH and isinstance(v, str) and _HEX.fullmatch(v) for a, v in e["vouched"].items())
          and e.get("checked") in (*STRENGTH, SIZE_ONLY))
    if not ok:
        raise CacheFormatError(f"malformed entry for {rel!r}", path=where, actual=str(e)[:200])
    return Checked(e["bytes"], e["sha256"], dict(e["vouched"]), e["checked"])
