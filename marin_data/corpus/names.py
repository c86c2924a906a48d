"""The names a corpus description gives: file paths, subset names, digests, and ``--subset`` patterns.

Every name in a manifest or shard index is untrusted: `safe_relpath` keeps a path inside the corpus,
`check_subset_name` keeps a subset name a plain folder path, `check_digest` keeps a digest a hex sha256,
each raising a typed error that names the file it came from. `select_subsets` resolves the patterns a user
types against the names a corpus holds.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from marin_data.errors import InvalidManifestError, UnknownSubsetError, UnsafePathError
from marin_data.layout import MANIFEST

__all__ = ["safe_relpath", "check_subset_name", "check_digest", "select_subsets"]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def safe_relpath(path: str, *, where: str = MANIFEST) -> str:
    """Return ``path`` if it is a clean relative POSIX path inside the corpus, else raise `UnsafePathError`.

    Absolute paths, ``..`` components, backslashes and empty components are refused, never followed:
    a tampered manifest must not make us read or write outside the corpus.
    """
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or "\x00" in path
        or re.match(r"^[A-Za-z]:", path)
        or any(part in ("", ".", "..") for part in path.split("/"))
    ):
        raise UnsafePathError(f"unsafe path {path!r} in corpus description (absolute, '..' or malformed)",
                              path=where, actual=path)
    return path


def check_subset_name(name: str, where: str) -> None:
    """Subset names are relative paths (``pretrain/dclm``, a Levanter store's ``cluster=3/quality=4``) that
    become folders: plain components of letters, digits, ``_``, ``.``, ``-`` and ``=``, never ``.`` or ``..``."""
    if not re.fullmatch(r"[A-Za-z0-9_.\-=]+(/[A-Za-z0-9_.\-=]+)*", name) or any(
        part in (".", "..") for part in name.split("/")
    ):
        raise InvalidManifestError(f"invalid subset name {name!r}", path=where, actual=name)


def check_digest(digest: str, where: str) -> None:
    """Raise `InvalidManifestError` naming ``where`` unless ``digest`` is a lowercase hex sha256."""
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise InvalidManifestError(f"not a hex sha256: {digest!r}", path=where, actual=digest)


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
