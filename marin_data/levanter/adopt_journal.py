"""The progress of an ``adopt`` of a store: a journal of the files already hashed, in the pin's folder.

``adopt`` of a store hashes every file of the chosen cells through an engine, in any order. Each file hashed
is appended here as one JSON line (its shard-index row, the digests the store vouched for and what the
listing said of it: size and listed digests), in one ``write`` to a file opened for appending, then
``fsync``'d: a run killed at any point leaves whole lines and at most one torn last line, which is ignored.
The next run re-uses an entry only while the listing still says the same of its file, so a re-run hashes
just the files not finished, and a file replaced meanwhile is hashed again. The first line names the data
the journal is about: a journal of other data is started afresh. The pin's commit removes it.

It lives where the pin is built (`ADOPT_JOURNAL` in the pin's local folder, or the work folder of a pin
uploaded at the end), never under the data's prefix.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from marin_data.corpus.records import ShardRecord
from marin_data.errors import CacheFormatError
from marin_data.fileio.untrusted_json import loads
from marin_data.layout import ADOPT_JOURNAL

__all__ = ["Finished", "Journal"]


@dataclass(frozen=True)
class Finished:
    """One file hashed: its row, the store's digests it was checked against, and its listing's identity."""

    row: ShardRecord
    vouched: dict[str, str]  # algorithm -> hex, as the store gave them (each one compared)
    listed: dict[str, object]  # what the listing said of it when it was hashed (`identity`)

    def to_json(self) -> dict:
        return {"row": self.row._asdict(), "vouched": self.vouched, "listed": self.listed}


class Journal:
    """The journal at ``folder/ADOPT_JOURNAL`` of the data at ``source``."""

    def __init__(self, folder: Path, source: str) -> None:
        self.path, self.source = Path(folder) / ADOPT_JOURNAL, source

    def read(self) -> dict[str, Finished]:
        """path -> its entry; {} when there is no journal or it is about other data.

        Raises:
            CacheFormatError: a damaged line that is not the last (a torn last line is a kill's, ignored).
        """
        try:
            lines = self.path.read_bytes().split(b"\n")
        except FileNotFoundError:
            return {}
        if _parse(lines[0]) != {"source": self.source}:
            return {}
        out: dict[str, Finished] = {}
        for n, line in enumerate(lines[1:-1], start=2):  # the last piece: "" or a line a kill tore
            entry = _parse(line)
            try:
                done = Finished(ShardRecord(**entry["row"]), dict(entry["vouched"]), dict(entry["listed"]))
            except (KeyError, TypeError, ValueError) as e:
                raise CacheFormatError(f"line {n} is damaged ({e!r}): delete it to hash every file again",
                                       path=str(self.path)) from e
            out[done.row.path] = done
        return out

    def start(self, kept: dict[str, Finished]) -> None:
        """Begin the journal afresh holding ``kept`` (the entries still good), replacing any other."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = [json.dumps({"source": self.source})] + [json.dumps(f.to_json()) for f in kept.values()]
        with open(tmp, "wb") as f:
            f.write(("\n".join(lines) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, done: Finished) -> None:
        """Record one file hashed: one line, in one write, on disk before this returns."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (json.dumps(done.to_json()) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _parse(line: bytes) -> dict | None:
    try:
        doc = loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
