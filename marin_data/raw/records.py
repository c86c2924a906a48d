"""What reading an input file makes of each record: a `Document`, or a bad record with its reason.

A bad *record* (malformed JSON, a missing or non-string text field, bytes that are not UTF-8, a document over
``max_doc_bytes``) raises `BadRecordError` with a ``reason`` key, one of the names below, or, when the caller
passes ``on_bad``, is handed to it and skipped, which is how ``--skip-bad`` counts skips by reason. The
readers (`marin_data.raw.jsonl`, `marin_data.raw.parquet`) refuse records through `reject`, so both formats
report a bad record the same way: its file, its line (for Parquet: the 1-based row) and why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from marin_data.errors import BadRecordError

__all__ = ["Document", "OnBad", "BAD_JSON", "MISSING_TEXT", "UNDECODABLE", "TOO_LONG", "reject", "too_long"]

# Reasons a record is bad: the keys of the skip counts that --skip-bad reports.
BAD_JSON = "bad_json"
MISSING_TEXT = "missing_text"
UNDECODABLE = "undecodable"
TOO_LONG = "too_long"


@dataclass(frozen=True, slots=True)
class Document:
    id: str
    text: str
    path: str  # the input file it came from
    line: int  # 1-based line (JSON Lines) or row (Parquet)


OnBad = Callable[[BadRecordError], None]


def reject(on_bad: OnBad | None, path: Path, line: int, reason: str, message: str) -> None:
    """Raise the bad record at ``path:line`` as a `BadRecordError`, or hand it to ``on_bad``."""
    err = BadRecordError(message, path=str(path), line=line, reason=reason)
    if on_bad is None:
        raise err
    on_bad(err)


def too_long(on_bad: OnBad | None, path: Path, line: int, max_doc_bytes: int) -> None:
    """`reject` a record over ``max_doc_bytes`` (reason `TOO_LONG`), saying how to keep it."""
    reject(on_bad, path, line, TOO_LONG, f"document over {max_doc_bytes:,} bytes: raise --max-doc-bytes to "
                                         "keep it (tokenizing takes many times its size), or --skip-bad")
