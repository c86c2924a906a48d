"""Terminal output shared by the commands: tables, sizes and progress bars."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["human_bytes", "human_count", "plural", "format_table", "progress"]


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
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
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

    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, unit_divisor=1024 if unit == "B" else 1000,
                dynamic_ncols=True, leave=False)
