"""A click command whose ``--help`` lists its options under headings, so that a long list teaches.

Two dozen options in one block read as a row of knobs; under headings ("Data", "Checkpoints and resume",
...) a reader finds the one they need and sees which belong together. `SectionedCommand` takes the
headings in the order they print, each with its options' parameter names in the order they print under
it. Every option of the command is under exactly one heading, checked when the command is made: an option
added without a place fails at import, never vanishes from the help. ``--help`` itself closes the last
section. The first column is as wide in every section (at most click's 30 characters), so the
descriptions line up down the whole page as they do under click's single "Options" heading.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import click

__all__ = ["SectionedCommand"]

_TERM_MAX = 30  # click's widest first column; a longer term takes a line of its own


class SectionedCommand(click.Command):
    """A `click.Command` given ``sections``: ``(heading, [parameter name, ...])`` pairs."""

    def __init__(self, *args, sections: Sequence[tuple[str, Sequence[str]]], **kwargs):
        super().__init__(*args, **kwargs)
        placed = Counter(name for _, names in sections for name in names)
        options = {p.name for p in self.params if isinstance(p, click.Option)}
        wrong = sorted(n for n in options | set(placed) if placed[n] != 1 or n not in options)
        if wrong:
            raise ValueError(f"{self.name}: options not under exactly one heading, or unknown: {', '.join(wrong)}")
        self.sections = [(heading, list(names)) for heading, names in sections]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records = {p.name: p.get_help_record(ctx) for p in self.get_params(ctx)}
        help_option = self.get_help_option(ctx)
        sections = [(heading, list(names)) for heading, names in self.sections]
        if help_option is not None:
            sections[-1][1].append(help_option.name)
        listed = [(heading, [records[n] for n in names if records[n] is not None]) for heading, names in sections]
        width = min(_TERM_MAX, max(len(term) for _, rows in listed for term, _ in rows))
        for heading, rows in listed:
            with formatter.section(heading):
                formatter.write_dl([(term.ljust(width), text) for term, text in rows], col_max=_TERM_MAX)
