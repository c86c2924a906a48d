"""A stream's documents by where their tokens lie: what a format's `ShardDecoder.documents` answers for the
loader's trace (`marin_data.loader.trace`).

Positions are tokens of a subset's concatenated stream (the loader's ``SubsetTokens``), the coordinates the
loader cuts its windows in. A format answers two questions about them (`Documents`): which documents a window
``[lo, hi)`` of subset ``s``'s tokens touches, and where the document with a given id lies. Parquet corpora
answer from their shards' ``id`` column and row groups (`marin_data.formats.marin.documents`), a pinned
Levanter cache from its cells' offsets, its documents named ``SUBSET:ROW`` (`marin_data.levanter.cell_documents`).
`Document` and `touching` are what both share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["Document", "Documents", "touching"]


@dataclass(frozen=True)
class Document:
    """One document a window touches: its id and the first and last of its tokens inside the window, counted
    from the document's first token (both inclusive)."""

    id: str
    first: int
    last: int


class Documents(Protocol):
    """Where the documents of one stream lie (module docstring)."""

    def touching(self, s: int, lo: int, hi: int) -> list[Document]:
        """The documents of subset ``s`` that tokens ``[lo, hi)`` of its stream meet, in order."""

    def find(self, doc_id: str) -> tuple[int, int, int]:
        """``(subset index, first token, one past its last token)`` of the document ``doc_id`` in its subset's
        stream; subset -1 for a document of a subset the stream does not read (a weight of 0).

        Raises:
            UnknownDocumentError: no subset of the corpus holds a document with that id.
        """


def touching(starts: np.ndarray, ends: np.ndarray, lo: int, hi: int) -> list[int]:
    """The documents ``d`` (``[starts[d], ends[d])``, sorted, back to back) that share a token with ``[lo, hi)``
    (an empty one shares none)."""
    first, stop = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(starts, hi, side="left"))
    return [d for d in range(first, stop) if ends[d] > starts[d]]
