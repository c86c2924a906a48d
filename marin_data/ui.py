"""Terminal output shared by the commands: tables, sizes, progress bars, and the escaping of text that
came from elsewhere.

Names and messages from a store, a manifest or an index may hold terminal control characters: a ``\r``
that lets a later text overwrite a summary line, an escape sequence that recolours the screen or retitles
the window, a bidirectional override that reverses what follows. `printable` escapes every one of them
(``\x1b``, ``\r``, ``\u202e``) in a name or a field, newlines included; `terminal_safe` does it for whole
output, keeping its newlines and tabs; `echo` is ``click.echo`` through `terminal_safe`, and every command
prints with it. JSON output needs neither: ``json.dumps`` escapes them itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["human_bytes", "human_count", "plural", "format_table", "progress", "printable", "terminal_safe", "echo"]

# C0 controls, DEL, C1 controls, the bidirectional formatting characters and the line/paragraph separators
_CONTROLS = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[{_CONTROLS}]")
_UNSAFE_IN_TEXT = re.compile(f"(?![\n\t])[{_CONTROLS}]")


def _escaped(m: re.Match) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``str(text)`` with every terminal control character escaped, newlines and tabs included: for a name
    or a field printed within a line."""
    return _UNSAFE.sub(_escaped, str(text))


def terminal_safe(text: object) -> str:
    """``str(text)`` with every terminal control character escaped but its newlines and tabs: for a whole
    message or a document's text."""
    return _UNSAFE_IN_TEXT.sub(_escaped, str(text))


def echo(text: object = "", *, err: bool = False, fg: str | None = None) -> None:
    """Print a line on stdout (``err``: stderr) through `terminal_safe`, optionally coloured."""
    import click

    click.secho(terminal_safe(text), err=err, fg=fg)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def human_count(n: float) -> str:
    for unit in ("", "K", "M", "B", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.2f}{unit}"
        n /= 1000
    raise AssertionError  # unreachable


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` agreeing in number: ``1 file``, ``2 files``, ``1,024 files``; ``many`` for an
    irregular plural (``plural(n, "entry", "entries")``)."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned (they are numbers)."""
    cells = [[printable(h) for h in headers]] + [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


class _Hidden:
    """What `progress` returns when the bar is hidden: the calls it gets, doing nothing (and no tqdm import)."""

    def update(self, n: float = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Hidden:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress(total: float | None, desc: str, unit: str = "it", *, unit_scale: bool = False, disable: bool | None = None):
    """A tqdm progress bar on stderr; hidden when stderr is not a terminal unless MARIN_PROGRESS=1."""
    import os
    import sys

    if disable is None:
        disable = not (sys.stderr.isatty() or os.environ.get("MARIN_PROGRESS") == "1")
    if disable:
        return _Hidden()
    from tqdm import tqdm

    return tqdm(total=total, desc=printable(desc), unit=unit, unit_scale=unit_scale,
                unit_divisor=1024 if unit == "B" else 1000, dynamic_ncols=True, leave=False)
