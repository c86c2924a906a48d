"""Command-line options shared by the commands that talk to a Hugging Face endpoint (publish, download,
verify --remote with an ``hf://datasets/org/name`` URL)."""

from __future__ import annotations

import click

__all__ = ["hf_options", "check_hf_flags"]


def hf_options(fn):
    """Add ``--endpoint`` and ``--token`` (for ``hf://`` URLs) to a command."""
    for option in reversed([
        click.option("--endpoint", metavar="URL",
                     help="hf:// only: a Hub-compatible endpoint, e.g. a `marin-data serve` mirror. "
                          "Default: HF_ENDPOINT, else huggingface.co."),
        click.option("--token", metavar="T",
                     help="hf:// only: a Hugging Face token. Default: HF_TOKEN or the `hf auth login` one."),
    ]):
        fn = option(fn)
    return fn


def check_hf_flags(url: str, endpoint: str | None, token: str | None, **other_flags: object) -> bool:
    """True for an ``hf://`` URL. Refuses ``--endpoint``/``--token`` on other URLs and the store flags
    named in ``other_flags`` (those set) on ``hf://`` ones, so a flag never silently does nothing."""
    is_hf = url.startswith("hf://")
    if not is_hf and (endpoint or token):
        raise click.UsageError("--endpoint and --token apply to hf:// URLs only (S3 takes --endpoint-url, "
                               "--profile)")
    given = [name for name, value in other_flags.items() if value]
    if is_hf and given:
        verb = "does" if len(given) == 1 else "do"
        raise click.UsageError(f"{', '.join(given)} {verb} not apply to hf:// URLs (they take --endpoint and --token)")
    return is_hf
