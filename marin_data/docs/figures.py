"""Figures for the datasheet, as PNG bytes: token composition and document lengths by subset, and for a store
of Levanter caches named like Marin's (``cluster=3/quality=4``) a cluster x quality heat map of tokens.

Rendered with matplotlib's Agg canvas directly (no pyplot, no display, no global backend switch) under the
library's default style with a fixed font (DejaVu Sans, shipped inside matplotlib), fixed sizes and DPI, so
the bytes depend only on the statistics and the matplotlib version. The PNG's only text chunk names that
version (``Software: matplotlib 3.x.y``): PNG output is reproducible for one matplotlib release, and the
repository's datasheet test reads it to know whether byte equality can be expected.
"""

from __future__ import annotations

import io
import re

import numpy as np

from marin_data.docs.stats import CorpusStats
from marin_data.ui import human_count, plural

__all__ = ["png_software", "composition_png", "lengths_png", "cluster_quality", "token_grid", "heatmap_png",
           "heat_norm"]

_WIDTH_IN = 8.0
_ROW_IN = 0.32  # figure height grows with the number of subsets so labels never overlap
_DPI = 100
_LENGTH_BINS = 48
_CELL = re.compile(r"cluster=(\d+)/quality=(\d+)")


def png_software() -> str:
    import matplotlib

    return f"matplotlib {matplotlib.__version__}"


