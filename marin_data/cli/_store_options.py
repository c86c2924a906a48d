"""Command-line options shared by the commands that talk to a store (publish, download, verify --remote), and
the one place a command turns them into store options (`source_options`) and a source's refusal into a usage
error (`usage_errors`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from marin_data.cli._hf_options import check_hf_flags
from marin_data.errors import NotApplicableError

__all__ = ["store_options", "store_kwargs", "check_s3_flags", "check_sha256", "show_retries", "is_url",
           "remote_options", "source_options", "usage_errors", "data_of", "local_options"]


def is_url(source: str) -> bool:
    """``s3://`` or ``hf://``: a published corpus (checked before click would turn ``hf://x`` into a path)."""
    return source.split("://", 1)[0] in ("s3", "hf") and "://" in source


def store_options(fn):
    """Add ``--endpoint-url``, ``--profile``, ``--anonymous`` and ``--requester-pays`` to a command."""
    for option in reversed([
        click.option("--endpoint-url", metavar="URL",
                     help="An S3-compatible endpoint (MinIO, R2, a local server; GCS: https://storage.googleapis.com "
                          "with an HMAC key's id and secret as AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). "
                          "Default: AWS."),
        click.option("--profile", metavar="NAME", help="AWS named profile for credentials and region."),
        click.option("--anonymous", is_flag=True,
                     help="Send unsigned requests: public buckets, no credentials needed."),
        click.option("--requester-pays", is_flag=True,
                     help="Accept the transfer charges of a requester-pays bucket."),
    ]):
        fn = option(fn)
    return fn


def store_kwargs(endpoint_url: str | None, profile: str | None, anonymous: bool, requester_pays: bool) -> dict:
    """The `open_store` keyword arguments for the options above (only those set)."""
    if anonymous and profile:
        raise click.UsageError("--anonymous sends unsigned requests; it cannot be combined with --profile")
    options = {"endpoint_url": endpoint_url, "profile": profile, "anonymous": anonymous,
               "requester_pays": requester_pays}
    return {k: v for k, v in options.items() if v}


def check_s3_flags(urls: list[str], endpoint_url: str | None, profile: str | None, anonymous: bool,
                   requester_pays: bool) -> None:
    """Refuse the S3 options when no URL is ``s3://``: they would silently do nothing (the Hub takes
    ``--endpoint``)."""
    given = [flag for flag, value in (("--endpoint-url", endpoint_url), ("--profile", profile),
                                      ("--anonymous", anonymous), ("--requester-pays", requester_pays)) if value]
    if given and not any(u.startswith("s3://") for u in urls):
        verb = "applies" if len(given) == 1 else "apply"
        raise click.UsageError(f"{', '.join(given)} {verb} to s3:// URLs only; an hf:// source takes "
                               "--endpoint and --token")


def check_sha256(value: str | None, flag: str = "--manifest-sha256") -> None:
    if value is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        raise click.UsageError(f"{flag} must be 64 hex digits, got {value!r}")


def show_retries() -> None:
    """Print the retry helper's ``Retrying in Xs [n/N]`` lines on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")


def remote_options(url: str, endpoint_url: str | None, profile: str | None, anonymous: bool,
                   requester_pays: bool, endpoint: str | None, token: str | None) -> dict:
    """The store options for ``url``, refusing the flags its kind of store does not take."""
    s3 = {"--endpoint-url": endpoint_url, "--profile": profile, "--anonymous": anonymous,
          "--requester-pays": requester_pays}
    if check_hf_flags(url, endpoint, token, **s3):
        return {k: v for k, v in {"endpoint": endpoint, "token": token}.items() if v}
    return store_kwargs(endpoint_url, profile, anonymous, requester_pays)


def source_options(source: str, endpoint_url: str | None, profile: str | None, anonymous: bool,
                   requester_pays: bool, endpoint: str | None, token: str | None) -> dict:
    """What a command opens ``source`` with: for a URL its `remote_options`; for a local path the store
    options given, unchecked (a local store ignores them): empty unless the user passed some, which the
    command or the source then refuses where they cannot apply."""
    if is_url(source):
        return remote_options(source, endpoint_url, profile, anonymous, requester_pays, endpoint, token)
    given = {"endpoint_url": endpoint_url, "profile": profile, "anonymous": anonymous,
             "requester_pays": requester_pays, "endpoint": endpoint, "token": token}
    return {k: v for k, v in given.items() if v}


def data_of(source: str) -> list[str]:
    """Where a local pin kept apart from its data says the data is (its manifest's ``data``; none for a download
    of one, which holds its shards): the store options apply to that store."""
    if is_url(source) or not Path(source).is_dir():
        return []
    from marin_data.formats import read_manifest
    from marin_data.stores import open_store
    from marin_data.transfer.apart import data_url

    try:
        manifest = read_manifest(open_store(source))
    except (ValueError, OSError):  # the command says what is wrong with it
        return []
    return [data] if manifest is not None and (data := data_url(manifest, source)) else []


def local_options(source: str, options: dict, what: str) -> None:
    """Refuse store ``options`` given with the local folder ``source`` unless it is a pin kept apart from its
    data (`data_of`: they open the data's store); ``what``: the error's words for the refused options."""
    if options and not is_url(source) and not data_of(source):
        raise click.UsageError(f"{what} apply to s3:// and hf:// URLs only (and to a pin kept apart from its "
                               "data, whose data is there)")


@contextmanager
def usage_errors() -> Iterator[None]:
    """A source's `NotApplicableError` (an option or operation its format does not take) as click's usage
    error, with the same words."""
    try:
        yield
    except NotApplicableError as e:
        raise click.UsageError(e.message) from e
