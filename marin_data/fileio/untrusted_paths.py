"""Paths read from a description someone else wrote (a manifest, a shard index, a store's listing), kept
inside the folder they are joined to.

`safe_relpath` refuses, never follows, anything but a clean relative POSIX path: absolute paths, ``..``
components, backslashes, NUL bytes, drive letters and empty components raise `UnsafePathError` naming the
file the path came from. `unsafe_paths` is the same check over a whole Arrow column at once, for a shard
index's 100,000 rows (a test holds it to its one-path twin). `marin_data.corpus.names` gives these checks
to the corpus with its other name checks; the stores use them directly.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from marin_data.errors import UnsafePathError, shown
from marin_data.fileio.arrays import mask
from marin_data.layout import MANIFEST

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["safe_relpath", "unsafe_paths"]

# What `safe_relpath` refuses, as one RE2 pattern (where `$` is the end of the text, never before a final
# newline): empty, absolute, a backslash or NUL, a drive letter, an empty, "." or ".." component.
_UNSAFE_PATH = r"^$|^/|\\|\x00|^[A-Za-z]:|(^|/)\.{0,2}(/|$)"


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
        raise UnsafePathError(f"unsafe path {shown(path)} in corpus description (absolute, '..' or malformed)",
                              path=where, actual=path)
    return path


def unsafe_paths(paths: pa.Array) -> np.ndarray:
    """``[n]`` bool: which of a null-free string column's paths `safe_relpath` refuses."""
    import pyarrow.compute as pc

    return mask(pc.match_substring_regex(paths, _UNSAFE_PATH))
