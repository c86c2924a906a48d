"""The names a corpus description gives: file paths, subset names, digests, and ``--subset`` patterns.

Every name in a manifest or shard index is untrusted: `safe_relpath` keeps a path inside the corpus,
`check_subset_name` keeps a subset name a plain folder path, `check_digest` keeps a digest a hex sha256,
each raising a typed error that names the file it came from. `unsafe_paths` and `bad_digests` are the same
checks over a whole Arrow column at once, for the shard index's 100,000 rows (a test holds each to its
one-name twin). `select_subsets` resolves the patterns a user types against the names a corpus holds.
`safe_relpath` and `unsafe_paths` live in `marin_data.fileio.untrusted_paths`, where the stores take the
path check from; they are given here with the other checks.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from marin_data.fileio.arrays import mask, string_buffers
from marin_data.fileio.untrusted_paths import safe_relpath, unsafe_paths
from marin_data.errors import InvalidManifestError, UnknownSubsetError, shown
from marin_data.layout import ADOPT_JOURNAL, BY_SHA256, CHECKED, LOCK_NAME, MANIFEST, MIRRORS, RECORD, \
    SHARDS_INDEX, STAGING, SUMS, TOKENIZER

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["WRITER_NAMES", "METADATA_NAMES", "safe_relpath", "unsafe_paths", "is_reserved", "reserved_paths",
           "check_subset_name", "as_subset_name", "check_digest", "bad_digests", "select_subsets"]

# Names no listed file may take, as a path's first component (`marin_data.layout`): what writers keep beside a
# corpus (a download writes and later readers trust them: the lock, a commit journal whose manifest
# `load_corpus` prefers, a download's records), and, by suffix, partial files, which a download writes and
# removes. A shard may not take the metadata files' names either.
WRITER_NAMES = (MANIFEST, RECORD, CHECKED, LOCK_NAME, STAGING, MIRRORS, BY_SHA256, ADOPT_JOURNAL)
METADATA_NAMES = (SHARDS_INDEX, SUMS, TOKENIZER)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX_BYTES = np.zeros(256, bool)
_HEX_BYTES[np.frombuffer(b"0123456789abcdef", np.uint8)] = True


def is_reserved(path: str, names: Sequence[str] = WRITER_NAMES) -> bool:
    """Whether ``path`` starts with one of ``names`` (a whole component) or is a partial file's name."""
    return path.split("/")[0] in names or path.endswith(".part")


def reserved_paths(paths: pa.Array, names: Sequence[str] = WRITER_NAMES) -> np.ndarray:
    """``[n]`` bool: `is_reserved` over a null-free string column."""
    import pyarrow.compute as pc

    pattern = "^(" + "|".join(re.escape(name) for name in names) + r")(/|$)|\.part$"
    return mask(pc.match_substring_regex(paths, pattern))


def check_subset_name(name: str, where: str) -> None:
    """Subset names are relative paths (``pretrain/dclm``, a Levanter store's ``cluster=3/quality=4``) that
    become folders: plain components of letters, digits, ``_``, ``.``, ``-`` and ``=``, never ``.`` or ``..``."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-=]+(/[A-Za-z0-9_.\-=]+)*", name) or any(
        part in (".", "..") for part in name.split("/")
    ):
        raise InvalidManifestError(f"invalid subset name {shown(name)}", path=where, actual=name)


def as_subset_name(text: str) -> str:
    """A subset name made from free text (a folder's name): runs of other characters become ``-``."""
    return re.sub(r"[^A-Za-z0-9_.\-=]+", "-", text).strip("-.") or "cache"


def check_digest(digest: str, where: str) -> None:
    """Raise `InvalidManifestError` naming ``where`` unless ``digest`` is a lowercase hex sha256."""
    if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
        raise InvalidManifestError(f"not a hex sha256: {shown(digest)}", path=where, actual=digest)


def bad_digests(digests: pa.Array) -> np.ndarray:
    """``[n]`` bool: which of a null-free string column's digests `check_digest` refuses: a fixed-width
    check (64 bytes each, every byte a lowercase hex digit) over the column's bytes, with no per-row call."""
    offsets, data = string_buffers(digests)
    bad = np.diff(offsets) != 64
    starts = offsets[:-1][~bad]
    if len(starts):  # 64 bytes per good row: one contiguous block when every row is good
        rows = data[starts[:, None] + np.arange(64)] if bad.any() else data[offsets[0]:offsets[-1]].reshape(-1, 64)
        bad[~bad] = ~_HEX_BYTES[rows].all(axis=1)
    return bad


def select_subsets(available: Iterable[str], patterns: Sequence[str] | None, *,
                   what: str = "subset pattern") -> list[str]:
    """Resolve ``--subset`` patterns against subset names; all subsets when ``patterns`` is empty.

    A pattern matches a subset by exact name, by shell glob (``pretrain/*``), or as a parent path
    (``pretrain`` selects ``pretrain/dclm`` and ``pretrain/code``). A pattern that matches nothing is an
    error (`UnknownSubsetError`, naming the pattern as ``what``, and the known subsets), so a typo never
    silently selects less data.
    """
    names = sorted(available)
    if not patterns:
        return names
    chosen: set[str] = set()
    for pat in patterns:
        hits = [n for n in names if n == pat or fnmatch.fnmatchcase(n, pat) or n.startswith(pat.rstrip("/") + "/")]
        if not hits:
            raise UnknownSubsetError(
                f"{what} {pat!r} matches no subset; known subsets: {', '.join(names) or '(none)'}",
                expected=names, actual=pat,
            )
        chosen.update(hits)
    return sorted(chosen)
