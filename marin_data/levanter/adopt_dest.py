"""Where the pin of an ``adopt`` of a store goes, and the pin already there.

A `PinPlace` is the pin's destination: a local folder, where the pin is built and committed in place
(`marin_data.corpus.commit.commit_corpus`: the manifest last) with its journal beside it
(`marin_data.levanter.adopt_journal`), or an ``s3://`` prefix or ``hf://`` repo, where it is built in a local
work folder (``--work-dir``; by default one under the user's cache folder named after the destination's
URL, so a re-run finds its journal) and then uploaded: every file the manifest lists, then the manifest (a
Hub repo takes them all in one commit). The journal is removed only once the pin is at its destination: a
run killed while uploading is finished by the next without hashing anything again.

`earlier` reads the pin already at the destination (its manifest, shard index and ``vouched.json``, each
checked against the manifest's digests), so that a later run adds cells to it.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from marin_data.corpus.index import read_shard_index
from marin_data.corpus.manifest import Manifest
from marin_data.corpus.records import ShardRecord
from marin_data.errors import InvalidManifestError
from marin_data.fileio.atomic import sha256_file
from marin_data.fileio.untrusted_json import loads
from marin_data.layout import MANIFEST, SHARDS_INDEX, VOUCHED
from marin_data.stores import open_store
from marin_data.stores.base import METADATA_LIMIT
from marin_data.transfer.read import read_file

__all__ = ["Earlier", "PinPlace", "default_work_dir", "is_remote"]


def is_remote(url: str) -> bool:
    return url.split("://", 1)[0] in ("s3", "hf") and "://" in url


def default_work_dir(url: str) -> Path:
    """``$MARIN_CACHE_DIR/adopt/<digest of url>``, else under ``~/.cache/marin``: one per destination."""
    root = Path(os.environ.get("MARIN_CACHE_DIR") or Path.home() / ".cache" / "marin")
    return root / "adopt" / hashlib.sha256(url.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Earlier:
    """The pin at the destination: its manifest, rows and ``vouched.json`` entries (path -> how vouched)."""

    manifest: Manifest
    rows: tuple[ShardRecord, ...]
    vouched: dict[str, dict]


class PinPlace:
    """The destination ``url`` (a local path, ``s3://``, ``hf://``), opened with ``options``."""

    def __init__(self, url: str, options: dict, work_dir: str | os.PathLike | None = None) -> None:
        self.remote = is_remote(url)
        self.store = open_store(url, **options)
        self.url = url.rstrip("/") if self.remote else str(Path(url).resolve())
        self.options = options
        self.folder = Path(work_dir or default_work_dir(self.url)) if self.remote else Path(self.url)

    def earlier(self) -> Earlier | None:
        """The pin already at the destination, or None.

        Raises:
            InvalidManifestError: a manifest that does not parse, or files that differ from its digests.
        """
        data = read_file(self.store, MANIFEST, limit=METADATA_LIMIT)
        if data is None:
            return None
        manifest = Manifest.from_json(data, self.store.describe(MANIFEST))
        rows = read_shard_index(self._listed(manifest, SHARDS_INDEX), metadata=manifest.files)
        vouched = _vouched(self._listed(manifest, VOUCHED), self.store.describe(VOUCHED)) \
            if VOUCHED in manifest.files else {}
        return Earlier(manifest, tuple(rows), vouched)

    def _listed(self, manifest: Manifest, name: str) -> bytes:
        where = self.store.describe(name)
        rec = manifest.files.get(name)
        data = read_file(self.store, name, limit=METADATA_LIMIT) if rec is not None else None
        if rec is None or data is None or (hashlib.sha256(data).hexdigest(), len(data)) != (rec.sha256, rec.bytes):
            raise InvalidManifestError(f"{name} is missing or differs from the manifest's digest", path=where)
        return data

    def publish(self) -> None:
        """Send the pin committed in the work folder to a remote destination (nothing to do for a local one)."""
        if not self.remote:
            return
        manifest = Manifest.from_json((self.folder / MANIFEST).read_bytes(), str(self.folder / MANIFEST))
        names = [*sorted(manifest.files), MANIFEST]  # the manifest last: it names only files already there
        if self.url.startswith("hf://"):
            _commit_to_hub(self.url, self.folder, names, self.options)
            return
        for name in names:
            digest, size = sha256_file(self.folder / name)
            self.store.put(name, self.folder / name, sha256=digest, size=size)


def _vouched(data: bytes, where: str) -> dict[str, dict]:
    """The ``files`` of a ``vouched.json``: path -> ``{"checked": ..., "digest": ...}``."""
    try:
        files = loads(data).get("files")
    except (ValueError, AttributeError) as e:
        raise InvalidManifestError(f"not a vouched.json: {e}", path=where) from e
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        raise InvalidManifestError("not a vouched.json: expected 'files', an object of objects", path=where)
    return files


def _commit_to_hub(url: str, folder: Path, names: list[str], options: dict) -> None:
    """The pin's files as one commit of the dataset repo ``url`` (created if needed): all of it or none."""
    from marin_data.transfer.publish_hf import commit_files

    commit_files(url, folder, names, message=f"marin-data adopt: the pin ({len(names)} files)",
                 endpoint=options.get("endpoint"), token=options.get("token"))
