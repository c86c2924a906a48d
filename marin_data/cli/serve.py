"""``marin-data serve``: a Hugging Face Hub-compatible mirror of the corpora under a folder
(library: `marin_data.mirror`)."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from marin_data.layout import MANIFEST
from marin_data.ui import echo, plural

__all__ = ["command"]


@click.command("serve")
@click.argument("root", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on (0.0.0.0 serves the network; put TLS in front for that).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="TCP port; 0 picks a free one.")
@click.option("--writable", is_flag=True, help="Accept uploads (HfApi.create_repo / upload_folder / create_commit) "
                                               "from clients holding --token.")
@click.option("--token", envvar="MARIN_MIRROR_TOKEN", metavar="T",
              help="Bearer token every write must carry (env MARIN_MIRROR_TOKEN keeps it out of `ps`).")
@click.option("--threads", type=click.IntRange(min=1), default=16, show_default=True,
              help="Worker threads: requests the mirror works on at once (idle, slow and downloading clients "
                   "hold none).")
@click.option("--quiet", is_flag=True, help="Do not log each request.")
def command(root: Path, host: str, port: int, writable: bool, token: str | None, threads: int, quiet: bool) -> None:
    """Serve every ROOT/org/name folder as the Hub dataset repo org/name.

    Unmodified huggingface_hub clients (snapshot_download, hf_hub_download, HfFileSystem, `hf download`,
    datasets) work against it with HF_ENDPOINT set to the printed URL. Files are served over plain HTTP
    with their LFS sha256 / git SHA-1, so clients verify what they get. Read-only unless --writable.

    \b
    LIMITS (per client; docs/security.md)
      request line 8 KiB (414), head 64 KiB and 100 header lines (431), JSON body 1 MiB (413);
      head within 10 s of its first byte (408), 60 s idle between requests, 30 s without body bytes,
      60 s without the client taking response bytes; 4,096 connections at once (503 beyond).

    \b
    EXAMPLES
      marin-data serve /data/mirror                       # /data/mirror/marin/sample -> marin/sample
      HF_ENDPOINT=http://127.0.0.1:8080 hf download --repo-type dataset marin/sample --local-dir sample
      MARIN_MIRROR_TOKEN=s3cret marin-data serve /data/mirror --writable --host 0.0.0.0
      HF_HUB_DISABLE_XET=1 HF_ENDPOINT=http://host:8080 hf upload --repo-type dataset \\
          --token s3cret team/corpus ./corpus .
    """
    if writable and not token:
        raise click.UsageError("--writable needs --token T (or MARIN_MIRROR_TOKEN): writes are never anonymous")
    if token and not writable:
        raise click.UsageError("--token only applies with --writable")
    if (root / MANIFEST).is_file():
        raise click.UsageError(f"{root} is a corpus; ROOT must hold org/name folders, each one repo: put the corpus "
                               f"at ROOT/org/name (e.g. mkdir -p ROOT/org && mv {root} ROOT/org/) and serve ROOT")
    from marin_data.mirror import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if quiet:
        logging.getLogger("marin_data.mirror.access").setLevel(logging.WARNING)

    def ready(mirror) -> None:
        repos = mirror.app.repos.repo_ids()
        mode = "read-write (token required)" if writable else "read-only"
        echo(f"Serving {plural(len(repos), 'repo')} from {root} at {mirror.url} ({mode}); "
             f"Ctrl-C stops.\n  export HF_ENDPOINT={mirror.url}", err=True)
        for repo_id in repos[:20]:
            echo(f"  {repo_id}", err=True)
        if len(repos) > 20:
            echo(f"  ... and {len(repos) - 20} more", err=True)
        for folder, why in mirror.app.repos.skipped():
            echo(f"  skipped {folder}: {why}", err=True)
        if not repos:
            echo(f"  {root} holds no repo: ROOT/org/name folders are served as the dataset repos org/name",
                 err=True)

    serve(root, host=host, port=port, token=token, writable=writable, threads=threads, on_ready=ready)
