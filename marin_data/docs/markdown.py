"""Markdown pieces shared by the datasheet and the dataset card: tables, numbers, answers.

Numbers are written exactly (``1,234,567``, never "1.2M") so a reader — or a test — can check each one
against ``manifest.json``; human-readable sizes appear only beside an exact figure.
"""

from __future__ import annotations

from collections.abc import Sequence

from marin_data.docs.questions import Metadata, not_answered

__all__ = ["count", "share", "table", "answer", "code"]


def count(n: int) -> str:
    return f"{n:,}"


def share(fraction: float) -> str:
    """A share of the corpus as a percentage with two decimals (``12.34%``)."""
    return f"{100 * fraction:.2f}%"


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str) -> str:
    """A GitHub-flavoured Markdown table; ``align`` has one letter per column, ``l`` or ``r`` (numbers)."""
    if len(align) != len(headers) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r} does not fit {len(headers)} columns")
    lines = ["| " + " | ".join(_cell(h) for h in headers) + " |",
             "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def answer(meta: Metadata, qid: str) -> str:
    """The curated answer as Markdown (a list becomes bullets), or the visible 'Not answered.' marker."""
    value = meta.answer(qid)
    if value is None:
        return not_answered(qid)
    if isinstance(value, tuple):
        return "\n".join(f"- {v}" for v in value)
    return value


def code(lines: Sequence[str], lang: str = "bash") -> str:
    return "\n".join([f"```{lang}", *lines, "```"])
