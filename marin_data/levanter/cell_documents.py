"""A pinned Levanter cache's documents by where their tokens lie (`marin_data.formats.documents`), for the
loader's trace. A pinned cache has no ids: a document is ``SUBSET:ROW``, its row in its cell (the ids
`marin-data convert` gives such rows too). Its boundaries are its part's offsets, read through the corpus's
`PinnedCells` from the pinned ledgers and offsets chunk files alone; no token data is read.

The stream is the loader's ``TokenStream``, read by duck typing (this stage comes before the loader): its
``subsets`` and ``corpus``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from marin_data.errors import UnknownDocumentError, shown
from marin_data.formats.documents import Document, touching
from marin_data.levanter.cache import CachePart

__all__ = ["CellDocuments"]


@dataclass(frozen=True)
class _Part:
    """One part of a cell: its rows and tokens start at these in the cell (and in its subset's stream)."""

    part: CachePart
    row: int
    token: int


class CellDocuments:
    """The documents of a pinned Levanter cache's stream: ``SUBSET:ROW`` (module docstring); ``cells``: its
    corpus's `PinnedCells` (the stream's decoder)."""

    def __init__(self, stream: Any, cells: Any) -> None:
        self.stream = stream
        self.cells = cells
        self._parts: dict[int, list[_Part]] = {}

    def parts(self, s: int) -> list[_Part]:
        hit = self._parts.get(s)
        if hit is None:
            hit, row, token = [], 0, 0
            for part in self.cells.cache(self.stream.subsets[s]).parts:
                hit.append(_Part(part, row, token))
                row, token = row + part.rows, token + part.tokens
            self._parts[s] = hit
        return hit

    def _ends(self, s: int, part: _Part) -> np.ndarray:
        return np.asarray(self.cells.ends(self.stream.subsets[s], part.part), dtype=np.int64)

    def touching(self, s: int, lo: int, hi: int) -> list[Document]:
        """As `marin_data.formats.documents.Documents.touching`."""
        name, out = self.stream.subsets[s], []
        for p in self.parts(s):
            if p.token >= hi or p.token + p.part.tokens <= lo:
                continue
            ends = self._ends(s, p)
            starts = np.concatenate(([0], ends[:-1]))
            for d in touching(starts, ends, lo - p.token, hi - p.token):
                begin = p.token + int(starts[d])
                out.append(Document(f"{name}:{p.row + d}", max(lo, begin) - begin,
                                    min(hi, p.token + int(ends[d])) - 1 - begin))
        return out

    def find(self, doc_id: str) -> tuple[int, int, int]:
        """As `marin_data.formats.documents.Documents.find`, for an id ``SUBSET:ROW``."""
        name, _, row = doc_id.rpartition(":")
        if name not in self.stream.corpus.manifest.subsets or not row.isdigit():
            raise UnknownDocumentError(f"a pinned cache's documents are SUBSET:ROW of one of its subsets, not "
                                       f"{shown(doc_id)}", actual=doc_id)
        if name not in self.stream.subsets:
            return -1, 0, 0
        s, row = self.stream.subsets.index(name), int(row)
        for p in self.parts(s):
            if p.row <= row < p.row + p.part.rows:
                ends = self._ends(s, p)
                d = row - p.row
                return s, p.token + (int(ends[d - 1]) if d else 0), p.token + int(ends[d])
        raise UnknownDocumentError(f"subset {name!r} has {sum(p.part.rows for p in self.parts(s)):,} rows, no row "
                                   f"{row:,}", actual=doc_id)
