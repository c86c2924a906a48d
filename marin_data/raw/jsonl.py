"""Read a JSON Lines file (``.jsonl``, ``.ndjson``, ``.json``; plain, gzip or zstd) as documents.

Each line is one record: a JSON object whose text field (and id field, when there is one) becomes a
`Document`; a blank line is no record. Memory is bounded whatever the file holds: decompression yields at
most 1 MiB per step (a 180 KB zstd file can expand to GiBs), and a line longer than ``max_doc_bytes`` is
refused (or skipped) as soon as it passes the limit, never buffered whole (docs/security.md). A truncated
or corrupt gzip or zstd stream raises `UnreadableInputError` naming the file and the last good line (zstd's
bounded reader takes a file cut inside a frame for a clean end, so the frame headers are walked to notice
it).
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from marin_data.errors import UnreadableInputError
from marin_data.fileio.untrusted_json import loads
from marin_data.raw.records import BAD_JSON, MISSING_TEXT, UNDECODABLE, Document, OnBad, reject, too_long

__all__ = ["read_jsonl"]

_READ = 1 << 20  # input read and decompressed output per step
_ZSTD_MAX_WINDOW = 1 << 27  # zstd's own default cap (what `zstd --long` writes); a larger window is refused
_ZSTD_MAGIC = 0xFD2FB528


def read_jsonl(path: Path, fmt: str, source: str, text_field: str, id_field: str,
               on_bad: OnBad | None, max_doc_bytes: int) -> Iterator[Document]:
    """The documents of a JSON Lines file of format ``fmt`` (`marin_data.raw.documents.input_format`), in
    line order; `marin_data.raw.documents.read_documents` says what the other arguments are."""
    line = 0
    tail = b""  # the start of the next line
    dropping = False  # inside a line refused as too long: its bytes are dropped up to its end
    chunks = _chunks(path, fmt)
    while True:
        try:
            chunk = next(chunks, None)
        except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
            raise UnreadableInputError(f"cannot open: {e.strerror}", path=str(path)) from e
        except _stream_errors() as e:
            raise UnreadableInputError(f"corrupt or truncated {fmt} data after line {line}: {e}",
                                       path=str(path)) from e
        if chunk is None:
            lines = [tail] if tail or dropping else []
        else:
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
        for raw in lines:
            line += 1
            if dropping:  # the end of a line already refused
                dropping = False
            elif len(raw) > max_doc_bytes:
                too_long(on_bad, path, line, max_doc_bytes)
            elif raw.strip():  # blank lines (a trailing newline, hand-edited files) are not records
                doc = _parse_json_record(raw, path, line, source, text_field, id_field, on_bad)
                if doc is not None:
                    yield doc
        if chunk is None:
            return
        if len(tail) > max_doc_bytes or dropping:
            if not dropping:
                too_long(on_bad, path, line + 1, max_doc_bytes)
            tail, dropping = b"", True


def _chunks(path: Path, fmt: str) -> Iterator[bytes]:
    """The decompressed bytes of a JSON Lines file, in 1 MiB reads."""
    with open(path, "rb") as raw:
        if fmt == "jsonl.gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:  # multi-member; EOFError when truncated
                while chunk := gz.read(_READ):
                    yield chunk
        elif fmt == "jsonl.zstd":
            yield from _zstd_chunks(raw)
        else:
            while chunk := raw.read(_READ):
                yield chunk


def _zstd_chunks(raw: io.BufferedIOBase) -> Iterator[bytes]:
    """Decompress concatenated zstd frames at most 1 MiB at a time, raising `EOFError` if the file ends
    inside a frame.

    ``decompressobj().decompress`` has no output limit (1 MiB of input can expand to GiBs), so the bounded
    ``stream_reader`` decompresses; it treats a truncated file as a clean end of stream, which would silently
    drop the documents after the cut, so the frame headers are then walked to notice an unfinished frame.
    """
    import zstandard

    dctx = zstandard.ZstdDecompressor(max_window_size=_ZSTD_MAX_WINDOW)
    with dctx.stream_reader(raw, read_size=_READ, read_across_frames=True, closefd=False) as reader:
        while chunk := reader.read(_READ):
            yield chunk
    if not _zstd_frames_complete(raw):
        raise EOFError("the file ends inside a zstd frame (truncated)")


def _zstd_frames_complete(f: io.BufferedIOBase) -> bool:
    """True when the file is whole zstd frames (and skippable frames), from their headers alone (RFC 8878)."""
    end = f.seek(0, os.SEEK_END)
    pos = 0
    while pos < end:
        f.seek(pos)
        head = f.read(8)
        if len(head) < 5:
            return False
        magic = int.from_bytes(head[:4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame: its size follows the magic
            pos += 8 + int.from_bytes(head[4:8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            return False
        desc = head[4]
        single = desc >> 5 & 1
        pos += 5 + (not single) + (0, 1, 2, 4)[desc & 3] + (single, 2, 4, 8)[desc >> 6]
        last = 0
        while not last:  # blocks: a 3-byte header (last flag, type, size); an RLE block holds one byte
            f.seek(pos)
            block = f.read(3)
            if len(block) < 3:
                return False
            h = int.from_bytes(block, "little")
            last, kind = h & 1, h >> 1 & 3
            pos += 3 + (1 if kind == 1 else h >> 3)
        pos += 4 * (desc >> 2 & 1)  # the content checksum
    return pos == end


def _stream_errors() -> tuple[type[BaseException], ...]:
    import zstandard

    return (OSError, EOFError, zlib.error, zstandard.ZstdError)


def _parse_json_record(raw: bytes, path: Path, line: int, source: str, text_field: str, id_field: str,
                       on_bad: OnBad | None) -> Document | None:
    try:
        obj = loads(raw)
    except UnicodeDecodeError as e:
        reject(on_bad, path, line, UNDECODABLE, f"line is not UTF-8 ({e.reason} at byte {e.start})")
        return None
    except ValueError as e:
        reject(on_bad, path, line, BAD_JSON, f"malformed JSON: {e}")
        return None
    if not isinstance(obj, dict):
        reject(on_bad, path, line, BAD_JSON, f"a JSON {type(obj).__name__}, not an object")
        return None
    text = obj.get(text_field)
    if not isinstance(text, str):
        what = "no" if text is None else f"a {type(text).__name__}, not a string, in"
        reject(on_bad, path, line, MISSING_TEXT, f"{what} text field {text_field!r}")
        return None
    if not _is_unicode(text):
        reject(on_bad, path, line, UNDECODABLE, "text holds lone surrogates (\\ud800-\\udfff): not valid Unicode")
        return None
    doc_id = obj.get(id_field)
    return Document(id=f"{source}:{line}" if doc_id is None else str(doc_id), text=text, path=str(path), line=line)


def _is_unicode(text: str) -> bool:
    """False for text holding surrogates (JSON ``\\ud800`` escapes), which no tokenizer can encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
