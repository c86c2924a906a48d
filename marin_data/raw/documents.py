"""Read raw documents from the input formats ``marin-data shard`` accepts.

JSON Lines (``.jsonl``, ``.ndjson``, ``.json`` — Dolma names its JSON Lines ``*.json.gz``), plain or
compressed with gzip (``.gz``) or zstd (``.zst``/``.zstd``), and Parquet. Each record becomes a `Document`
carrying where it came from, so every error can name the file and the line (for Parquet: the 1-based row).
`input_format` tells the format from the file name, `expand_inputs` turns files, folders and globs into the
files to read, and `read_documents` reads one, through `marin_data.raw.jsonl` or `marin_data.raw.parquet`.

Two kinds of failure, as `marin_data.errors` names them:

- a bad *record* (malformed JSON, a missing or non-string text field, bytes that are not UTF-8, a document
  over ``max_doc_bytes``) raises
  `BadRecordError` with a ``reason`` key — or, when the caller passes ``on_bad``, is handed to it and
  skipped, which is how ``--skip-bad`` counts skips by reason (`marin_data.raw.records`);
- a bad *file* (missing, unreadable, a truncated or corrupt gzip/zstd/Parquet stream) raises
  `UnreadableInputError` naming the file and the last good line. ``--skip-bad`` does not skip these: a
  truncated archive loses an unknown number of documents, which no count of skipped records can report.

Memory is bounded whatever the file holds: decompression yields at most 1 MiB per step (a 180 KB zstd file
can expand to GiBs), and a line longer than ``max_doc_bytes`` is refused (or skipped) as soon as it passes
the limit, never buffered whole: tokenizing a document takes many times its size (docs/security.md).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePath

from marin_data.errors import UnreadableInputError
from marin_data.raw.jsonl import read_jsonl
from marin_data.raw.parquet import read_parquet
from marin_data.raw.records import Document, OnBad

__all__ = ["DEFAULT_MAX_DOC_BYTES", "input_format", "expand_inputs", "source_names", "read_documents"]

DEFAULT_MAX_DOC_BYTES = 8 << 20  # one document's JSON line or text; tokenizing it peaks at many times this

_JSONL = (".jsonl", ".ndjson", ".json")
_COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def input_format(path: str | os.PathLike) -> str:
    """``"jsonl"``, ``"jsonl.gzip"``, ``"jsonl.zstd"`` or ``"parquet"``, from the file name.

    Raises:
        UnreadableInputError: the name has none of the supported suffixes.
    """
    suffixes = [s.lower() for s in PurePath(path).suffixes[-2:]]
    if suffixes and suffixes[-1] == ".parquet":
        return "parquet"
    compression = _COMPRESSION.get(suffixes[-1]) if suffixes else None
    base = suffixes[-2] if compression and len(suffixes) == 2 else (suffixes[-1] if suffixes else "")
    if base in _JSONL:
        return f"jsonl.{compression}" if compression else "jsonl"
    raise UnreadableInputError(
        "unsupported input format: expected .jsonl/.ndjson/.json (optionally .gz, .zst or .zstd) or .parquet",
        path=str(path),
    )


def expand_inputs(patterns: Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files, directories (every supported file below, recursively) and globs (``**`` recurses).

    Returns absolute paths, sorted and de-duplicated, so a run's work is planned the same way whatever
    order the shell listed the files in.

    Raises:
        UnreadableInputError: a path that does not exist, a glob that matches nothing, a directory with no
            supported file, or a file of an unsupported format.
    """
    found: set[Path] = set()
    for pattern in patterns:
        pattern = os.fspath(pattern)
        if glob.has_magic(pattern):
            hits = [Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)]
            if not hits:
                raise UnreadableInputError("no input file matches this pattern", path=pattern)
        elif os.path.isdir(pattern):
            hits = [p for p in Path(pattern).rglob("*") if p.is_file() and not p.name.startswith(".")
                    and _supported(p)]
            if not hits:
                raise UnreadableInputError("directory holds no .jsonl/.json(.gz/.zst) or .parquet file",
                                           path=pattern)
        elif os.path.isfile(pattern):
            hits = [Path(pattern)]
        else:
            raise UnreadableInputError("no such input file", path=pattern)
        for p in hits:
            input_format(p)
            found.add(Path(os.path.abspath(p)))
    return sorted(found)


def source_names(paths: Sequence[Path]) -> list[str]:
    """Each path relative to the inputs' common directory, as POSIX paths.

    These names (not absolute paths) go into default document ids and the subset's record of its inputs,
    so the same files sharded from another directory or machine give the same bytes.
    """
    if not paths:
        return []
    base = os.path.commonpath([os.path.dirname(p) for p in paths])
    return [Path(os.path.relpath(p, base)).as_posix() for p in paths]


def read_documents(
    path: str | os.PathLike,
    *,
    source: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    on_bad: OnBad | None = None,
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES,
) -> Iterator[Document]:
    """Yield the documents of one input file in file order.

    Args:
        path: a file in one of the supported formats.
        source: the name used in default ids (``"<source>:<line>"``, for records without an id); defaults
            to the file name.
        text_field: the field (JSON) or column (Parquet) holding the text.
        id_field: the field or column holding the id; records without one get a default id.
        on_bad: called with each `BadRecordError` instead of raising it; the record is then skipped.
        max_doc_bytes: the longest record (a JSON line, a Parquet text value) in bytes; a longer one is a bad
            record (reason `TOO_LONG`).

    Raises:
        BadRecordError: a malformed record, when ``on_bad`` is None.
        UnreadableInputError: the file cannot be opened, or its stream is corrupt or truncated.
    """
    path = Path(path)
    fmt = input_format(path)
    source = path.name if source is None else source
    if fmt == "parquet":
        yield from read_parquet(path, source, text_field, id_field, on_bad, max_doc_bytes)
    else:
        yield from read_jsonl(path, fmt, source, text_field, id_field, on_bad, max_doc_bytes)


def _supported(path: Path) -> bool:
    try:
        input_format(path)
    except UnreadableInputError:
        return False
    return True
