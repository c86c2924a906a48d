"""A subset's inputs: their identity (sha256 + size), the recipe a re-run must match, and its record.

`hash_inputs` identifies every input file; `make_recipe` gives everything besides the tokenizer that determines a
subset's bytes; the record of both lives at `sources_path` (``sources/<subset>.json``, listed in the manifest),
and `check_recorded` holds a re-run of a subset the corpus already holds to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from marin_data.fileio.atomic import sha256_file
from marin_data.errors import CorpusConflictError, UnreadableInputError
from marin_data.layout import SOURCES
from marin_data.raw.documents import source_names
from marin_data.ui import progress
from marin_data.fileio.untrusted_json import loads

__all__ = ["InputFile", "sources_path", "hash_inputs", "make_recipe", "check_recorded"]


@dataclass(frozen=True)
class InputFile:
    path: str  # absolute path to read
    name: str  # path relative to the inputs' common directory: default ids, the subset's record
    bytes: int
    sha256: str


def sources_path(subset: str) -> str:
    """The corpus-relative path of a subset's record of its inputs and settings."""
    return f"{SOURCES}/{subset}.json"


def hash_inputs(paths: Sequence[Path]) -> list[InputFile]:
    """sha256 and size of every input, in parallel threads (hashlib releases the GIL), with a bytes bar."""
    total = sum(p.stat().st_size for p in paths)

    def one(path: Path) -> tuple[str, int]:
        try:
            return sha256_file(path, on_bytes=bar.update)
        except OSError as e:
            raise UnreadableInputError(f"cannot read: {e.strerror or e}", path=str(path)) from e

    with progress(total, "hashing inputs", "B", unit_scale=True) as bar, \
            ThreadPoolExecutor(min(8, max(1, len(paths)))) as threads:
        digests = list(threads.map(one, paths))
    return [InputFile(path=str(p), name=n, bytes=size, sha256=digest)
            for p, n, (digest, size) in zip(paths, source_names(paths), digests)]


def make_recipe(files: Sequence[InputFile], *, text_field: str, id_field: str, shard_tokens: int) -> dict:
    """Everything besides the tokenizer that determines a subset's bytes (what a re-run must match)."""
    return {
        "format": 1,
        "inputs": [{"name": f.name, "bytes": f.bytes, "sha256": f.sha256} for f in files],
        "text_field": text_field,
        "id_field": id_field,
        "shard_tokens": shard_tokens,
    }


def check_recorded(root: Path, subset: str, recipe: dict) -> dict:
    """The record of ``subset``, which the corpus already holds, when it was made by ``recipe``.

    Raises:
        CorpusConflictError: there is no record, or it names other inputs or settings.
    """
    path = root / sources_path(subset)
    try:
        recorded = loads(path.read_bytes())
    except (OSError, ValueError):
        recorded = None
    if recorded is None:
        raise CorpusConflictError(f"the corpus already holds subset {subset!r}, with no record of its inputs "
                                  f"({sources_path(subset)})", path=str(root))
    differ = [k for k in recipe if recorded.get(k) != recipe[k]]
    if differ:
        raise CorpusConflictError(
            f"the corpus already holds subset {subset!r}, made with different {' and '.join(differ)} (see "
            f"{sources_path(subset)}); a subset is only ever the output of one set of inputs and settings",
            path=str(root))
    return recorded
