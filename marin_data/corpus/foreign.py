"""Other tools' bookkeeping inside a copy of a corpus or a tree of Levanter caches: never data, so every walk
of a tree (verify's search for unlisted files, the detection of a store's caches, adopt's pin, a cache's
download, info's sizes) skips it, and the command says once what it skipped (`skipped_note`).

- ``.cache/huggingface/`` at the root: huggingface_hub's record of a ``hf download --local-dir`` copy
  (a ``.gitignore``, a ``CACHEDIR.TAG``, and per file fetched ``download/<path>.metadata`` and ``.lock``).
- ``.executor_info`` and ``.executor_status`` in any folder: what Marin's executor writes beside the output
  of each step (the step's config and its state), e.g. beside a tokenize step's ``train/`` and
  ``validation/`` caches, or at the root of a tree of such steps.

Nothing else is skipped: any other file outside a cache, or unlisted by a manifest, is still reported.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

__all__ = ["FOREIGN_FOLDERS", "EXECUTOR_FILES", "EXECUTOR_WHY", "foreign", "is_foreign", "skipped_groups",
           "skipped_note"]

# Folders, relative to the root, that other tools keep inside a copy for their own bookkeeping.
FOREIGN_FOLDERS = {".cache/huggingface": "huggingface_hub's own bookkeeping of a `hf download --local-dir` copy"}
# Files of these names, in any folder: Marin's executor's record of the step that wrote the folder.
EXECUTOR_FILES = (".executor_info", ".executor_status")
EXECUTOR_WHY = "Marin's executor's record of the step that wrote their folder"


def foreign(path: str) -> str | None:
    """The folder of `FOREIGN_FOLDERS` that ``path`` (relative to the root, POSIX separators) lies in, or the
    path itself if it is an executor file (`EXECUTOR_FILES`); None for anything else."""
    folder = next((f for f in FOREIGN_FOLDERS if path == f or path.startswith(f + "/")), None)
    return folder if folder is not None else path if PurePosixPath(path).name in EXECUTOR_FILES else None


def is_foreign(path: str) -> bool:
    """Whether ``path`` is other tools' bookkeeping (`foreign`)."""
    return foreign(path) is not None


def skipped_groups(ignored: Iterable[str]) -> list[tuple[str, str]]:
    """What ``ignored`` (`foreign` of each skipped file: folders, executor files) holds, one (what, why) per
    kind: each bookkeeping folder (``.cache/huggingface/``), then the executor files together
    (``3 executor files (.executor_info, .executor_status)``)."""
    ignored = sorted(set(ignored))
    groups = [(f"{p}/", FOREIGN_FOLDERS[p]) for p in ignored if p in FOREIGN_FOLDERS]
    executor = [p for p in ignored if p not in FOREIGN_FOLDERS]
    if executor:
        names = ", ".join(sorted({PurePosixPath(p).name for p in executor}))
        groups.append((f"{len(executor)} executor file{'s' if len(executor) != 1 else ''} ({names})", EXECUTOR_WHY))
    return groups


def skipped_note(ignored: Iterable[str], done: str) -> str | None:
    """One line saying what was skipped (`skipped_groups`) and what ``done`` to it ("not counted"), or None
    when nothing was."""
    groups = skipped_groups(ignored)
    if not groups:
        return None
    return f"other tools' bookkeeping, {done}: " + "; ".join(f"{what}, {why}" for what, why in groups)
