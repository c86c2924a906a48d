"""``marin-data``: a thin click front over library functions.

Each command lives in its own module (as huggingface_hub's ``cli/``), is imported only when used, parses
and checks its flags, and calls one library function. Errors are mapped to messages and exit codes in
`marin_data.cli._errors`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import traceback

import click

from marin_data.cli._errors import describe
from marin_data.ui import echo

__all__ = ["main", "cli"]

# Commands that do linear algebra: the others keep OpenBLAS (loaded with numpy) to one thread, since its
# threads, one per core, spin after numpy's import-time check: ~0.1 s of CPU per command (*measured*), taken
# from a local server or the hashing. `train` keeps the user's settings (torch's BLAS may be OpenBLAS).
NUMERIC_COMMANDS = {"train"}
# command name -> module defining a click command named `command`
COMMANDS = {
    "publish": "marin_data.cli.publish",
    "download": "marin_data.cli.download",
    "verify": "marin_data.cli.verify",
    "datasheet": "marin_data.cli.datasheet",
    "serve": "marin_data.cli.serve",
    "shard": "marin_data.cli.shard",
    "info": "marin_data.cli.info",
    "show": "marin_data.cli.show",
    "sample": "marin_data.cli.sample",
    "adopt": "marin_data.cli.adopt",
    "convert": "marin_data.cli.convert",
    "tokenizer": "marin_data.cli.tokenizer",
    "trace": "marin_data.cli.trace",
}
# Other installed packages add commands through this entry-point group: `marin-data train` comes from
# marin_train (see pyproject.toml), which imports this package, so this package cannot import it.
PLUGIN_GROUP = "marin_data.commands"


def _plugins() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)}


class LazyGroup(click.Group):
    """Imports a command's module only when it is listed or invoked, so `marin-data --help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *_plugins(), *self.commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module, plugin = COMMANDS.get(name), _plugins().get(name) if name not in COMMANDS else None
        if module is None and plugin is None:  # a command attached directly with @cli.command()
            return super().get_command(ctx, name)
        if name not in NUMERIC_COMMANDS and "numpy" not in sys.modules:  # (no effect once it is loaded)
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        return importlib.import_module(module).command if module else plugin.load()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="marin")
def cli() -> None:
    """Shard, verify, publish, download and stream the Marin corpus.

    \b
    EXAMPLES
      marin-data sample out/sample          # build the embedded sample corpus offline
      marin-data info out/sample            # what is in it, and its manifest sha256
      marin-data verify out/sample          # prove every byte is right

    Set MARIN_DEBUG=1 to see tracebacks.
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, turning known errors into one line and an exit code."""
    try:
        # Not standalone: click returns the exit code of `ctx.exit(n)` (or a command's int return value).
        rv = cli.main(args=argv, standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        echo("Aborted.", err=True)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the one place errors become exit codes
        known = describe(e)
        if known is None or os.environ.get("MARIN_DEBUG") == "1":
            traceback.print_exc()
        if known is None:
            sys.exit(70)
        message, code = known
        echo(f"error: {message}", err=True, fg="red")
        sys.exit(code)
