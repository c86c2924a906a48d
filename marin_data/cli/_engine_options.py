"""Command-line options shared by the commands that can run their per-file work on Ray (shard, verify)."""

from __future__ import annotations

import click

__all__ = ["engine_options", "engine_kwargs"]


def engine_options(fn):
    """Add ``--engine local|ray`` and ``--ray-address`` to a command."""
    for option in reversed([
        click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="Where the per-file work runs: this machine, or Ray tasks (needs pip install "
                          "'marin[ray]'; a Ray cluster's nodes must see the files at the same paths)."),
        click.option("--ray-address", metavar="ADDR",
                     help="With --engine ray: the Ray cluster to join (HOST:PORT, or auto for the cluster this "
                          "node belongs to). Default: start a private local Ray instance."),
    ]):
        fn = option(fn)
    return fn


def engine_kwargs(engine: str, ray_address: str | None) -> dict:
    """The library's ``engine``/``engine_address`` keyword arguments for the options above."""
    if ray_address is not None and engine != "ray":
        raise click.UsageError("--ray-address needs --engine ray")
    return {"engine": engine, "engine_address": ray_address}