def _render(draw, rows: int) -> bytes:
    """Run ``draw(fig)`` on a fresh figure under fixed settings and return the PNG bytes."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rc = {"font.family": "DejaVu Sans", "font.size": 9, "svg.hashsalt": "marin", "path.simplify": False}
    # The default style, not the user's matplotlibrc; rc_context restores the caller's settings afterwards.
    with matplotlib.style.context("default"), matplotlib.rc_context(rc):
        fig = Figure(figsize=(_WIDTH_IN, 1.6 + _ROW_IN * max(rows, 1)), dpi=_DPI, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": png_software()})
    return buf.getvalue()


def composition_png(stats: CorpusStats) -> bytes:
    """Horizontal bars: each subset's share of the corpus's tokens, labelled with its token count."""
    names = [s.name for s in stats.subsets]

    def draw(fig) -> None:
        ax = fig.add_subplot()
        y = np.arange(len(names))
        shares = [100 * s.token_share for s in stats.subsets]
        ax.barh(y, shares, color="#4C72B0")
        for yi, s in zip(y, stats.subsets):
            label = f" {100 * s.token_share:.2f}% ({human_count(s.tokens)} tokens) "
            inside = s.token_share > 0.5  # long bars carry their label inside, so it never leaves the axes
            ax.text(100 * s.token_share, yi, label, va="center", ha="right" if inside else "left", fontsize=8,
                    color="white" if inside else "black")
        ax.set_yticks(y, names)
        ax.invert_yaxis()  # first subset (alphabetically) on top, as in the datasheet's tables
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of the corpus's tokens (%)")
        ax.set_title(f"Token composition: {human_count(stats.tokens)} tokens in {plural(len(names), 'subset')}")

    return _render(draw, len(names))


def _bin_edges(stats: CorpusStats) -> np.ndarray:
    longest = max((s.lengths.max for s in stats.subsets), default=1)
    return np.unique(np.round(np.logspace(0, np.log10(max(longest, 2) + 1), _LENGTH_BINS + 1)))


def lengths_png(stats: CorpusStats) -> bytes:
    """One row per subset: its documents in log-spaced length bins, p50 and p99 marked.

    Each row is scaled to its own fullest bin, so a subset with one sharp peak does not wash out the others;
    the right axis gives that bin's share of the subset's documents, so absolute shares stay readable.
    """
    from matplotlib import patheffects

    names = [s.name for s in stats.subsets]
    edges = _bin_edges(stats)
    grid = np.zeros((len(names), len(edges) - 1))
    for i, s in enumerate(stats.subsets):
        ls = s.lengths
        if ls.docs:
            hist, _ = np.histogram(ls.lengths_L, bins=edges, weights=ls.counts_L)
            grid[i] = hist / ls.docs
    peaks = grid.max(axis=1)

    def draw(fig) -> None:
        ax = fig.add_subplot()
        scaled = grid / np.where(peaks > 0, peaks, 1)[:, None]
        mesh = ax.pcolormesh(edges, np.arange(len(names) + 1), scaled, cmap="viridis", vmin=0, vmax=1)
        outline = [patheffects.withStroke(linewidth=4, foreground="black")]
        for i, s in enumerate(stats.subsets):
            for p, marker in ((50, "|"), (99, "x")):
                ax.plot([max(s.lengths.percentile(p), 1)], [i + 0.5], marker=marker, color="white", ms=9, mew=2,
                        clip_on=False, path_effects=outline)
        ax.set_xscale("log")
        ticks = np.arange(len(names)) + 0.5
        ax.set_yticks(ticks, names)
        ax.invert_yaxis()
        right = ax.secondary_yaxis("right")
        right.set_yticks(ticks, [f"{100 * p:.1f}%" for p in peaks])
        right.set_ylabel("fullest bin's share of documents")
        ax.set_xlabel("tokens per document (log scale)")
        ax.set_title("Document-length distribution by subset (white: | p50, x p99)")
        fig.colorbar(mesh, ax=ax, label="fraction of the fullest bin")

    return _render(draw, len(names))


def cluster_quality(name: str) -> tuple[int, int] | None:
    """``(3, 4)`` for a cell named ``cluster=3/quality=4``; None for any other name."""
    m = _CELL.fullmatch(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def token_grid(stats: CorpusStats) -> tuple[list[int], list[int], np.ndarray] | None:
    """The clusters, the quality levels and ``tokens[cluster, quality]`` (float; NaN where no cell is) of
    the subsets named ``cluster=X/quality=Y``; None when no subset is named so."""
    named = {cq: s.tokens for s in stats.subsets if (cq := cluster_quality(s.name)) is not None}
    if not named:
        return None
    clusters, qualities = sorted({c for c, _ in named}), sorted({q for _, q in named})
    grid = np.full((len(clusters), len(qualities)), np.nan)
    for (c, q), tokens in named.items():
        grid[clusters.index(c), qualities.index(q)] = tokens
    return clusters, qualities, grid


def heatmap_png(stats: CorpusStats) -> bytes | None:
    """A cluster (rows) x quality (columns) grid of each cell's tokens, coloured (`heat_norm`) and labelled; None
    when no subset is named ``cluster=X/quality=Y``. A missing cell is left grey."""
    found = token_grid(stats)
    if found is None:
        return None
    clusters, qualities, grid = found
    shown = np.ma.masked_invalid(np.where(grid > 0, grid, np.nan))
    norm, scale = heat_norm(shown.compressed())

    def draw(fig) -> None:
        ax = fig.add_subplot()
        ax.set_facecolor("#DDDDDD")  # no cell, or no tokens
        mesh = ax.pcolormesh(shown, cmap="viridis", norm=norm)
        for (i, j), tokens in np.ndenumerate(grid):
            label = "no cell" if np.isnan(tokens) else human_count(tokens)
            ax.text(j + 0.5, i + 0.5, label, ha="center", va="center", fontsize=7,
                    color="black" if np.isnan(tokens) or tokens <= 0 or norm(tokens) > 0.5 else "white")
        ax.set_xticks(np.arange(len(qualities)) + 0.5, [f"quality={q}" for q in qualities])
        ax.set_yticks(np.arange(len(clusters)) + 0.5, [f"cluster={c}" for c in clusters])
        ax.invert_yaxis()  # cluster 0 on top, as the cells table lists them
        ax.set_title(f"Tokens by cluster and quality: {human_count(np.nansum(grid))} tokens in "
                     f"{plural(int(np.sum(~np.isnan(grid))), 'cell')}")
        fig.colorbar(mesh, ax=ax, label=f"tokens ({scale} scale)")

    return _render(draw, len(clusters))


def heat_norm(values: np.ndarray):
    """The heat map's colour scale over the cells' token counts: from the least to the most, log where they
    span a decade or more, linear otherwise (a log scale stretched to a decade paints cells of 1.8M and 2.2M
    tokens alike). Returns the matplotlib norm and the scale's name."""
    from matplotlib.colors import LogNorm, Normalize

    low = float(values.min()) if values.size else 1.0
    high = float(values.max()) if values.size else 1.0
    if high >= 10 * low:
        return LogNorm(vmin=low, vmax=high), "log"
    if high == low:
        return Normalize(vmin=low * 0.9, vmax=low * 1.1), "linear"
    return Normalize(vmin=low, vmax=high), "linear"
