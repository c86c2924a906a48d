"""``shard_ledger.json``: what a Levanter cache says of itself, parsed as hostile input.

Fields (Levanter's ``CacheLedger``): ``total_num_rows``, ``shard_rows`` (source shard -> rows),
``is_finished``, ``finished_shards``, ``field_counts`` (``{"input_ids": total tokens}``),
``field_counts_by_shard``, ``layout`` (``"consolidated"``, the default, or ``"sharded"``: the rows live in
the sub-caches ``finished_shards`` names, in that order) and ``metadata.preprocessor_metadata`` (may be null).
`render_ledger` writes the same fields back, in Levanter's key order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field as dc_field
from typing import Any

from marin_data.errors import CacheFormatError
from marin_data.layout import STATS, SUCCESS
from marin_data.levanter.jsonio import field, int_field, parse_json, str_map

__all__ = ["LEDGER", "SUCCESS", "STATS", "TOKENS_FIELD", "CONSOLIDATED", "SHARDED", "Ledger", "parse_ledger",
           "render_ledger", "parse_stats"]

LEDGER = "shard_ledger.json"
TOKENS_FIELD = "input_ids"
CONSOLIDATED = "consolidated"
SHARDED = "sharded"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and v >= 0


@dataclass(frozen=True)
class Ledger:
    total_num_rows: int
    shard_rows: dict[str, int]
    is_finished: bool
    finished_shards: list[str]
    field_counts: dict[str, int]
    field_counts_by_shard: dict[str, dict[str, int]] = dc_field(default_factory=dict)
    layout: str = CONSOLIDATED
    preprocessor_metadata: dict | None = None

    @property
    def tokens(self) -> int | None:
        """``field_counts["input_ids"]``: the cache's total tokens, None when the ledger does not say."""
        return self.field_counts.get(TOKENS_FIELD)


def parse_ledger(data: bytes, where: str) -> Ledger:
    """Parse ledger bytes; raise `CacheFormatError` naming ``where`` and the field on any defect."""
    doc = parse_json(data, where)
    by_shard = field(doc, "field_counts_by_shard", dict, where, default={})
    for name, counts in by_shard.items():
        if not isinstance(counts, dict) or not all(_is_int(v) and not isinstance(v, bool) for v in counts.values()):
            raise CacheFormatError(f"field_counts_by_shard[{name!r}] is not an object of counts", path=where)
    layout = field(doc, "layout", (str, type(None)), where, default=None) or CONSOLIDATED
    if layout not in (CONSOLIDATED, SHARDED):
        raise CacheFormatError(f"unknown layout {layout!r} (expected {CONSOLIDATED!r} or {SHARDED!r})",
                               path=where, actual=layout)
    metadata = field(doc, "metadata", (dict, type(None)), where, default=None) or {}
    finished = field(doc, "finished_shards", list, where, default=[])
    if not all(isinstance(s, str) for s in finished):
        raise CacheFormatError("finished_shards holds a non-string", path=where)
    return Ledger(
        total_num_rows=int_field(doc, "total_num_rows", where),
        shard_rows=str_map(doc, "shard_rows", where, _is_int, "a row count"),
        is_finished=field(doc, "is_finished", bool, where, default=False),
        finished_shards=finished,
        field_counts=str_map(doc, "field_counts", where, _is_int, "a count"),
        field_counts_by_shard=by_shard,
        layout=layout,
        preprocessor_metadata=field(metadata, "preprocessor_metadata", (dict, type(None)), where, default=None),
    )


def render_ledger(ledger: Ledger) -> bytes:
    """The ledger as Levanter writes it (``dataclasses_json``: fields in declaration order)."""
    doc = {"total_num_rows": ledger.total_num_rows, "shard_rows": ledger.shard_rows,
           "is_finished": ledger.is_finished, "finished_shards": ledger.finished_shards,
           "field_counts": ledger.field_counts,
           "metadata": {"preprocessor_metadata": ledger.preprocessor_metadata}}
    if ledger.layout != CONSOLIDATED or ledger.field_counts_by_shard:
        doc["field_counts_by_shard"] = ledger.field_counts_by_shard
        doc["layout"] = ledger.layout
    return json.dumps(doc).encode()


def parse_stats(data: bytes, where: str) -> dict[str, int]:
    """``.stats.json``: ``{"total_tokens": n, "total_elements": n}`` (either may be absent)."""
    doc = parse_json(data, where, limit=1 << 20)
    return {k: int_field(doc, k, where) for k in ("total_tokens", "total_elements") if k in doc}
