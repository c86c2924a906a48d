"""JSON from a cache, read as hostile input: a size bound before parsing, nesting that cannot exhaust the
stack (`marin_data.fileio.untrusted_json`), and typed field access that names the file and the key on any defect (`CacheFormatError`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from marin_data.errors import CacheFormatError
from marin_data.fileio.untrusted_json import loads

__all__ = ["MAX_JSON_BYTES", "parse_json", "field", "int_field", "str_map"]

# A ledger lists a row count per source shard; a million shards is ~50 MB. Anything larger is refused unread.
MAX_JSON_BYTES = 64 << 20

T = TypeVar("T")


def parse_json(data: bytes, where: str, *, limit: int = MAX_JSON_BYTES) -> dict:
    """Parse a JSON object of at most ``limit`` bytes; too deep a nesting is refused like any malformed file."""
    if len(data) > limit:
        raise CacheFormatError(f"{len(data)} bytes, more than the {limit} a cache's JSON may have", path=where)
    try:
        doc = loads(data)
    except ValueError as e:  # UnicodeDecodeError and too deep a nesting are ValueErrors
        raise CacheFormatError(f"not valid JSON: {e}", path=where) from e
    if not isinstance(doc, dict):
        raise CacheFormatError(f"top level is a {type(doc).__name__}, not an object", path=where)
    return doc


def field(doc: dict, key: str, kind: type[T] | tuple[type, ...], where: str, *, default: Any = ...,
          check: Callable[[Any], bool] | None = None, what: str = "") -> T:
    """``doc[key]``, which must be of ``kind`` (a bool is never an int) and pass ``check``."""
    if key not in doc:
        if default is ...:
            raise CacheFormatError(f"no {key!r}", path=where, expected=key)
        return default
    value = doc[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds) or (
            check is not None and not check(value)):
        raise CacheFormatError(f"{key!r} is {value!r:.80}, expected {what or '/'.join(k.__name__ for k in kinds)}",
                               path=where, actual=value)
    return value


def int_field(doc: dict, key: str, where: str, **kwargs: Any) -> int:
    """A non-negative integer field."""
    return field(doc, key, int, where, check=lambda v: v >= 0, what="an integer >= 0", **kwargs)


def str_map(doc: dict, key: str, where: str, value_check: Callable[[Any], bool], what: str) -> dict:
    """A field holding an object whose values pass ``value_check`` (absent: empty)."""
    value = field(doc, key, dict, where, default={})
    for k, v in value.items():
        if isinstance(v, bool) or not value_check(v):
            raise CacheFormatError(f"{key}[{k!r}] is {v!r:.80}, expected {what}", path=where, actual=v)
    return value
